"""The churn experiment (flowbus sim cbdlo-churn): without churn every expected event arrives
and the trees cost only the backup probes while events flow; with churn the trees are
repaired by messages (counted), end consistent, and most events still arrive; configs are
checked, the YAML is the built-in default, and the command writes CSV / JSON / PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flowbus.errors import ExperimentError
from flowbus.experiments.cbdlo_churn import CbdloChurn, load, run_one

SMALL: dict[str, Any] = {"nodes": 200, "subscriptions": 150, "events": 30, "attributes": 10, "apt": 10}


def test_without_churn_every_event_arrives_and_the_trees_cost_only_the_probes() -> None:
    r = run_one(CbdloChurn(seeds=(1,), churn=(0.0,), settings=SMALL), 0.0, 1)
    assert r["failures"] == r["joins"] == 0
    assert r["expected"] > 0 and r["completeness"] == 1.0
    # only the coordinators' probes of their backups, one per topology every 50 time units
    assert r["maintenance_per_event"] == r["probes_per_event"] > 0 and r["maintenance_build"] > 0
    assert r["trees_consistent"] and r["dead_hosted_vnodes"] == 0 and r["topologies_lost"] == 0


def test_under_churn_the_trees_are_repaired_by_messages() -> None:
    r = run_one(CbdloChurn(seeds=(2,), churn=(0.3,), settings=SMALL), 0.3, 2)
    assert r["failures"] == r["joins"] == 60
    assert r["maintenance_per_event"] > r["probes_per_event"] and r["trees_consistent"]
    assert 0.6 < r["completeness"] < 1.0  # some events meet a dead host before its repair


def test_churn_configs_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ExperimentError, match="churn"):
        CbdloChurn(churn=(1.5,))
    with pytest.raises(ExperimentError, match="not a run setting"):
        CbdloChurn(settings={"colour": 1})
    with pytest.raises(ExperimentError, match="do not fit"):
        CbdloChurn(settings={"nodes": 20, "subscriptions": 5000})
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodez: 3\n")
    with pytest.raises(ExperimentError, match="unknown key 'nodez'"):
        load(bad)
    root = Path(__file__).resolve().parents[2] / "experiments"
    assert load(root / "cbdlo-churn.yaml") == load()


@pytest.mark.broker
def test_cli_cbdlo_churn_json(tmp_path: Path) -> None:
    from flowbus.cli import app

    cfg = tmp_path / "churn.yaml"
    cfg.write_text("nodes: 120\nsubscriptions: 80\nevents: 10\nattributes: 8\napt: 8\nchurn: [0.0, 0.2]\n")
    out = tmp_path / "out"
    args = ["sim", "cbdlo-churn", "--config", str(cfg), "--seeds", "1", "--out", str(out), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["experiment"] == "cbdlo-churn" and [r["churn"] for r in doc["summary"]] == [0.0, 0.2]
    for key in ("csv", "json", "plot"):
        assert Path(doc["outputs"][key]).is_file()
    assert Path(doc["outputs"]["csv"]).read_text().startswith("churn,seed,nodes")
