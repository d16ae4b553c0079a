"""Pastry routing hops in the simulator: the experiment of the Pastry paper's figure 4.

How it works: :func:`run` takes a :class:`PastryHops` config and draws ``nodes`` random
128-bit Pastry ids from a stream derived from the seed, fills every node's leaf set and
routing table with :func:`~flowbus.overlay.pastry_static.build_static` (the "correct
tables" construction, no joins) and adds each :class:`~flowbus.overlay.pastry.PastryNode`
to a :class:`~flowbus.sim.engine.Simulator` with a constant latency of 1.0. Each lookup is
a random key handed to a random source node as a ``Route(key, i, hops=0, origin=source)``
message injected at time 0 -- exactly what ``PastryNode.route(key, i)`` would start with.
The simulator then runs until no message is in flight. Every ``Deliver`` is checked
against :func:`~flowbus.overlay.pastry.numerically_closest` over the sorted ids (the node
responsible for the key), and the hop histogram comes from the simulator's
:class:`~flowbus.sim.metrics.Metrics` (the delivered ``Route.hops``).

The result's rows are that histogram (lookups per hop count); its findings the mean and
maximum hop count, the bound ceil(log16 N) + 1, and the paper's reported mean for the
sizes it plots. :func:`record` flattens it into the one JSON document the command prints.
Separate streams (``pastry-hops/ids``, ``pastry-hops/tables``, ``pastry-hops/lookups``)
make a seed give the same result on every run, timing fields aside.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

from flowbus.errors import ExperimentError
from flowbus.experiments.config import OneSeed, integer
from flowbus.experiments.output import Csv, OutputFiles, ProgressFn, Result, pyplot, save
from flowbus.overlay.pastry import BITS, Route, numerically_closest
from flowbus.overlay.pastry_static import build_static, random_ids
from flowbus.sim.engine import Simulator, derive_seed
from flowbus.sim.metrics import Metrics
from flowbus.sim.transport import ConstantLatency

__all__ = ["FILES", "PAPER_MEAN_HOPS", "TIMING_FIELDS", "PastryHops", "hop_bound", "record", "run"]

PAPER_MEAN_HOPS: Final[dict[int, float]] = {1000: 2.5, 3000: 2.8, 10_000: 3.2, 100_000: 4.0}
"""Average hops the Pastry paper (Rowstron & Druschel 2001, figure 4) reports, by N."""

TIMING_FIELDS: Final = ("build_s", "run_s", "wall_s")
"""The fields of :func:`record` that vary from run to run."""


@dataclass(frozen=True, slots=True)
class PastryHops(OneSeed):
    """``lookups`` random keys routed through a static Pastry network of ``nodes`` nodes."""

    NAME: ClassVar[str] = "pastry-hops"

    nodes: int = 10_000
    lookups: int = 10_000
    seed: int = 1

    def __post_init__(self) -> None:
        for key in ("nodes", "lookups"):
            value = getattr(self, key)
            if type(value) is not int or value < 1:
                raise ExperimentError(f"pastry-hops: the number of {key} must be an int >= 1, got {value!r}")
        integer("seed", self.seed, 0)


def hop_bound(nodes: int) -> int:
    """ceil(log16 ``nodes``) + 1, computed on integers (no rounding error at powers of 16)."""
    k, cap = 0, 1
    while cap < nodes:
        k, cap = k + 1, cap * 16
    return k + 1


def run(config: PastryHops, *, progress: ProgressFn | None = None) -> Result:
    """Route the lookups (see the module note).

    ``progress(what, done, total)`` is called while building (``"building"``, in steps)
    and simulating (``"simulating"``, lookups delivered).
    """
    nodes, lookups, seed = config.nodes, config.lookups, config.seed

    def report(what: str, done: int, total: int) -> None:
        if progress is not None:
            progress(what, done, total)

    t0 = time.perf_counter()
    report("building", 0, 3)
    ids = random_ids(nodes, random.Random(derive_seed(seed, "pastry-hops/ids")))
    report("building", 1, 3)
    cores = build_static(ids, random.Random(derive_seed(seed, "pastry-hops/tables")))
    report("building", 2, 3)
    check = _Check(ids, sorted(ids), lambda done: report("simulating", done, lookups), max(1, lookups // 100))
    metrics = Metrics()
    sim = Simulator(seed=seed, transport=[ConstantLatency(1.0)], metrics=metrics, on_deliver=check.on_deliver)
    for core in cores:
        sim.add_node(core.address, core)
    report("building", 3, 3)
    build_s = time.perf_counter() - t0

    t1 = time.perf_counter()
    rng = random.Random(derive_seed(seed, "pastry-hops/lookups"))
    for i in range(lookups):
        src = rng.randrange(nodes)
        sim.inject(src, Route(rng.getrandbits(BITS), i, 0, src), at=0.0)
    report("simulating", 0, lookups)
    sim.run()
    report("simulating", len(check.delivered), lookups)
    timing = {"build_s": build_s, "run_s": time.perf_counter() - t1, "wall_s": time.perf_counter() - t0}
    hops = metrics.hops()
    rows = [{"hops": h, "lookups": c} for h, c in hops.items()]
    return Result(config, FILES, rows, findings=_findings(config, check, metrics, sim.now), timing=timing)


@dataclass(slots=True)
class _Check:
    """Counts each lookup's first delivery, and those at the node responsible for its key."""

    ids: list[int]
    sorted_ids: list[int]
    report: Callable[[int], None]
    every: int
    delivered: set[int] = field(default_factory=set)
    correct: int = 0

    def on_deliver(self, node: int, sub: Hashable, event: Any, now: float) -> None:
        if not isinstance(event, Route) or event.payload in self.delivered:
            return
        self.delivered.add(event.payload)
        if self.ids[node] == numerically_closest(self.sorted_ids, event.key):
            self.correct += 1
        if len(self.delivered) % self.every == 0:
            self.report(len(self.delivered))


def _findings(config: PastryHops, check: _Check, metrics: Metrics, sim_time: float) -> dict[str, Any]:
    hops = metrics.hops()
    counted = sum(hops.values())
    return {
        "delivered": len(check.delivered),
        "correct": check.correct,
        "mean_hops": sum(h * c for h, c in hops.items()) / counted if counted else None,
        "max_hops": max(hops) if hops else None,
        "bound": hop_bound(config.nodes),
        "paper_mean_hops": PAPER_MEAN_HOPS.get(config.nodes),
        "messages": metrics.total_sent,
        "lost": metrics.total_lost,
        "duplicates": metrics.duplicates,
        "sim_time": sim_time,
    }


def record(result: Result) -> dict[str, Any]:
    """The run as one flat record: the config, the findings, the histogram as ``hops``
    (hop count as a string -> lookups), the timing."""
    hops = {str(r["hops"]): r["lookups"] for r in result.rows}
    return {**result.config.to_dict(), **result.findings, "hops": hops, **result.timing}


def plot(result: Result, png: Path) -> None:
    """Lookups per hop count, with the bound and the paper's mean for the size (if it gives one)."""
    fig, ax = pyplot().subplots(figsize=(7, 4))
    ax.bar([r["hops"] for r in result.rows], [r["lookups"] for r in result.rows], color="tab:blue")
    f = result.findings
    ax.axvline(f["bound"], color="black", linestyle=":", label=f"ceil(log16 N) + 1 = {f['bound']}")
    if f["mean_hops"] is not None:
        ax.axvline(f["mean_hops"], color="tab:blue", linestyle="--", label=f"mean {f['mean_hops']:.2f}")
    if f["paper_mean_hops"] is not None:
        ax.axvline(f["paper_mean_hops"], color="tab:orange", label=f"paper: {f['paper_mean_hops']}")
    ax.set_xlabel("hops")
    ax.set_ylabel("lookups")
    ax.set_title(f"Pastry lookups, {result.config.to_dict()['nodes']:,} nodes")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    save(fig, png)


FILES: Final = OutputFiles((Csv("csv", "{experiment}.csv"),), plot, json=("json", "{experiment}.json"))
"""``pastry-hops.csv`` (the histogram), ``pastry-hops.json`` and ``pastry-hops.png``."""
