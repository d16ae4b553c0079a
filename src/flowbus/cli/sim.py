"""The simulator commands: one per experiment of :mod:`flowbus.experiments`.

``flowbus sim pastry-hops``; the IRBR sweeps ``irbr-faults``, ``irbr-forwards``; the
chordal ring's ``ring-join``, ``ring-repair``, ``ring-classes``, ``ring-faults``,
``ring-adapt``; CBDLO's ``cbdlo-cost``, ``cbdlo-hops``, ``cbdlo-scale``, ``cbdlo-matching``,
``cbdlo-apt``, and ``cbdlo-churn``.
``sim_app`` is a typer sub-app (mounted as ``flowbus sim`` by :mod:`flowbus.cli`).

How it works: every command is thin. Its options become the experiment's config (checked
when built; the IRBR and CBDLO commands read ``--config``, by default
``experiments/<command>.yaml`` under the current directory, else the built-in defaults,
the same values, with the command line overrides); :func:`_execute` then runs it with a
progress bar on standard error, writes the CSV, JSON and PNG files under ``--out``
(:func:`flowbus.experiments.output.write_outputs`) and shows the result: with ``--json``
exactly one JSON document on standard output, otherwise a table. A bad input prints a red
message on standard error and exits with status 2, without a traceback, before anything
runs or is written. The IRBR sweeps run as Spark tasks, one per group of runs
(``--master`` / ``--remote``; ``local[*]`` by default), or with ``--serial`` one after the
other in this process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flowbus.cli import common
from flowbus.errors import FlowbusError

if TYPE_CHECKING:
    from flowbus.experiments.config import ExperimentConfig
    from flowbus.experiments.irbr import IrbrSweep
    from flowbus.experiments.output import ProgressFn, Result

__all__ = ["irbr_faults", "irbr_forwards", "pastry_hops", "sim_app"]

sim_app = typer.Typer(help="Discrete-event simulations of the overlay cores.", no_args_is_help=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]
SeedOption = Annotated[int, typer.Option(help="Master seed.")]
ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config", help="Sweep config (YAML). Default: experiments/<command>.yaml, else built-in defaults."
    ),
]

Build = Callable[[], "tuple[ExperimentConfig, str | None]"]
"""Makes a command's config from its options (and the config file it read, if any)."""
Run = Callable[[Any, "ProgressFn | None"], "Result"]
Show = Callable[["Result", dict[str, Any], bool], None]
"""Prints a result: its JSON document (given, ``outputs`` included) or a table."""


def _execute(build: Build, run: Run, *, out: Path | None, as_json: bool, show: Show) -> None:
    """Config, run, write (unless ``out`` is None), show; a FlowbusError exits with status 2."""
    from flowbus.experiments.output import document, write_outputs

    try:
        config, config_file = build()
        with common.progress_bar(True) as progress:
            result = run(config, progress)
        outputs = None if out is None else write_outputs(result, out, config_file=config_file)
    except FlowbusError as exc:
        common.fail(str(exc))
    show(result, document(result, config_file=config_file, outputs=outputs), as_json)


def _table(title: str, header: list[str], rows: list[list[str]], outputs: dict[str, str]) -> None:
    from rich.table import Table

    table = Table(title=title)
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    common.out.print(table)
    for name, path in outputs.items():
        common.out.print(f"{name}: {path}")


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.3f}"


def _ints(key: str, text: str) -> tuple[int, ...]:
    from flowbus.experiments.config import parse_list

    return parse_list(key, text, int, "integers separated by commas")


def _names(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


# ------------------------------------------------------------------------------ Pastry


@sim_app.command("pastry-hops")
def pastry_hops(
    nodes: Annotated[int, typer.Option(help="Pastry nodes (static, correct tables).")] = 10_000,
    lookups: Annotated[int, typer.Option(help="Lookups of random keys from random nodes.")] = 10_000,
    seed: Annotated[int, typer.Option(help="Master seed of the run.")] = 1,
    out: Annotated[Path | None, typer.Option(help="Output directory (default: write no files).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Routing hops of Pastry lookups against ceil(log16 N) + 1 and the paper's figure 4."""
    from flowbus.experiments import pastry_hops as ph

    def show(result: Result, doc: dict[str, Any], as_json: bool) -> None:
        flat = ph.record(result) | ({"outputs": doc["outputs"]} if "outputs" in doc else {})
        if as_json:
            common.emit(flat, as_json=True, title="")
            return
        table = {k: ("-" if v is None else v) for k, v in flat.items() if k not in ("hops", "outputs")}
        table.update({f"hops = {h}": n for h, n in flat["hops"].items()})
        common.emit(table, as_json=False, title=f"Pastry hops: {nodes:,} nodes, {lookups:,} lookups")

    _execute(
        lambda: (ph.PastryHops(nodes=nodes, lookups=lookups, seed=seed), None),
        lambda c, p: ph.run(c, progress=p), out=out, as_json=as_json, show=show,
    )  # fmt: skip


# ------------------------------------------------------------------------ IRBR sweeps

NodesOption = Annotated[int | None, typer.Option(help="Pastry nodes per run.")]
SeedsOption = Annotated[str | None, typer.Option(help="N (seeds 1..N), A-B, or a list 1,2,3.")]
EventsOption = Annotated[int | None, typer.Option(help="Events published per run.")]
ProtocolsOption = Annotated[str | None, typer.Option(help="Protocols, e.g. irbr,scribe,scribe-repair.")]
AcksOption = Annotated[
    bool | None, typer.Option("--acks/--no-acks", help="IRBR's hop-by-hop acknowledgements (default: on).")
]
NoticeOption = Annotated[
    float | None,
    typer.Option(help="The simulator's failure notice after this delay (an oracle; default: off)."),
]
SerialOption = Annotated[bool, typer.Option("--serial", help="Run in this process, without Spark.")]
MasterOption = Annotated[str | None, typer.Option(help="Spark master URL (default: local[*]).")]
RemoteOption = Annotated[str | None, typer.Option(help="Spark Connect server, sc://HOST:PORT.")]


def _irbr(
    experiment: str,
    config: Path | None,
    out: Path | None,
    as_json: bool,
    show: Show,
    runner: tuple[bool, str | None, str | None],
    **overrides: Any,
) -> None:
    from flowbus.experiments import irbr
    from flowbus.experiments.config import config_path

    def build() -> tuple[IrbrSweep, str | None]:
        path = config_path(experiment, config)
        return irbr.load(experiment, path, **overrides), None if path is None else str(path)

    serial, master, remote = runner
    target = out if out is not None else Path("out") / experiment
    _execute(
        build, lambda s, p: _run_irbr(s, serial, master, remote, p), out=target, as_json=as_json, show=show
    )


def _run_irbr(
    sweep: IrbrSweep, serial: bool, master: str | None, remote: str | None, progress: Any
) -> Result:
    from flowbus.errors import ExperimentError
    from flowbus.experiments import irbr

    if serial:
        if master is not None or remote is not None:
            raise ExperimentError("--serial runs without Spark: drop --master / --remote")
        return irbr.run(sweep, progress=progress)
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
    return replace(result, timing={**result.timing, "session_s": session_s})


def _irbr_title(what: str, result: Result) -> str:
    from flowbus.experiments.irbr import IrbrSweep

    sweep, wall = result.config, result.timing["wall_s"]
    assert isinstance(sweep, IrbrSweep)
    return (
        f"{what}: {sweep.nodes:,} nodes, {len(sweep.seeds)} seeds x {sweep.events} events "
        f"({len(result.rows)} runs, {wall:.1f} s, {result.runner['name']})"
    )


def _with_interval(row: dict[str, Any], rate: str) -> dict[str, Any]:
    return {
        f"{rate}_mean": row[f"{rate}_mean"],
        f"{rate}_ci95": row[f"{rate}_ci95"],
        f"{rate}_interval": [row[f"{rate}_lo"], row[f"{rate}_hi"]],
    }


def _show_faults(result: Result, doc: dict[str, Any], as_json: bool) -> None:
    rows = [
        {
            "protocol": r["protocol"], "failure": r["failure"], "runs": r["runs"],
            **_with_interval(r, "loss_rate"), **_with_interval(r, "reachable_loss_rate"),
            "forwards_per_event_mean": r["forwards_per_event_mean"],
            "acks_per_event_mean": r["acks_per_event_mean"],
            "delay_mean": r["delay_mean"], "delay_max": r["delay_max"],
            "duplicates_max": r["duplicates_max"], "wrong_max": r["wrong_max"],
        }
        for r in result.summary
    ]  # fmt: skip
    if as_json:
        common.emit({**doc, "rows": rows}, as_json=True, title="")
        return
    _table(
        _irbr_title("IRBR faults", result),
        ["protocol", "failed %", "runs", "loss % ± 95 %", "reachable", "fwd/ev", "acks/ev", "delay", "max"],
        [
            [r["protocol"], f"{100 * r['failure']:g}", str(r["runs"]),
             f"{_pct(r['loss_rate_mean'])} ± {_pct(r['loss_rate_ci95'])}",
             _pct(r["reachable_loss_rate_mean"]),
             f"{r['forwards_per_event_mean']:.1f}", f"{r['acks_per_event_mean']:.1f}",
             f"{r['delay_mean']:.2f}", f"{r['delay_max']:g}"]
            for r in result.summary
        ],
        doc["outputs"],
    )  # fmt: skip


def _show_forwards(result: Result, doc: dict[str, Any], as_json: bool) -> None:
    binned = result.tables["forwards"]
    if as_json:
        common.emit({**doc, "rows": binned}, as_json=True, title="")
        return
    _table(
        f"{_irbr_title('IRBR forwards', result)}; "
        f"IRBR below Scribe in every bin: {result.findings['irbr_below_scribe']}",
        ["protocol", "interested", "events", "mean interested", "mean forwards"],
        [
            [r["protocol"], r["bin"], str(r["events"]), f"{r['interested_mean']:.2f}",
             f"{r['forwards_mean']:.2f}"]
            for r in binned
        ],
        doc["outputs"],
    )  # fmt: skip


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
    acks: AcksOption = None,
    notice: NoticeOption = None,
    out: Annotated[Path | None, typer.Option(help="Output directory (default: out/irbr-faults).")] = None,
    serial: SerialOption = False,
    master: MasterOption = None,
    remote: RemoteOption = None,
    as_json: JsonOption = False,
) -> None:
    """Event loss of IRBR and Scribe when nodes fail at once (the IRBR paper's figure 4a)."""
    _irbr(
        "irbr-faults", config, out, as_json, _show_faults, (serial, master, remote),
        nodes=nodes, seeds=seeds, failures=failures, events=events, protocols=protocols,
        acks=acks, notice=notice,
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
    _irbr(
        "irbr-forwards", config, out, as_json, _show_forwards, (serial, master, remote),
        nodes=nodes, seeds=seeds, events=events, protocols=protocols,
    )  # fmt: skip


# ------------------------------------------------------------------------ chordal ring


def _ring(build: Callable[[], ExperimentConfig], run: Any, out: Path, as_json: bool, title: Any) -> None:
    """A ring experiment: its document, or a table of its rows titled ``title`` (a string,
    or a function of the result)."""

    def show(result: Result, doc: dict[str, Any], as_json: bool) -> None:
        if as_json:
            common.emit(doc, as_json=True, title="")
            return
        rows = result.rows
        cells = [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in r.values()] for r in rows]
        _table(title if isinstance(title, str) else title(result), list(rows[0]), cells, doc["outputs"])

    _execute(lambda: (build(), None), lambda c, p: run(c, progress=p), out=out, as_json=as_json, show=show)


@sim_app.command("ring-join")
def ring_join(
    sizes: Annotated[
        str, typer.Option(help="Ring sizes to report, e.g. 16,64,256,1024,4096.")
    ] = "16,64,256,1024,4096",
    seed: SeedOption = 1,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/ring-join"),
    as_json: JsonOption = False,
) -> None:
    """Messages and brokers touched by one join of the chordal ring, against its size (O(1) claimed)."""
    from flowbus.experiments import ring

    _ring(lambda: ring.RingJoin(sizes=_ints("sizes", sizes), seed=seed), ring.run_join, out, as_json,
          "chordal ring: join cost")  # fmt: skip


@sim_app.command("ring-repair")
def ring_repair(
    sizes: Annotated[str, typer.Option(help="Ring sizes, e.g. 64,256,1024,4096,10000.")] = "64,256,1024,4096",
    trials: Annotated[int, typer.Option(help="Failures of each kind per size.")] = 5,
    seed: SeedOption = 1,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/ring-repair"),
    as_json: JsonOption = False,
) -> None:
    """Messages and time to repair a broker, ring-link and chord-link failure against n (O(log n)?)."""
    from flowbus.experiments import ring

    _ring(lambda: ring.RingRepair(sizes=_ints("sizes", sizes), trials=trials, seed=seed), ring.run_repair,
          out, as_json, "chordal ring: repair cost")  # fmt: skip


@sim_app.command("ring-classes")
def ring_classes(
    nodes: Annotated[int, typer.Option(help="Brokers on the ring.")] = 256,
    events: Annotated[int, typer.Option(help="Events per class and phase.")] = 1000,
    link_failures: Annotated[float, typer.Option(help="Fraction of links failed in the second phase.")] = 0.1,
    seed: SeedOption = 1,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/ring-classes"),
    as_json: JsonOption = False,
) -> None:
    """Normal, express and secure events over the broker multigraph: violations, latency, hops."""
    from flowbus.experiments import ring

    _ring(
        lambda: ring.RingClasses(nodes=nodes, events=events, link_failures=link_failures, seed=seed),
        ring.run_classes, out, as_json,
        lambda r: f"events by class: {nodes} brokers, {r.findings['violations']} violations",
    )  # fmt: skip


@sim_app.command("ring-faults")
def ring_faults(
    nodes: Annotated[int, typer.Option(help="Brokers on the ring.")] = 24,
    backups: Annotated[str, typer.Option(help="Backup factors, e.g. 1,2,3,4.")] = "1,2,3,4",
    scenarios: Annotated[str, typer.Option(help="single, adjacent, skip-one.")] = "single,adjacent,skip-one",
    events: Annotated[int, typer.Option(help="Events published, one per time unit.")] = 300,
    seed: SeedOption = 1,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/ring-faults"),
    as_json: JsonOption = False,
) -> None:
    """Events lost, duplicated and delayed while brokers crash, for backup factors 1..4."""
    from flowbus.experiments import ring

    def build() -> ring.RingFaults:
        factors = _ints("backups", backups)
        return ring.RingFaults(
            nodes=nodes, backups=factors, scenarios=_names(scenarios), events=events, seed=seed
        )

    _ring(build, ring.run_faults, out, as_json, f"ring faults: {nodes} brokers, {events} events")


@sim_app.command("ring-adapt")
def ring_adapt(
    brokers: Annotated[int, typer.Option(help="Brokers on the ring at first.")] = 8,
    max_brokers: Annotated[int, typer.Option(help="Brokers the ring may grow to.")] = 16,
    duration: Annotated[float, typer.Option(help="Time units of each part.")] = 60.0,
    seed: SeedOption = 1,
    share_loss: Annotated[float, typer.Option(help="Probability a share or its ack is lost.")] = 0.0,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("out/ring-adapt"),
    as_json: JsonOption = False,
) -> None:
    """Load rising on one broker (state shared, brokers added) and express links slowing (re-routed)."""
    from flowbus.experiments import ring_adapt as ra

    def build() -> ra.RingAdapt:
        return ra.RingAdapt(
            brokers=brokers, max_brokers=max_brokers, duration=duration, seed=seed, share_loss=share_loss
        )

    _ring(build, ra.run_adapt, out, as_json, f"ring adapt: {brokers} to {max_brokers} brokers")


# ------------------------------------------------------------------------ CBDLO (the 004 document)

CbdloSeedsOption = Annotated[str | None, typer.Option(help="N (seeds 1..N) or a list 1,2,3.")]
CbdloOutOption = Annotated[Path, typer.Option(help="Output directory (CSV, JSON, PNG).")]
CBDLO_OUT = Path("docs/results/cbdlo")
_CBDLO_COLUMNS = ("messages_per_event", "maintenance_messages", "completeness", "effective_cost",
                  "hit_rate_10", "matching_cost_per_event", "comparisons_per_event")  # fmt: skip


def _show_cbdlo(result: Result, doc: dict[str, Any], as_json: bool) -> None:
    """The document without the rows (they are in the CSV), or a table of the means."""
    if as_json:
        common.emit({k: v for k, v in doc.items() if k != "rows"}, as_json=True, title="")
        return
    rows = result.summary
    shown = [k for k in _CBDLO_COLUMNS if any(r.get(k) is not None for r in rows)]
    if result.experiment == "cbdlo-apt":
        shown.insert(0, "attributes")
    _table(
        f"{result.experiment}: {len(result.rows)} runs, {result.timing['wall_s']:.1f} s",
        ["sweep", "x", "protocol", *shown],
        [[r["sweep"], str(r["x"]), r["protocol"], *(_num(r.get(k)) for k in shown)] for r in rows],
        doc["outputs"],
    )


def _cbdlo_command(experiment: str, doc: str) -> Callable[..., None]:
    def command(
        config: ConfigOption = None,
        seeds: CbdloSeedsOption = None,
        out: CbdloOutOption = CBDLO_OUT,
        as_json: JsonOption = False,
    ) -> None:
        from flowbus.experiments import cbdlo
        from flowbus.experiments.config import config_path

        def build() -> tuple[cbdlo.CbdloSweep, str | None]:
            path = config_path(experiment, config)
            return cbdlo.load(experiment, path, seeds=seeds), None if path is None else str(path)

        _execute(build, lambda c, p: cbdlo.run(c, progress=p), out=out, as_json=as_json, show=_show_cbdlo)

    command.__doc__ = doc
    command.__name__ = experiment.replace("-", "_")
    return command


_CBDLO_COMMANDS = {
    "cbdlo-cost": "Effective distribution cost against total subscriptions: Simple, CBDLO, TERA (figure 5).",
    "cbdlo-hops": "Effective distribution cost against maximum hops (the 004 document's figure 6).",
    "cbdlo-scale": "Messages per event of TERA and CBDLO against network size, then extrapolated (figure 7).",
    "cbdlo-matching": "Matching cost against subscriptions and attributes: Simple vs CBDLO (figures 8, 9).",
    "cbdlo-apt": "Share of attribute searches entering their topology within 10 hops, against the APT size.",
}

for _name, _doc in _CBDLO_COMMANDS.items():
    sim_app.command(_name)(_cbdlo_command(_name, _doc))


_CHURN_COLUMNS = ("failures", "completeness", "routing_per_event", "maintenance_per_event",
                  "gossip_per_event", "takeovers", "dead_hosted_vnodes", "topologies_lost")  # fmt: skip


@sim_app.command("cbdlo-churn")
def cbdlo_churn(
    config: ConfigOption = None,
    seeds: CbdloSeedsOption = None,
    out: CbdloOutOption = CBDLO_OUT,
    as_json: JsonOption = False,
) -> None:
    """CBDLO with nodes failing and joining while events flow: completeness and messages per event."""
    from flowbus.experiments import cbdlo_churn as churn
    from flowbus.experiments.config import config_path

    def build() -> tuple[churn.CbdloChurn, str | None]:
        path = config_path(churn.EXPERIMENT, config)
        return churn.load(path, seeds=seeds), None if path is None else str(path)

    def show(result: Result, doc: dict[str, Any], as_json: bool) -> None:
        if as_json:
            common.emit({k: v for k, v in doc.items() if k != "rows"}, as_json=True, title="")
            return
        title = f"cbdlo-churn: {len(result.rows)} runs, {result.timing['wall_s']:.1f} s"
        cells = [[str(r["churn"]), *(_num(r.get(k)) for k in _CHURN_COLUMNS)] for r in result.summary]
        _table(title, ["churn", *_CHURN_COLUMNS], cells, doc["outputs"])

    _execute(build, lambda c, p: churn.run(c, progress=p), out=out, as_json=as_json, show=show)
