"""``flowbus flow explain|expand``, ``flowbus run`` and ``flowbus bench flow`` (typer apps driven in process;
through ``python -m flowbus`` as well once the commands are mounted in flowbus.cli)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from flowbus.cli.flow import bench_flow, flow_app, run
from flowbus.filters import parse
from flowbus.filters.expr import parse_expression

from .conftest import STOCKS

SPEC = str(STOCKS)
FROM = '{"name": "IBM", "maxP": 160, "curP": 140}'
TO = '{"name": "IBM", "maxP": 200, "curP": 120}'

runner = CliRunner()
app = typer.Typer()
app.add_typer(flow_app, name="flow")
app.command("run")(run)
app.command("bench-flow")(bench_flow)


def invoke(*args: str) -> Any:
    return runner.invoke(app, list(args))


def test_explain_json_prints_the_paths() -> None:
    result = invoke("flow", "explain", SPEC, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert list(doc) == ["paths"]
    by = {(p["source"], p["sink"]): p for p in doc["paths"]}
    t4 = by[("NYSE", "big_trades")]
    assert parse(t4["select"]) == parse("price*vol >= 1000000")
    assert t4["transform"] == {"com": "NYS(issue)", "cap": "price * vol"}
    assert parse_expression(by[("NASDAQ", "big_trades")]["transform"]["com"]) == parse_expression(
        "NAS(issue)"
    )
    assert by[("combined.pub", "big_trades")]["transform"] == {"com": "com", "cap": "price * vol"}


def test_explain_text() -> None:
    result = invoke("flow", "explain", SPEC)
    assert result.exit_code == 0
    assert "before rewriting" in result.stdout and "after rewriting" in result.stdout
    assert "T: [issue, price, vol] => [com=NYS(issue), cap=price * vol]" in result.stdout


def test_expand_json_reproduces_the_paper() -> None:
    result = invoke("flow", "expand", SPEC, "--state", "max_cur", "--from", FROM, "--to", TO, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["events"] == [{"name": "IBM", "price": 200.0}, {"name": "IBM", "price": 120.0}]
    assert doc["states_expanded"] == 2 and doc["arc"] == "E4" and doc["form"] == "constrained"


def test_expand_prints_one_event_per_line() -> None:
    result = invoke("flow", "expand", SPEC, "--state", "max_cur", "--from", FROM, "--to", TO)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert [json.loads(line) for line in lines[:2]] == [
        {"name": "IBM", "price": 200.0},
        {"name": "IBM", "price": 120.0},
    ]
    assert lines[2].startswith("2 events; A* expanded 2 states")


def test_expand_several_keys_and_another_state() -> None:
    start = json.dumps([json.loads(FROM), {"name": "HP", "maxP": 50, "curP": 50}])
    goal = json.dumps([json.loads(TO), {"name": "HP", "maxP": 60, "curP": 60}])
    doc = json.loads(
        invoke("flow", "expand", SPEC, "--state", "max_cur", "--from", start, "--to", goal, "--json").stdout
    )
    assert [(e["name"], e["price"]) for e in doc["events"]] == [("HP", 60.0), ("IBM", 200.0), ("IBM", 120.0)]
    row = '{"name": "IBM", "n": 3, "avg": 10, "last": 9, "peak": 12, "drop": 3}'
    goal = '{"name": "IBM", "n": 9, "avg": 11, "last": 8, "peak": 12, "drop": 25}'
    doc = json.loads(
        invoke("flow", "expand", SPEC, "--state", "trends", "--from", row, "--to", goal, "--json").stdout
    )
    assert doc["events"] == [{"name": "IBM", "drop": 25.0}] and doc["arc"] == "E5"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("flow", "explain", "nope.yaml"), "cannot read spec"),
        (("flow", "expand", SPEC, "--state", "max_cu", "--from", FROM, "--to", TO), "unknown space 'max_cu'"),
        (("flow", "expand", SPEC, "--state", "max_cur", "--from", "{", "--to", TO), "--from is not JSON"),
        (
            ("flow", "expand", SPEC, "--state", "max_cur", "--from", '{"name": "IBM"}', "--to", TO),
            "missing 'maxP'",
        ),
        (
            ("flow", "expand", SPEC, "--state", "max_cur", "--from", FROM, "--to", TO, "--max-cost", "1"),
            "at most 1",
        ),
        (
            ("flow", "expand", SPEC, "--state", "max_cur", "--from", FROM, "--to", TO, "--arc", "T1"),
            "neither",
        ),
        (("flow", "expand", SPEC, "--state", "max_cur", "--from", TO, "--to", FROM), "no event sequence"),
        (
            ("run", SPEC, "--remote", "sc://127.0.0.1:1"),
            "cannot reach the Spark Connect server at 127.0.0.1:1",
        ),
        (("run", SPEC, "--source", "NYSE"), "POINT=DIR"),
        (("run", SPEC, "--source", "nope=."), "no space 'nope'"),
        (("run", SPEC, "--follow"), "--follow needs --source"),
        (("run", SPEC, "--format", "csv"), "unknown --format 'csv'"),
        (("run", SPEC, "--engine", "flink"), "unknown engine 'flink'"),
    ],
)
def test_errors_exit_2_with_a_message_and_no_traceback(args: tuple[str, ...], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_run_writes_one_jsonl_file_per_subscription_point(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = invoke(
        "run", SPEC, "--engine", "local", "--events", "1500", "--out", str(out), "--seed", "5", "--json"
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["events"] == 1500 and doc["graph"] == "rewritten"
    names = {"combined.sub", "big_trades", "compressed", "alarms"}
    assert set(doc["outputs"]) == names
    assert {p.name for p in out.iterdir()} == {f"{n}.jsonl" for n in names}
    for name, o in doc["outputs"].items():
        assert len((out / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()) == o["events"]
    again = json.loads(
        invoke(
            "run",
            SPEC,
            "--engine",
            "local",
            "--events",
            "1500",
            "--seed",
            "5",
            "--graph",
            "original",
            "--json",
        ).stdout
    )
    assert {k: v["events"] for k, v in again["outputs"].items()} == {
        k: v["events"] for k, v in doc["outputs"].items()
    }


def test_bench_flow_smoke() -> None:
    result = invoke("bench-flow", "--trades", "1000", "--rounds", "1", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["outputs_agree"] and doc["stateless_outputs_agree"]
    assert doc["original_events_per_s"] > 0 and doc["rewritten_events_per_s"] > 0
    lengths = [r["sequence_length"] for r in doc["reconnect"]]
    assert [r["published_while_disconnected"] for r in doc["reconnect"]] == [10, 1_000, 100_000]
    assert max(lengths) <= 16 and all(r["replay_reaches_current_state"] for r in doc["reconnect"])


def _wired() -> bool:
    from flowbus import cli

    return any(getattr(g, "name", None) == "flow" for g in cli.app.registered_groups)


@pytest.mark.skipif(not _wired(), reason="flow commands not mounted in flowbus.cli yet")
def test_python_m_flowbus_flow_expand() -> None:
    command = ["flow", "expand", SPEC, "--state", "max_cur", "--from", FROM, "--to", TO, "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "flowbus", *command], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(proc.stdout)["events"] == [
        {"name": "IBM", "price": 200.0},
        {"name": "IBM", "price": 120.0},
    ]
    bad = subprocess.run(
        [sys.executable, "-m", "flowbus", "run", SPEC, "--format", "csv"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "unknown --format" in bad.stderr and "Traceback" not in bad.stderr
