"""``flowbus flow explain|expand`` (the real app driven in process, and through ``python -m flowbus``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flowbus.filters import parse
from flowbus.filters.expr import parse_expression

from .conftest import SPEC, invoke

FROM = '{"name": "IBM", "maxP": 160, "curP": 140}'
TO = '{"name": "IBM", "maxP": 200, "curP": 120}'


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
    ],
)
def test_errors_exit_2_with_a_message_and_no_traceback(args: tuple[str, ...], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.broker
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


def test_explain_html_writes_one_page_with_both_drawings(tmp_path: Path) -> None:
    out = tmp_path / "stocks.html"
    result = invoke("flow", "explain", SPEC, "--html", str(out))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "" and f"wrote {out}" in result.stderr
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 2
    assert 'data-space="max_cur"' in page and 'class="arc arc-route"' in page
    bad = invoke("flow", "explain", SPEC, "--html", str(tmp_path / "no" / "such" / "dir.html"))
    assert bad.exit_code == 2 and "No such file or directory" in bad.stderr


def test_explain_dot_prints_the_graph_before_and_after() -> None:
    result = invoke("flow", "explain", SPEC, "--dot")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("digraph ") == 2
    assert '"capital" -> "big_trades" [label="S: select\\ncap >= 1000000"' in result.stdout
    assert '"NYSE" -> "big_trades" [label="NYSE->big_trades: route' in result.stdout
