"""The chordal ring's cost experiments: join cost against n, repair cost against n.

How it works:

* :func:`join_cost` grows one ring by ``max_nodes`` joins (:class:`~flowbus.experiments.ring_sim.RingSim`)
  and reports, for each size in ``sizes``, the mean and maximum of the messages one join
  sent and of the brokers it touched, over the joins just below that size. The document
  claims O(1): four brokers updated.
* :func:`repair_cost` builds a ring of each size, with chords, one state entry per broker
  and backup factor 2. It turns heartbeats on and then, ``trials`` times, breaks something
  and measures the repair until the ring is whole again:
  - a broker crash (detection, test by the neighbour's neighbour, divide-neighbour,
    takeover, redirects);
  - a ring-link failure (detection and confirmation that the broker is alive);
  - a chord-link failure (a traced query and its ``LinkDown``).
  Repair messages are every message but heartbeats, counted from the failure until the
  ring is consistent again and nothing is left in flight. The time runs from the failure
  to the last repair message. A least-squares fit of messages against log2 n tests the
  document's O(log n) claim.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flowbus.errors import FlowbusError
from flowbus.experiments.ring_sim import RingSim, ring_errors
from flowbus.sim import LinkFailure

__all__ = ["fit_log", "join_cost", "repair_cost", "write_outputs", "write_result"]

ProgressFn = Callable[[str, int, int], object]
HEARTBEAT = 5.0
KINDS = ("node", "ring-link", "chord-link")


def join_cost(
    *, sizes: Sequence[int], seed: int = 1, window: int = 32, progress: ProgressFn | None = None
) -> dict[str, Any]:
    """Messages and touched brokers per join, at each ring size of ``sizes``."""
    if not sizes or min(sizes) < 2:
        raise FlowbusError(f"ring-join: sizes must be >= 2, got {list(sizes)!r}")
    t0 = time.perf_counter()
    top = max(sizes)
    r = RingSim(seed=seed, backup=2)
    for k in range(top):
        r.grow(1, chords=False)
        if progress is not None and (k + 1) % 64 == 0:
            progress("joins", k + 1, top)
    errors = ring_errors(r.live)
    rows: list[dict[str, Any]] = []
    for n in sorted(set(sizes)):
        joins = r.joins[max(1, n - window) : n]
        rows.append({
            "nodes": n,
            "joins": len(joins),
            "messages_mean": float(np.mean([j.messages for j in joins])),
            "messages_max": max(j.messages for j in joins),
            "touched_mean": float(np.mean([j.touched for j in joins])),
            "touched_max": max(j.touched for j in joins),
        })  # fmt: skip
    return {
        "experiment": "ring-join",
        "seed": seed,
        "rows": rows,
        "consistent": not errors,
        "fit_messages": fit_log([r_["nodes"] for r_ in rows], [r_["messages_mean"] for r_ in rows]),
        "run_s": time.perf_counter() - t0,
    }


def fit_log(ns: Sequence[int], ys: Sequence[float]) -> dict[str, float]:
    """Least squares ``y = a + b log2 n``: the slope, intercept and R^2."""
    x = np.log2(np.asarray(ns, dtype=float))
    y = np.asarray(ys, dtype=float)
    if len(x) < 2:
        return {"slope": math.nan, "intercept": math.nan, "r2": math.nan}
    b, a = np.polyfit(x, y, 1)
    pred = a + b * x
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss if ss > 0 else 1.0
    return {"slope": float(b), "intercept": float(a), "r2": r2}


def repair_cost(
    *, sizes: Sequence[int], trials: int = 5, seed: int = 1, progress: ProgressFn | None = None
) -> dict[str, Any]:
    """Repair messages and time after a node, ring-link and chord-link failure, per size."""
    if not sizes or min(sizes) < 8 or trials < 1:
        raise FlowbusError(f"ring-repair: sizes must be >= 8 and trials >= 1, got {list(sizes)!r}, {trials}")
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for i, n in enumerate(sorted(set(sizes))):
        rows.extend(_repairs(n, trials, seed))
        if progress is not None:
            progress("ring sizes", i + 1, len(sizes))
    summary = []
    for kind in KINDS:
        pts = [(r["nodes"], r["messages"], r["time"]) for r in rows if r["kind"] == kind and r["repaired"]]
        by_n: dict[int, list[tuple[float, float]]] = {}
        for n, m, t in pts:
            by_n.setdefault(n, []).append((m, t))
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
    return {
        "experiment": "ring-repair",
        "seed": seed,
        "rows": rows,
        "summary": summary,
        "run_s": time.perf_counter() - t0,
    }


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
    return sum(v for k, v in sent.items() if k != "Heartbeat")


def _one_repair(r: RingSim, cut: LinkFailure, kind: str, rng: random.Random) -> dict[str, Any]:
    order = r.by_id()
    a = order[rng.randrange(len(order))]
    before, start = _repair_messages(r), r.sim.now
    last = [start]
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

    def watch(node: int, sub: Any, event: Any, now: float) -> None:
        return None

    r.sim.on_deliver = watch
    repaired = False
    for _ in range(400):
        r.sim.run(until=r.sim.now + 1.0)
        now_sent = _repair_messages(r)
        if now_sent != seen:
            seen, last[0] = now_sent, r.sim.now
        if kind == "node":
            repaired = not ring_errors(r.live) and r.sim.now - last[0] > 3 * HEARTBEAT
        elif kind == "ring-link":
            repaired = target.me.id in a.detour and r.sim.now - last[0] > 3 * HEARTBEAT
        else:
            repaired = bool(a.detour.get(target.me.id)) and r.sim.now - last[0] > 3 * HEARTBEAT
        if repaired:
            break
    if kind != "node":
        cut.restore(a.addr, target.addr)
        a.detour.pop(target.me.id, None)
        target.detour.pop(a.me.id, None)
    return {"messages": seen - before, "time": last[0] - start, "repaired": repaired}


def write_outputs(result: dict[str, Any], out: Path) -> dict[str, str]:
    """``rows.csv``, ``result.json`` and a PNG of a ring-join or ring-repair ``result``."""
    return write_result(result, out, _plot_join if result["experiment"] == "ring-join" else _plot_repair)


def write_result(
    result: dict[str, Any], out: Path, plot: Callable[[dict[str, Any], Path], None]
) -> dict[str, str]:
    """What every ring experiment writes in ``out``: ``rows.csv`` (the result's rows),
    ``result.json`` (all of it) and ``<experiment>.png`` (drawn by ``plot``)."""
    from flowbus.experiments.sweep import write_csv

    out.mkdir(parents=True, exist_ok=True)
    rows = result["rows"]
    paths = {
        "rows": out / "rows.csv",
        "json": out / "result.json",
        "plot": out / f"{result['experiment']}.png",
    }
    write_csv(paths["rows"], list(rows[0]), rows)
    paths["json"].write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    plot(result, paths["plot"])
    return {k: str(v) for k, v in paths.items()}


def _plot_join(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    ns = [r["nodes"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(ns, [r["messages_mean"] for r in rows], "o-", label="messages per join (mean)")
    ax.plot(ns, [r["touched_mean"] for r in rows], "s-", label="brokers touched per join (mean)")
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("brokers in the ring")
    ax.set_title("chordal ring: cost of one join")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_repair(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for s in result["summary"]:
        pts = s["by_nodes"]
        ns = [p["nodes"] for p in pts]
        axes[0].plot(ns, [p["messages_mean"] for p in pts], "o-", label=s["kind"])
        axes[1].plot(ns, [p["time_mean"] for p in pts], "o-", label=s["kind"])
        fit = s["fit_messages"]
        if ns and not math.isnan(fit["slope"]):
            xs = np.array(ns, dtype=float)
            axes[0].plot(xs, fit["intercept"] + fit["slope"] * np.log2(xs), ":", color="grey")
    for ax, what in zip(
        axes, ("repair messages (no heartbeats)", "time to repair (latency units)"), strict=True
    ):
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("brokers in the ring")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_title("repair cost (dotted: a + b log2 n fit)")
    axes[1].set_title("repair time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
