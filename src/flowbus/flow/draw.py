"""Drawings of a flow: its graph as written and as rewritten, as Graphviz DOT and as SVG (pure).

How it works (the 000 document's "tool [that] supports the visual specification of
information flow graphs and applies the rules of Section 3 to rewrite the graph"):

* **A model first.** :func:`drawing` turns a :class:`~flowbus.flow.graph.Graph` into a
  :class:`Drawing`: one :class:`Box` per space (its kind -- source, events, state, sink --
  whether it is a publication or subscription point, its schema) and one :class:`Line` per
  arc, labelled by its kind and its expressions (the filter of a select, the outputs of a
  transform, the rule set of a collapse or expand, the ``S`` and ``T`` of a route).
  :func:`drawings` gives the two a person compares: the graph as written, and
  :func:`~flowbus.flow.rewrite.rewrite`'s (one ``[S; T]`` route per publication ->
  subscription path, the subexpressions its ``S`` and ``T`` share, and on each publication
  point those that all its routes share, computed once per event).
* **DOT** (:func:`to_dot`) is the model written for Graphviz, for whoever has it.
* **SVG** (:func:`to_svg`) needs no program at all: the spaces, and each arc's label as a
  node of its own between its two spaces, are put in layers by networkx's topological
  generations (so every arc goes left to right and no label sits on another), ordered
  within a layer by the mean position of their neighbours in the layer before or after (a
  few sweeps of the barycentre heuristic, to uncross arcs); each arc is drawn as two curves,
  space to label to space. Each element carries ``class`` and ``data-*`` attributes naming its space or arc
  (the console's live counts and the browser tests find them there), and a ``<title>`` with
  the full text (a long label is cut on the drawing).
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

import networkx as nx

from flowbus.filters.text import expr_to_text
from flowbus.flow.graph import (
    Arc,
    Collapse,
    EventSpace,
    Expand,
    Graph,
    Outputs,
    Route,
    Select,
    Space,
    StateSpace,
    Transform,
    outputs_text,
)
from flowbus.flow.rewrite import RoutePath, Step, rewrite, route_shared

__all__ = ["Box", "Drawing", "Line", "drawing", "drawings", "to_dot", "to_svg"]


@dataclass(frozen=True, slots=True)
class Box:
    """A space: ``kind`` is source, events, state or sink; ``roles`` publication / subscription."""

    name: str
    kind: str
    roles: tuple[str, ...]
    schema: str
    note: str = ""  # e.g. the subexpressions a publication point computes once


@dataclass(frozen=True, slots=True)
class Line:
    """An arc: ``kind`` is select, transform, collapse, expand or route; ``label`` its lines."""

    name: str
    kind: str
    source: str
    target: str
    label: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Drawing:
    title: str
    boxes: tuple[Box, ...]
    lines: tuple[Line, ...]


def _box(g: Graph, s: Space, note: str = "") -> Box:
    fields = ", ".join(f"{n}: {t.__name__}" for n, t in s.schema.fields.items())
    if isinstance(s, StateSpace):
        return Box(s.name, "state", (), f"<{fields}> key {', '.join(s.key)}", note)
    assert isinstance(s, EventSpace)
    roles = tuple(
        r for r, on in (("publication", s.is_publication), ("subscription", s.is_subscription)) if on
    )
    return Box(s.name, s.kind, roles, f"[{fields}]", note)


def _outputs(outputs: Outputs) -> str:
    """``[com=NYS(issue), price, vol]``: a transform's outputs (its inputs are its source's fields)."""
    return outputs_text((), outputs).removeprefix("[] => ")


def _label(g: Graph, arc: Arc) -> tuple[str, ...]:
    if isinstance(arc, Select):
        return (arc.filter.to_text(),)
    if isinstance(arc, Transform):
        return (_outputs(arc.outputs),)
    if isinstance(arc, Route):
        lines = [f"S: {arc.select.to_text()}", f"T: {_outputs(arc.outputs)}"]
        if arc.requires:
            lines.append(f"requires: {', '.join(expr_to_text(e) for e in arc.requires)}")
        path = RoutePath(arc.source, arc.target, arc.via, _step(g, arc))
        if path.shared:
            lines.append(f"shared: {', '.join(expr_to_text(e) for e in path.shared)}")
        return tuple(lines)
    assert isinstance(arc, (Collapse, Expand))
    return (f"rule set {arc.rules.name}",)


def _step(g: Graph, arc: Route) -> Step:
    return Step(tuple(g.space(arc.source).schema), arc.select, arc.outputs, arc.requires)


def drawing(g: Graph, title: str) -> Drawing:
    """``g`` as boxes and lines (see the module note)."""
    routes_from: dict[str, list[Route]] = {}
    for arc in g.arcs:
        if isinstance(arc, Route):
            routes_from.setdefault(arc.source, []).append(arc)
    boxes = []
    for s in g.spaces:
        routes = routes_from.get(s.name, [])
        shared = route_shared(routes) if len(routes) > 1 else []
        note = f"computed once: {', '.join(expr_to_text(e) for e in shared)}" if shared else ""
        boxes.append(_box(g, s, note))
    lines = tuple(Line(a.name, a.kind, a.source, a.target, _label(g, a)) for a in g.arcs)
    return Drawing(title, tuple(boxes), lines)


def drawings(g: Graph) -> tuple[Drawing, Drawing]:
    """The graph as written and after the rewrite (one ``[S; T]`` per publication -> subscription path)."""
    rewritten = rewrite(g)
    paths = sum(1 for a in rewritten.arcs if isinstance(a, Route))
    return (
        drawing(g, f"flow {g.name}: as written ({len(g.spaces)} spaces, {len(g.arcs)} arcs)"),
        drawing(rewritten, f"flow {g.name}: rewritten ({paths} paths, each [S; T])"),
    )


# ------------------------------------------------------------------ DOT

_DOT_SHAPES = {"source": "invhouse", "events": "box", "state": "cylinder", "sink": "house"}
_DOT_COLOURS = {
    "select": "#b45309",
    "transform": "#1d4ed8",
    "collapse": "#7c3aed",
    "expand": "#047857",
    "route": "#0f766e",
}


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(d: Drawing) -> str:
    """``d`` in Graphviz's DOT language (left to right; shapes by kind; arcs labelled)."""
    out = [
        f"digraph {_q(d.title)} {{",
        "  rankdir=LR;",
        f"  label={_q(d.title)}; labelloc=t;",
        '  node [fontname="Helvetica", style=filled, fillcolor="#f8fafc"];',
        '  edge [fontname="Helvetica", fontsize=10];',
    ]
    for b in d.boxes:
        roles = f" ({', '.join(b.roles)})" if b.roles else ""
        label = "\n".join(x for x in (b.name, f"{b.kind}{roles}", b.schema, b.note) if x)
        out.append(f"  {_q(b.name)} [shape={_DOT_SHAPES[b.kind]}, label={_q(label)}];")
    for line in d.lines:
        label = "\n".join((f"{line.name}: {line.kind}", *line.label))
        colour = _DOT_COLOURS[line.kind]
        out.append(f"  {_q(line.source)} -> {_q(line.target)} [label={_q(label)}, color={_q(colour)}];")
    out.append("}")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ SVG

CHAR = 6.6  # the width of a character of the 11 px monospace font the drawings use
LINE_H = 13  # the height of a line of text
BOX_H = 46
GAP = 18  # between two things of one column
COL_GAP = 46  # between two columns
LABEL_CHARS = 48  # a label line longer than this is cut (the <title> has it all)
BOLD = ' font-weight="bold"'
_FILLS = {"source": "#dbeafe", "events": "#f1f5f9", "state": "#ede9fe", "sink": "#dcfce7"}

Place = tuple[float, float, float, float]  # x, y, width, height


def _cut(text: str, n: int = LABEL_CHARS) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _kind_text(b: Box) -> str:
    return b.kind + "".join(f" · {r[:3]}" for r in b.roles)


def _texts(line: Line) -> list[str]:
    return [f"{line.name}: {line.kind}", *line.label]


def _box_h(live: bool) -> float:
    """A space's height: two lines of text, and two of counts on a live drawing."""
    return BOX_H + (2 * LINE_H if live else 0)


def _size(d: Drawing, live: bool) -> dict[str, tuple[float, float]]:
    """Width and height of each node of the layered graph: spaces, and arcs as their labels."""
    out: dict[str, tuple[float, float]] = {
        b.name: (
            max(len(b.name) + 2, len(_kind_text(b)), 22 if live else 12) * CHAR + 16,
            _box_h(live) + (LINE_H if b.note else 0),
        )
        for b in d.boxes
    }
    for line in d.lines:
        texts = _texts(line)
        out["arc:" + line.name] = (max(len(_cut(t)) for t in texts) * CHAR + 8, len(texts) * LINE_H + 6)
    return out


def _layers(d: Drawing) -> list[list[str]]:
    """The spaces and arcs (as ``arc:NAME``) in layers -- every arc node between its source's
    layer and a later one -- ordered to uncross the lines."""
    g: nx.DiGraph[str] = nx.DiGraph()
    g.add_nodes_from(b.name for b in d.boxes)
    for line in d.lines:
        g.add_edge(line.source, "arc:" + line.name)
        g.add_edge("arc:" + line.name, line.target)
    first = {n: i for i, n in enumerate(g.nodes)}  # (ties: the order of the spec)
    layers = [sorted(layer, key=first.__getitem__) for layer in nx.topological_generations(g)]
    for sweep in range(6):
        down = sweep % 2 == 0
        for i in range(1, len(layers)) if down else range(len(layers) - 2, -1, -1):
            ref = {n: k for k, n in enumerate(layers[i - 1 if down else i + 1])}
            near = g.predecessors if down else g.successors
            own = {n: k for k, n in enumerate(layers[i])}
            means: dict[str, float] = {}
            for n in layers[i]:
                around = [ref[m] for m in near(n) if m in ref]
                means[n] = sum(around) / len(around) if around else own[n]
            layers[i] = sorted(layers[i], key=means.__getitem__)
    return layers


def _place(d: Drawing, live: bool = False) -> tuple[dict[str, Place], float, float]:
    """Each node's place, and the drawing's width and height."""
    size = _size(d, live)
    layers = _layers(d)
    column_h = [sum(size[n][1] for n in layer) + GAP * (len(layer) - 1) for layer in layers]
    height = max(column_h, default=0) + 2 * GAP
    at: dict[str, Place] = {}
    x = 12.0
    for layer, h in zip(layers, column_h, strict=True):
        width = max(size[n][0] for n in layer)
        y = (height - h) / 2
        for n in layer:
            w, hn = size[n]
            at[n] = (x + (width - w) / 2 if n.startswith("arc:") else x, y, w, hn)
            y += hn + GAP
        x += width + COL_GAP
    return at, x - COL_GAP + 12, height


def _svg_box(b: Box, place: Place, live: bool) -> str:
    x, y, w, _ = place
    title = escape("\n".join(t for t in (f"{b.name} ({_kind_text(b)})", b.schema, b.note) if t))
    parts = [
        f'<g class="space space-{b.kind}" data-space="{escape(b.name)}" data-kind="{b.kind}">',
        f"<title>{title}</title>",
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{_box_h(live)}" '
        f'rx="{14 if b.kind == "state" else 4}" fill="{_FILLS[b.kind]}" stroke="#334155" '
        f'stroke-width="{3 if b.roles else 1.2}"/>',
        f'<text x="{x + 8:.1f}" y="{y + 17:.1f}"{BOLD}>{escape(b.name)}</text>',
        f'<text x="{x + 8:.1f}" y="{y + 34:.1f}" fill="#475569">{escape(_kind_text(b))}</text>',
    ]
    if live:
        parts += [
            f'<text class="live" data-{what}="{escape(b.name)}" x="{x + 8:.1f}" '
            f'y="{y + 34 + LINE_H * k:.1f}" fill="#b91c1c"{BOLD}></text>'
            for k, what in enumerate(("count", "rate"), 1)
        ]
    if b.note:
        parts.append(
            f'<text x="{x:.1f}" y="{y + _box_h(live) + 11:.1f}" fill="#0f766e">{escape(_cut(b.note))}</text>'
        )
    return "".join(parts) + "</g>"


def _curve(x1: float, y1: float, x2: float, y2: float) -> str:
    mx = (x1 + x2) / 2
    return f"M{x1:.1f},{y1:.1f} C{mx:.1f},{y1:.1f} {mx:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"


def _svg_line(line: Line, at: dict[str, Place], ident: int, live: bool) -> str:
    sx, sy, sw, _ = at[line.source]
    tx, ty, _, _ = at[line.target]
    lx, ly, lw, lh = at["arc:" + line.name]
    colour = _DOT_COLOURS[line.kind]
    texts = _texts(line)
    path = (
        _curve(sx + sw, sy + _box_h(live) / 2, lx, ly + lh / 2)
        + " "
        + _curve(lx + lw, ly + lh / 2, tx, ty + _box_h(live) / 2)
    )
    label = "".join(
        f'<text x="{lx + 4:.1f}" y="{ly + 13 + LINE_H * i:.1f}"{BOLD if i == 0 else ""}>'
        f"{escape(_cut(t))}</text>"
        for i, t in enumerate(texts)
    )
    count = (
        f'<text class="live" data-arc-count="{escape(line.name)}" x="{lx + 4:.1f}" y="{ly - 3:.1f}" '
        f'fill="{colour}"></text>'
        if live
        else ""
    )
    return (
        f'<g class="arc arc-{line.kind}" data-arc="{escape(line.name)}" data-source="{escape(line.source)}" '
        f'data-target="{escape(line.target)}"><title>{escape(chr(10).join(texts))}</title>'
        f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="1.6" '
        f'marker-end="url(#head-{line.kind}-{ident})"/>'
        f'<rect x="{lx:.1f}" y="{ly:.1f}" width="{lw:.1f}" height="{lh:.1f}" rx="3" fill="#ffffff" '
        f'stroke="{colour}" stroke-width="0.6"/><g class="label" fill="{colour}">{label}</g>{count}</g>'
    )


def to_svg(d: Drawing, *, live: bool = False, ident: int = 0) -> str:
    """``d`` as an SVG element (see the module note); ``live`` leaves a place in each box and
    above each arc's label for the counts the console fills in; ``ident`` keeps the marker ids
    of several drawings on one page apart."""
    at, width, height = _place(d, live)
    markers = "".join(
        f'<marker id="head-{kind}-{ident}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" '
        f'markerHeight="8" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="{colour}"/></marker>'
        for kind, colour in _DOT_COLOURS.items()
    )
    body = [_svg_line(line, at, ident, live) for line in d.lines]
    body += [_svg_box(b, at[b.name], live) for b in d.boxes]
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="flow-drawing" width="{width:.0f}" '
        f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" font-family="monospace" '
        f'font-size="11"><title>{escape(d.title)}</title><defs>{markers}</defs>{"".join(body)}</svg>'
    )
