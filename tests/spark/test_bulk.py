"""Bulk matching on Spark against the matcher, brute force and the broadcast-hash-join baseline."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from flowbus.cli_spark import match
from flowbus.filters import Filter, parse
from flowbus.matching import Matcher
from flowbus.spark.bulk import (
    bulk_match,
    join_baseline,
    match_events,
    parse_filter,
    read_events,
    read_subscriptions,
)
from flowbus.workloads import Workload

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
    ],
)
def test_fast_path_reads_like_the_parser(text: str) -> None:
    assert parse_filter(text) == parse(text)


@pytest.mark.parametrize("text", ['in = "x"', 'a = "x" &', 'a = "x', "", 'a = "x" & 3'])
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
