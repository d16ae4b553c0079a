"""``flowbus match`` through a real Spark Connect server (``local[2]`` on 127.0.0.1, see connect.py)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flowbus.filters import parse

from .connect import ConnectServer, connect_server, run_flowbus
from .matchdata import match_events, match_filters


@pytest.fixture(scope="module")
def connect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """One Spark Connect server (local[2]) shared by this module's tests; stopped after them."""
    with connect_server(tmp_path_factory.mktemp("spark-connect")) as server:
        yield server


def test_match_through_spark_connect_equals_brute_force(connect: ConnectServer, tmp_path: Path) -> None:
    rng = random.Random(20240612)
    events = match_events(200, rng)
    texts = match_filters(40, rng)
    sub_ids = [f"s{i}" for i in range(len(texts))]
    # absolute paths: the server resolves relative ones against its own working directory
    events_path, subs_path, out_path = tmp_path / "events.parquet", tmp_path / "subs.parquet", tmp_path / "o"
    pq.write_table(events, events_path)
    pq.write_table(pa.table({"sub_id": sub_ids, "filter": texts}), subs_path)
    sessions_before = connect.sessions()

    res = run_flowbus(
        connect,
        "match", "--events", str(events_path), "--subscriptions", str(subs_path), "--out", str(out_path),
        "--remote", connect.url, "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, f"stdout:\n{res.stdout}\nstderr:\n{res.stderr[-5000:]}\n{connect.logs()}"

    out = pq.read_table(out_path)
    got = sorted(zip(out.column("event_id").to_pylist(), out.column("sub_id").to_pylist(), strict=True))
    filters = [(sid, parse(text)) for sid, text in zip(sub_ids, texts, strict=True)]
    want = sorted(
        (row["event_id"], sid)
        for row in events.to_pylist()
        for sid, f in filters
        if f.matches({k: v for k, v in row.items() if v is not None and k != "event_id"})
    )
    assert len(want) > 200 and len({s for _, s in want}) > 20  # the check has teeth
    assert got == want

    doc: dict[str, Any] = json.loads(res.stdout)
    assert doc["command"] == "match"
    assert doc["pairs"] == len(want) and doc["subscriptions"] == len(texts)
    assert doc["master"] == connect.url
    # It ran on the server: a client session new to it did the work.
    assert connect.sessions() - sessions_before, f"the server saw no new client session\n{connect.logs()}"


def test_run_through_spark_connect_delivers_what_the_interpreter_delivers(
    connect: ConnectServer, tmp_path: Path
) -> None:
    from flowbus.flow import LocalRun, load_spec, rewrite
    from flowbus.flow.generators import generate

    spec = Path(__file__).resolve().parents[2] / "examples" / "stocks" / "flow.yaml"
    res = run_flowbus(
        connect,
        "run", str(spec), "--remote", connect.url, "--events", "800", "--seed", "2",
        "--batch-events", "400", "--format", "jsonl", "--out", "out", "--json",
        cwd=tmp_path, timeout=400,
    )  # fmt: skip
    assert res.returncode == 0, f"stdout:\n{res.stdout}\nstderr:\n{res.stderr[-5000:]}\n{connect.logs()}"
    doc: dict[str, Any] = json.loads(res.stdout)
    assert doc["master"] == connect.url and doc["events"] == 800  # reported from the server's side
    out = tmp_path / "out"  # relative on the command line: the client resolves it for the server
    g = load_spec(spec)
    expected = LocalRun(rewrite(g)).run(generate(g, events=800, seed=2)).outputs
    for point, events in expected.items():
        rows = [json.loads(line) for f in sorted((out / point).glob("*/part-*.json")) for line in f.open()]
        rows.sort(key=lambda r: r["_order"])
        assert [{k: v for k, v in r.items() if k != "_order"} for r in rows] == [dict(e) for e in events], (
            point
        )
        assert doc["outputs"][point]["events"] == len(events)
