"""``flowbus run --engine spark``: a flow on Spark, with a live summary per micro-batch.

How it works: the spec is loaded and checked, the input (the spec's generator,
or ``--source POINT=DIR`` directories) is written to the run's input log under
``OUT/_flowbus``, the session starts (``local[*]`` unless ``--master`` names a
cluster), and :class:`flowbus.spark.flow.SparkFlow` starts one query per event
log and per stateful group. Without ``--follow`` the run ends when every query
has processed all its input; with it, new files in the source directories are
ingested every second (and processed before the next look) until Ctrl-C or
``--timeout``. Queries are stopped on
every way out, Ctrl-C included. Started again on the same ``OUT``, a run
resumes from its checkpoints (``--fresh`` starts over).
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.live import Live
from rich.table import Table

from flowbus.errors import FlowbusError, FlowError
from flowbus.flow.graph import Graph

__all__ = ["run_spark"]


def _sources(specs: list[str], g: Graph) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for spec in specs:
        point, sep, path = spec.partition("=")
        if not sep or not point or not path:
            raise FlowError(f"--source takes POINT=DIR, got {spec!r}")
        if not g.has_space(point):
            raise FlowError(f"--source {spec!r}: the flow has no space {point!r}")
        directory = Path(path)
        if not directory.is_dir():
            raise FlowError(f"--source {spec!r}: {path!r} is not a directory")
        out[point] = directory
    return out


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

    def __init__(self, points: list[str], total: int | None) -> None:
        self.points = points
        self.total = total
        self.t0 = time.perf_counter()
        self.lock = threading.Lock()
        self.batches = 0
        self.events_in = 0
        self.out = dict.fromkeys(points, 0)
        self.last: dict[str, int] = {}

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
) -> dict[str, Any]:
    """Run ``spec`` on Spark; the summary as a JSON-able dict."""
    from flowbus.flow.generators import generate
    from flowbus.flow.spec import load_spec

    if sink not in ("parquet", "jsonl", "console"):
        raise FlowError(f"unknown --format {sink!r} (parquet, jsonl or console)")
    if collapse not in ("state", "aggregate"):
        raise FlowError(f"unknown --collapse {collapse!r} (state or aggregate)")
    g = load_spec(spec)
    dirs = _sources(sources, g)
    if follow and not dirs:
        raise FlowError("--follow needs --source directories to follow")
    if not dirs and g.input is None:
        raise FlowError(f"flow {g.name!r} names no input generator: give --source POINT=DIR")
    target = Path(out) if out is not None else Path("out") / g.name
    if fresh and (target / "_flowbus").is_dir():
        shutil.rmtree(target)
    total = None
    if not dirs and g.input is not None:
        total = events if events is not None else g.input.events

    from flowbus.spark.flow import SparkFlow, fingerprint
    from flowbus.spark.session import spark_session

    t0 = time.perf_counter()
    spark = spark_session(
        master=master, remote=remote, app_name=f"flowbus-run-{g.name}",
        conf={"spark.sql.shuffle.partitions": "2"} if remote is None else None,
        jvm_log=(target / "_spark.log").resolve() if live else None,
    )  # fmt: skip
    if remote is None:
        spark.sparkContext.setLogLevel("ERROR")
    session_s = time.perf_counter() - t0
    flow_points: list[str] = []
    summary = _Summary(flow_points, total)
    flow = SparkFlow(
        spark, g, target, sink=sink, batch_events=batch_events, collapse=collapse,  # type: ignore[arg-type]
        on_batch=summary.add,
    )  # fmt: skip
    flow_points.extend(flow.plan.recorded)
    summary.out = dict.fromkeys(flow_points, 0)
    if dirs:
        published = flow.ingest_dirs(dirs)
    else:
        assert g.input is not None
        n = total or 0
        s = seed if seed is not None else g.input.seed
        published = flow.ingest_generator(
            generate(g, events=n, seed=s), fingerprint=fingerprint(spec.read_text(), g.input.generator, n, s)
        )
    t1 = time.perf_counter()
    stopped_by = "end of input"
    live_view = (
        Live(summary.render(), console=err_console, refresh_per_second=2, transient=False) if live else None
    )
    try:
        if live_view is not None:
            live_view.start()
        flow.start()
        if follow:
            stopped_by = _follow(flow, dirs, timeout, summary, live_view)
        else:
            worker = threading.Thread(target=_process, args=(flow,), daemon=True)
            worker.start()
            while worker.is_alive():
                worker.join(0.5)
                if live_view is not None:
                    live_view.update(summary.render())
                if timeout is not None and time.perf_counter() - t1 > timeout:
                    stopped_by = f"--timeout {timeout:g} s"
                    break
            flow.check()
    except KeyboardInterrupt:
        stopped_by = "Ctrl-C"
    finally:
        flow.stop()
        if live_view is not None:
            live_view.update(summary.render())
            live_view.stop()
    seconds = time.perf_counter() - t1
    counts = (
        _count_outputs(target, list(flow.plan.recorded), sink) if sink != "console" else dict(summary.out)
    )
    return {
        "engine": "spark",
        "spec": str(spec),
        "master": remote if remote is not None else spark.sparkContext.master,
        "events": summary.events_in,
        "published": published,
        "micro_batches": summary.batches,
        "seconds": seconds,
        "events_per_s": summary.events_in / seconds if seconds > 0 else None,
        "session_s": session_s,
        "stopped_by": stopped_by,
        "out": str(target),
        "format": sink,
        "collapse": {
            grp.name: {
                "collapses": [c.name for c in grp.collapses],
                "path": "aggregate (expand per micro-batch)" if grp.aggregate else "transformWithState",
            }
            for grp in flow.plan.groups
        },
        "outputs": {
            p: {"events": counts.get(p, 0), "path": str(target / p) if sink != "console" else None}
            for p in flow.plan.recorded
        },
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
        if published != seen:
            seen = published
            flow.process_available()
        flow.check()
        if live is not None:
            live.update(summary.render())
        if timeout is not None and time.perf_counter() - t0 > timeout:
            return f"--timeout {timeout:g} s"
        time.sleep(1.0)
