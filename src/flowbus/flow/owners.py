"""What an owner runs for a stateful group of a deployed flow: its folds and their outputs.

How it works (the group, its feeds and partitions: :mod:`flowbus.flow.deploy`): a
:class:`Group` folds a feed's input for its key into each of its collapses' rows. Each
:class:`Fold` steps its row with its rule set written out as one compiled function
(:mod:`flowbus.flow.rulecode`), exactly as the interpreter's :meth:`BoundRules.step`; when the
row changes, each expand arc out of its state (an :class:`Output`) says what it publishes.
The owner's subscriber had the row before the change, so an arc that replays its collapse
sends the cause itself, and one whose first rule writes any row in one event the event read
off the new row (:attr:`~flowbus.flow.expand.Expander.goal_event`); any other asks the
:class:`~flowbus.flow.local.Deliverer` (the A* search). A late subscriber's
:meth:`Group.snapshot` is the shortest sequence from the initial row, per arc.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flowbus.errors import Undefined
from flowbus.filters.compile import ALWAYS
from flowbus.flow.collapse import BoundRules, Key, Row
from flowbus.flow.expand import expander
from flowbus.flow.graph import Collapse, Expand, Graph
from flowbus.flow.local import Deliverer
from flowbus.flow.rulecode import KeyFn, StepFn, projection

__all__ = ["BusFeed", "Fold", "Group", "Output"]


@dataclass(frozen=True, slots=True)
class Output:
    """A state's expand arc: what the owner publishes on each change of a row. The owner's
    subscriber had the row before the change, so an arc that replays its collapse sends the
    cause itself and one whose first rule writes any row in one event (``off_goal``) the
    event read off the new row: what :meth:`Deliverer.events` answers, without its calls."""

    deliverer: Deliverer
    space: str  # the bus space it publishes into
    arc: str = ""
    off_goal: Callable[[Key, Row], Mapping[str, Any] | None] | None = None  # Expander.goal_event
    project: Callable[[Row], Row] | None = None  # the state's columns it tracks (None: all of them)
    fields: frozenset[str] = frozenset()  # a replaying arc's event fields

    def events(self, key: Key, old: Row, new: Row, cause: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
        """What the arc publishes when the row of ``key`` goes from ``old`` to ``new``."""
        project = self.project
        if project is None:
            had, goal = old, new
        else:
            had, goal = project(old), project(new)
        if goal == had:
            return ()
        fields = self.fields
        if fields and fields <= cause.keys():
            return (cause if len(cause) == len(fields) else {f: cause[f] for f in self.deliverer.fields},)
        if self.off_goal is not None:
            ev = self.off_goal(key, goal)
            if ev is not None:
                return (ev,)
        return self.deliverer.search(key, had, goal).events

    @staticmethod
    def of(rw: Graph, e: Expand, collapse: Collapse, space: str) -> Output:
        """The expand arc ``e`` out of ``collapse``'s state, into bus space ``space``, as owners run it."""
        d = Deliverer(rw, e, collapse)
        return Output(
            d, space, e.name,
            None if d.shortcut else expander(d.bound).goal_event,
            None if d.whole else projection(d.index),
            frozenset(d.fields) if d.shortcut else frozenset(),
        )  # fmt: skip


Event = Mapping[str, Any]
TestFn = Callable[[Event, Any], bool]
TransformFn = Callable[[Event, Any], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class BusFeed:
    """How events of bus space ``space`` reach a group: ``[S; T]`` (none: as they are)."""

    index: int
    space: str
    field: str  # the hidden field carrying the key's hash
    select: TestFn
    transform: TransformFn
    new_memo: Callable[[], Any]
    arcs: tuple[str, ...] = ()  # its route's name, then the arcs of the graph it stands for

    def input(self, event: Event) -> Mapping[str, Any] | None:
        """The event the group folds for ``event`` (None: the feed's select or transform drops it)."""
        memo = self.new_memo()
        if self.select is not ALWAYS and not self.select(event, memo):
            return None
        try:
            return self.transform(event, memo)
        except Undefined:
            return None


@dataclass(frozen=True, slots=True)
class Fold:
    """One collapse arc of a group, into ``state``, and the expand arcs out of that state;
    ``step``: its rules as one compiled function (:mod:`flowbus.flow.rulecode`)."""

    arc: str
    state: str
    bound: BoundRules
    outputs: tuple[Output, ...]
    step: StepFn


@dataclass(frozen=True)
class Group:
    """A stateful group: the collapses reading one space with one key, partitioned by hash."""

    name: str
    flow: str
    feeds: tuple[BusFeed, ...]
    folds: tuple[Fold, ...]
    counts: dict[str, int] = field(default_factory=dict, compare=False)  # (the deployment's)
    key_fn: KeyFn | None = field(default=None, compare=False)  # the first fold's key, compiled

    def key_of(self, event: Mapping[str, Any]) -> Key | None:
        try:
            return (self.key_fn or self.folds[0].bound.key_of)(event)
        except Undefined:
            return None

    def snapshot(self, key: Key, rows: Mapping[str, Row]) -> list[tuple[str, dict[str, Any]]]:
        """What a subscriber that has seen nothing needs of ``key`` to reach ``rows`` (per state):
        per expand arc, the shortest sequence from the initial row (A*)."""
        out: list[tuple[str, dict[str, Any]]] = []
        for f in self.folds:
            row = rows.get(f.state)
            if row is None:
                continue
            for o in f.outputs:
                d = o.deliverer
                goal = d.project(row)
                start = d.project(f.bound.initial)
                if goal != start:
                    out.extend((o.space, dict(ev)) for ev in d.search(key, start, goal).events)
        return out
