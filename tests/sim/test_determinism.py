"""Determinism: one config and seed give identical metrics and delivery logs; seeds matter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flowbus.sim import (
    ConstantLatency,
    CoordinateLatency,
    Crashes,
    Layer,
    Loss,
    Metrics,
    Partition,
    Simulator,
    UniformLatency,
)

from .cores import Flood, flooding_sim_nodes


def _run(seed: int) -> tuple[str, str]:
    part = Partition([range(0, 100), range(100, 200)])
    layers: list[Layer] = [CoordinateLatency(base=0.1, scale=5.0), UniformLatency(0.0, 0.5), Loss(0.05), part]
    layers.append(Crashes({7: 3.0, 150: 1.0}))
    sim = Simulator(seed=seed, transport=layers, metrics=Metrics(log=True))
    for i, core in enumerate(flooding_sim_nodes(200, 6, seed=seed)):
        sim.add_node(i, core)
    rng = sim.rng("workload")
    for k in range(20):
        sim.inject(rng.randrange(200), Flood(k, k), at=rng.uniform(0.0, 10.0))
    sim.schedule(5.0, part.heal)
    sim.run()
    assert sim.metrics.log is not None
    return json.dumps(sim.metrics.to_dict()), json.dumps([r.to_json() for r in sim.metrics.log])


def test_same_seed_same_bytes() -> None:
    m1, log1 = _run(5)
    m2, log2 = _run(5)
    assert m1 == m2 and log1 == log2
    d = json.loads(m1)
    assert d["deliveries"] > 0 and set(d["lost_by_reason"]) == {"crash", "loss", "partition"}


@pytest.mark.broker
def test_same_bytes_across_processes_with_different_hash_seeds() -> None:
    root = Path(__file__).resolve().parents[2]
    code = "from tests.sim.test_determinism import _run; import sys; sys.stdout.write(repr(_run(5)))"
    outs = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True
        )
        outs.add(done.stdout)
    assert outs == {repr(_run(5))}


def test_different_seeds_differ() -> None:
    assert _run(5) != _run(6)


def test_flooding_throughput_sanity() -> None:
    """Not a timed assertion: checks a big flood completes and prints messages/s with -s."""
    sim = Simulator(seed=1, transport=[ConstantLatency(1.0)])
    for i, core in enumerate(flooding_sim_nodes(2_000, 8)):
        sim.add_node(i, core)
    for k in range(10):
        sim.inject(k, Flood(k, k), at=float(k))
    t0 = time.perf_counter()
    sim.run()
    dt = time.perf_counter() - t0
    m = sim.metrics
    assert m.deliveries == 20_000 and m.duplicates == 0
    assert m.received == m.total_sent + 10
    print(f"flooding: {m.total_sent} messages in {dt:.2f}s = {m.total_sent / dt:,.0f} msg/s")
