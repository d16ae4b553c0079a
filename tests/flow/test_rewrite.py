"""The rewrite of section 4.1: the paper's Figure 2 reproduced, the rules one by one, tagged transforms."""

from __future__ import annotations

import pytest

from flowbus.filters import parse
from flowbus.filters.ast import BinOp, Call, Field
from flowbus.filters.expr import parse_expression
from flowbus.flow import FlowBuilder, Graph, LocalRun, Route, rewrite, tag
from flowbus.flow.explain import explain_json, explain_text
from flowbus.flow.graph import Collapse, Expand, outputs_text
from flowbus.flow.rewrite import RoutePath, Step, find_paths, merge_transforms, push_select, reduce_path

S1 = parse("price*vol >= 1000000")
T4 = {"com": parse_expression("NYS(issue)"), "cap": parse_expression("price*vol")}
T5 = {"com": parse_expression("NAS(issue)"), "cap": parse_expression("price*vol")}
T6 = {"com": parse_expression("com"), "cap": parse_expression("price*vol")}
PAPER = {
    # source: (arcs of the path, inputs, the transform printed in the paper)
    "NYSE": (
        ("T1", "T3", "S"),
        ("issue", "price", "vol"),
        T4,
        "[issue, price, vol] => [com=NYS(issue), cap=price*vol]",
    ),
    "NASDAQ": (
        ("T2", "T3", "S"),
        ("issue", "price", "vol"),
        T5,
        "[issue, price, vol] => [com=NAS(issue), cap=price*vol]",
    ),
    "combined.pub": (("T3", "S"), ("com", "price", "vol"), T6, "[com, price, vol] => [com, cap=price*vol]"),
}


def _to_big_trades(g: Graph) -> dict[str, RoutePath]:
    return {p.source: p for p in find_paths(g) if p.sink == "big_trades"}


@pytest.mark.parametrize("which", ["builder", "yaml"])
def test_figure2_reduces_to_s1_then_t4_t5_t6(which: str, fig2: Graph, stocks: Graph) -> None:
    paths = _to_big_trades(fig2 if which == "builder" else stocks)
    assert sorted(paths) == sorted(PAPER)
    for source, (via, inputs, transform, printed) in PAPER.items():
        p = paths[source]
        assert p.via == via
        assert p.step.select == S1
        assert p.step.inputs == inputs
        assert dict(p.step.outputs) == transform
        assert p.step.requires == ()
        text = outputs_text(p.step.inputs, p.step.outputs)
        assert text.replace(" * ", "*") == printed


def test_figure2_select_is_an_expression_predicate_on_the_product(fig2: Graph) -> None:
    (lit,) = _to_big_trades(fig2)["NYSE"].step.select.disjuncts[0].literals
    assert lit.left == BinOp("*", Field("price"), Field("vol"))  # type: ignore[union-attr]
    assert lit.right.value == 1000000  # type: ignore[union-attr]


def test_figure2_shared_subexpression_is_the_product(fig2: Graph) -> None:
    for p in _to_big_trades(fig2).values():
        assert p.shared == [BinOp("*", Field("price"), Field("vol"))]


def test_externalized_points_and_identity_paths(fig2: Graph) -> None:
    pairs = {(p.source, p.sink): p.via for p in find_paths(fig2)}
    assert pairs[("NYSE", "combined.sub")] == ("T1",)
    assert pairs[("combined.pub", "combined.sub")] == ()
    r = rewrite(fig2)
    names = {s.name: s for s in r.spaces}
    assert set(names) == {"NYSE", "NASDAQ", "combined.pub", "combined.sub", "big_trades"}
    assert names["combined.pub"].kind == "source"  # type: ignore[union-attr]
    assert names["combined.sub"].kind == "sink"  # type: ignore[union-attr]
    assert all(isinstance(a, Route) for a in r.arcs) and len(r.arcs) == 6


def test_explain_json_has_the_paper_paths(stocks: Graph) -> None:
    doc = explain_json(stocks)
    found = {(p["source"], p["sink"]): p for p in doc["paths"]}
    p = found[("NYSE", "big_trades")]
    assert parse(p["select"]) == S1
    assert {k: parse_expression(v) for k, v in p["transform"].items()} == T4
    assert set(p) == {"source", "sink", "select", "transform"}
    assert found[("drops", "alarms")]["select"] == "drop > 20"


def test_explain_text_lists_before_and_after(stocks: Graph) -> None:
    text = explain_text(stocks)
    before, after = text.split("after rewriting")
    assert "T3: combined -> capital  transform  [com, price, vol] => [com, cap=price * vol]" in before
    assert "NYSE -> big_trades   (T1; T3; S)" in after
    assert "S: price * vol >= 1000000" in after
    assert "T: [issue, price, vol] => [com=NYS(issue), cap=price * vol]" in after
    assert "computed once for S and T: price * vol" in after
    assert "tagged transforms" in after


def test_rewrite_is_idempotent(stocks: Graph) -> None:
    once = rewrite(stocks)
    twice = rewrite(once)
    assert [s.name for s in twice.spaces] == [s.name for s in once.spaces]

    def routes(g: Graph) -> set[tuple[object, ...]]:
        return {(a.source, a.target, a.select, a.outputs, a.requires) for a in g.arcs if isinstance(a, Route)}

    assert routes(twice) == routes(once)


def test_stateful_arcs_are_kept_and_reattached(stocks: Graph) -> None:
    r = rewrite(stocks)
    stateful = {a.name: (a.source, a.target) for a in r.arcs if isinstance(a, (Collapse, Expand))}
    assert stateful == {
        "C4": ("ticks", "max_cur"),
        "E4": ("max_cur", "compressed"),
        "C5": ("ticks", "trends"),
        "E5": ("trends", "drops"),
    }


# ------------------------------------------------------------------ the rules


def test_push_select_substitutes_the_transform() -> None:
    ta = (("y1", parse_expression("f(x1, x2, 3)")), ("y2", parse_expression("x1 + 1")))
    sa = parse("y1 > 2 & y2 = 5")
    assert push_select(ta, sa) == parse("f(x1, x2, 3) > 2 & x1 + 1 = 5")


def test_predicate_on_a_renamed_field_stays_a_predicate() -> None:
    assert push_select((("y", Field("x")),), parse("y in {1, 2} & exists y")) == parse(
        "x in {1, 2} & exists x"
    )


def test_predicate_on_a_constant_folds() -> None:
    assert push_select((("y", parse_expression("2 * 3")),), parse("y = 6")) == parse("true")
    assert push_select((("y", parse_expression("6")),), parse("y < 6 | z = 1")) == parse("z = 1")


def test_merge_transforms_substitutes_the_first_into_the_second() -> None:
    t1 = (("y1", parse_expression("x + 1")), ("y2", parse_expression("g(x)")))
    t2 = (("z", parse_expression("y1 * y2")), ("w", parse_expression("y1 - 1")))
    assert dict(merge_transforms(t1, t2)) == {
        "z": parse_expression("(x + 1) * g(x)"),
        "w": parse_expression("x + 1 - 1"),
    }


def test_t_t_s_t_s_t_becomes_s_t() -> None:
    b = FlowBuilder().function("g", abs)
    for name in "ABCDEFG":
        b.events(name, {"x": "float", "y": "float"}) if name not in "AG" else None
    b.source("A", {"x": "float", "y": "float"}).sink("G", {"x": "float", "y": "float"})
    b.transform("t1", "A", "B", {"x": "x + 1", "y": "y"})
    b.transform("t2", "B", "C", {"x": "x", "y": "g(y)"})
    b.select("s1", "C", "D", "x > 2")
    b.transform("t3", "D", "E", {"x": "x * 2", "y": "y"})
    b.select("s2", "E", "F", "x < y")
    b.transform("t4", "F", "G", {"x": "y", "y": "x"})
    g = b.build()
    (path,) = find_paths(g)
    assert path.step.select == parse("x + 1 > 2 & (x + 1) * 2 < g(y)")
    assert dict(path.step.outputs) == {"x": parse_expression("g(y)"), "y": parse_expression("(x + 1) * 2")}
    events = [{"x": float(x), "y": float(y)} for x in range(-3, 6) for y in range(-12, 13)]
    run = lambda graph: LocalRun(graph).run(("A", e) for e in events).outputs  # noqa: E731
    assert run(g) == run(rewrite(g)) and run(g)["G"]


def test_an_undefined_intermediate_still_drops_the_event() -> None:
    """T1 computes NYS(issue), which T2 then ignores: an unknown issue must still be dropped."""
    b = FlowBuilder().lookup("NYS", {"IBM": "IBM"})
    b.source("src", {"issue": "str", "price": "float"}).events("mid", {"com": "str", "p": "float"})
    b.sink("out", {"p": "float"})
    b.transform("T1", "src", "mid", {"com": "NYS(issue)", "p": "price"})
    b.transform("T2", "mid", "out", {"p": "p * 2"})
    g = b.build()
    (path,) = find_paths(g)
    assert path.step.requires == (Call("NYS", (Field("issue"),)),)
    events = [("src", {"issue": "IBM", "price": 1.0}), ("src", {"issue": "HP", "price": 2.0})]
    assert LocalRun(rewrite(g)).run(events).outputs == {"out": [{"p": 2.0}]}
    assert LocalRun(g).run(events).outputs == {"out": [{"p": 2.0}]}


def test_a_select_that_is_always_false_removes_the_path() -> None:
    b = FlowBuilder().source("a", {"x": "int"}).events("b", {"y": "int"}).sink("c", {"y": "int"})
    b.transform("t", "a", "b", {"y": "3"}).select("s", "b", "c", "y > 5")
    g = b.build()
    (path,) = find_paths(g)
    assert path.step.select == parse("false")
    assert not [a for a in rewrite(g).arcs if isinstance(a, Route)]


def test_reduce_path_of_nothing_is_the_identity() -> None:
    assert reduce_path(["a", "b"], []) == Step.identity(["a", "b"])


# -------------------------------------------------------- tagged transforms


def test_tagged_plan_delivers_what_the_routes_deliver(fig2: Graph) -> None:
    r = rewrite(fig2)
    plan = tag(r)
    assert plan.source_field == "_source"
    subs = dict(plan.subscriptions)
    assert subs["big_trades"] == parse(
        '_source = "NYSE" & price * vol >= 1000000 | _source = "NASDAQ" & price * vol >= 1000000'
        ' | _source = "combined.pub" & price * vol >= 1000000'
    )
    assert subs["combined.sub"] == parse('_source = "NYSE" | _source = "NASDAQ" | _source = "combined.pub"')
    table = dict(plan.table)
    (step,) = table[("NASDAQ", "big_trades")]
    assert dict(step.outputs) == T5
    trades = [
        ("NYSE", {"issue": "IBM", "price": 150.0, "vol": 10_000}),
        ("NASDAQ", {"issue": "AAPL", "price": 10.0, "vol": 5}),
        ("NASDAQ", {"issue": "NOPE", "price": 500.0, "vol": 5_000}),
        ("combined.pub", {"com": "Intel", "price": 50.0, "vol": 30_000}),
    ]
    for source, event in trades:
        local = LocalRun(r)
        local.publish(source, event)
        expected = {sink: evs for sink, evs in local.outputs.items() if evs}
        got: dict[str, list[object]] = {}
        for sink, out in plan.deliver(source, event):
            got.setdefault(sink, []).append(out)
        assert got == expected


def test_a_space_feeding_a_collapse_and_a_transform_is_split() -> None:
    b = FlowBuilder().source("src", {"k": "str", "v": "int"}).events("mid", {"k": "str", "v": "int"})
    b.sink("doubled", {"k": "str", "v": "int"}).sink("totals", {"k": "str", "v": "int"})
    b.state("sum", {"k": "str", "total": "int"}, key="k", initial={"total": 0})
    b.transform("t", "src", "mid", {"k": "k", "v": "v + 1"})
    b.collapse("c", "mid", "sum", {"key": "k", "rules": [{"set": {"total": "total + v"}}]})
    b.transform("d", "mid", "doubled", {"k": "k", "v": "v * 2"})
    b.expand("e", "sum", "totals", {"key": "k", "rules": [{"set": {"total": "v"}}]})
    g = b.build()
    r = rewrite(g)
    assert r.arc("c").source == "mid.sub" and {s.name for s in r.spaces} >= {"mid.sub", "src", "sum"}
    events = [("src", {"k": k, "v": v}) for k, v in [("a", 1), ("b", 5), ("a", 2), ("a", -4)]]
    original, rewritten = LocalRun(g).run(events), LocalRun(r).run(events)
    assert rewritten.outputs == original.outputs
    assert original.outputs["totals"] == [
        {"k": "a", "v": 2},
        {"k": "b", "v": 6},
        {"k": "a", "v": 5},
        {"k": "a", "v": 2},
    ]
    assert (
        rewritten.state_rows("sum")
        == original.state_rows("sum")
        == [{"k": "a", "total": 2}, {"k": "b", "total": 6}]
    )


def test_a_subexpression_of_both_select_and_transform_is_computed_once_per_event() -> None:
    calls: list[float] = []

    def f(x: float) -> float:
        calls.append(x)
        return x - 1

    b = FlowBuilder().function("f", f).source("a", {"x": "float"}).events("m", {"y": "float"})
    b.sink("z", {"y": "float", "w": "float"})
    b.transform("t1", "a", "m", {"y": "f(x)"}).transform("t2", "m", "z", {"y": "y", "w": "y * 2"})
    g = b.build()
    (path,) = find_paths(g)
    assert path.step.outputs == (("y", Call("f", (Field("x"),))), ("w", parse_expression("f(x) * 2")))
    b2 = FlowBuilder().function("f", f).source("a", {"x": "float"}).events("m", {"y": "float"})
    b2.events("n", {"y": "float"}).sink("z", {"y": "float", "w": "float"})
    b2.transform("t1", "a", "m", {"y": "f(x)"}).select("s", "m", "n", "y > 0")
    b2.transform("t2", "n", "z", {"y": "y", "w": "y * 2"})
    local = LocalRun(rewrite(b2.build()))
    for x in (0.5, 2.0, 3.0):
        local.publish("a", {"x": x})
    assert calls == [0.5, 2.0, 3.0]  # once per event, though S, and T's two outputs, all read f(x)
    assert local.outputs["z"] == [{"y": 1.0, "w": 2.0}, {"y": 2.0, "w": 4.0}]


def test_a_source_feeding_a_collapse_and_a_transform_gets_an_exit() -> None:
    """A source read by a collapse and by a transform: the rewrite routed the source to its
    exit ``src.sub`` for the collapse but never made that node, and refused the graph (a
    route "to unknown space 'src.sub'"): such a flow could be neither deployed nor run."""
    b = FlowBuilder().source("src", {"k": "str", "v": "int"})
    b.sink("doubled", {"k": "str", "v": "int"}).sink("totals", {"k": "str", "v": "int"})
    b.state("sum", {"k": "str", "total": "int"}, key="k", initial={"total": 0})
    b.collapse("c", "src", "sum", {"key": "k", "rules": [{"set": {"total": "total + v"}}]})
    b.transform("d", "src", "doubled", {"k": "k", "v": "v * 2"})
    b.expand("e", "sum", "totals", {"key": "k", "rules": [{"set": {"total": "v"}}]})
    g = b.build()
    r = rewrite(g)
    assert r.arc("c").source == "src.sub" and r.space("src").kind == "source"
    events = [("src", {"k": k, "v": v}) for k, v in [("a", 1), ("b", 5), ("a", 2)]]
    original, rewritten = LocalRun(g).run(events), LocalRun(r).run(events)
    assert rewritten.outputs == original.outputs
    assert original.outputs["totals"] == [{"k": "a", "v": 1}, {"k": "b", "v": 5}, {"k": "a", "v": 3}]
    assert original.outputs["doubled"] == [{"k": "a", "v": 2}, {"k": "b", "v": 10}, {"k": "a", "v": 4}]
