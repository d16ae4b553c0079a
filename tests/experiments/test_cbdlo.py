"""CBDLO experiment runs: deterministic rows, complete delivery where the protocol promises it,
the workload's Zipf law, checked configs, the figure 7 fit, and the five commands (one JSON
document, CSV / JSON / PNG; a bad config exits with status 2 and writes nothing)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from flowbus.errors import ExperimentError
from flowbus.experiments.cbdlo import extrapolate, fit, load
from flowbus.experiments.cbdlo_run import CbdloRun, ZipfRangeWorkload, build, run
from flowbus.overlay.cbdlo_tree import Topologies

runner = CliRunner()
SMALL: dict[str, Any] = {"nodes": 200, "subscriptions": 150, "events": 12, "attributes": 20}


def _app() -> Any:
    from flowbus.cli import app

    return app


@pytest.mark.parametrize("protocol", ["simple", "cbdlo", "tera"])
def test_runs_are_deterministic(protocol: str) -> None:
    a = run(CbdloRun(protocol=protocol, seed=4, **SMALL))
    b = run(CbdloRun(protocol=protocol, seed=4, **SMALL))
    for row in (a, b):
        del row["build_s"], row["run_s"]
    assert a == b and a["messages"] > 0 and a["expected"] > 0


def test_cbdlo_reaches_every_interested_subscriber_when_apts_cover_the_attributes() -> None:
    r = run(CbdloRun(protocol="cbdlo", apt=20, **SMALL))
    assert r["delivered"] == r["expected"] and r["completeness"] == 1.0
    assert r["hit_rate"] == 1.0 and r["walk_restarts"] == 0 and r["duplicates"] == 0
    assert r["vnodes_per_subscription_max"] <= 2 + 1 / 150  # ranges: at most 2 s + 1 virtual nodes
    assert r["tree_height_max"] <= 1.4405 * math.log2(r["vnodes_max"] + 2)


def test_rows_report_maintenance_beside_routing_and_the_build_matches_the_reference() -> None:
    rows = {p: run(CbdloRun(protocol=p, **SMALL)) for p in ("simple", "cbdlo", "tera")}
    cbdlo = rows["cbdlo"]
    assert cbdlo["maintenance_messages"] == cbdlo["maintenance_build"] > cbdlo["subscriptions"]
    assert cbdlo["maintenance_per_subscription"] == cbdlo["maintenance_build"] / 150
    assert rows["simple"]["maintenance_messages"] == rows["tera"]["maintenance_messages"] == 0
    # the trees the protocol built are the ones the one-process reference makes
    net = build(CbdloRun(protocol="cbdlo", **SMALL))
    ref = Topologies(0.0, 1000.0)
    for s in net.subs:
        ref.subscribe(s)
    assert net.topologies is not None and sorted(net.topologies.trees) == sorted(ref.trees)
    for attr, tree in net.topologies.trees.items():
        want = [(v.lo, v.hi, v.host, v.height) for v in ref.trees[attr].vnodes()]
        assert [(v.lo, v.hi, v.host, v.height) for v in tree.vnodes()] == want
        held = {vid: r for core in net.cores for vid, r in core.replica.recs.get(attr, {}).items()}
        assert held == tree.records()


def test_full_flood_is_complete_and_partial_flood_is_not() -> None:
    full = run(CbdloRun(protocol="simple", fanout=0, max_hops=20, **SMALL))
    assert full["completeness"] == 1.0 and full["reached_per_event"] == 200
    partial = run(CbdloRun(protocol="simple", fanout=1, max_hops=10, **SMALL))
    assert partial["completeness"] < 0.5 and partial["messages"] < full["messages"] / 5


def test_workload_follows_the_zipf_law() -> None:
    c = CbdloRun(attributes=20, mu=0.8, alpha=0.7)
    w = ZipfRangeWorkload(c)
    rng = random.Random(1)
    subs = [w.subscription(rng, i, 0) for i in range(4000)]
    share = [sum(f"a{i}" in s.attrs for s in subs) / len(subs) for i in (1, 2, 5, 20)]
    for got, i in zip(share, (1, 2, 5, 20), strict=True):
        assert got == pytest.approx(0.8 * i**-0.7, abs=0.03)  # mu * i^-alpha (a1 also when none drawn)
    events = [w.event(rng, i) for i in range(500)]
    assert all(len(e.values) == 8 for e in events)
    assert sum("a1" in e.as_dict() for e in events) > sum("a20" in e.as_dict() for e in events)


def test_bad_run_configs_are_refused() -> None:
    with pytest.raises(ExperimentError, match="unknown protocol"):
        CbdloRun(protocol="gossip")
    with pytest.raises(ExperimentError, match="do not fit"):
        CbdloRun(nodes=12, subscriptions=2000, local_max=100)
    with pytest.raises(ExperimentError, match="event_attrs"):
        CbdloRun(attributes=4, event_attrs=8)
    with pytest.raises(ExperimentError, match="width"):
        CbdloRun(width_min=0.5, width_max=0.2)


def test_experiment_configs_are_checked(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    cases = [
        ("nodez: 10\n", "unknown key 'nodez'"),
        ("protocols: [simple, gossip]\n", "unknown protocol"),
        ("experiment: cbdlo-hops\n", "is a config for 'cbdlo-hops'"),
        ("sweep: {colour: [1]}\n", "cannot sweep 'colour'"),
        ("sweep: {subscriptions: [100, 100]}\n", None),
        ("nodes: 50\nsweep: {subscriptions: [6000]}\n", "do not fit"),
        ("seeds: [1, 1]\n", "twice"),
        ("- a list\n", "expected a mapping"),
    ]
    for text, message in cases:
        bad.write_text(text)
        if message is None:
            load("cbdlo-cost", bad)  # a repeated sweep value is allowed (two identical points)
            continue
        with pytest.raises(ExperimentError, match=message):
            load("cbdlo-cost", bad)
    bad.write_text("events: [5, 5]\n")
    with pytest.raises(ExperimentError, match="2 values for 7 sizes"):
        load("cbdlo-scale", bad)
    with pytest.raises(ExperimentError, match="seeds"):
        load("cbdlo-cost", seeds="x")
    with pytest.raises(ExperimentError, match="unknown experiment"):
        load("cbdlo-nope")
    apt = load("cbdlo-apt")
    assert len(apt.points()) == len(apt.sweep["apt"]) * len(apt.attributes_list or ())


def test_the_figure_7_fit_and_extrapolation() -> None:
    ns = [100, 1000, 10_000, 100_000]
    search = [30.0, 29.0, 31.0, 30.0]
    f = fit(ns, search, [2 * math.log2(n) for n in ns], [0.5 * n for n in ns])
    assert f["a"] == pytest.approx(30) and f["b_log2n"] == pytest.approx(2) and f["c_n"] == pytest.approx(0.5)
    assert f["r2"] > 0.999
    summary = [
        {"protocol": "x", "x": n, "events": 10, "sent_Walk": 50.0, "sent_Enter": 10.0, "sent_TreeStep": 0.0,
         "sent_Matched": 30.0 * n}
        for n in ns
    ]  # fmt: skip
    ext = extrapolate(summary)["x"]
    assert ext["a"] == pytest.approx(6.0) and ext["c_n"] == pytest.approx(3.0)
    assert ext["predicted"]["1000000000"] == pytest.approx(3e9 + 6, rel=1e-9)


@pytest.mark.broker
def test_cli_cbdlo_apt_json(tmp_path: Path) -> None:
    cfg = tmp_path / "apt.yaml"
    cfg.write_text("nodes: 150\nsubscriptions: 100\nevents: 5\nseeds: [1]\n"
                   "sweep: {apt: [2, 20]}\nattributes_list: [30]\n")  # fmt: skip
    out = tmp_path / "out"
    result = runner.invoke(_app(), ["sim", "cbdlo-apt", "--config", str(cfg), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["experiment"] == "cbdlo-apt" and doc["seeds"] == [1] and doc["runs"] == 2
    rates = [r["hit_rate_10"] for r in doc["summary"]]
    assert 0 <= rates[0] <= rates[1] <= 1
    for key in ("csv", "json", "plot"):
        assert Path(doc["outputs"][key]).is_file()
    assert Path(doc["outputs"]["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert Path(doc["outputs"]["csv"]).read_text().startswith("sweep,protocol,nodes")


def test_cli_cbdlo_bad_config_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("nodes: -3\n")
    out = tmp_path / "out"
    missing = str(tmp_path / "none.yaml")
    for args in (["cbdlo-cost", "--config", str(cfg)], ["cbdlo-scale", "--config", missing],
                 ["cbdlo-hops", "--seeds", "0"]):  # fmt: skip
        result = runner.invoke(_app(), ["sim", *args, "--out", str(out), "--json"])
        assert result.exit_code == 2, result.output
        assert result.stdout == ""
        assert not out.exists()


def test_the_yaml_configs_are_the_built_in_defaults() -> None:
    from flowbus.experiments.cbdlo import EXPERIMENTS

    root = Path(__file__).resolve().parents[2] / "experiments"
    for name in EXPERIMENTS:
        assert load(name, root / f"{name}.yaml") == load(name)
