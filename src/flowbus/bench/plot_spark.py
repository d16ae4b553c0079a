"""Plot a ``flowbus bench spark --json`` document, and write its figures as CSV.

flowbus bench plot spark docs/results/spark.json docs/results/spark.png docs/results/spark.csv
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per measured figure: what, variant, value, unit."""
    out: list[dict[str, Any]] = []
    plans = doc["plans"]
    out.append({"what": "stock flow plan", "variant": "rewritten", "value": plans["rewritten_events_per_s"]})
    out.append(
        {"what": "stock flow plan", "variant": "hop by hop", "value": plans["hop_by_hop_events_per_s"]}
    )
    out.append({"what": "flowbus run (stock flow)", "variant": "transformWithState",
                "value": doc["engine"]["events_per_s"]})  # fmt: skip
    col = doc["collapse"]
    out.append({"what": "collapse+expand", "variant": "transformWithState",
                "value": col["transform_with_state"]["events_per_s"]})  # fmt: skip
    out.append({"what": "collapse+expand", "variant": "aggregate", "value": col["aggregate"]["events_per_s"]})
    for r in out:
        r["unit"] = "events/s"
    for run in doc["bulk_match"]["runs"]:
        n = run["subscriptions"]
        for variant, key in (("flowbus", "flowbus_total_s"), ("broadcast hash join", "join_total_s")):
            if key in run:
                out.append(
                    {"what": f"bulk match {n:,} subs", "variant": variant, "value": run[key], "unit": "s"}
                )
    return out


def plot(doc: dict[str, Any], png: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    plans = doc["plans"]
    ax = axes[0]
    ax.bar(["rewritten", "hop by hop"], [plans["rewritten_events_per_s"], plans["hop_by_hop_events_per_s"]],
           color=["tab:blue", "tab:gray"])  # fmt: skip
    ax.set_title(f"stock flow, {plans['events']:,} trades: ratio {plans['ratio']:.2f}")
    ax.set_ylabel("events/s")
    col = doc["collapse"]
    ax = axes[1]
    ax.bar(["transformWithState\n(expand per event)", "aggregate\n(expand per batch)"],
           [col["transform_with_state"]["events_per_s"], col["aggregate"]["events_per_s"]],
           color=["tab:blue", "tab:orange"])  # fmt: skip
    ax.set_title(f"collapse + expand, {col['events']:,} ticks, {col['keys']} keys")
    ax.set_ylabel("events/s")
    ax = axes[2]
    runs = doc["bulk_match"]["runs"]
    labels = [f"{r['subscriptions']:,}" for r in runs]
    xs = range(len(runs))
    ax.bar(
        [x - 0.2 for x in xs], [r["flowbus_total_s"] for r in runs], 0.4, label="flowbus (broadcast matcher)"
    )
    ax.bar([x + 0.2 for x in xs], [r["join_total_s"] for r in runs], 0.4, label="broadcast hash join")
    ax.set_xticks(list(xs), labels)
    ax.set_xlabel("W1 subscriptions")
    ax.set_ylabel("seconds (end to end)")
    ax.set_yscale("log")
    ax.set_title(f"bulk matching, {doc['bulk_match']['events']:,} events")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def write_csv(doc: dict[str, Any], path: Path) -> None:
    """:func:`rows` as CSV."""
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["what", "variant", "value", "unit"])
        w.writeheader()
        w.writerows(rows(doc))
