"""``flowbus.experiments.config`` and the configs built on it: every bad value is an
ExperimentError naming its key, raised before anything runs; the statistics helpers."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from flowbus.errors import ExperimentError
from flowbus.experiments.cbdlo import DEFAULTS as CBDLO
from flowbus.experiments.cbdlo_run import CbdloRun
from flowbus.experiments.config import (
    config_path,
    fraction,
    integer,
    number,
    one_of,
    parse_list,
    read_config,
    seeds_value,
    unique,
)
from flowbus.experiments.irbr import DEFAULTS as IRBR
from flowbus.experiments.irbr_run import IrbrRun
from flowbus.experiments.pastry_hops import PastryHops
from flowbus.experiments.ring import RingClasses, RingFaults, RingJoin, RingRepair
from flowbus.experiments.stats import fit_log, interval, mean, r_squared, sample_sd


def test_checks_name_the_key() -> None:
    assert integer("nodes", 3, 2) == 3 and number("zipf", 1) == 1.0 and fraction("f", 1) == 1.0
    cases: list[tuple[Any, str]] = [
        (lambda: integer("nodes", True, 2), "nodes must be an int >= 2, got True"),
        (lambda: integer("nodes", 1.0, 0), "nodes must be an int >= 0, got 1.0"),
        (lambda: number("latency", 0, low=0, strict=True), "latency must be a number > 0, got 0"),
        (lambda: number("zipf", "x"), "zipf must be a number, got 'x'"),
        (lambda: fraction("mu", 0, open_low=True), "mu must be a fraction in (0, 1], got 0"),
        (lambda: fraction("failure", 1.0, open_high=True), "failure must be a fraction in [0, 1), got 1.0"),
        (lambda: unique("seeds", [1, 2, 1]), "seeds: 1 is listed twice"),
        (lambda: unique("seeds", []), "seeds must not be empty"),
        (lambda: unique("seeds", "12"), "seeds must be a list"),
        (lambda: one_of("protocol", "x", ("a", "b")), "unknown protocol 'x' (expected one of a, b)"),
        (lambda: parse_list("sizes", "1,x", int, "integers"), "sizes must be integers; got '1,x'"),
        (lambda: seeds_value(0), "seeds N must be >= 1"),
    ]
    for call, message in cases:
        with pytest.raises(ExperimentError) as info:
            call()
        assert message in str(info.value)


def test_seeds_in_a_file() -> None:
    assert seeds_value(3) == (1, 2, 3) and seeds_value([5, 2]) == (5, 2) and seeds_value("2-3") == (2, 3)


def test_config_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert config_path("irbr-faults", None) is None  # no experiments/ here: the built-in defaults
    (tmp_path / "experiments").mkdir()
    default = tmp_path / "experiments" / "irbr-faults.yaml"
    default.write_text("experiment: irbr-faults\nnodes: 50\n")
    assert config_path("irbr-faults", None) == Path("experiments/irbr-faults.yaml")
    with pytest.raises(ExperimentError, match="sweep config not found"):
        config_path("irbr-faults", tmp_path / "missing.yaml")
    assert read_config(default, "irbr-faults", {"nodes"}) == {"nodes": 50}
    with pytest.raises(ExperimentError, match="is a config for 'irbr-faults', not 'irbr-forwards'"):
        read_config(default, "irbr-forwards", {"nodes"})
    with pytest.raises(ExperimentError, match="unknown key 'nodes' \\(known keys: events\\)"):
        read_config(default, "irbr-faults", {"events"})


@pytest.mark.parametrize(
    ("make", "key"),
    [
        (lambda: IrbrRun("irbr", zipf=-1.0), "zipf"),
        (lambda: IrbrRun("irbr", latency=0.0), "latency"),
        (lambda: IrbrRun("irbr", notice=-1.0), "notice"),
        (lambda: IrbrRun("irbr", symbols=0), "symbols"),
        (lambda: IrbrRun("irbr", covering=1), "covering"),  # type: ignore[arg-type]
        (lambda: CbdloRun(mu=0.0), "mu"),
        (lambda: CbdloRun(alpha=-1.0), "alpha"),
        (lambda: CbdloRun(domain=0.0), "domain"),
        (lambda: CbdloRun(one_sided=2.0), "one_sided"),
        (lambda: PastryHops(lookups=0), "lookups"),
        (lambda: PastryHops(seed=-1), "seed"),
        (lambda: RingJoin(sizes=(1, 16)), "sizes"),
        (lambda: RingJoin(window=0), "window"),
        (lambda: RingRepair(sizes=(16,), trials=0), "trials"),
        (lambda: RingClasses(link_failures=1.0), "link_failures"),
        (lambda: RingClasses(express=1.5), "express"),
        (lambda: RingFaults(custody=(0,)), "custody"),  # type: ignore[arg-type]
        (lambda: RingFaults(events=5), "events"),
    ],
)
def test_a_bad_value_names_its_key(make: Any, key: str) -> None:
    with pytest.raises(ExperimentError, match=key):
        make()


def test_every_config_is_json_and_knows_its_name_and_seeds() -> None:
    import json

    configs = [
        *IRBR.values(),
        *CBDLO.values(),
        PastryHops(),
        RingJoin(),
        RingRepair(),
        RingClasses(),
        RingFaults(),
    ]
    for c in configs:
        assert c.experiment.split("-")[0] in ("irbr", "cbdlo", "pastry", "ring")
        assert c.seeds and all(type(s) is int for s in c.seeds)
        json.dumps(c.to_dict())
    assert sorted(c.experiment for c in configs) == sorted(
        ["irbr-faults", "irbr-forwards", "cbdlo-cost", "cbdlo-hops", "cbdlo-scale", "cbdlo-matching",
         "cbdlo-apt", "pastry-hops", "ring-join", "ring-repair", "ring-classes", "ring-faults"]
    )  # fmt: skip


def test_statistics() -> None:
    assert mean([1.0, 2.0, 4.0]) == pytest.approx(7 / 3)
    assert sample_sd([5.0], 5.0) is None and interval(5.0, None, 1) == (None, None, None)
    assert sample_sd([1.0, 3.0], 2.0) == pytest.approx(math.sqrt(2))
    half, lo, hi = interval(2.0, math.sqrt(2), 2)
    assert (
        half == pytest.approx(12.7062) and lo == pytest.approx(2 - 12.7062) and hi == pytest.approx(14.7062)
    )
    assert r_squared([3.0, 3.0], [1.0, 2.0]) == 1.0 and r_squared([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 1.0
    fit = fit_log([2, 8], [1.0, 5.0])  # 1 + 2 (log2 n - 1)
    assert fit["slope"] == pytest.approx(2.0) and fit["intercept"] == pytest.approx(-1.0)
