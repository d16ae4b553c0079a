"""``flowbus run``: a flow spec on Spark (Structured Streaming, the default) or on the local
reference interpreter (``--engine local``).

How it works, on Spark: the spec is loaded and checked, the input (the spec's generator,
or ``--source POINT=DIR`` directories) is written to the run's input log under
``OUT/_flowbus``, the session starts (``local[*]`` unless ``--master`` names a
cluster; a long local run's JVM with ``STREAMING_CONF``), and while the input is
ingested the flow runs once over the first ``--warm-up`` events of the spec's
generator in a scratch directory (:meth:`flowbus.spark.flow.SparkFlow.warm_up`,
as ``flowbus bench spark`` does: workers started, kernels loaded, the JVM's
code compiled before the first micro-batch). Then :class:`flowbus.spark.flow.SparkFlow`
starts one query per event log and per stateful group. Without ``--follow`` the run ends when every query
has processed all its input; with it, new files in the source directories are
ingested every second (and processed before the next look) until Ctrl-C or
``--timeout``. Queries are stopped on
every way out, Ctrl-C included. Started again on the same ``OUT``, a run
resumes from its checkpoints (``--fresh`` starts over). A live table on standard error
(:class:`_Summary`) shows the micro-batches and the events out per subscription point.

On the local engine (:class:`flowbus.flow.local.LocalRun`) the generated events go through
the rewritten graph (``--graph original``: the graph as written), and the outputs are
written as JSON lines under ``--out`` if given. As everywhere in the command line,
``--json`` prints exactly one JSON document and a bad input exits with status 2.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.live import Live
from rich.table import Table

from flowbus.cli.common import JsonOption, SpecArgument, emit, err, fail, progress_bar
from flowbus.cli.common import out as stdout
from flowbus.errors import FlowbusError, FlowError

if TYPE_CHECKING:
    from flowbus.flow.graph import Graph

__all__ = ["run", "run_spark"]

WARM_UP = 2000
"""Events of the default warm-up (``--warm-up``)."""
LONG_RUN = 200_000
"""Generated events from which a local run (or any ``--follow``) gets ``STREAMING_CONF``'s JVM: a run of
300 events took 10 s longer with it (the JVM interprets until C2 compiles); at 2,000,000 events the
JIT's CPU fell from 11-14 to about 4 CPU-s (docs/results/spark.md)."""


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
    sink_format: Annotated[
        str, typer.Option("--format", help="spark: parquet, jsonl or console, per subscription point.")
    ] = "parquet",
    batch_events: Annotated[
        int, typer.Option(min=1, help="spark: events per input file, one file per micro-batch.")
    ] = 2000,
    source: Annotated[
        list[str] | None,
        typer.Option(
            help="spark: POINT=DIR, JSON lines or Parquet files of a publication point, or "
            "POINT=flowbus://HOST:PORT or POINT=flowbus://HOST:PORT/SPACE, its space on the bus "
            "(by default the point's name)."
        ),
    ] = None,
    sink: Annotated[
        list[str] | None,
        typer.Option(
            "--sink",
            help="spark: flowbus://HOST:PORT (every subscription point published into the space of "
            "its name) or POINT=flowbus://HOST:PORT/SPACE.",
        ),
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
            help="spark: state (per-key fold over Arrow, expand per event) or aggregate (Spark's own "
            "aggregation for max/min/last/count/sum rule sets, expand per micro-batch)."
        ),
    ] = "state",
    warm_up: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="spark: events of the spec's generator run through the flow first, in a scratch "
            "directory, while the input is ingested (0: none; default 2,000 when the spec generates "
            "more than ten times that).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Run a flow spec: on Spark (Structured Streaming) by default, or the local reference interpreter."""
    if engine not in ("spark", "local"):
        fail(f"unknown engine {engine!r} (expected spark or local)")
    if graph not in ("rewritten", "original"):
        fail(f"unknown graph {graph!r} (expected rewritten or original)")
    if engine == "spark":
        _run_spark_cli(
            spec, master=master, remote=remote, events=events, seed=seed, out=out, sink=sink_format,
            batch_events=batch_events, sources=source or [], sinks=sink or [], follow=follow, timeout=timeout,
            fresh=fresh, collapse=collapse, warm_up=warm_up, as_json=as_json,
        )  # fmt: skip
        return
    try:
        doc = _run_local(spec, events=events, seed=seed, out=out, rewritten=graph == "rewritten")
    except FlowbusError as exc:
        fail(str(exc))
    if as_json:
        emit(doc, as_json=True, title="")
        return
    flat = {k: v for k, v in doc.items() if k not in ("outputs", "states")}
    if out is None:
        flat["out"] = "not written (pass --out DIR)"
    flat.update({f"output {name}": o["events"] for name, o in doc["outputs"].items()})
    flat.update({f"state {name}": f"{n} rows" for name, n in doc["states"].items()})
    emit(flat, as_json=False, title=f"flowbus run {spec} (local engine)")


def _run_spark_cli(spec: Path, *, as_json: bool, **options: Any) -> None:
    try:
        doc = run_spark(spec, live=not as_json and err.is_terminal, err_console=err, **options)
    except FlowbusError as exc:
        fail(str(exc))
    if as_json:
        emit(doc, as_json=True, title="")
        return
    flat = {k: v for k, v in doc.items() if k not in ("outputs", "collapse")}
    flat.update(
        {f"state {n}": f"{', '.join(c['collapses'])}: {c['path']}" for n, c in doc["collapse"].items()}
    )
    flat.update(
        {f"output {name}": f"{o['events']:,} events  {o['path'] or ''}" for name, o in doc["outputs"].items()}
    )
    emit(flat, as_json=False, title=f"flowbus run {spec} (Spark)")
    if doc["format"] != "console":
        reader = "parquet" if doc["format"] == "parquet" else "json"
        where = f"outputs: {doc['out']}/<point>/<log>-<batch>/ ({doc['format']}); "
        stdout.print(
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
    from flowbus.flow.spec import load_spec

    g = load_spec(spec)
    total = events if events is not None else (g.input.events if g.input else 0)
    local = LocalRun(rewrite(g) if rewritten else g)
    t0 = time.perf_counter()
    with progress_bar(True) as progress:
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


def _sources(specs: list[str], g: Graph) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for spec in specs:
        point, sep, path = spec.partition("=")
        if not sep or not point or not path:
            raise FlowError(f"--source takes POINT=DIR or POINT=flowbus://HOST:PORT/SPACE, got {spec!r}")
        if not g.has_space(point):
            raise FlowError(f"--source {spec!r}: the flow has no space {point!r}")
        if path.startswith("flowbus://"):
            continue
        directory = Path(path)
        if not directory.is_dir():
            raise FlowError(f"--source {spec!r}: {path!r} is not a directory")
        out[point] = directory
    return out


def _bus_ends(g: Graph, sources: list[str], sinks: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``--source POINT=flowbus://...`` and ``--sink`` ends (by the rewritten graph's point
    names), each checked: brokers reachable, spaces known or declared, schemas alike."""
    bus_sources = [s for s in sources if "=flowbus://" in s]
    if not bus_sources and not sinks:
        return {}, {}
    from flowbus.flow.plan import INPUT, plan
    from flowbus.flow.rewrite import rewrite
    from flowbus.spark.pipeline import check_ends, parse_end, sink_points

    rw = rewrite(g)
    log = plan(rw).log(INPUT)
    points = {p.removesuffix(".pub"): p for p in log.points} | {p: p for p in log.points}
    ins = {}
    for spec in bus_sources:
        point, _, url = spec.partition("=")
        if point not in points:
            raise FlowError(
                f"--source {spec!r}: {point!r} is not a publication point ({', '.join(log.points)})"
            )
        ins[points[point]] = parse_end(url, point)
    outs = sink_points(rw, plan(rw).recorded, list(sinks))
    check_ends(rw, ins, outs)
    return ins, outs


def _count_outputs(out: Path, points: list[str], sink: str) -> dict[str, int]:
    """Events written per subscription point (read back from the sink's files)."""
    import pyarrow.parquet as pq

    counts: dict[str, int] = {}
    for point in points:
        base = out / point
        n = 0
        if base.is_dir():
            for f in base.glob("*/part-*"):
                if sink == "parquet" and f.suffix == ".parquet":
                    n += pq.read_metadata(f).num_rows
                elif sink == "jsonl" and f.suffix == ".json":
                    with f.open("rb") as fh:
                        n += sum(1 for _ in fh)
        counts[point] = n
    return counts


class _Summary:
    """The live table: micro-batches, events in, events out per subscription point."""

    def __init__(self, total: int | None) -> None:
        self.total = total
        self.t0 = time.perf_counter()
        self.lock = threading.Lock()
        self.batches = 0
        self.events_in = 0
        self.out: dict[str, int] = {}
        self.last: dict[str, int] = {}

    def expect(self, points: Sequence[str]) -> None:
        """The subscription points of the flow (rows of the table before their first batch)."""
        with self.lock:
            self.out = dict.fromkeys(points, 0) | self.out

    def add(self, report: Any) -> None:
        with self.lock:
            self.batches += 1
            if report.query == "deliver input":
                self.events_in += report.rows_in
            for p, n in report.out.items():
                self.out[p] = self.out.get(p, 0) + n
            self.last.update(report.out)

    def render(self) -> Table:
        with self.lock:
            elapsed = time.perf_counter() - self.t0
            total = f" / {self.total:,}" if self.total else ""
            table = Table(
                title=f"flowbus run: {self.batches} micro-batches, {self.events_in:,}{total} events in, "
                f"{elapsed:.0f} s",
                title_justify="left",
            )
            table.add_column("subscription point")
            table.add_column("events out", justify="right")
            table.add_column("last batch", justify="right")
            for p in sorted(self.out):
                table.add_row(p, f"{self.out[p]:,}", f"{self.last.get(p, 0):,}")
            return table


def run_spark(
    spec: Path,
    *,
    master: str | None,
    remote: str | None,
    events: int | None,
    seed: int | None,
    out: Path | None,
    sink: str,
    batch_events: int,
    sources: list[str],
    follow: bool,
    timeout: float | None,
    fresh: bool,
    collapse: str,
    live: bool,
    err_console: Any,
    sinks: Sequence[str] = (),
    warm_up: int | None = 0,
) -> dict[str, Any]:
    """Run ``spec`` on Spark; the summary as a JSON-able dict."""
    from flowbus.flow.spec import load_spec

    if sink not in ("parquet", "jsonl", "console"):
        raise FlowError(f"unknown --format {sink!r} (parquet, jsonl or console)")
    if collapse not in ("state", "aggregate"):
        raise FlowError(f"unknown --collapse {collapse!r} (state or aggregate)")
    g = load_spec(spec)
    dirs = _sources(sources, g)
    bus_in, bus_out = _bus_ends(g, sources, sinks)
    if dirs and bus_in:
        raise FlowError("--source: read directories or the bus in one run, not both")
    if follow and not dirs and not bus_in:
        raise FlowError("--follow needs --source directories (or the bus) to follow")
    if not dirs and not bus_in and g.input is None:
        raise FlowError(f"flow {g.name!r} names no input generator: give --source POINT=DIR")
    target = Path(out) if out is not None else Path("out") / g.name
    if fresh and (target / "_flowbus").is_dir():
        shutil.rmtree(target)
    total = None
    if not dirs and not bus_in and g.input is not None:
        total = events if events is not None else g.input.events

    from flowbus.spark.flow import SparkFlow

    t0 = time.perf_counter()
    long_run = follow or (total is not None and total >= LONG_RUN)
    spark = _session(g.name, target, master=master, remote=remote, long_run=long_run)
    session_s = time.perf_counter() - t0
    summary = _Summary(total)
    flow = SparkFlow(
        spark, g, target, sink=sink, batch_events=batch_events, collapse=collapse,  # type: ignore[arg-type]
        on_batch=summary.add, bus_sources=bus_in, bus_sinks=bus_out,
    )  # fmt: skip
    summary.expect(flow.plan.recorded)
    sample = _warm_up_sample(g, warm_up, total, seed)
    with ThreadPoolExecutor(1) as pool:  # the warm-up beside the ingest, as the bench does
        warming = pool.submit(flow.warm_up, sample) if sample else None
        if bus_in:
            published = 0  # (the bus's events come in with the queries)
        else:
            published = (
                flow.ingest_dirs(dirs) if dirs else _ingest_generated(flow, spec, g, events=total, seed=seed)
            )
        if warming is not None:
            warming.result()
    t1 = time.perf_counter()
    stopped_by = _drive(
        flow, dirs, follow=follow, timeout=timeout, summary=summary,
        live=Live(summary.render(), console=err_console, refresh_per_second=2) if live else None,
    )  # fmt: skip
    return _result(
        spec, flow, summary, target=target, sink=sink, published=published, stopped_by=stopped_by,
        master=remote if remote is not None else spark.sparkContext.master,
        seconds=time.perf_counter() - t1, session_s=session_s, warm_up=len(sample),
    )  # fmt: skip


def _session(name: str, target: Path, *, master: str | None, remote: str | None, long_run: bool) -> Any:
    """The session of the run: ``local[*]`` unless ``master`` or ``remote``; the JVM's log (and
    its Python workers' chatter) in the run's directory, ``_spark.log``, whether or not the live
    table draws: a terminal, a pipe or a CI log shows flowbus's own output only. A long local
    run's JVM compiles with C2 alone (``STREAMING_CONF``; a short one starts faster with C1)."""
    from flowbus.spark.session import STREAMING_CONF, spark_session

    conf = None if remote is not None else {"spark.sql.shuffle.partitions": "2"}
    if conf is not None and long_run and (master is None or master.startswith("local")):
        conf.update(STREAMING_CONF)  # (a cluster's executors are JVMs of their own)
    spark = spark_session(
        master=master, remote=remote, app_name=f"flowbus-run-{name}", conf=conf,
        jvm_log=(target / "_spark.log").resolve(),
    )  # fmt: skip
    if remote is None:
        spark.sparkContext.setLogLevel("ERROR")
    return spark


def _warm_up_sample(g: Graph, warm_up: int | None, total: int | None, seed: int | None) -> list[Any]:
    """The events to warm the flow up with (:meth:`~flowbus.spark.flow.SparkFlow.warm_up`): the
    first ``warm_up`` of the spec's generator; by default 2,000 when the run generates more than
    ten times that (a short run would pay more than it saves)."""
    from flowbus.flow.generators import generate

    if g.input is None:
        return []
    if warm_up is None:
        warm_up = WARM_UP if total is not None and total > 10 * WARM_UP else 0
    s = seed if seed is not None else g.input.seed
    return list(generate(g, events=warm_up, seed=s)) if warm_up else []


def _ingest_generated(flow: Any, spec: Path, g: Graph, *, events: int | None, seed: int | None) -> int:
    """The spec's generator's events into the run's input log (once: fingerprinted)."""
    from flowbus.flow.generators import generate
    from flowbus.spark.flow import fingerprint

    assert g.input is not None
    n = events or 0
    s = seed if seed is not None else g.input.seed
    done: int = flow.ingest_generator(
        generate(g, events=n, seed=s), fingerprint=fingerprint(spec.read_text(), g.input.generator, n, s)
    )
    return done


def _drive(
    flow: Any,
    dirs: Mapping[str, Path],
    *,
    follow: bool,
    timeout: float | None,
    summary: _Summary,
    live: Live | None,
) -> str:
    """Start the queries and run them to the end of the input (or, with ``follow``, on); why they
    stopped. The queries are stopped on every way out, Ctrl-C included."""
    t0 = time.perf_counter()
    stopped_by = "end of input"
    try:
        if live is not None:
            live.start()
        flow.start()
        if follow:
            stopped_by = _follow(flow, dirs, timeout, summary, live)
        else:
            worker = threading.Thread(target=_process, args=(flow,), daemon=True)
            worker.start()
            while worker.is_alive():
                worker.join(0.5)
                if live is not None:
                    live.update(summary.render())
                if timeout is not None and time.perf_counter() - t0 > timeout:
                    stopped_by = f"--timeout {timeout:g} s"
                    break
            flow.check()
    except KeyboardInterrupt:
        stopped_by = "Ctrl-C"
    finally:
        flow.stop()
        if live is not None:
            live.update(summary.render())
            live.stop()
    return stopped_by


def _result(
    spec: Path,
    flow: Any,
    summary: _Summary,
    *,
    target: Path,
    sink: str,
    master: str,
    published: int,
    stopped_by: str,
    seconds: float,
    session_s: float,
    warm_up: int,
) -> dict[str, Any]:
    """The run's summary document (what ``--json`` prints)."""
    points = list(flow.plan.recorded)
    counts = _count_outputs(target, points, sink) if sink != "console" else dict(summary.out)
    paths = {p: str(target / p) if sink != "console" else None for p in points}
    for p, end in flow.bus_sinks.items():  # (published: this run's count)
        counts[p] = summary.out.get(p, 0)
        paths[p] = f"flowbus://{','.join(end.brokers)}/{end.space}"
    return {
        "engine": "spark",
        "spec": str(spec),
        "master": master,
        "events": summary.events_in,
        "published": published,
        "micro_batches": summary.batches,
        "seconds": seconds,
        "events_per_s": summary.events_in / seconds if seconds > 0 else None,
        "session_s": session_s,
        "warm_up_events": warm_up,
        "stopped_by": stopped_by,
        "out": str(target),
        "format": sink,
        "collapse": {
            grp.name: {
                "collapses": [c.name for c in grp.collapses],
                "path": "aggregate (expand per micro-batch)"
                if grp.aggregate
                else "per-key fold (expand per event)",
            }
            for grp in flow.plan.groups
        },
        "outputs": {p: {"events": counts.get(p, 0), "path": paths[p]} for p in points},
    }


def _process(flow: Any) -> None:
    with contextlib.suppress(FlowbusError):  # flow.check() in the main thread reports it
        flow.process_available()


def _follow(flow: Any, dirs: Mapping[str, Path], timeout: float | None, summary: _Summary, live: Any) -> str:
    """Every second: ingest the new files of ``dirs`` and, if there were any, process them all."""
    t0 = time.perf_counter()
    seen = -1
    while True:
        published = flow.ingest_dirs(dirs)
        if published != seen or flow.bus_sources:  # (the bus: its queries look themselves)
            seen = published
            flow.process_available()
        flow.check()
        if live is not None:
            live.update(summary.render())
        if timeout is not None and time.perf_counter() - t0 > timeout:
            return f"--timeout {timeout:g} s"
        time.sleep(1.0)
