"""Plot a ``flowbus bench spark --json`` document, and write its figures as CSV.

flowbus bench plot spark docs/results/spark/spark.json docs/results/spark/spark.png \
    docs/results/spark/spark.csv --engine docs/results/spark/spark.2m.json

The state path is the engine's per-key fold (``per_key_fold``); a document of
the engine before it holds ``transform_with_state`` instead, and is labelled so.
With ``--engine``, a ``bench spark --engine-only --json`` document (the stock
flow at 2,000,000 events) adds its two rates against the goal.
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
    label, state = _state_path(doc["collapse"])
    out.append({"what": "flowbus run (stock flow)", "variant": label, "value": doc["engine"]["events_per_s"]})
    out.append({"what": "collapse+expand", "variant": label, "value": state["events_per_s"]})
    aggregate = doc["collapse"]["aggregate"]["events_per_s"]
    out.append({"what": "collapse+expand", "variant": "aggregate", "value": aggregate})
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


def engine_rows(engine: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of an engine-only document: the stock flow on Spark and on the local interpreter."""
    e = engine["engine"]
    what = f"stock flow, {e['events']:,} events"
    return [
        {"what": what, "variant": "Spark engine", "value": e["events_per_s"], "unit": "events/s"},
        {"what": what, "variant": "local interpreter", "value": e["local_events_per_s"], "unit": "events/s"},
    ]


def _state_path(col: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The state path's label and figures: the per-key fold, or the engine before it."""
    if "per_key_fold" in col:
        return "per-key fold", col["per_key_fold"]
    return "transformWithState (engine before)", col["transform_with_state"]


def plot(doc: dict[str, Any], png: Path, engine: dict[str, Any] | None = None) -> None:
    panels = 4 if engine is not None else 3
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4.5))
    plans = doc["plans"]
    ax = axes[0]
    ax.bar(["rewritten", "hop by hop"], [plans["rewritten_events_per_s"], plans["hop_by_hop_events_per_s"]],
           color=["tab:blue", "tab:gray"])  # fmt: skip
    ax.set_title(f"stock flow, {plans['events']:,} trades: ratio {plans['ratio']:.2f}")
    ax.set_ylabel("events/s")
    col = doc["collapse"]
    label, state = _state_path(col)
    ax = axes[1]
    ax.bar([f"{label}\n(expand per event)", "aggregate\n(expand per batch)"],
           [state["events_per_s"], col["aggregate"]["events_per_s"]],
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
    if engine is not None:
        _engine_panel(axes[3], engine)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def _engine_panel(ax: Any, engine: dict[str, Any]) -> None:
    e = engine["engine"]
    ax.bar(["Spark engine", "local interpreter"], [e["events_per_s"], e["local_events_per_s"]],
           color=["tab:blue", "tab:gray"])  # fmt: skip
    ax.axhline(100_000, color="tab:red", linestyle="--", label="goal: 100,000 events/s")
    ratio = e["events_per_s"] / e["local_events_per_s"]
    ax.set_title(f"stock flow, {e['events']:,} events: ratio {ratio:.2f}")
    ax.set_ylabel("events/s")
    ax.legend()


def write_csv(doc: dict[str, Any], path: Path, engine: dict[str, Any] | None = None) -> None:
    """:func:`rows` (and :func:`engine_rows`) as CSV."""
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["what", "variant", "value", "unit"])
        w.writeheader()
        w.writerows(rows(doc) + (engine_rows(engine) if engine is not None else []))
