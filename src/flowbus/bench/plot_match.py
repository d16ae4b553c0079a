"""Plot ``flowbus bench match`` results (JSON lines) against the reference matchers' published figures.

flowbus bench plot match docs/results/matching/match.jsonl docs/results/matching/match.png
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# Figures measured on this kind of machine (2 cores), quoted by the foundation issue.
W1_REFERENCES = {
    "Event Ruler (Java)": {1_000: 87_700, 10_000: 35_800, 100_000: 4_900},
    "Quamina (Go)": {1_000: 141_700, 10_000: 16_800, 100_000: 853},
    "naive numpy counting": {1_000: 85_900, 10_000: 75_400, 100_000: 38_100, 1_000_000: 5_000},
}
REIN_MS = {100_000: 1.38, 1_000_000: 12.8}


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    fig, (w1, rein) = plt.subplots(1, 2, figsize=(12, 4.5))
    for strategy, style in (("counting", "o-"), ("clustering", "s-")):
        pts = sorted(
            (r["subscriptions"], r["events_per_s"])
            for r in rows
            if r["workload"] == "w1" and r["strategy"] == strategy
        )
        if pts:
            w1.plot(*zip(*pts, strict=True), style, lw=2, label=f"flowbus {strategy}")
        pts = sorted(
            (r["subscriptions"], r["ms_per_event"])
            for r in rows
            if r["workload"] == "w-rein" and r["strategy"] == strategy
        )
        if pts:
            rein.plot(*zip(*pts, strict=True), style, lw=2, label=f"flowbus {strategy}")
    for name, ref in W1_REFERENCES.items():
        w1.plot(list(ref), list(ref.values()), "--", alpha=0.7, label=name)
    rein.plot(list(REIN_MS), list(REIN_MS.values()), "--", alpha=0.7, label="REIN (C++)")
    rein.axhline(3.0, color="grey", lw=0.8, ls=":", label="goal: 3 ms at 1M")
    w1.axhline(150_000, color="grey", lw=0.8, ls=":", label="goal: 150K ev/s at 100K")
    w1.set(
        xscale="log",
        yscale="log",
        xlabel="subscriptions",
        ylabel="events / s",
        title="W1: 3 equalities of 20 attributes",
    )
    rein.set(
        xscale="log",
        yscale="log",
        xlabel="subscriptions",
        ylabel="ms / event",
        title="W-REIN: 10 ranges (40%) of 20 attributes",
    )
    for ax in (w1, rein):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
