"""The Information Flow Graph as immutable data (000 document, section 2).

How it works: a :class:`Graph` is a tuple of information spaces and a tuple of
arcs, checked when it is built (:mod:`flowbus.flow.validate`), so a Graph that
exists is a valid one. Spaces are

* :class:`EventSpace` -- an event history with a schema. ``kind`` is
  ``source`` (a publication point: only out-arcs), ``sink`` (a subscription
  point: only in-arcs) or ``events`` (internal; ``publish`` / ``subscribe``
  make it a publication / subscription point as well);
* :class:`StateSpace` -- a keyed relation with a schema, one key component or
  more, and the initial values of the other components.

Arcs are :class:`Select` (a filter; keeps the schema), :class:`Transform`
(target field -> expression over the source's fields), :class:`Collapse` and
:class:`Expand` (a :class:`~flowbus.flow.collapse.RuleSet`), and
:class:`Route` -- the ``[S; T]`` arc the rewrite produces (a select, then a
transform, with the expressions whose definedness the composed transforms
required). Several arcs into one event space merge; several out of one replicate.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from flowbus.errors import FlowError
from flowbus.filters.ast import Expr, Field, Filter
from flowbus.filters.text import expr_to_text
from flowbus.flow.collapse import RuleSet
from flowbus.flow.infer import with_builtins
from flowbus.model import Schema, Value

__all__ = [
    "Arc",
    "Collapse",
    "EventSpace",
    "Expand",
    "Graph",
    "InputSpec",
    "Route",
    "Select",
    "Space",
    "StateSpace",
    "Transform",
    "outputs_text",
]

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.(pub|sub))?")
SpaceKind = Literal["source", "sink", "events"]
Outputs = tuple[tuple[str, Expr], ...]


def _check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise FlowError(
            f"{what} name {name!r} is not a name (letters, digits and _, not starting with a digit)"
        )


@dataclass(frozen=True, slots=True)
class EventSpace:
    name: str
    schema: Schema
    kind: SpaceKind = "events"
    publish: bool = False
    subscribe: bool = False

    def __post_init__(self) -> None:
        _check_name(self.name, "space")
        if self.kind not in ("source", "sink", "events"):
            raise FlowError(
                f"space {self.name!r}: unknown kind {self.kind!r} (source, sink, events or state)"
            )
        if not self.schema.fields:
            raise FlowError(f"space {self.name!r}: the schema has no fields")
        if self.kind == "sink" and self.publish:
            raise FlowError(f"space {self.name!r}: a sink is not a publication point (use kind: events)")
        if self.kind == "source" and self.subscribe:
            raise FlowError(f"space {self.name!r}: a source is not a subscription point (use kind: events)")

    @property
    def is_publication(self) -> bool:
        return self.kind == "source" or self.publish

    @property
    def is_subscription(self) -> bool:
        return self.kind == "sink" or self.subscribe


@dataclass(frozen=True, slots=True)
class StateSpace:
    name: str
    schema: Schema
    key: tuple[str, ...]
    initial: tuple[tuple[str, Value], ...]

    def __post_init__(self) -> None:
        _check_name(self.name, "space")
        object.__setattr__(self, "key", tuple(self.key))
        object.__setattr__(self, "initial", tuple(self.initial))
        where = f"state {self.name!r}"
        if not self.key:
            raise FlowError(f"{where}: no key (name the schema fields that identify a row)")
        for k in self.key:
            if k not in self.schema:
                raise FlowError(f"{where}: key {k!r} is not in the schema ({', '.join(self.schema)})")
        if len(set(self.key)) != len(self.key):
            raise FlowError(f"{where}: a key component is named twice")
        if not self.components:
            raise FlowError(f"{where}: every schema field is in the key: the state has nothing to hold")
        given = dict(self.initial)
        for name in given:
            if name in self.key:
                raise FlowError(f"{where}: initial value for key component {name!r} (keys have none)")
            if name not in self.schema:
                raise FlowError(f"{where}: initial value for {name!r}, which is not in the schema")
        missing = [c for c in self.components if c not in given]
        if missing:
            raise FlowError(f"{where}: no initial value for {', '.join(missing)}")
        try:
            self.schema.validate({**{k: _example(self.schema.type_of(k)) for k in self.key}, **given})
        except Exception as exc:
            raise FlowError(f"{where}: initial values: {exc}") from None

    @property
    def components(self) -> tuple[str, ...]:
        """The non-key fields, in schema order (the layout of a row)."""
        return tuple(n for n in self.schema if n not in self.key)


_EXAMPLES: dict[type, Value] = {str: "", int: 0, float: 0.0, bool: False}


def _example(kind: type) -> Value:
    return _EXAMPLES[kind]


Space = EventSpace | StateSpace


@dataclass(frozen=True, slots=True)
class Select:
    name: str
    source: str
    target: str
    filter: Filter
    kind = "select"


@dataclass(frozen=True, slots=True)
class Transform:
    name: str
    source: str
    target: str
    outputs: Outputs
    kind = "transform"

    def __post_init__(self) -> None:
        object.__setattr__(self, "outputs", tuple(self.outputs))


@dataclass(frozen=True, slots=True)
class Route:
    """``[S; T]``: events passing ``select`` are transformed by ``outputs`` (all of ``requires`` defined)."""

    name: str
    source: str
    target: str
    select: Filter
    outputs: Outputs
    requires: tuple[Expr, ...] = ()
    via: tuple[str, ...] = ()
    kind = "route"

    def __post_init__(self) -> None:
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "requires", tuple(self.requires))
        object.__setattr__(self, "via", tuple(self.via))


@dataclass(frozen=True, slots=True)
class Collapse:
    name: str
    source: str
    target: str
    rules: RuleSet
    kind = "collapse"


@dataclass(frozen=True, slots=True)
class Expand:
    name: str
    source: str
    target: str
    rules: RuleSet
    kind = "expand"


Arc = Select | Transform | Route | Collapse | Expand
STATELESS = (Select, Transform, Route)


def outputs_text(inputs: tuple[str, ...] | list[str], outputs: Outputs) -> str:
    """``[issue, price, vol] => [com=NYS(issue), cap=price * vol]`` (a field kept as is prints bare)."""
    outs = ", ".join(n if e == Field(n) else f"{n}={expr_to_text(e)}" for n, e in outputs)
    return f"[{', '.join(inputs)}] => [{outs}]"


@dataclass(frozen=True, slots=True)
class InputSpec:
    """Where ``flowbus run`` gets events: a named generator (see :mod:`flowbus.flow.generators`)."""

    generator: str
    events: int = 10_000
    seed: int = 1
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if type(self.events) is not int or self.events < 0:
            raise FlowError(f"input: events must be a non-negative integer, got {self.events!r}")
        if type(self.seed) is not int:
            raise FlowError(f"input: seed must be an integer, got {self.seed!r}")
        object.__setattr__(self, "options", tuple(dict(self.options).items()))


@dataclass(frozen=True, slots=True)
class Graph:
    """An information flow graph; validated on construction (raises :class:`FlowError`)."""

    spaces: tuple[Space, ...]
    arcs: tuple[Arc, ...]
    functions: Mapping[str, Callable[..., Any] | Mapping[Any, Any]] = field(
        default_factory=dict, compare=False
    )
    name: str = "flow"
    input: InputSpec | None = None
    _spaces: Mapping[str, Space] = field(init=False, repr=False, compare=False)
    _arcs: Mapping[str, Arc] = field(init=False, repr=False, compare=False)
    _out: Mapping[str, tuple[Arc, ...]] = field(init=False, repr=False, compare=False)
    _in: Mapping[str, tuple[Arc, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        from flowbus.flow.validate import validate_graph

        object.__setattr__(self, "spaces", tuple(self.spaces))
        object.__setattr__(self, "arcs", tuple(self.arcs))
        object.__setattr__(self, "functions", MappingProxyType(dict(self.functions)))
        spaces: dict[str, Space] = {}
        for s in self.spaces:
            if s.name in spaces:
                raise FlowError(f"space {s.name!r} is defined twice")
            spaces[s.name] = s
        arcs: dict[str, Arc] = {}
        for a in self.arcs:
            if a.name in arcs:
                raise FlowError(f"arc {a.name!r} is defined twice")
            arcs[a.name] = a
        out: dict[str, list[Arc]] = {n: [] for n in spaces}
        into: dict[str, list[Arc]] = {n: [] for n in spaces}
        for a in self.arcs:
            out.setdefault(a.source, []).append(a)
            into.setdefault(a.target, []).append(a)
        object.__setattr__(self, "_spaces", MappingProxyType(spaces))
        object.__setattr__(self, "_arcs", MappingProxyType(arcs))
        object.__setattr__(self, "_out", MappingProxyType({k: tuple(v) for k, v in out.items()}))
        object.__setattr__(self, "_in", MappingProxyType({k: tuple(v) for k, v in into.items()}))
        validate_graph(self)

    def __reduce__(self) -> tuple[Any, ...]:
        # shipped to Spark executors pickled; the read-only views are rebuilt on arrival
        return (Graph, (self.spaces, self.arcs, dict(self.functions), self.name, self.input))

    @property
    def all_functions(self) -> dict[str, Any]:
        """The graph's functions and lookup tables, with the built-ins (max, min, abs)."""
        return with_builtins(self.functions)

    def has_space(self, name: str) -> bool:
        return name in self._spaces

    def space(self, name: str) -> Space:
        try:
            return self._spaces[name]
        except KeyError:
            from flowbus.flow.infer import hint

            raise FlowError(
                f"unknown space {name!r}{hint(name, self._spaces)} (spaces: {', '.join(self._spaces)})"
            ) from None

    def event_space(self, name: str) -> EventSpace:
        s = self.space(name)
        if not isinstance(s, EventSpace):
            raise FlowError(f"space {name!r} is a state, not an event history")
        return s

    def state_space(self, name: str) -> StateSpace:
        s = self.space(name)
        if not isinstance(s, StateSpace):
            raise FlowError(f"space {name!r} is an event history, not a state")
        return s

    def arc(self, name: str) -> Arc:
        try:
            return self._arcs[name]
        except KeyError:
            raise FlowError(f"unknown arc {name!r} (arcs: {', '.join(self._arcs)})") from None

    def out_arcs(self, name: str) -> tuple[Arc, ...]:
        return self._out.get(name, ())

    def in_arcs(self, name: str) -> tuple[Arc, ...]:
        return self._in.get(name, ())
