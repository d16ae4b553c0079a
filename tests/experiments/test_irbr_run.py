"""One run of the IRBR fault experiment: validation, determinism, shared subscription
phases (run_group) giving the very rows of separate runs, nested failure sets."""

from __future__ import annotations

import json
import random

import pytest

from flowbus.errors import FlowbusError
from flowbus.experiments.irbr_run import TIMING_FIELDS, IrbrRun, IrbrRunResult, QuoteWorkload, run, run_group


def stable(result: IrbrRunResult) -> str:
    row = {k: v for k, v in result.row.items() if k not in TIMING_FIELDS}
    return json.dumps([row, result.events], sort_keys=True)


@pytest.mark.parametrize("protocol", ["irbr", "scribe"])
@pytest.mark.broker
def test_a_run_is_the_same_every_time_and_in_a_group(protocol: str) -> None:
    configs = [IrbrRun(protocol, nodes=120, failure=f, events=30, seed=4) for f in (0.0, 0.1, 0.3)]
    alone = [run(c) for c in configs]
    assert [stable(r) for r in alone] == [stable(run(c)) for c in configs]
    assert [stable(r) for r in run_group(configs)] == [stable(r) for r in alone]
    failed = [r.row["failed"] for r in alone]
    assert failed == [0, 12, 36]
    assert all(r.row["duplicates"] == r.row["wrong"] == 0 for r in alone)
    assert len(alone[0].events) == 30 and alone[0].row["lost"] == 0  # no failure, no loss


def test_irbr_forwards_fewer_messages_than_scribe() -> None:
    irbr, scribe = (run(IrbrRun(p, nodes=200, events=40, seed=2)) for p in ("irbr", "scribe"))
    assert irbr.row["interested"] == scribe.row["interested"] > 0
    assert irbr.row["forwards_per_event"] < scribe.row["forwards_per_event"]
    for a, b in zip(irbr.events, scribe.events, strict=True):
        assert a["interested"] == b["interested"] and a["forwards"] < b["forwards"]


def test_bad_configs_and_groups_are_refused() -> None:
    for bad in (
        {"protocol": "siena"},
        {"nodes": 1},
        {"failure": 1.0},
        {"failure": -0.1},
        {"events": 0},
        {"subscribers": 1.5},
        {"latency": 0.0},
    ):
        with pytest.raises(FlowbusError):
            IrbrRun(**{"protocol": "irbr", **bad})  # type: ignore[arg-type]
    with pytest.raises(FlowbusError, match="failure rate only"):
        run_group([IrbrRun("irbr", seed=1), IrbrRun("irbr", seed=2)])
    assert run_group([]) == []


def test_the_workload_is_seeded_and_skewed() -> None:
    work = QuoteWorkload(20, 1.0)
    a = [work.event(random.Random(3), i) for i in range(5)]
    assert a == [work.event(random.Random(3), i) for i in range(5)]
    rng = random.Random(4)
    symbols = [work.symbol(rng) for _ in range(4000)]
    assert symbols.count("s0") > 3 * symbols.count("s9") > 0  # Zipf: the first symbols dominate
    kinds = {len(work.subscription(rng).disjuncts[0].literals) for _ in range(200)}
    assert kinds == {1, 3}


def test_acknowledgements_find_the_dead_nodes_without_the_failure_notice() -> None:
    base = IrbrRun("irbr", nodes=150, failure=0.1, events=30, seed=1)
    acks, bare, oracle = (
        run(IrbrRun(**{**base.to_dict(), **change})).row
        for change in ({}, {"acks": False}, {"acks": False, "notice": 3.0})
    )
    assert base.acks and base.notice is None  # the defaults: acknowledgements, no oracle
    assert acks["interested"] == bare["interested"] == oracle["interested"] > 0
    assert acks["lost_reachable"] == 0 and acks["duplicates"] == 0
    assert acks["timeouts"] > 0 and acks["acks_per_event"] > 0 and acks["ack_messages"] > 0
    assert acks["acks"] is True and bare["acks"] is False  # the setting, not a count
    assert bare["lost"] > 0 and bare["acks_per_event"] == 0 == bare["timeouts"]  # nobody learns
    assert oracle["lost"] == 0 and oracle["acks_per_event"] == 0
    assert acks["delay_max"] > bare["delay_max"]  # a re-send comes after the timeout


def test_scribe_heartbeat_repair_reconnects_cut_subtrees() -> None:
    plain, repair = (
        run(IrbrRun(p, nodes=150, failure=0.1, events=30, seed=3)) for p in ("scribe", "scribe-repair")
    )
    assert plain.row["interested"] == repair.row["interested"] > 0
    assert 0 < repair.row["lost"] < plain.row["lost"]  # lost only until the children re-join
    lossy = {e["event"] for e in repair.events if e["lost"]}
    assert lossy <= {e["event"] for e in plain.events if e["lost"]}
    assert repair.row["duplicates"] == 0
    with pytest.raises(FlowbusError, match="heartbeat"):
        IrbrRun("scribe-repair", heartbeat=0.0)
