"""The chordal ring adapting to load and latency (the 003 document's adaptation triggers):
``flowbus sim ring-adapt``.

How it works (Madhu Kumar, Bellur, Govindan, "Chordal Reliability Rings", section 2's
triggers "load change", "publishing rate variation" and "express event delivery"; section
3.4's three steps of a loaded broker; section 3.3.3's express range):

* Part ``load`` (table ``rows``): a ring of ``brokers``
  :class:`~flowbus.overlay.chordal_ring.RingNode` cores in the simulator, heartbeats every
  time unit, each with ``entries`` state entries and a ``rate_limit`` of events routed per
  time unit. Every entry attracts ``cold_rate`` events a time unit, but the entries of one
  broker (the *hot* one) ramp from ``cold_rate`` to ``hot_rate`` over ``ramp`` time units:
  its publishers got busy. A broker over its limit passes entries, and their traffic, to a
  ring neighbour with room; when no neighbour has any, it asks for a broker, and the
  "cluster" (this driver) starts one that joins next to the most loaded asker, at most one
  a time unit, up to ``max_brokers``. Each time unit a row: brokers, the hot broker's load, the largest and
  mean load, shares and requests so far, and the entries held (all distinct; those not
  held at that moment are in a ``ShareState`` on its way); once the run settles, the
  entries lost and held twice.
* Part ``latency`` (table ``latency``): the broker multigraph
  (:func:`~flowbus.overlay.multigraph.ring_deployment`, ``nodes`` brokers) with one
  :class:`~flowbus.overlay.class_router.ClassRouter` each measuring its links from
  heartbeats every ``beat``. Each time unit one express event bounded by ``bound`` goes
  between each of ``pairs`` fixed pairs of brokers. At ``slow_at`` the links the express
  paths used slow to ``slow_latency`` (above the bound). Per time unit of sending: events,
  mean and largest delivery latency, the largest of those that kept to express links
  within the bound, how many of those crossed a slowed link on their last hop, and how
  many fell back to the normal route (no express path within the bound left: the normal
  route knows no bound and may cross a slowed link).
* Shares are acknowledged (``ShareAck``; re-sent after a timeout, taken back in the end):
  the load rows count the ``ShareState`` and ``ShareAck`` messages the simulator carried,
  and the shares sent again and taken back; ``share_loss`` loses each of those messages
  with that probability.
* Part ``brokers`` (table ``brokers``): the brokers' own core
  (:class:`~flowbus.routing.ring_broker.RingBroker` with
  :class:`~flowbus.routing.express.ExpressRoutes`, what a broker process runs), a ring of
  ``express_brokers`` measuring their links from the ring heartbeats (every time unit),
  ``express_bound`` the express range. A subscription to the express space at each broker;
  the first broker by id publishes one event a time unit. At ``slow_at`` its link to its
  tree neighbour slows by ``slow_latency`` each way, at ``recover_at`` it is fast again. Per
  time unit of sending: the deliveries, the mean and largest delivery latency, and whether
  the first hop went round the slow link (a ``Detour``) or direct.
"""

from __future__ import annotations

import random
import time
from collections.abc import Hashable
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import numpy as np

from flowbus.core import Effect
from flowbus.errors import ExperimentError
from flowbus.experiments.config import OneSeed, integer, number
from flowbus.experiments.output import Csv, OutputFiles, ProgressFn, Result
from flowbus.experiments.ring_plots import plot_adapt
from flowbus.experiments.ring_sim import BrokerRing, LinkLatency, LoseShares, RingSim, SlowLinks
from flowbus.filters import parse
from flowbus.meta import SPACE
from flowbus.overlay.class_router import Classed, ClassRouter
from flowbus.overlay.multigraph import LinkClass, ring_deployment
from flowbus.routing.express import ExpressRoutes
from flowbus.sim.engine import Simulator, derive_seed

__all__ = ["RingAdapt", "run_adapt"]


@dataclass(frozen=True, slots=True)
class RingAdapt(OneSeed):
    """Load rising on one broker of a ring; express links slowing (see the module note)."""

    NAME: ClassVar[str] = "ring-adapt"

    brokers: int = 8
    max_brokers: int = 16
    entries: int = 10
    rate_limit: float = 100.0
    cold_rate: float = 1.0
    hot_rate: float = 80.0
    ramp: float = 30.0
    duration: float = 60.0
    nodes: int = 64
    pairs: int = 20
    bound: float = 5.0
    beat: float = 2.0
    slow_at: float = 20.0
    slow_latency: float = 25.0
    recover_at: float = 40.0
    express_brokers: int = 8
    express_bound: float = 4.0
    share_loss: float = 0.0
    seed: int = 1

    def __post_init__(self) -> None:
        integer("ring-adapt: brokers", self.brokers, 3)
        integer("ring-adapt: max_brokers", self.max_brokers, self.brokers)
        integer("ring-adapt: entries", self.entries, 2)
        integer("ring-adapt: nodes", self.nodes, 5)
        integer("ring-adapt: pairs", self.pairs, 1)
        integer("ring-adapt: express_brokers", self.express_brokers, 3)
        number("ring-adapt: express_bound", self.express_bound, low=0.0, strict=True)
        number("ring-adapt: recover_at", self.recover_at, low=self.slow_at, strict=True)
        if not 0 <= number("ring-adapt: share_loss", self.share_loss, low=0.0) < 1:
            raise ExperimentError(f"ring-adapt: share_loss is a probability below 1, got {self.share_loss!r}")
        for key in ("rate_limit", "hot_rate", "ramp", "duration", "bound", "beat", "slow_at"):
            number(f"ring-adapt: {key}", getattr(self, key), low=0.0, strict=True)
        number("ring-adapt: cold_rate", self.cold_rate, low=0.0)
        number("ring-adapt: slow_latency", self.slow_latency, low=self.bound, strict=True)
        integer("seed", self.seed, 0)


def run_adapt(config: RingAdapt, *, progress: ProgressFn | None = None) -> Result:
    """Both parts (see the module note)."""
    t0 = time.perf_counter()
    rows, held, shares = _load(config, progress)
    latency, slowed = _latency(config)
    brokers = _brokers(config)
    last = rows[-1]
    seen_slow = config.slow_at + 2 * (config.bound + config.beat)
    findings = {
        "brokers_added": last["brokers"] - config.brokers,
        "shares": last["shares"],
        "requests": last["requests"],
        "hot_load_peak": max(r["hot_load"] for r in rows),
        "max_load_end": last["max_load"],
        "entries_lost": config.brokers * config.entries - len(set(held)),
        "entries_twice": len(held) - len(set(held)),
        "slowed_links": slowed,
        "latency_before": _mean(latency, lambda r: r["t"] + r["latency_max"] < config.slow_at),
        "latency_after": _mean(latency, lambda r: r["t"] >= seen_slow),
        **shares,
        "brokers_detoured": sum(r["detour"] for r in brokers),
        "brokers_lost": sum(r["sent"] - r["delivered"] for r in brokers),
    }
    files = OutputFiles(
        (
            Csv("rows", "rows.csv"),
            Csv("latency", "latency.csv", "latency"),
            Csv("brokers", "brokers.csv", "brokers"),
        ),
        plot_adapt,
    )
    timing = {"seconds": round(time.perf_counter() - t0, 3)}
    tables = {"latency": latency, "brokers": brokers}
    return Result(config, files, rows, findings=findings, tables=tables, timing=timing)


def _mean(rows: list[dict[str, Any]], when: Any) -> float:
    """The mean latency of the rows ``when`` picks: before (all arrived before the links
    slowed) or after (sent once a silence of twice the bound had shown them slow)."""
    picked = [r["latency_mean"] for r in rows if when(r) and r["delivered"]]
    return round(float(np.mean(picked)), 3) if picked else 0.0


# ---------------------------------------------------------------------------------- load


def _load(
    c: RingAdapt, progress: ProgressFn | None
) -> tuple[list[dict[str, Any]], list[Hashable], dict[str, int]]:
    """The rows, the entries held once the shares on their way have arrived, and the share
    messages then (sent, acknowledged, sent again, taken back)."""
    r = RingSim(
        seed=c.seed,
        heartbeat=1.0,
        layers=[LoseShares(c.share_loss)],
        node_options={"rate_limit": c.rate_limit},
    )
    r.grow(c.brokers)
    hot = r.by_id()[0]
    for nd in r.live:
        for k in range(c.entries):
            r.call(nd.addr, lambda x, a=nd.addr, k=k: x.set_state(("e", a, k), k))
    r.settle(5.0)
    start = r.sim.now

    def rate_of(key: Hashable) -> float:
        if isinstance(key, tuple) and key[1] == hot.addr:
            up = min(1.0, (r.sim.now - start) / c.ramp)
            return c.cold_rate + up * (c.hot_rate - c.cold_rate)
        return c.cold_rate

    rows, answered = [], 0
    for step in range(1, int(c.duration) + 1):
        r.drive_load(rate_of, 1.0)
        fresh = [q for _, q in r.requests[answered:]]
        if fresh and len(r.live) < c.max_brokers:  # (the most loaded asker; one a time unit)
            r.join_through(max(fresh, key=lambda q: (q.load, -q.peer.addr)).peer.addr)
        answered = len(r.requests)
        rows.append(_load_row(r, hot.addr, step))
        if progress is not None:
            progress("time units", step, int(c.duration))
    r.settle(5.0 if not c.share_loss else 4 * r.probe_timeout)  # (lost shares: tried 3 times)
    sent = r.sim.metrics.sent_by_type()
    shares = {
        "share_messages": sent.get("ShareState", 0),
        "share_acks": sent.get("ShareAck", 0),
        "shares_resent": sum(nd.shares.resent for nd in r.nodes),
        "shares_taken_back": sum(nd.shares.taken_back for nd in r.nodes),
    }
    return rows, [k for nd in r.live for k in nd.state], shares


def _load_row(r: RingSim, hot: int, step: int) -> dict[str, Any]:
    now = r.sim.now
    live = [nd for nd in r.live if nd.joined]
    loads = [nd.load(now) for nd in live]
    keys = [k for nd in live for k in nd.state]
    sent = r.sim.metrics.sent_by_type()
    return {
        "t": step,
        "brokers": len(live),
        "hot_load": round(r.nodes[hot].load(now), 3),
        "max_load": round(max(loads), 3),
        "mean_load": round(float(np.mean(loads)), 3),
        "shares": sum(nd.loads.shares for nd in r.nodes),
        "share_msgs": sent.get("ShareState", 0),
        "share_acks": sent.get("ShareAck", 0),
        "resent": sum(nd.shares.resent for nd in r.nodes),
        "taken_back": sum(nd.shares.taken_back for nd in r.nodes),
        "requests": len(r.requests),
        "entries_held": len(keys),
        "entries_distinct": len(set(keys)),
    }


# ------------------------------------------------------------------------------- latency


def _latency(c: RingAdapt) -> tuple[list[dict[str, Any]], int]:
    rng = random.Random(derive_seed(c.seed, "ring-adapt/deployment"))
    truth = ring_deployment(c.nodes, express_fraction=0.5, secure_fraction=0.0, rng=rng)
    view = truth.copy()
    routers = [ClassRouter(b, view, heartbeat=c.beat) for b in truth.brokers]
    got: list[tuple[Classed, float]] = []
    sim = Simulator(seed=c.seed, transport=[LinkLatency(truth)], failure_notice=10.0)
    sim.on_deliver = lambda node, sub, event, now: got.append((event, now))
    for router in routers:
        sim.add_node(router.broker, router)
        sim.invoke(router.broker, lambda x: x.start())
    pick = random.Random(derive_seed(c.seed, "ring-adapt/pairs"))
    pairs = [tuple(pick.sample(range(c.nodes), 2)) for _ in range(c.pairs)]
    for t in range(int(c.duration)):
        for i, (a, b) in enumerate(pairs):
            sim.invoke(a, partial(_send, b, (t, i), c.bound, float(t)), at=float(t))
    slowed: set[int] = set()

    def slow() -> None:
        for a, b in pairs:
            path = view.path(a, b, cls=LinkClass.EXPRESS, bound=c.bound)
            slowed.update(path.links if path is not None else ())
        for key in sorted(slowed):
            truth.measure(key, c.slow_latency)

    sim.schedule(c.slow_at, slow)
    sim.run(until=c.duration + 4 * c.slow_latency)
    rows = []
    for t in range(int(c.duration)):
        mine = [(e, now) for e, now in got if e.payload[0] == t]
        lat = [now - e.sent for e, now in mine]
        express = [now - e.sent for e, now in mine if not e.fell_back]
        rows.append({
            "t": t,
            "sent": len(pairs),
            "delivered": len(mine),
            **_latency_cols(lat),
            "express_max": round(max(express), 3) if express else 0.0,
            "over_slowed": sum(e.link in slowed for e, _ in mine if not e.fell_back),
            "fell_back": sum(e.fell_back for e, _ in mine),
        })  # fmt: skip
    return rows, len(slowed)


def _send(dst: int, payload: Any, bound: float, now: float, router: ClassRouter) -> list[Effect]:
    return router.send(dst, payload, LinkClass.EXPRESS, now, bound=bound)


# ------------------------------------------------------------------------------- brokers


def _brokers(c: RingAdapt) -> list[dict[str, Any]]:
    slow = SlowLinks()
    ring = BrokerRing(c.express_brokers, seed=c.seed, backup=2, heartbeat=1.0, layers=[slow])
    for b in ring.brokers:
        b.express = ExpressRoutes(b.addr, bound=c.express_bound, is_express=_URGENT.__eq__)
    order = ring.order()
    for i, b in enumerate(order):
        ring.sim.invoke(b.addr, partial(_subscribe, f"s{i}"))
    ring.settle(10.0)
    start, src, link = ring.sim.now, order[0], frozenset((order[0].addr, order[1].addr))
    ring.got.clear()
    ring.sim.schedule(start + c.slow_at, partial(slow.slow.__setitem__, link, c.slow_latency))
    ring.sim.schedule(start + c.recover_at, partial(slow.slow.pop, link))
    for t in range(int(c.duration)):
        ring.sim.invoke(src.addr, partial(_urgent, t), at=start + t)
    detours: dict[int, int] = {}
    for t in range(int(c.duration)):
        ring.sim.run(until=start + t + 0.5)
        detours[t] = src.express.detours
    ring.settle(4 * c.slow_latency)
    rows = []
    for t in range(int(c.duration)):
        lat = [now - start - t for _, ev, now in ring.got if ev["t"] == t]
        rows.append({
            "t": t,
            "sent": len(order),
            "delivered": len(lat),
            **_latency_cols(lat),
            "detour": int(detours[t] > detours.get(t - 1, 0)),
        })  # fmt: skip
    return rows


_URGENT = "urgent"


def _subscribe(sub: str, broker: Any) -> list[Effect]:
    return list(broker.subscribe(sub, parse(f'{SPACE} = "{_URGENT}"')))


def _urgent(t: int, broker: Any) -> list[Effect]:
    return list(broker.publish({SPACE: _URGENT, "t": t}))


def _latency_cols(lat: list[float]) -> dict[str, float]:
    """A table row's mean and worst delivery latency (0 with no delivery)."""
    return {
        "latency_mean": round(float(np.mean(lat)), 3) if lat else 0.0,
        "latency_max": round(max(lat), 3) if lat else 0.0,
    }
