"""The simulator commands: ``flowbus sim pastry-hops``, ``irbr-faults``, ``irbr-forwards``,
the chordal ring's ``ring-join``, ``ring-repair``, ``ring-classes``, ``ring-faults``, and
CBDLO's ``cbdlo-cost``, ``cbdlo-hops``, ``cbdlo-scale``, ``cbdlo-matching``, ``cbdlo-apt``
(:mod:`flowbus.experiments.cbdlo_experiments`: configs in ``experiments/cbdlo-*.yaml``; CSV, JSON and
PNG under ``--out``, by default ``docs/results/cbdlo``).

``sim_app`` is a typer sub-app (mounted as ``flowbus sim`` by :mod:`flowbus.cli`). As
everywhere in the command line, ``--json`` prints exactly one JSON document on standard
output (progress, if any, goes to standard error), otherwise a two-column table; a bad
input prints a red message on standard error and exits with status 2, without a traceback.

``irbr-faults`` and ``irbr-forwards`` run a sweep of the IRBR fault experiment
(:mod:`flowbus.experiments.sweep`): the sweep is read from ``--config`` (default
``experiments/<command>.yaml`` under the current directory, else the built-in defaults,
the same values) with the command line overrides, and checked before anything runs. The
runs go to Spark as one task each (``--master`` / ``--remote``; ``local[*]`` by default)
or, with ``--serial``, run one after the other in this process. CSV files, a manifest and
a PNG go to ``--out``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from flowbus.cli import common
from flowbus.errors import FlowbusError

if TYPE_CHECKING:
    from flowbus.experiments.sweep import Sweep, SweepResult

__all__ = ["irbr_faults", "irbr_forwards", "pastry_hops", "sim_app"]

sim_app = typer.Typer(help="Discrete-event simulations of the overlay cores.", no_args_is_help=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]


def _cli() -> Any:
    """The command line's shared helpers (consoles, fail, emit, progress bar)."""
    return common


def _fail(message: str) -> NoReturn:
    _cli().fail(message)
    raise typer.Exit(2)  # not reached: fail() exits


@sim_app.command("pastry-hops")
def pastry_hops(
    nodes: Annotated[int, typer.Option(help="Pastry nodes (static, correct tables).")] = 10_000,
    lookups: Annotated[int, typer.Option(help="Lookups of random keys from random nodes.")] = 10_000,
    seed: Annotated[int, typer.Option(help="Master seed of the run.")] = 1,
    as_json: JsonOption = False,
) -> None:
    """Routing hops of Pastry lookups against ceil(log16 N) + 1 and the paper's figure 4."""
    from flowbus.experiments.pastry_hops import run

    cli = _cli()
    try:
        with cli.progress_bar(True) as progress:
            result = run(nodes=nodes, lookups=lookups, seed=seed, progress=progress)
    except FlowbusError as exc:
        _fail(str(exc))
    if as_json:
        cli.emit(result, as_json=True, title="")
        return
    flat = {k: ("-" if v is None else v) for k, v in result.items() if k != "hops"}
    flat.update({f"hops = {h}": n for h, n in result["hops"].items()})
    cli.emit(flat, as_json=False, title=f"Pastry hops: {nodes:,} nodes, {lookups:,} lookups")


# ------------------------------------------------------------------------ IRBR sweeps

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config", help="Sweep config (YAML). Default: experiments/<command>.yaml, else built-in defaults."
    ),
]
NodesOption = Annotated[int | None, typer.Option(help="Pastry nodes per run.")]
SeedsOption = Annotated[str | None, typer.Option(help="N (seeds 1..N), A-B, or a list 1,2,3.")]
EventsOption = Annotated[int | None, typer.Option(help="Events published per run.")]
ProtocolsOption = Annotated[str | None, typer.Option(help="Protocols, e.g. irbr,scribe.")]
SerialOption = Annotated[bool, typer.Option("--serial", help="Run in this process, without Spark.")]
MasterOption = Annotated[str | None, typer.Option(help="Spark master URL (default: local[*]).")]
RemoteOption = Annotated[str | None, typer.Option(help="Spark Connect server, sc://HOST:PORT.")]


def _load(experiment: str, config: Path | None, **overrides: Any) -> tuple[Sweep, str | None]:
    """The sweep, and the config file it came from (None: the built-in defaults)."""
    from flowbus.experiments.sweep import ExperimentError, load_sweep

    if config is None:
        default = Path("experiments") / f"{experiment}.yaml"
        config = default if default.is_file() else None
    elif not config.is_file():
        raise ExperimentError(f"sweep config not found: {config}")
    return load_sweep(experiment, config, **overrides), None if config is None else str(config)


def _run_sweep(
    sweep: Sweep, *, serial: bool, master: str | None, remote: str | None, progress: Any
) -> SweepResult:
    from flowbus.experiments.sweep import ExperimentError, run_serial

    if serial:
        if master is not None or remote is not None:
            raise ExperimentError("--serial runs without Spark: drop --master / --remote")
        return run_serial(sweep, progress=progress)
    from flowbus.spark.session import is_connect, spark_session
    from flowbus.spark.sweep import run_spark

    t = time.perf_counter()
    spark = spark_session(
        master=master, remote=remote, app_name=f"flowbus-{sweep.experiment}",
        conf={"spark.sql.shuffle.partitions": "2"} if remote is None else None,
    )  # fmt: skip
    if not is_connect(spark):
        spark.sparkContext.setLogLevel("ERROR")
    session_s = time.perf_counter() - t
    result = run_spark(spark, sweep, master=remote or master, progress=progress)
    result.extra["session_s"] = session_s
    return result


def _sweep_command(
    experiment: str,
    config: Path | None,
    out: Path | None,
    serial: bool,
    master: str | None,
    remote: str | None,
    **overrides: Any,
) -> tuple[Sweep, str | None, SweepResult, dict[str, str]]:
    from flowbus.experiments.sweep import write_outputs

    cli = _cli()
    try:
        sweep, config_file = _load(experiment, config, **overrides)
        target = out if out is not None else Path("out") / experiment
        with cli.progress_bar(True) as progress:
            result = _run_sweep(sweep, serial=serial, master=master, remote=remote, progress=progress)
        outputs = write_outputs(result, target, config_file=config_file)
    except FlowbusError as exc:
        _fail(str(exc))
    return sweep, config_file, result, outputs


def _rate(row: dict[str, Any], rate: str) -> dict[str, Any]:
    return {
        f"{rate}_mean": row[f"{rate}_mean"],
        f"{rate}_ci95": row[f"{rate}_ci95"],
        f"{rate}_interval": [row[f"{rate}_lo"], row[f"{rate}_hi"]],
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.3f}"


@sim_app.command("irbr-faults")
def irbr_faults(
    config: ConfigOption = None,
    nodes: NodesOption = None,
    seeds: SeedsOption = None,
    failures: Annotated[
        str | None, typer.Option(help="Failure rates (fractions), e.g. 0.005,0.01,0.02,0.05,0.1.")
    ] = None,
    events: EventsOption = None,
    protocols: ProtocolsOption = None,
    out: Annotated[Path | None, typer.Option(help="Output directory (default: out/irbr-faults).")] = None,
    serial: SerialOption = False,
    master: MasterOption = None,
    remote: RemoteOption = None,
    as_json: JsonOption = False,
) -> None:
    """Event loss of IRBR and Scribe when nodes fail at once (the IRBR paper's figure 4a)."""
    sweep, config_file, result, outputs = _sweep_command(
        "irbr-faults", config, out, serial, master, remote,
        nodes=nodes, seeds=seeds, failures=failures, events=events, protocols=protocols,
    )  # fmt: skip
    rows = [
        {
            "protocol": r["protocol"], "failure": r["failure"], "runs": r["runs"],
            **_rate(r, "loss_rate"), **_rate(r, "reachable_loss_rate"),
            "forwards_per_event_mean": r["forwards_per_event_mean"],
            "duplicates_max": r["duplicates_max"], "wrong_max": r["wrong_max"],
        }
        for r in result.summary
    ]  # fmt: skip
    doc = {
        "experiment": "irbr-faults",
        "config": {"file": config_file, **sweep.to_dict()},
        "runner": result.runner,
        "rows": rows,
        "runs": len(result.runs),
        "outputs": outputs,
        "run_s": result.run_s,
    }
    if as_json:
        _cli().emit(doc, as_json=True, title="")
        return
    _table(
        f"IRBR faults: {sweep.nodes:,} nodes, {len(sweep.seeds)} seeds x {sweep.events} events "
        f"({len(result.runs)} runs, {result.run_s:.1f} s, {result.runner['name']})",
        ["protocol", "failed %", "runs", "loss %", "± 95 %", "reachable loss %", "± 95 %", "fwd/event"],
        [
            [r["protocol"], f"{100 * r['failure']:g}", str(r["runs"]),
             _pct(r["loss_rate_mean"]), _pct(r["loss_rate_ci95"]),
             _pct(r["reachable_loss_rate_mean"]), _pct(r["reachable_loss_rate_ci95"]),
             f"{r['forwards_per_event_mean']:.2f}"]
            for r in result.summary
        ],
        outputs,
    )  # fmt: skip


@sim_app.command("irbr-forwards")
def irbr_forwards(
    config: ConfigOption = None,
    nodes: NodesOption = None,
    seeds: SeedsOption = None,
    events: EventsOption = None,
    protocols: ProtocolsOption = None,
    out: Annotated[Path | None, typer.Option(help="Output directory (default: out/irbr-forwards).")] = None,
    serial: SerialOption = False,
    master: MasterOption = None,
    remote: RemoteOption = None,
    as_json: JsonOption = False,
) -> None:
    """Forwards per event against interested nodes, IRBR vs Scribe, no failures (the paper's figure 4b)."""
    from flowbus.experiments.sweep import forwards_by_interest, irbr_below_scribe

    sweep, config_file, result, outputs = _sweep_command(
        "irbr-forwards", config, out, serial, master, remote,
        nodes=nodes, seeds=seeds, events=events, protocols=protocols,
    )  # fmt: skip
    binned = forwards_by_interest(result.events)
    below = irbr_below_scribe(binned)
    doc = {
        "experiment": "irbr-forwards",
        "config": {"file": config_file, **sweep.to_dict()},
        "runner": result.runner,
        "rows": binned,
        "forwards_per_event": {r["protocol"]: r["forwards_per_event_mean"] for r in result.summary},
        "irbr_below_scribe": below,
        "runs": len(result.runs),
        "outputs": outputs,
        "run_s": result.run_s,
    }
    if as_json:
        _cli().emit(doc, as_json=True, title="")
        return
    _table(
        f"IRBR forwards: {sweep.nodes:,} nodes, {len(sweep.seeds)} seeds x {sweep.events} events "
        f"({len(result.runs)} runs, {result.run_s:.1f} s, {result.runner['name']}); "
        f"IRBR below Scribe in every bin: {below}",
        ["protocol", "interested", "events", "mean interested", "mean forwards"],
        [
            [r["protocol"], r["bin"], str(r["events"]), f"{r['interested_mean']:.2f}",
             f"{r['forwards_mean']:.2f}"]
            for r in binned
        ],
        outputs,
    )  # fmt: skip


def _table(title: str, header: list[str], rows: list[list[str]], outputs: dict[str, str]) -> None:
    from rich.table import Table

    cli = _cli()
    table = Table(title=title)
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    cli.out.print(table)
    for name, path in outputs.items():
        cli.out.print(f"{name}: {path}")


# ------------------------------------------------------------------------ chordal ring


def _sizes(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        _fail(f"sizes must be integers separated by commas, got {text!r}")
        raise


def _ring_command(result_fn: Any, out: Path, as_json: bool, title: str | Any, *, write: Any = None) -> None:
    """Run a ring experiment with progress, write its outputs (``write``: the experiment's
    writer, default ring-join/ring-repair's), print JSON or a table titled ``title`` (a
    string, or a function of the result)."""
    if write is None:
        from flowbus.experiments.ring_experiments import write_outputs as write

    cli = _cli()
    try:
        with cli.progress_bar(True) as progress:
            result = result_fn(progress)
        result["outputs"] = write(result, out)
    except FlowbusError as exc:
        _fail(str(exc))
    if as_json:
        cli.emit(result, as_json=True, title="")
        return
    rows = result["rows"]
    cells = [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in r.values()] for r in rows]
    _table(title if isinstance(title, str) else title(result), list(rows[0]), cells, result["outputs"])


@sim_app.command("ring-join")
def ring_join(
    sizes: Annotated[
        str, typer.Option(help="Ring sizes to report, e.g. 16,64,256,1024,4096.")
    ] = "16,64,256,1024,4096",
    seed: Annotated[int, typer.Option(help="Master seed.")] = 1,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/ring-join"),
    as_json: JsonOption = False,
) -> None:
    """Messages and brokers touched by one join of the chordal ring, against its size (O(1) claimed)."""
    from flowbus.experiments.ring_experiments import join_cost

    ns = _sizes(sizes)
    _ring_command(
        lambda p: join_cost(sizes=ns, seed=seed, progress=p), out, as_json, "chordal ring: join cost"
    )


@sim_app.command("ring-repair")
def ring_repair(
    sizes: Annotated[str, typer.Option(help="Ring sizes, e.g. 64,256,1024,4096,10000.")] = "64,256,1024,4096",
    trials: Annotated[int, typer.Option(help="Failures of each kind per size.")] = 5,
    seed: Annotated[int, typer.Option(help="Master seed.")] = 1,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/ring-repair"),
    as_json: JsonOption = False,
) -> None:
    """Messages and time to repair a broker, ring-link and chord-link failure against n (O(log n)?)."""
    from flowbus.experiments.ring_experiments import repair_cost

    ns = _sizes(sizes)
    _ring_command(
        lambda p: repair_cost(sizes=ns, trials=trials, seed=seed, progress=p),
        out,
        as_json,
        "chordal ring: repair cost",
    )


@sim_app.command("ring-classes")
def ring_classes(
    nodes: Annotated[int, typer.Option(help="Brokers on the ring.")] = 256,
    events: Annotated[int, typer.Option(help="Events per class and phase.")] = 1000,
    link_failures: Annotated[float, typer.Option(help="Fraction of links failed in the second phase.")] = 0.1,
    seed: Annotated[int, typer.Option(help="Master seed.")] = 1,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/ring-classes"),
    as_json: JsonOption = False,
) -> None:
    """Normal, express and secure events over the broker multigraph: violations, latency, hops."""
    from flowbus.experiments.ring_classes import run, write_outputs

    _ring_command(
        lambda p: run(nodes=nodes, events=events, link_failures=link_failures, seed=seed, progress=p),
        out, as_json, lambda r: f"events by class: {nodes} brokers, {r['violations']} violations",
        write=write_outputs,
    )  # fmt: skip


@sim_app.command("ring-faults")
def ring_faults(
    nodes: Annotated[int, typer.Option(help="Brokers on the ring.")] = 24,
    backups: Annotated[str, typer.Option(help="Backup factors, e.g. 1,2,3,4.")] = "1,2,3,4",
    scenarios: Annotated[str, typer.Option(help="single, adjacent, skip-one.")] = "single,adjacent,skip-one",
    events: Annotated[int, typer.Option(help="Events published, one per time unit.")] = 300,
    seed: Annotated[int, typer.Option(help="Master seed.")] = 1,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/ring-faults"),
    as_json: JsonOption = False,
) -> None:
    """Events lost, duplicated and delayed while brokers crash, for backup factors 1..4."""
    from flowbus.experiments.ring_faults import run, write_outputs

    names = [s.strip() for s in scenarios.split(",") if s.strip()]
    factors = _sizes(backups)
    _ring_command(
        lambda p: run(nodes=nodes, backups=factors, scenarios=names, events=events, seed=seed, progress=p),
        out, as_json, f"ring faults: {nodes} brokers, {events} events", write=write_outputs,
    )  # fmt: skip


# ------------------------------------------------------------------------ CBDLO (the 004 document)

CbdloConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config", help="Experiment config (YAML). Default: experiments/<command>.yaml, else built-in."
    ),
]
CbdloSeedsOption = Annotated[str | None, typer.Option(help="N (seeds 1..N) or a list 1,2,3.")]
CbdloOutOption = Annotated[Path, typer.Option(help="Output directory (CSV, JSON, PNG).")]
CBDLO_OUT = Path("docs/results/cbdlo")


def _cbdlo_command(experiment: str, config: Path | None, seeds: str | None, out: Path, as_json: bool) -> None:
    """Load, run and write one CBDLO experiment; print its JSON document or a table of means."""
    from flowbus.experiments.cbdlo_experiments import ExperimentError, load, run, write_outputs

    cli = _cli()
    try:
        if config is None:
            default = Path("experiments") / f"{experiment}.yaml"
            config = default if default.is_file() else None
        elif not config.is_file():
            raise ExperimentError(f"config not found: {config}")
        cfg = load(experiment, config, seeds=seeds)
        cfg["config_file"] = None if config is None else str(config)
        with cli.progress_bar(not as_json) as progress:
            result = run(cfg, progress=progress)
        write_outputs(result, out)
    except FlowbusError as exc:
        _fail(str(exc))
    if as_json:
        doc = {k: v for k, v in result.items() if k != "rows"}
        doc["runs"] = len(result["rows"])
        cli.emit(doc, as_json=True, title="")
        return
    keys = ["messages_per_event", "completeness", "effective_cost", "hit_rate_10",
            "matching_cost_per_event", "comparisons_per_event"]  # fmt: skip
    rows = result["summary"]
    shown = [k for k in keys if any(r.get(k) is not None for r in rows)]
    if experiment == "cbdlo-apt":
        shown.insert(0, "attributes")
    _table(
        f"{experiment}: {len(result['rows'])} runs, {result['timing']['wall_s']:.1f} s",
        ["sweep", "x", "protocol", *shown],
        [[r["sweep"], str(r["x"]), r["protocol"], *(_num(r.get(k)) for k in shown)] for r in rows],
        result["outputs"],
    )  # fmt: skip


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"


_CBDLO_COMMANDS = {
    "cbdlo-cost": "Effective distribution cost against total subscriptions: Simple, CBDLO, TERA (figure 5).",
    "cbdlo-hops": "Effective distribution cost against maximum hops (the 004 document's figure 6).",
    "cbdlo-scale": "Messages per event of TERA and CBDLO against network size, then extrapolated (figure 7).",
    "cbdlo-matching": "Matching cost against subscriptions and attributes: Simple vs CBDLO (figures 8, 9).",
    "cbdlo-apt": "Share of attribute searches entering their topology within 10 hops, against the APT size.",
}


def _cbdlo_cli(experiment: str, doc: str) -> Any:
    def command(
        config: CbdloConfigOption = None,
        seeds: CbdloSeedsOption = None,
        out: CbdloOutOption = CBDLO_OUT,
        as_json: JsonOption = False,
    ) -> None:
        _cbdlo_command(experiment, config, seeds, out, as_json)

    command.__doc__ = doc
    command.__name__ = experiment.replace("-", "_")
    return command


for _name, _doc in _CBDLO_COMMANDS.items():
    sim_app.command(_name)(_cbdlo_cli(_name, _doc))
