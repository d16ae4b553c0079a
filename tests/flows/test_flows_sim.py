"""Flows on a simulated ring of brokers: the same outputs as the reference interpreter."""

from __future__ import annotations

from pathlib import Path

from flowbus.flow.deploy import Deployment
from tests.flows.world import FlowWorld, canon, per_key, reference

STOCKS = Path(__file__).parents[2] / "examples" / "stocks" / "flow.yaml"


def test_the_stock_flow_on_three_brokers_delivers_what_the_interpreter_does() -> None:
    d = Deployment.from_file(STOCKS)
    w = FlowWorld(3, seed=1)
    w.deploy(d)
    assert all(b.flows.records.keys() == {"stocks"} for b in w.brokers)
    spaces = ["combined", "big_trades", "compressed", "alarms", "drops"]
    for i, b in enumerate(w.brokers):
        for s in spaces:
            w.subscribe(b.addr, (s, i), s)
    w.subscribe(2, "big", "big_trades", "cap >= 5000000")
    w.settle()
    events = list(d.generate(events=1500))
    w.publish(0, events)
    w.settle(200)
    ref = reference(d, events, spaces)
    for s in ["combined", "big_trades"]:
        for i in range(3):
            assert canon(w.received((s, i))) == canon(ref[s]), (s, i)
    for s in ["compressed", "drops", "alarms"]:
        for i in range(3):
            assert per_key(w.received((s, i)), "name") == per_key(ref[s], "name"), (s, i)
    assert canon(w.received("big")) == canon([e for e in ref["big_trades"] if e["cap"] >= 5000000])
