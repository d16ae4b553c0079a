"""The PNGs of the ring experiments (:mod:`flowbus.experiments.ring`): one function each.

Each takes the experiment's :class:`~flowbus.experiments.output.Result` and the PNG's path.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from flowbus.experiments.output import Result, pyplot, save

__all__ = ["plot_adapt", "plot_classes", "plot_faults", "plot_join", "plot_repair"]


def plot_join(result: Result, png: Path) -> None:
    """Messages and brokers touched per join against the ring size."""
    rows = result.rows
    ns = [r["nodes"] for r in rows]
    fig, ax = pyplot().subplots(figsize=(7, 4))
    ax.plot(ns, [r["messages_mean"] for r in rows], "o-", label="messages per join (mean)")
    ax.plot(ns, [r["touched_mean"] for r in rows], "s-", label="brokers touched per join (mean)")
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("brokers in the ring")
    ax.set_title("chordal ring: cost of one join")
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, png)


def plot_repair(result: Result, png: Path) -> None:
    """Repair messages (with their a + b log2 n fit) and time, per kind of failure, against n."""
    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4))
    for s in result.summary:
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
    save(fig, png)


def plot_classes(result: Result, png: Path) -> None:
    """Mean latency (bar to p99) of each class, links intact and failed."""
    rows = result.rows
    fig, ax = pyplot().subplots(figsize=(8, 4))
    width = 0.35
    classes = ["normal", "express", "secure"]
    for j, phase in enumerate(("intact", "failed")):
        by = {r["cls"]: r for r in rows if r["phase"] == phase}
        xs = np.arange(len(classes)) + (j - 0.5) * width
        means = [by[c]["latency_mean"] for c in classes]
        p99 = [by[c]["latency_p99"] - by[c]["latency_mean"] for c in classes]
        ax.bar(xs, means, width, yerr=[np.zeros(len(classes)), p99], capsize=4, label=f"links {phase}")
    ax.set_xticks(np.arange(len(classes)), classes)
    ax.set_ylabel("latency (mean; bar to p99)")
    nodes = result.config.to_dict()["nodes"]
    ax.set_title(f"events by class, {nodes} brokers; violations: {result.findings['violations']}")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    save(fig, png)


def plot_faults(result: Result, png: Path) -> None:
    """Lost deliveries and delay p99 by crash scenario, one bar per backup factor."""
    rows = result.rows
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    backups = sorted({r["backup"] for r in rows})
    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4))
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
    save(fig, png)


def plot_adapt(result: Result, png: Path) -> None:
    """Load on the ring over time (the hot broker, the largest, brokers) and express latency
    over time with the links slowed."""
    rows, lat = result.rows, result.tables["latency"]
    cfg = result.config.to_dict()
    fig, axes = pyplot().subplots(1, 3, figsize=(19, 4))
    ts = [r["t"] for r in rows]
    axes[0].plot(ts, [r["hot_load"] for r in rows], label="hot broker's load")
    axes[0].plot(ts, [r["max_load"] for r in rows], label="largest load")
    axes[0].plot(ts, [r["mean_load"] for r in rows], label="mean load")
    axes[0].axhline(1.0, color="grey", linestyle=":", label="limit")
    twin = axes[0].twinx()
    twin.step(ts, [r["brokers"] for r in rows], "k--", where="post", label="brokers")
    twin.set_ylabel("brokers")
    axes[0].set_xlabel("time")
    axes[0].set_ylabel("load (1 = limit)")
    axes[0].set_title("load rising on one broker: shares, then brokers added")
    axes[0].legend(loc="upper left")
    axes[0].grid(alpha=0.3)
    tl = [r["t"] for r in lat]
    axes[1].plot(tl, [r["latency_mean"] for r in lat], label="mean")
    axes[1].plot(tl, [r["latency_max"] for r in lat], label="max (fallbacks to normal links too)")
    axes[1].plot(tl, [r["express_max"] for r in lat], label="max of those kept to express links")
    axes[1].axvline(cfg["slow_at"], color="grey", linestyle=":", label="links slow")
    axes[1].set_xlabel("time sent")
    axes[1].set_ylabel("express delivery latency")
    axes[1].set_title(f"express events (bound {cfg['bound']:g} a link): a link slowing")
    axes[1].legend()
    axes[1].grid(alpha=0.3)
    _plot_brokers(axes[2], result.tables["brokers"], cfg)
    save(fig, png)


def _plot_brokers(ax: Any, rows: list[dict[str, Any]], cfg: dict[str, Any]) -> None:
    """The ring brokers' core: one express event a time unit, one link slowed, then fast."""
    ts = [r["t"] for r in rows]
    ax.plot(ts, [r["latency_mean"] for r in rows], label="mean delivery latency")
    ax.plot(ts, [r["latency_max"] for r in rows], label="largest")
    ax.fill_between(ts, 0, [r["detour"] * max(r["latency_max"] for r in rows) for r in rows],
                    step="mid", alpha=0.15, label="first hop round the slow link")  # fmt: skip
    ax.axvline(cfg["slow_at"], color="grey", linestyle=":", label="link slow")
    ax.axvline(cfg["recover_at"], color="grey", linestyle="--", label="link fast again")
    ax.set_xlabel("time sent")
    ax.set_ylabel("delivery latency")
    ax.set_title(f"ring brokers' core (bound {cfg['express_bound']:g}): a detour and back")
    ax.legend()
    ax.grid(alpha=0.3)
