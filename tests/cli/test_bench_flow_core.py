"""``flowbus bench flow-core``: the flow's routing core and plain's, alternately, in one process,
on tiny sizes."""

from __future__ import annotations

import json

from .conftest import invoke


def test_bench_flow_core_times_both_cores_on_the_same_deliveries() -> None:
    result = invoke("bench", "flow-core", "--events", "400", "--subs", "5", "--repeats", "2", "--json")
    assert result.exit_code == 0, result.output
    r = json.loads(result.stdout)
    want = r["deliveries_expected"]
    assert want["flow"] > 0 and abs(want["plain"] - want["flow"]) <= max(10, want["flow"] // 10)
    assert r["deliveries"] == {"flow": [want["flow"]] * 2, "plain": [want["plain"]] * 2}
    assert r["deliveries_match"] is True
    assert len(r["flow_us_per_event"]) == len(r["plain_us_per_event"]) == 2
    assert all(x > 0 for x in r["flow_us_per_event"] + r["plain_us_per_event"])
    assert r["flow_vs_plain"] == r["plain_us_median"] / r["flow_us_median"]


def test_bench_flow_core_prints_a_table_without_json() -> None:
    result = invoke("bench", "flow-core", "--events", "200", "--subs", "3", "--repeats", "1")
    assert result.exit_code == 0, result.output
    assert "flow/plain" in result.stdout and "deliveries match: True" in result.stdout
