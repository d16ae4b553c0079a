"""Information Flow Graphs (the 000 document: Banavar et al., IBM Gryphon).

A flow is data: a spec (YAML, :func:`load_spec`, or Python, :class:`FlowBuilder`)
becomes an immutable, validated :class:`Graph` of information spaces (event
histories and keyed states) and arcs (select, transform, collapse, expand).
:func:`rewrite` returns the equivalent graph in which every publication ->
subscription path is one ``[select; transform]`` route (section 4.1);
:func:`expand` finds the shortest event sequence between two states by A*
(section 4.2); :class:`LocalRun` is the reference interpreter of either graph.
"""

from flowbus.errors import ExpandError, FlowError
from flowbus.flow.collapse import BoundRules, Rule, RuleSet
from flowbus.flow.expand import Expansion, KeyExpansion, expand, expand_key
from flowbus.flow.graph import (
    Arc,
    Collapse,
    EventSpace,
    Expand,
    Graph,
    InputSpec,
    Route,
    Select,
    Space,
    StateSpace,
    Transform,
)
from flowbus.flow.local import LocalRun, run_graph, write_outputs
from flowbus.flow.rewrite import RoutePath, Step, TaggedPlan, find_paths, reduce_path, rewrite, tag
from flowbus.flow.spec import FlowBuilder, graph_from_spec, load_spec

__all__ = [
    "Arc",
    "BoundRules",
    "Collapse",
    "EventSpace",
    "Expand",
    "ExpandError",
    "Expansion",
    "FlowBuilder",
    "FlowError",
    "Graph",
    "InputSpec",
    "KeyExpansion",
    "LocalRun",
    "Route",
    "RoutePath",
    "Rule",
    "RuleSet",
    "Select",
    "Space",
    "StateSpace",
    "Step",
    "TaggedPlan",
    "Transform",
    "expand",
    "expand_key",
    "find_paths",
    "graph_from_spec",
    "load_spec",
    "reduce_path",
    "rewrite",
    "run_graph",
    "tag",
    "write_outputs",
]
