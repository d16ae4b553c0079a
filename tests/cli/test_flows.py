"""The flow commands on brokers end to end: a broker or a cluster started with `--flow`, `flow ls`,
`flow generate | pub -`, `sub` without a filter, `flow deploy` / `undeploy`, and their errors."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.cli.test_broker import FLOWBUS, flowbus
from tests.flows.world import canon, reference
from tests.ports import consecutive_free_ports

from flowbus.broker.process import start_process, wait_ready
from flowbus.flow.deploy import Deployment

pytestmark = pytest.mark.broker

STOCKS = Path(__file__).parents[2] / "examples" / "stocks" / "flow.yaml"


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    proc = start_process("127.0.0.1:0", join=[], flows=[STOCKS])
    try:
        yield wait_ready(proc)
    finally:
        proc.terminate()
        proc.wait(20)


def test_a_flow_deployed_at_start_runs_from_generate_to_sub(broker: str) -> None:
    listed = json.loads(flowbus("flow", "ls", "--broker", broker, "--json").stdout)
    assert [f["name"] for f in listed] == ["stocks"]
    assert {s["name"] for s in listed[0]["spaces"] if s["publishable"]} == {"NYSE", "NASDAQ", "combined"}
    generated = flowbus("flow", "generate", str(STOCKS), "--events", "400")
    lines = generated.stdout.splitlines()
    assert len(lines) == 400 and set(json.loads(lines[0])) == {"space", "event"}
    want = reference(
        Deployment.from_file(STOCKS), [tuple(json.loads(x).values()) for x in lines], ["big_trades"]
    )
    big = [e for e in want["big_trades"] if e["cap"] >= 2_000_000]
    sub = subprocess.Popen(
        [*FLOWBUS, "sub", "big_trades", "cap >= 2000000", "--broker", broker, "--count", str(len(big))],
        stdout=subprocess.PIPE,
        text=True,
    )
    everything = subprocess.Popen(
        [*FLOWBUS, "sub", "big_trades", "--broker", broker, "--count", str(len(want["big_trades"]))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3.0)  # (both subscribed)
        done = flowbus("pub", "-", "--broker", broker, stdin=generated.stdout)
        assert done.returncode == 0, done.stderr
        assert "published 400 event(s) to NASDAQ, NYSE, combined" in done.stderr
        out, _ = sub.communicate(timeout=30)
        assert canon([json.loads(x) for x in out.splitlines()]) == canon(big)
        out, _ = everything.communicate(timeout=30)
        assert canon([json.loads(x) for x in out.splitlines()]) == canon(want["big_trades"])
    finally:
        for p in (sub, everything):
            p.kill()
            p.wait()


def test_deploy_and_undeploy_another_flow(broker: str, tmp_path: Path) -> None:
    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        "name: tiny\nspaces:\n  raw: {kind: source, schema: {x: int}}\n"
        "  big: {kind: sink, schema: {x: int}}\narcs:\n  - {name: S, from: raw, to: big, select: 'x > 10'}\n"
    )
    done = flowbus("flow", "deploy", str(spec), "--broker", broker, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["name"] == "tiny"
    names = [f["name"] for f in json.loads(flowbus("flow", "ls", "--broker", broker, "--json").stdout)]
    assert names == ["stocks", "tiny"]
    done = flowbus("flow", "undeploy", "tiny", "--broker", broker)
    assert done.returncode == 0 and "flow tiny" in done.stdout and "undeployed" in done.stdout
    names = [f["name"] for f in json.loads(flowbus("flow", "ls", "--broker", broker, "--json").stdout)]
    assert names == ["stocks"]


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["flow", "undeploy", "nope"], None, "no flow 'nope' is deployed (deployed: stocks)"),
        (["pub", "-"], '{"x": 1}\n', 'each line is {"space": NAME, "event": {...}}'),
        (["pub", "compressed", "--event", '{"name": "IBM", "price": 1.0}'], None, "is not publishable"),
        (["sub", "big_trades", "price > 1"], None, "unknown field 'price' in space 'big_trades'"),
        (["sub", "max_cur"], None, "space 'max_cur' of flow 'stocks' is a state"),
    ],
)
def test_bad_input_is_named(broker: str, args: list[str], stdin: str | None, message: str) -> None:
    done = flowbus(*args, "--broker", broker, stdin=stdin)
    assert done.returncode == 2
    assert message in " ".join(done.stderr.split())


def test_a_bad_spec_is_refused_before_anything_starts(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\nspaces: {}\narcs: [{name: S, from: a, to: b, select: 'x > 1'}]\n")
    done = flowbus("flow", "deploy", str(spec), "--broker", "127.0.0.1:1")
    assert done.returncode == 2 and "from unknown space 'a'" in done.stderr and "bad.yaml" in done.stderr
    done = flowbus(
        "broker", "start", "--listen", "127.0.0.1:0", "--overlay", "pastry-irbr", "--flow", str(STOCKS)
    )
    assert done.returncode == 2 and "the pastry-irbr overlay runs no flows" in done.stderr


def test_cluster_up_deploys_its_flows_once_the_ring_is_up() -> None:
    port = consecutive_free_ports(2)
    proc = subprocess.Popen(
        [
            *FLOWBUS,
            "cluster",
            "up",
            "--brokers",
            "2",
            "--port",
            str(port),
            "--flow",
            str(STOCKS),
            "--http",
            "off",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]
        assert "2 broker(s) up" in lines[2]
        assert lines[3].startswith("flow stocks ") and "publish into NYSE, NASDAQ, combined" in lines[3]
        listed = json.loads(flowbus("flow", "ls", "--broker", f"127.0.0.1:{port + 1}", "--json").stdout)
        assert listed[0]["owners"] == 2  # (both brokers own a part of its state)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()
