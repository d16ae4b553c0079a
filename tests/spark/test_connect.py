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

from .connect import ConnectServer, connect_server, run_flowbus
from .matchdata import (
    RUN_ARGS,
    STOCKS,
    brute_force_pairs,
    check_run,
    match_events,
    match_filters,
    written_pairs,
)


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

    got = written_pairs(out_path)
    want = brute_force_pairs(events, sub_ids, texts)
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
    res = run_flowbus(
        connect,
        "run", str(STOCKS), *RUN_ARGS, "--remote", connect.url,
        "--out", "out", "--json",
        cwd=tmp_path, timeout=400,
    )  # fmt: skip
    assert res.returncode == 0, f"stdout:\n{res.stdout}\nstderr:\n{res.stderr[-5000:]}\n{connect.logs()}"
    doc: dict[str, Any] = json.loads(res.stdout)
    assert doc["master"] == connect.url and doc["events"] == 800  # reported from the server's side
    out = tmp_path / "out"  # relative on the command line: the client resolves it for the server
    check_run(out, doc)
