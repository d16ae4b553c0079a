"""The drawings of a flow (flow/draw.py, flow/html.py): every space and arc drawn, the rewritten
view one route per publication -> subscription path with its S, T and shared subexpressions,
a layout whose arcs all go left to right and whose things never overlap, DOT that names
everything, and a page that fetches nothing."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from tests.flow.conftest import STOCKS, figure2
from tests.flows.specgen import random_deployment

from flowbus.flow import Graph, find_paths, load_spec
from flowbus.flow.draw import Drawing, _place, drawings, to_dot, to_svg
from flowbus.flow.html import flow_page

SVG = "{http://www.w3.org/2000/svg}"


def _groups(svg: str, cls: str) -> list[ET.Element]:
    root = ET.fromstring(svg)
    return [g for g in root.iter(f"{SVG}g") if cls in (g.get("class") or "").split()]


def test_the_stock_flow_as_written_has_every_space_by_kind_and_every_arc_with_its_expression() -> None:
    g = load_spec(STOCKS)
    before, _ = drawings(g)
    kinds = {b.name: b.kind for b in before.boxes}
    assert kinds == {s.name: getattr(s, "kind", "state") for s in g.spaces}
    assert kinds["max_cur"] == "state" and kinds["NYSE"] == "source" and kinds["alarms"] == "sink"
    assert {b.name: b.roles for b in before.boxes}["combined"] == ("publication", "subscription")
    lines = {line.name: line for line in before.lines}
    assert set(lines) == {a.name for a in g.arcs}
    assert lines["S"].kind == "select" and lines["S"].label == ("cap >= 1000000",)
    assert lines["T3"].label == ("[com, cap=price * vol]",)
    assert (lines["C4"].kind, lines["C4"].label) == ("collapse", ("rule set max_cur",))
    assert lines["E5"].kind == "expand"
    svg = to_svg(before)
    drawn = {x.get("data-space"): x.get("data-kind") for x in _groups(svg, "space")}
    assert drawn == kinds
    assert {x.get("data-arc") for x in _groups(svg, "arc")} == set(lines)


def test_the_rewritten_view_has_one_route_per_path_with_its_select_transform_and_shared_parts() -> None:
    g = load_spec(STOCKS)
    _, after = drawings(g)
    routes = [line for line in after.lines if line.kind == "route"]
    pairs = [(line.source, line.target) for line in routes]
    assert sorted(pairs) == sorted((p.source, p.sink) for p in find_paths(g))
    assert len(set(pairs)) == len(pairs) == 10
    big = next(line for line in routes if (line.source, line.target) == ("NASDAQ", "big_trades"))
    assert big.label == (
        "S: price * vol >= 1000000",
        "T: [com=NAS(issue), cap=price * vol]",
        "shared: price * vol",
    )
    assert {line.kind for line in after.lines} == {"route", "collapse", "expand"}
    notes = {b.name: b.note for b in after.boxes}
    assert notes["NYSE"] == "computed once: NYS(issue), price * vol"  # (shared by its three routes)
    svg = to_svg(after)
    drawn = [(x.get("data-source"), x.get("data-target")) for x in _groups(svg, "arc-route")]
    assert sorted(drawn) == sorted(pairs)


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def _check_layout(d: Drawing, live: bool = False) -> None:
    at, width, height = _place(d, live)
    for line in d.lines:  # space -> its label -> the target space, left to right
        src, label, dst = at[line.source], at["arc:" + line.name], at[line.target]
        assert src[0] + src[2] < label[0] and label[0] + label[2] < dst[0], line
    things = list(at.items())
    for i, (n, a) in enumerate(things):
        assert a[0] >= 0 and a[0] + a[2] <= width and a[1] >= 0 and a[1] + a[3] <= height, n
        for m, b in things[i + 1 :]:
            assert not _overlap(a, b), (n, m)


@pytest.mark.parametrize("seed", [1, 2, 3, 5, 8])
def test_random_flows_are_laid_out_left_to_right_without_overlaps(seed: int) -> None:
    g = random_deployment(seed).graph
    for d in drawings(g):
        _check_layout(d)
        _check_layout(d, live=True)
        svg = to_svg(d, live=True)
        assert len(_groups(svg, "space")) == len(d.boxes)
        assert {
            x.get("data-count") for x in ET.fromstring(svg).iter(f"{SVG}text") if x.get("data-count")
        } == {b.name for b in d.boxes}
    _check_layout(drawings(load_spec(STOCKS))[1])


def test_dot_names_every_space_and_arc_and_escapes_quotes() -> None:
    g: Graph = figure2()
    before, after = drawings(g)
    dot = to_dot(before)
    assert dot.startswith('digraph "flow figure2: as written') and dot.rstrip().endswith("}")
    for s in g.spaces:
        assert re.search(rf'^  "{s.name}" \[shape=\w+, label="{s.name}\\n', dot, re.M), s.name
    edges = re.findall(r'^  "(\w+)" -> "(\w+)" \[label="(\w+): (\w+)', dot, re.M)
    assert sorted(edges) == sorted((a.source, a.target, a.name, a.kind) for a in g.arcs)
    rewritten = to_dot(after)
    assert rewritten.count(' -> "big_trades"') == 3
    assert (
        '"combined.pub" -> "big_trades" [label="combined.pub->big_trades: route\\nS: price * vol >= 1000000'
        in (rewritten)
    )
    quoted = to_dot(Drawing('a "b"', (), ()))
    assert quoted.startswith('digraph "a \\"b\\"" {')


def test_the_page_has_both_drawings_the_paths_and_fetches_nothing() -> None:
    g = load_spec(STOCKS)
    page = flow_page(g)
    assert page.count("<svg") == 2
    assert re.findall(r"(?:src|href)=", page) == []  # no script, no stylesheet, no image to fetch
    assert re.findall(r"https?://[^\"]*", page) == ["http://www.w3.org/2000/svg"] * 2
    assert page.count("<tr><td>NYSE</td><td>big_trades</td><td>T1; T3; S</td>") == 1
    assert "Tagged transforms" in page and "_source" in page
