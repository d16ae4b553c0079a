"""``flowbus run`` on the local engine, and the errors of both engines (the real app driven in
process; Spark runs are in tests/spark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import SPEC, invoke


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("run", SPEC, "--remote", "sc://127.0.0.1:1"),
            "cannot reach the Spark Connect server at 127.0.0.1:1",
        ),
        (("run", SPEC, "--source", "NYSE"), "POINT=DIR"),
        (("run", SPEC, "--source", "nope=."), "no space 'nope'"),
        (("run", SPEC, "--follow"), "--follow needs --source"),
        (("run", SPEC, "--source", "NYSE=flowbus://nohost"), "give the brokers as HOST:PORT"),
        (("run", SPEC, "--sink", "nope=flowbus://127.0.0.1:1/x"), "POINT a subscription point (alarms,"),
        (("run", SPEC, "--sink", "alarms=flowbus://127.0.0.1:1"), "name the space"),
        (
            (
                "run",
                SPEC,
                "--source",
                "NYSE=flowbus://127.0.0.1:1/x",
                "--source",
                "NASDAQ=flowbus://127.0.0.1:1/x",
            ),
            "'NYSE' and 'NASDAQ' read one space, 'x'",
        ),
        (("run", SPEC, "--format", "csv"), "unknown --format 'csv'"),
        (("run", SPEC, "--engine", "flink"), "unknown engine 'flink'"),
    ],
)
@pytest.mark.broker
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


def test_the_help_shows_the_bus_options() -> None:
    result = invoke("run", "--help")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "flowbus://HOST:PORT" in text and "--sink" in text


def test_the_warm_up_of_a_spark_run_is_the_generators_first_events_and_only_for_long_runs() -> None:
    from flowbus.cli.run import WARM_UP, _warm_up_sample
    from flowbus.flow import load_spec
    from flowbus.flow.generators import generate

    g = load_spec(Path(SPEC))
    assert g.input is not None
    assert _warm_up_sample(g, None, 10 * WARM_UP + 1, 3) == list(generate(g, events=WARM_UP, seed=3))
    assert _warm_up_sample(g, None, 10 * WARM_UP, 3) == []  # a short run: none by default
    assert _warm_up_sample(g, None, None, None) == []  # (an input of unknown size: directories, the bus)
    assert _warm_up_sample(g, 7, 100, None) == list(generate(g, events=7, seed=g.input.seed))
    assert _warm_up_sample(g, 0, 10**6, None) == []
