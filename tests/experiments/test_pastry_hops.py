"""``flowbus.experiments.pastry_hops``: Pastry lookups in the simulator, and ``flowbus sim pastry-hops``."""

from __future__ import annotations

import json
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from flowbus.cli.sim import sim_app
from flowbus.errors import ExperimentError
from flowbus.experiments.pastry_hops import TIMING_FIELDS, PastryHops, hop_bound, record, run

runner = CliRunner()
app = typer.Typer()
app.add_typer(sim_app, name="sim")

FIELDS = {
    "nodes", "lookups", "seed", "delivered", "correct", "mean_hops", "max_hops", "bound",
    "paper_mean_hops", "hops", "messages", "build_s", "run_s",
}  # fmt: skip


@pytest.fixture(scope="module")
def result_1000() -> dict[str, Any]:
    return record(run(PastryHops(nodes=1000, lookups=2000, seed=1)))


def test_1000_nodes_all_delivered_at_the_closest_node(result_1000: dict[str, Any]) -> None:
    r = result_1000
    assert r.keys() >= FIELDS
    assert r["delivered"] == r["correct"] == 2000
    assert r["duplicates"] == 0 and r["lost"] == 0
    assert 2.0 <= r["mean_hops"] <= 3.0
    assert r["bound"] == 4 and r["max_hops"] <= r["bound"]
    assert r["paper_mean_hops"] == 2.5
    assert sum(r["hops"].values()) == 2000
    assert r["messages"] == sum(int(h) * n for h, n in r["hops"].items())
    json.dumps(r)


def test_same_seed_same_result_but_timing(result_1000: dict[str, Any]) -> None:
    again = record(run(PastryHops(nodes=1000, lookups=2000, seed=1)))

    def strip(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if k not in TIMING_FIELDS}

    assert strip(again) == strip(result_1000)
    assert strip(record(run(PastryHops(nodes=1000, lookups=2000, seed=2)))) != strip(result_1000)


def test_progress_reports_building_and_simulating() -> None:
    calls: list[tuple[str, int, int]] = []
    run(PastryHops(nodes=50, lookups=20, seed=3), progress=lambda w, d, t: calls.append((w, d, t)))
    assert ("building", 3, 3) in calls and ("simulating", 20, 20) in calls


def test_tiny_networks() -> None:
    for n in (1, 2, 17):
        r = record(run(PastryHops(nodes=n, lookups=30, seed=n)))
        assert r["delivered"] == r["correct"] == 30
        assert r["max_hops"] <= r["bound"]


def test_hop_bound() -> None:
    assert [hop_bound(n) for n in (1, 2, 16, 17, 256, 257, 1000, 4096, 10_000, 100_000)] == [
        1, 2, 2, 3, 3, 4, 4, 4, 5, 6,
    ]  # fmt: skip


@pytest.mark.parametrize(("nodes", "lookups"), [(0, 10), (10, 0), (-5, 10)])
def test_run_rejects_bad_sizes(nodes: int, lookups: int) -> None:
    with pytest.raises(ExperimentError):
        run(PastryHops(nodes=nodes, lookups=lookups, seed=1))


def test_cli_json() -> None:
    result = runner.invoke(app, ["sim", "pastry-hops", "--nodes", "300", "--lookups", "300", "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc.keys() >= FIELDS
    assert doc["nodes"] == 300 and doc["delivered"] == doc["correct"] == 300
    assert doc["max_hops"] <= doc["bound"]


def test_cli_table() -> None:
    result = runner.invoke(app, ["sim", "pastry-hops", "--nodes", "100", "--lookups", "50"])
    assert result.exit_code == 0, result.stderr
    assert "mean_hops" in result.stdout and "hops = " in result.stdout


def test_cli_bad_input_exits_2() -> None:
    result = runner.invoke(app, ["sim", "pastry-hops", "--nodes", "0", "--json"])
    assert result.exit_code == 2
    assert "number of nodes must be an int >= 1" in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_mounted_in_the_main_app() -> None:
    from flowbus.cli import app as main_app

    result = runner.invoke(main_app, ["sim", "pastry-hops", "--nodes", "40", "--lookups", "10", "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["delivered"] == 10
