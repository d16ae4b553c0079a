"""The stateless part of a flow over one batch DataFrame, two ways: its rewrite and the original
graph hop by hop (the baseline ``flowbus bench spark`` measures the rewrite against, as
:func:`flowbus.spark.bulk.join_baseline` is for bulk matching).

How it works (the 000 document, section 4.1: the rewrite to ``[select; transform]``):

* :func:`input_frame` -- the published events, written once as the engine's input log
  (:class:`flowbus.flow.eventlog.InputLog`) and read back as one cached DataFrame.
* :func:`rewritten_plan` -- each subscription point (and each space feeding a collapse) from
  its routes: one filter and one projection of the publication point's rows per path
  (:func:`flowbus.spark.routes.route_columns`).
* :func:`hop_plan` -- the original graph walked arc by arc; each internal space with out-arcs
  (``combined``, ``capital`` in the stock flow) is an event log of its own, written once
  (Parquet) and read by its out-arcs: what an engine that does not rewrite keeps between hops.

Both count the events each point receives (the same counts, under the rewrite's names).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from flowbus.flow import Graph, rewrite
from flowbus.flow.eventlog import InputLog
from flowbus.flow.generators import generate
from flowbus.flow.graph import EventSpace, Route, Select, Transform
from flowbus.flow.plan import INPUT, plan
from flowbus.spark.bus import spark_type
from flowbus.spark.columns import ColumnCompiler
from flowbus.spark.groups import log_schema
from flowbus.spark.routes import route_columns

__all__ = ["hop_plan", "input_frame", "rewritten_plan"]


def input_frame(spark: SparkSession, g: Graph, *, events: int, seed: int) -> DataFrame:
    """``events`` generated events as one cached DataFrame in the input log's layout (``_point``,
    ``e<i>``)."""
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
