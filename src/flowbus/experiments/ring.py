"""The chordal ring's experiments (the 003 document): join and repair cost, classes, crashes.

How it works: each experiment is a config -- :class:`RingJoin`, :class:`RingRepair`,
:class:`RingClasses`, :class:`RingFaults`, checked when built -- and a run of it
(:func:`run_join`, ...) that gives a :class:`~flowbus.experiments.output.Result`: its rows
go to ``rows.csv``, everything to ``result.json``, and a PNG
(:mod:`~flowbus.experiments.ring_plots`) to ``<experiment>.png``. The rings live in the
simulator (:mod:`~flowbus.experiments.ring_sim`).

* ``ring-join``: one ring grown by ``max(sizes)`` joins; for each size of ``sizes``, the
  mean and maximum of the messages one join sent and of the brokers it touched, over the
  ``window`` joins just below that size. The document claims O(1): four brokers updated.
* ``ring-repair``: a ring of each size, with chords, one state entry per broker and
  backup factor 2. Heartbeats on; then, ``trials`` times, something breaks and the repair
  is measured until the ring is whole again:

  - a broker crash (detection, test by the neighbour's neighbour, divide-neighbour,
    takeover, redirects);
  - a ring-link failure (detection and confirmation that the broker is alive);
  - a chord-link failure (a traced query and its ``LinkDown``).

  Repair messages are every message but heartbeats, counted from the failure until the
  ring is consistent again and nothing is left in flight; the time runs from the failure
  to the last repair message. The summary fits messages against log2 n per kind
  (:func:`~flowbus.experiments.stats.fit_log`): the document's O(log n) claim.
* ``ring-classes``: secure and express events over the broker multigraph
  (:func:`~flowbus.overlay.multigraph.ring_deployment`, one
  :class:`~flowbus.overlay.class_router.ClassRouter` per broker). Some links are express
  (low latency), some secure, some pairs have an extra parallel secure link. Phase
  ``intact``: ``events`` events of each class (normal, express, secure) between random
  pairs of brokers; phase ``failed``: the same after a fraction ``link_failures`` of the
  links went down, which the brokers learn only from failed sends. Per phase and class:
  events sent, delivered, undeliverable (no path of the class), violations (hops over a
  link lacking the class, counted by the receiving broker), express fallbacks, mean hops,
  and the mean, median and 99th-percentile latency.
* ``ring-faults``: delivery while brokers crash, for each backup factor and scenario, on
  a fresh ring of :class:`~flowbus.routing.ring_broker.RingBroker` cores with
  ``subs_per_broker`` subscriptions each. One event per time unit is published from
  random brokers that never crash, before, during and after the crashes: ``single`` (three
  brokers far apart, 60 units apart), ``adjacent`` (a broker and its Right at once: the
  neighbour holding its first backup), ``skip-one`` (a broker and its neighbour's
  neighbour at once). Every subscription counts as live throughout (its client re-attaches
  to whichever broker serves it); one whose every backed-up copy died with its broker is
  lost, and so are its events: that is what the backup factor buys. Per row: events,
  expected deliveries (filters evaluated offline), delivered, lost, duplicated, and the
  publish-to-delivery delay (mean, p99, max).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Final

import numpy as np

from flowbus.core import Effect
from flowbus.errors import ExperimentError
from flowbus.experiments.config import OneSeed, fraction, integer, one_of, unique
from flowbus.experiments.output import Csv, OutputFiles, ProgressFn, Result
from flowbus.experiments.ring_plots import plot_classes, plot_faults, plot_join, plot_repair
from flowbus.experiments.ring_sim import BrokerRing, LinkLatency, RingSim, ring_errors
from flowbus.experiments.stats import fit_log
from flowbus.filters import Filter, parse
from flowbus.overlay.class_router import Classed, ClassRouter
from flowbus.overlay.multigraph import LinkClass, ring_deployment
from flowbus.routing.ring_broker import RingBroker
from flowbus.sim import LinkFailure
from flowbus.sim.engine import Simulator, derive_seed

__all__ = [
    "CLASSES",
    "KINDS",
    "SCENARIOS",
    "RingClasses",
    "RingFaults",
    "RingJoin",
    "RingRepair",
    "run_classes",
    "run_faults",
    "run_join",
    "run_repair",
]

HEARTBEAT: Final = 5.0
KINDS: Final = ("node", "ring-link", "chord-link")
CLASSES: Final = (LinkClass.NORMAL, LinkClass.EXPRESS, LinkClass.SECURE)
SCENARIOS: Final = ("single", "adjacent", "skip-one")


def _files(plot: Any) -> OutputFiles:
    return OutputFiles((Csv("rows", "rows.csv"),), plot)


def _sizes(experiment: str, sizes: Any, low: int) -> tuple[int, ...]:
    """``sizes`` as a tuple if it is a non-empty list of ints >= ``low`` (repeats are run once)."""
    if (
        isinstance(sizes, str)
        or not isinstance(sizes, Sequence)
        or not sizes
        or any(type(n) is not int or n < low for n in sizes)
    ):
        raise ExperimentError(f"{experiment}: sizes must be a list of ints >= {low}, got {sizes!r}")
    return tuple(sizes)


# ---------------------------------------------------------------------------------- join


@dataclass(frozen=True, slots=True)
class RingJoin(OneSeed):
    """One ring grown by joins; the cost of a join at each of ``sizes`` brokers."""

    NAME: ClassVar[str] = "ring-join"

    sizes: tuple[int, ...] = (16, 64, 256, 1024, 4096)
    seed: int = 1
    window: int = 32

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", _sizes("ring-join", self.sizes, 2))
        integer("seed", self.seed, 0)
        integer("window", self.window, 1)


def run_join(config: RingJoin, *, progress: ProgressFn | None = None) -> Result:
    """Messages and touched brokers per join, at each ring size (see the module note)."""
    t0 = time.perf_counter()
    top = max(config.sizes)
    r = RingSim(seed=config.seed, backup=2)
    for k in range(top):
        r.grow(1, chords=False)
        if progress is not None and (k + 1) % 64 == 0:
            progress("joins", k + 1, top)
    errors = ring_errors(r.live)
    rows: list[dict[str, Any]] = []
    for n in sorted(set(config.sizes)):
        joins = r.joins[max(1, n - config.window) : n]
        rows.append({
            "nodes": n,
            "joins": len(joins),
            "messages_mean": float(np.mean([j.messages for j in joins])),
            "messages_max": max(j.messages for j in joins),
            "touched_mean": float(np.mean([j.touched for j in joins])),
            "touched_max": max(j.touched for j in joins),
        })  # fmt: skip
    findings = {
        "consistent": not errors,
        "fit_messages": fit_log([row["nodes"] for row in rows], [row["messages_mean"] for row in rows]),
    }
    return Result(config, _files(plot_join), rows, findings=findings, timing=_timing(t0))


def _timing(t0: float) -> dict[str, Any]:
    return {"wall_s": time.perf_counter() - t0}


# -------------------------------------------------------------------------------- repair


@dataclass(frozen=True, slots=True)
class RingRepair(OneSeed):
    """Rings of each of ``sizes`` brokers; ``trials`` failures of each kind in each."""

    NAME: ClassVar[str] = "ring-repair"

    sizes: tuple[int, ...] = (64, 256, 1024, 4096)
    trials: int = 5
    seed: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", _sizes("ring-repair", self.sizes, 8))
        integer("ring-repair: trials", self.trials, 1)
        integer("seed", self.seed, 0)


def run_repair(config: RingRepair, *, progress: ProgressFn | None = None) -> Result:
    """Repair messages and time after a node, ring-link and chord-link failure, per size."""
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for i, n in enumerate(sorted(set(config.sizes))):
        rows.extend(_repairs(n, config.trials, config.seed))
        if progress is not None:
            progress("ring sizes", i + 1, len(config.sizes))
    summary = []
    for kind in KINDS:
        by_n: dict[int, list[tuple[float, float]]] = {}
        for r in rows:
            if r["kind"] == kind and r["repaired"]:
                by_n.setdefault(r["nodes"], []).append((r["messages"], r["time"]))
        means = {
            n: (float(np.mean([m for m, _ in v])), float(np.mean([t for _, t in v]))) for n, v in by_n.items()
        }
        ns = sorted(means)
        summary.append({
            "kind": kind,
            "by_nodes": [{"nodes": n, "messages_mean": means[n][0], "time_mean": means[n][1]} for n in ns],
            "fit_messages": fit_log(ns, [means[n][0] for n in ns]),
            "repaired": sum(1 for r in rows if r["kind"] == kind and r["repaired"]),
            "trials": sum(1 for r in rows if r["kind"] == kind),
        })  # fmt: skip
    return Result(config, _files(plot_repair), rows, summary, timing=_timing(t0))


def _repairs(n: int, trials: int, seed: int) -> list[dict[str, Any]]:
    cut = LinkFailure()
    r = RingSim(seed=seed, backup=2, layers=[cut]).grow(n)
    for nd in r.live:
        r.call(nd.addr, lambda c, a=nd.addr: c.set_state(("sub", a), a))
        r.call(nd.addr, lambda c: c.start_heartbeats(HEARTBEAT))
    r.heartbeat = HEARTBEAT  # from now on the ring never falls silent: settle for a span
    r.settle(4 * HEARTBEAT)
    rng = random.Random(seed * 1_000_003 + n)
    out = []
    for trial in range(trials):
        for kind in KINDS:
            out.append({"nodes": n, "trial": trial, "kind": kind, **_one_repair(r, cut, kind, rng)})
    return out


def _repair_messages(r: RingSim) -> int:
    sent = r.sim.metrics.sent_by_type()
    return sum(v for k, v in sent.items() if k not in ("Heartbeat", "HeartbeatAck"))


def _one_repair(r: RingSim, cut: LinkFailure, kind: str, rng: random.Random) -> dict[str, Any]:
    order = r.by_id()
    a = order[rng.randrange(len(order))]
    before, start = _repair_messages(r), r.sim.now
    last = start
    if kind == "node":
        target = a
        r.crash([a])
    elif kind == "ring-link":
        target = order[(order.index(a) + 1) % len(order)]
        cut.fail(a.addr, target.addr)
    else:
        alive = {nd.me: nd for nd in order}
        chords = [p for p in a.chords.values() if p in alive]  # (a chord may point at a broker
        if not chords:  # an earlier trial crashed: its death reaches only its own neighbours)
            return {"messages": 0, "time": 0.0, "repaired": False}
        far = max(chords, key=lambda p: p.id)
        target = alive[far]
        cut.fail(a.addr, target.addr)
        r.call(a.addr, lambda c: c.route(far.id, "probe"))  # the first use of the link finds it down
    seen = before
    r.sim.on_deliver = _ignore
    repaired = False
    for _ in range(400):
        r.sim.run(until=r.sim.now + 1.0)
        now_sent = _repair_messages(r)
        if now_sent != seen:
            seen, last = now_sent, r.sim.now
        quiet = r.sim.now - last > 3 * HEARTBEAT
        if kind == "node":
            repaired = not ring_errors(r.live) and quiet
        elif kind == "ring-link":
            repaired = target.me.id in a.detour and quiet
        else:
            repaired = bool(a.detour.get(target.me.id)) and quiet
        if repaired:
            break
    if kind != "node":
        cut.restore(a.addr, target.addr)
        a.detour.pop(target.me.id, None)
        target.detour.pop(a.me.id, None)
    return {"messages": seen - before, "time": last - start, "repaired": repaired}


def _ignore(node: int, sub: Any, event: Any, now: float) -> None:
    return None


# ------------------------------------------------------------------------------- classes


@dataclass(frozen=True, slots=True)
class RingClasses(OneSeed):
    """Events of each class over a multigraph of ``nodes`` brokers, links intact then failed."""

    NAME: ClassVar[str] = "ring-classes"

    nodes: int = 256
    events: int = 1000
    express: float = 0.3
    secure: float = 0.3
    parallel_secure: float = 0.2
    link_failures: float = 0.1
    seed: int = 1

    def __post_init__(self) -> None:
        integer("ring-classes: nodes", self.nodes, 5)
        integer("ring-classes: events", self.events, 1)
        for key in ("express", "secure", "parallel_secure"):
            fraction(f"ring-classes: {key}", getattr(self, key))
        fraction("ring-classes: link_failures", self.link_failures, open_high=True)
        integer("seed", self.seed, 0)


def run_classes(config: RingClasses, *, progress: ProgressFn | None = None) -> Result:
    """Violations, latency and hops of each class, links intact then failed (see the module note)."""
    c = config
    t0 = time.perf_counter()
    rng = random.Random(derive_seed(c.seed, "ring-classes/deployment"))
    truth = ring_deployment(
        c.nodes,
        express_fraction=c.express,
        secure_fraction=c.secure,
        rng=rng,
        parallel_secure=c.parallel_secure,
    )
    view = truth.copy()
    routers = [ClassRouter(b, view) for b in truth.brokers]
    got: list[tuple[Classed, float]] = []
    sim = Simulator(seed=c.seed, transport=[LinkLatency(truth)], failure_notice=10.0)
    sim.on_deliver = lambda node, sub, event, now: got.append((event, now))
    for r in routers:
        sim.add_node(r.broker, r)
    pick = random.Random(derive_seed(c.seed, "ring-classes/events"))
    rows = []
    for phase in ("intact", "failed"):
        if phase == "failed":
            keys = sorted(link.key for link in truth.links())
            for key in pick.sample(keys, round(c.link_failures * len(keys))):
                truth.fail_link(key)
        for cls in CLASSES:
            rows.append(_phase(sim, routers, got, pick, phase, cls, c.events))
            if progress is not None:
                progress("phases x classes", len(rows), 2 * len(CLASSES))
    links = list(truth.links())
    findings = {
        "links": len(links),
        "express_links": sum(LinkClass.EXPRESS in link.classes for link in links),
        "secure_links": sum(LinkClass.SECURE in link.classes for link in links),
        "failed_links": len(truth.failed),
        "violations": sum(r.violations for r in routers),
    }
    return Result(config, _files(plot_classes), rows, findings=findings, timing=_timing(t0))


def _phase(
    sim: Simulator,
    routers: list[ClassRouter],
    got: list[tuple[Classed, float]],
    pick: random.Random,
    phase: str,
    cls: LinkClass,
    events: int,
) -> dict[str, Any]:
    got.clear()
    undeliverable = sum(r.undeliverable for r in routers)
    violations = sum(r.violations for r in routers)
    n = len(routers)
    start = sim.now
    for i in range(events):
        a, b = pick.sample(range(n), 2)
        at = start + 0.01 * i
        sim.invoke(a, partial(_send, b, i, cls, at), at=at)
    sim.run()
    lat = np.array([now - e.sent for e, now in got]) if got else np.zeros(1)
    return {
        "phase": phase,
        "cls": cls.name.lower(),
        "sent": events,
        "delivered": len(got),
        "undeliverable": sum(r.undeliverable for r in routers) - undeliverable,
        "violations": sum(r.violations for r in routers) - violations,
        "fell_back": sum(e.fell_back for e, _ in got),
        "hops_mean": float(np.mean([e.hops for e, _ in got])) if got else 0.0,
        "latency_mean": float(lat.mean()),
        "latency_p50": float(np.percentile(lat, 50)),
        "latency_p99": float(np.percentile(lat, 99)),
    }


def _send(dst: int, payload: int, cls: LinkClass, now: float, router: ClassRouter) -> list[Effect]:
    return router.send(dst, payload, cls, now)


# -------------------------------------------------------------------------------- faults


@dataclass(frozen=True, slots=True)
class RingFaults(OneSeed):
    """Backup factors x crash scenarios (x custody), each on a fresh ring of ``nodes`` brokers."""

    NAME: ClassVar[str] = "ring-faults"

    nodes: int = 24
    backups: tuple[int, ...] = (1, 2, 3, 4)
    scenarios: tuple[str, ...] = SCENARIOS
    seed: int = 1
    subs_per_broker: int = 2
    events: int = 300
    custody: tuple[bool, ...] = (False,)

    def __post_init__(self) -> None:
        for s in unique("ring-faults: scenarios", self.scenarios):
            one_of("scenario", s, SCENARIOS)
        integer("ring-faults: nodes", self.nodes, 8)
        for b in unique("ring-faults: backups", self.backups):
            if b not in (1, 2, 3, 4) or type(b) is not int:
                raise ExperimentError(f"ring-faults: backups must be in 1..4, got {list(self.backups)}")
        integer("ring-faults: events", self.events, 10)
        integer("ring-faults: subs_per_broker", self.subs_per_broker, 0)
        for held in unique("ring-faults: custody", self.custody):
            if type(held) is not bool:
                raise ExperimentError(f"ring-faults: custody must list true or false, got {held!r}")
        integer("seed", self.seed, 0)
        for key in ("backups", "scenarios", "custody"):
            object.__setattr__(self, key, tuple(getattr(self, key)))


def run_faults(config: RingFaults, *, progress: ProgressFn | None = None) -> Result:
    """Lost, duplicated and delayed deliveries per custody x backup x scenario (see the module note)."""
    t0 = time.perf_counter()
    rows = []
    total = len(config.backups) * len(config.scenarios) * len(config.custody)
    for held in config.custody:
        for backup in config.backups:
            for scenario in config.scenarios:
                rows.append(_crashes(config, backup, scenario, held))
                if progress is not None:
                    progress("custody x backup x scenario", len(rows), total)
    return Result(config, _files(plot_faults), rows, timing=_timing(t0))


def _subscribe(sub: Hashable, filt: Filter, broker: RingBroker) -> list[Effect]:
    return broker.subscribe(sub, filt)


def _publish(event: dict[str, Any], broker: RingBroker) -> list[Effect]:
    return broker.publish(event)


def _victims(ring: BrokerRing, scenario: str, rng: random.Random) -> list[list[RingBroker]]:
    order = ring.order()
    n = len(order)
    i = rng.randrange(n)
    if scenario == "single":
        return [[order[(i + k * n // 3) % n]] for k in range(3)]
    step = {"adjacent": 1, "skip-one": 2}[scenario]
    return [[order[i], order[(i + step) % n]]]


def _crashes(c: RingFaults, backup: int, scenario: str, custody: bool) -> dict[str, Any]:
    """One fresh ring, its subscriptions, the scenario's crashes while events are published."""
    ring = BrokerRing(c.nodes, seed=c.seed, backup=backup, custody=custody)
    rng = random.Random(derive_seed(c.seed, f"ring-faults/{scenario}/{backup}"))
    subs: dict[Hashable, Filter] = {}
    for b in ring.brokers:
        for k in range(c.subs_per_broker):
            sid = (b.addr, k)
            subs[sid] = parse(f"x >= {rng.randrange(80)} & x < {rng.randrange(80, 101)}")
            ring.sim.invoke(b.addr, partial(_subscribe, sid, subs[sid]))
    ring.settle(100.0)
    waves = _victims(ring, scenario, rng)
    crashed = {b.addr for w in waves for b in w}
    publishers = [b.addr for b in ring.brokers if b.addr not in crashed]
    start = ring.sim.now
    first_crash = start + c.events / 4
    for k, wave in enumerate(waves):
        for b in wave:
            ring.sim.crash(b.addr, at=first_crash + 60.0 * k)
    sent: dict[int, dict[str, Any]] = {}
    for i in range(c.events):
        at = start + i
        event = {"id": i, "x": rng.randrange(100), "t": at}
        sent[i] = event
        ring.sim.invoke(rng.choice(publishers), partial(_publish, event), at=at)
    ring.settle(c.events + 60.0 * len(waves) + 300.0)
    row = {"backup": backup, "scenario": scenario, "nodes": c.nodes, "crashed": len(crashed)}
    return {**row, **_deliveries(ring, subs, sent), "custody": custody}


def _deliveries(
    ring: BrokerRing, subs: dict[Hashable, Filter], sent: dict[int, dict[str, Any]]
) -> dict[str, Any]:
    counts = Counter((sub, e["id"]) for sub, e, _ in ring.got)
    delays = [now - e["t"] for _, e, now in ring.got]
    expected = {(s, i) for i, e in sent.items() for s, f in subs.items() if f.matches(e)}
    delivered = {k for k in counts if k in expected}
    d = np.asarray(delays) if delays else np.zeros(1)
    return {
        "events": len(sent),
        "expected": len(expected),
        "delivered": len(delivered),
        "lost": len(expected - delivered),
        "duplicates": sum(c - 1 for c in counts.values()),
        "wrong": sum(1 for k in counts if k not in expected),
        "delay_mean": float(d.mean()),
        "delay_p99": float(np.percentile(d, 99)),
        "delay_max": float(d.max()),
    }
