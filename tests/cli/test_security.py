"""Security from the command line: ``flowbus certs init``, a broker process with ``--tls`` and
an ``acl``, ``pub`` / ``sub`` with ``--tls DIR --user NAME`` and ``--token``, a refusal named on
standard error, plain text to the TLS port closed without a traceback in the broker's log, the
rights read again on ``SIGHUP`` and ``flowbus acl reload``."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.cli.conftest import until_received
from tests.cli.test_broker import FLOWBUS, flowbus
from tests.ports import consecutive_free_ports

from flowbus.broker.acl import new_token
from flowbus.broker.process import start_process, wait_ready

pytestmark = pytest.mark.broker

TOKEN, TOKEN_HASH = new_token()
EVENT = {"symbol": "IBM", "price": 120.0, "quantity": 1, "exchange": "NYSE", "level": 1}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, Path, int]]:
    """A ``certs init`` directory, a TLS broker with an acl, its log, its process id."""
    root = tmp_path_factory.mktemp("secured")
    done = flowbus(
        "certs", "init", str(root / "pki"), "--brokers", "1", "--clients", "alice", "--clients", "bob"
    )
    assert done.returncode == 0, done.stderr
    config = root / "broker.yaml"
    acl = {"alice": {"publish": ["stocks"], "subscribe": ["*"]}, "bob": {"subscribe": ["stocks"]}}
    config.write_text(json.dumps({"acl": acl, "tokens": {"carol": TOKEN_HASH}}))  # (JSON is YAML)
    log = root / "broker.log"
    proc = start_process("127.0.0.1:0", join=[], config=config, log=log, tls=root / "pki")
    try:
        yield root / "pki", wait_ready(proc), log, proc.pid
    finally:
        proc.terminate()
        proc.wait(20)


def _publish_until_received(sub: subprocess.Popen[str], options: list[str]) -> None:
    """Publish ``EVENT`` (``flowbus pub`` with ``options``) until the ``flowbus sub --count 1``
    process ``sub`` prints it (it may not be subscribed yet)."""
    out = until_received(sub, lambda: flowbus("pub", "stocks", "--event", json.dumps(EVENT), *options))
    assert json.loads(out) == EVENT


def test_certs_init_writes_the_authority_and_the_named_certificates(
    secured: tuple[Path, str, Path, int],
) -> None:
    pki, _, _, _ = secured
    names = {p.name for p in pki.iterdir()}
    assert {"ca.pem", "broker-1.pem", "broker-1-key.pem", "alice.pem", "bob-key.pem"} <= names


def test_pub_and_sub_with_certificates_and_a_refusal_by_name(secured: tuple[Path, str, Path, int]) -> None:
    pki, address, _, _ = secured
    tls = ["--tls", str(pki), "--broker", address]
    sub = subprocess.Popen(
        [*FLOWBUS, "sub", "stocks", "price > 100", "--count", "1", *tls, "--user", "bob"],
        stdout=subprocess.PIPE,
        text=True,
    )
    _publish_until_received(sub, [*tls, "--user", "alice"])
    refused = flowbus("pub", "stocks", "--event", json.dumps(EVENT), *tls, "--user", "bob")
    assert refused.returncode == 2
    assert "identity 'bob' has no publish right on 'stocks'" in refused.stderr
    refused = flowbus("pub", "stocks", "--event", json.dumps(EVENT), *tls, "--token", TOKEN)
    assert refused.returncode == 2 and "identity 'carol' has no publish right" in refused.stderr


def test_plain_text_to_the_tls_port_is_closed_without_a_traceback(
    secured: tuple[Path, str, Path, int],
) -> None:
    _, address, log, _ = secured
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            answer = s.recv(100)
        except ConnectionResetError:  # (closed with our bytes unread)
            answer = b""
        assert answer == b""
    for _ in range(50):
        if "plain text from 127.0.0.1 on a TLS port" in log.read_text():
            break
        time.sleep(0.1)
    text = log.read_text()
    assert "plain text from 127.0.0.1 on a TLS port: closed" in text and "Traceback" not in text


def test_cluster_up_tls_is_a_mutual_tls_ring(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    assert flowbus("certs", "init", str(pki), "--brokers", "2", "--clients", "alice").returncode == 0
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
            "--tls",
            str(pki),
            "--http",
            "off",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        assert "2 broker(s) up" in lines[2], lines
        # an event published at the second broker reaches a subscriber of the first (over mTLS)
        tls = ["--tls", str(pki), "--user", "alice"]
        sub = subprocess.Popen(
            [*FLOWBUS, "sub", "stocks", "--count", "1", "--broker", f"127.0.0.1:{port}", *tls],
            stdout=subprocess.PIPE,
            text=True,
        )
        _publish_until_received(sub, ["--broker", f"127.0.0.1:{port + 1}", *tls])
    finally:
        proc.terminate()
        proc.wait(30)


def test_bench_broker_tls_runs_brokers_and_clients_in_tls() -> None:
    """A tiny ``flowbus bench broker --tls`` row: every delivery as counted offline, over TLS."""
    done = flowbus(
        "bench", "broker", "--tls", "--brokers", "1", "--subscriptions", "10", "--events", "300",
        "--clients", "1", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["rows"]
    assert row["tls"] is True and "error" not in row, row.get("error")
    assert row["deliveries_match_offline"] is True and row["deliveries_expected"] > 0


def test_flow_commands_take_tls_and_deploying_needs_the_right(secured: tuple[Path, str, Path, int]) -> None:
    pki, address, _, _ = secured
    tls = ["--tls", str(pki), "--user", "alice", "--broker", address]
    listed = flowbus("flow", "ls", *tls)
    assert listed.returncode == 0 and "no flow is deployed" in listed.stdout, listed.stderr
    spec = Path(__file__).resolve().parents[2] / "examples" / "stocks" / "flow.yaml"
    refused = flowbus("flow", "deploy", str(spec), *tls)
    assert refused.returncode == 2 and "identity 'alice' has no deploy right on 'stocks'" in refused.stderr


def test_sighup_and_acl_reload_give_a_running_broker_new_rights(secured: tuple[Path, str, Path, int]) -> None:
    pki, address, log, pid = secured
    config = pki.parent / "broker.yaml"
    original = config.read_text()
    tls = ["--tls", str(pki), "--broker", address]
    sub = subprocess.Popen(
        [*FLOWBUS, "sub", "stocks", "--count", "5", *tls, "--user", "bob"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert sub.stdout is not None
        for _ in range(20):  # (until the subscriber is subscribed)
            done = flowbus("pub", "stocks", "--event", json.dumps(EVENT), *tls, "--user", "alice")
            assert done.returncode == 0, done.stderr
            if select.select([sub.stdout], [], [], 1.0)[0]:
                break
        assert json.loads(sub.stdout.readline()) == EVENT
        acl = {"alice": {"publish": ["stocks"], "subscribe": ["*"], "admin": ["acl"]}, "bob": {}}
        config.write_text(json.dumps({"acl": acl}))
        os.kill(pid, signal.SIGHUP)
        said = " ".join(sub.communicate(timeout=20)[1].split())  # (standard error, unwrapped)
        assert sub.returncode == 2 and "identity 'bob' has no subscribe right on 'stocks'" in said
        done = flowbus("acl", "reload", *tls, "--user", "alice", "--json")
        assert done.returncode == 0 and json.loads(done.stdout)["identities"] == ["alice", "bob"], done.stderr
        config.write_text(json.dumps({"acl": {"alice": {"publish": 3}}}))
        bad = flowbus("acl", "reload", *tls, "--user", "alice")
        said = " ".join(bad.stderr.split())
        assert bad.returncode == 2 and "acl.alice.publish: a list of space patterns" in said
        assert "acl reload refused, the old rights stay" in log.read_text()
    finally:
        sub.kill()
        sub.wait()
        config.write_text(original)
        os.kill(pid, signal.SIGHUP)
