"""The before/after table and plot of redesign.md, from the JSON documents beside it.

python docs/results/redesign/compare.py    (writes compare.csv and compare.png here)
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).parent


def rows(side: str, bench: str) -> list[dict]:
    out = []
    for path in sorted(HERE.glob(f"{side}-{bench}*.json")):
        doc = json.loads(path.read_text())
        out.extend(doc.get("rows", [doc]))
    return out


def medians() -> list[dict]:
    table = []
    for side in ("before", "after"):
        runs = rows(side, "match")
        table.append(
            {
                "side": side,
                "bench": "match W1 100k",
                "case": "",
                "runs": len(runs),
                "events_per_s": statistics.median(r["events_per_s"] for r in runs),
            }
        )
        by: dict[tuple, list[dict]] = {}
        for r in rows(side, "broker"):
            by.setdefault((r["brokers"], r["subscriptions"], r["rate"] or 0), []).append(r)
        for r in rows(side, "flow-bus"):
            by.setdefault((r["kind"], r["brokers"], r["rate"] or 0), []).append(r)
        for key, runs in by.items():
            bench = "flow-bus" if isinstance(key[0], str) else "broker"
            case = (
                f"{key[0]}, {key[1]} brokers" if bench == "flow-bus" else f"{key[0]} brokers, K={key[1]}"
            ) + (f", paced {key[2]:.0f}/s" if key[2] else "")
            table.append(
                {
                    "side": side,
                    "bench": bench,
                    "case": case,
                    "runs": len(runs),
                    "events_per_s": statistics.median(r["events_per_s_in"] for r in runs),
                    "latency_p99_ms": statistics.median(r["latency_p99_ms"] for r in runs),
                    "broker_rss_mb": statistics.median(r["broker_rss_mb"] for r in runs),
                }
            )
    return table


def main() -> None:
    table = medians()
    with (HERE / "compare.csv").open("w", newline="") as f:
        w = csv.DictWriter(
            f, ["side", "bench", "case", "runs", "events_per_s", "latency_p99_ms", "broker_rss_mb"]
        )
        w.writeheader()
        w.writerows(table)
    before = {(r["bench"], r["case"]): r for r in table if r["side"] == "before"}
    after = {(r["bench"], r["case"]): r for r in table if r["side"] == "after"}
    keys = [k for k in before if k in after]
    ratios = [after[k]["events_per_s"] / before[k]["events_per_s"] for k in keys]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(keys) + 1.2))
    ax.barh(range(len(keys)), ratios, color=["#4a7" if abs(r - 1) < 0.1 else "#c63" for r in ratios])
    ax.axvline(1.0, color="k", lw=0.8)
    ax.axvspan(0.9, 1.1, color="#ddd", zorder=0)
    ax.set_yticks(range(len(keys)), [f"{b}: {c}" if c else b for b, c in keys], fontsize=8)
    ax.set_xlabel("after / before, median events/s in (grey: within 10 %)")
    ax.set_xlim(0.7, 1.3)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(HERE / "compare.png", dpi=110)
    for k, r in zip(keys, ratios, strict=True):
        b, a = before[k]["events_per_s"], after[k]["events_per_s"]
        print(f"{k[0]:9} {k[1]:32} {b:>10.0f} {a:>10.0f} {r:6.3f}")


if __name__ == "__main__":
    main()
