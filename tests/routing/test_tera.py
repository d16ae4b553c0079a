"""TERA baseline: a walk reaches the topic overlay through the APT, the event is flooded to
every member of the topic, each matching subscription gets it once whichever topic brought
it, and a walk with no APT hit expires at max hops."""

from __future__ import annotations

import random
from collections.abc import Hashable
from functools import partial
from typing import Any

import pytest

from flowbus.core import Effect
from flowbus.errors import ProtocolError
from flowbus.overlay.cbdlo_tree import RangeSubscription
from flowbus.overlay.cyclon import Apt
from flowbus.routing.crawl import Publication
from flowbus.routing.tera import TeraNode, TopicFlood
from flowbus.sim import ConstantLatency, Simulator


def _publish(pub: Publication, core: TeraNode) -> list[Effect]:
    return core.publish(pub)


class Obs:
    def __init__(self) -> None:
        self.ended: list[tuple[str, str, int]] = []

    def tera_walk_ended(self, pub: Publication, topic: str, outcome: str, hops: int) -> None:
        self.ended.append((topic, outcome, hops))


def _world(
    apt_entries: bool,
) -> tuple[Simulator, list[TeraNode], list[RangeSubscription], set[tuple[Hashable, int]], Obs]:
    n = 80
    rng = random.Random(4)
    subs = []
    members: dict[str, list[int]] = {"a": [], "b": []}
    for i in range(60):
        node = rng.randrange(20, n)  # nodes 0..19 subscribe to nothing
        attrs = rng.sample(["a", "b"], rng.randint(1, 2))
        lo = rng.uniform(0, 60)
        subs.append(RangeSubscription(i, node, tuple((t, lo, lo + 40) for t in attrs)))
        for t in attrs:
            if node not in members[t]:
                members[t].append(node)
    obs = Obs()
    got: set[tuple[Hashable, int]] = set()
    sim = Simulator(seed=1, transport=[ConstantLatency(1.0)],
                    on_deliver=lambda node, sub, pub, now: got.add((sub, pub.eid)))  # fmt: skip
    nodes = []
    for a in range(n):
        topics: dict[str, Any] = {}
        for t, ms in members.items():
            if a in ms:
                topics[t] = [m for m in rng.sample(ms, min(len(ms), 4)) if m != a][:3]
        apt = Apt(5, [(t, ms[0]) for t, ms in members.items()] if apt_entries else [])
        view = rng.sample([b for b in range(n) if b != a], 4)
        core = TeraNode(a, view=view, rng=rng, apt=apt, topic_views=topics, max_hops=6, observer=obs)
        nodes.append(core)
        sim.add_node(a, core)
    for s in subs:
        nodes[s.node].subscribe(s)
    return sim, nodes, subs, got, obs


def test_topic_flood_delivers_each_matching_subscription_once() -> None:
    sim, _, subs, got, obs = _world(True)
    rng = random.Random(6)
    for eid in range(20):
        values = {"a": rng.uniform(0, 100), "b": rng.uniform(0, 100)}
        pub = Publication.of(eid, values)
        sim.invoke(rng.randrange(20), partial(_publish, pub))
        sim.run()
        want = {s.sid for s in subs if s.matches(values)}
        assert {sid for sid, e in got if e == eid} == want
    assert sim.metrics.duplicates == 0
    assert {o for _, o, _ in obs.ended} == {"hit"} and all(h == 0 for _, _, h in obs.ended)
    flooded = sim.metrics.sent_by_type()["TopicFlood"]
    assert flooded >= 20 * (
        len({s.node for s in subs if "a" in s.attrs}) - 1
    )  # every member of a, each event


def test_without_apt_entries_walks_expire() -> None:
    sim, _, _, _, obs = _world(False)
    pub = Publication.of(0, {"a": 10.0})
    sim.invoke(0, lambda core: core.publish(pub))
    sim.run()
    ((topic, outcome, hops),) = obs.ended
    assert topic == "a" and (outcome == "hit" or (outcome, hops) == ("expired", 6))


def test_unknown_message() -> None:
    node = TeraNode(0, view=[1], rng=random.Random(0), apt=Apt(1))
    with pytest.raises(ProtocolError, match="unknown message"):
        node.on_message(1, "x", 0.0)
    assert node.on_message(1, TopicFlood(Publication.of(0, {"a": 1.0}), "a"), 0.0)[0].delay > 0  # type: ignore[union-attr]
