"""What one step of a ring broker with a deployed flow gives its driver: the edge's shared
results in one ``DeliverAll``, and when the events the folds derive are routed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.flows.world import reference

from flowbus.core import Deliver, DeliverAll, Effect, SetTimer, Settled
from flowbus.flow.deploy import Deployment
from flowbus.meta import EVENT_ID, PARTITION, SPACE
from flowbus.routing import flows
from flowbus.routing.cbr import ContentRouter
from flowbus.routing.flows import log_entry, log_folds
from flowbus.routing.ring_broker import DERIVED_NOW, DERIVED_TIMER, RingBroker
from flowbus.routing.ring_flows import FEW, FlowSide
from flowbus.routing.ring_keys import LOG

STOCKS = Path(__file__).parents[2] / "examples" / "stocks" / "flow.yaml"
SUBS = {
    "c1": ("combined", ""),
    "c2": ("combined", "price >= 0"),
    "c3": ("combined", ""),
    "m": ("compressed", ""),
}


def _broker(d: Deployment) -> RingBroker:
    b = RingBroker(0, backup=2, custody=True, local_ack=True, grouped=True)
    b.start()
    b.deploy(d, nonce=1)
    for sub, (space, filt) in SUBS.items():
        b.subscribe_flow(sub, space, filt)
    return b


def _publish(b: RingBroker, events: list[tuple[str, dict[str, Any]]], first: int) -> list[Effect]:
    return b.publish_batch([(("pub", first + i), {**e, "__space": s}) for i, (s, e) in enumerate(events)])


def _got(effects: list[Effect]) -> dict[str, list[dict[str, Any]]]:
    got: dict[str, list[dict[str, Any]]] = {s: [] for s in SUBS}
    for e in effects:
        if isinstance(e, DeliverAll | Deliver):
            for sub in e.subs if isinstance(e, DeliverAll) else (e.sub,):
                if sub in got:
                    got[sub].append({k: v for k, v in e.event.items() if not k.startswith("__")})
    return got


def test_shared_results_go_in_one_deliver_all_and_a_big_step_routes_what_it_derives() -> None:
    d = Deployment.from_file(STOCKS)
    events = list(d.generate(events=300))
    want = reference(d, events, ["combined", "compressed"])
    b = _broker(d)
    effects = _publish(b, events, 0)
    shared = [e for e in effects if isinstance(e, DeliverAll) and {"c1", "c2", "c3"} <= set(e.subs)]
    assert len(shared) == len(want["combined"])  # (one effect per event for the three)
    assert not any(isinstance(e, Deliver) and e.sub in ("c1", "c2", "c3") for e in effects)
    got = _got(effects)
    assert got["c1"] == got["c2"] == got["c3"] == want["combined"]
    assert len(want["compressed"]) >= DERIVED_NOW  # so the step routed them itself, in order:
    assert got["m"] == want["compressed"]


def test_alone_a_small_steps_derived_events_go_in_that_step_without_a_matcher_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d = Deployment.from_file(STOCKS)
    events = list(d.generate(events=6))
    want = reference(d, events, ["combined", "compressed"])
    b = _broker(d)
    passes: list[int] = []
    route = ContentRouter.route_batch
    counted = lambda r, evs, src: passes.append(len(evs)) or route(r, evs, src)  # noqa: E731
    monkeypatch.setattr(ContentRouter, "route_batch", counted)
    first = _publish(b, events[:3], 0)
    assert not [e for e in first if isinstance(e, SetTimer) and e.key == DERIVED_TIMER]
    second = _publish(b, events[3:], 3)
    assert _got(first)["m"] + _got(second)["m"] == want["compressed"] and _got(first)["m"]
    assert _got(first)["c1"] + _got(second)["c1"] == want["combined"]
    assert passes == []  # (the broker's own index: no neighbour subscribes)
    _publish(_broker(d), list(d.generate(events=FEW + 1)), 0)
    assert passes == [FEW + 1]  # (more than a few: the matcher's pass costs less)


def test_a_small_steps_derived_events_wait_for_the_next_publish_or_the_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a broker does when its neighbours subscribe (the matcher routes derived events)."""
    monkeypatch.setattr(FlowSide, "_route_alone", lambda self, events: None)
    d = Deployment.from_file(STOCKS)
    events = list(d.generate(events=6))
    want = reference(d, events, ["compressed"])["compressed"]
    b = _broker(d)
    first = _publish(b, events[:3], 0)
    assert [e for e in first if isinstance(e, SetTimer) and e.key == DERIVED_TIMER]
    assert _got(first)["m"] == []  # (they wait)
    second = _publish(b, events[3:], 3)  # they go first in this step's matcher pass
    taken = _got(second)["m"]
    rest = _got(b.on_timer(DERIVED_TIMER, 0.0))["m"]  # what the second step derived
    assert taken + rest == want and taken == want[: len(taken)] and taken
    eids = [e.event[EVENT_ID] for e in second if isinstance(e, DeliverAll | Deliver) and "m" in _subs(e)]
    assert len(eids) == len(set(eids))


def _subs(e: Deliver | DeliverAll) -> tuple[Any, ...]:
    return e.subs if isinstance(e, DeliverAll) else (e.sub,)


def test_an_owner_publishes_the_derived_events_some_subscription_needs_and_all_once_one_takes_all() -> None:
    d = Deployment.from_file(STOCKS)
    events = list(d.generate(events=1200))
    b = RingBroker(0, backup=2, custody=True, local_ack=True, grouped=True)
    b.start()
    b.deploy(d, nonce=1)
    b.subscribe_flow("a", "alarms", "")
    published: list[dict[str, Any]] = []
    route = b.flow_side._route_alone  # (alone, what the folds derive is routed there)
    b.flow_side._route_alone = lambda evs: published.extend(evs) or route(evs)  # type: ignore[method-assign]

    def drops() -> list[dict[str, Any]]:
        return [
            {k: v for k, v in e.items() if not k.startswith("__")} for e in published if e[SPACE] == "drops"
        ]

    got = _by_sub(_publish(b, events[:1000], 0) + b.on_timer(DERIVED_TIMER, 0.0))
    first = reference(d, events[:1000], ["alarms", "drops"])
    assert got["a"] == first["alarms"] and first["alarms"]  # (what alarms needs: drop > 20)
    assert drops() == first["alarms"] and len(first["drops"]) > 3 * len(first["alarms"])
    published.clear()
    b.subscribe_flow("d", "drops", "")  # (now every drop is wanted)
    got = _by_sub(_publish(b, events[1000:], 1000) + b.on_timer(DERIVED_TIMER, 0.0))
    both = reference(d, events, ["alarms", "drops"])
    assert drops() == both["drops"][len(first["drops"]) :]
    assert got["d"][-len(drops()) :] == drops()  # (after its snapshot)
    assert got["a"] == both["alarms"][len(first["alarms"]) :]


def _by_sub(effects: list[Effect]) -> dict[Any, list[dict[str, Any]]]:
    got: dict[Any, list[dict[str, Any]]] = {}
    for e in effects:
        if isinstance(e, DeliverAll | Deliver):
            for sub in _subs(e):
                got.setdefault(sub, []).append({k: v for k, v in e.event.items() if not k.startswith("__")})
    return got


def test_derived_events_delivered_only_here_are_in_no_custody_record() -> None:
    d = Deployment.from_file(STOCKS)
    events = list(d.generate(events=300))
    b = _broker(d)
    effects = _publish(b, events, 0)
    assert _got(effects)["m"] == reference(d, events, ["compressed"])["compressed"]
    held = [rec.event for rec in b.custodian.records.values()]
    assert len(held) > len(events) // 2 and not any(PARTITION in e for e in held)  # (sources only)
    counts: dict[Any, int] = {}
    for e in effects:
        if isinstance(e, DeliverAll | Deliver):
            counts[e.event[EVENT_ID]] = counts.get(e.event[EVENT_ID], 0) + len(_subs(e))
    results = effects + b.settle_many(list(counts.items()))  # (some settle as they are published)
    b.flow_side.backups_confirmed()
    results += b.settle_many([])
    settled = [eid for r in results if isinstance(r, Settled) for eid in r.ids]
    assert b.in_custody() == 0 and sorted(settled) == sorted(("pub", i) for i in range(len(events)))


def test_prepare_builds_what_the_next_events_need_once_the_tables_stop_changing() -> None:
    d = Deployment.from_file(STOCKS)
    events = list(d.generate(events=FEW + 8))
    b, plain = _broker(d), _broker(d)
    for x in (b, plain):
        for i in range(40):  # (enough for the router's matcher)
            x.subscribe_flow(f"p{i}", "combined", f"price >= {i}")
    local = b.router._match[b.addr]  # (the router's index of the local subscriptions)
    gate, own = b.flows.gate, b.flow_side.own

    def ready() -> bool:
        return local.uses_matcher and gate.version == own.version == b.router.changes

    b.prepare()
    assert not ready()  # (a first look: the tables may still be changing)
    b.prepare()
    assert ready() and {s for _, s in gate._now} == {"compressed", "drops"}
    b.subscribe_flow("late", "big_trades", "")
    b.prepare()
    assert not ready()  # (changed since the last call: not yet)
    b.prepare()
    assert ready()
    plain.subscribe_flow("late", "big_trades", "")
    assert _by_sub(_publish(b, events, 0)) == _by_sub(_publish(plain, events, 0))  # (the same answers)


def test_a_fold_log_entry_is_one_flat_tuple_that_reads_back_as_its_folds() -> None:
    folds = [
        (("pub", 1), ()),  # (a fold that published nothing)
        (("pub", 2), (("compressed", "max_cur", "('IBM',)", 7, 0, (("name", "IBM"), ("price", 1.0))),)),
        ("p3", (("drops", "trends", "('HP',)", 3, 0, (("n", 1), ("x", None))), ("s", "t", "k", 3, 1, ()))),
        ((("nested", 1), 4), (("s", "t", "k", 1, 0, (("b", True), ("i", 1), ("f", 1.0))),)),
        ((), ()),
        ((-1, "x"), ()),
    ]
    entry = log_entry(folds)
    assert [x for x in entry if isinstance(x, tuple)] == [(("nested", 1), 4)]  # (only an id of no scalars)
    back = log_folds(entry)
    assert back == folds and [type(v) for _, k in back for r in k for _, v in r[5]] == [
        str, float, int, type(None), bool, int, float,
    ]  # fmt: skip
    assert log_folds(()) == []


def _logs(b: RingBroker) -> dict[Any, tuple[Any, ...]]:
    return {k: v for k, v in b.ring.state.items() if isinstance(k, tuple) and k[0] == LOG}


def test_a_partition_logs_a_steps_folds_in_one_entry_and_drops_the_oldest_it_no_longer_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(flows, "SEEN", 250)
    d = Deployment.from_file(STOCKS)
    events = list(d.generate(events=400))
    b = _broker(d)
    (part,) = b.flows.parts.values()
    for step in range(4):  # (four steps of 100 events)
        _publish(b, events[100 * step : 100 * (step + 1)], 100 * step)
        logs = _logs(b)
        assert sorted(k[2] for k in logs) == list(range(max(0, step - 2), step + 1))  # (>= 250 ids kept)
    folded = [eid for k in sorted(logs) for eid, _ in log_folds(logs[k])]
    assert folded == [("pub", i) for i in range(100, 400) if ("pub", i) in part.seen] and len(folded) >= 250
    assert sorted(part.seen) == sorted(folded)
    again = _by_sub(_publish(b, events[300:], 300))  # (ids in the log: folded no more)
    assert "m" not in again and part.next_log == 4


def test_a_flow_deployed_here_is_built_once_and_a_neighbour_builds_it_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The deployment the broker was given is the one it installs (not built again from its
    text); a broker that gets the record from the ring builds it once."""
    d = Deployment.from_file(STOCKS)
    built: list[str] = []
    from_text = Deployment.from_text.__func__  # type: ignore[attr-defined]

    def counted(cls: type[Deployment], text: str) -> Deployment:
        built.append(text)
        return from_text(cls, text)

    monkeypatch.setattr(Deployment, "from_text", classmethod(counted))
    b = RingBroker(0, backup=2, custody=True, local_ack=True, grouped=True)
    b.start()
    rec, _ = b.deploy(d, nonce=1)
    assert b.flow_side.flows.deployments[rec.name] is d and built == []
    other = RingBroker(1, backup=2, custody=True, local_ack=True, grouped=True)
    other.start()
    other.flow_side.take_records((rec,), (), fresh=False, src=0)
    assert other.flow_side.flows.deployments[rec.name].name == d.name and built == [d.text]
