"""Secure and express events over the broker multigraph, with and without link failures.

How it works: :func:`run` deploys ``nodes`` brokers on a chordal ring
(:func:`~flowbus.overlay.multigraph.ring_deployment`). Some links are express (low
latency), some secure, and some pairs have an extra parallel secure link. One
:class:`~flowbus.overlay.class_router.ClassRouter` runs per broker in the simulator.

- The transport gives every message the latency of the link it names, and drops it if
  that link is down. The sender gets a failure notice, marks the link failed in its view,
  and routes again.
- Phase ``intact``: ``events`` events of each class (normal, express, secure) between
  random pairs of brokers.
- Phase ``failed``: the same after a fraction ``link_failures`` of the links went down.
  The brokers' view does not know which ones; they learn it from failed sends.

Per phase and class the result gives events sent, delivered, undeliverable (no path of the
class), violations (hops over a link lacking the class, counted by the receiving broker),
express fallbacks, mean hops, and the mean, median and 99th-percentile latency.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from flowbus.core import Effect
from flowbus.errors import FlowbusError
from flowbus.overlay.class_router import Classed, ClassRouter
from flowbus.overlay.multigraph import LinkClass, Multigraph, ring_deployment
from flowbus.sim.engine import Simulator, derive_seed

__all__ = ["LinkLatency", "run", "write_outputs"]

ProgressFn = Callable[[str, int, int], object]
CLASSES = (LinkClass.NORMAL, LinkClass.EXPRESS, LinkClass.SECURE)


class LinkLatency:
    """A transport layer: a :class:`Classed` message takes its link's latency, or is dropped
    (reason ``"link"``) if that link is down in ``truth``."""

    def __init__(self, truth: Multigraph) -> None:
        self.truth = truth

    def bind(self, host: object) -> Callable[[int, int, Any, float], float | str]:
        truth = self.truth

        def decide(src: int, dst: int, msg: Any, now: float) -> float | str:
            if not isinstance(msg, Classed):
                return 1.0
            if not truth.is_live(msg.link):
                return "link"
            latency = truth.link(msg.link).latency
            return 1.0 if latency is None else latency

        return decide


def run(
    *,
    nodes: int = 256,
    events: int = 1000,
    express: float = 0.3,
    secure: float = 0.3,
    parallel_secure: float = 0.2,
    link_failures: float = 0.1,
    seed: int = 1,
    progress: ProgressFn | None = None,
) -> dict[str, Any]:
    if nodes < 5 or events < 1 or not 0 <= link_failures < 1:
        raise FlowbusError(
            "ring-classes: need nodes >= 5, events >= 1 and 0 <= link_failures < 1, "
            f"got {nodes}, {events}, {link_failures}"
        )
    t0 = time.perf_counter()
    rng = random.Random(derive_seed(seed, "ring-classes/deployment"))
    truth = ring_deployment(
        nodes, express_fraction=express, secure_fraction=secure, rng=rng, parallel_secure=parallel_secure
    )
    view = truth.copy()
    routers = [ClassRouter(b, view) for b in truth.brokers]
    got: list[tuple[Classed, float]] = []
    sim = Simulator(seed=seed, transport=[LinkLatency(truth)], failure_notice=10.0)
    sim.on_deliver = lambda node, sub, event, now: got.append((event, now))
    for r in routers:
        sim.add_node(r.broker, r)
    pick = random.Random(derive_seed(seed, "ring-classes/events"))
    rows = []
    for phase in ("intact", "failed"):
        if phase == "failed":
            keys = sorted(link.key for link in truth.links())
            for key in pick.sample(keys, round(link_failures * len(keys))):
                truth.fail_link(key)
        for cls in CLASSES:
            rows.append(_phase(sim, routers, got, pick, phase, cls, events))
            if progress is not None:
                progress("phases x classes", len(rows), 2 * len(CLASSES))
    links = list(truth.links())
    return {
        "experiment": "ring-classes",
        "nodes": nodes,
        "seed": seed,
        "links": len(links),
        "express_links": sum(LinkClass.EXPRESS in link.classes for link in links),
        "secure_links": sum(LinkClass.SECURE in link.classes for link in links),
        "failed_links": len(truth.failed),
        "violations": sum(r.violations for r in routers),
        "rows": rows,
        "run_s": time.perf_counter() - t0,
    }


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


def write_outputs(result: dict[str, Any], out: Path) -> dict[str, str]:
    """``rows.csv``, ``result.json`` and the PNG in ``out``."""
    from flowbus.experiments.ring_experiments import write_result

    return write_result(result, out, _plot)


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.35
    classes = [c.name.lower() for c in CLASSES]
    for j, phase in enumerate(("intact", "failed")):
        by = {r["cls"]: r for r in rows if r["phase"] == phase}
        xs = np.arange(len(classes)) + (j - 0.5) * width
        means = [by[c]["latency_mean"] for c in classes]
        p99 = [by[c]["latency_p99"] - by[c]["latency_mean"] for c in classes]
        ax.bar(xs, means, width, yerr=[np.zeros(len(classes)), p99], capsize=4, label=f"links {phase}")
    ax.set_xticks(np.arange(len(classes)), classes)
    ax.set_ylabel("latency (mean; bar to p99)")
    ax.set_title(f"events by class, {result['nodes']} brokers; violations: {result['violations']}")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
