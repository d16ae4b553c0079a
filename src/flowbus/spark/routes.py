"""The ``[S; T]`` routes leaving one publication point, applied to a DataFrame of its events.

How it works: a rewritten graph (:func:`flowbus.flow.rewrite.rewrite`) labels
every path from a publication point to a subscription point with one
:class:`~flowbus.flow.graph.Route`: a select filter, then the outputs (target
field -> expression), with the expressions the composed transforms required to
be defined. For each route, :func:`apply_routes` keeps the rows where

* the select holds (:func:`flowbus.spark.columns.filter_to_column`),
* every required expression and every output is defined (as
  :meth:`flowbus.filters.compile.Compiler.transform` drops an event on which one is
  undefined -- a lookup miss, a division by zero),

and projects the outputs. Routes to the same target (fan-out, then fan-in)
are unioned: the event arrives once per route, as in the local interpreter.
All the routes of one source read the same DataFrame; subexpressions they share
(``NYS(issue)`` in several routes) are left to Catalyst, which evaluates each
plan's projections over one scan.

An engine reading an event log (the rows of several points, ``_point`` and a
struct column per point) gives :func:`scan_branches` the :class:`Branch` of
each point's events bound for one target: those of distinct points are read
in one pass (one filter, ``CASE _point`` per column), not one scan each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from flowbus.errors import UserError
from flowbus.flow.graph import Route
from flowbus.spark.columns import ColumnCompiler, FunctionsLike, parts_defined, schema_types

__all__ = ["Branch", "apply_routes", "route_columns", "scan_branches"]


def route_columns(route: Route, compiler: ColumnCompiler) -> tuple[Column, list[Column]]:
    """The condition a row must meet to take ``route``, and the output columns (aliased)."""
    conditions = [compiler.filter(route.select)]
    conditions += [compiler.defined(e) for e in route.requires]
    outputs: list[Column] = []
    for name, e in route.outputs:
        parts = compiler.value(e)
        conditions.append(parts_defined(parts))
        outputs.append(compiler.single(parts, e).alias(name))
    cond = conditions[0]
    for c in conditions[1:]:
        cond = cond & c
    return cond, outputs


def apply_routes(df: DataFrame, routes: Sequence[Route], *, functions: FunctionsLike) -> dict[str, DataFrame]:
    """Target -> the rows ``df`` (the events of the routes' one source) delivers there.

    ``functions`` resolves lookup tables (pass ``graph.all_functions``); a route
    calling a Python callable raises
    :class:`~flowbus.spark.columns.ColumnUnsupported` naming the function.
    """
    sources = sorted({r.source for r in routes})
    if len(sources) > 1:
        raise UserError(f"apply_routes takes the routes of one source, got routes from {sources}")
    compiler = ColumnCompiler(functions, schema_types(df.schema))
    out: dict[str, DataFrame] = {}
    for route in routes:
        cond, outputs = route_columns(route, compiler)
        rows = df.where(cond).select(*outputs)
        prev = out.get(route.target)
        out[route.target] = rows if prev is None else prev.unionByName(rows)
    return out


@dataclass(frozen=True)
class Branch:
    """A point's events that go somewhere: the rows of ``point`` where ``cond`` holds (all if None),
    as ``columns`` (name -> column over the log's columns)."""

    point: str
    cond: Column | None
    columns: dict[str, Column]

    @staticmethod
    def of(point: str, route: Route, cond: Column, columns: list[Column]) -> Branch:
        """The branch of ``route`` (its columns from :meth:`SparkFlow._route_columns`)."""
        names = ["_order", *(n for n, _ in route.outputs)]
        return Branch(point, cond, dict(zip(names, columns, strict=True)))


def scan_branches(df: DataFrame, branches: Sequence[Branch]) -> DataFrame:
    """The rows of ``branches`` over log rows ``df``, in as few passes over ``df`` as the points allow.

    Branches of distinct points become one pass: each row is of one point, so
    one filter (its point's condition) and one projection (each column the
    branch of the row's point: ``CASE _point``) serve them all -- where a
    union would scan the micro-batch once per branch. Branches of one point
    (several routes to one target) go to further passes, unioned.
    """
    passes: list[list[Branch]] = []
    for b in branches:
        free = next((p for p in passes if all(_apart(o, b) for o in p)), None)
        if free is None:
            passes.append([b])
        else:
            free.append(b)
    return _union([_one_pass(df, p) for p in passes])


def _apart(a: Branch, b: Branch) -> bool:
    """Can ``a`` and ``b`` share a pass: other points, the same columns?"""
    return a.point != b.point and a.columns.keys() == b.columns.keys()


def _one_pass(df: DataFrame, branches: list[Branch]) -> DataFrame:
    def at(b: Branch) -> Column:
        here = F.col("_point") == F.lit(b.point)
        return here if b.cond is None else here & b.cond

    if len(branches) == 1:
        return df.where(at(branches[0])).select(*branches[0].columns.values())
    columns = []
    first, *rest = branches
    for name in first.columns:
        case = F.when(F.col("_point") == F.lit(first.point), first.columns[name])
        for b in rest:
            case = case.when(F.col("_point") == F.lit(b.point), b.columns[name])
        columns.append(case.alias(name))
    return df.where(reduce(lambda a, b: a | b, (at(b) for b in branches))).select(*columns)


def _union(frames: Sequence[DataFrame]) -> DataFrame:
    return reduce(DataFrame.unionByName, frames)
