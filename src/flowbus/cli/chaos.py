"""``flowbus chaos run`` and ``flowbus chaos mixes``: fault campaigns on real brokers
(:mod:`flowbus.chaos`); ``flowbus chaos sim``: random restart schedules of the same cores in
the simulator (:mod:`flowbus.chaos.restarts`).

``run`` prints each run's progress on standard error and, with ``--json``, one JSON document
on standard output (totals over the runs, and ``rows``: one per run); without it, a table.
Its files (each run's logs, CSV and timeline plot, and the campaign's ``campaign.json``,
``rows.csv`` and ``campaign.png``) go under ``--out``. The exit status is 0 when the
campaign ran, whatever it found: the document says what it found.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from flowbus.cli.common import JsonOption, emit, err, fail, out

__all__ = ["chaos_app"]

chaos_app = typer.Typer(
    help="Fault campaigns on real brokers (network namespaces as root).", no_args_is_help=True
)

SHORT = ("short",)
FULL = (
    "crash",
    "pause",
    "isolate",
    "split",
    "partial",
    "clients",
    "links",
    "acks",
    "disk",
    "membership",
    "flows",
    "mixed",
    "starve",
    "overload",
)


@chaos_app.command("mixes")
def mixes(as_json: JsonOption = False) -> None:
    """List the fault mixes."""
    from flowbus.chaos.nemesis import MIXES, NETWORK

    rows: list[dict[str, Any]] = [
        {
            "mix": m.name,
            "faults_per_run": m.faults,
            "kinds": " ".join(m.kinds) + (f" (under {m.under})" if m.under else ""),
            "needs_root": bool(set(m.all_kinds) & NETWORK),
            "about": m.about,
        }
        for m in MIXES.values()
    ]
    if as_json:
        emit({"mixes": rows}, as_json=True, title="")
        return
    from rich.table import Table

    table = Table(title="flowbus chaos mixes")
    for col in ("mix", "faults/run", "kinds", "root", "about"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["mix"], str(r["faults_per_run"]), r["kinds"], "yes" if r["needs_root"] else "", r["about"]
        )
    out.print(table)


@chaos_app.command("run")
def run(
    out_dir: Annotated[
        Path, typer.Option("--out", help="Directory of the runs' logs, CSV and plots.")
    ] = Path("out/chaos"),
    overlay: Annotated[str, typer.Option(help="chordal-ring or pastry-irbr.")] = "chordal-ring",
    brokers: Annotated[int, typer.Option(min=3, max=12, help="Brokers in the ring.")] = 5,
    mix: Annotated[list[str] | None, typer.Option(help="A mix (repeatable; flowbus chaos mixes).")] = None,
    seeds: Annotated[
        str, typer.Option(help="Seeds per mix: N (1..N), A-B or a list like 3,5 (parts: chaos merge).")
    ] = "5",
    short: Annotated[bool, typer.Option(help="The short campaign CI runs (mix short, one seed).")] = False,
    loopback: Annotated[
        bool, typer.Option(help="Faults of processes only, on 127.0.0.1, even as root.")
    ] = False,
    sync: Annotated[
        str, typer.Option(help="The brokers' store syncing: full (each commit on the disk) or normal.")
    ] = "full",
    flow: Annotated[bool, typer.Option(help="Deploy the campaign's flow and put it under fire.")] = True,
    state: Annotated[
        bool, typer.Option(help="Subscribe downstream of the flow's state too (its catch-up is checked).")
    ] = False,
    trace: Annotated[
        bool, typer.Option(help="Trace each broker's messages (RUN/traces/NAME.jsonl), for diagnosis.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Run a fault campaign: every mix with every seed (default: the full campaign)."""
    from flowbus.chaos.campaign import Campaign, run_campaign
    from flowbus.errors import FlowbusError
    from flowbus.experiments.config import parse_seeds

    chosen = tuple(mix) if mix else SHORT if short else FULL
    try:
        campaign = Campaign(
            out=out_dir,
            mixes=chosen,
            seeds=(1,) if short and not mix else parse_seeds(seeds),
            overlay=overlay,
            brokers=brokers,
            isolate=False if loopback else None,
            sync=sync,
            flow=flow,
            state=state,
            trace=trace,
        )
        doc = run_campaign(campaign, say=lambda text: err.print(f"[dim]chaos[/] {text}"))
    except FlowbusError as e:
        fail(str(e))
    if as_json:
        emit(doc, as_json=True, title="")
        return
    summary = {k: v for k, v in doc.items() if k != "rows"}
    emit(summary, as_json=False, title=f"flowbus chaos on {overlay}")


@chaos_app.command("merge")
def merge(
    parts: Annotated[list[Path], typer.Argument(help="The parts' campaign.json (one overlay, one commit).")],
    out_dir: Annotated[
        Path, typer.Option("--out", help="Directory of the merged campaign.json, CSV, table and plot.")
    ] = Path("out/chaos"),
    as_json: JsonOption = False,
) -> None:
    """One campaign from its parts (runs of other seeds or mixes, at one commit)."""
    import json

    from flowbus.chaos.report import merge_campaigns, write_campaign
    from flowbus.errors import FlowbusError

    docs = []
    for path in parts:
        try:
            docs.append(json.loads(path.read_text()))
        except (OSError, ValueError) as e:
            fail(f"{path}: not a campaign's JSON document ({e})")
    try:
        doc = merge_campaigns(docs)
    except FlowbusError as e:
        fail(str(e))
    write_campaign(out_dir / doc["overlay"], doc)
    if as_json:
        emit(doc, as_json=True, title="")
        return
    summary = {k: v for k, v in doc.items() if k != "rows"}
    emit(summary, as_json=False, title=f"flowbus chaos on {doc['overlay']} ({len(parts)} parts)")


@chaos_app.command("follow")
def follow_events(
    run_dir: Annotated[Path, typer.Argument(help="A run's directory, traced (flowbus chaos run --trace).")],
    publisher: Annotated[str, typer.Option(help="The publishing client (pub0, pub1, fpub...).")],
    seq: Annotated[str, typer.Option(help="Its publish sequence numbers: N or A-B.")],
    as_json: JsonOption = False,
) -> None:
    """Where a traced run's events went, hop by hop, and when each was delivered."""
    from rich.table import Table

    from flowbus.chaos.follow import follow
    from flowbus.errors import FlowbusError

    first, _, last = seq.partition("-")
    if not first.isdigit() or (last and not last.isdigit()):
        fail(f"--seq: N or A-B, got {seq!r}")
    try:
        hops = follow(run_dir, publisher, int(first), int(last or first))
    except FlowbusError as e:
        fail(str(e))
    if as_json:
        emit({"hops": hops}, as_json=True, title="")
        return
    table = Table(title=f"{publisher} {seq} in {run_dir.name}")
    for column in ("t", "seq", "broker", "way", "peer", "message"):
        table.add_column(column)
    for h in hops:
        table.add_row(f"{h['t']:.3f}", str(h["seq"]), h["broker"], h["way"], h["peer"], h["message"])
    out.print(table)


@chaos_app.command("sim")
def sim(
    seeds: Annotated[str, typer.Option(help="Schedules: N (1..N), A-B or a list like 3,5,8.")] = "0-259",
    events: Annotated[int, typer.Option(help="Events published in each schedule, 50 a second.")] = 2500,
    flow: Annotated[bool, typer.Option(help="Deploy the campaign's flow and feed it.")] = True,
    timers: Annotated[
        str, typer.Option(help="Clocks: sim (slow links and detection) or broker (the brokers' own).")
    ] = "sim",
    publishers: Annotated[
        str, typer.Option(help="The publishers' brokers' places in ring order (1,2: the lowest may die).")
    ] = "0,1",
    faults: Annotated[
        str,
        typer.Option(
            help="What strikes the victims: crash (kill -9, back as new members), pause (SIGSTOP), "
            "starve (pauses and CPU hiccups) or rejoin (a member killed as it joins)."
        ),
    ] = "crash",
    derived: Annotated[
        bool, typer.Option(help="Subscribe to the flow's derived space too (its order and losses judged).")
    ] = False,
    jobs: Annotated[int, typer.Option(min=1, help="Processes running schedules side by side.")] = 1,
    out_dir: Annotated[
        Path, typer.Option("--out", help="Directory of rows.csv, result.json and the plot.")
    ] = Path("out/chaos-sim"),
    as_json: JsonOption = False,
) -> None:
    """Random fault schedules in the simulator: each seed a replayable schedule of crashes and
    rejoins (or pauses) under a stream; counts what any schedule lost, reordered or left unsettled."""
    from flowbus.chaos.restarts import RestartSchedules, run_schedules
    from flowbus.errors import FlowbusError
    from flowbus.experiments.config import parse_seeds
    from flowbus.experiments.output import document, write_outputs

    try:
        try:
            places = tuple(int(p) for p in publishers.split(","))
        except ValueError:
            fail(f"--publishers: two places in ring order like 1,2, got {publishers!r}")
        config = RestartSchedules(
            seeds=parse_seeds(seeds),
            events=events,
            flow=flow,
            timers=timers,
            publishers=places,
            faults=faults,
            derived=derived,
        )
        result = run_schedules(config, say=lambda text: err.print(f"[dim]chaos sim[/] {text}"), jobs=jobs)
        outputs = write_outputs(result, out_dir)
    except FlowbusError as e:
        fail(str(e))
    doc = document(result, outputs=outputs)
    if as_json:
        emit(doc, as_json=True, title="")
        return
    found = result.findings
    bad = " ".join(map(str, found["bad"]))
    summary = {
        "schedules": found["schedules"],
        "bad": found["bad_count"],
        "bad seeds": bad,
        **found["totals"],
    }
    emit({**summary, **outputs}, as_json=False, title="flowbus chaos sim")
