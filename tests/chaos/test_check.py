"""The campaign's checker on logs written by hand: every count it reports (lost by phase,
stranded in a store, duplicated, misrouted, phantom, out of order, hung, refused, recovery,
unavailable seconds, double serving, tracebacks) from a run whose truth is known; and the
seeded schedules."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from flowbus.chaos.check import check_run, timeline
from flowbus.chaos.nemesis import MIXES, Mix, check_mixes, schedule
from flowbus.chaos.workload import STRIDE, Client, Spec, SubSpec, event_of, filters_for
from flowbus.errors import ExperimentError
from flowbus.filters import parse

T0 = 1000.0


def _spec(root: Path) -> Spec:
    return Spec(
        brokers=("10.0.0.1:7000", "10.0.0.2:7000"),
        publishers=(Client("pub0", 0), Client("pub1", 1)),
        subscribers=(Client("sub0", 0, (SubSpec("all", "level >= 1"), SubSpec("high", "level >= 4"))),),
        out=str(root),
        rate=10.0,
        publish_for=4.0,
    )


def _write(root: Path, spec: Spec, pubs: list[list[object]], deliveries: list[list[object]]) -> None:
    (root / "spec.json").write_text(spec.to_json())
    with (root / "publishes.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["publisher", "k", "pseq", "sent", "acked", "error"])
        w.writerows(pubs)
    with (root / "deliveries.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sub", "quantity", "broker", "t", "n"])
        w.writerows(deliveries)


def _run(tmp_path: Path) -> tuple[Path, dict[int, dict[str, object]]]:
    """Publisher 0 publishes k = 1..40 at 10 a second, all acknowledged but k = 40 (hung) and
    k = 39 (refused); publisher 1 publishes k = 1..3. A fault from 1.0 to 2.0 s."""
    events = {p * STRIDE + k: event_of(p, k) for p, n in ((0, 40), (1, 3)) for k in range(1, n + 1)}
    faults = [
        {"t": T0 + 1.0, "what": "inject", "kind": "kill", "start": 1.0, "hosts": ["b0"]},
        {"t": T0 + 2.0, "what": "heal", "kind": "kill", "start": 1.0, "hosts": ["b0"]},
    ]
    (tmp_path / "faults.jsonl").write_text("".join(json.dumps(f) + "\n" for f in faults))
    return tmp_path, {q: {"event": e, "sent": T0 + (q % STRIDE) / 10} for q, e in events.items()}


def test_a_run_with_every_kind_of_mistake_is_counted(tmp_path: Path) -> None:
    root, events = _run(tmp_path)
    faults = (
        (root / "faults.jsonl")
        .read_text()
        .replace('"what": "heal",', '"what": "heal", "failed": ["broker b0: no ready line in 60 s"],')
    )
    (root / "faults.jsonl").write_text(faults)  # (b0 did not come back)
    spec = _spec(root)
    high = parse("level >= 4")
    acked = [q for q in sorted(events) if q not in (39, 40)]
    lost = {5, 15, 35, 25}  # (one before the fault, one during, one after: from "all"; 25 stranded)
    rows: list[list[object]] = []
    for q in acked:
        t = float(str(events[q]["sent"])) + 0.02
        if q not in lost:
            rows.append(["all", q, "10.0.0.1:7000", f"{t:.4f}"])
        if high.matches(events[q]["event"]):  # type: ignore[arg-type]
            rows.append(["high", q, "10.0.0.1:7000", f"{t:.4f}"])
    i, j = (next(n for n, r in enumerate(rows) if r[:2] == ["all", q]) for q in (11, 12))
    rows[i], rows[j] = rows[j], rows[i]  # (12 taken before 11: 11 is out of order)
    rows.append(["all", 7, "10.0.0.2:7000", f"{T0 + 3:.4f}"])  # a duplicate
    rows.append(["all", 6 * STRIDE + 1, "10.0.0.2:7000", f"{T0 + 3:.4f}"])  # never published
    low = max(q for q in acked if q < STRIDE and not high.matches(events[q]["event"]))  # type: ignore[arg-type]
    rows.append(["high", low, "10.0.0.2:7000", f"{T0 + 9:.4f}"])  # not its filter (its latest: in order)
    rows.append(["all", 40, "10.0.0.1:7000", f"{T0 + 9:.4f}"])  # (given up, hung: taken all the same,
    rows.append(["all", 39, "10.0.0.1:7000", f"{T0 + 9:.4f}"])  # and 39 after 40: not the order promised)
    _write(root, spec, _pubs(events), rows)
    (root / "queued.csv").write_text("broker,sub,quantity\nb1,all,25\nb0,high,5\n")  # (left in a store)
    row = check_run(root)
    assert row["published"] == 43 and row["acknowledged"] == 41
    assert row["lost"] == 3 and (row["lost_prefix"], row["lost_middle"], row["lost_postfix"]) == (1, 1, 1)
    assert row["stranded"] == 1  # (25, for "all"; 5 for "high" was taken)
    assert row["duplicated"] == 1 and row["phantom"] == 1 and row["misrouted"] == 1
    assert row["out_of_order"] == 1 and row["unacknowledged_taken"] == 2 and row["unacknowledged_late"] == 1
    assert row["hung_publishes"] == 1 and row["refused"] == 1
    assert row["refused_by_reason"] == {"not acknowledged within 30 s (connected to x)": 1}
    assert row["faults_injected"] == 1 and row["tracebacks"] == 0 and row["heal_failures"] == 1
    assert row["expected_deliveries"] == len(acked) + sum(
        1
        for q in acked
        if high.matches(events[q]["event"])  # type: ignore[arg-type]
    )


def _pubs(events: dict[int, dict[str, object]]) -> list[list[object]]:
    out: list[list[object]] = []
    for q, info in sorted(events.items()):
        p, k = divmod(q, STRIDE)
        t = float(str(info["sent"]))
        out.append([f"pub{p}", k, k, f"{t:.4f}", "", ""])
        if q == 40:
            out.append(["pub0", k, k, "", "", "hung: neither acknowledged nor refused at the end"])
        elif q == 39:
            out.append(["pub0", k, k, "", "", "not acknowledged within 30 s (connected to x)"])
        else:
            out.append([f"pub{p}", k, k, "", f"{t + 0.05:.4f}", ""])
    return out


def test_a_clean_run_is_clean_and_its_recovery_is_measured_from_the_heal(tmp_path: Path) -> None:
    root, events = _run(tmp_path)
    spec = _spec(root)
    acked = [q for q in events if q not in (39, 40)]
    rows = []
    for sub, filt in (("all", parse("level >= 1")), ("high", parse("level >= 4"))):
        for q in sorted(acked):
            if filt.matches(events[q]["event"]):  # type: ignore[arg-type]
                t = float(str(events[q]["sent"]))  # (the fault held what came from 1.0 s on
                at = t + 0.02 if t < T0 + 1.0 else T0 + 2.5 + (t - T0 - 1.0) / 100  # until 2.5 s)
                rows.append([sub, q, "10.0.0.1:7000", f"{at:.4f}"])
    rows.sort(key=lambda r: float(str(r[3])))
    (root / "logs").mkdir()
    (root / "logs" / "b0.log").write_text("Traceback (most recent call last):\n  boom\n")
    states = [{"t": T0 + 1, "every": 1.0, "served": {"b0": ["all"], "b1": ["all", "high"]}}]
    (root / "states.jsonl").write_text("".join(json.dumps(s) + "\n" for s in states))
    _write(root, spec, _pubs(events), rows)
    row = check_run(root)
    assert row["lost"] == row["duplicated"] == row["misrouted"] == row["phantom"] == row["out_of_order"] == 0
    assert row["recovery_max_s"] == pytest.approx(0.509, abs=0.002)  # (sent at 1.9, taken at 2.509)
    assert row["double_served_s"] == 1.0 and row["tracebacks"] == 1 and row["heal_failures"] == 0
    assert row["unavailable_s"] >= 1  # (pub1 publishes 3 events, then nothing: under half its rate)
    seconds = timeline(root)
    assert sum(s["sent"] for s in seconds) == 43 and sum(s["acked"] for s in seconds) == 41
    assert sum(s["taken"] for s in seconds) == len(rows)


def test_a_flows_derived_space_is_checked_against_the_interpreter(tmp_path: Path) -> None:
    """A publisher into the campaign flow's source space and a subscription of its derived
    space ``big`` (level 3 and up, priced): what it must get is what the interpreter derives
    from the acknowledged events; an event the flow selects out is misrouted there, and a
    plain subscription wants none of the flow's events."""
    from flowbus.chaos.workload import FLOW

    spec = Spec(
        brokers=("10.0.0.1:7000",),
        publishers=(Client("pub0", 0), Client("fpub", 0, space="trades", rate=10.0)),
        subscribers=(
            Client(
                "sub0",
                0,
                (
                    SubSpec("all", "level >= 1"),
                    SubSpec("f0", "notional > 100", "big"),
                    SubSpec("f1", "", "big"),
                ),
            ),
        ),
        out=str(tmp_path),
        rate=100.0,  # (pub0's; it sends 10 a second: under half of it, unavailable)
        publish_for=2.0,
        flow=FLOW,
    )
    spec = Spec.from_json(spec.to_json())  # (as the workload and the checker read it)
    assert spec.publishers[1].space == "trades" and spec.subscribers[0].subs[1].space == "big"
    pubs: list[list[object]] = []
    for p in (0, 1):
        for k in range(1, 21):
            pubs += [[f"{('pub0', 'fpub')[p]}", k, k, f"{T0 + k / 10:.4f}", "", ""]]
            pubs += [[f"{('pub0', 'fpub')[p]}", k, k, "", f"{T0 + k / 10 + 0.05:.4f}", ""]]
    flow_events = {STRIDE + k: event_of(1, k) for k in range(1, 21)}
    big = {q for q, e in flow_events.items() if e["level"] >= 3 and e["price"] * e["level"] > 100}
    low = next(q for q, e in flow_events.items() if e["level"] < 3)
    assert big and len(big) < 20
    rows: list[list[object]] = [
        ["all", k, "10.0.0.1:7000", f"{T0 + k / 10 + 0.01:.4f}"] for k in range(1, 21)
    ]
    got = sorted(big)[1:]  # (the first one lost)
    rows += [["f0", q, "10.0.0.1:7000", f"{T0 + 3 + i / 100:.4f}"] for i, q in enumerate(got)]
    rows.append(["f0", low, "10.0.0.1:7000", f"{T0 + 4:.4f}"])  # (selected out by the flow)
    rows.append(["all", STRIDE + 1, "10.0.0.1:7000", f"{T0 + 4:.4f}"])  # (another space's event)
    every = sorted(q for q, e in flow_events.items() if e["level"] >= 3)  # (f1, no filter: all of big)
    rows += [["f1", q, "10.0.0.1:7000", f"{T0 + 3 + i / 100:.4f}"] for i, q in enumerate(every)]
    _write(tmp_path, spec, pubs, rows)
    row = check_run(tmp_path)
    assert row["expected_deliveries"] == 20 + len(big) + len(every)
    assert row["lost"] == 1 and row["misrouted"] == 2 and row["duplicated"] == 0
    assert row["unavailable_s"] == 2  # (pub0's two seconds; fpub at its own rate, 10, is available)


def test_events_and_filters_are_the_same_in_every_process() -> None:
    assert event_of(1, 7) == event_of(1, 7) and event_of(1, 7)["quantity"] == STRIDE + 7
    assert event_of(0, 1) != event_of(0, 2)
    assert filters_for(10, 3) == filters_for(10, 3) and filters_for(10, 3) != filters_for(10, 4)
    for text in filters_for(30, 1):
        parse(text)  # (each one a filter of the language)


def test_schedules_are_seeded_and_mixes_checked() -> None:
    for mix in MIXES.values():
        a = schedule(mix, 3, brokers=5, detect=5.0)
        assert a == schedule(mix, 3, brokers=5, detect=5.0)
        if mix.under:  # (held from before the first fault to the end of the last)
            under, *a = a
            assert under.kind == mix.under and under.start < a[0].start and under.end == a[-1].end
        assert len(a) == mix.faults
        assert all(a[i].end < a[i + 1].start for i in range(len(a) - 1))  # (one at a time, healed)
        assert all(f.kind in mix.kinds for f in a)
    (under, *_), starved = schedule(MIXES["overload"], 1, brokers=5, detect=5.0), MIXES["starve"]
    for fault, (low, high) in (
        (under, (0.08, 0.3)),
        (schedule(starved, 1, brokers=5, detect=5.0)[0], (0.02, 0.2)),
    ):
        shares = [float(x) for x in str(fault.rules["cpu"]).split()]
        assert fault.targets == (0, 1, 2, 3, 4) and len(shares) == 5 and all(low <= x <= high for x in shares)
    assert schedule(MIXES["crash"], 1, brokers=5, detect=5.0) != schedule(
        MIXES["crash"], 2, brokers=5, detect=5.0
    )
    with pytest.raises(ExperimentError, match="unknown mix 'nope'"):
        check_mixes(["nope"], isolated=True)
    with pytest.raises(ExperimentError, match="needs network namespaces"):
        check_mixes(["split"], isolated=False)
    assert [m.name for m in check_mixes(["process"], isolated=False)] == ["process"]
    with pytest.raises(ExperimentError, match="unknown kinds"):
        Mix("bad", ("earthquake",), 1, "")


def test_a_space_downstream_of_the_flows_state_is_checked_for_its_counts_and_per_key_order(
    tmp_path: Path,
) -> None:
    """``counted`` carries, per trade, the ``n``-th trade of its symbol (the flow's state
    ``tally``). The interpreter counts what the network took: the acknowledged trades, and
    one never acknowledged but delivered (its acknowledgement lost). A count that differs is
    a wrong value; two events of different symbols may come in any order (their partitions
    are not one), two of one symbol may not. A change skipped by a catch-up (a later one of
    its symbol came) is caught up; the last change of a symbol must come."""
    from flowbus.chaos.workload import FLOW

    spec = Spec(
        brokers=("10.0.0.1:7000",),
        publishers=(Client("fpub", 0, space="trades", rate=10.0),),
        subscribers=(Client("sub0", 0, (SubSpec("c0", "", "counted"), SubSpec("c1", "n >= 2", "counted"))),),
        out=str(tmp_path),
        publish_for=6.0,
        flow=FLOW,
    )
    n = 60
    symbol = {k: event_of(0, k)["symbol"] for k in range(1, n + 1)}
    count: dict[int, int] = {}
    for k in range(1, n + 1):
        count[k] = sum(1 for j in range(1, k + 1) if symbol[j] == symbol[k])
    pubs: list[list[object]] = []
    for k in range(1, n + 1):
        pubs.append(["fpub", k, k, f"{T0 + k / 10:.4f}", "", ""])
        if k != 5:  # (its acknowledgement never came; it was taken all the same)
            pubs.append(["fpub", k, k, "", f"{T0 + k / 10 + 0.05:.4f}", ""])
    assert any(count[k] > 1 and symbol[k] == symbol[5] for k in range(6, n + 1))  # (counted after it)
    c0 = list(range(1, n + 1))
    c0[0], c0[1] = c0[1], c0[0]  # (two symbols swapped: allowed)
    assert symbol[1] != symbol[2] and 7 not in (1, 2)
    rows: list[list[object]] = [
        ["c0", k, "b", f"{T0 + 7 + i / 100:.4f}", count[k] + (k == 7)] for i, k in enumerate(c0)
    ]
    last = {symbol[k]: k for k in range(1, n + 1)}
    middle = next(k for k in range(1, n + 1) if count[k] == 2 and last[symbol[k]] != k)
    final = next(k for k in range(1, n + 1) if count[k] >= 2 and last[symbol[k]] == k and k != 5)
    rows = [r for r in rows if r[1] not in (middle, final)]  # (c0: a change skipped, a last one lost)
    c1 = [k for k in range(1, n + 1) if count[k] >= 2]
    third = next(k for k in c1 if count[k] == 3)
    second = next(k for k in c1 if count[k] == 2 and symbol[k] == symbol[third])
    c1.remove(second)
    c1.insert(c1.index(third) + 1, second)  # (behind a later one of its symbol: out of order)
    rows += [["c1", k, "b", f"{T0 + 8 + i / 100:.4f}", count[k]] for i, k in enumerate(c1)]
    _write(tmp_path, spec, pubs, rows)
    row = check_run(tmp_path)
    assert row["acknowledged"] == n - 1
    assert row["expected_deliveries"] == (n - 1) + sum(1 for k in c1 if k != 5)
    assert row["caught_up"] == 1 and row["lost"] == 1  # (a later one of its symbol came; none did)
    assert row["delivered"] == row["expected_deliveries"] - 2
    assert row["misrouted"] == row["phantom"] == row["duplicated"] == 0
    assert row["wrong_values"] == 1 and row["out_of_order"] == 1


def test_brokers_that_end_with_other_flows_than_those_deployed_are_counted(tmp_path: Path) -> None:
    """The last poll's flows per broker against the campaign's flow and what the redeploy
    faults deployed and undeployed (an undeploy that failed leaves its flow expected)."""
    from flowbus.chaos.workload import FLOW

    spec = Spec(
        brokers=("10.0.0.1:7000",),
        publishers=(Client("pub0", 0),),
        subscribers=(Client("sub0", 0, (SubSpec("all", ""),)),),
        out=str(tmp_path),
        flow=FLOW,
    )
    _write(tmp_path, spec, [], [])
    polls = [
        {"t": T0, "served": {}, "flows": {"b0": ["chaos"], "b1": ["chaos"], "b2": ["chaos"]}},
        {"t": T0 + 1, "served": {}, "flows": {"b0": ["chaos"], "b1": ["chaos", "extra"], "b2": []}},
    ]
    (tmp_path / "states.jsonl").write_text("".join(json.dumps(r) + "\n" for r in polls))
    for undone, mismatch in ((None, 2), ("ClientError: refused", 2)):
        ops = [
            {"t": T0, "what": "deploy", "flow": "extra", "error": None},
            {"t": T0 + 1, "what": "undeploy", "flow": "extra", "error": undone},
        ]
        (tmp_path / "faults.jsonl").write_text("".join(json.dumps(f) + "\n" for f in ops))
        assert check_run(tmp_path)["registry_mismatch"] == mismatch
    polls[-1]["flows"] = {"b0": ["chaos"], "b1": ["chaos"], "b2": ["chaos"]}
    (tmp_path / "states.jsonl").write_text("".join(json.dumps(r) + "\n" for r in polls))
    assert check_run(tmp_path)["registry_mismatch"] == 3  # (the undeploy failed: extra expected)
    (tmp_path / "faults.jsonl").write_text("")
    assert check_run(tmp_path)["registry_mismatch"] == 0


def test_follow_puts_a_traced_events_hops_and_deliveries_in_time_order(tmp_path: Path) -> None:
    """``flowbus chaos follow``'s list: the trace lines that carry the chosen events (by their
    id between brokers, client and sequence number) and their deliveries (by the checker's
    numbering of the publisher's events), times from the first publish."""
    from flowbus.chaos.follow import follow

    spec = _spec(tmp_path)
    pubs = [["pub0", k, k + 10, T0 + k, T0 + k + 0.5, ""] for k in (1, 2, 3)] + [
        ["pub1", 1, 1, T0, T0 + 1, ""]
    ]
    deliveries = [["all", k, "10.0.0.2:7000", T0 + k + 0.3, ""] for k in (1, 2, 3)] + [
        ["all", STRIDE + 1, "x", T0, ""]
    ]
    _write(tmp_path, spec, pubs, deliveries)
    (tmp_path / "traces").mkdir()
    lines = {
        "b0": [[T0 + 2.1, "out", "10.0.0.2:7000", [["Publish", ["pub0", 12]], ["Ping"]]]],
        "b1": [
            [T0 + 2.2, "in", "10.0.0.1:7000", [["Publish", ["pub0", 12]], ["Publish", ["pub1", 12]]]],
            [T0 + 2.25, "out", "10.0.0.1:7000", [["Confirm"]]],
        ],
    }
    for name, rows in lines.items():
        (tmp_path / "traces" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    hops = follow(tmp_path, "pub0", 12, 12)
    assert [(h["t"], h["broker"], h["way"], h["message"]) for h in hops] == [
        (2.1, "b0", "out", "Publish"),
        (2.2, "b1", "in", "Publish"),
        (2.3, "10.0.0.2:7000", "delivered", ""),
    ]
    assert len(follow(tmp_path, "pub0", 11, 13)) == 5
    with pytest.raises(ExperimentError, match="no publishes of 'nobody'"):
        follow(tmp_path, "nobody", 1, 1)
