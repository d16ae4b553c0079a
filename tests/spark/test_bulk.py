"""Bulk matching on Spark against the matcher, brute force and the broadcast-hash-join baseline."""

from __future__ import annotations

import itertools
import json
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from flowbus.bench.workloads import Workload
from flowbus.cli.match import match
from flowbus.errors import FilterError, FlowbusError
from flowbus.filters import Filter, Predicate, parse
from flowbus.matching import Matcher, Strategy, SubscriptionError
from flowbus.matching.kernels import MAX_REQUIRED
from flowbus.spark.bulk import (
    Subscriptions,
    _baseline_table,
    build_matcher,
    bulk_match,
    join_baseline,
    match_events,
    parse_filter,
    read_events,
    read_subscriptions,
)

Pairs = list[tuple[int, Any]]


def _pairs(table: pa.Table) -> Pairs:
    return sorted(zip(table.column("event_id").to_pylist(), table.column("sub_id").to_pylist(), strict=True))


def _write_w1(tmp: Path, *, events: int, subs: int, workload: str = "w1") -> tuple[pa.Table, list[Any]]:
    wl = Workload(workload, 3)  # type: ignore[arg-type]
    table = wl.events(events)
    table = table.append_column("event_id", pa.array(range(1000, 1000 + events), pa.int64()))
    pq.write_table(table, tmp / "events.parquet")
    filters = [pair for chunk in wl.filters(subs) for pair in chunk]
    texts = [f.to_text() for _, f in filters]
    pq.write_table(pa.table({"sub_id": [i for i, _ in filters], "filter": texts}), tmp / "subs.parquet")
    return table, filters


# ------------------------------------------------------------------ without Spark


@pytest.mark.parametrize(
    "text",
    [
        'a0 = "v1" & a2 = "v3" & a1 = "v9"',
        'x = 3 & y >= -2 & z < 10 & w > "m" & v <= "q"',
        'a = "x" & a = "x"',
        'a = "x" & a = "y"',
        'a = "x" | b = "y"',
        'a != "x"',
        'a = "x\\"y"',
        'a = 1.5 & b = "z"',
        "  a=1&b=2  ",
        'a.b = "c"',
        'a = "&" & b = "c"',
        'TRUE = 1 & b = "c"',
        'b = 1 & a = 2 & c = "x"',
        "in2 = 1 & and_x = 2 & a.in = 3",
        "a = 99999999999999999999999 & b = -0",
    ],
)
def test_fast_path_reads_like_the_parser(text: str) -> None:
    assert parse_filter(text) == parse(text)


@pytest.mark.parametrize(
    "text", ['in = "x"', 'a = "x" &', 'a = "x', "", 'a = "x" & 3', "and.x = 1", 'b = 1 & TRUE.y = "z"']
)
def test_fast_path_refuses_what_the_parser_refuses(text: str) -> None:
    with pytest.raises(Exception) as fast:
        parse_filter(text)
    with pytest.raises(Exception) as slow:
        parse(text)
    assert type(fast.value) is type(slow.value)


def test_matcher_pickles_to_an_equal_answering_matcher() -> None:
    wl = Workload("w1-mixed", 5)
    m = Matcher(workers=2)
    for chunk in wl.filters(3000):
        m.add_many(chunk)
    m.add("s", 'a0 prefix "v1" & a2 != "v3"')
    events = wl.events(5000)
    before = [r.tolist() for r in m.match_batch(events)]
    m2 = pickle.loads(pickle.dumps(m))
    assert [r.tolist() for r in m2.match_batch(events)] == before
    assert [r.tolist() for r in m2.match_batch(events.drop_columns(["a0"]))] == [
        r.tolist() for r in m.match_batch(events.drop_columns(["a0"]))
    ]
    assert sum(map(len, before)) > 0
    m2.add("t", 'a4 = "v2"')  # still a working index after unpickling
    assert "t" in m2.match({"a4": "v2"})


# ------------------------------------------------------------------ the bulk paths without Spark

_TEXTS = [
    'a0 = "v1" & a2 = "v3" & a1 = "v9"',  # literals out of order
    'x = 3 & y >= -2 & z < 10 & w > "m" & v <= "q"',
    'a = "x" & a = "x"',  # a repeated attribute: the parser folds it
    'a0 = "v1" & a0 = "v2"',
    'a = "x" | b = "y"',
    'a = "&" & b = "c"',  # an & inside a string
    'a = 1.5 & b = "z"',
    "  a=1&b=2  ",
    'a.b = "c" & x = 007',
    "in2 = 1 & and_x = 2",
    'a\u00a0= 1 & b = "\u00e9 y"',  # a non-ASCII space between tokens
    "exists a & b = 1",
    "!(a = 1) & b = 2",
    'x >= 3 & x < 9 & y = "q"',
    'a0 = "v1" & a1 = "v2"',
    'a1 = "v2" & a0 = "v1"',
    'TRUE = 1 & b = "c"',
    'a0 prefix "v" & a2 != "v3"',
]


def test_read_subscriptions_gives_the_parsers_filters(tmp_path: Path) -> None:
    texts = _TEXTS * 3
    table = pa.table({"sub_id": [f"s{i}" for i in range(len(texts))], "filter": texts})
    pq.write_table(table, tmp_path / "subs.parquet", row_group_size=7)  # several chunks
    subs = read_subscriptions(tmp_path / "subs.parquet")
    want = [parse(t) for t in texts]
    assert subs.filters == want
    assert subs.fields == frozenset().union(*(f.fields() for f in want))
    plain = {texts[r] for r in subs.plain.rows.tolist()}
    assert 'a0 = "v1" & a2 = "v3" & a1 = "v9"' in plain and "  a=1&b=2  " in plain
    assert plain.isdisjoint(
        {'a = "x" & a = "x"', 'a = "&" & b = "c"', 'TRUE = 1 & b = "c"', "!(a = 1) & b = 2"}
    )
    codes, bounds = subs.plain.codes, subs.plain.offsets
    assert all((np.diff(codes[a:b]) > 0).all() for a, b in itertools.pairwise(bounds.tolist()))
    assert [p.sort_key() for p in subs.plain.predicates] == sorted(
        p.sort_key() for p in subs.plain.predicates
    )


def test_read_subscriptions_names_the_first_bad_row(tmp_path: Path) -> None:
    texts = ['a = "x"', 'a = "x" | b = 1', 'b = "y" & c = 2', "and.x = 1", 'a = "', 'c = "z"']
    pq.write_table(pa.table({"sub_id": list(range(10, 16)), "filter": texts}), tmp_path / "s.parquet")
    with pytest.raises(FlowbusError, match=r"row 4 \(sub_id 13\)"):
        read_subscriptions(tmp_path / "s.parquet")


def _csr(
    pairs: list[tuple[Any, Filter]], rng: random.Random
) -> tuple[list[Any], np.ndarray, np.ndarray, list[Predicate]]:
    """Columnar form with every literal its own (possibly equal) predicate, some rows out of order or
    with a literal twice."""
    preds: list[Predicate] = []
    offsets, codes = [0], []
    for _, f in pairs:
        (conj,) = f.disjuncts
        row = list(range(len(preds), len(preds) + len(conj.literals)))
        preds += conj.literals  # type: ignore[arg-type]
        rng.shuffle(row)
        if row and rng.random() < 0.1:
            row.append(row[0])
        codes += row
        offsets.append(len(codes))
    return [i for i, _ in pairs], np.asarray(offsets), np.asarray(codes), preds


_ONE_CONJUNCTION = [
    'x = 1 & s prefix "ab"',
    'x = 1.0 & y = "b"',
    'x in {1, 2, 3} & y != "a"',
    'y not in {"a", "b"} & x >= 2',
    "exists y",
    'y > "b" & y <= "d"',
    "x > 1 & x < 3 & x >= 1.5",
    's suffix "z" & s contains "b"',
    "true",
    "x < 2",
]


def _events(wl: Workload, n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = wl.events(n).to_pylist()
    for row in rows:
        if rng.random() < 0.8:
            row["x"] = rng.choice([0, 1, 1.0, 1.5, 2, 2.5, 3, 4, True])
        if rng.random() < 0.8:
            row["y"] = rng.choice(["a", "b", "bb", "c", "d", "e", 2])
        if rng.random() < 0.8:
            row["s"] = rng.choice(["abz", "abc", "xbz", "zz", ""])
    return rows


@pytest.mark.parametrize("strategy", ["counting", "clustering"])
@pytest.mark.parametrize("workload", ["w1", "w1-mixed", "w-rein"])
def test_add_conjunctions_answers_as_add_many(strategy: Strategy, workload: str) -> None:
    rng = random.Random(7)
    wl = Workload(workload, 11)  # type: ignore[arg-type]
    pairs: list[tuple[Any, Filter]] = [x for chunk in wl.filters(3000) for x in chunk]
    pairs += [(f"e{i}", parse(t)) for i, t in enumerate(_ONE_CONJUNCTION * 20)]
    events = _events(wl, 1500, 3)
    slow, fast = Matcher(strategy=strategy, workers=1), Matcher(strategy=strategy, workers=1)

    def same() -> None:
        assert len(slow) == len(fast)
        want = [r.tolist() for r in slow.match_batch(events)]
        assert [r.tolist() for r in fast.match_batch(events)] == want
        assert sum(map(len, want)) > 50

    slow.add_many(pairs)
    fast.add_conjunctions(*_csr(pairs, rng))
    same()
    gone = rng.sample([i for i, _ in pairs], len(pairs) // 2)
    for m in (slow, fast):
        for i in gone:
            m.remove(i)
    same()
    again = [(i, f) for i, f in pairs if i in set(gone[: len(gone) // 2])]
    again += [(f"n{i}", f) for i, f in pairs[:500]]
    slow.add_many(again)
    fast.add_conjunctions(*_csr(again, rng))  # reuses freed slots and subscription indexes
    same()
    for m in (slow, fast):
        for i, _ in again[::3]:
            m.remove(i)
    same()


def test_add_conjunctions_with_negations_answers_as_add_many() -> None:
    pairs = [
        (i, parse(t)) for i, t in enumerate(['!(x = 1) & y = "a"', '!(y prefix "b")', "x = 2", "!(x > 1)"])
    ]
    events = [{"x": x, "y": y} for x in (0, 1, 2, 3) for y in ("a", "bb", "c")] + [{}]
    slow, fast = Matcher(), Matcher()
    slow.add_many(pairs)
    fast.add_conjunctions(*_csr(pairs, random.Random(1)))
    assert [r.tolist() for r in fast.match_batch(events)] == [r.tolist() for r in slow.match_batch(events)]


def test_add_conjunctions_checks_as_add_many_and_changes_nothing() -> None:
    wide = parse(" & ".join(f"k{i} = 1" for i in range(MAX_REQUIRED + 1)))
    base = [(1, parse('a = "x"')), (2, parse('b = "y"'))]
    cases: list[list[tuple[Any, Filter]]] = [
        [(3, parse("c = 1")), (3, parse("c = 2"))],
        [(4, parse("c = 1")), (1, parse("c = 2"))],
        [(5, parse("c = 1")), (1.5, parse("c = 2"))],
        [(6, parse("c = 1")), (7, wide), (6, parse("d = 1"))],
        [(8, parse("c = 1")), (9, wide)],
    ]
    events = [{"a": "x", "b": "y", "c": 1, "d": 1}]
    for case in cases:
        slow, fast = Matcher(), Matcher()
        slow.add_many(base)
        fast.add_many(base)
        with pytest.raises((SubscriptionError, FilterError)) as want:
            slow.add_many(case)
        with pytest.raises((SubscriptionError, FilterError)) as got:
            fast.add_conjunctions(*_csr(case, random.Random(2)))
        assert (type(got.value), str(got.value)) == (type(want.value), str(want.value))
        assert len(fast) == 2 and fast.match_batch(events)[0].tolist() == [1, 2]
    with pytest.raises(FlowbusError, match="offsets"):
        Matcher().add_conjunctions([1, 2], np.array([0, 1]), np.array([0]), [Predicate("a", "=", 1)])


def test_build_matcher_of_mixed_subscriptions_answers_as_add_many(tmp_path: Path) -> None:
    wl = Workload("w1-mixed", 4)
    filters = [f for chunk in wl.filters(2000) for _, f in chunk] + [
        parse(t) for t in _TEXTS if "TRUE" not in t
    ]
    texts = [f.to_text() for f in filters]
    pq.write_table(pa.table({"sub_id": list(range(len(texts))), "filter": texts}), tmp_path / "s.parquet")
    subs = read_subscriptions(tmp_path / "s.parquet")
    assert 0 < subs.plain.rows.size < len(texts)
    events = wl.events(2000)
    want = Matcher(workers=1)
    want.add_many(enumerate(filters))
    for strategy in ("counting", "clustering"):
        got = build_matcher(subs, strategy=strategy)  # type: ignore[arg-type]
        assert [r.tolist() for r in got.match_batch(events)] == [r.tolist() for r in want.match_batch(events)]
    again = Subscriptions.of(subs.ids, subs.filters)
    assert again.filters == subs.filters and again.fields == subs.fields


def test_baseline_table_of_mixed_rows(tmp_path: Path) -> None:
    texts = ['a0 = "v1" & a2 = "v3"', 'a = "&" & b = "c"', 'a1 = "v2"', 'x = "1" & y = "2" & z = "3"']
    pq.write_table(pa.table({"sub_id": [5, 6, 7, 8], "filter": texts}), tmp_path / "s.parquet")
    table = _baseline_table(read_subscriptions(tmp_path / "s.parquet"))
    assert table.to_pylist() == [
        {
            "sub_id": 5,
            "attr0": "a0",
            "value0": "v1",
            "attr1": "a2",
            "value1": "v3",
            "attr2": None,
            "value2": None,
        },
        {
            "sub_id": 6,
            "attr0": "a",
            "value0": "&",
            "attr1": "b",
            "value1": "c",
            "attr2": None,
            "value2": None,
        },
        {
            "sub_id": 7,
            "attr0": "a1",
            "value0": "v2",
            "attr1": None,
            "value1": None,
            "attr2": None,
            "value2": None,
        },
        {"sub_id": 8, "attr0": "x", "value0": "1", "attr1": "y", "value1": "2", "attr2": "z", "value2": "3"},
    ]
    bad = ['a0 = "v1"', 'a = "x" | b = "y"', "b = 1"]
    pq.write_table(pa.table({"sub_id": [1, 2, 3], "filter": bad}), tmp_path / "bad.parquet")
    with pytest.raises(FlowbusError, match="subscription 2: the join baseline"):
        _baseline_table(read_subscriptions(tmp_path / "bad.parquet"))
    pq.write_table(pa.table({"sub_id": [1, 2], "filter": ['a0 = "v1"', "b = 1"]}), tmp_path / "bad2.parquet")
    with pytest.raises(FlowbusError, match="subscription 2: the join baseline"):
        _baseline_table(read_subscriptions(tmp_path / "bad2.parquet"))


# ------------------------------------------------------------------ on Spark


def test_bulk_match_equals_the_matcher_and_the_join_baseline(spark: Any, tmp_path: Path) -> None:
    events, filters = _write_w1(tmp_path, events=4000, subs=20_000)
    result = bulk_match(spark, tmp_path / "events.parquet", tmp_path / "subs.parquet", tmp_path / "out")
    got = _pairs(pq.read_table(tmp_path / "out"))
    m = Matcher()
    m.add_many(filters)
    want = sorted(
        (eid, int(sid))
        for eid, ids in zip(events.column("event_id").to_pylist(), m.match_batch(events), strict=True)
        for sid in ids
    )
    assert len(want) > 40
    assert got == want
    assert result.pairs == len(want) and result.subscriptions == 20_000
    subs = read_subscriptions(tmp_path / "subs.parquet")
    baseline = join_baseline(spark, read_events(spark, tmp_path / "events.parquet"), subs)
    assert "BroadcastHashJoin" in baseline._jdf.queryExecution().executedPlan().toString()
    assert _pairs(baseline.toArrow()) == want


def test_bulk_match_of_jsonl_events_and_csv_string_ids_agrees_with_brute_force(
    spark: Any, tmp_path: Path
) -> None:
    wl = Workload("w1-mixed", 8)
    rows = wl.events(300).to_pylist()
    for n, row in enumerate(rows):
        row["n"] = n
        if n % 7 == 0:
            del row["a1"]  # a missing attribute
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    filters = [(f"s{i}", f) for chunk in wl.filters(400) for i, f in chunk]
    filters += [
        ("p", parse('a0 prefix "v1" & !(a2 = "v3")')),
        ("q", parse('a1 < 50 | exists a1 & a3 = "v7"')),
    ]
    csv = "sub_id,filter\n" + "".join(
        f'{i},"{f.to_text().replace(chr(34), 2 * chr(34))}"\n' for i, f in filters
    )
    (tmp_path / "subs.csv").write_text(csv)
    bulk_match(spark, tmp_path / "events.jsonl", tmp_path / "subs.csv", tmp_path / "out")
    out = spark.read.parquet(str(tmp_path / "out"))
    ids = read_events(spark, tmp_path / "events.jsonl").select("event_id", "n").toArrow()
    n_of = dict(zip(ids.column("event_id").to_pylist(), ids.column("n").to_pylist(), strict=True))
    got = sorted((n_of[e], s) for e, s in _pairs(out.toArrow()))
    want = sorted((n, sid) for n, row in enumerate(rows) for sid, f in filters if _matches(f, row))
    assert out.schema["sub_id"].dataType.simpleString() == "string"
    assert len(want) > 20
    assert got == want


def _matches(f: Filter, row: dict[str, Any]) -> bool:
    return f.matches({k: v for k, v in row.items() if v is not None})


def test_match_events_on_an_empty_table_gives_no_pairs(spark: Any, tmp_path: Path) -> None:
    _write_w1(tmp_path, events=10, subs=50)
    subs = read_subscriptions(tmp_path / "subs.parquet")
    m = Matcher()
    m.add_many(zip(subs.ids, subs.filters, strict=True))
    empty = read_events(spark, tmp_path / "events.parquet").limit(0)
    assert match_events(spark, empty, m, subs).count() == 0


# ------------------------------------------------------------------ the command line


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """flowbus (test harness)."""

    app.command("match")(match)
    return app


def _run(*args: str) -> Any:
    return CliRunner().invoke(_app(), ["match", *args])


def test_cli_matches_and_prints_one_json_document(spark: Any, tmp_path: Path) -> None:
    _write_w1(tmp_path, events=500, subs=2000)
    res = _run(
        "--events", str(tmp_path / "events.parquet"), "--subscriptions", str(tmp_path / "subs.parquet"),
        "--out", str(tmp_path / "out"), "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["pairs"] == pq.read_table(tmp_path / "out").num_rows


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    _write_w1(tmp, events=20, subs=20)
    ev, subs, out = str(tmp / "events.parquet"), str(tmp / "subs.parquet"), str(tmp / "out")
    (tmp / "bad_filter.jsonl").write_text(
        '{"sub_id": 1, "filter": "a = \\"x\\""}\n{"sub_id": 2, "filter": "a = "}\n'
    )
    (tmp / "no_filter.csv").write_text("sub_id,text\n1,a\n")
    (tmp / "garbage.parquet").write_bytes(b"not parquet at all")
    (tmp / "dup.csv").write_text('sub_id,filter\n1,"a = 1"\n1,"b = 2"\n')
    (tmp / "taken").mkdir()
    (tmp / "taken" / "x").write_text("x")
    return {
        "missing events": (
            ["--events", str(tmp / "nope"), "--subscriptions", subs, "--out", out],
            "does not exist",
        ),
        "missing subs": (
            ["--events", ev, "--subscriptions", str(tmp / "nope.csv"), "--out", out],
            "does not exist",
        ),
        "bad filter": (
            ["--events", ev, "--subscriptions", str(tmp / "bad_filter.jsonl"), "--out", out],
            "row 2",
        ),
        "no column": (
            ["--events", ev, "--subscriptions", str(tmp / "no_filter.csv"), "--out", out],
            "filter",
        ),
        "garbage": (
            ["--events", ev, "--subscriptions", str(tmp / "garbage.parquet"), "--out", out],
            "cannot read",
        ),
        "duplicate": (["--events", ev, "--subscriptions", str(tmp / "dup.csv"), "--out", out], "repeats"),
        "out taken": (
            ["--events", ev, "--subscriptions", subs, "--out", str(tmp / "taken")],
            "exists already",
        ),
        "bad events": (["--events", str(tmp / "dup.csv"), "--subscriptions", subs, "--out", out], "Parquet"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing events",
        "missing subs",
        "bad filter",
        "no column",
        "garbage",
        "duplicate",
        "out taken",
        "bad events",
    ],
)
def test_cli_bad_input_is_a_clear_error_and_writes_nothing(case: str, tmp_path: Path) -> None:
    args, expected = _bad_inputs(tmp_path)[case]
    res = _run(*args)
    assert res.exit_code == 2, res.output
    assert expected in " ".join(res.stderr.split())  # rich wraps long lines
    assert "Traceback" not in res.output + res.stderr
    assert not (tmp_path / "out").exists()
