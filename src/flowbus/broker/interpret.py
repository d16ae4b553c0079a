"""Subscriptions with an interpretation: a reconnecting subscriber gets the shortest equivalent sequence.

A subscriber may name a *collapse rule set* (the Information Flow Graph's collapse,
000 document section 2). The events it receives then mean something beyond
themselves: folded through the rules they make a keyed state ("the latest price
per symbol", "the maximum and current price per company"). When such a subscriber
comes back after a disconnect it does not need the backlog it missed, only an
event sequence with the same effect on that state. :meth:`Interpretation.catch_up`
gives the shortest one (the IFG's expand, section 4.2): fold the backlog into
the state the subscriber had seen, and for every key whose row changed search, by
the flow package's A* (:func:`flowbus.flow.expand.shorten`), for the shortest
sequence taking the seen row to the new one.

How it works:

* **Config.** The broker config holds rule sets in the flow specs' syntax (``key``,
  ``rules``, ``description``; docs/flow.md, examples/stocks/flow.yaml). What a
  flow spec says in the state space is optional here::

      rulesets:
        max_cur:                            # the paper's <max, cur> per symbol
          key: {symbol: symbol}             # state key component: event field (plain)
          rules:
            - {when: "price > maxP", set: {maxP: price, curP: price}}
            - {set: {curP: price}}
        count:
          key: symbol
          state: {schema: {n: int}, initial: {n: 0}}   # optional: types and starting values
          event: {symbol: str, price: float}           # optional: else the space's schema
          rules: [{set: {n: n + 1}}]

  The state's components are those ``state.schema`` declares, then those the
  rules set. A key's type is its event field's; an undeclared component's is
  that of what the rules set it to (``price`` is a float, so ``maxP`` is); one
  that only its own value explains (``n: n + 1``) must be declared. A component
  without an ``initial`` value starts from its type's zero (0, 0.0, "", false).
  :class:`Interpretations` checks every rule set's syntax when it is made and
  builds the :class:`Interpretation` of a rule set once per event schema (the
  schema of the space subscribed to), on first use.
* **State.** A state maps a key tuple (the key components in ``key`` order) to a
  row tuple (the components in the order above), holding only the rows that
  differ from the initial row; ``{}`` (or None) is the initial state. In that form
  two states are equivalent exactly when they are equal. :meth:`~Interpretation.rows`
  and :meth:`~Interpretation.state_of` convert to and from JSON-able rows.
* **Fold** is :meth:`flowbus.flow.collapse.BoundRules.collapse`, event by event.
* **Catch up.** Rows of different keys are independent, so each key is handled on
  its own, keys in the order of their last change in the backlog. Events that
  changed nothing are dropped. The key's own events are a sequence that works,
  and :func:`flowbus.flow.expand.shorten` looks for a shorter one: one of them
  alone, then A* over the candidate values of section 4.2 (the rows' values, the
  key and the rules' constants), then over those and the values the key's events
  carried (``150`` in ``[150, 7, 50]`` is in no row, yet the sequence needs it),
  each within ``max_states`` states; when there is none, or the search gives up,
  the key's own events are the answer. So the result is never longer than the
  backlog, and it is the shortest over those values whenever the search
  completes. Event fields no rule reads do not change the state: an event of
  the backlog is sent as it was published, a found one copies them from the
  key's last backlog event.

Errors: a bad rule set or one that does not fit the event schema, an unknown rule
set name, or a malformed state raise :class:`~flowbus.errors.FlowError`; an
event that does not fit the schema raises :class:`~flowbus.errors.SchemaError`
naming its position and field. Nothing is changed by a call that raises.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NoReturn

import yaml

from flowbus.errors import FlowbusError, FlowError, SchemaError, Undefined
from flowbus.filters.ast import Expr, Field, Functions
from flowbus.filters.text import expr_to_text
from flowbus.flow.collapse import BoundRules, Key, Row, RuleSet
from flowbus.flow.expand import rows_from_json, shorten
from flowbus.flow.infer import NUMBERS, check_expr, hint, with_builtins
from flowbus.flow.rulecode import KeyFn, StepFn, key_function, step_function
from flowbus.flow.spec import FlowBuilder
from flowbus.model import Schema, Value, type_name

__all__ = ["MAX_STATES", "Interpretation", "Interpretations", "State", "load_interpretation"]

State = Mapping[Key, Row]
"""Key tuple -> row tuple, only rows that differ from the initial row (see the module notes)."""

MAX_STATES = 5_000
"""The A* states one key's catch-up search may expand before it falls back to the key's own events."""

_RULESET_KEYS = frozenset({"key", "rules", "description", "state", "event"})
_STATE_KEYS = frozenset({"schema", "initial"})


@dataclass(frozen=True, slots=True)
class _Declared:
    """One rule set of the config, its syntax checked: the rules, the state layout, maybe an event schema."""

    rules: RuleSet
    components: tuple[str, ...]  # the state's non-key fields: the declared ones, then those rules set
    types: Mapping[str, Any]  # the state fields whose type the config gives (as written)
    initial: Mapping[str, Value]  # as written; a component without one starts from its type's zero
    event: Schema | None


@dataclass(frozen=True, eq=False)
class Interpretation:
    """A rule set bound to an event schema: fold events into a state, and catch a subscriber up.

    Build one with :class:`Interpretations` (or :func:`load_interpretation`).
    ``state`` is the whole state schema (key fields and components).
    """

    name: str
    event: Schema
    state: Schema
    bound: BoundRules
    max_states: int = MAX_STATES

    @property
    def key_names(self) -> tuple[str, ...]:
        return self.bound.key_names

    @property
    def components(self) -> tuple[str, ...]:
        return self.bound.components

    @property
    def initial(self) -> Row:
        return self.bound.initial

    # ---------------------------------------------------------------- fold

    def fold(
        self, state: State | None, events: Iterable[Mapping[str, Any]], *, delivered: bool = False
    ) -> dict[Key, Row]:
        """The state after ``events`` from ``state`` (``{}`` or None: the initial one); ``state`` is kept.

        ``delivered``: ``state`` is one this method returned and the events are what a broker
        delivered from a space of this rule set's event schema (checked when published), as a
        subscription's queue folds them: the state is not checked again, and an event only for
        its field names and NaN (the full check, and its error, when those differ).
        """
        if not delivered:
            table = self._checked_state(state, "state")
            for i, raw in enumerate(events):
                self.bound.collapse(table, self._event(raw, "event", i))
            return self._canonical(table)
        table = dict(state or {})
        names, initial = self._names, self.bound.initial
        key_of, step = self._compiled
        for i, raw in enumerate(events):
            if type(raw) is not dict or raw.keys() != names or any(v != v for v in raw.values()):  # (NaN)
                raw = self._event(raw, "event", i)
            try:  # (BoundRules.collapse, with the rules compiled)
                key = key_of(raw)
            except Undefined:
                continue
            old = table.get(key, initial)
            new = step(key, old, raw)
            if new is not None and new != old:
                table[key] = new
        return self._canonical(table)

    # ------------------------------------------------------------ catch up

    def catch_up(
        self, seen_state: State | None, backlog: Iterable[Mapping[str, Any]]
    ) -> list[dict[str, Value]]:
        """The shortest sequence equivalent to ``backlog`` for a subscriber that has seen ``seen_state``
        (None: nothing).

        ``fold(seen_state, result) == fold(seen_state, backlog)`` and
        ``len(result) <= len(backlog)``; see the module notes for how.
        """
        start = self._checked_state(seen_state, "seen state")
        table = dict(start)
        own: dict[Key, list[dict[str, Value]]] = {}  # per key, the backlog events that changed its row
        for i, raw in enumerate(backlog):
            event = self._event(raw, "backlog event", i)
            changed = self.bound.collapse(table, event)
            if changed is not None:
                key = changed[0]
                own.setdefault(key, []).append(event)
                own[key] = own.pop(key)  # keys in the order of their last change
        out: list[dict[str, Value]] = []
        for key, events in own.items():
            old, new = start.get(key, self.initial), table[key]
            if old != new:
                out += self._shortest(key, old, new, events)
        return out

    def _shortest(
        self, key: Key, old: Row, new: Row, events: list[dict[str, Value]]
    ) -> list[dict[str, Value]]:
        """The shortest sequence for one key that the search finds with the help of ``events`` (they take
        ``old`` to ``new``), never longer than them; a found event that is not one of them takes the fields
        no rule reads from the last of them."""
        found = shorten(self.bound, key, old, new, events, max_states=self.max_states).events
        last, own = events[-1], {id(ev): ev for ev in events}
        return [own[id(ev)] if id(ev) in own else {**last, **{f: ev[f] for f in self._read}} for ev in found]

    # ------------------------------------------------------------- rows

    def rows(self, state: State | None) -> list[dict[str, Value]]:
        """``state`` as JSON-able rows ``{"symbol": "IBM", "maxP": 160.0}`` (for storing a subscriber's)."""
        checked = self._checked_state(state, "state")
        names = (*self.key_names, *self.components)
        return [dict(zip(names, (*k, *r), strict=True)) for k, r in self._canonical(checked).items()]

    def state_of(self, rows: Sequence[Mapping[str, Any]]) -> dict[Key, Row]:
        """The state of rows as :meth:`rows` gives them (:class:`FlowError` when one does not fit)."""
        table = rows_from_json(self.bound, dict(self.state.fields), list(rows), f"rule set {self.name!r}")
        return self._canonical(table)

    # ----------------------------------------------------------- checks

    @cached_property
    def _read(self) -> tuple[str, ...]:
        """The event fields some rule or the key reads (the others cannot change the state)."""
        reads: set[str] = set()
        for rule in self.bound.ruleset.rules:
            reads |= {n.removeprefix("event.") for n in rule.reads()}
        reads |= {e.name for _, e in self.bound.ruleset.key if isinstance(e, Field)}
        return tuple(n for n in self.event if n in reads)

    @cached_property
    def _compiled(self) -> tuple[KeyFn, StepFn]:
        """The rule set's key and step as compiled functions (:mod:`flowbus.flow.rulecode`: the
        interpreter's answers; a subscription's queue folds every event it delivers)."""
        return key_function(self.bound), step_function(self.bound)

    @cached_property
    def _names(self) -> frozenset[str]:
        return frozenset(self.event)

    def _event(self, raw: Mapping[str, Any], what: str, i: int) -> dict[str, Value]:
        """Event ``i`` of the ``what`` (``event``, ``backlog event``) checked against the event
        schema (where it is, named only in an error: this runs per event)."""
        if not isinstance(raw, Mapping):
            raise SchemaError(f"rule set {self.name!r}: {what} {i} is not a mapping of fields, got {raw!r}")
        try:
            event = self.event.validate(raw)
        except SchemaError as exc:
            raise SchemaError(f"rule set {self.name!r}: {what} {i}: {exc}", field=exc.field) from None
        for name, value in event.items():
            if isinstance(value, float) and math.isnan(value):
                raise SchemaError(
                    f"rule set {self.name!r}: {what} {i}: field {name!r} is NaN, which equals nothing "
                    "(a state holding it could never be caught up with)",
                    field=name,
                )
        return event

    def _checked_state(self, state: State | None, what: str) -> dict[Key, Row]:
        """A copy of ``state``, its keys and rows checked against the state schema (floats as float)."""
        where = f"rule set {self.name!r}: {what}"
        if state is None:
            return {}
        if not isinstance(state, Mapping):
            raise FlowError(f"{where} must map key tuples to row tuples, got {type(state).__name__}")
        out: dict[Key, Row] = {}
        for key, row in state.items():
            k = self._tuple(key, self.key_names, f"{where}: key {key!r}")
            out[k] = self._tuple(row, self.components, f"{where}: row {row!r} of key {key!r}")
        return out

    def _tuple(self, values: object, names: tuple[str, ...], where: str) -> tuple[Value, ...]:
        if not isinstance(values, tuple) or len(values) != len(names):
            raise FlowError(f"{where}: expected a tuple of {len(names)} ({', '.join(names)})")
        return tuple(_typed(self.state, n, v, where) for n, v in zip(names, values, strict=True))

    def _canonical(self, table: dict[Key, Row]) -> dict[Key, Row]:
        return {k: r for k, r in table.items() if r != self.initial}


def _typed(schema: Schema, name: str, value: object, where: str) -> Value:
    """``value`` checked against the type of ``name`` (an int for a float field becomes a float)."""
    kind = schema.type_of(name)
    if kind is float and type(value) is int:
        return float(value)
    if type(value) is not kind:
        raise FlowError(f"{where}: {name!r} must be {kind.__name__}, got {type_name(value)} {value!r}")
    return value  # type: ignore[return-value]


class Interpretations:
    """The rule sets of a broker config, by name; each bound once per event schema, on first use.

    ``rulesets`` is the config's ``rulesets:`` mapping (name -> rule set, see the
    module notes); every rule set's syntax is checked here (:class:`FlowError`
    naming it). ``functions`` are the lookup tables and functions the rules may call.
    """

    def __init__(
        self,
        rulesets: Mapping[str, Any],
        *,
        functions: Functions | None = None,
        max_states: int = MAX_STATES,
    ) -> None:
        if not isinstance(rulesets, Mapping):
            raise FlowError(f"rulesets must map names to rule sets, got {type(rulesets).__name__}")
        self.functions: Functions = dict(functions or {})
        self.max_states = max_states
        self._declared = {str(name): _declare(str(name), spec) for name, spec in rulesets.items()}
        self._bound: dict[tuple[str, tuple[tuple[str, type], ...]], Interpretation] = {}
        for name, declared in self._declared.items():
            if declared.event is not None:
                self.get(name)  # a declared event schema: bind (and check) now

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **kwargs: Any) -> Interpretations:
        """The rule sets of a whole broker config (its ``rulesets:`` key; none if absent)."""
        if not isinstance(config, Mapping):
            raise FlowError(f"a broker config is a mapping, got {type(config).__name__}")
        return cls(config.get("rulesets") or {}, **kwargs)

    @classmethod
    def from_yaml(cls, text: str, **kwargs: Any) -> Interpretations:
        """The rule sets of a broker config written in YAML."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or exc
            raise FlowError(f"broker config: not valid YAML{at}: {problem}") from None
        return cls.from_config(data if data is not None else {}, **kwargs)

    def names(self) -> list[str]:
        return list(self._declared)

    def __contains__(self, name: object) -> bool:
        return name in self._declared

    def get(self, name: str, event: Schema | Mapping[str, Any] | None = None) -> Interpretation:
        """The interpretation ``name`` over ``event`` (the subscribed space's schema, or the declared one)."""
        declared = self._declared.get(name)
        if declared is None:
            known = ", ".join(self._declared) or "none configured"
            raise FlowError(f"unknown rule set {name!r}{hint(name, self._declared)} (rule sets: {known})")
        schema = _event_schema(name, declared, event)
        cache_key = (name, tuple(schema.fields.items()))
        found = self._bound.get(cache_key)
        if found is None:
            found = self._bound[cache_key] = _bind(name, declared, schema, self.functions, self.max_states)
        return found


def load_interpretation(
    name: str,
    rulesets: Mapping[str, Any],
    event: Schema | Mapping[str, Any] | None = None,
    *,
    functions: Functions | None = None,
) -> Interpretation:
    """The interpretation ``name`` of a config's ``rulesets:`` mapping over ``event`` (or the declared
    schema); the other rule sets are checked too. To build each once, keep an :class:`Interpretations`."""
    return Interpretations(rulesets, functions=functions).get(name, event)


# ------------------------------------------------------------------ building


def _declare(name: str, spec: object) -> _Declared:
    """The syntax of one rule set checked, and its state layout (types are settled when bound)."""
    where = f"rule set {name!r}"
    if not isinstance(spec, Mapping):
        raise FlowError(f"{where}: a rule set is a mapping with key and rules, got {spec!r}")
    for k in spec:
        if k not in _RULESET_KEYS:
            raise FlowError(f"{where}: unknown key {k!r} (expected {', '.join(sorted(_RULESET_KEYS))})")
    for k in ("key", "rules"):
        if k not in spec:
            raise FlowError(f"{where}: missing key {k!r}")
    rules = FlowBuilder().rules(name, key=spec["key"], rules=spec["rules"])
    for key_name, e in rules.key:
        if not isinstance(e, Field) or e.name.startswith(("event.", "state.")):
            raise FlowError(
                f"{where}: key {key_name!r} is computed from the event; a catch-up builds events "
                "from the key, so it must be a plain event field"
            )
    state = spec.get("state", {})
    if not isinstance(state, Mapping):
        raise FlowError(f"{where}: state must be a mapping with schema and initial, got {state!r}")
    for k in state:
        if k not in _STATE_KEYS:
            raise FlowError(f"{where}: state: unknown key {k!r} (expected initial, schema)")
    schema, initial = state.get("schema", {}), state.get("initial", {})
    if not isinstance(schema, Mapping) or not isinstance(initial, Mapping):
        raise FlowError(f"{where}: state: schema and initial must be mappings")
    key_names = {n for n, _ in rules.key}
    set_by_rules = [n for rule in rules.rules for n, _ in rule.sets if n not in key_names]
    components = tuple(dict.fromkeys([*(str(n) for n in schema if n not in key_names), *set_by_rules]))
    if not components:
        raise FlowError(f"{where}: the state has no component besides the key (the rules set nothing)")
    for n in initial:
        if n not in components:
            what = "a key component (keys have none)" if n in key_names else "not a component of the state"
            raise FlowError(f"{where}: state: initial value for {n!r}, which is {what}")
    event = spec.get("event")
    return _Declared(
        rules,
        components,
        {str(n): t for n, t in schema.items()},
        dict(initial),
        None if event is None else _schema(event, f"{where}: event"),
    )


def _schema(value: object, where: str) -> Schema:
    if isinstance(value, Schema):
        return value
    if not isinstance(value, Mapping) or not value:
        raise FlowError(f"{where}: a schema maps field names to types (str, int, float, bool), got {value!r}")
    try:
        return Schema.of(value)
    except FlowbusError as exc:
        raise FlowError(f"{where}: {exc}") from None


def _event_schema(name: str, declared: _Declared, event: Schema | Mapping[str, Any] | None) -> Schema:
    if event is None:
        if declared.event is None:
            raise FlowError(
                f"rule set {name!r} declares no event schema: give the schema of the space subscribed to"
            )
        return declared.event
    schema = _schema(event, f"rule set {name!r}: event")
    if declared.event is not None and dict(declared.event.fields) != dict(schema.fields):
        raise FlowError(
            f"rule set {name!r} is declared over events {declared.event.to_dict()}, not {schema.to_dict()}"
        )
    return schema


def _bind(
    name: str, declared: _Declared, event: Schema, functions: Functions, max_states: int
) -> Interpretation:
    where = f"rule set {name!r}"
    key_names = tuple(n for n, _ in declared.rules.key)
    fields: dict[str, Any] = {}
    for key_name, e in declared.rules.key:
        if key_name in declared.types:
            fields[key_name] = declared.types[key_name]
            continue
        assert isinstance(e, Field)
        if e.name not in event:
            raise FlowError(
                f"{where}: key {key_name!r} reads {e.name!r}, which is not a field of the events "
                f"({', '.join(event)})"
            )
        fields[key_name] = event.type_of(e.name)
    given = {c: declared.types[c] for c in declared.components if c in declared.types}
    given_schema = _schema({**fields, **given}, f"{where}: state")
    types = {**dict(given_schema.fields), **_infer(declared, event, dict(given_schema.fields), functions)}
    state = Schema.of({n: types[n] for n in (*key_names, *declared.components)})
    initial = tuple(
        _typed(state, c, declared.initial[c], f"{where}: state: initial")
        if c in declared.initial
        else _ZERO[state.type_of(c)]
        for c in declared.components
    )
    bound = BoundRules(
        declared.rules,
        event=event,
        state=state,
        key_names=key_names,
        components=declared.components,
        initial=initial,
        functions=functions,
        where=where,
    )
    return Interpretation(name, event, state, bound, max_states)


_ZERO: Mapping[type, Value] = {str: "", int: 0, float: 0.0, bool: False}


def _infer(
    declared: _Declared, event: Schema, known: dict[str, type], functions: Functions
) -> dict[str, type]:
    """The types of the components the config does not declare, from what the rules set them to.

    A component takes the type of the right-hand sides assigned to it that can be
    typed so far (``int`` and ``float`` together make ``float``), and the pass is
    repeated until nothing changes (a type only ever widens from ``int`` to
    ``float``, so this ends). A component none of whose right-hand sides can be
    typed (``n: n + 1`` alone), or whose are a mix (a string and a number, a
    function of unknown result), must be declared in ``state: {schema: ...}``.
    :class:`BoundRules` then checks every rule against the types found.
    """
    where = f"rule set {declared.rules.name!r}"
    fns = with_builtins(functions)
    exprs: dict[str, list[Expr]] = {}
    for rule in declared.rules.rules:
        for name, e in rule.sets:
            exprs.setdefault(name, []).append(e)
    pending = [c for c in declared.components if c not in known]
    found: dict[str, type] = {}
    changed = True
    while changed:
        changed = False
        for c in pending:
            env = _environment(event, {**known, **found})
            kinds: set[type] = {found[c]} if c in found else set()
            for e in exprs[c]:
                try:
                    kinds |= check_expr(e, env, fns, f"{where}: {c}")
                except FlowError:
                    continue  # reads a component not typed yet (or is wrong: BoundRules says so)
            if not kinds:
                continue
            kind = _one_type(frozenset(kinds))
            if kind is None:
                shown = "/".join(sorted(k.__name__ for k in kinds))
                raise FlowError(
                    f"{where}: cannot tell the type of {c!r} (its rules give {shown}): "
                    f"declare it, e.g. state: {{schema: {{{c}: float}}}}"
                )
            if found.get(c) is not kind:
                found[c] = kind
                changed = True
    untyped = [c for c in pending if c not in found]
    if untyped:
        _stuck(declared, event, {**known, **found}, untyped, exprs, fns)
    return found


def _stuck(
    declared: _Declared,
    event: Schema,
    known: dict[str, type],
    pending: list[str],
    exprs: Mapping[str, list[Expr]],
    functions: Functions,
) -> NoReturn:
    """Why no pending component could be typed: a name that is nothing (the flow's message), or a cycle."""
    where = f"rule set {declared.rules.name!r}"
    guess = _environment(event, {**known, **dict.fromkeys(pending, float)})
    for c in pending:
        for e in exprs[c]:
            check_expr(e, guess, functions, f"{where}: {c}")  # raises for a name that is nothing
    c = pending[0]
    raise FlowError(
        f"{where}: cannot tell the type of {c!r}, its rules read what is not typed yet "
        f"({', '.join(expr_to_text(e) for e in exprs[c])}): declare it, e.g. "
        f"state: {{schema: {{{c}: int}}}}"
    )


def _environment(event: Schema, state: Mapping[str, type]) -> dict[str, type]:
    """What a rule's expression may read: event fields and state fields, bare or qualified."""
    env: dict[str, type] = {}
    for name, kind in event.fields.items():
        env[name] = env[f"event.{name}"] = kind
    for name, kind in state.items():
        env[name] = env[f"state.{name}"] = kind
    return env


def _one_type(kinds: frozenset[type]) -> type | None:
    if kinds and kinds <= NUMBERS:
        return int if kinds == {int} else float
    return next(iter(kinds)) if len(kinds) == 1 else None
