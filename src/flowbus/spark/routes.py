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
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame

from flowbus.errors import FlowbusError
from flowbus.flow.graph import Route
from flowbus.spark.columns import ColumnCompiler, FunctionsLike, parts_defined, schema_types

__all__ = ["apply_routes", "route_columns"]


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
        raise FlowbusError(f"apply_routes takes the routes of one source, got routes from {sources}")
    compiler = ColumnCompiler(functions, schema_types(df.schema))
    out: dict[str, DataFrame] = {}
    for route in routes:
        cond, outputs = route_columns(route, compiler)
        rows = df.where(cond).select(*outputs)
        prev = out.get(route.target)
        out[route.target] = rows if prev is None else prev.unionByName(rows)
    return out
