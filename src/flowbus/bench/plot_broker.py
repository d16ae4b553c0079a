"""Plot ``flowbus bench broker --json``: events/s taken
in and p99 publish-to-delivery latency against the number of subscriptions, one line per
broker count (and protocol: ``--protocol stomp`` rows are "flowbus over STOMP"), with
ActiveMQ's (measured in the same run with ``--baseline activemq``, else the reference points)
and the goal.

flowbus bench plot broker broker.json broker.png (and ``flowbus bench broker --out DIR``)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STYLES = ("o-", "s-", "^-", "D-")


def _protocol(row: dict[str, Any]) -> str:
    return str(row.get("protocol", "native"))  # (rows of before --protocol are native)


def _points(rows: list[dict[str, Any]], line: tuple[str, int], key: str) -> list[tuple[int, float]]:
    return sorted(
        (r["subscriptions"], r[key])
        for r in rows
        if (_protocol(r), r["brokers"]) == line and r.get(key) is not None and "error" not in r
    )


def plot(result: dict[str, Any], out: Path) -> None:
    rows = result["rows"]
    fig, (rate, lat) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, line in enumerate(sorted({(_protocol(r), r["brokers"]) for r in rows})):
        protocol, b = line
        over = " over STOMP" if protocol == "stomp" else ""
        label = f"flowbus{over}, {b} broker" + ("s" if b > 1 else "")
        pts = _points(rows, line, "events_per_s_in")
        if pts:
            rate.plot(*zip(*pts, strict=True), STYLES[i % len(STYLES)], lw=2, label=label)
        pts = _points(rows, line, "latency_p99_ms")
        if pts:
            lat.plot(*zip(*pts, strict=True), STYLES[i % len(STYLES)], lw=2, label=label)
        failed = [
            r["subscriptions"]
            for r in rows
            if (_protocol(r), r["brokers"]) == line and ("error" in r or "skipped" in r)
        ]
        for k in failed:
            rate.axvline(k, color=f"C{i}", lw=0.8, ls=(0, (2, 3)), alpha=0.6)
        if failed:
            rate.plot([], [], color=f"C{i}", lw=0.8, ls=(0, (2, 3)), label=f"{label}: failed or skipped")
    amq = "activemq_events_per_s_in"
    measured = {r["subscriptions"]: r[amq] for r in rows if r.get(amq) is not None}
    if measured:  # (--baseline activemq: ActiveMQ in the same run)
        rate.plot(list(measured), list(measured.values()), "kx", ms=9, mew=2, label="ActiveMQ 5.17, same run")
    else:
        ref = result.get("reference", {}).get("events_per_s_in", {})
        xs = [int(k) for k, vs in ref.items() for _ in vs]
        ys = [v for vs in ref.values() for v in vs]
        if xs:
            rate.plot(xs, ys, "kx", ms=9, mew=2, label="ActiveMQ 5.17 (reference)")
    goal = result.get("goal")
    if goal:
        rate.plot([goal["subscriptions"]], [goal["events_per_s_in"]], "r*", ms=13, label="goal (at least)")
        lat.axhline(
            goal["latency_p99_ms"],
            color="r",
            lw=0.8,
            ls=":",
            label=f"goal: p99 < {goal['latency_p99_ms']:g} ms",
        )
    windows = sorted({r["publish_window"] for r in rows if r.get("publish_window")})
    rate.set(xscale="log", yscale="log", xlabel="subscriptions", ylabel="events / s in", title="Throughput")
    lat.set(
        xscale="log",
        yscale="log",
        xlabel="subscriptions",
        ylabel="ms",
        title="p99 publish-to-delivery latency"
        + (f" (publisher window {windows[0]:,})" if len(windows) == 1 else ""),
    )
    for ax in (rate, lat):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    machine = result.get("machine", {})
    fig.suptitle(
        f"flowbus brokers on loopback, {rows[0]['events'] if rows else 0:,} events; "
        f"{machine.get('cpu_count', '?')} cores, clients: {result.get('clients', '?')}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
