"""``flowbus bench flow-bus``: the stock flow on one broker process against plain content routing,
on tiny sizes; and the offline check that judges each subscription's deliveries."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from flowbus.bench import flow_bus
from flowbus.bench.workloads import stock_flow_spec
from flowbus.flow.deploy import Deployment

from .conftest import invoke

KEYS = {
    "kind", "brokers", "rate", "events", "subscriptions", "deliveries_expected", "deliveries",
    "events_per_s_in", "deliveries_per_s", "latency_p50_ms", "latency_p99_ms", "deliveries_match",
    "broker_cpu_s", "client_cpu_s", "broker_rss_mb",
}  # fmt: skip


@pytest.mark.broker
def test_bench_flow_bus_delivers_what_the_interpreter_does_and_compares_with_plain(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = (
        "--events",
        "1000",
        "--subs",
        "5",
        "--brokers",
        "1",
        "--rate",
        "2000",
        "--repeats",
        "2",
        "--out",
        str(out),
        "--json",
    )
    result = invoke("bench", "flow-bus", *args)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    rows = doc["rows"]
    assert [(r["kind"], r["rate"]) for r in rows] == [
        ("flow", None),
        ("plain", None),
        ("flow", None),  # (flat out twice, the pairs alternating)
        ("plain", None),
        ("flow", 2000),
        ("plain", 2000),
    ]
    assert doc["repeats"] == 2
    for r in rows:
        assert "error" not in r, r["error"]
        assert r.keys() >= KEYS, KEYS - r.keys()
        assert r["deliveries_match"] and r["deliveries"] == r["deliveries_expected"] > 0
        assert r["events"] == 1000 and r["latency_p99_ms"] >= r["latency_p50_ms"] > 0
    flows = [r for r in rows if r["kind"] == "flow"]
    assert all(r["subscriptions"] == 20 and r["flow_vs_plain"] > 0 for r in flows)
    assert set(flows[0]["deliveries_per_space"]) <= set(flow_bus.SPACES)
    for flow, base in zip(rows[::2], rows[1::2], strict=True):  # the same deliveries, within one filter's
        assert abs(base["deliveries_expected"] - flow["deliveries_expected"]) <= 20
    assert doc["goals_met"]["deliveries_match"] is True
    with (out / "rows.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 6
    assert (out / "flow-bus.png").stat().st_size > 0


def test_the_check_catches_a_lost_event_and_a_key_out_of_order() -> None:
    d = Deployment.from_file(stock_flow_spec())
    events = list(d.generate(events=400))
    ref = flow_bus.reference(d, events)
    published = np.arange(len(events), dtype=np.float64)
    for space in ("combined", "compressed"):
        want = list(range(len(ref.outputs[space])))
        got = [(float(ref.origin[space][j]) + 0.5, ref.outputs[space][j]) for j in want]
        ok, latency = flow_bus.check(space, got, want, ref, published)
        assert ok and latency == [0.5] * len(want)
        assert not flow_bus.check(space, got[1:], want, ref, published)[0]
    got = [(0.0, e) for e in ref.outputs["compressed"]]
    key = got[0][1]["name"]
    first, second = [i for i, (_, e) in enumerate(got) if e["name"] == key][:2]
    got[first], got[second] = got[second], got[first]
    assert got[first][1] != got[second][1]
    assert not flow_bus.check("compressed", got, list(range(len(got))), ref, published)[0]
    # a stateless space takes any order
    combined = [(0.0, e) for e in reversed(ref.outputs["combined"])]
    assert flow_bus.check("combined", combined, list(range(len(combined))), ref, published)[0]


def test_the_goals_are_judged_on_their_rows_and_the_ratio_per_broker_count() -> None:
    def row(kind: str, brokers: int, rate: float | None, **more: object) -> dict[str, object]:
        return {"kind": kind, "brokers": brokers, "rate": rate, "deliveries_match": True, **more}

    rows = [
        row("flow", 1, None, flow_vs_plain=0.54),
        row("plain", 1, None),
        row("flow", 1, None, flow_vs_plain=0.47),  # (a noisy repeat: the median, 0.54, counts)
        row("flow", 1, None, flow_vs_plain=0.58),
        row("flow", 1, 5000.0, flow_vs_plain=1.0, latency_p99_ms=12.0),
        row("flow", 3, None, flow_vs_plain=0.43),
        row("flow", 3, None, flow_vs_plain=0.52),
        row("flow", 3, None, flow_vs_plain=0.49),
        row("flow", 3, 5000.0, flow_vs_plain=0.98, latency_p99_ms=511.0),
    ]
    medians = {(1, 0.0): 0.54, (1, 5000.0): 1.0, (3, 0.0): 0.49, (3, 5000.0): 0.98}
    assert flow_bus.median_ratios(rows) == medians
    goals = flow_bus.goals_met(rows, 5000.0)
    assert goals["flow_vs_plain_at_least_0.5"] is False  # (the ring of three's median, 0.49)
    assert goals["flow_vs_plain_at_least_0.5_by_brokers"] == {"1": True, "3": False}
    rows[5]["flow_vs_plain"] = 0.55
    assert flow_bus.goals_met(rows, 5000.0)["flow_vs_plain_at_least_0.5_by_brokers"] == {"1": True, "3": True}
    assert goals["p99_under_50_ms_paced_1_broker"] is True and goals["deliveries_match"] is True
    rows[4]["latency_p99_ms"] = 50.0
    assert flow_bus.goals_met(rows, 5000.0)["p99_under_50_ms_paced_1_broker"] is False
