"""Information flows on Spark: the rewritten plan against hop-by-hop, the engine end to end, state paths.

Three measurements in one Spark session (``local[2]`` by default), on the stock example
(:func:`flowbus.bench.workloads.stock_flow_spec`):

* ``plans`` -- the stateless part of the stock flow (its Figures 1 and 2:
  integration, big trades, the ticks feeding the state) over one DataFrame of
  ``events`` trades, two ways (:mod:`flowbus.spark.plans`). *Rewritten*: one
  ``[S; T]`` route per publication -> subscription path, each a filter and a
  projection of the publication point's rows. *Hop by hop*: the original graph
  walked arc by arc, each internal space with out-arcs (``combined``,
  ``capital``) an event log of its own -- what an engine that does not rewrite
  must keep between hops, as the engine keeps the derived logs between its
  stateful stages -- written once (Parquet) and read by its out-arcs.
  Every subscription point (and the space feeding the collapses) is counted;
  the best of ``rounds`` runs counts. Both deliver the same number of events
  per point (checked).
* ``engine`` -- ``flowbus run`` itself (:class:`flowbus.spark.flow.SparkFlow`,
  Structured Streaming, collapse and expand folded per key over Arrow) on the
  stock flow: events per second from the first micro-batch to the last; and the
  local reference interpreter (:class:`flowbus.flow.local.LocalRun`, one Python
  thread) over the same events, in the same run. The document's
  ``run_events_per_s`` and ``local_events_per_s`` are these two rates. On a
  shared machine the steadier figures are per CPU-second: ``cpu_s`` is what the
  run's process tree (driver, JVM, Python workers) spent, read from ``/proc``,
  with the 1-minute load average at its start and end and ``other_cpu_s``, what
  the rest of the machine used meanwhile. Before the run, while the input is
  ingested, the flow runs once over its first ``warm_up`` events in a scratch
  directory (:meth:`~flowbus.spark.flow.SparkFlow.warm_up`: the Python workers
  start and load the kernels, the JVM compiles the queries' code); that time is
  reported apart (``ingest_and_warm_up_s`` and ``_cpu_s``) and counted in
  ``end_to_end_events_per_s``.
* ``collapse`` -- the state paths on a flow that is only a collapse and an
  expand (``ticks -> max_cur -> compressed``): the per-key fold (expand per
  event) against Spark's own streaming aggregation (``max``/``max_by``,
  expand per micro-batch), events per second of each run.

``spark`` is a session from :func:`flowbus.spark.session.spark_session` (typed ``Any``
here: only ``flowbus.spark`` imports pyspark).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from flowbus.bench.workloads import stock_flow_spec
from flowbus.experiments.cpu import machine_busy_s
from flowbus.flow import FlowBuilder, Graph, load_spec
from flowbus.flow.generators import generate
from flowbus.flow.local import LocalRun
from flowbus.flow.rewrite import rewrite
from flowbus.spark.flow import SparkFlow
from flowbus.spark.plans import hop_plan, input_frame, rewritten_plan

Progress = Callable[[str, int, int], None]


def _timed(fn: Callable[[], dict[str, int]], rounds: int) -> tuple[float, dict[str, int]]:
    best = float("inf")
    counts: dict[str, int] = {}
    for _ in range(rounds):
        t0 = time.perf_counter()
        counts = fn()
        best = min(best, time.perf_counter() - t0)
    return best, counts


def plans(spark: Any, *, events: int, seed: int, rounds: int) -> dict[str, Any]:
    g = load_spec(stock_flow_spec())
    df = input_frame(spark, g, events=events, seed=seed)

    def rewritten() -> dict[str, int]:
        return rewritten_plan(df, g)

    def hops() -> dict[str, int]:
        return hop_plan(df, g)

    rewritten(), hops()  # warm up: JVM code, broadcast maps
    t_rw, c_rw = _timed(rewritten, rounds)
    t_hop, c_hop = _timed(hops, rounds)
    df.unpersist()
    names = {"combined.sub": "combined"}
    same = all(c_hop.get(names.get(k, k)) == v for k, v in c_rw.items())
    return {
        "events": events,
        "rewritten_s": t_rw,
        "hop_by_hop_s": t_hop,
        "rewritten_events_per_s": events / t_rw,
        "hop_by_hop_events_per_s": events / t_hop,
        "ratio": t_hop / t_rw,
        "deliveries": c_rw,
        "deliveries_agree": same,
    }


def _tree_cpu_s() -> float | None:
    """CPU seconds (user + system) of this process and every process under it -- the JVM, its
    Python workers, and the children they reaped -- read from ``/proc`` (None elsewhere)."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(d.name)] = int(fields[1])
        ticks[int(d.name)] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    mine = {os.getpid()}
    grew = True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in mine} - mine
        grew = bool(more)
        mine |= more
    return sum(ticks.get(pid, 0) for pid in mine) / os.sysconf("SC_CLK_TCK")


def _run_flow(
    spark: Any, g: Graph, events: list[tuple[str, dict[str, Any]]], *, warm_up: int = 0, **kw: Any
) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="flowbus-bench-run-"))
    try:
        flow = SparkFlow(spark, g, out, **kw)
        t_ingest, cpu_ingest = time.perf_counter(), _tree_cpu_s()
        with ThreadPoolExecutor(1) as pool:  # the warm-up overlaps the ingest, as flowbus run's does
            warming = pool.submit(_warm_up, flow, events[:warm_up]) if warm_up else None
            flow.ingest_generator(events, fingerprint="bench")
            ingest_s = time.perf_counter() - t_ingest
            warm_s = warming.result() if warming is not None else None
        ready_s = time.perf_counter() - t_ingest
        ready_cpu = _tree_cpu_s()
        load = os.getloadavg()[0]
        busy0, cpu0 = machine_busy_s(), _tree_cpu_s()
        t0 = time.perf_counter()
        with flow:
            flow.start()
            flow.process_available()
            seconds = time.perf_counter() - t0
            busy1, cpu1 = machine_busy_s(), _tree_cpu_s()
            profile = _profile(flow)
        delivered = dict(flow.stats.out)
        batches = flow.stats.batches
    finally:
        shutil.rmtree(out, ignore_errors=True)
    cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    return {
        "ingest_s": ingest_s,
        "warm_up_events": warm_up,
        "warm_up_s": warm_s,
        "ingest_and_warm_up_s": ready_s,
        "ingest_and_warm_up_cpu_s": ready_cpu - cpu_ingest
        if ready_cpu is not None and cpu_ingest is not None
        else None,
        "other_cpu_s": max(0.0, busy1 - busy0 - cpu) if cpu is not None else None,
        "seconds": seconds,
        "events_per_s": len(events) / seconds,
        "cpu_s": cpu,
        "events_per_cpu_s": len(events) / cpu if cpu else None,
        "load_average_1m": [load, os.getloadavg()[0]],
        "micro_batches": batches,
        "out": delivered,
        "profile": profile,
    }


def _warm_up(flow: SparkFlow, sample: list[tuple[str, dict[str, Any]]]) -> float:
    t0 = time.perf_counter()
    flow.warm_up(sample)
    return time.perf_counter() - t0


def _profile(flow: SparkFlow) -> dict[str, Any]:
    """Where each query's time went: Spark's own phases (``durationMs`` of its progress
    reports, summed over the micro-batches, in seconds) and, for the ``foreachBatch``
    queries, the time in flowbus's batch function."""
    inside: dict[str, float] = {}
    for r in flow.stats.reports:
        inside[r.query] = inside.get(r.query, 0.0) + r.seconds
    out: dict[str, Any] = {}
    for name, q in flow.queries.items():
        phases: dict[str, float] = {}
        # (a delivery reads its micro-batch's files itself: Spark counts no input rows for it)
        progress = [p for p in q.recentProgress if "addBatch" in p.durationMs]
        for p in progress:
            for phase, ms in p.durationMs.items():
                phases[phase] = phases.get(phase, 0.0) + ms / 1000
        out[name] = {"batches": len(progress), "phases_s": phases}
    for query, secs in inside.items():
        out.setdefault(query.replace(" ", "-"), {})["in_flowbus_s"] = secs
    return out


def engine(spark: Any, *, events: int, batch_events: int, seed: int, warm_up: int = 0) -> dict[str, Any]:
    """The stock flow on Spark (after a warm-up over the first ``warm_up`` events, overlapping the
    ingest) and on the local interpreter; ``end_to_end_events_per_s`` counts the ingest and the
    warm-up too."""
    g = load_spec(stock_flow_spec())
    published = list(generate(g, events=events, seed=seed))
    local = LocalRun(rewrite(g))
    t0, c0 = time.perf_counter(), time.process_time()
    for space, event in published:
        local.publish(space, event)
    local_s, local_cpu = time.perf_counter() - t0, time.process_time() - c0
    result = _run_flow(spark, g, published, batch_events=batch_events, warm_up=warm_up)
    return {
        "events": events,
        "batch_events": batch_events,
        **result,
        "local_seconds": local_s,
        "local_events_per_s": events / local_s,
        "local_events_per_cpu_s": events / local_cpu,
        "local_out": {p: len(evs) for p, evs in local.outputs.items()},
        "ratio_run_over_local": result["events_per_s"] * local_s / events,
        "end_to_end_events_per_s": events / (result["ingest_and_warm_up_s"] + result["seconds"]),
    }


def _ticks_flow() -> Graph:
    b = FlowBuilder("collapse").source("ticks", {"name": "str", "price": "float"})
    b.state("max_cur", {"name": "str", "maxP": "float", "curP": "float"}, key="name",
            initial={"maxP": 0, "curP": 0})  # fmt: skip
    b.rules("max_cur", key={"name": "name"}, rules=[
        {"when": "price > maxP", "set": {"maxP": "price", "curP": "price"}}, {"set": {"curP": "price"}},
    ])  # fmt: skip
    b.sink("compressed", {"name": "str", "price": "float"})
    b.collapse("C", "ticks", "max_cur", "max_cur").expand("E", "max_cur", "compressed", "max_cur")
    return b.build()


def collapse(spark: Any, *, events: int, batch_events: int, keys: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    g = _ticks_flow()
    ticks = [
        ("ticks", {"name": f"K{rng.randrange(keys)}", "price": round(rng.uniform(1, 100), 2)})
        for _ in range(events)
    ]
    state = _run_flow(spark, g, ticks, batch_events=batch_events, collapse="state")
    aggregate = _run_flow(spark, g, ticks, batch_events=batch_events, collapse="aggregate")
    return {
        "events": events,
        "keys": keys,
        "batch_events": batch_events,
        "per_key_fold": state,
        "aggregate": aggregate,
        "ratio_aggregate_over_state": aggregate["events_per_s"] / state["events_per_s"],
    }


def batch_size(events: int) -> int:
    """The default micro-batch: half the run, at least 5,000 events, at most 1,000,000 (Spark's
    fixed cost per micro-batch and query is a second or two; two micro-batches of 1,000,000 cost
    13 CPU-s less than four of 500,000, measured)."""
    return max(5_000, min(1_000_000, -(-events // 2)))


def run(
    spark: Any,
    *,
    events: int = 100_000,
    engine_events: int | None = None,
    batch_events: int | None = None,
    rounds: int = 3,
    seed: int = 1,
    progress: Progress | None = None,
    engine_only: bool = False,
    warm_up: int = 2000,
) -> dict[str, Any]:
    """``engine_events`` defaults to ``events``, ``batch_events`` to :func:`batch_size` of it;
    ``warm_up`` events run through the flow first, while the input is ingested (0: none)."""
    n = engine_events or events
    batch = batch_events or batch_size(n)
    if engine_only:
        return _rates({"engine": engine(spark, events=n, batch_events=batch, seed=seed, warm_up=warm_up)})
    steps = 3
    if progress:
        progress("stock flow: rewritten vs hop by hop", 0, steps)
    doc: dict[str, Any] = {"plans": plans(spark, events=events, seed=seed, rounds=rounds)}
    if progress:
        progress("stock flow: rewritten vs hop by hop", 1, steps)
    doc["engine"] = engine(spark, events=n, batch_events=batch, seed=seed, warm_up=warm_up)
    if progress:
        progress("stock flow: rewritten vs hop by hop", 2, steps)
    doc["collapse"] = collapse(spark, events=n, batch_events=batch, keys=500, seed=seed)
    if progress:
        progress("stock flow: rewritten vs hop by hop", 3, steps)
    return _rates(doc)


def _rates(doc: dict[str, Any]) -> dict[str, Any]:
    """The headline: the stock flow on Spark and on the local interpreter, same events, same run."""
    e = doc["engine"]
    return {"run_events_per_s": e["events_per_s"], "local_events_per_s": e["local_events_per_s"], **doc}
