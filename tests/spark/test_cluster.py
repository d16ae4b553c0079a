"""``flowbus match``, ``run`` and ``sim irbr-faults`` on a real standalone cluster: a master and a worker on
127.0.0.1 (see cluster.py)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from .cluster import StandaloneCluster, run_flowbus, standalone
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
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """One master and one worker (1 core, 1 GiB) shared by this module's tests; stopped after them."""
    with standalone(tmp_path_factory.mktemp("spark-standalone")) as cluster:
        yield cluster


def test_match_on_a_standalone_cluster_equals_brute_force(
    standalone_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    rng = random.Random(20240611)
    events = match_events(400, rng)
    texts = match_filters(60, rng)
    sub_ids = [f"s{i}" for i in range(len(texts))]
    events_path, subs_path, out_path = tmp_path / "events.parquet", tmp_path / "subs.parquet", tmp_path / "o"
    pq.write_table(events, events_path)
    pq.write_table(pa.table({"sub_id": sub_ids, "filter": texts}), subs_path)
    cluster = standalone_cluster
    apps_before = {app["id"] for app in cluster.completed_apps()}

    res = run_flowbus(
        cluster,
        "match", "--events", str(events_path), "--subscriptions", str(subs_path), "--out", str(out_path),
        "--master", cluster.master_url, "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, f"stdout:\n{res.stdout}\nstderr:\n{res.stderr[-5000:]}\n{cluster.logs()}"

    got = written_pairs(out_path)
    want = brute_force_pairs(events, sub_ids, texts)
    assert len(want) > 200 and len({s for _, s in want}) > 30  # the check has teeth
    assert got == want

    doc: dict[str, Any] = json.loads(res.stdout)
    assert doc["command"] == "match"
    assert doc["pairs"] == len(want) and doc["subscriptions"] == len(texts)
    assert doc["master"] == cluster.master_url
    # It ran on the cluster: the master saw the application through, whose executor (launched by our
    # worker) called the driver back on 127.0.0.1.
    apps = cluster.apps_completed_since(apps_before)
    assert [(app["name"], app["state"]) for app in apps] == [("flowbus-match", "FINISHED")], apps
    logs = cluster.executor_logs(apps[0]["id"])
    assert logs, f"no executor was launched\n{cluster.logs()}"
    assert '--driver-url" "spark://CoarseGrainedScheduler@127.0.0.1:' in logs[0].read_text(errors="replace")


def test_run_on_a_standalone_cluster_delivers_what_the_interpreter_delivers(
    standalone_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    res = run_flowbus(
        standalone_cluster,
        "run", str(STOCKS), *RUN_ARGS, "--master", standalone_cluster.master_url,
        "--out", str(out), "--json",
        cwd=tmp_path, timeout=400,
    )  # fmt: skip
    assert res.returncode == 0, (
        f"stdout:\n{res.stdout}\nstderr:\n{res.stderr[-5000:]}\n{standalone_cluster.logs()}"
    )
    doc: dict[str, Any] = json.loads(res.stdout)
    assert doc["master"] == standalone_cluster.master_url and doc["events"] == 800
    check_run(out, doc)


def test_irbr_sweep_on_a_standalone_cluster_equals_the_serial_runs(
    standalone_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    """The sweep's groups run as tasks on the cluster's executor (each forks per failure rate)."""
    small = ["--nodes", "60", "--seeds", "2", "--failures", "0,0.1", "--events", "15",
             "--protocols", "irbr,scribe"]  # fmt: skip
    res = run_flowbus(
        standalone_cluster,
        "sim", "irbr-faults", *small, "--master", standalone_cluster.master_url,
        "--out", str(tmp_path / "cluster"), "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, (
        f"stdout:\n{res.stdout}\nstderr:\n{res.stderr[-5000:]}\n{standalone_cluster.logs()}"
    )
    doc: dict[str, Any] = json.loads(res.stdout)
    assert doc["runner"]["master"] == standalone_cluster.master_url and doc["runs"] == 8
    serial = run_flowbus(
        standalone_cluster, "sim", "irbr-faults", *small, "--serial", "--out", str(tmp_path / "serial"),
        "--json", cwd=tmp_path,
    )  # fmt: skip
    assert serial.returncode == 0, serial.stderr[-3000:]
    for name in ("runs.csv", "events.csv"):
        assert (tmp_path / "cluster" / name).read_bytes() == (tmp_path / "serial" / name).read_bytes()
