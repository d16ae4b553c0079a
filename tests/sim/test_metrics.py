"""Metrics: counts by type and reason, duplicates, hops, the JSON form."""

from __future__ import annotations

import json

from flowbus.sim import ConstantLatency, Metrics, Simulator

from .cores import Flood, Item, flooding_sim_nodes


def _flood(*, naive: bool, log: bool = False) -> Simulator:
    sim = Simulator(transport=[ConstantLatency(1.0)], metrics=Metrics(log=log))
    for i, core in enumerate(flooding_sim_nodes(30, 4, naive=naive)):
        sim.add_node(i, core)
    sim.inject(0, Flood(0, 1))
    sim.run()
    return sim


def test_flooding_delivers_once_per_node() -> None:
    m = _flood(naive=False).metrics
    assert m.deliveries == 30 and m.duplicates == 0
    assert sum(m.hops().values()) == 30 and m.hops()[0] == 1
    assert m.sent_by_type() == {"Flood": m.total_sent}


def test_naive_flooding_duplicates_are_detected() -> None:
    m = _flood(naive=True).metrics
    assert m.deliveries == m.received
    assert m.duplicates == m.deliveries - 30 > 0


def test_direct_counters_and_unhashable_events() -> None:
    m = Metrics(log=True)
    assert m.deliver(1, "s", Item(0, 0, 2), 0.5)
    assert not m.deliver(2, "s", Item(0, 0, 3), 0.7)  # Item's identity ignores hops
    assert m.deliver(1, "s", {"unhashable": 1}, 1.0)
    assert not m.deliver(1, "s", {"unhashable": 1}, 1.0)
    m.lost("loss")
    m.lost("loss")
    m.lost("crash")
    m.sent(Flood(0, 0))
    m.sent("text")
    d = m.to_dict()
    assert d["lost_by_reason"] == {"crash": 1, "loss": 2} and d["lost"] == 3
    assert d["sent_by_type"] == {"Flood": 1, "str": 1} and d["sent"] == 2
    assert d["hops"] == {"2": 1, "3": 1}
    assert d["deliveries"] == 4 and d["duplicates"] == 2
    assert m.log is not None and m.log[0].to_json() == [0.5, 1, "'s'", "Item(origin=0, seq=0, hops=2)"]
    json.dumps(d)


def test_to_dict_is_json_and_has_every_counter() -> None:
    sim = _flood(naive=False, log=True)
    d = sim.metrics.to_dict()
    assert set(d) == {
        "events", "sent", "sent_by_type", "received", "injected", "lost", "lost_by_reason",
        "deliveries", "duplicates", "hops", "timers_fired", "failure_notices",
    }  # fmt: skip
    assert d["events"] == sim.events_processed == d["received"]
    assert json.loads(json.dumps(d)) == d
    assert sim.metrics.log is not None and len(sim.metrics.log) == 30
