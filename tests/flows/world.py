"""A simulated ring of brokers with deployed flows, and the reference interpreter's outputs to compare."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Hashable, Mapping
from dataclasses import replace
from typing import Any

from flowbus.core import Ended
from flowbus.flow.deploy import Deployment
from flowbus.flow.graph import EventSpace, Graph
from flowbus.flow.local import LocalRun
from flowbus.flow.rewrite import exit_name
from flowbus.meta import EVENT_ID
from flowbus.routing.ring_broker import RingBroker
from flowbus.sim import CoordinateLatency, Simulator


class FlowWorld:
    """Ring brokers in custody mode; each delivery is settled ``ack_delay`` after it is made."""

    def __init__(self, n: int, seed: int, ack_delay: float = 1.0) -> None:
        self.sim = Simulator(seed=seed, transport=[CoordinateLatency(0.5, 2.0)], failure_notice=8.0)
        self.got: dict[Hashable, list[tuple[Any, dict[str, Any]]]] = defaultdict(list)
        self.ack_delay = ack_delay
        self.sim.on_deliver = self._delivered
        self.ended: dict[int, list[Hashable]] = defaultdict(list)  # broker -> subscriptions it ended
        self.sim.on_outcome = lambda node, o, now: (
            self.ended[node].extend(o.subs) if type(o) is Ended else None
        )
        self.brokers: list[RingBroker] = []
        self.published: dict[int, int] = {}  # broker -> events published there so far (their ids)
        rng = random.Random(seed)
        for a in range(n):
            b = RingBroker(a, backup=2, heartbeat=5.0, probe_timeout=10.0, ping_timeout=10.0,
                           custody=True, local_ack=True)  # fmt: skip
            self.brokers.append(b)
            self.sim.add_node(a, b)
            picks = rng.sample(range(a), min(3, a))
            self.sim.invoke(a, (lambda c: c.start()) if a == 0 else (lambda c, p=picks: c.join(p)))
            self.sim.run(until=self.sim.now + 40)

    def _delivered(self, node: int, sub: Hashable, event: Any, now: float) -> None:
        eid = event[EVENT_ID]
        self.got[sub].append((eid, {k: v for k, v in event.items() if not k.startswith("__")}))
        self.sim.invoke(node, lambda c: c.settle(sub, eid), at=now + self.ack_delay)

    def deploy(self, d: Deployment, at: int = 0) -> None:
        self.sim.invoke(at, lambda c: c.deploy(d, nonce=1)[1])
        self.settle()

    def subscribe(self, at: int, sub: Hashable, space: str, filt: str = "") -> None:
        self.sim.invoke(at, lambda c: c.subscribe_flow(sub, space, filt))

    def publish(self, at: int, events: list[tuple[str, dict[str, Any]]], *, batch: int = 50) -> None:
        """Publish ``events`` from broker ``at`` in order, ``batch`` at a time."""
        first = self.published.get(at, 0)
        self.published[at] = first + len(events)
        for i in range(0, len(events), batch):
            items = [
                ((f"pub{at}", first + i + j), {**e, "__space": s})
                for j, (s, e) in enumerate(events[i : i + batch])
            ]
            self.sim.invoke(at, lambda c, it=items: c.publish_batch(it))
            self.sim.run(until=self.sim.now + 0.5)

    def settle(self, t: float = 60.0) -> None:
        self.sim.run(until=self.sim.now + t)

    def received(self, sub: Hashable) -> list[dict[str, Any]]:
        """What ``sub`` got, once per event id (the client library drops duplicates)."""
        seen: set[Any] = set()
        out = []
        for eid, ev in self.got[sub]:
            if eid not in seen:
                seen.add(eid)
                out.append(ev)
        return out


def reference(
    d: Deployment, events: list[tuple[str, dict[str, Any]]], spaces: list[str]
) -> dict[str, list[Any]]:
    """What ``flowbus run --engine local`` delivers at each of ``spaces`` (made subscription points)."""
    g = d.graph
    marked = tuple(
        replace(sp, subscribe=True)
        if isinstance(sp, EventSpace) and sp.kind == "events" and sp.name in spaces
        else sp
        for sp in g.spaces
    )
    g = Graph(spaces=marked, arcs=g.arcs, functions=g.functions, name=g.name)
    run = LocalRun(g).run(events)
    return {s: run.outputs[exit_name(g, s)] for s in spaces}


def canon(events: list[Mapping[str, Any]]) -> Counter[str]:
    return Counter(repr(sorted((k, float(v) if isinstance(v, int) and not isinstance(v, bool) else v)
                               for k, v in e.items())) for e in events)  # fmt: skip


def per_key(events: list[Mapping[str, Any]], key: str) -> dict[Any, list[str]]:
    out: dict[Any, list[str]] = defaultdict(list)
    for e in events:
        out[e[key]].append(repr(sorted((k, float(v) if isinstance(v, int) else v) for k, v in e.items())))
    return dict(out)


def states(d: Deployment, events: list[dict[str, Any]], expand: str = "E4") -> dict[Any, list[Any]]:
    """Per key, the rows a subscriber of ``expand``'s target goes through with these events."""
    from flowbus.flow.validate import bind_rules

    bound = bind_rules(d.graph, d.graph.arc(expand))
    rows: dict[Any, Any] = {}
    seq: dict[Any, list[Any]] = {}
    for e in events:
        key = bound.key_of(e)
        new = bound.step(key, rows.get(key, bound.initial), e)
        if new is not None and new != rows.get(key, bound.initial):
            rows[key] = new
            seq.setdefault(key, []).append(new)
    return seq


def subsequence(part: list[Any], whole: list[Any]) -> bool:
    it = iter(whole)
    return all(any(x == y for y in it) for x in part)
