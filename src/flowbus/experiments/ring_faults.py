"""Delivery under broker crashes on the chordal ring, for backup factors 1..4.

How it works: :class:`BrokerRing` grows a ring of
:class:`~flowbus.routing.ring_broker.RingBroker` cores in the simulator, with a coordinate
latency of 0.5 to 3.3, heartbeats every 5 and failure notices. Each broker holds
``subs_per_broker`` subscriptions.

For each backup factor and scenario, :func:`run` does the following on a fresh ring:

- It publishes one event per time unit from random brokers that never crash, before,
  during and after the crashes.
- It crashes brokers:
  - ``single``: three brokers far apart, one after another, 60 units apart;
  - ``adjacent``: a broker and its Right at once. The Right is the neighbour that holds
    its first backup, so this is also "a broker and the neighbour holding its backup";
  - ``skip-one``: a broker and its neighbour's neighbour at once.
- It then lets everything settle.

Every subscription counts as live throughout, since its client re-attaches to whichever
broker serves it. A subscription whose every backed-up copy died with its broker is lost,
and so are its events: that is what the backup factor buys. Per row: events, expected
deliveries (filters evaluated offline), delivered, lost, duplicated, and the
publish-to-delivery delay (mean, p99, max).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from flowbus.core import Effect
from flowbus.errors import FlowbusError
from flowbus.filters import Filter, parse
from flowbus.routing.ring_broker import RingBroker
from flowbus.sim.engine import Simulator, derive_seed
from flowbus.sim.transport import CoordinateLatency

__all__ = ["SCENARIOS", "BrokerRing", "run", "write_outputs"]

SCENARIOS = ("single", "adjacent", "skip-one")
ProgressFn = Callable[[str, int, int], object]


class BrokerRing:
    """Ring brokers in a simulator, grown one join at a time, with deliveries recorded."""

    def __init__(
        self, n: int, *, seed: int, backup: int, heartbeat: float = 5.0, custody: bool = False
    ) -> None:
        self.sim = Simulator(seed=seed, transport=[CoordinateLatency(0.5, 2.0)], failure_notice=8.0)
        self.got: list[tuple[Hashable, Any, float]] = []
        self.sim.on_deliver = lambda node, sub, event, now: self.got.append((sub, event, now))
        self.brokers: list[RingBroker] = []
        rng = random.Random(derive_seed(seed, "ring-faults/joins"))
        for a in range(n):
            b = RingBroker(
                a, backup=backup, heartbeat=heartbeat, probe_timeout=10.0, ping_timeout=10.0, custody=custody
            )
            self.brokers.append(b)
            self.sim.add_node(a, b)
            picks = rng.sample(range(a), min(3, a))
            self.sim.invoke(a, partial(_first if a == 0 else _join, picks))
            self.sim.run(until=self.sim.now + 40)

    def settle(self, span: float) -> None:
        self.sim.run(until=self.sim.now + span)

    def order(self) -> list[RingBroker]:
        return sorted((b for b in self.brokers if not self.sim.is_down(b.addr)), key=lambda b: b.ring.me.id)


def _first(picks: list[int], broker: RingBroker) -> list[Effect]:
    return broker.start()


def _join(picks: list[int], broker: RingBroker) -> list[Effect]:
    return broker.join(picks)


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


def _one(
    *, nodes: int, backup: int, scenario: str, seed: int, subs_per_broker: int, events: int, custody: bool
) -> dict[str, Any]:
    ring = BrokerRing(nodes, seed=seed, backup=backup, custody=custody)
    rng = random.Random(derive_seed(seed, f"ring-faults/{scenario}/{backup}"))
    subs: dict[Hashable, Filter] = {}
    for b in ring.brokers:
        for k in range(subs_per_broker):
            sid = (b.addr, k)
            subs[sid] = parse(f"x >= {rng.randrange(80)} & x < {rng.randrange(80, 101)}")
            ring.sim.invoke(b.addr, partial(_subscribe, sid, subs[sid]))
    ring.settle(100.0)
    waves = _victims(ring, scenario, rng)
    crashed = {b.addr for w in waves for b in w}
    publishers = [b.addr for b in ring.brokers if b.addr not in crashed]
    start = ring.sim.now
    first_crash = start + events / 4
    for k, wave in enumerate(waves):
        for b in wave:
            ring.sim.crash(b.addr, at=first_crash + 60.0 * k)
    sent: dict[int, dict[str, Any]] = {}
    for i in range(events):
        at = start + i
        event = {"id": i, "x": rng.randrange(100), "t": at}
        sent[i] = event
        ring.sim.invoke(rng.choice(publishers), partial(_publish, event), at=at)
    ring.settle(events + 60.0 * len(waves) + 300.0)
    return {**_measure(ring, subs, sent, backup, scenario, nodes, len(crashed)), "custody": custody}


def _measure(
    ring: BrokerRing,
    subs: dict[Hashable, Filter],
    sent: dict[int, dict[str, Any]],
    backup: int,
    scenario: str,
    nodes: int,
    crashed: int,
) -> dict[str, Any]:
    counts = Counter((sub, e["id"]) for sub, e, _ in ring.got)
    delays = [now - e["t"] for _, e, now in ring.got]
    expected = {(s, i) for i, e in sent.items() for s, f in subs.items() if f.matches(e)}
    delivered = {k for k in counts if k in expected}
    d = np.asarray(delays) if delays else np.zeros(1)
    return {
        "backup": backup,
        "scenario": scenario,
        "nodes": nodes,
        "crashed": crashed,
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


def run(
    *,
    nodes: int = 24,
    backups: Sequence[int] = (1, 2, 3, 4),
    scenarios: Sequence[str] = SCENARIOS,
    seed: int = 1,
    subs_per_broker: int = 2,
    events: int = 300,
    custody: Sequence[bool] = (False,),
    progress: ProgressFn | None = None,
) -> dict[str, Any]:
    bad = [s for s in scenarios if s not in SCENARIOS]
    if bad or nodes < 8 or not backups or not set(backups) <= {1, 2, 3, 4} or events < 10:
        raise FlowbusError(
            f"ring-faults: scenarios from {SCENARIOS}, nodes >= 8, backups in 1..4, events >= 10; "
            f"got {list(scenarios)}, {nodes}, {list(backups)}, {events}"
        )
    t0 = time.perf_counter()
    rows = []
    total = len(backups) * len(scenarios) * len(custody)
    for held in custody:
        for b in backups:
            for sc in scenarios:
                rows.append(
                    _one(
                        nodes=nodes,
                        backup=b,
                        scenario=sc,
                        seed=seed,
                        subs_per_broker=subs_per_broker,
                        events=events,
                        custody=held,
                    )
                )
                if progress is not None:
                    progress("custody x backup x scenario", len(rows), total)
    return {"experiment": "ring-faults", "seed": seed, "rows": rows, "run_s": time.perf_counter() - t0}


def write_outputs(result: dict[str, Any], out: Path) -> dict[str, str]:
    """``rows.csv``, ``result.json`` and the PNG in ``out``."""
    from flowbus.experiments.ring_experiments import write_result

    return write_result(result, out, _plot)


def _plot(result: dict[str, Any], path: Path) -> None:
    rows = result["rows"]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    backups = sorted({r["backup"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(backups)
    for j, b in enumerate(backups):
        by = {r["scenario"]: r for r in rows if r["backup"] == b}
        xs = np.arange(len(scenarios)) + (j - (len(backups) - 1) / 2) * width
        lost = [100 * by[s]["lost"] / max(by[s]["expected"], 1) for s in scenarios]
        axes[0].bar(xs, lost, width, label=f"backup {b}")
        axes[1].bar(xs, [by[s]["delay_p99"] for s in scenarios], width, label=f"backup {b}")
    for ax, what in zip(axes, ("deliveries lost (%)", "delay p99 (latency units)"), strict=True):
        ax.set_xticks(np.arange(len(scenarios)), scenarios)
        ax.set_ylabel(what)
        ax.grid(alpha=0.3, axis="y")
        ax.legend()
    axes[0].set_title("lost deliveries by crash scenario and backup factor")
    axes[1].set_title("publish-to-delivery delay")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
