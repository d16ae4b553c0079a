"""Flows on a simulated ring of brokers: the same outputs as the reference interpreter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.flows.specgen import random_deployment
from tests.flows.world import FlowWorld, canon, per_key, reference, states, subsequence
from tests.spark.flowgen import random_events

from flowbus.errors import UserError
from flowbus.filters.expr import parse_expression
from flowbus.filters.text import literal_to_text
from flowbus.flow.deploy import Deployment
from flowbus.meta import SPACE
from flowbus.routing.ring_broker import RingBroker

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


def replay(d: Deployment, state: str, expand: str, events: list[dict[str, Any]]) -> dict[Any, Any]:
    """The rows a subscriber of ``expand``'s target reaches by folding what it got with the expand's rules."""
    from flowbus.flow.validate import bind_rules

    bound = bind_rules(d.graph, d.graph.arc(expand))
    rows: dict[Any, Any] = {}
    for e in events:
        key = bound.key_of(e)
        new = bound.step(key, rows.get(key, bound.initial), e)
        if new is not None:
            rows[key] = new
    return rows


@pytest.mark.slow  # (a few seconds of simulation: not in make check)
@pytest.mark.parametrize("seed", [1, 2])
def test_a_crash_of_a_state_owner_loses_and_duplicates_nothing(seed: int) -> None:
    d = Deployment.from_file(STOCKS)
    w = FlowWorld(4, seed=seed)
    w.deploy(d)
    order = sorted(w.brokers, key=lambda b: b.node_id)
    parts = {b.addr: len(b.flows.parts) for b in order}
    assert sum(parts.values()) == 4
    victim = order[2]
    alive = [b for b in order if b is not victim]
    spaces = ["combined", "big_trades", "compressed", "alarms"]
    for b in alive:
        for s in spaces:
            w.subscribe(b.addr, (s, b.addr), s)
    w.settle()
    events = list(d.generate(events=2000, seed=seed))
    publisher = alive[0].addr
    w.sim.crash(victim.addr, at=w.sim.now + 10.25)
    w.publish(publisher, events, batch=25)
    w.settle(600)
    taken = [p for b in alive for p in b.flows.parts if p[4] == victim.node_id]
    assert len(taken) == 1  # its partition is served by the broker that took it over
    ref = reference(d, events, spaces)
    final = replay(d, "max_cur", "E4", ref["compressed"])
    history = states(d, ref["compressed"])
    for b in alive:
        for s in ["combined", "big_trades", "alarms"]:
            assert canon(w.received((s, b.addr))) == canon(ref[s]), (s, b.addr)
        got = w.received(("compressed", b.addr))
        assert replay(d, "max_cur", "E4", got) == final
        seen = states(d, got)  # every state the subscriber goes through is the offline run's, in order
        assert all(subsequence(seen[k], history[k]) for k in seen)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_flows_on_three_brokers_deliver_what_the_interpreter_does(seed: int) -> None:
    d = random_deployment(seed)
    w = FlowWorld(3, seed=seed)
    w.deploy(d)
    spaces = [s.name for s in d.spaces.values() if s.kind != "state"]
    derived = {s.name for s in d.spaces.values() if s.derived}
    for s in spaces:
        w.subscribe(1, s, s)
        w.subscribe(2, (s, "filtered"), s, 'k = "a"')
    w.settle()
    events = random_events(d.graph, seed, 600)
    w.publish(0, events)
    w.settle(200)
    ref = reference(
        d,
        events,
        [s for s in spaces if d.spaces[s].kind == "events"]
        + [s for s in spaces if d.spaces[s].kind == "sink"],
    )
    for s in spaces:
        want = ref.get(s, [e for p, e in events if p == s])
        if d.subscription(s).sources & derived:
            assert per_key(w.received(s), "k") == per_key(want, "k"), s
            assert per_key(w.received((s, "filtered")), "k") == per_key(
                [e for e in want if e["k"] == "a"], "k"
            ), s
        else:
            assert canon(w.received(s)) == canon(want), s
            assert canon(w.received((s, "filtered"))) == canon([e for e in want if e["k"] == "a"]), s


def test_a_late_subscriber_starts_from_the_shortest_sequence_to_the_current_state() -> None:
    d = Deployment.from_file(STOCKS)
    w = FlowWorld(3, seed=4)
    w.deploy(d)
    w.subscribe(1, "early", "compressed")
    w.settle()
    events = list(d.generate(events=1200))
    w.publish(0, events[:800])
    w.settle(100)
    w.subscribe(2, "late", "compressed")
    company = reference(d, events[:800], ["compressed"])["compressed"][0]["name"]
    w.subscribe(2, "late-one", "compressed", f'name = "{company}"')  # (a snapshot is checked at the edge)
    w.settle(20)
    first = list(w.received("late"))
    w.publish(0, events[800:])
    w.settle(100)
    ref = reference(d, events, ["compressed"])["compressed"]
    mid = replay(d, "max_cur", "E4", reference(d, events[:800], ["compressed"])["compressed"])
    assert replay(d, "max_cur", "E4", first) == mid  # the snapshot reaches the state...
    assert len(first) <= 2 * len(mid)  # ... by the shortest way (max then current: two at most)
    assert replay(d, "max_cur", "E4", w.received("late")) == replay(d, "max_cur", "E4", ref)
    assert per_key(w.received("early"), "name") == per_key(ref, "name")
    assert per_key(w.received("late-one"), "name") == {company: per_key(w.received("late"), "name")[company]}


def test_deploys_are_idempotent_and_a_second_version_of_a_name_is_refused() -> None:
    d = Deployment.from_file(STOCKS)
    w = FlowWorld(3, seed=5)
    w.deploy(d)
    b = w.brokers[1]
    rec, effects = b.deploy(d, nonce=7)
    assert effects == [] and rec == w.brokers[0].flows.records["stocks"]
    other = Deployment.from_text(d.text.replace("cap >= 1000000", "cap >= 2000000"))
    with pytest.raises(UserError, match=r"flow 'stocks' is deployed already with version"):
        b.deploy(other, nonce=8)
    assert b.flows.records["stocks"] == rec


def test_two_versions_deployed_at_once_end_as_the_same_one_everywhere() -> None:
    d = Deployment.from_file(STOCKS)
    other = Deployment.from_text(d.text.replace("cap >= 1000000", "cap >= 2000000"))
    w = FlowWorld(4, seed=6)
    w.sim.invoke(0, lambda c: c.deploy(d, nonce=1)[1])
    w.sim.invoke(3, lambda c: c.deploy(other, nonce=1)[1])
    w.settle()
    winner = min(d.version, other.version)
    assert {b.flows.records["stocks"].version for b in w.brokers} == {winner}
    parts = [p for b in w.brokers for p in b.flows.parts]
    assert len(parts) == 4 and {p[2] for p in parts} == {w.brokers[0].flows.records["stocks"].deploy_id}


def test_an_undeploy_reaches_every_broker_and_a_joining_broker_gets_the_flows() -> None:
    d = Deployment.from_file(STOCKS)
    w = FlowWorld(3, seed=7)
    w.deploy(d)
    late = RingBroker(
        9, backup=2, heartbeat=5.0, probe_timeout=10.0, ping_timeout=10.0, custody=True, local_ack=True
    )
    w.sim.add_node(9, late)
    w.sim.invoke(9, lambda c: c.join([0]))
    w.settle(80)
    assert late.flows.records.keys() == {"stocks"} and not late.flows.parts  # (it owns nothing)
    w.subscribe(1, "s", "compressed")
    w.settle()
    w.publish(0, list(d.generate(events=100)))
    w.settle()
    assert any(k[0] == "frow" for b in w.brokers for k in b.ring.state)
    w.sim.invoke(2, lambda c: c.undeploy("stocks"))
    w.settle()
    for b in [*w.brokers, late]:
        assert not b.flows.records and not b.flows.parts and not b.flows.subs
        assert not any(isinstance(k, tuple) and k[0] in ("frow", "fsub") for k in b.ring.state)
    assert w.ended[1] == ["s"]  # (the broker's Ended outcome: its driver ends the subscription)


@pytest.mark.parametrize(
    ("space", "filt", "error"),
    [
        ("nowhere", "", r"no deployed flow has a space 'nowhere'"),
        ("max_cur", "", r"space 'max_cur' of flow 'stocks' is a state: subscribe to what lies downstream"),
        ("big_trades", "price > 3", r"unknown field 'price' in space 'big_trades' \(fields: com, cap\)"),
    ],
)
def test_a_bad_flow_subscription_is_refused_by_name_and_changes_nothing(
    space: str, filt: str, error: str
) -> None:
    d = Deployment.from_file(STOCKS)
    w = FlowWorld(1, seed=8)
    w.deploy(d)
    b = w.brokers[0]
    before = (set(b.subs), dict(b.ring.state))
    with pytest.raises(UserError, match=error):
        b.subscribe_flow("x", space, filt)
    assert (set(b.subs), dict(b.ring.state)) == before


def stateless_stocks() -> Deployment:
    """The stock flow without its state regions (stamps no events for partitions)."""
    spec = yaml.safe_load(Deployment.from_file(STOCKS).text)
    keep = {"NYSE", "NASDAQ", "combined", "capital", "big_trades"}
    spec["spaces"] = {k: v for k, v in spec["spaces"].items() if k in keep}
    spec["arcs"] = [a for a in spec["arcs"] if a["from"] in keep and a["to"] in keep]
    spec.pop("rulesets")
    return Deployment.from_spec(spec)


def test_a_filter_over_a_computed_field_stops_unwanted_events_at_the_publishers_broker() -> None:
    d = stateless_stocks()
    # cap = price * vol: a derived attribute of each source (stamped by the publisher's broker)
    # compared by a plain predicate the matchers index
    routed = d.subscription("big_trades", "cap >= 5000000").routing
    assert {f"__x.{d.name}.{s}.0 >= 5000000" for s in ("NYSE", "NASDAQ", "combined")} <= {
        literal_to_text(lit) for c in routed.disjuncts for lit in c.literals
    }
    assert d.derived["combined"][0] == {parse_expression("price * vol"): f"__x.{d.name}.combined.0"}
    w = FlowWorld(2, seed=9)
    w.deploy(d)
    w.subscribe(1, "big", "big_trades", "cap >= 5000000")
    w.settle()
    events = list(d.generate(events=2000))
    before = w.sim.metrics.sent_by_type().get("Publish", 0)
    w.publish(0, events)
    w.settle()
    left = w.sim.metrics.sent_by_type().get("Publish", 0) - before
    want = [e for e in reference(d, events, ["big_trades"])["big_trades"] if e["cap"] >= 5000000]
    assert canon(w.received("big")) == canon(want)
    # what left broker 0: the events the routed filter takes, stamped as broker 0 stamps them
    # (those the subscriber wants, and those whose company the lookup does not know: the
    # transform drops them at the edge)
    stamped = [{**e, "__space": s} for s, e in events]
    for e in stamped:
        d.stamp(e)
    routed = sum(d.subscription("big_trades", "cap >= 5000000").routing.matches(e) for e in stamped)
    assert len(want) <= left == routed < len(events) / 10


def test_each_broker_counts_the_events_through_the_routes_and_arcs_it_runs() -> None:
    d = Deployment.from_file(STOCKS)
    w = FlowWorld(1, seed=3)
    w.deploy(Deployment.from_text(d.text))  # (the broker's own: it counts; d is the reference's)
    w.subscribe(0, "all", "combined")
    w.subscribe(0, "big", "big_trades")
    w.settle()
    events = list(d.generate(events=300))
    w.publish(0, events)
    w.settle(60)
    counts = w.brokers[0].flows.deployments["stocks"].counts
    ref = reference(d, events, ["combined", "big_trades", "compressed"])
    sub = d.subscription("combined")
    nyse = sum(1 for s, e in events if s == "NYSE" and sub.deliver({**e, SPACE: s}))  # (T1 defined)
    assert counts["NYSE->combined.sub"] == nyse > 100  # a route: each event once per route
    assert counts["T1"] == nyse  # T1 is on three routes from NYSE: still once per event
    assert counts["S"] == len(ref["big_trades"])  # (the events that passed the select)
    assert counts["C4"] == counts["C5"] == len(ref["combined"])  # every combined event is a tick, folded
    assert counts["E4"] == len(ref["compressed"])  # what the expand published


def test_owners_publish_drops_only_as_far_as_the_subscriptions_on_the_ring_need_them() -> None:
    d = Deployment.from_file(STOCKS)
    w = FlowWorld(3, seed=2)
    w.deploy(d)
    w.subscribe(1, "alarms", "alarms")
    w.settle()
    published: list[dict[str, Any]] = []
    for b in w.brokers:
        route = b.route_own
        b.route_own = lambda evs, route=route: published.extend(evs) or route(evs)  # type: ignore[method-assign]
    events = list(d.generate(events=1600))
    w.publish(0, events[:1000])
    w.settle(100)
    first = reference(d, events[:1000], ["alarms", "drops"])
    drops = [e for e in published if e[SPACE] == "drops"]
    assert len(drops) == len(first["alarms"]) < len(first["drops"]) // 100  # (only those over 20)
    w.subscribe(2, "late", "drops")  # (a subscription on another broker opens it)
    w.settle(20)
    published.clear()
    w.publish(0, events[1000:])
    w.settle(100)
    both = reference(d, events, ["alarms", "drops"])
    later = both["drops"][len(first["drops"]) :]
    assert len([e for e in published if e[SPACE] == "drops"]) == len(later)
    got = per_key(w.received("late"), "name")
    for name, want in per_key(later, "name").items():
        assert got[name][-len(want) :] == want  # (after its snapshot)
    assert per_key(w.received("alarms"), "name") == per_key(both["alarms"], "name")


def test_a_source_read_by_a_collapse_and_a_transform_runs_on_the_brokers_as_in_the_interpreter() -> None:
    """The source feeds a transform and a collapse (the rewrite gives it an exit node of its
    own, ``trades.sub``, for the collapse): every derived event the interpreter gives, at
    every broker, per key in the state's order."""
    d = Deployment.from_text(
        """
name: direct
spaces:
  trades: {kind: source, schema: {symbol: str, quantity: int, level: int}}
  big: {kind: sink, schema: {symbol: str, quantity: int}}
  tally: {kind: state, schema: {symbol: str, n: int, last: int}, key: [symbol], initial: {n: 0, last: 0}}
  counted: {kind: sink, schema: {symbol: str, n: int, quantity: int}}
rulesets:
  tally: {key: {symbol: symbol}, rules: [{set: {n: n + 1, last: quantity}}]}
  counts: {key: {symbol: symbol}, rules: [{set: {n: event.n, last: event.quantity}}]}
arcs:
  - {name: T, from: trades, to: big, transform: {symbol: symbol, quantity: quantity * level}}
  - {name: C, from: trades, to: tally, collapse: tally}
  - {name: E, from: tally, to: counted, expand: counts}
"""
    )
    w = FlowWorld(3, seed=2)
    w.deploy(d)
    for i, b in enumerate(w.brokers):
        w.subscribe(b.addr, ("counted", i), "counted")
        w.subscribe(b.addr, ("big", i), "big")
    w.settle()
    events = [("trades", {"symbol": f"S{k % 7}", "quantity": k, "level": k % 5}) for k in range(400)]
    w.publish(0, events)
    w.settle(200)
    ref = reference(d, events, ["big", "counted"])
    assert len(ref["counted"]) == 400 and ref["big"]
    for i in range(3):
        assert canon(w.received(("big", i))) == canon(ref["big"])
        assert per_key(w.received(("counted", i)), "symbol") == per_key(ref["counted"], "symbol")
