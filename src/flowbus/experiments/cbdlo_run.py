"""One CBDLO / Simple / TERA run: a network snapshot, a workload, events through the simulator.

The machinery :mod:`flowbus.experiments.cbdlo` sweeps; a run is described by a
:class:`CbdloRun` (checked when built) and gives one row.

How it works: :func:`build` makes the state a converged network would be in, directly,
without simulating the gossip that leads to it (the 004 document's experiments measure
routing on a settled overlay too):

* Views: each node's view is ``view`` distinct nodes drawn uniformly at random -- the
  random out-graph Cyclon converges to (:mod:`flowbus.overlay.cyclon` shows it stays so
  under churn; ``tests/overlay/test_cbdlo_cyclon.py`` checks it).
* Subscriptions (:class:`ZipfRangeWorkload`): ``subscriptions`` of them on random nodes,
  at most ``local_max`` per node. Attribute ``i`` (1-based) occurs in a subscription with
  probability ``mu * i^-alpha`` (the document's Zipf law, section 5.2; a subscription that
  draws none gets attribute 1);
  each predicate is a range of ``width_min..width_max`` of the value range ``[0, domain)``,
  stuck to one end of it (one bound: ``a >= v`` or ``a < v``) with probability
  ``one_sided``.
* Events carry ``event_attrs`` distinct attributes, drawn by the same Zipf weights ``i^-alpha``
  (sampling without replacement), with values uniform in ``[0, domain)``.
* CBDLO: the subscriptions go into the attribute topologies through the nodes' own
  ``subscribe``, in a simulator of their own: each subscription's predicates travel to
  their coordinators, which send the changed virtual-node records to the hosts
  (:mod:`flowbus.routing.cbdlo_maint`); one subscription every 2 time units (latency 1), so
  the coordinators see them in the order drawn. Those messages are the row's
  ``maintenance_build``. APTs: an LRU table of a node that has heard many descriptors holds the
  ``apt`` most recently heard distinct attributes, and in a stream of random descriptors
  those are a weighted sample without replacement, an attribute weighing as many as the
  nodes hosting it; so each APT is filled by :meth:`~flowbus.overlay.cyclon.Apt.learn` with
  such a sample (oldest first), each entry a random host of the attribute.
* TERA: a topic (attribute) overlay of its subscribers, each with ``topic_view`` random other
  members; APTs filled the same way, weighted by topic size.

:func:`run` then publishes ``events`` events from random nodes, one at a time, in a
:class:`~flowbus.sim.engine.Simulator` (latency 1), each run until its messages have
settled, and counts per event: messages by type, the subscriptions that should get it
(``expected``: their filters evaluated offline) and those that did (``delivered``), and
for CBDLO every walk's outcome and hops. ``messages`` are the routing messages (walks,
entries, tree steps, matches, floods); ``maintenance_messages`` the tree maintenance
messages, of the build and of the run (none without churn: Simple has no structure to keep,
TERA's topic overlays are built directly, unmodelled). Every random draw comes from a
stream derived from the seed.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Final

import numpy as np

from flowbus.core import Effect
from flowbus.errors import ExperimentError
from flowbus.experiments.config import fraction, integer, number, one_of
from flowbus.experiments.output import ProgressFn
from flowbus.overlay.cbdlo_tree import RangeSubscription, Topologies
from flowbus.overlay.cyclon import Apt
from flowbus.routing.cbdlo import CbdloNode
from flowbus.routing.cbdlo_maint import MESSAGES as MAINTENANCE
from flowbus.routing.crawl import Publication, Walk
from flowbus.routing.flooding import SimpleNode
from flowbus.routing.tera import TeraNode
from flowbus.sim.engine import Simulator, derive_seed
from flowbus.sim.transport import ConstantLatency

__all__ = [
    "PROTOCOLS",
    "CbdloRun",
    "Network",
    "Observer",
    "ZipfRangeWorkload",
    "build",
    "fill_apts",
    "maintenance_sent",
    "run",
    "subscribe_all",
]

PROTOCOLS: Final = ("simple", "cbdlo", "tera")
SETTLE: Final = 500.0
"""Time units each event is given to settle (latency 1: far more than any path)."""


@dataclass(frozen=True, slots=True)
class CbdloRun:
    """Everything one run depends on (recorded with its results)."""

    protocol: str = "cbdlo"
    nodes: int = 3000
    view: int = 10
    apt: int = 100
    max_hops: int = 10
    trace: int = 5
    subscriptions: int = 2000
    local_max: int = 100
    attributes: int = 20
    alpha: float = 0.9
    mu: float = 0.5
    event_attrs: int = 8
    width_min: float = 0.05
    width_max: float = 0.25
    one_sided: float = 0.5
    domain: float = 1000.0
    events: int = 100
    fanout: int = 2
    topic_view: int = 4
    seed: int = 1

    def __post_init__(self) -> None:
        one_of("protocol", self.protocol, PROTOCOLS)
        lows = {"nodes": 2, "view": 1, "apt": 0, "max_hops": 0, "trace": 0, "subscriptions": 1,
                "local_max": 1, "attributes": 1, "event_attrs": 1, "events": 1, "fanout": 0,
                "topic_view": 1, "seed": 0}  # fmt: skip
        for name, low in lows.items():
            integer(name, getattr(self, name), low)
        if self.view >= self.nodes:
            raise ExperimentError(f"view ({self.view}) must be smaller than nodes ({self.nodes})")
        if self.subscriptions > self.nodes * self.local_max:
            raise ExperimentError(
                f"{self.subscriptions} subscriptions do not fit {self.nodes} nodes x {self.local_max} each"
            )
        if self.event_attrs > self.attributes:
            raise ExperimentError(f"event_attrs ({self.event_attrs}) > attributes ({self.attributes})")
        number("alpha", self.alpha, low=0)
        number("domain", self.domain, low=0, strict=True)
        fraction("mu", self.mu, open_low=True)
        fraction("one_sided", self.one_sided)
        fraction("width_min", self.width_min, open_low=True)
        fraction("width_max", self.width_max, open_low=True)
        if self.width_min > self.width_max:
            raise ExperimentError(
                f"need width_min <= width_max, got width_min {self.width_min}, width_max {self.width_max}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------- workload


class ZipfRangeWorkload:
    """Subscriptions and events with Zipf-distributed attributes (see the module note)."""

    def __init__(self, c: CbdloRun) -> None:
        self.c = c
        self.names = [f"a{i}" for i in range(1, c.attributes + 1)]
        self.weights = [(i + 1) ** -c.alpha for i in range(c.attributes)]
        self.occurs = [min(1.0, c.mu * w) for w in self.weights]

    def subscription(self, rng: random.Random, sid: Hashable, node: int) -> RangeSubscription:
        c = self.c
        attrs = [a for a, p in zip(self.names, self.occurs, strict=True) if rng.random() < p] or [
            self.names[0]
        ]
        ranges = []
        for a in attrs:
            width = rng.uniform(c.width_min, c.width_max) * c.domain
            if rng.random() < c.one_sided:
                lo, hi = (0.0, width) if rng.random() < 0.5 else (c.domain - width, c.domain)
            else:
                lo = rng.uniform(0.0, c.domain - width)
                hi = lo + width
            ranges.append((a, round(lo, 3), round(hi, 3)))
        return RangeSubscription(sid, node, tuple(ranges))

    def event(self, rng: random.Random, eid: int) -> Publication:
        # weighted sampling without replacement (Efraimidis-Spirakis keys)
        keys = sorted(((rng.random() ** (1.0 / w), a) for a, w in zip(self.names, self.weights, strict=True)),
                      reverse=True)  # fmt: skip
        attrs = [a for _, a in keys[: self.c.event_attrs]]
        return Publication(eid, tuple((a, round(rng.uniform(0.0, self.c.domain), 3)) for a in attrs))


# -------------------------------------------------------------------------------- network


@dataclass(slots=True)
class Network:
    config: CbdloRun
    cores: list[Any]
    subs: list[RangeSubscription]
    topologies: Topologies | None
    observer: Observer
    build_s: float
    maintenance_build: int = 0


@dataclass(slots=True)
class Observer:
    """Collects the walks' outcomes (what PeerSim would call an observer)."""

    walks: list[tuple[int, str, str, int, int]] = field(
        default_factory=list
    )  # eid, attr, outcome, walked, restarts
    founds: list[tuple[int, str, int, int, int]] = field(default_factory=list)  # eid, attr, H1, H2, members

    def walk_ended(self, walk: Walk, outcome: str, node: int) -> None:
        self.walks.append((walk.pub.eid, walk.attr, outcome, walk.walked, walk.restarts))

    def found(self, walk: Walk, tree_hops: int, members: int) -> None:
        self.founds.append((walk.pub.eid, walk.attr, walk.walked, tree_hops, members))

    def tera_walk_ended(self, pub: Publication, topic: str, outcome: str, hops: int) -> None:
        self.walks.append((pub.eid, topic, outcome, hops, 0))


def _stream(c: CbdloRun, name: str) -> random.Random:
    return random.Random(derive_seed(c.seed, f"cbdlo/{name}"))


def _views(c: CbdloRun) -> list[list[int]]:
    rng = _stream(c, "views")
    n, k = c.nodes, c.view
    views = []
    for a in range(n):
        view: list[int] = []
        seen = {a}
        while len(view) < k:
            b = rng.randrange(n)
            if b not in seen:
                seen.add(b)
                view.append(b)
        views.append(view)
    return views


def _place(c: CbdloRun, work: ZipfRangeWorkload) -> list[RangeSubscription]:
    rng = _stream(c, "subscriptions")
    load = [0] * c.nodes
    subs = []
    for sid in range(c.subscriptions):
        node = rng.randrange(c.nodes)
        while load[node] >= c.local_max:
            node = rng.randrange(c.nodes)
        load[node] += 1
        subs.append(work.subscription(rng, sid, node))
    return subs


def fill_apts(apts: list[Apt], seed: int, weights: dict[str, int], hosts: dict[str, list[int]]) -> None:
    """Fill each APT as a converged LRU table would be: ``size`` distinct attributes drawn
    without replacement, proportionally to ``weights`` (Efraimidis-Spirakis keys, vectorised),
    each with a random one of its ``hosts``, learnt oldest first."""
    attrs = sorted(a for a, w in weights.items() if w > 0)
    if not apts or not attrs:
        return
    gen = np.random.default_rng(seed)
    w = np.array([weights[a] for a in attrs], dtype=float)
    n_hosts = np.array([len(hosts[a]) for a in attrs])
    k = min(max(a.size for a in apts), len(attrs))
    for start in range(0, len(apts), 10_000):
        chunk = apts[start : start + 10_000]
        keys = np.log(gen.random((len(chunk), len(attrs)))) / w
        order = np.argsort(-keys, axis=1, kind="stable")[:, :k]
        picks = (gen.random((len(chunk), k)) * n_hosts[order]).astype(np.int64)
        for apt, row, pick in zip(chunk, order.tolist(), picks.tolist(), strict=True):
            m = min(apt.size, k)
            apt.load(
                [
                    (attrs[j], hosts[attrs[j]][p])
                    for j, p in zip(reversed(row[:m]), reversed(pick[:m]), strict=True)
                ]
            )


def build(c: CbdloRun, *, progress: ProgressFn | None = None) -> Network:
    """The network snapshot of ``c`` (see the module note)."""
    t0 = time.perf_counter()
    work = ZipfRangeWorkload(c)
    views = _views(c)
    subs = _place(c, work)
    obs = Observer()
    rng = _stream(c, "cores")
    topologies: Topologies | None = None
    cores: list[Any]
    if c.protocol == "simple":
        cores = [
            SimpleNode(a, view=views[a], rng=rng, fanout=c.fanout, max_hops=c.max_hops)
            for a in range(c.nodes)
        ]
        for s in subs:
            cores[s.node].subscribe(s)
    elif c.protocol == "cbdlo":
        topologies = Topologies(0.0, c.domain)
        cores = [
            CbdloNode(a, topologies=topologies, rng=rng, view_size=c.view, shuffle_len=max(1, c.view // 2),
                      apt_size=c.apt, trace_len=c.trace, max_hops=c.max_hops, observer=obs)
            for a in range(c.nodes)
        ]  # fmt: skip
        maintenance = subscribe_all(c.seed, cores, subs, progress=progress)
        for a, core in enumerate(cores):
            core.cyclon.seed(views[a])
        hosts = {attr: tree.hosts() for attr, tree in topologies.trees.items()}
        weights = {attr: len(h) for attr, h in hosts.items()}
        fill_apts([core.apt for core in cores], derive_seed(c.seed, "cbdlo/apt"), weights, hosts)
        return Network(c, cores, subs, topologies, obs, time.perf_counter() - t0, maintenance)
    else:
        node_topics: dict[str, set[int]] = {}
        for s in subs:
            for attr in s.attrs:
                node_topics.setdefault(attr, set()).add(s.node)
        members = {attr: sorted(ns) for attr, ns in node_topics.items()}
        trng = _stream(c, "topics")
        topic_views: list[dict[str, list[int]]] = [{} for _ in range(c.nodes)]
        for attr, ms in members.items():
            for m in ms:
                others = [x for x in trng.sample(ms, min(len(ms), c.topic_view + 1)) if x != m]
                topic_views[m][attr] = others[: c.topic_view]
        weights = {attr: len(ms) for attr, ms in members.items()}
        apts = [Apt(c.apt) for _ in range(c.nodes)]
        fill_apts(apts, derive_seed(c.seed, "cbdlo/apt"), weights, members)
        cores = []
        for a, apt in enumerate(apts):
            cores.append(TeraNode(a, view=views[a], rng=rng, apt=apt, topic_views=topic_views[a],
                                  max_hops=c.max_hops, observer=obs))  # fmt: skip
        for s in subs:
            cores[s.node].subscribe(s)
    return Network(c, cores, subs, topologies, obs, time.perf_counter() - t0)


def maintenance_sent(sim: Simulator) -> int:
    """The tree maintenance messages ``sim`` has sent."""
    sent = sim.metrics.sent_by_type()
    return sum(sent.get(k, 0) for k in MAINTENANCE)


def subscribe_all(
    seed: int, cores: list[Any], subs: list[RangeSubscription], *, progress: ProgressFn | None = None
) -> int:
    """Every subscription through its node's ``subscribe`` in a simulator (one every 2 time
    units, latency 1), run until the trees settle; return the maintenance messages sent."""
    sim = Simulator(seed=seed, transport=[ConstantLatency(1.0)])
    for a, core in enumerate(cores):
        sim.add_node(a, core)
    for i, s in enumerate(subs):
        sim.invoke(s.node, partial(_subscribe, s), at=2.0 * i)
    step = 5000
    for i in range(0, len(subs), step):
        sim.run(until=2.0 * (i + step))
        if progress is not None:
            progress("subscribing", min(i + step, len(subs)), len(subs))
    sim.run()
    return maintenance_sent(sim)


def _subscribe(sub: RangeSubscription, core: Any) -> list[Effect]:
    return core.subscribe(sub)  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------------ run


def run(c: CbdloRun, *, progress: ProgressFn | None = None, network: Network | None = None) -> dict[str, Any]:
    """Publish ``c.events`` events on the network of ``c``; one result row (see the module note)."""
    net = network if network is not None else build(c, progress=progress)
    t0 = time.perf_counter()
    got: set[tuple[Hashable, int]] = set()
    sim = Simulator(seed=c.seed, transport=[ConstantLatency(1.0)],
                    on_deliver=lambda node, sub, pub, now: got.add((sub, pub.eid)))  # fmt: skip
    for a, core in enumerate(net.cores):
        sim.add_node(a, core)
    work = ZipfRangeWorkload(c)
    rng = _stream(c, "events")
    by_attr: dict[str, list[RangeSubscription]] = {}
    for s in net.subs:
        by_attr.setdefault(s.attrs[0], []).append(s)
    expected = delivered = 0
    per_event: list[dict[str, Any]] = []
    for i in range(c.events):
        pub = work.event(rng, i)
        src = rng.randrange(c.nodes)
        before = sim.metrics.total_sent - maintenance_sent(sim)
        at = i * SETTLE
        sim.invoke(src, partial(_publish, pub), at=at)
        sim.run(until=at + SETTLE - 1)
        values = pub.as_dict()
        want = {s.sid for a in values if a in by_attr for s in by_attr[a] if s.matches(values)}
        hit = {sid for sid, eid in got if eid == i}
        wrong = len(hit - want)
        if wrong:
            raise ExperimentError(
                f"{c.protocol}: event {i} delivered to {wrong} subscriptions that do not match it"
            )
        got.clear()
        expected += len(want)
        delivered += len(hit)
        routing = sim.metrics.total_sent - maintenance_sent(sim) - before
        per_event.append({"messages": routing, "expected": len(want), "delivered": len(hit)})
        if progress is not None:
            progress(f"{c.protocol}: events", i + 1, c.events)
    sim.run()
    return _row(c, net, sim, per_event, expected, delivered, time.perf_counter() - t0)


def _publish(pub: Publication, core: Any) -> list[Effect]:
    return core.publish(pub)  # type: ignore[no-any-return]


def _row(
    c: CbdloRun,
    net: Network,
    sim: Simulator,
    per_event: list[dict[str, Any]],
    expected: int,
    delivered: int,
    run_s: float,
) -> dict[str, Any]:
    messages = sum(e["messages"] for e in per_event)
    completeness = delivered / expected if expected else 1.0
    maintenance = net.maintenance_build + maintenance_sent(sim)
    row: dict[str, Any] = {
        **c.to_dict(),
        "messages": messages,
        "messages_per_event": messages / c.events,
        "maintenance_messages": maintenance,
        "maintenance_build": net.maintenance_build,
        "maintenance_per_subscription": net.maintenance_build / c.subscriptions,
        "expected": expected,
        "delivered": delivered,
        "completeness": completeness,
        "effective_cost": messages / completeness if completeness > 0 else float("inf"),
        "sent_by_type": sim.metrics.sent_by_type(),
        "duplicates": sim.metrics.duplicates,
        "build_s": net.build_s,
        "run_s": run_s,
    }
    obs = net.observer
    if c.protocol == "cbdlo":
        row.update(_cbdlo_stats(c, net, obs))
    elif c.protocol == "tera":
        outcomes = Counter(w[2] for w in obs.walks)
        row["walks"] = len(obs.walks)
        row["walk_hits"] = outcomes["hit"]
    else:
        row["comparisons_per_event"] = sum(core.comparisons for core in net.cores) / c.events
        row["reached_per_event"] = sum(core.reached for core in net.cores) / c.events
    return row


def _cbdlo_stats(c: CbdloRun, net: Network, obs: Observer) -> dict[str, Any]:
    assert net.topologies is not None
    trees = net.topologies.trees
    with_tree = [w for w in obs.walks if w[1] in trees]
    outcomes = Counter(w[2] for w in with_tree)
    hits = [w for w in with_tree if w[2] == "hit"]
    found = obs.founds
    h1 = [f[2] for f in found]
    h2 = [f[3] for f in found]
    per_event_cost: dict[int, float] = {}
    for eid, _, walked, tree_hops, _ in found:
        per_event_cost[eid] = per_event_cost.get(eid, 0.0) + c.apt * walked + tree_hops
    for eid, _, outcome, walked, _ in obs.walks:
        if outcome != "hit":
            per_event_cost[eid] = per_event_cost.get(eid, 0.0) + c.apt * walked
    sizes = [len(t) for t in trees.values()]
    heights = [t.height() for t in trees.values()]
    subs_per_tree = [t.subscriptions for t in trees.values()]
    return {
        "walks": len(obs.walks),
        "walks_no_topology": len(obs.walks) - len(with_tree),
        "walk_hits": outcomes["hit"],
        "walk_expired": outcomes["expired"],
        "walk_gave_up": sum(n for k, n in outcomes.items() if k.startswith("gave-up")),
        "walk_restarts": sum(w[4] for w in with_tree),
        "hit_rate": outcomes["hit"] / len(with_tree) if with_tree else 0.0,
        "hit_rate_10": sum(1 for w in hits if w[3] <= 10) / len(with_tree) if with_tree else 0.0,
        "h1_mean": sum(h1) / len(h1) if h1 else 0.0,
        "h2_mean": sum(h2) / len(h2) if h2 else 0.0,
        "h2_max": max(h2, default=0),
        "matching_cost_per_event": sum(per_event_cost.values()) / c.events,
        "matching_cost_per_attribute": sum(per_event_cost.values()) / max(1, len(obs.walks)),
        "topologies": len(trees),
        "vnodes_max": max(sizes, default=0),
        "vnodes_per_subscription_max": max(
            (v / s for v, s in zip(sizes, subs_per_tree, strict=True)), default=0.0
        ),
        "tree_height_max": max(heights, default=0),
    }
