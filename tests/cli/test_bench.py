"""``flowbus bench ...``: each command runs its :mod:`flowbus.bench` module and prints one JSON
document; the plots redraw docs/results; ``flowbus bench`` works from an installed wheel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import invoke

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


def test_bench_flow_smoke() -> None:
    result = invoke("bench", "flow", "--trades", "1000", "--rounds", "1", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["outputs_agree"] and doc["stateless_outputs_agree"]
    assert doc["original_events_per_s"] > 0 and doc["rewritten_events_per_s"] > 0
    lengths = [r["sequence_length"] for r in doc["reconnect"]]
    assert [r["published_while_disconnected"] for r in doc["reconnect"]] == [10, 1_000, 100_000]
    assert max(lengths) <= 16 and all(r["replay_reaches_current_state"] for r in doc["reconnect"])


def test_bench_floor_prints_the_floor() -> None:
    result = invoke("bench", "floor", "--rounds", "2", "--deliveries-per-s", "1000000", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["benchmark"] == "broker_floor" and doc["deliveries_per_s"] == 1_000_000
    assert doc["floor_us"] == pytest.approx(doc["encode_us"] + doc["decode_us"] + doc["handoff_us"])
    assert doc["cores_at"] == pytest.approx(doc["floor_us"])  # a million deliveries: floor_us us each


def test_bench_cbr_runs_each_size() -> None:
    args = ("--sizes", "50,100", "--events", "200", "--batch", "100", "--json")
    result = invoke("bench", "cbr", *args)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["module"] == "flowbus.routing.cbr" and doc["events"] == 200
    assert [r["K"] for r in doc["results"]] == [50, 100]
    assert all(r["route_events_per_s"] > 0 and "remote_subscribe_s" in r for r in doc["results"])


def test_bench_cbr_adverts_agree_with_brute_force() -> None:
    args = ("--brokers", "7", "--publishers", "2", "--subscriptions", "60", "--events", "50", "--json")
    result = invoke("bench", "cbr-adverts", *args)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["delivery_equal"] and doc["late_state_equal"]
    assert doc["on"]["table_entries"] <= doc["off"]["table_entries"]


def test_bench_broker_passes_every_option_to_the_benchmark(monkeypatch: pytest.MonkeyPatch) -> None:
    """The options of the broker benchmark reach its run(), lists parsed (no broker started)."""
    import flowbus.bench.broker as broker

    seen: dict[str, Any] = {}

    def run(**kwargs: Any) -> dict[str, Any]:
        seen.update(kwargs)
        return {"rows": []}

    monkeypatch.setattr(broker, "run", run)
    result = invoke(
        "bench", "broker", "--brokers", "1", "--subscriptions", "1_000,10000", "--rate", "500",
        "--window", "64", "--broker-heartbeat", "2.5", "--clients", "2", "--baseline", "activemq", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {"rows": []}
    assert seen["brokers"] == [1] and seen["subscriptions"] == [1_000, 10_000]
    assert (seen["rate"], seen["window"], seen["broker_heartbeat"], seen["clients"]) == (500.0, 64, 2.5, 2)
    assert seen["subscribe_timeout"] == 900.0 and seen["profile_dir"] is None
    assert seen["baseline"] == "activemq" and seen["protocol"] == "native"
    invoke("bench", "broker", "--protocol", "stomp", "--json")
    assert seen["protocol"] == "stomp" and seen["window"] is None  # (None: native's default window)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("bench", "broker", "--brokers", "1,x"), "a comma-separated list of integers is expected"),
        (("bench", "broker", "--baseline", "rabbitmq"), "unknown baseline 'rabbitmq'"),
        (
            ("bench", "broker", "--protocol", "amqp"),
            "unknown protocol 'amqp' (expected one of native, stomp)",
        ),
        (
            ("bench", "broker", "--protocol", "stomp", "--tls", "--window", "64"),
            "--protocol stomp takes no --window (STOMP has no publish window: TCP's backpressure paces "
            "the publisher); no --tls (its clients connect in plain text",
        ),
        (("bench", "broker", "--protocol", "stomp", "--rate", "100"), "takes no --rate"),
        (("bench", "cbr", "--cbr", "nope.py"), "'nope.py' is not a file"),
        (("bench", "cbr-adverts", "--brokers", "3", "--publishers", "4"), "more than --brokers 3"),
        (("bench", "plot", "broker", "nope.json", "x.png"), "cannot read 'nope.json'"),
    ],
)
def test_bad_input_exits_2_with_a_message(args: tuple[str, ...], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.broker
def test_bench_broker_over_stomp_matches_the_offline_evaluation(tmp_path: Path) -> None:
    """A tiny ``--protocol stomp`` sweep, one broker and a ring of two (the subscriber connections
    spread over their STOMP doors): every delivery as counted offline, rows naming the protocol;
    the table, CSV and plot take the rows."""
    result = invoke(
        "bench", "broker", "--protocol", "stomp", "--brokers", "1,2", "--subscriptions", "40", "--events",
        "300", "--clients", "3", "--json", "--out", str(tmp_path),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["protocol"] == "stomp" and "stomp.py" in doc["clients"]
    assert [r["brokers"] for r in doc["rows"]] == [1, 2]
    for row in doc["rows"]:
        assert "error" not in row, row["error"]
        assert (row["protocol"], row["publish_window"], row["subscriber_connections"]) == ("stomp", None, 3)
        assert row["deliveries_match_offline"] is True
        assert row["deliveries"] == row["deliveries_expected"] > 0 and row["events_per_s_in"] > 0
        assert row["routed_s"] >= row["subscribe_s"] > 0 and row["broker_cpu_s"] >= 0
        assert row["latency_p99_ms"] >= row["latency_p50_ms"] > 0 and "stomp_errors" not in row
    assert doc["rows"][1]["ring_intact"] is True
    assert (tmp_path / "broker.png").read_bytes()[:4] == b"\x89PNG"
    assert "protocol" in (tmp_path / "rows.csv").read_text().splitlines()[0]


def test_plots_redraw_the_results(tmp_path: Path) -> None:
    for kind, result in (("match", "matching/match.jsonl"), ("broker", "broker/result.json")):
        done = invoke("bench", "plot", kind, str(RESULTS / result), str(tmp_path / f"{kind}.png"))
        assert done.exit_code == 0, done.stderr
        assert (tmp_path / f"{kind}.png").read_bytes()[:4] == b"\x89PNG"
    png, csv = tmp_path / "spark.png", tmp_path / "spark.csv"
    engine = ("--engine", str(RESULTS / "spark" / "spark.2m.json"))
    plotted = str(RESULTS / "spark" / "spark.json")
    done = invoke("bench", "plot", "spark", plotted, str(png), str(csv), *engine)
    assert done.exit_code == 0, done.stderr
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert csv.read_text().splitlines() == (RESULTS / "spark" / "spark.csv").read_text().splitlines()


# ------------------------------------------------------------------------- from a wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """flowbus built as a wheel (from a copy of the sources) and unpacked into a directory."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    dist, target = tmp / "dist", tmp / "site"
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(dist), str(source)], check=True, timeout=300)
    (wheel,) = dist.glob("flowbus-*.whl")
    install = [*pip, "install", "--no-deps", "--target", str(target), str(wheel)]
    subprocess.run(install, check=True, timeout=300)
    return target


def _from_wheel(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.broker
def test_bench_match_runs_from_an_installed_wheel(installed: Path, tmp_path: Path) -> None:
    where = _from_wheel(installed, tmp_path, "-c", "import flowbus.bench.match as m; print(m.__file__)")
    assert Path(where.stdout.strip()).is_relative_to(installed), where.stderr
    args = ("-m", "flowbus", "bench", "match", "--subscriptions", "200", "--events", "200", "--json")
    done = _from_wheel(installed, tmp_path, *args)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["benchmark"] == "match" and doc["workload"] == "w1"
    assert doc["subscriptions"] == 200 and doc["events"] == 200
    assert doc["agrees_with_brute_force"] and doc["events_per_s"] > 0


@pytest.mark.broker
def test_bench_flow_outside_a_checkout_names_what_it_needs(installed: Path, tmp_path: Path) -> None:
    done = _from_wheel(installed, tmp_path, "-m", "flowbus", "bench", "flow", "--trades", "10", "--json")
    assert done.returncode == 2 and "Traceback" not in done.stderr and done.stdout == ""
    assert "examples/stocks/flow.yaml of a flowbus checkout" in " ".join(done.stderr.split())
    assert str(tmp_path / "examples") in done.stderr.replace("\n", "")  # (a long path may be folded)
