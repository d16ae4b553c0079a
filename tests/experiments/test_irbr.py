"""``flowbus.experiments.irbr``: sweep configs, serial runs, aggregation, outputs, ``flowbus sim irbr-*``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flowbus.errors import ExperimentError, FlowbusError
from flowbus.experiments import irbr, irbr_run
from flowbus.experiments.config import parse_seeds
from flowbus.experiments.irbr import (
    DEFAULTS,
    EVENT_COLUMNS,
    RUN_COLUMNS,
    SUMMARY_COLUMNS,
    IrbrSweep,
    aggregate,
    forwards_by_interest,
    irbr_below_scribe,
)
from flowbus.experiments.irbr_run import TIMING_FIELDS
from flowbus.experiments.output import Result, write_outputs
from flowbus.experiments.stats import t975

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

TINY = {"nodes": 80, "seeds": "2", "failures": "0,0.1", "events": 20, "protocols": "irbr,scribe"}


@pytest.fixture(scope="module")
def tiny() -> IrbrSweep:
    return irbr.load("irbr-faults", **TINY)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tiny_result(tiny: IrbrSweep) -> Result:
    return irbr.run(tiny)


@pytest.fixture(scope="module")
def tiny_outputs(tiny_result: Result, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return write_outputs(tiny_result, tmp_path_factory.mktemp("tiny"))


# ------------------------------------------------------------------------------ parsing


def test_yaml_files_match_the_builtin_defaults() -> None:
    for experiment in ("irbr-faults", "irbr-forwards"):
        assert irbr.load(experiment, ROOT / "experiments" / f"{experiment}.yaml") == DEFAULTS[experiment]
    faults = DEFAULTS["irbr-faults"]
    assert faults.nodes == 1000 and faults.seeds == tuple(range(1, 11)) and faults.events == 200
    assert faults.failures == (0.005, 0.01, 0.02, 0.05, 0.1)
    assert faults.protocols == ("irbr", "scribe", "scribe-repair")
    assert faults.acks and faults.notice is None  # acknowledgements, no oracle
    forwards = DEFAULTS["irbr-forwards"]
    assert forwards.failures == (0.0,) and forwards.seeds == (1, 2, 3) and forwards.events == 300


def test_yaml_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("nodes: 120\nseeds: [3, 1]\nfailures: [0.1, 0.02]\nprotocols: [scribe]\nevents: 7\n")
    s = irbr.load("irbr-faults", path)
    assert (s.nodes, s.seeds, s.failures, s.protocols, s.events) == (120, (1, 3), (0.02, 0.1), ("scribe",), 7)
    s = irbr.load("irbr-faults", path, nodes=60, seeds="4", failures="0.05", protocols="irbr,scribe")
    assert (s.nodes, s.seeds, s.failures, s.protocols) == (60, (1, 2, 3, 4), (0.05,), ("irbr", "scribe"))
    assert s.subscribers == 0.5 and s.events == 7  # untouched keys keep the file's or default values


def test_configs_are_sorted_and_complete(tiny: IrbrSweep) -> None:
    configs = tiny.configs()
    assert len(configs) == 2 * 2 * 2
    assert [(c.protocol, c.failure, c.seed) for c in configs] == sorted(
        (p, f, s) for p in ("irbr", "scribe") for f in (0.0, 0.1) for s in (1, 2)
    )
    assert all(c.nodes == 80 and c.events == 20 for c in configs)


def test_parse_seeds() -> None:
    assert parse_seeds("3") == (1, 2, 3)
    assert parse_seeds("1,5,9") == (1, 5, 9)
    assert parse_seeds("7,") == (7,)
    assert parse_seeds("4-6") == (4, 5, 6)


@pytest.mark.parametrize(
    ("yaml_text", "overrides", "message"),
    [
        ("nodez: 10\n", {}, "unknown key 'nodez'"),
        ("", {"failures": "0.1,1.5"}, "fraction in [0, 1)"),
        ("", {"failures": "5"}, "did you mean 0.05"),
        ("", {"failures": "0.1,x"}, "failures must be fractions"),
        ("", {"failures": "0.1,0.1"}, "listed twice"),
        ("", {"protocols": "irbr,pubsub"}, "unknown protocol 'pubsub'"),
        ("", {"nodes": 1}, "nodes must be an int >= 2"),
        ("", {"events": 0}, "events must be an int >= 1"),
        ("", {"seeds": "0"}, "seeds N must be >= 1"),
        ("", {"seeds": "a,b"}, "seeds must be N"),
        ("subscribers: 3\n", {}, "subscribers must be a fraction"),
        ("seeds: many\n", {}, "seeds must be N"),
        ("experiment: irbr-forwards\n", {}, "is a config for 'irbr-forwards'"),
        ("- 1\n- 2\n", {}, "expected a mapping"),
        ("nodes: [1\n", {}, "not valid YAML"),
    ],
)
def test_bad_input_raises_before_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, yaml_text: str, overrides: dict[str, Any], message: str
) -> None:
    def no_run(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a run started")

    monkeypatch.setattr(irbr_run, "run", no_run)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ExperimentError) as info:
        irbr.run(irbr.load("irbr-faults", path, **overrides))
    assert message in str(info.value)
    assert isinstance(info.value, FlowbusError)


def test_forwards_sweep_has_no_failures() -> None:
    with pytest.raises(ExperimentError, match="without failures"):
        irbr.load("irbr-forwards", failures="0.1")


# ------------------------------------------------------------------------------ t table


def test_t_quantiles() -> None:
    assert t975(1) == 12.7062 and t975(9) == 2.2622 and t975(30) == 2.0423
    assert t975(40) == 2.0211 and t975(120) == 1.9799
    assert 2.0211 < t975(35) < 2.0423 and 1.96 < t975(10_000) < 1.961
    values = [t975(df) for df in range(1, 500)]
    assert values == sorted(values, reverse=True)  # decreasing in df


def test_interval_on_a_hand_computed_example() -> None:
    rows = [
        {"protocol": "scribe", "failure": 0.1, "seed": s, "loss_rate": x, "reachable_loss_rate": x / 2,
         "forwards_per_event": 10.0 * s, "lost": s, "lost_reachable": 0, "interested": 10, "reachable": 9,
         "duplicates": 0, "wrong": s - 1, "acks_per_event": 2.0 * s, "delay": 3.0 + s, "delay_max": 5.0 * s}
        for s, x in ((1, 0.1), (2, 0.2), (3, 0.3))
    ]  # fmt: skip
    (row,) = aggregate(rows)
    # mean 0.2, sd 0.1, t(0.975, 2) = 4.3027: half width 4.3027 * 0.1 / sqrt(3) = 0.2484165...
    assert row["runs"] == 3
    assert row["loss_rate_mean"] == pytest.approx(0.2)
    assert row["loss_rate_sd"] == pytest.approx(0.1)
    assert row["loss_rate_ci95"] == pytest.approx(0.2484165, abs=1e-7)
    assert row["loss_rate_lo"] == pytest.approx(0.2 - 0.2484165, abs=1e-7)
    assert row["loss_rate_hi"] == pytest.approx(0.2 + 0.2484165, abs=1e-7)
    assert row["reachable_loss_rate_ci95"] == pytest.approx(0.2484165 / 2, abs=1e-7)
    assert row["forwards_per_event_mean"] == pytest.approx(20.0)
    figures = (row["acks_per_event_mean"], row["delay_mean"], row["delay_max"])
    assert figures == pytest.approx((4.0, 5.0, 15.0))
    assert (row["lost"], row["interested"], row["reachable"], row["wrong_max"]) == (6, 30, 27, 2)
    (one,) = aggregate(rows[:1])
    assert one["runs"] == 1 and one["loss_rate_sd"] is None and one["loss_rate_ci95"] is None


# ------------------------------------------------------------------------------ runs


def test_serial_runs(tiny_result: Result) -> None:
    runs = tiny_result.rows
    assert len(runs) == 8
    names = [c for c, _ in RUN_COLUMNS]
    assert all(set(r) - set(TIMING_FIELDS) == set(names) for r in runs)
    assert [(r["protocol"], r["failure"], r["seed"]) for r in runs] == [
        (c.protocol, c.failure, c.seed) for c in tiny_result.config.configs()
    ]
    for r in runs:
        assert r["duplicates"] == 0 and r["wrong"] == 0
        if r["protocol"] == "irbr":
            assert r["reachable_loss_rate"] == 0.0
    assert len(tiny_result.tables["events"]) == 8 * 20
    assert all(set(e) == {c for c, _ in EVENT_COLUMNS} for e in tiny_result.tables["events"])


def test_aggregate_means_are_the_row_means(tiny_result: Result) -> None:
    summary = tiny_result.summary
    assert [(r["protocol"], r["failure"]) for r in summary] == [
        ("irbr", 0.0), ("irbr", 0.1), ("scribe", 0.0), ("scribe", 0.1),
    ]  # fmt: skip
    for s in summary:
        assert list(s) == list(SUMMARY_COLUMNS)
        rows = [r for r in tiny_result.rows if (r["protocol"], r["failure"]) == (s["protocol"], s["failure"])]
        assert s["runs"] == len(rows) == 2
        for rate in ("loss_rate", "reachable_loss_rate", "forwards_per_event"):
            assert s[f"{rate}_mean"] == pytest.approx(sum(r[rate] for r in rows) / 2)
        for col in ("lost", "lost_reachable", "interested", "reachable"):
            assert s[col] == sum(r[col] for r in rows)
        sd = math.sqrt(sum((r["loss_rate"] - s["loss_rate_mean"]) ** 2 for r in rows))  # n - 1 = 1
        assert s["loss_rate_sd"] == pytest.approx(sd)
        assert s["loss_rate_ci95"] == pytest.approx(12.7062 * sd / math.sqrt(2))


def test_outputs(tiny_outputs: dict[str, str], tiny_result: Result) -> None:
    runs_csv = Path(tiny_outputs["runs"]).read_text().splitlines()
    assert runs_csv[0].split(",") == [c for c, _ in RUN_COLUMNS]
    assert "run_s" not in runs_csv[0] and len(runs_csv) == 1 + 8
    assert Path(tiny_outputs["summary"]).read_text().splitlines()[0].split(",") == list(SUMMARY_COLUMNS)
    assert len(Path(tiny_outputs["events"]).read_text().splitlines()) == 1 + 8 * 20
    assert Path(tiny_outputs["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(Path(tiny_outputs["manifest"]).read_text())
    assert doc["experiment"] == "irbr-faults" and doc["seeds"] == [1, 2] and doc["runs"] == 8
    assert doc["runner"] == {"name": "serial", "master": None}
    assert doc["flowbus_version"] and doc["python"] and doc["timing"]["wall_s"] > 0
    assert doc["config"]["nodes"] == 80


@pytest.mark.broker
def test_reruns_are_byte_identical(
    tiny: IrbrSweep, tiny_outputs: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    again = write_outputs(irbr.run(tiny), tmp_path_factory.mktemp("again"))
    for name in ("runs", "summary", "events"):
        assert Path(again[name]).read_bytes() == Path(tiny_outputs[name]).read_bytes(), name


def test_forwards_binning() -> None:
    events = [
        {"protocol": p, "interested": i, "forwards": f}
        for p, i, f in [("irbr", 0, 0), ("irbr", 3, 5), ("irbr", 5, 7), ("irbr", 200, 300),
                        ("scribe", 0, 40), ("scribe", 4, 41), ("scribe", 90, 45)]
    ]  # fmt: skip
    binned = forwards_by_interest(events)
    by = {(r["protocol"], r["bin"]): r for r in binned}
    assert by[("irbr", "1-5")]["events"] == 2 and by[("irbr", "1-5")]["forwards_mean"] == 6.0
    assert by[("irbr", "161+")]["hi"] is None and ("scribe", "81-160") in by
    assert irbr_below_scribe(binned) is True  # the bins both have: 0 and 1-5
    events.append({"protocol": "irbr", "interested": 2, "forwards": 200})
    assert irbr_below_scribe(forwards_by_interest(events)) is False
    assert irbr_below_scribe(forwards_by_interest(events[:4])) is None


# ------------------------------------------------------------------------------- CLI


def _app() -> Any:
    from flowbus.cli import app

    return app


@pytest.mark.broker
def test_cli_faults_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no experiments/ here: the built-in defaults, with the overrides
    out = tmp_path / "faults"
    args = ["sim", "irbr-faults", "--serial", "--json", "--nodes", "60", "--seeds", "2",
            "--failures", "0,0.1", "--events", "15", "--out", str(out)]  # fmt: skip
    result = runner.invoke(_app(), args)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)  # exactly one JSON document
    assert doc["experiment"] == "irbr-faults" and doc["runs"] == 12 and doc["config"]["file"] is None
    assert doc["config"]["nodes"] == 60 and doc["config"]["seeds"] == [1, 2]
    assert [(r["protocol"], r["failure"]) for r in doc["rows"]] == [
        ("irbr", 0.0), ("irbr", 0.1), ("scribe", 0.0), ("scribe", 0.1),
        ("scribe-repair", 0.0), ("scribe-repair", 0.1),
    ]  # fmt: skip
    for r in doc["rows"]:
        assert {"loss_rate_mean", "loss_rate_interval", "reachable_loss_rate_mean",
                "reachable_loss_rate_interval", "acks_per_event_mean", "delay_mean",
                "delay_max"} <= set(r)  # fmt: skip
        assert (r["acks_per_event_mean"] > 0) == (r["protocol"] == "irbr")  # only IRBR acknowledges
    for name in ("runs", "summary", "events", "plot", "manifest"):
        assert Path(doc["outputs"][name]).is_file(), name
    assert doc["outputs"]["plot"].endswith(".png") and doc["timing"]["wall_s"] > 0


def test_cli_forwards_json_with_a_config(tmp_path: Path) -> None:
    config = tmp_path / "fw.yaml"
    config.write_text("nodes: 60\nseeds: 1\nfailure: 0\nevents: 20\n")
    result = runner.invoke(
        _app(),
        ["sim", "irbr-forwards", "--serial", "--json", "--config", str(config), "--out", str(tmp_path / "o")],
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["config"]["file"] == str(config) and doc["runs"] == 2
    assert {r["protocol"] for r in doc["rows"]} == {"irbr", "scribe"}
    assert doc["irbr_below_scribe"] is True
    assert Path(doc["outputs"]["forwards"]).is_file() and Path(doc["outputs"]["plot"]).is_file()


def test_cli_table(tmp_path: Path) -> None:
    args = ["sim", "irbr-faults", "--serial", "--nodes", "60", "--seeds", "1", "--failures", "0.1",
            "--events", "10", "--protocols", "scribe", "--out", str(tmp_path)]  # fmt: skip
    result = runner.invoke(_app(), args)
    assert result.exit_code == 0, result.stderr
    assert "IRBR faults" in result.stdout and "scribe" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--failures", "0.1,abc"], "failures must be fractions"),
        (["--failures", "1.5"], "fraction in [0, 1)"),
        (["--protocols", "gossip"], "unknown protocol 'gossip'"),
        (["--config", "no/such.yaml"], "sweep config not found"),
        (["--master", "local[2]"], "--serial runs without Spark"),
    ],
)
def test_cli_bad_input_exits_2(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "never"
    result = runner.invoke(_app(), ["sim", "irbr-faults", "--serial", "--json", "--out", str(out), *args])
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not out.exists()
