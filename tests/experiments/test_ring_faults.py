"""Delivery under broker crashes on the chordal ring: no event lost through single crashes
(kept events re-sent to the broker that took the dead one's place, taken-over subscriptions,
events handed across the tree's cut); the command's outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flowbus.errors import FlowbusError
from flowbus.experiments.output import document
from flowbus.experiments.ring import RingFaults, run_faults

runner = CliRunner()


@pytest.mark.parametrize("seed", [1, 2])
def test_single_and_skip_one_crashes_lose_nothing(seed: int) -> None:
    r = document(
        run_faults(
            RingFaults(nodes=12, backups=(1, 2), scenarios=("single", "skip-one"), events=80, seed=seed)
        )
    )
    assert len(r["rows"]) == 4
    for row in r["rows"]:
        assert row["lost"] == 0 and row["wrong"] == 0, row
        assert row["expected"] > 100 and row["delivered"] == row["expected"]
        # a dead broker's last deliveries may be made again by the one that took over
        assert row["duplicates"] <= 0.01 * row["expected"]


def test_adjacent_crashes_are_measured_not_hidden() -> None:
    r = document(run_faults(RingFaults(nodes=12, backups=(1, 3), scenarios=("adjacent",), events=80, seed=3)))
    one, three = r["rows"]
    assert one["duplicates"] <= 0.01 * one["expected"] and three["duplicates"] <= 0.01 * three["expected"]
    assert one["delivered"] + one["lost"] == one["expected"]
    assert three["delivered"] + three["lost"] == three["expected"]


def test_bad_input() -> None:
    for kw in ({"scenarios": ("everything",)}, {"backups": (5,)}, {"nodes": 3}):
        with pytest.raises(FlowbusError):
            RingFaults(**kw)  # type: ignore[arg-type]


def _app() -> Any:
    from flowbus.cli import app

    return app


def test_cli(tmp_path: Path) -> None:
    args = [
        "sim",
        "ring-faults",
        "--nodes",
        "10",
        "--backups",
        "2",
        "--scenarios",
        "single",
        "--events",
        "40",
    ]
    result = runner.invoke(_app(), [*args, "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [(r["backup"], r["scenario"]) for r in doc["rows"]] == [(2, "single")]
    assert all(Path(p).is_file() for p in doc["outputs"].values())
    bad = runner.invoke(
        _app(), ["sim", "ring-faults", "--scenarios", "nope", "--json", "--out", str(tmp_path / "x")]
    )
    assert bad.exit_code == 2 and bad.stdout == ""
