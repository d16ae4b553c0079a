"""What a campaign leaves: CSV of its rows, each run's timeline as a plot with its faults drawn.

How it works: :func:`plot_timeline` draws, per second of a run, the events sent and
acknowledged (publishers) and taken (subscribers) above, the delivery latency (p50, p99,
log scale) below, and each fault as a shaded band from its injection to its heal, named;
:func:`write_campaign` writes ``campaign.json`` (what ``--json`` prints), ``rows.csv``
(one row per run), ``campaign.md`` (:func:`markdown`: the figures per mix, summed over its
seeds, and the totals) and ``campaign.png`` (lost, duplicated, out of order and recovery per
run, the goal's zero line visible at a glance).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowbus.chaos.proxy import COUNTS
from flowbus.errors import ExperimentError

__all__ = [
    "TOTALS",
    "markdown",
    "merge_campaigns",
    "plot_timeline",
    "summarize",
    "write_campaign",
    "write_csv",
]

_HEAD = (
    "mix",
    "runs",
    "faults",
    "acknowledged",
    "expected",
    "delivered",
    "lost (prefix/middle/postfix)",
    "stranded",
    "dup",
    "misrouted",
    "wrong values",
    "out of order",
    "hung",
    "refused",
    "double-served s",
    "recovery p99 s",
    "tracebacks",
)

_COLOURS = {
    "kill": "#d62728",
    "kill-adjacent": "#d62728",
    "kill-minority": "#d62728",
    "power-loss": "#8c564b",
    "restart": "#7f7f7f",
    "pause": "#9467bd",
    "starve": "#e377c2",
    "disk-full": "#8c564b",
    "client-cut": "#17becf",
    "ack-cut": "#17becf",
    "delay": "#bcbd22",
    "loss": "#bcbd22",
    "dup": "#bcbd22",
    "reorder": "#bcbd22",
}


TOTALS = (
    "faults_injected",
    "heal_failures",
    "published",
    "acknowledged",
    "expected_deliveries",
    "delivered",
    "caught_up",
    "lost",
    "lost_prefix",
    "lost_middle",
    "lost_postfix",
    "stranded",
    "duplicated",
    "misrouted",
    "wrong_values",
    "phantom",
    "out_of_order",
    "unacknowledged_taken",
    "unacknowledged_late",
    "hung_publishes",
    "refused",
    "unavailable_s",
    "double_served_s",
    "registry_mismatch",
    "tracebacks",
)
"""The counts a campaign sums over its runs."""


def summarize(
    rows: Sequence[dict[str, Any]], *, overlay: str, isolated: bool, commit: str = ""
) -> dict[str, Any]:
    """The campaign's document: totals over the runs, the worst recovery, the rows."""
    totals = {k: sum(r.get(k, 0) for r in rows) for k in TOTALS}  # (rows of older runs: 0)
    proxy = {k: sum(r["proxy"].get(k, 0) for r in rows if "proxy" in r) for k in COUNTS}
    return {
        "overlay": overlay,
        "isolated": isolated,
        **({"commit": commit} if commit else {}),
        "runs": len(rows),
        "failed_runs": sum(1 for r in rows if "error" in r),
        **totals,
        **({"proxy": proxy} if any("proxy" in r for r in rows) else {}),
        "recovery_p99_s": max((r["recovery_p99_s"] for r in rows), default=0.0),
        "recovery_max_s": max((r["recovery_max_s"] for r in rows), default=0.0),
        "seeds": sorted({r["seed"] for r in rows}),
        "rows": list(rows),
    }


def merge_campaigns(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One campaign's document from the documents of its parts (a campaign run in parts, for
    example some seeds at a time): they must be of one overlay and one commit, and no run
    (mix, seed) may come twice."""
    if not docs:
        raise ExperimentError("nothing to merge: give the parts' campaign.json")
    for key in ("overlay", "commit"):
        values = {d.get(key, "unknown") for d in docs}
        if len(values) > 1:
            raise ExperimentError(f"the parts differ in {key}: {', '.join(sorted(values))}")
    commit = docs[0].get("commit", "unknown")
    if len(docs) > 1 and (commit == "unknown" or commit.endswith("+dirty")):
        raise ExperimentError(f"the parts' code is not known to be one commit ({commit})")
    rows = [r for d in docs for r in d["rows"]]
    runs = [(r["mix"], r["seed"]) for r in rows]
    twice = sorted({f"{m}-{s}" for m, s in runs if runs.count((m, s)) > 1})
    if twice:
        raise ExperimentError(f"runs in more than one part: {', '.join(twice)}")
    return summarize(
        rows,
        overlay=docs[0]["overlay"],
        isolated=all(d["isolated"] for d in docs),
        commit=commit,
    )


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        path.write_text("")
        return
    keys = [k for k in rows[0] if not isinstance(rows[0][k], dict | list)]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def _bands(ax: Any, faults: Sequence[dict[str, Any]], start: float) -> None:
    injected = {}
    for f in faults:
        key = (f["kind"], f["start"])
        if f["what"] == "inject":
            injected[key] = f["t"]
        elif f["what"] == "heal" and key in injected:  # (not a redeploy's deploy or undeploy)
            t0 = injected.pop(key) - start
            ax.axvspan(t0, f["t"] - start, color=_COLOURS.get(f["kind"], "#ff7f0e"), alpha=0.15, lw=0)
            ax.text(
                t0,
                1.0,
                f" {f['kind']} {'+'.join(f['hosts'])}",
                transform=ax.get_xaxis_transform(),
                fontsize=7,
                va="top",
                rotation=90,
            )


def plot_timeline(
    path: Path, rows: Sequence[dict[str, Any]], faults: Sequence[dict[str, Any]], *, title: str
) -> None:
    """The run's throughput and latency per second, the faults as bands (see the module note)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True, height_ratios=(3, 2))
    t = [r["t"] for r in rows]
    for key, label in (("sent", "sent / s"), ("acked", "acknowledged / s"), ("taken", "taken / s")):
        top.plot(t, [r[key] for r in rows], label=label, lw=1)
    top.set_ylabel("events / s")
    top.legend(loc="upper right", fontsize=8)
    top.set_title(f"flowbus chaos: {title}")
    for key, label in (("latency_p50_ms", "p50"), ("latency_p99_ms", "p99")):
        bottom.plot(t, [max(r[key], 0.1) for r in rows], label=f"delivery latency {label}", lw=1)
    bottom.set_yscale("log")
    bottom.set_ylabel("ms")
    bottom.set_xlabel("seconds since the first publish")
    bottom.legend(loc="upper right", fontsize=8)
    start = _first_publish(path.parent)
    for ax in (top, bottom):
        _bands(ax, faults, start)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _first_publish(root: Path) -> float:
    with (root / "publishes.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            if row["sent"]:
                return float(row["sent"])
    return 0.0


def markdown(doc: dict[str, Any]) -> str:
    """The campaign's figures as a Markdown table: one line per mix (its seeds summed; the
    recovery, its worst p99), and the totals."""

    by_mix: dict[str, list[dict[str, Any]]] = {}
    for r in doc["rows"]:
        by_mix.setdefault(r["mix"], []).append(r)

    def line(name: str, rows: Sequence[dict[str, Any]]) -> str:
        t = summarize(rows, overlay=doc.get("overlay", ""), isolated=doc.get("isolated", False))
        lost = f"{t['lost']:,} ({t['lost_prefix']:,}/{t['lost_middle']:,}/{t['lost_postfix']:,})"
        cells = [
            name,
            str(len(rows)),
            str(t["faults_injected"]),
            f"{t['acknowledged']:,}",
            f"{t['expected_deliveries']:,}",
            f"{t['delivered']:,}",
            lost,
            f"{t['stranded']:,}",
            str(t["duplicated"]),
            str(t["misrouted"]),
            str(t["wrong_values"]),
            str(t["out_of_order"]),
            str(t["hung_publishes"]),
            str(t["refused"]),
            f"{t['double_served_s']:.1f}",
            f"{t['recovery_p99_s']:.2f}",
            str(t["tracebacks"]),
        ]
        return "| " + " | ".join(cells) + " |"

    out = ["| " + " | ".join(_HEAD) + " |", "|" + "---|" * len(_HEAD)]
    out += [line(m, rows) for m, rows in by_mix.items()]
    out.append(line("**all**", doc["rows"]))
    return "\n".join(out) + "\n"


def write_campaign(root: Path, doc: dict[str, Any]) -> None:
    """``campaign.json``, ``rows.csv``, ``campaign.md`` and ``campaign.png`` in ``root``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    root.mkdir(parents=True, exist_ok=True)
    (root / "campaign.json").write_text(json.dumps(doc, indent=1))
    rows = doc["rows"]
    write_csv(root / "rows.csv", rows)
    if not rows:
        return
    (root / "campaign.md").write_text(markdown(doc))
    labels = [f"{r['mix']}-{r['seed']}" for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, 0.35 * len(rows)), 6), sharex=True)
    x = range(len(rows))
    width = 0.27
    for i, key in enumerate(("lost", "duplicated", "out_of_order")):
        top.bar([v + (i - 1) * width for v in x], [r[key] for r in rows], width, label=key)
    top.axhline(0, color="black", lw=0.8)
    top.set_ylabel("deliveries")
    top.legend(fontsize=8)
    top.set_title(f"flowbus chaos on {doc['overlay']}: {doc['runs']} runs, {doc['faults_injected']} faults")
    bottom.bar(x, [r["recovery_p99_s"] for r in rows], color="#9467bd", label="recovery p99 (s)")
    bottom.axhline(10, color="red", lw=0.8, ls="--", label="goal: 10 s")
    bottom.set_ylabel("seconds")
    bottom.set_xticks(list(x), labels, rotation=90, fontsize=7)
    bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(root / "campaign.png", dpi=110)
    plt.close(fig)
