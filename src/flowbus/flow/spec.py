"""Flow specs: the YAML format and the equivalent Python builder (000 document, section 2).

How it works: :class:`FlowBuilder` collects spaces, lookup tables, rule sets and
arcs -- each call checks its own piece (an expression that does not parse is
reported with the arc and output it belongs to) -- and :meth:`FlowBuilder.build`
makes the :class:`~flowbus.flow.graph.Graph`, which validates the whole.
:func:`load_spec` reads a YAML file into the same builder calls, so both ways
give the same graph and the same errors, prefixed by the file name. The format
(every key; see docs/flow.md)::

    name: stocks
    lookups:                     # tables callable as NAME(x): a file, file#table, or inline
      NYS: lookups.yaml#NYS
    spaces:
      NYSE: {kind: source, schema: {issue: str, price: float, vol: int}}
      combined: {kind: events, schema: {...}, publish: true, subscribe: true}
      max_cur: {kind: state, schema: {...}, key: [name], initial: {maxP: 0, curP: 0}}
      alerts: {kind: events, schema: {...}, subscribe: true, class: secure}  # brokers: only
                                 # over mutual-TLS links (docs/security.md); normal by default
    rulesets:
      max_cur:
        key: {name: name}        # state key component: event expression (or a list of shared names)
        rules:
          - {when: "price > maxP", set: {maxP: price, curP: price}}
          - {set: {curP: price}}
    arcs:
      - {name: T1, from: NYSE, to: combined, transform: {com: NYS(issue), price: price, vol: vol}}
      - {name: S1, from: capital, to: big_trades, select: "cap >= 1000000"}
      - {name: C4, from: ticks, to: max_cur, collapse: max_cur}      # a rule set's name, or inline
      - {name: E4, from: max_cur, to: compressed, expand: max_cur}
    input: {generator: stocks, events: 10000, seed: 1, options: {}}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from flowbus.errors import FlowbusError, FlowError
from flowbus.filters.ast import Const, Expr, Filter
from flowbus.filters.expr import parse_expression
from flowbus.filters.parser import parse
from flowbus.flow.collapse import Rule, RuleSet
from flowbus.flow.graph import (
    Arc,
    Collapse,
    EventSpace,
    Expand,
    Graph,
    InputSpec,
    Select,
    Space,
    StateSpace,
    Transform,
)
from flowbus.model import Schema, Value

__all__ = ["FlowBuilder", "graph_from_spec", "load_spec", "lookup_table", "read_spec", "space_classes"]

SchemaLike = Schema | Mapping[str, Any]
ExprLike = str | Expr | Value
RulesLike = RuleSet | str | Mapping[str, Any]


def expression(value: object, where: str) -> Expr:
    """An expression from spec text, a constant, or an Expr; :class:`FlowError` naming ``where``."""
    if isinstance(value, str):
        try:
            return parse_expression(value)
        except FlowbusError as exc:
            raise FlowError(f"{where}: {exc}") from None
    if type(value) in (int, float, bool):
        try:
            return Const(value)  # type: ignore[arg-type]
        except FlowbusError as exc:
            raise FlowError(f"{where}: {exc}") from None
    if hasattr(value, "evaluate") and hasattr(value, "fields"):
        return value  # type: ignore[return-value]
    raise FlowError(f"{where}: {value!r} is not an expression (text like `price * vol`, or a constant)")


def condition(value: object, where: str) -> Filter:
    if isinstance(value, Filter):
        return value
    if isinstance(value, bool):
        return Filter.true() if value else Filter.false()
    if not isinstance(value, (str, list)):
        raise FlowError(f"{where}: {value!r} is not a filter")
    try:
        return parse(value)
    except FlowbusError as exc:
        raise FlowError(f"{where}: {exc}") from None


def _schema(value: SchemaLike, where: str) -> Schema:
    if isinstance(value, Schema):
        return value
    if not isinstance(value, Mapping) or not value:
        raise FlowError(
            f"{where}: schema must map field names to types (str, int, float, bool), got {value!r}"
        )
    try:
        return Schema.of(value)
    except FlowbusError as exc:
        raise FlowError(f"{where}: {exc}") from None


class FlowBuilder:
    """Build a :class:`Graph` in Python; each method returns the builder, so calls chain."""

    def __init__(self, name: str = "flow") -> None:
        self.name = name
        self._spaces: list[Space] = []
        self._arcs: list[Arc] = []
        self._functions: dict[str, Callable[..., Any] | Mapping[Any, Any]] = {}
        self._rulesets: dict[str, RuleSet] = {}
        self._input: InputSpec | None = None

    # ------------------------------------------------------------------ spaces

    def source(self, name: str, schema: SchemaLike) -> FlowBuilder:
        """A publication point: events come in here (only out-arcs)."""
        self._spaces.append(EventSpace(name, _schema(schema, f"space {name!r}"), "source"))
        return self

    def sink(self, name: str, schema: SchemaLike) -> FlowBuilder:
        """A subscription point: events end here (only in-arcs)."""
        self._spaces.append(EventSpace(name, _schema(schema, f"space {name!r}"), "sink"))
        return self

    def events(
        self, name: str, schema: SchemaLike, *, publish: bool = False, subscribe: bool = False
    ) -> FlowBuilder:
        """An internal event history; ``publish``/``subscribe`` make it a publication/subscription point."""
        for flag, value in (("publish", publish), ("subscribe", subscribe)):
            if not isinstance(value, bool):
                raise FlowError(f"space {name!r}: {flag} must be true or false, got {value!r}")
        where = f"space {name!r}"
        self._spaces.append(EventSpace(name, _schema(schema, where), "events", publish, subscribe))
        return self

    def state(
        self, name: str, schema: SchemaLike, *, key: str | Sequence[str], initial: Mapping[str, Value]
    ) -> FlowBuilder:
        """A keyed relation: ``key`` names the key fields, ``initial`` the other fields' starting values."""
        where = f"state {name!r}"
        keys = (key,) if isinstance(key, str) else tuple(key)
        if not isinstance(initial, Mapping):
            raise FlowError(f"{where}: initial must map components to values, got {initial!r}")
        self._spaces.append(StateSpace(name, _schema(schema, where), keys, tuple(initial.items())))
        return self

    # --------------------------------------------------------------- functions

    def lookup(self, name: str, table: Mapping[Any, Any]) -> FlowBuilder:
        """A lookup table, callable in expressions as ``NAME(x)``."""
        if not isinstance(table, Mapping):
            raise FlowError(f"lookup {name!r}: a table maps keys to values, got {type(table).__name__}")
        self._functions[name] = dict(table)
        return self

    def function(self, name: str, fn: Callable[..., Any]) -> FlowBuilder:
        """A Python function callable in expressions (it should be pure)."""
        if not callable(fn):
            raise FlowError(f"function {name!r} is not callable")
        self._functions[name] = fn
        return self

    def rules(
        self, name: str, *, key: str | Sequence[str] | Mapping[str, ExprLike], rules: Sequence[Any]
    ) -> RuleSet:
        """Define (and return) a named collapse rule set; ``rules`` are :class:`Rule` s or spec mappings."""
        ruleset = _make_ruleset(name, key, rules, f"rule set {name!r}")
        self._rulesets[name] = ruleset
        return ruleset

    def _ruleset(self, value: RulesLike, arc: str, where: str) -> RuleSet:
        if isinstance(value, RuleSet):
            return value
        if isinstance(value, str):
            if value not in self._rulesets:
                known = ", ".join(self._rulesets) or "none defined"
                raise FlowError(f"{where}: unknown rule set {value!r} (rule sets: {known})")
            return self._rulesets[value]
        if isinstance(value, Mapping):
            _only(value, {"key", "rules", "description"}, where, required=("key", "rules"))
            return _make_ruleset(arc, value["key"], value["rules"], where)
        raise FlowError(f"{where}: expected a rule set name or a mapping with key and rules, got {value!r}")

    # -------------------------------------------------------------------- arcs

    def select(self, name: str, source: str, target: str, filter: str | Filter) -> FlowBuilder:
        """Events of ``source`` that match ``filter`` go to ``target`` (same schema)."""
        self._arcs.append(Select(name, source, target, condition(filter, f"select arc {name!r}")))
        return self

    def transform(self, name: str, source: str, target: str, outputs: Mapping[str, ExprLike]) -> FlowBuilder:
        """Each event of ``source`` becomes ``{field: expression}`` in ``target``."""
        where = f"transform arc {name!r}"
        if not isinstance(outputs, Mapping) or not outputs:
            raise FlowError(f"{where}: outputs must map target fields to expressions, got {outputs!r}")
        outs = tuple((str(k), expression(v, f"{where}: output {k!r}")) for k, v in outputs.items())
        self._arcs.append(Transform(name, source, target, outs))
        return self

    def collapse(self, name: str, source: str, target: str, rules: RulesLike) -> FlowBuilder:
        """Fold the events of ``source`` into the state ``target`` with ``rules``."""
        self._arcs.append(
            Collapse(name, source, target, self._ruleset(rules, name, f"collapse arc {name!r}"))
        )
        return self

    def expand(self, name: str, source: str, target: str, rules: RulesLike) -> FlowBuilder:
        """Turn each change of the state ``source`` into the shortest event sequence into ``target``."""
        self._arcs.append(Expand(name, source, target, self._ruleset(rules, name, f"expand arc {name!r}")))
        return self

    def input(self, generator: str, *, events: int = 10_000, seed: int = 1, **options: Any) -> FlowBuilder:
        """The event generator ``flowbus run`` uses (see :mod:`flowbus.flow.generators`)."""
        self._input = InputSpec(generator, events, seed, tuple(options.items()))
        return self

    def build(self) -> Graph:
        return Graph(tuple(self._spaces), tuple(self._arcs), self._functions, self.name, self._input)


def _make_ruleset(name: str, key: object, rules: object, where: str) -> RuleSet:
    if isinstance(key, str):
        key = [key]
    if isinstance(key, Mapping):
        pairs = tuple((str(k), expression(v, f"{where}: key {k!r}")) for k, v in key.items())
    elif isinstance(key, Sequence) and key and all(isinstance(k, str) for k in key):
        pairs = tuple((k, expression(k, f"{where}: key {k!r}")) for k in key)
    else:
        raise FlowError(f"{where}: key must be a field name, a list of names, or a mapping, got {key!r}")
    if not isinstance(rules, Sequence) or isinstance(rules, str):
        raise FlowError(f"{where}: rules must be a list")
    built = tuple(
        r if isinstance(r, Rule) else _rule(r, f"{where}: rule {i}") for i, r in enumerate(rules, 1)
    )
    return RuleSet(name, pairs, built)


def _rule(value: object, where: str) -> Rule:
    if not isinstance(value, Mapping):
        raise FlowError(f"{where}: a rule is a mapping with `set` (and optionally `when`), got {value!r}")
    _only(value, {"when", "set", "description"}, where, required=("set",))
    sets = value["set"]
    if not isinstance(sets, Mapping):
        raise FlowError(f"{where}: set must map components to expressions, got {sets!r}")
    pairs = tuple((str(k), expression(v, f"{where}: set {k!r}")) for k, v in sets.items())
    when = condition(value["when"], f"{where}: when") if "when" in value else Filter.true()
    try:
        return Rule(pairs, when)
    except FlowError as exc:
        raise FlowError(f"{where}: {exc}") from None


def _only(d: Mapping[str, Any], allowed: set[str], where: str, *, required: Sequence[str] = ()) -> None:
    for key in d:
        if key not in allowed:
            raise FlowError(f"{where}: unknown key {key!r} (expected {', '.join(sorted(allowed))})")
    for key in required:
        if key not in d:
            raise FlowError(f"{where}: missing key {key!r}")


# ------------------------------------------------------------------- YAML


def read_spec(path: str | Path) -> Any:
    """The parsed YAML of a spec file; :class:`FlowError` naming the file if it cannot be read."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise FlowError(f"cannot read spec {str(p)!r}: {exc.strerror or exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise FlowError(f"{p}: not valid YAML{at}: {problem}") from None


def load_spec(path: str | Path) -> Graph:
    """The graph of a YAML spec file; :class:`FlowError` (naming the file and the culprit) if it is bad."""
    p = Path(path)
    data = read_spec(p)
    try:
        return graph_from_spec(data, base=p.parent)
    except FlowbusError as exc:
        raise FlowError(f"{p}: {exc}") from None


_TOP = {"name", "description", "lookups", "spaces", "rulesets", "arcs", "input"}
_SPACE = {"kind", "schema", "publish", "subscribe", "key", "initial", "description", "class"}
_CLASSES = ("normal", "secure")
_ARC_KINDS = ("select", "transform", "collapse", "expand")


def graph_from_spec(data: object, *, base: Path | None = None) -> Graph:
    """The graph of an already parsed spec (``base`` resolves lookup files)."""
    if not isinstance(data, Mapping):
        raise FlowError(f"a spec is a mapping with spaces and arcs, got {type(data).__name__}")
    _only(data, _TOP, "top level", required=("spaces", "arcs"))
    b = FlowBuilder(str(data.get("name", "flow")))
    for name, table in _mapping(data.get("lookups", {}), "lookups").items():
        b.lookup(str(name), lookup_table(table, f"lookup {name!r}", base or Path(".")))
    for name, spec in _mapping(data["spaces"], "spaces").items():
        _space(b, str(name), spec)
    for name, spec in _mapping(data.get("rulesets", {}), "rulesets").items():
        where = f"rule set {name!r}"
        spec = _mapping(spec, where)
        _only(spec, {"key", "rules", "description"}, where, required=("key", "rules"))
        b.rules(str(name), key=spec["key"], rules=spec["rules"])
    arcs = data["arcs"]
    if not isinstance(arcs, list):
        raise FlowError(f"arcs must be a list, got {type(arcs).__name__}")
    for i, spec in enumerate(arcs, 1):
        _arc(b, i, spec)
    if "input" in data:
        _input(b, _mapping(data["input"], "input"))
    return b.build()


def space_classes(data: Mapping[str, Any]) -> dict[str, str]:
    """The spaces of a (valid) parsed spec declared with a ``class``, and their class: the
    graph does not carry it; the brokers route such spaces by it."""
    spaces = data.get("spaces")
    if not isinstance(spaces, Mapping):
        return {}
    return {str(n): str(s["class"]) for n, s in spaces.items() if isinstance(s, Mapping) and "class" in s}


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise FlowError(f"{where} must be a mapping, got {type(value).__name__}")
    return value


def _space(b: FlowBuilder, name: str, spec: object) -> None:
    where = f"space {name!r}"
    spec = _mapping(spec, where)
    _only(spec, _SPACE, where, required=("kind", "schema"))
    if spec.get("class", "normal") not in _CLASSES:
        raise FlowError(f"{where}: class is {' or '.join(_CLASSES)}, got {spec['class']!r}")
    kind = spec["kind"]
    extra = {"publish", "subscribe"} if kind == "events" else {"key", "initial"} if kind == "state" else set()
    for key in spec:
        if key in {"publish", "subscribe", "key", "initial"} - extra:
            raise FlowError(f"{where}: {key!r} does not apply to a {kind} space")
    if kind == "source":
        b.source(name, spec["schema"])
    elif kind == "sink":
        b.sink(name, spec["schema"])
    elif kind == "events":
        b.events(
            name, spec["schema"], publish=spec.get("publish", False), subscribe=spec.get("subscribe", False)
        )
    elif kind == "state":
        _only(spec, _SPACE, where, required=("key", "initial"))
        b.state(name, spec["schema"], key=spec["key"], initial=spec["initial"])
    else:
        raise FlowError(f"{where}: unknown kind {kind!r} (source, sink, events or state)")


def _arc(b: FlowBuilder, i: int, spec: object) -> None:
    where = f"arc {i}"
    spec = _mapping(spec, where)
    kinds = [k for k in _ARC_KINDS if k in spec]
    if len(kinds) != 1:
        raise FlowError(
            f"{where} ({spec.get('name', 'unnamed')}): needs exactly one of {', '.join(_ARC_KINDS)}"
        )
    kind = kinds[0]
    _only(spec, {"name", "from", "to", "description", kind}, where, required=("from", "to"))
    source, target = str(spec["from"]), str(spec["to"])
    name = str(spec.get("name", f"{source}->{target}"))
    value = spec[kind]
    if kind == "select":
        b.select(name, source, target, value)
    elif kind == "transform":
        b.transform(name, source, target, _mapping(value, f"transform arc {name!r}"))
    elif kind == "collapse":
        b.collapse(name, source, target, value)
    else:
        b.expand(name, source, target, value)


def lookup_table(value: object, where: str, base: Path) -> Mapping[Any, Any]:
    if isinstance(value, Mapping):
        return value
    if not isinstance(value, str):
        raise FlowError(f"{where}: a table is a mapping, or a file name (optionally FILE#TABLE)")
    file, _, table = value.partition("#")
    path = base / file
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise FlowError(f"{where}: cannot read {str(path)!r}: {exc}") from None
    if table:
        if not isinstance(data, Mapping) or table not in data:
            raise FlowError(f"{where}: {str(path)!r} has no table {table!r}")
        data = data[table]
    if not isinstance(data, Mapping):
        raise FlowError(f"{where}: {str(path)!r}{'#' + table if table else ''} is not a mapping")
    return data


def _input(b: FlowBuilder, spec: Mapping[str, Any]) -> None:
    _only(spec, {"generator", "events", "seed", "options"}, "input", required=("generator",))
    options = _mapping(spec.get("options", {}), "input options")
    b.input(str(spec["generator"]), events=spec.get("events", 10_000), seed=spec.get("seed", 1), **options)
