"""Information flows on Spark: the rewritten plan against hop-by-hop, the engine end to end, state paths.

Three measurements in one Spark session (``local[2]`` by default):

* ``plans`` -- the stateless part of the stock flow (its Figures 1 and 2:
  integration, big trades, the ticks feeding the state) over one DataFrame of
  ``events`` trades, two ways. *Rewritten*: one ``[S; T]`` route per
  publication -> subscription path, each a filter and a projection of the
  publication point's rows (:func:`flowbus.spark.routes.route_columns`).
  *Hop by hop*: the original graph walked arc by arc, each internal space
  with out-arcs (``combined``, ``capital``) an event log of its own -- what an
  engine that does not rewrite must keep between hops, as the engine keeps
  the derived logs between its stateful stages -- written once (Parquet) and
  read by its out-arcs.
  Every subscription point (and the space feeding the collapses) is written to
  Spark's ``noop`` sink; the best of ``rounds`` runs counts. Both deliver the
  same number of events per point (checked).
* ``engine`` -- ``flowbus run`` itself (:class:`flowbus.spark.flow.SparkFlow`,
  Structured Streaming, collapse and expand in ``transformWithState``) on the
  stock flow: events per second from the first micro-batch to the last.
* ``collapse`` -- the state paths on a flow that is only a collapse and an
  expand (``ticks -> max_cur -> compressed``): ``transformWithState`` (expand
  per event) against Spark's own streaming aggregation (``max``/``max_by``,
  expand per micro-batch), events per second of each run.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from flowbus.flow import FlowBuilder, Graph, load_spec, rewrite
from flowbus.flow.generators import generate
from flowbus.flow.graph import EventSpace, Route, Select, Transform
from flowbus.flow.plan import INPUT, plan
from flowbus.spark.columns import ColumnCompiler
from flowbus.spark.flow import SparkFlow, log_schema, spark_type

Progress = Callable[[str, int, int], None]
STOCKS = Path(__file__).resolve().parents[1] / "examples" / "stocks" / "flow.yaml"


def _input_frame(spark: SparkSession, g: Graph, events: int, seed: int) -> DataFrame:
    """The published events as one cached DataFrame in the input log's layout (``_point``, ``e<i>``)."""
    from flowbus.flow.eventlog import InputLog

    tmp = Path(tempfile.mkdtemp(prefix="flowbus-bench-flow-"))
    r = rewrite(g)
    log = InputLog(r, plan(r).log(INPUT), tmp, batch_events=events + 1)
    log.publish_all(generate(g, events=events, seed=seed))
    df = spark.read.schema(log_schema(r, plan(r).log(INPUT))).parquet(str(tmp)).cache()
    df.count()
    shutil.rmtree(tmp, ignore_errors=True)
    return df


def _point_rows(df: DataFrame, g: Graph, point: str) -> DataFrame:
    r = rewrite(g)
    column = plan(r).log(INPUT).column(point)
    return df.where(F.col("_point") == point).select("_order", f"{column}.*")


def _count(df: DataFrame) -> int:
    return int(df.count())


def rewritten_plan(df: DataFrame, g: Graph) -> dict[str, int]:
    """Each subscription point (and collapse input) from its routes: one filter and projection per path."""
    from flowbus.spark.routes import route_columns

    r = rewrite(g)
    p = plan(r)
    targets: dict[str, list[DataFrame]] = {}
    functions = r.all_functions
    for point in p.log(INPUT).points:
        rows = _point_rows(df, g, point)
        compiler = ColumnCompiler(functions, dict(r.event_space(point).schema.fields))
        for arc in r.out_arcs(point):
            if isinstance(arc, Route):
                cond, outputs = route_columns(arc, compiler)
                targets.setdefault(arc.target, []).append(rows.where(cond).select(*outputs))
    return {t: _count(_union(frames)) for t, frames in targets.items()}


def hop_plan(df: DataFrame, g: Graph) -> dict[str, int]:
    """The original graph arc by arc, each internal space written as an event log its out-arcs read."""
    functions = g.all_functions
    spaces: dict[str, DataFrame] = {}
    tmp = Path(tempfile.mkdtemp(prefix="flowbus-bench-hops-"))
    r = rewrite(g)
    published = {n[: -len(".pub")] if n.endswith(".pub") else n: n for n in plan(r).log(INPUT).points}
    counts: dict[str, int] = {}
    order = [s.name for s in g.spaces if isinstance(s, EventSpace)]  # the spec lists spaces upstream first
    for name in order:
        frames = []
        if name in published:
            frames.append(_point_rows(df, g, published[name]).drop("_order"))
        for arc in g.in_arcs(name):
            if not isinstance(arc, Select | Transform) or arc.source not in spaces:
                continue
            source = spaces[arc.source]
            compiler = ColumnCompiler(functions, dict(g.event_space(arc.source).schema.fields))
            if isinstance(arc, Select):
                frames.append(source.where(compiler.filter(arc.filter)))
            else:
                schema = g.event_space(name).schema.fields
                cols = []
                cond = None
                for field, e in arc.outputs:
                    parts = compiler.value(e)
                    defined = compiler.defined(e)
                    cond = defined if cond is None else cond & defined
                    cols.append(compiler.single(parts, e).cast(spark_type(schema[field])).alias(field))
                frames.append(source.where(cond).select(*cols) if cond is not None else source.select(*cols))
        if not frames:
            continue
        space = _union(frames)
        if any(isinstance(a, Select | Transform) for a in g.out_arcs(name)):
            # the hop: the space is an event log of its own, written once and read by its out-arcs
            path = str(tmp / name)
            space.write.mode("overwrite").parquet(path)
            space = space.sparkSession.read.parquet(path)
        spaces[name] = space
    subscription = {
        s.name
        for s in g.spaces
        if isinstance(s, EventSpace)
        and (s.is_subscription or any(a.kind == "collapse" for a in g.out_arcs(s.name)))
    }
    for name in subscription:
        if name in spaces:
            counts[name] = _count(spaces[name])
    shutil.rmtree(tmp, ignore_errors=True)
    return counts


def _union(frames: list[DataFrame]) -> DataFrame:
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


def _timed(fn: Callable[[], dict[str, int]], rounds: int) -> tuple[float, dict[str, int]]:
    best = float("inf")
    counts: dict[str, int] = {}
    for _ in range(rounds):
        t0 = time.perf_counter()
        counts = fn()
        best = min(best, time.perf_counter() - t0)
    return best, counts


def plans(spark: SparkSession, *, events: int, seed: int, rounds: int) -> dict[str, Any]:
    g = load_spec(STOCKS)
    df = _input_frame(spark, g, events, seed)

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


def _run_flow(
    spark: SparkSession, g: Graph, events: list[tuple[str, dict[str, Any]]], **kw: Any
) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="flowbus-bench-run-"))
    try:
        flow = SparkFlow(spark, g, out, **kw)
        flow.ingest_generator(events, fingerprint="bench")
        t0 = time.perf_counter()
        with flow:
            flow.start()
            flow.process_available()
        seconds = time.perf_counter() - t0
        delivered = dict(flow.stats.out)
        batches = flow.stats.batches
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {
        "seconds": seconds,
        "events_per_s": len(events) / seconds,
        "micro_batches": batches,
        "out": delivered,
    }


def engine(spark: SparkSession, *, events: int, batch_events: int, seed: int) -> dict[str, Any]:
    g = load_spec(STOCKS)
    result = _run_flow(spark, g, list(generate(g, events=events, seed=seed)), batch_events=batch_events)
    return {"events": events, "batch_events": batch_events, **result}


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


def collapse(spark: SparkSession, *, events: int, batch_events: int, keys: int, seed: int) -> dict[str, Any]:
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
        "transform_with_state": state,
        "aggregate": aggregate,
        "ratio_aggregate_over_state": aggregate["events_per_s"] / state["events_per_s"],
    }


def run(
    spark: SparkSession,
    *,
    events: int = 100_000,
    engine_events: int = 20_000,
    batch_events: int = 5_000,
    rounds: int = 3,
    seed: int = 1,
    progress: Progress | None = None,
) -> dict[str, Any]:
    steps = 3
    if progress:
        progress("stock flow: rewritten vs hop by hop", 0, steps)
    doc: dict[str, Any] = {"plans": plans(spark, events=events, seed=seed, rounds=rounds)}
    if progress:
        progress("stock flow: rewritten vs hop by hop", 1, steps)
    doc["engine"] = engine(spark, events=engine_events, batch_events=batch_events, seed=seed)
    if progress:
        progress("stock flow: rewritten vs hop by hop", 2, steps)
    doc["collapse"] = collapse(spark, events=engine_events, batch_events=batch_events, keys=500, seed=seed)
    if progress:
        progress("stock flow: rewritten vs hop by hop", 3, steps)
    return doc
