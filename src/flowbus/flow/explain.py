"""``flowbus flow explain``: a graph before and after rewriting, path by path (000 document, section 4.1).

How it works: the text form lists the spaces and arcs as written, then every
publication point -> subscription point path with the arcs it went through and
its one ``S`` and ``T`` (the paper's Figure 2c: ``S1: (price*vol >= 1000000);
T4: [issue, price, vol] => [com=NYS(issue), cap=price*vol]``), the
subexpressions that ``S`` and ``T`` share (computed once per event), the
stateful arcs kept as they are, and the tagged-transform form (one select
stage, and the transforms by source and subscription point). The JSON form is
``{"paths": [{"source", "sink", "select", "transform"}]}`` -- the select as
filter text, the transform as field -> expression text (``requires`` is added
to a path whose transform needs an intermediate value it no longer outputs) --
for other tools to check.
"""

from __future__ import annotations

from typing import Any

from flowbus.filters.text import expr_to_text
from flowbus.flow.graph import (
    Arc,
    Collapse,
    Expand,
    Graph,
    Route,
    Select,
    Space,
    StateSpace,
    Transform,
    outputs_text,
)
from flowbus.flow.rewrite import RoutePath, find_paths, rewrite, tag
from flowbus.flow.validate import bind_rules

__all__ = ["explain_json", "explain_text"]


def explain_json(g: Graph) -> dict[str, Any]:
    """``{"paths": [...]}``: every publication -> subscription path as its ``[S; T]``."""
    paths = []
    for p in find_paths(g):
        doc: dict[str, Any] = {
            "source": p.source,
            "sink": p.sink,
            "select": p.step.select.to_text(),
            "transform": {name: expr_to_text(e) for name, e in p.step.outputs},
        }
        if p.step.requires:
            doc["requires"] = [expr_to_text(e) for e in p.step.requires]
        paths.append(doc)
    return {"paths": paths}


def _space_line(s: Space, width: int) -> str:
    fields = ", ".join(f"{n}: {t.__name__}" for n, t in s.schema.fields.items())
    if isinstance(s, StateSpace):
        initial = ", ".join(f"{n}={v!r}" for n, v in s.initial)
        return f"    {s.name:<{width}}  state    <{fields}>  key {', '.join(s.key)}; initially {initial}"
    roles = [r for r, on in (("publication point", s.publish), ("subscription point", s.subscribe)) if on]
    extra = f"  ({', '.join(roles)})" if roles else ""
    return f"    {s.name:<{width}}  {s.kind:<7}  [{fields}]{extra}"


def _arc_lines(g: Graph, arc: Arc, shown: set[object]) -> list[str]:
    head = f"    {arc.name}: {arc.source} -> {arc.target}  {arc.kind}"
    if isinstance(arc, Select):
        return [f"{head}  {arc.filter.to_text()}"]
    if isinstance(arc, Transform):
        return [f"{head}  {outputs_text(list(g.space(arc.source).schema), arc.outputs)}"]
    if isinstance(arc, Route):
        return [
            f"{head}  (was {'; '.join(arc.via) or 'identity'})",
            f"        S: {arc.select.to_text()}",
            f"        T: {outputs_text(list(g.space(arc.source).schema), arc.outputs)}",
        ]
    assert isinstance(arc, (Collapse, Expand))
    if arc.rules in shown:
        return [f"{head}  rule set {arc.rules.name} (as above)"]
    shown.add(arc.rules)
    lines = [f"{head}  rule set {arc.rules.name}"]
    return lines + [f"        {line}" for line in bind_rules(g, arc).describe()]


def _path_lines(p: RoutePath) -> list[str]:
    via = "; ".join(p.via) if p.via else "identity"
    lines = [
        f"  {p.source} -> {p.sink}   ({via})",
        f"    S: {p.step.select.to_text()}",
        f"    T: {outputs_text(p.step.inputs, p.step.outputs)}",
    ]
    if p.step.requires:
        lines.append(f"    requires defined: {', '.join(expr_to_text(e) for e in p.step.requires)}")
    if p.shared:
        lines.append(f"    computed once for S and T: {', '.join(expr_to_text(e) for e in p.shared)}")
    if not p.step.select.disjuncts:
        lines.append("    (the select is always false: this path never delivers)")
    return lines


def explain_text(g: Graph) -> str:
    """The graph as written, then path by path after rewriting, then its tagged-transform form."""
    width = max((len(s.name) for s in g.spaces), default=0)
    lines = [
        f"flow {g.name!r}: {len(g.spaces)} spaces, {len(g.arcs)} arcs",
        "",
        "before rewriting",
        "  spaces",
    ]
    lines += [_space_line(s, width) for s in g.spaces]
    lines.append("  arcs")
    shown: set[object] = set()
    for arc in g.arcs:
        lines += _arc_lines(g, arc, shown)
    paths = find_paths(g)
    lines += ["", f"after rewriting: {len(paths)} publication -> subscription paths, each [S; T]"]
    for p in paths:
        lines += _path_lines(p)
    rewritten = rewrite(g)
    stateful = [a for a in rewritten.arcs if isinstance(a, (Collapse, Expand))]
    if stateful:
        lines += ["", "stateful arcs, kept (re-attached to the rewritten nodes)"]
        lines += [f"  {a.name}: {a.source} -> {a.target}  {a.kind} ({a.rules.name})" for a in stateful]
    lines += _tagged_lines(rewritten)
    return "\n".join(lines) + "\n"


def _tagged_lines(rewritten: Graph) -> list[str]:
    plan = tag(rewritten)
    if not plan.subscriptions:
        return []
    lines = [
        "",
        f"tagged transforms: one select stage over a core space (events tagged with {plan.source_field})",
    ]
    lines += [f"  subscription {sink}: {f.to_text()}" for sink, f in plan.subscriptions]
    lines.append("  transforms applied at delivery, by (source, subscription point)")
    for (source, sink), steps in plan.table:
        for step in steps:
            lines.append(f"    ({source}, {sink}): {outputs_text(step.inputs, step.outputs)}")
    return lines
