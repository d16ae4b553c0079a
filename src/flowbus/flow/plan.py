"""How a rewritten graph runs as streams: event logs, stateless deliveries and stateful groups.

How it works: an engine that runs a graph as a set of streaming queries (the
Spark engine, :mod:`flowbus.spark.flow`) needs to know which events flow
where, with no Spark in sight -- this module is that part, and is tested on
its own.

* An *event log* is an append-only table of events of several publication
  points, each row one event: ``_point`` (the point's name), ``_order`` (its
  position in the run, a list of integers compared lexicographically) and one
  struct column per point (``e0``, ``e1``, ...) holding the event's fields
  (null for the other points). The ``input`` log holds the events published
  at the rewritten graph's publication points, ``_order = [seq]`` with
  ``seq`` the ingestion sequence. Each stateful group writes one derived log:
  the events its expand arcs deliver.
* A *stateful group* is the collapse arcs that read one space with the same
  key expressions (so one keyed operator folds them all). It is fed by the
  routes into that space (or, when the space is itself a point of a log, by
  that point's events) and all its feeds come from one log.
* Per log, the *deliveries*: every point of the log that is a subscription
  point is recorded as is, and every route from a point of the log to a
  subscription point delivers there.

``_order`` extends along the path an event takes, which is how per-key order
survives the shuffles: a route appends its position among its source's
out-arcs; a collapse group appends the collapse arc's position in the group
and the index of the event in the expansion it caused. Sorted by ``_order``,
the events of a subscription point come in the order the reference
interpreter (:mod:`flowbus.flow.local`) delivers them: depth first, event by
event.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flowbus.errors import FlowError
from flowbus.filters.ast import Expr
from flowbus.flow.graph import Collapse, EventSpace, Expand, Graph, Route

__all__ = ["INPUT", "FlowPlan", "Log", "StatefulGroup", "plan"]

INPUT = "input"
"""The name of the log of published events."""


@dataclass(frozen=True, slots=True)
class Log:
    """An event log: its name and the points whose events it carries (struct column ``e<i>``)."""

    name: str
    points: tuple[str, ...]

    def column(self, point: str) -> str:
        return f"e{self.points.index(point)}"


@dataclass(frozen=True, slots=True)
class Feed:
    """How events reach a stateful group's space: a route from ``point``, or the point itself."""

    point: str
    route: Route | None
    position: int  # the route's position among the point's out-arcs (appended to _order)


@dataclass(frozen=True, slots=True)
class StatefulGroup:
    """Collapse arcs out of ``space`` sharing ``key``, fed from log ``log_in``, writing log ``log_out``.

    Groups are named ``g0``, ``g1``, ... in graph order; a group's log has its name.
    """

    name: str
    space: str
    collapses: tuple[Collapse, ...]
    key: tuple[tuple[str, Expr], ...]
    feeds: tuple[Feed, ...]
    log_in: str
    log_out: str
    targets: tuple[str, ...]  # the expand arcs' targets: the points of log_out
    aggregate: bool = False  # folded by the engine's built-in aggregation (see plan's ``aggregate``)


@dataclass(frozen=True, slots=True)
class FlowPlan:
    graph: Graph  # rewritten
    logs: tuple[Log, ...]
    groups: tuple[StatefulGroup, ...]
    recorded: tuple[str, ...]  # the subscription points, in graph order

    def log(self, name: str) -> Log:
        for log in self.logs:
            if log.name == name:
                return log
        raise KeyError(name)

    def deliveries(self, log: Log) -> list[tuple[str, list[tuple[int, Route]]]]:
        """Per point of ``log``: its routes (with their positions) to subscription points."""
        out = []
        for point in log.points:
            routes = [
                (i, a)
                for i, a in enumerate(self.graph.out_arcs(point))
                if isinstance(a, Route) and a.target in self.recorded
            ]
            out.append((point, routes))
        return out

    def levels(self) -> list[list[str]]:
        """The logs in dependency order: a log's stateful groups write logs of a later level."""
        level = {INPUT: 0}
        pending = list(self.groups)
        while pending:
            progressed = False
            for g in list(pending):
                if g.log_in in level:
                    level[g.log_out] = level[g.log_in] + 1
                    pending.remove(g)
                    progressed = True
            if not progressed:  # pragma: no cover - validation forbids cycles through state
                raise FlowError("the stateful groups of this graph form a cycle")
        out: list[list[str]] = [[] for _ in range(max(level.values()) + 1)]
        for log in self.logs:
            out[level[log.name]].append(log.name)
        return out


def _input_points(g: Graph) -> tuple[str, ...]:
    return tuple(s.name for s in g.spaces if isinstance(s, EventSpace) and s.is_publication)


def plan(g: Graph, aggregate: Callable[[Collapse], bool] | None = None) -> FlowPlan:
    """The logs, stateful groups and deliveries of the rewritten graph ``g``.

    ``aggregate`` says which collapses an engine folds with its built-in
    aggregation: they are grouped apart from the others (``aggregate=True``).
    """
    recorded = tuple(s.name for s in g.spaces if isinstance(s, EventSpace) and s.is_subscription)
    logs = [Log(INPUT, _input_points(g))]
    groups: list[StatefulGroup] = []
    # collapse arcs grouped by (space, key); each group writes one derived log
    by_space: dict[tuple[str, tuple[tuple[str, Expr], ...], bool], list[Collapse]] = {}
    for arc in g.arcs:
        if isinstance(arc, Collapse):
            flag = aggregate is not None and aggregate(arc)
            by_space.setdefault((arc.source, tuple(arc.rules.key), flag), []).append(arc)
    pending = list(by_space.items())
    placed: dict[str, str] = {p: INPUT for p in logs[0].points}
    while pending:
        progressed = False
        for (space, key, flag), collapses in list(pending):
            feeds = _feeds(g, space)
            if not all(f.point in placed for f in feeds):
                continue
            sources = sorted({placed[f.point] for f in feeds})
            if len(sources) > 1:
                raise FlowError(
                    f"space {space!r} is fed from events of several stages ({', '.join(sources)}): "
                    "the Spark engine folds a collapse from one event log"
                )
            name = f"g{len(groups)}"
            targets = tuple(
                dict.fromkeys(
                    e.target for c in collapses for e in g.out_arcs(c.target) if isinstance(e, Expand)
                )
            )
            log_in = sources[0] if sources else INPUT
            groups.append(
                StatefulGroup(name, space, tuple(collapses), key, feeds, log_in, name, targets, flag)
            )
            logs.append(Log(name, targets))
            for t in targets:
                placed.setdefault(t, name)
            pending.remove(((space, key, flag), collapses))
            progressed = True
        if not progressed:
            stuck = ", ".join(sorted({s for (s, _, _), _ in pending}))
            raise FlowError(f"the collapses out of {stuck} are fed by events that never arrive")
    return FlowPlan(g, tuple(logs), tuple(groups), recorded)


def _feeds(g: Graph, space: str) -> tuple[Feed, ...]:
    feeds: list[Feed] = []
    sp = g.space(space)
    if isinstance(sp, EventSpace) and (
        sp.is_publication or any(isinstance(a, Expand) for a in g.in_arcs(space))
    ):
        feeds.append(Feed(space, None, -1))
    for arc in g.in_arcs(space):
        if isinstance(arc, Route):
            position = g.out_arcs(arc.source).index(arc)
            feeds.append(Feed(arc.source, arc, position))
    return tuple(feeds)
