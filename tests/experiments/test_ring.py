"""The chordal ring's cost experiments: flat join cost, repairs that finish, the log fit,
and the two commands (one JSON document, CSV, PNG; bad input exits with status 2)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from flowbus.experiments.output import document
from flowbus.experiments.ring import RingJoin, RingRepair, run_join, run_repair
from flowbus.experiments.stats import fit_log

runner = CliRunner()


def _app() -> Any:
    from flowbus.cli import app

    return app


def test_join_cost_is_flat() -> None:
    r = document(run_join(RingJoin(sizes=(16, 64, 256), window=16)))
    assert r["consistent"]
    means = [row["messages_mean"] for row in r["rows"]]
    assert max(means) - min(means) <= 3 and all(row["touched_max"] <= 7 for row in r["rows"])


def test_repairs_finish_and_cost_little() -> None:
    r = document(run_repair(RingRepair(sizes=(16, 48), trials=2, seed=3)))
    by_kind = {s["kind"]: s for s in r["summary"]}
    assert by_kind["node"]["repaired"] == by_kind["node"]["trials"] == 4
    assert by_kind["ring-link"]["repaired"] == 4
    assert all(0 < row["messages"] < 200 for row in r["rows"] if row["repaired"])


def test_fit_log() -> None:
    fit = fit_log([4, 16, 64], [5.0, 9.0, 13.0])  # 1 + 2 log2 n
    assert math.isclose(fit["slope"], 2.0) and math.isclose(fit["intercept"], 1.0) and fit["r2"] == 1.0
    assert math.isnan(fit_log([4], [1.0])["slope"])


def test_cli_ring_join_json(tmp_path: Path) -> None:
    result = runner.invoke(_app(), ["sim", "ring-join", "--sizes", "8,32", "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [r["nodes"] for r in doc["rows"]] == [8, 32]
    for key in ("rows", "json", "plot"):
        assert Path(doc["outputs"][key]).is_file()
    assert Path(doc["outputs"]["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_ring_bad_sizes(tmp_path: Path) -> None:
    for args in (["ring-join", "--sizes", "8,x"], ["ring-repair", "--sizes", "4"]):
        result = runner.invoke(_app(), ["sim", *args, "--json", "--out", str(tmp_path / "o")])
        assert result.exit_code == 2
        assert result.stdout == ""
        assert not (tmp_path / "o").exists()
