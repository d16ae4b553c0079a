"""CBDLO under churn: nodes failing and joining while events flow (``flowbus sim cbdlo-churn``).

How it works (the 004 document, sections 2-4, claims CBDLO "adapts to dynamic networks" but
measures no churn; the experiment is ours): a :class:`CbdloChurn` config fixes a CBDLO
network (:class:`~flowbus.experiments.cbdlo_run.CbdloRun` settings) and sweeps ``churn``:
the share of the initial nodes that fail during the run, with as many newcomers joining.
One run, per churn value and seed (:func:`run_one`):

1. The network is built as in the other CBDLO figures (:func:`~flowbus.experiments.cbdlo_run.build`:
   views, subscriptions through the maintenance protocol, APTs).
2. A simulator with failure notices (``notice`` time units after a send to a dead node)
   runs it; every node gossips (Cyclon, every ``period``), so views lose dead neighbours and
   APTs learn entry points from descriptors; every coordinator probes its backup every
   ``probe`` (:class:`~flowbus.routing.cbdlo_maint.TreePing`).
3. ``events`` events are published, one every ``interval`` from a random live node. The
   failures and the joins fall at uniformly random times over the same span. A failure
   crashes a random live node (a host, a coordinator, a backup, a subscriber: whichever).
   A newcomer gets a view of ``view`` random live nodes, the APT of its first contact, and
   ``subscriptions / nodes`` subscriptions on average (drawn as the others), sent to the
   coordinators at once.
4. An event is *expected* at a subscription that matches it, was sent at least ``grace``
   before the publication, and whose node lives until ``interval`` after it.

A row: completeness (delivered / expected), routing messages per event (walks, entries,
tree steps, matches), maintenance messages per event (those of
:data:`~flowbus.routing.cbdlo_maint.MESSAGES` sent during the run; the backup probes among
them, and also apart), gossip per event, the build's maintenance, takeovers, and at the
end, after the trees settle, whether every topology is AVL-balanced and held by its live
hosts (``trees_consistent``), the virtual nodes still on dead hosts (never needed by a
search, so never reported) and the topologies lost (coordinator and backup dead before a
repair).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any, Final

from flowbus.core import Effect
from flowbus.errors import ExperimentError
from flowbus.experiments.cbdlo_plots import plot
from flowbus.experiments.cbdlo_run import CbdloRun, Network, ZipfRangeWorkload, build, maintenance_sent
from flowbus.experiments.config import (
    fraction,
    integer,
    number,
    parse_seeds,
    read_config,
    seeds_value,
    unique,
)
from flowbus.experiments.output import Csv, OutputFiles, ProgressFn, Result
from flowbus.experiments.stats import mean
from flowbus.overlay.cbdlo_tree import RangeSubscription
from flowbus.routing.cbdlo import CbdloNode
from flowbus.routing.cbdlo_maint import MESSAGES as MAINTENANCE
from flowbus.routing.crawl import Publication
from flowbus.sim.engine import Simulator, derive_seed
from flowbus.sim.transport import ConstantLatency

__all__ = ["DEFAULT", "EXPERIMENT", "FILES", "CbdloChurn", "load", "run", "run_one"]

EXPERIMENT: Final = "cbdlo-churn"
ROUTING: Final = ("Walk", "Enter", "TreeStep", "Matched")
GOSSIP: Final = ("Shuffle", "ShuffleReply")
RUN_FIELDS: Final = frozenset(f.name for f in fields(CbdloRun)) - {"protocol", "seed"}


@dataclass(frozen=True, slots=True)
class CbdloChurn:
    """The churn sweep: ``churn`` values x ``seeds``, the network in ``settings``."""

    seeds: tuple[int, ...] = (1, 2, 3)
    churn: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.4)
    interval: float = 10.0
    notice: float = 0.5
    period: float = 50.0
    probe: float = 50.0
    grace: float = 5.0
    settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for s in unique(f"{EXPERIMENT}: seeds", self.seeds):
            integer(f"{EXPERIMENT}: seeds: a seed", s, 0)
        for c in unique(f"{EXPERIMENT}: churn", self.churn):
            fraction(f"{EXPERIMENT}: churn", c)
        object.__setattr__(self, "seeds", tuple(self.seeds))
        object.__setattr__(self, "churn", tuple(self.churn))
        for key in ("interval", "notice", "period", "probe"):
            number(f"{EXPERIMENT}: {key}", getattr(self, key), low=0, strict=True)
        number(f"{EXPERIMENT}: grace", self.grace, low=0)
        for key in self.settings:
            if key not in RUN_FIELDS:
                raise ExperimentError(f"{EXPERIMENT}: {key!r} is not a run setting")
        self.network(self.seeds[0] if self.seeds else 1)

    @property
    def experiment(self) -> str:
        return EXPERIMENT

    def network(self, seed: int) -> CbdloRun:
        return CbdloRun(**self.settings, protocol="cbdlo", seed=seed)

    def to_dict(self) -> dict[str, Any]:
        return {"experiment": EXPERIMENT, "seeds": list(self.seeds), "churn": list(self.churn),
                "interval": self.interval, "notice": self.notice, "period": self.period, "probe": self.probe,
                "grace": self.grace,
                **self.settings}  # fmt: skip


DEFAULT: Final = CbdloChurn(
    settings={
        "nodes": 3000,
        "view": 10,
        "local_max": 100,
        "max_hops": 10,
        "apt": 20,
        "attributes": 100,
        "subscriptions": 2000,
        "events": 100,
        "trace": 5,
        "alpha": 0.9,
        "mu": 0.5,
        "event_attrs": 8,
        "width_min": 0.05,
        "width_max": 0.25,
        "one_sided": 0.5,
    }
)
"""The built-in config: the same values as ``experiments/cbdlo-churn.yaml``."""

_OWN: Final = ("seeds", "churn", "interval", "notice", "period", "probe", "grace")


def load(path: Path | None = None, *, seeds: str | None = None) -> CbdloChurn:
    """The built-in config updated by the YAML file ``path`` and ``seeds``, checked."""
    values: dict[str, Any] = json.loads(json.dumps(DEFAULT.to_dict()))
    values.pop("experiment")
    if path is not None:
        values.update(read_config(path, EXPERIMENT, RUN_FIELDS | set(_OWN)))
    values["seeds"] = parse_seeds(seeds) if seeds is not None else seeds_value(values["seeds"])
    own = {k: values.pop(k) for k in _OWN if k in values}
    if "churn" in own:
        own["churn"] = tuple(own["churn"]) if isinstance(own["churn"], list) else own["churn"]
    return CbdloChurn(**own, settings=values)


# ------------------------------------------------------------------------------------ run


@dataclass(slots=True)
class _Log:
    """What happened to whom and when (for the expected deliveries)."""

    issued: dict[Hashable, tuple[int, float]] = field(default_factory=dict)  # sid -> (node, when)
    crashed: dict[int, float] = field(default_factory=dict)
    got: set[tuple[Hashable, int]] = field(default_factory=set)
    joins: int = 0


def _events_and_churn(
    cfg: CbdloChurn, c: CbdloRun, churn: float, start: float
) -> tuple[list[float], list[tuple[float, str]]]:
    rng = random.Random(derive_seed(c.seed, f"cbdlo-churn/{churn}"))
    times = [start + i * cfg.interval for i in range(c.events)]
    k = round(churn * c.nodes)
    span = c.events * cfg.interval
    changes = sorted([(start + rng.random() * span, "fail") for _ in range(k)]
                     + [(start + rng.random() * span, "join") for _ in range(k)])  # fmt: skip
    return times, changes


def run_one(cfg: CbdloChurn, churn: float, seed: int) -> dict[str, Any]:
    """One run at churn ``churn`` with seed ``seed``: one row (see the module note)."""
    t0 = time.perf_counter()
    c = cfg.network(seed)
    net = build(c)
    log = _Log(issued={s.sid: (s.node, 0.0) for s in net.subs})
    sim = Simulator(seed=seed, transport=[ConstantLatency(1.0)], failure_notice=cfg.notice,
                    on_deliver=lambda node, sub, pub, now: log.got.add((sub, pub.eid)))  # fmt: skip
    for a, core in enumerate(net.cores):
        core.period, core.probe = cfg.period, cfg.probe
        sim.add_node(a, core)
        sim.invoke(a, CbdloNode.start)
    start = 2 * cfg.period  # the gossip under way before the first event
    times, changes = _events_and_churn(cfg, c, churn, start)
    rng = random.Random(derive_seed(seed, f"cbdlo-churn/{churn}/actions"))
    churner = _Churner(cfg, c, net, sim, log, rng)
    for at, what in changes:
        sim.schedule(at, churner.fail if what == "fail" else churner.join)
    work = ZipfRangeWorkload(c)
    erng = random.Random(derive_seed(seed, "cbdlo-churn/events"))
    pubs = []
    for i, at in enumerate(times):
        pub = work.event(erng, i)
        pubs.append((pub, at))
        sim.schedule(at, partial(churner.publish, pub))
    sim.run(until=times[-1] + cfg.interval)
    before = sim.metrics.sent_by_type()
    sim.run(until=times[-1] + 20 * cfg.interval)  # let the repairs settle, then look
    return _row(cfg, churn, c, net, sim, log, churner, pubs, before, time.perf_counter() - t0)


class _Churner:
    """The failures, joins and publications of one run (each at its scheduled time)."""

    def __init__(self, cfg: CbdloChurn, c: CbdloRun, net: Network, sim: Simulator, log: _Log,
                 rng: random.Random) -> None:  # fmt: skip
        self.cfg, self.c, self.net, self.sim, self.log, self.rng = cfg, c, net, sim, log, rng
        self.live = list(range(c.nodes))
        self.work = ZipfRangeWorkload(c)
        self.next_id = c.nodes
        self.next_sid = c.subscriptions

    def fail(self) -> None:
        if len(self.live) <= self.c.view + 1:
            return
        node = self.live.pop(self.rng.randrange(len(self.live)))
        self.log.crashed[node] = self.sim.now
        self.sim.crash(node)

    def join(self) -> None:
        c, rng = self.c, self.rng
        addr = self.next_id
        self.next_id += 1
        contacts = rng.sample(self.live, c.view)
        core = CbdloNode(addr, topologies=self.net.cores[0].topologies, rng=self.net.cores[0].rng,
                         view_size=c.view, shuffle_len=max(1, c.view // 2), apt_size=c.apt, trace_len=c.trace,
                         max_hops=c.max_hops, period=self.cfg.period, probe=self.cfg.probe,
                         observer=self.net.observer)  # fmt: skip
        core.cyclon.seed(contacts)
        core.apt.load(self.sim.core(contacts[0]).apt.items())  # type: ignore[attr-defined]
        self.net.cores.append(core)
        self.sim.add_node(addr, core)
        self.live.append(addr)
        self.log.joins += 1
        per_node = c.subscriptions / c.nodes
        subs = []
        for _ in range(int(per_node) + (rng.random() < per_node - int(per_node))):
            subs.append(self.work.subscription(rng, self.next_sid, addr))
            self.next_sid += 1
            self.log.issued[subs[-1].sid] = (addr, self.sim.now)
        self.net.subs.extend(subs)
        self.sim.invoke(addr, partial(_arrive, subs))

    def publish(self, pub: Publication) -> None:
        src = self.live[self.rng.randrange(len(self.live))]
        self.sim.invoke(src, partial(CbdloNode.publish, pub=pub))


def _arrive(subs: list[RangeSubscription], core: CbdloNode) -> list[Effect]:
    """A newcomer starts gossiping and sends its subscriptions."""
    effects = core.start()
    for sub in subs:
        effects += core.subscribe(sub)
    return effects


def _row(cfg: CbdloChurn, churn: float, c: CbdloRun, net: Network, sim: Simulator, log: _Log,
         churner: _Churner, pubs: Sequence[tuple[Publication, float]], before: dict[str, int],
         run_s: float) -> dict[str, Any]:  # fmt: skip
    expected = delivered = 0
    for pub, at in pubs:
        values = pub.as_dict()
        for s in net.subs:
            node, issued = log.issued[s.sid]
            alive = log.crashed.get(node, float("inf")) > at + cfg.interval
            if issued <= at - cfg.grace and alive and s.matches(values):
                expected += 1
                delivered += (s.sid, pub.eid) in log.got
            elif (s.sid, pub.eid) in log.got and not s.matches(values):
                raise ExperimentError(
                    f"cbdlo-churn: event {pub.eid} delivered to {s.sid}, which does not match it"
                )
    sent, per = before, float(c.events)
    routing = sum(sent.get(k, 0) for k in ROUTING)
    maintenance = sum(sent.get(k, 0) for k in MAINTENANCE)
    consistent, dead_vnodes, lost = _settled(net, set(log.crashed))
    return {
        "churn": churn, "seed": c.seed, "nodes": c.nodes, "subscriptions": c.subscriptions,
        "events": c.events, "failures": len(log.crashed), "joins": log.joins,
        "churn_per_time_unit": len(log.crashed) / (c.events * cfg.interval),
        "expected": expected, "delivered": delivered,
        "completeness": delivered / expected if expected else 1.0,
        "routing_messages": routing, "routing_per_event": routing / per,
        "maintenance_messages": maintenance, "maintenance_per_event": maintenance / per,
        "maintenance_build": net.maintenance_build,
        "gossip_per_event": sum(sent.get(k, 0) for k in GOSSIP) / per,
        "probes_per_event": sent.get("TreePing", 0) / per,
        "takeovers": sent.get("TakeOver", 0),
        "maintenance_total": maintenance_sent(sim),
        "trees_consistent": consistent, "dead_hosted_vnodes": dead_vnodes, "topologies_lost": lost,
        "run_s": run_s,
    }  # fmt: skip


def _settled(net: Network, dead: set[int]) -> tuple[bool, int, int]:
    """After the run: every topology AVL-balanced with its live hosts holding exactly its
    records; the virtual nodes left on dead hosts; the topologies whose coordinator is dead."""
    assert net.topologies is not None
    by_addr = {core.addr: core for core in net.cores}
    consistent, dead_vnodes, lost = True, 0, 0
    for attr, tree in net.topologies.trees.items():
        if tree.coordinator in dead:
            lost += 1
            continue
        try:
            tree.check()
        except AssertionError:
            consistent = False
        held = {}
        for addr, core in by_addr.items():
            if addr not in dead:
                held.update(core.replica.recs.get(attr, {}))
        want = {vid: r for vid, r in tree.records().items() if r.host not in dead}
        consistent = consistent and held == want
        dead_vnodes += sum(len(tree.hosted.get(d, ())) for d in dead)
    return consistent, dead_vnodes, lost


def run(config: CbdloChurn, *, progress: ProgressFn | None = None) -> Result:
    """Every (churn, seed) run; the rows and their means over the seeds."""
    t0 = time.perf_counter()
    jobs = [(ch, s) for ch in config.churn for s in config.seeds]
    rows = []
    for i, (ch, s) in enumerate(jobs):
        if progress is not None:
            progress("runs", i, len(jobs))
        rows.append(run_one(config, ch, s))
    if progress is not None:
        progress("runs", len(jobs), len(jobs))
    summary = []
    for ch in config.churn:
        rs = [r for r in rows if r["churn"] == ch]
        row: dict[str, Any] = {"churn": ch, "runs": len(rs)}
        for k, v in rs[0].items():
            if k not in ("churn", "seed", "run_s") and isinstance(v, int | float) and not isinstance(v, bool):
                row[k] = mean([r[k] for r in rs])
        row["trees_consistent"] = all(r["trees_consistent"] for r in rs)
        summary.append(row)
    timing = {"wall_s": time.perf_counter() - t0, "run_s": [r["run_s"] for r in rows]}
    clean = [{k: v for k, v in r.items() if k != "run_s"} for r in rows]
    return Result(config, FILES, clean, summary, {"runs": len(rows)}, timing=timing)


FILES: Final = OutputFiles((Csv("csv", "{experiment}.csv"),), plot, json=("json", "{experiment}.json"))
"""``cbdlo-churn.csv`` (one row per run), ``cbdlo-churn.json``, ``cbdlo-churn.png``."""
