"""Pastry routing hops in the simulator: the experiment of the Pastry paper's figure 4.

How it works: :func:`run` draws ``nodes`` random 128-bit Pastry ids from a stream derived
from the seed, fills every node's leaf set and routing table with
:func:`~flowbus.overlay.pastry_static.build_static` (the "correct tables" construction, no joins)
and adds each :class:`~flowbus.overlay.pastry.PastryNode` to a
:class:`~flowbus.sim.engine.Simulator` with a constant latency of 1.0. Each lookup is a
random key handed to a random source node as a ``Route(key, i, hops=0, origin=source)``
message injected at time 0 -- exactly what ``PastryNode.route(key, i)`` would start with.
The simulator then runs until no message is in flight. Every ``Deliver`` is checked
against :func:`~flowbus.overlay.pastry.numerically_closest` over the sorted ids (the
node responsible for the key), and the hop histogram comes from the simulator's
:class:`~flowbus.sim.metrics.Metrics` (the delivered ``Route.hops``). The result is a
JSON-able dict with the mean and maximum hop count, the bound ceil(log16 N) + 1, and the
paper's reported mean for the sizes it plots. Separate streams (``pastry-hops/ids``,
``pastry-hops/tables``, ``pastry-hops/lookups``) make a seed give the same dict on every
run, timing fields aside.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Hashable
from typing import Any, Final

from flowbus.overlay.pastry import BITS, Route, numerically_closest
from flowbus.overlay.pastry_static import build_static, random_ids
from flowbus.sim.engine import SimError, Simulator, derive_seed
from flowbus.sim.metrics import Metrics
from flowbus.sim.transport import ConstantLatency

__all__ = ["PAPER_MEAN_HOPS", "TIMING_FIELDS", "hop_bound", "run"]

ProgressFn = Callable[[str, int, int], object]

PAPER_MEAN_HOPS: Final[dict[int, float]] = {1000: 2.5, 3000: 2.8, 10_000: 3.2, 100_000: 4.0}
"""Average hops the Pastry paper (Rowstron & Druschel 2001, figure 4) reports, by N."""

TIMING_FIELDS: Final = ("build_s", "run_s")
"""The fields of :func:`run`'s result that vary from run to run."""


def hop_bound(nodes: int) -> int:
    """ceil(log16 ``nodes``) + 1, computed on integers (no rounding error at powers of 16)."""
    k, cap = 0, 1
    while cap < nodes:
        k, cap = k + 1, cap * 16
    return k + 1


def run(*, nodes: int, lookups: int, seed: int, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Route ``lookups`` random keys through a static Pastry network of ``nodes`` nodes.

    ``progress(what, done, total)`` is called while building (``"building"``, in steps)
    and simulating (``"simulating"``, lookups delivered). Raises :class:`SimError` (a
    ``FlowbusError``) for ``nodes < 1`` or ``lookups < 1``.
    """
    if type(nodes) is not int or nodes < 1:
        raise SimError(f"pastry-hops: the number of nodes must be an int >= 1, got {nodes!r}")
    if type(lookups) is not int or lookups < 1:
        raise SimError(f"pastry-hops: the number of lookups must be an int >= 1, got {lookups!r}")

    def report(what: str, done: int, total: int) -> None:
        if progress is not None:
            progress(what, done, total)

    t0 = time.perf_counter()
    report("building", 0, 3)
    ids = random_ids(nodes, random.Random(derive_seed(seed, "pastry-hops/ids")))
    report("building", 1, 3)
    cores = build_static(ids, random.Random(derive_seed(seed, "pastry-hops/tables")))
    report("building", 2, 3)
    sorted_ids = sorted(ids)
    delivered: set[int] = set()
    correct = 0
    every = max(1, lookups // 100)

    def on_deliver(node: int, sub: Hashable, event: Any, now: float) -> None:
        nonlocal correct
        if not isinstance(event, Route) or event.payload in delivered:
            return
        delivered.add(event.payload)
        if ids[node] == numerically_closest(sorted_ids, event.key):
            correct += 1
        if len(delivered) % every == 0:
            report("simulating", len(delivered), lookups)

    metrics = Metrics()
    sim = Simulator(seed=seed, transport=[ConstantLatency(1.0)], metrics=metrics, on_deliver=on_deliver)
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
    report("simulating", len(delivered), lookups)
    run_s = time.perf_counter() - t1

    hops = metrics.hops()
    counted = sum(hops.values())
    return {
        "nodes": nodes,
        "lookups": lookups,
        "seed": seed,
        "delivered": len(delivered),
        "correct": correct,
        "mean_hops": sum(h * c for h, c in hops.items()) / counted if counted else None,
        "max_hops": max(hops) if hops else None,
        "bound": hop_bound(nodes),
        "paper_mean_hops": PAPER_MEAN_HOPS.get(nodes),
        "hops": {str(h): c for h, c in hops.items()},
        "messages": metrics.total_sent,
        "lost": metrics.total_lost,
        "duplicates": metrics.duplicates,
        "sim_time": sim.now,
        "build_s": build_s,
        "run_s": run_s,
    }
