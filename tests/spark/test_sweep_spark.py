"""``flowbus.spark.sweep``: a sweep's runs as Spark tasks give the serial runner's rows and aggregates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flowbus.experiments import irbr
from flowbus.experiments.irbr import SUMMARY_COLUMNS, IrbrSweep
from flowbus.experiments.irbr_run import TIMING_FIELDS
from flowbus.experiments.output import Result, write_outputs
from flowbus.experiments.stats import t975


@pytest.fixture(scope="module")
def sweep() -> IrbrSweep:
    return irbr.load("irbr-faults", nodes=80, seeds="2", failures="0,0.1", events=20)


@pytest.fixture(scope="module")
def serial(sweep: IrbrSweep) -> Result:
    return irbr.run(sweep)


@pytest.fixture(scope="module")
def on_spark(spark: Any, sweep: IrbrSweep) -> Result:
    from flowbus.spark.sweep import run_spark

    return run_spark(spark, sweep)


def _untimed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows]


def test_same_runs_and_events(on_spark: Result, serial: Result) -> None:
    assert len(on_spark.rows) == 12  # irbr, scribe, scribe-repair x 2 failure rates x 2 seeds
    assert _untimed(on_spark.rows) == _untimed(serial.rows)
    assert on_spark.tables["events"] == serial.tables["events"]
    assert all(r["run_s"] > 0 for r in on_spark.rows)
    assert on_spark.runner["name"] == "spark" and on_spark.runner["tasks"] == 6  # (protocol, seed)
    assert str(on_spark.runner["master"]).startswith("local[")  # the shared session's master


def test_same_aggregates(on_spark: Result, serial: Result) -> None:
    assert len(on_spark.summary) == len(serial.summary) == 6
    for a, b in zip(on_spark.summary, serial.summary, strict=True):
        assert list(a) == list(b) == list(SUMMARY_COLUMNS)
        for key in SUMMARY_COLUMNS:
            if isinstance(b[key], float):
                assert a[key] == pytest.approx(b[key], rel=1e-12, abs=1e-15), key
            else:
                assert a[key] == b[key], key


def test_same_csv_bytes(on_spark: Result, serial: Result, tmp_path: Path) -> None:
    a, b = write_outputs(on_spark, tmp_path / "spark"), write_outputs(serial, tmp_path / "serial")
    for name in ("runs", "events"):
        assert Path(a[name]).read_bytes() == Path(b[name]).read_bytes(), name


def test_one_task_per_group_of_runs(spark: Any, sweep: IrbrSweep) -> None:
    from flowbus.spark.sweep import run_dataframe

    groups = sweep.groups()
    flat = [c for g in groups for c in g]
    assert [len(g) for g in groups] == [2] * 6
    assert sorted(flat, key=lambda c: (c.protocol, c.failure, c.seed)) == sweep.configs()
    assert run_dataframe(spark, groups).rdd.getNumPartitions() == 6  # the fixture is classic


def test_t_column_matches_the_table(spark: Any) -> None:
    from pyspark.sql import functions as F

    from flowbus.spark.sweep import t975_column

    dfs = [1, 2, 9, 29, 30, 31, 35, 40, 59, 60, 61, 100, 119, 120, 121, 1000, 100_000]
    got = spark.createDataFrame([(d,) for d in dfs], "df long").select(
        "df", t975_column(F.col("df")).alias("t")
    )
    by = {r["df"]: r["t"] for r in got.collect()}
    for d in dfs:
        assert by[d] == pytest.approx(t975(d), rel=1e-12), d
