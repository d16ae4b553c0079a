"""The PNGs of the CBDLO experiments (matplotlib, Agg): one function per experiment.

Each plots the means over seeds (the result's ``summary``) against the swept setting, one
line per protocol, with the document's stated values as star markers where it gives any.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from flowbus.experiments.output import Result, pyplot, save

__all__ = ["plot"]

COLORS: Final = {"simple": "tab:orange", "cbdlo": "tab:blue", "tera": "tab:green"}
NAMES: Final = {"simple": "Simple (flooding)", "cbdlo": "CBDLO (CRAWL + CDM)", "tera": "TERA"}


def _series(
    summary: Sequence[Mapping[str, Any]], sweep: str, protocol: str, key: str
) -> tuple[list[Any], list[Any]]:
    pts = sorted((r["x"], r.get(key)) for r in summary if r["sweep"] == sweep and r["protocol"] == protocol)
    pts = [(x, y) for x, y in pts if y is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot(result: Result, png: Path) -> None:
    """The figure of ``result``'s experiment."""
    {
        "cbdlo-cost": _cost,
        "cbdlo-hops": _cost,
        "cbdlo-scale": _scale,
        "cbdlo-matching": _matching,
        "cbdlo-apt": _apt,
        "cbdlo-churn": _churn,
    }[result.experiment](result, png)


def _churn(result: Result, png: Path) -> None:
    """Completeness, and routing / maintenance / gossip messages per event, against churn."""
    plt = pyplot()
    rows = sorted(result.summary, key=lambda r: r["churn"])
    xs = [100 * r["churn"] for r in rows]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax.plot(xs, [100 * r["completeness"] for r in rows], "o-", color=COLORS["cbdlo"], label=NAMES["cbdlo"])
    ax.set_xlabel("nodes failed during the run, as many joining (% of the network)")
    ax.set_ylabel("completeness (% of expected deliveries)")
    ax.set_title("CBDLO under churn: completeness")
    ax.legend()
    for key, label, style in (("routing_per_event", "routing (walks, entries, tree steps, matches)", "o-"),
                              ("maintenance_per_event", "tree maintenance", "s-"),
                              ("gossip_per_event", "gossip (Cyclon shuffles)", "^--")):  # fmt: skip
        bx.plot(xs, [r[key] for r in rows], style, label=label)
    bx.set_xlabel("nodes failed during the run, as many joining (% of the network)")
    bx.set_ylabel("messages per event")
    bx.set_title("messages per event")
    bx.legend()
    save(fig, png)


def _cost(result: Result, png: Path) -> None:
    plt = pyplot()
    cfg = result.config.to_dict()
    sweep = next(iter(cfg["sweep"]))
    summary = result.summary
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    for p in cfg["protocols"]:
        xs, ys = _series(summary, sweep, p, "effective_cost")
        ax.plot(xs, ys, "o-", color=COLORS[p], label=NAMES[p])
        xs, cs = _series(summary, sweep, p, "completeness")
        bx.plot(xs, [100 * c for c in cs], "o-", color=COLORS[p], label=NAMES[p])
    paper = result.findings.get("paper") or {}
    point = paper.get("simple_first_point")
    if point and sweep == "subscriptions":
        xs, _ = _series(summary, sweep, "simple", "effective_cost")
        if xs:
            ax.scatter([xs[0]], [point["effective_cost"]], marker="*", s=160, color=COLORS["simple"],
                       edgecolors="black", zorder=5, label="Simple, document (411,630)")  # fmt: skip
    ax.set_yscale("log")
    ax.set_xlabel("total subscriptions" if sweep == "subscriptions" else "maximum hops")
    ax.set_ylabel("effective distribution cost (messages / completeness)")
    ax.set_title(f"{result.experiment}: {cfg['nodes']:,} nodes, {len(result.config.seeds)} seeds")
    bx.set_xlabel(ax.get_xlabel())
    bx.set_ylabel("delivery completeness (% of expected deliveries)")
    bx.set_ylim(0, 105)
    bx.set_title("delivered / expected")
    for a in (ax, bx):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    save(fig, png)


def _scale(result: Result, png: Path) -> None:
    plt = pyplot()
    cfg = result.config.to_dict()
    summary = result.summary
    ext = result.findings.get("extrapolation", {})
    fig, ax = plt.subplots(figsize=(8, 5))
    for p in cfg["protocols"]:
        xs, ys = _series(summary, "nodes", p, "messages_per_event")
        ax.plot(xs, ys, "o-", color=COLORS[p], label=f"{NAMES[p]}, simulated")
        f = ext.get(p)
        if f and xs:
            grid = [xs[-1] * 10 ** (k / 4) for k in range(0, 4 * 4 + 1)]
            grid = [n for n in grid if n <= 1e9] + [1e9]
            ax.plot(grid, [f["a"] + f["b_log2n"] * math.log2(n) + f["c_n"] * n for n in grid], "--",
                    color=COLORS[p], label=f"{NAMES[p]}, extrapolated")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes")
    ax.set_ylabel("messages per event")
    ax.set_title("figure 7: TERA (APT 50) vs CBDLO (APT 100)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    save(fig, png)


def _matching(result: Result, png: Path) -> None:
    plt = pyplot()
    cfg = result.config.to_dict()
    summary = result.summary
    sweeps = list(cfg["sweep"])
    fig, axes = plt.subplots(1, len(sweeps), figsize=(6 * len(sweeps), 4.5), squeeze=False)
    for ax, sweep in zip(axes[0], sweeps, strict=True):
        xs, ys = _series(summary, sweep, "simple", "comparisons_per_event")
        if xs:
            ax.plot(xs, ys, "o-", color=COLORS["simple"], label="Simple: m x s per node reached, per event")
        xs, ys = _series(summary, sweep, "cbdlo", "matching_cost_per_event")
        if xs:
            ax.plot(xs, ys, "o-", color=COLORS["cbdlo"], label="CBDLO: |APT| H1 + H2, per event")
        xs, ys = _series(summary, sweep, "cbdlo", "matching_cost_per_attribute")
        if xs:
            ax.plot(xs, ys, "s--", color=COLORS["cbdlo"], label="CBDLO: per attribute search (doc's 1/8)")
        ax.set_yscale("log")
        ax.set_xscale("log")
        ax.set_xlabel("total subscriptions" if sweep == "subscriptions" else "attributes")
        ax.set_ylabel("matching cost (attribute comparisons)")
        ax.set_title("figure 8" if sweep == "subscriptions" else "figure 9")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    save(fig, png)


def _apt(result: Result, png: Path) -> None:
    plt = pyplot()
    cfg = result.config.to_dict()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    rows = [r for r in result.summary if r["protocol"] == "cbdlo"]
    for attrs in sorted({r["attributes"] for r in rows}):
        pts = sorted((r["x"], r["hit_rate_10"]) for r in rows if r["attributes"] == attrs)
        ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], "o-", label=f"{int(attrs):,} attributes")
    ax.scatter([100], [90], marker="*", s=160, color="black", zorder=5, label="document: 90% at APT 100")
    ax.set_xscale("log")
    ax.set_xlabel("APT size (entries)")
    ax.set_ylabel("searches entering their topology within 10 hops (%)")
    ax.set_ylim(0, 105)
    ax.set_title(f"APT hit rate, {cfg['nodes']:,} nodes, view {cfg['view']}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    save(fig, png)
