"""A broker's information spaces: events and filters checked against their schemas, the routing
filter that keeps spaces apart, and the collapse rule sets bound to them.

How it works (the information spaces of the IFG, each with a schema: Banavar et al.,
"Information Flow Based Event Distribution Middleware", section 2):

* **One routing table for every space.** Each event carries its space in the field
  ``__space`` (:data:`SPACE`), and each subscription's (or advertisement's) filter becomes
  ``__space = "<space>" & (<filter>)`` (:meth:`Spaces.routing_filter`), built from the parsed
  filter, not parsed again.
* **Events.** An event is a map of field names to values; names starting with ``__`` are
  reserved. A space with a schema validates its events (:meth:`flowbus.model.Schema.validate`);
  one without takes any. :meth:`Spaces.check_event` answers the fields to route, or why not,
  and the broker refuses the publish with that reason (``Nack``).
* **Filters.** A filter is parsed (:func:`flowbus.filters.parse`) and, in a space with a
  schema, may name only its fields.
* **Collapse rule sets** (the IFG's collapse, section 2; :mod:`flowbus.broker.interpret`)
  are bound to the schema of the space subscribed to. The configuration's rule sets are read
  on first use, so a bad one refuses the subscriptions that name a rule set, not the
  broker's start.

* **Flows.** The spaces of the flows deployed on the network (:mod:`flowbus.routing.flows`)
  are spaces too: a publish into one is checked by its flow (publishable spaces only, against
  their schemas); a subscription to one is the flow's (:meth:`Spaces.flow_of`).

A check never raises for bad input: it answers what was wrong, naming the space, the field
or the rule set.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property, lru_cache
from typing import Any

from flowbus.broker.config import BrokerConfig
from flowbus.broker.interpret import Interpretation, Interpretations
from flowbus.errors import FlowbusError, FlowError, SchemaError
from flowbus.filters import Filter, parse
from flowbus.filters.ast import Conjunction, Op, Predicate
from flowbus.flow.deploy import Deployment
from flowbus.flow.validate import bind_rules
from flowbus.meta import HIDDEN, SPACE, is_hidden
from flowbus.model import Schema
from flowbus.routing.flows import Flows

__all__ = ["Spaces"]


_UNKNOWN: Any = object()


class Spaces:
    """The spaces of a broker's configuration (see the module note)."""

    def __init__(self, config: BrokerConfig, flows: Flows | None = None) -> None:
        self.schemas: Mapping[str, Schema | None] = config.spaces
        self.rulesets: Mapping[str, Any] = config.rulesets
        self.flows = flows
        self._flow_rules: dict[tuple[str, str, str], Interpretation] = {}

    def flow_of(self, space: str) -> Deployment | None:
        """The deployed flow ``space`` belongs to (None: a space of the configuration, or unknown)."""
        return None if self.flows is None or space in self.schemas else self.flows.flow_of_space(space)

    def listed(self) -> dict[str, dict[str, str] | None]:
        """Every space with its schema, as the client protocol's ``Welcome`` lists them."""
        out = {n: None if s is None else s.to_dict() for n, s in self.schemas.items()}
        if self.flows is not None:
            for d in self.flows.deployments.values():
                out.update((n, s.schema.to_dict()) for n, s in d.spaces.items() if s.subscribable)
        return out

    def check_event(self, space: str, event: Any) -> tuple[dict[str, Any] | None, str]:
        """The fields of ``event`` to route (its space in ``__space``), checked against the
        space's schema; or None and what is wrong."""
        schema = self.schemas.get(space, _UNKNOWN)
        if schema is _UNKNOWN:
            flow = self.flow_of(space)
            if flow is None:
                return None, self._unknown(space)
            try:
                fields = flow.check_event(space, event)
            except FlowbusError as e:
                return None, str(e)
            fields[SPACE] = space
            return fields, ""
        if not isinstance(event, dict) or not all(isinstance(k, str) for k in event):
            return None, f"an event is a map of field names to values, got {type(event).__name__}"
        if any(is_hidden(k) for k in event):
            return None, f"field names starting with {HIDDEN!r} are reserved"
        if schema is None:
            fields = dict(event)
        else:
            try:
                fields = schema.validate(event)
            except SchemaError as e:
                return None, f"space {space!r}: {e}"
        fields[SPACE] = space
        return fields, ""

    def check_filter(self, space: str, text: str) -> tuple[Filter | None, str]:
        """``text`` parsed, its fields checked against ``space``'s schema; or None and why not."""
        schema = self.schemas.get(space, _UNKNOWN)
        if schema is _UNKNOWN:
            return None, self._unknown(space)
        try:
            filt = parse(text)
        except FlowbusError as e:
            return None, f"filter: {e}"
        if schema is not None:
            unknown = sorted(f for f in filt.fields() if f not in schema)
            if unknown:
                fields = ", ".join(schema)
                return None, f"filter: unknown field {unknown[0]!r} in space {space!r} (fields: {fields})"
        return filt, ""

    @staticmethod
    def routing_filter(space: str, filt: Filter) -> Filter:
        """``__space = space & (filt)``, built from the parsed filter (not parsed again)."""
        in_space = _in_space(space)
        if len(filt.disjuncts) == 1:
            return Filter.conjunction((in_space, *filt.disjuncts[0].literals))
        return Filter(tuple(Conjunction((in_space, *c.literals)) for c in filt.disjuncts))

    def check_collapse(self, name: str, space: str) -> str | None:
        """Why the collapse rule set ``name`` cannot serve ``space`` (None: it can)."""
        if name not in self.rulesets:
            known = ", ".join(sorted(self.rulesets)) or "none"
            return f"unknown collapse rule set {name!r} (known: {known})"
        try:
            self.interpretation(name, space)
        except FlowbusError as e:
            return f"collapse rule set {name!r}: {e}"
        return None

    def interpretation(self, name: str, space: str) -> Interpretation:
        """The collapse rule set ``name`` bound to ``space``'s schema (built once); a name
        ``FLOW:ARC`` is the rule set of the expand arc ``ARC`` of a deployed flow, bound to the
        space it publishes into (:meth:`flow_collapse`)."""
        flow, sep, arc = name.partition(":")
        if sep:
            return self._flow_interpretation(flow, arc)
        return self._interpretations.get(name, self.schemas.get(space))

    def flow_collapse(self, space: str) -> str | None:
        """The rule set a subscription to a flow's ``space`` catches up with after an absence:
        that of the expand arc publishing into it (``FLOW:ARC``), if one does."""
        flow = self.flow_of(space)
        arc = flow.expand_into(space) if flow is not None else None
        return None if flow is None or arc is None else f"{flow.name}:{arc.name}"

    def _flow_interpretation(self, flow: str, arc: str) -> Interpretation:
        d = self.flows.deployments.get(flow) if self.flows is not None else None
        if d is None:
            raise FlowError(f"no flow {flow!r} is deployed")
        key = (flow, d.version, arc)
        made = self._flow_rules.get(key)
        if made is None:
            expand = d.graph.arc(arc)
            state = d.graph.space(expand.source).schema
            made = Interpretation(
                f"{flow}:{arc}", d.graph.space(expand.target).schema, state, bind_rules(d.graph, expand)
            )
            self._flow_rules[key] = made
        return made

    @cached_property
    def _interpretations(self) -> Interpretations:
        return Interpretations(self.rulesets)  # (raises, and is tried again, if one is bad)

    def _unknown(self, space: str) -> str:
        return f"unknown space {space!r} (known: {', '.join(sorted(self.listed()))})"


@lru_cache(maxsize=1024)
def _in_space(space: str) -> Predicate:
    """``__space = space``: one literal a space, shared by its subscriptions' routing filters."""
    return Predicate(SPACE, Op.EQ, space)
