"""A bad flow is refused with a message naming the arc or space and what is wrong."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from flowbus.flow import FlowBuilder, FlowError, graph_from_spec, load_spec
from flowbus.flow.graph import Collapse

BASE: dict[str, Any] = {
    "name": "small",
    "lookups": {"NYS": {"IBM": "IBM"}},
    "spaces": {
        "NYSE": {"kind": "source", "schema": {"issue": "str", "price": "float", "vol": "int"}},
        "combined": {"kind": "events", "schema": {"com": "str", "price": "float", "vol": "int"}},
        "big": {"kind": "sink", "schema": {"com": "str", "price": "float", "vol": "int"}},
        "ticks": {"kind": "events", "schema": {"name": "str", "price": "float"}},
        "st": {
            "kind": "state",
            "schema": {"name": "str", "maxP": "float", "curP": "float"},
            "key": ["name"],
            "initial": {"maxP": 0, "curP": 0},
        },
        "out": {"kind": "sink", "schema": {"name": "str", "price": "float"}},
    },
    "rulesets": {
        "mc": {
            "key": {"name": "name"},
            "rules": [
                {"when": "price > maxP", "set": {"maxP": "price", "curP": "price"}},
                {"set": {"curP": "price"}},
            ],
        }
    },
    "arcs": [
        {
            "name": "T1",
            "from": "NYSE",
            "to": "combined",
            "transform": {"com": "NYS(issue)", "price": "price", "vol": "vol"},
        },
        {"name": "S", "from": "combined", "to": "big", "select": "price * vol >= 1000000"},
        {"name": "T2", "from": "combined", "to": "ticks", "transform": {"name": "com", "price": "price"}},
        {"name": "C", "from": "ticks", "to": "st", "collapse": "mc"},
        {"name": "E", "from": "st", "to": "out", "expand": "mc"},
    ],
}


def spec(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        *parents, last = path.split("__")
        node: Any = data
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if value is None:
            del node[last]
        else:
            node[int(last) if isinstance(node, list) else last] = value
    return data


def test_the_base_spec_is_valid() -> None:
    g = graph_from_spec(BASE)
    assert [a.name for a in g.arcs] == ["T1", "S", "T2", "C", "E"]


CASES: list[tuple[dict[str, Any], str]] = [
    (spec(arcs__0__from="NYS"), "transform arc 'T1': from unknown space 'NYS' (did you mean 'NYSE'?)"),
    (spec(arcs__1__to="combined"), "the graph has a cycle: combined (S) -> combined"),
    (spec(arcs__1__select="price >"), "select arc 'S': unexpected end of filter"),
    (spec(arcs__1__select="volume > 3"), "select arc 'S': unknown field 'volume'"),
    (spec(arcs__2__to="big"), "transform arc 'T2': output 'name' is not a field of 'big'"),
    (spec(arcs__2__transform={"name": "com"}), "transform arc 'T2': no output for price of 'ticks'"),
    (
        spec(arcs__2__transform={"name": "com", "price": "prise"}),
        "unknown field 'prise' (did you mean 'price'?)",
    ),
    (spec(arcs__0__transform__com="NYX(issue)"), "output 'com': unknown function or lookup table 'NYX'"),
    (
        spec(arcs__0__transform__com="NYS(issue"),
        "transform arc 'T1': output 'com': `NYS(issue` is not an expression",
    ),
    (spec(arcs__2__transform__price="com"), "output 'price': `com` is a str, the schema says float"),
    (spec(arcs__2__transform__price="com * 2"), "`com * 2` does arithmetic on `com`, a str"),
    (
        spec(spaces__big__schema={"com": "str", "price": "float"}),
        "a select keeps the schema, but 'combined' is [com: str, price: float, vol: int] and 'big' is",
    ),
    (
        spec(arcs__1__from="big", arcs__1__to="combined"),
        "sink 'big' has an out-arc (S): sinks have only in-arcs",
    ),
    (
        {
            **spec(),
            "arcs": [
                *BASE["arcs"],
                {
                    "name": "back",
                    "from": "ticks",
                    "to": "combined",
                    "transform": {"com": "name", "price": "price", "vol": "1"},
                },
            ],
        },
        "the graph has a cycle: combined (T2) -> ticks (back) -> combined",
    ),
    (spec(spaces__st__initial={"maxP": 0}), "state 'st': no initial value for curP"),
    (spec(spaces__st__key=["nam"]), "state 'st': key 'nam' is not in the schema"),
    (spec(spaces__NYSE__kind="table"), "space 'NYSE': unknown kind 'table'"),
    (spec(spaces__NYSE__schema={"issue": "string"}), "schema field 'issue' has unknown type 'string'"),
    (
        spec(rulesets__mc__key={"nom": "name"}),
        "collapse arc 'C': rule set 'mc' keys on nom, the state's key is name",
    ),
    (spec(rulesets__mc__rules=[{"set": {"name": "price"}}]), "rule 1: sets 'name', which is the state's key"),
    (spec(rulesets__mc__rules=[{"set": {"maxQ": "price"}}]), "rule 1: sets 'maxQ', which is not a component"),
    (
        spec(rulesets__mc__rules=[{"when": "prize > 1", "set": {"curP": "price"}}]),
        "rule 1 (when): unknown field 'prize'",
    ),
    (spec(rulesets__mc__rules=[{"set": {"curP": "price"}, "sets": {}}]), "rule 1: unknown key 'sets'"),
    (spec(arcs__3__collapse="nope"), "collapse arc 'C': unknown rule set 'nope' (rule sets: mc)"),
    (spec(arcs__3__to="combined"), "collapse arc 'C': to space 'combined' must be a state"),
    (spec(arcs__4__from="ticks"), "expand arc 'E': from space 'ticks' must be a state"),
    (spec(arcs__0__select="true"), "arc 1 (T1): needs exactly one of select, transform, collapse, expand"),
    (spec(arcs__0__frm="NYSE"), "arc 1: unknown key 'frm'"),
    (spec(oops=1), "top level: unknown key 'oops'"),
    (spec(arcs=None), "top level: missing key 'arcs'"),
    (spec(lookups__NYS="missing.yaml#NYS"), "lookup 'NYS': cannot read"),
]


@pytest.mark.parametrize(("data", "message"), CASES, ids=[m[:40] for _, m in CASES])
def test_bad_specs_are_refused_naming_the_culprit(data: dict[str, Any], message: str) -> None:
    with pytest.raises(FlowError) as info:
        graph_from_spec(data)
    assert message in str(info.value)


def test_degree_rules() -> None:
    def base() -> FlowBuilder:
        b = FlowBuilder().source("a", {"x": "int"}).sink("z", {"x": "int"}).events("m", {"x": "int"})
        return b.state("st", {"x": "int", "n": "int"}, key="x", initial={"n": 0})

    with pytest.raises(FlowError, match="source 'a' has an in-arc"):
        base().select("s", "m", "a", "true").build()
    with pytest.raises(FlowError, match="sink 'z' has an out-arc"):
        base().select("s", "z", "m", "true").build()
    rules = {"key": "x", "rules": [{"set": {"n": "n + 1"}}]}
    with pytest.raises(
        FlowError, match=r"state 'st' must have exactly one in-arc, a collapse \(has: c1, c2\)"
    ):
        base().collapse("c1", "a", "st", rules).collapse("c2", "m", "st", rules).build()
    with pytest.raises(
        FlowError, match="state 'st' must have exactly one in-arc, a collapse \\(has: none\\)"
    ):
        base().build()
    with pytest.raises(FlowError, match="arc 's' is defined twice"):
        base().collapse("c", "a", "st", rules).select("s", "a", "m", "true").select(
            "s", "a", "z", "true"
        ).build()


def test_expand_rules_must_determine_whole_events() -> None:
    def graph(rules: dict[str, Any], out: dict[str, str]) -> None:
        b = FlowBuilder().source("a", {"k": "str", "v": "int"}).sink("z", out)
        b.state("st", {"k": "str", "n": "int", "last": "int"}, key="k", initial={"n": 0, "last": 0})
        b.collapse("c", "a", "st", {"key": "k", "rules": [{"set": {"n": "n + 1", "last": "v"}}]})
        b.expand("e", "st", "z", rules).build()

    graph({"key": "k", "rules": [{"set": {"last": "v"}}]}, {"k": "str", "v": "int"})  # fine
    with pytest.raises(FlowError, match="expand arc 'e': event field 'w' is read by no rule"):
        graph({"key": "k", "rules": [{"set": {"last": "v"}}]}, {"k": "str", "v": "int", "w": "int"})
    with pytest.raises(FlowError, match="tracks only the components its rules set"):
        graph({"key": "k", "rules": [{"when": "n > 1", "set": {"last": "v"}}]}, {"k": "str", "v": "int"})
    with pytest.raises(FlowError, match="'last' is both an event field and a state component"):
        graph({"key": "k", "rules": [{"set": {"last": "last"}}]}, {"k": "str", "last": "int"})
    graph({"key": "k", "rules": [{"set": {"last": "event.last"}}]}, {"k": "str", "last": "int"})  # fine


def test_yaml_errors_name_the_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("spaces:\n  a: {kind: source\n", encoding="utf-8")
    with pytest.raises(FlowError, match=r"bad.yaml: not valid YAML at line 3"):
        load_spec(bad)
    with pytest.raises(FlowError, match="cannot read spec"):
        load_spec(tmp_path / "absent.yaml")
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(FlowError, match=r"wrong\.yaml: a spec is a mapping"):
        load_spec(wrong)


def test_lookup_files_resolve_next_to_the_spec(tmp_path: Path) -> None:
    (tmp_path / "tables.json").write_text('{"NYS": {"IBM": "IBM"}}', encoding="utf-8")
    data = spec(lookups__NYS="tables.json#NYS")
    g = graph_from_spec(data, base=tmp_path)
    assert dict(g.functions["NYS"]) == {"IBM": "IBM"}  # type: ignore[call-overload]
    with pytest.raises(FlowError, match="has no table 'NAS'"):
        graph_from_spec(spec(lookups__NYS="tables.json#NAS"), base=tmp_path)


def test_builder_and_yaml_give_the_same_graph() -> None:
    b = FlowBuilder("small").lookup("NYS", {"IBM": "IBM"})
    for name, s in BASE["spaces"].items():
        if s["kind"] == "state":
            b.state(name, s["schema"], key=s["key"], initial=s["initial"])
        else:
            getattr(b, s["kind"])(name, s["schema"])
    b.rules("mc", **BASE["rulesets"]["mc"])
    b.transform("T1", "NYSE", "combined", {"com": "NYS(issue)", "price": "price", "vol": "vol"})
    b.select("S", "combined", "big", "price * vol >= 1000000")
    b.transform("T2", "combined", "ticks", {"name": "com", "price": "price"})
    b.collapse("C", "ticks", "st", "mc").expand("E", "st", "out", "mc")
    built, loaded = b.build(), graph_from_spec(BASE)
    assert built == loaded
    assert isinstance(built.arc("C"), Collapse)


# ------------------------------------------- an expand must make what its collapse makes (issue 16, item 8)

BOTH = {"key": {"name": "name"}, "rules": [{"set": {"maxP": "price", "curP": "price"}}]}


def test_an_expand_that_cannot_make_what_its_collapse_makes_is_refused() -> None:
    # the collapse makes <50, 50> after 100 then 50; max_cur's maximum never decreases
    with pytest.raises(FlowError) as info:
        graph_from_spec(spec(arcs__3__collapse=BOTH))
    message = str(info.value)
    assert "expand arc 'E'" in message and "collapse arc 'C'" in message
    assert "first rule has a `when`" in message


def _reach(expand: dict[str, Any], out: dict[str, str] | None = None) -> None:
    """The base spec with the collapse BOTH and this expand into ``out``."""
    data = spec(arcs__3__collapse=BOTH, arcs__4__expand=expand)
    data["spaces"]["out"]["schema"] = out or {"name": "str", "price": "float"}
    graph_from_spec(data)


def test_an_expand_whose_first_rule_writes_any_row_is_accepted() -> None:
    free = {"key": {"name": "name"}, "rules": [{"set": {"maxP": "hi", "curP": "lo"}}]}
    _reach(free, {"name": "str", "hi": "float", "lo": "float"})
    _reach({"key": {"name": "name"}, "rules": [{"set": {"curP": "price"}}]})  # tracks curP only
    later = {"when": "hi > 1", "set": {"curP": "hi"}}  # never fires: the first rule takes every event
    _reach({**free, "rules": [*free["rules"], later]}, {"name": "str", "hi": "float", "lo": "float"})


@pytest.mark.parametrize(
    ("expand", "out", "wanted"),
    [
        (
            {"key": "name", "rules": [{"when": "price > 0", "set": {"maxP": "hi", "curP": "lo"}}]},
            {"name": "str", "price": "float", "hi": "float", "lo": "float"},
            "first rule has a `when`",
        ),
        (
            {
                "key": "name",
                "rules": [{"set": {"maxP": "price", "curP": "price"}}, {"set": {"curP": "price"}}],
            },
            None,
            "sets 'maxP' and 'curP' from one field, 'price'",
        ),
        (
            {"key": "name", "rules": [{"set": {"maxP": "hi + 0", "curP": "lo"}}]},
            {"name": "str", "hi": "float", "lo": "float"},
            "sets 'maxP' to `hi + 0`, not to a field of the event",
        ),
        (
            {"key": "name", "rules": [{"set": {"maxP": "hi", "curP": "lo"}}]},
            {"name": "str", "hi": "int", "lo": "float"},
            "sets 'maxP' (a float) from 'hi', an int",
        ),
        (
            {"key": "name", "rules": [{"set": {"curP": "lo"}}, {"set": {"maxP": "hi"}}]},
            {"name": "str", "hi": "float", "lo": "float"},
            "first rule does not set 'maxP'",
        ),
    ],
)
def test_why_an_expand_is_refused(expand: dict[str, Any], out: dict[str, str] | None, wanted: str) -> None:
    with pytest.raises(FlowError) as info:
        _reach(expand, out)
    message = str(info.value)
    assert "expand arc 'E'" in message and "collapse arc 'C'" in message and wanted in message


def test_the_collapses_own_rules_need_events_of_the_same_types() -> None:
    graph_from_spec(BASE)  # the same rule set over the same fields
    with pytest.raises(FlowError) as info:  # the collapse makes maxP = 1.5, no int price can
        graph_from_spec(spec(spaces__out__schema={"name": "str", "price": "int"}))
    assert "'price' is a float in the collapse's events, an int in the expand's" in str(info.value)


# -------------------------------------- a select constant the field cannot hold (issue 16, item 9)


@pytest.mark.parametrize(
    ("select", "wanted"),
    [
        ('vol = "x"', '`vol = "x"` compares the int field \'vol\' with the str "x"'),
        ('!(vol = "x")', '`!(vol = "x")` compares the int field \'vol\' with the str "x"'),
        ('vol != "x"', "compares the int field 'vol' with the str \"x\""),
        ('vol in {1, "x"}', "compares the int field 'vol' with the str \"x\""),
        ("com > 3", "compares the str field 'com' with the int 3"),
        ("com = true", "compares the str field 'com' with the bool true"),
        ('vol prefix "x"', "prefix needs a str field, 'vol' is an int"),
        ('price contains "1"', "contains needs a str field, 'price' is a float"),
        ("vol = 1.5", "'vol' is an int field, it never equals 1.5"),
        ("vol not in {1, 2.5}", "'vol' is an int field, it never equals 2.5"),
        ('price * vol = "x"', '`price * vol = "x"` compares a float with a str'),
        ("com prefix NYS(com) & vol > com", "`vol > com` compares an int with a str"),
        ("vol prefix com", "`vol prefix com`: prefix needs strings, `vol` is an int"),
    ],
)
def test_a_select_constant_the_field_cannot_have_is_refused(select: str, wanted: str) -> None:
    with pytest.raises(FlowError) as info:
        graph_from_spec(spec(arcs__1__select=select))
    message = str(info.value)
    assert message.startswith("select arc 'S': ") and wanted in message, message


@pytest.mark.parametrize(
    "select",
    [
        "vol = 2.0",
        "vol > 1.5",
        "price = 3",
        'com prefix "I"',
        "exists vol",
        "price * vol >= 1000000",
        'NYS(com) = "IBM"',
        'com in {"IBM", "HP"}',
        "vol in {1, 2.0}",
        "price < vol",
    ],
)
def test_a_select_constant_of_the_fields_type_is_accepted(select: str) -> None:
    graph_from_spec(spec(arcs__1__select=select))


def test_a_boolean_field_takes_boolean_constants() -> None:
    b = FlowBuilder().source("a", {"ok": "bool", "n": "int"}).sink("z", {"ok": "bool", "n": "int"})
    b.select("S", "a", "z", "ok = true & n > 0").build()
    with pytest.raises(FlowError, match=r"select arc 'T': .*compares the bool field 'ok' with the int 1"):
        FlowBuilder().source("a", {"ok": "bool"}).sink("z", {"ok": "bool"}).select(
            "T", "a", "z", "ok = 1"
        ).build()
