"""The information flow commands: ``flowbus flow explain|expand``, ``flowbus run`` and ``flowbus bench flow``.

``flow_app`` is a typer sub-app (mounted as ``flowbus flow``); :func:`run` and
:func:`bench_flow` are command functions mounted as ``flowbus run`` and
``flowbus bench flow``. As everywhere in the command line, ``--json`` prints
exactly one JSON document on standard output, and a bad input (a spec that does
not load, an unknown state, a row that is not JSON) prints a red message on
standard error and exits with status 2, without a traceback.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from flowbus.errors import FlowbusError

if TYPE_CHECKING:
    from flowbus.flow.collapse import BoundRules
    from flowbus.flow.graph import Graph

__all__ = ["bench_flow", "flow_app", "run"]

flow_app = typer.Typer(
    help="Information flow graphs: the rewrite to \\[select; transform], and expand by A*.",
    no_args_is_help=True,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]
SpecArgument = Annotated[Path, typer.Argument(help="A flow spec (YAML), e.g. examples/stocks/flow.yaml.")]


def _cli() -> Any:
    """The main command line module, for its helpers (imported late: it imports this module)."""
    from flowbus import cli

    return cli


def _fail(message: str) -> NoReturn:
    _cli().fail(message)
    raise typer.Exit(2)  # not reached: fail() exits


def _load(spec: Path) -> Graph:
    from flowbus.flow.spec import load_spec

    return load_spec(spec)


@flow_app.command("explain")
def explain(spec: SpecArgument, as_json: JsonOption = False) -> None:
    """Print the graph before and after rewriting, path by path (000 document, section 4.1)."""
    from flowbus.flow.explain import explain_json, explain_text

    try:
        g = _load(spec)
        if as_json:
            sys.stdout.write(json.dumps(explain_json(g), indent=2) + "\n")
        else:
            sys.stdout.write(explain_text(g))
    except FlowbusError as exc:
        _fail(str(exc))


def _rules_for(g: Graph, state: str, arc: str | None) -> tuple[str, BoundRules]:
    """The arc whose rule set ``flow expand`` uses: ``arc``, the state's one expand arc, or its collapse."""
    from flowbus.errors import FlowError
    from flowbus.flow.graph import Collapse, Expand
    from flowbus.flow.validate import bind_rules

    g.state_space(state)
    if arc is not None:
        chosen = g.arc(arc)
        if not (isinstance(chosen, Expand) and chosen.source == state) and not (
            isinstance(chosen, Collapse) and chosen.target == state
        ):
            raise FlowError(f"arc {arc!r} is neither a collapse into nor an expand out of state {state!r}")
        return chosen.name, bind_rules(g, chosen)
    expands = [a for a in g.out_arcs(state) if isinstance(a, Expand)]
    if len(expands) > 1:
        names = ", ".join(a.name for a in expands)
        raise FlowError(f"state {state!r} has several expand arcs ({names}): choose one with --arc")
    chosen_arc = expands[0] if expands else g.in_arcs(state)[0]
    return chosen_arc.name, bind_rules(g, chosen_arc)


def _rows(text: str, option: str, bound: BoundRules, g: Graph, state: str) -> dict[Any, Any]:
    from flowbus.flow.expand import rows_from_json

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FlowbusError(f"{option} is not JSON: {exc.msg} at column {exc.colno}") from None
    fields = dict(g.state_space(state).schema.fields)
    return rows_from_json(bound, fields, data, option)


@flow_app.command("expand")
def expand(
    spec: SpecArgument,
    state: Annotated[str, typer.Option("--state", help="The state space, e.g. max_cur.")],
    start: Annotated[
        str, typer.Option("--from", help='Start row(s) as JSON: {"name": "IBM", "maxP": 160, ...}')
    ],
    goal: Annotated[str, typer.Option("--to", help="Goal row(s) as JSON, same form.")],
    arc: Annotated[str | None, typer.Option(help="Use this collapse or expand arc's rule set.")] = None,
    max_cost: Annotated[int | None, typer.Option(min=0, help="Refuse sequences longer than this.")] = None,
    max_states: Annotated[
        int, typer.Option(min=1, help="Give up after expanding this many states.")
    ] = 200_000,
    as_json: JsonOption = False,
) -> None:
    """Print the shortest event sequence taking a state from one row to another (section 4.2, A*)."""
    from flowbus.flow.expand import expand as run_expand

    try:
        g = _load(spec)
        arc_name, bound = _rules_for(g, state, arc)
        s0 = _rows(start, "--from", bound, g, state)
        s1 = _rows(goal, "--to", bound, g, state)
        result = run_expand(bound, s0, s1, max_cost=max_cost, max_states=max_states)
    except FlowbusError as exc:
        _fail(str(exc))
    doc = {
        "state": state,
        "arc": arc_name,
        "events": [dict(ev) for ev in result.events],
        "length": len(result.events),
        "states_expanded": result.states_expanded,
        "states_generated": result.states_generated,
        "form": result.form.kind,
        "keys": [
            {"key": list(k.key), "length": len(k.events), "states_expanded": k.states_expanded}
            for k in result.keys
        ],
        "seconds": result.seconds,
    }
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    for ev in result.events:
        sys.stdout.write(json.dumps(ev) + "\n")
    sys.stdout.write(
        f"{len(result.events)} events; A* expanded {result.states_expanded} states "
        f"({result.form.kind} rule set, arc {arc_name})\n"
    )


def run(
    spec: SpecArgument,
    engine: Annotated[
        str, typer.Option(help="spark (default) or local (the reference interpreter).")
    ] = "spark",
    events: Annotated[
        int | None, typer.Option(min=0, help="Events to generate (default: the spec's).")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Output directory (spark default: out/FLOW; local: none unless given)."),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the generator (default: the spec's).")] = None,
    graph: Annotated[str, typer.Option(help="local engine: rewritten (default) or original.")] = "rewritten",
    master: Annotated[
        str | None, typer.Option(help="spark: a cluster's master URL (default: local[*]).")
    ] = None,
    remote: Annotated[
        str | None, typer.Option(help="spark: a Spark Connect server (sc://HOST:PORT).")
    ] = None,
    sink: Annotated[
        str, typer.Option("--format", help="spark: parquet, jsonl or console, per subscription point.")
    ] = "parquet",
    batch_events: Annotated[
        int, typer.Option(min=1, help="spark: events per input file, one file per micro-batch.")
    ] = 2000,
    source: Annotated[
        list[str] | None,
        typer.Option(help="spark: POINT=DIR, JSON lines or Parquet files of a publication point."),
    ] = None,
    follow: Annotated[
        bool, typer.Option(help="spark: keep ingesting new files of the sources until Ctrl-C.")
    ] = False,
    timeout: Annotated[float | None, typer.Option(min=0, help="spark: stop after this many seconds.")] = None,
    fresh: Annotated[
        bool, typer.Option(help="spark: start over rather than resume a run found in --out.")
    ] = False,
    collapse: Annotated[
        str,
        typer.Option(
            help="spark: state (transformWithState, expand per event) or aggregate (Spark's own "
            "aggregation for max/min/last/count/sum rule sets, expand per micro-batch)."
        ),
    ] = "state",
    as_json: JsonOption = False,
) -> None:
    """Run a flow spec: on Spark (Structured Streaming) by default, or the local reference interpreter."""
    if engine not in ("spark", "local"):
        _fail(f"unknown engine {engine!r} (expected spark or local)")
    if graph not in ("rewritten", "original"):
        _fail(f"unknown graph {graph!r} (expected rewritten or original)")
    if engine == "spark":
        _run_spark_cli(
            spec, master=master, remote=remote, events=events, seed=seed, out=out, sink=sink,
            batch_events=batch_events, sources=source or [], follow=follow, timeout=timeout,
            fresh=fresh, collapse=collapse, as_json=as_json,
        )  # fmt: skip
        return
    try:
        doc = _run_local(spec, events=events, seed=seed, out=out, rewritten=graph == "rewritten")
    except FlowbusError as exc:
        _fail(str(exc))
    if as_json:
        _cli().emit(doc, as_json=True, title="")
        return
    flat = {k: v for k, v in doc.items() if k not in ("outputs", "states")}
    if out is None:
        flat["out"] = "not written (pass --out DIR)"
    flat.update({f"output {name}": o["events"] for name, o in doc["outputs"].items()})
    flat.update({f"state {name}": f"{n} rows" for name, n in doc["states"].items()})
    _cli().emit(flat, as_json=False, title=f"flowbus run {spec} (local engine)")


def _run_spark_cli(spec: Path, *, as_json: bool, **options: Any) -> None:
    from flowbus.cli.run import run_spark

    cli = _cli()
    try:
        doc = run_spark(spec, live=not as_json and cli.err.is_terminal, err_console=cli.err, **options)
    except FlowbusError as exc:
        _fail(str(exc))
    if as_json:
        cli.emit(doc, as_json=True, title="")
        return
    flat = {k: v for k, v in doc.items() if k not in ("outputs", "collapse")}
    flat.update(
        {f"state {n}": f"{', '.join(c['collapses'])}: {c['path']}" for n, c in doc["collapse"].items()}
    )
    flat.update(
        {f"output {name}": f"{o['events']:,} events  {o['path'] or ''}" for name, o in doc["outputs"].items()}
    )
    cli.emit(flat, as_json=False, title=f"flowbus run {spec} (Spark)")
    if doc["format"] != "console":
        reader = "parquet" if doc["format"] == "parquet" else "json"
        where = f"outputs: {doc['out']}/<point>/<log>-<batch>/ ({doc['format']}); "
        cli.out.print(
            where + f"read one with spark.read.{reader}('{doc['out']}/<point>/*')",
            markup=False,
            highlight=False,
        )


def _run_local(
    spec: Path, *, events: int | None, seed: int | None, out: Path | None, rewritten: bool
) -> dict[str, Any]:
    from flowbus.flow.generators import generate
    from flowbus.flow.local import LocalRun, write_outputs
    from flowbus.flow.rewrite import rewrite

    g = _load(spec)
    total = events if events is not None else (g.input.events if g.input else 0)
    local = LocalRun(rewrite(g) if rewritten else g)
    t0 = time.perf_counter()
    with _cli().progress_bar(True) as progress:
        for i, (space, event) in enumerate(generate(g, events=events, seed=seed), 1):
            local.publish(space, event)
            if progress is not None and i % 5000 == 0:
                progress("events", i, total)
    seconds = time.perf_counter() - t0
    files = write_outputs(local, out) if out is not None else {}
    return {
        "engine": "local",
        "spec": str(spec),
        "graph": "rewritten" if rewritten else "original",
        "events": local.published,
        "seconds": seconds,
        "events_per_s": local.published / seconds if seconds > 0 else None,
        "out": str(out) if out is not None else None,
        "outputs": {
            name: {"events": len(evs), "file": str(files[name]) if name in files else None}
            for name, evs in local.outputs.items()
        },
        "states": {name: len(rows) for name, rows in local.states.items()},
    }


def bench_flow(
    trades: Annotated[int, typer.Option(min=1, help="Trades through each graph.")] = 200_000,
    seed: Annotated[int, typer.Option(help="Seed of the trade generator.")] = 1,
    rounds: Annotated[int, typer.Option(min=1, help="Timed runs of each graph (the best counts).")] = 3,
    as_json: JsonOption = False,
) -> None:
    """The stock example, original against rewritten graph (local interpreter), and A* reconnects."""
    cli = _cli()
    try:
        cli._benchmarks()
        from benchmarks.flow import run as bench  # type: ignore[import-not-found]

        with cli.progress_bar(True) as progress:
            result = bench(trades=trades, seed=seed, rounds=rounds, progress=progress)
    except FlowbusError as exc:
        _fail(str(exc))
    cli.emit(result, as_json=as_json, title=f"flow: stock example, {trades:,} trades")
