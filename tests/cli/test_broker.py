"""The broker commands end to end: `flowbus broker start`, `sub`, `pub`, `cluster up`, and
their errors for bad input."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import stomp  # type: ignore[import-untyped]
from tests.cli.conftest import until_received
from tests.ports import consecutive_free_ports

from flowbus.broker.process import start_process, wait_ready

pytestmark = pytest.mark.broker

FLOWBUS = [sys.executable, "-m", "flowbus"]


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    proc = start_process("127.0.0.1:0", join=[])
    try:
        yield wait_ready(proc)
    finally:
        proc.terminate()
        proc.wait(20)


def flowbus(*args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FLOWBUS, *args], input=stdin, capture_output=True, text=True, timeout=timeout)


def test_pub_and_sub(broker: str) -> None:
    sub = subprocess.Popen(
        [*FLOWBUS, "sub", "stocks", 'symbol = "IBM" & price > 100', "--broker", broker, "--count", "2"],
        stdout=subprocess.PIPE,
        text=True,
    )
    events = [
        {"symbol": "IBM", "price": 90.0 + 10 * i, "quantity": i, "exchange": "NYSE", "level": 1}
        for i in range(4)
    ]
    lines = "".join(json.dumps(e) + "\n" for e in events)

    def publish() -> subprocess.CompletedProcess[str]:
        done = flowbus("pub", "stocks", "--broker", broker, stdin=lines)
        assert "published 4 event(s) to stocks" in done.stderr
        return done

    got = [json.loads(line) for line in until_received(sub, publish).splitlines()]
    assert [e["price"] for e in got] == [110.0, 120.0]
    assert got[0] == events[2]


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["pub", "stocks", "--event", "{bad"], None, "event 1: not JSON"),
        (["pub", "stocks", "--event", "[1, 2]"], None, "a JSON object is expected"),
        (["pub", "stocks", "--event", '{"symbol": 1}'], None, "field 'symbol' must be str"),
        (["pub", "nowhere", "--event", '{"x": 1}'], None, "unknown space 'nowhere'"),
        (["sub", "stocks", "price >"], None, "unexpected end of filter at line 1, column 8"),
        (["sub", "stocks", "colour = 1"], None, "unknown field 'colour'"),
    ],
)
def test_bad_input_is_named(broker: str, args: list[str], stdin: str | None, message: str) -> None:
    done = flowbus(*args, "--broker", broker, stdin=stdin)
    assert done.returncode == 2
    assert message in " ".join(done.stderr.split())


def test_broker_start_refuses_bad_options() -> None:
    done = flowbus("broker", "start", "--listen", "nowhere")
    assert done.returncode == 2 and "HOST:PORT" in done.stderr
    done = flowbus("broker", "start", "--listen", "127.0.0.1:0", "--overlay", "mesh")
    assert done.returncode == 2 and "unknown overlay 'mesh'" in done.stderr


def _background_job() -> None:
    """What a shell without job control does to a command it runs with ``&``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background-job"])
def test_cluster_up_and_ctrl_c(background: bool) -> None:
    """Ctrl-C (SIGINT) stops the cluster, also when it was started as a script's background
    job, with SIGINT ignored (it then did nothing: a test run started that way hung)."""
    port = consecutive_free_ports(2)
    proc = subprocess.Popen(
        [*FLOWBUS, "cluster", "up", "--brokers", "2", "--port", str(port), "--http", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # (its brokers in its process group: all stopped below, whatever happens)
        preexec_fn=_background_job if background else None,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]
        assert lines[0].startswith(f"broker 127.0.0.1:{port} ")
        assert lines[1].startswith(f"broker 127.0.0.1:{port + 1} ")
        assert "2 broker(s) up" in lines[2]
        assert lines[3].startswith("console: http://127.0.0.1:")  # (the first broker's; 8080 unless told)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        for p in (port, port + 1):  # the brokers are gone
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", p), timeout=5).close()
    finally:
        with contextlib.suppress(ProcessLookupError):  # (brokers left behind if it timed out)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_cluster_up_gives_each_broker_a_stomp_port_and_a_stomp_event_crosses_the_ring() -> None:
    """``cluster up --stomp PORT``: broker i serves STOMP on PORT + i - 1; an event sent over
    STOMP at the second broker reaches a STOMP subscriber of the first, its selector applied."""
    port = consecutive_free_ports(4)
    door = port + 2  # (the STOMP ports after the brokers')
    proc = subprocess.Popen(
        [
            *FLOWBUS,
            "cluster",
            "up",
            "--brokers",
            "2",
            "--port",
            str(port),
            "--http",
            "off",
            "--stomp",
            str(door),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    got: list[dict[str, Any]] = []
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]
        assert lines[3].strip() == f"STOMP: 127.0.0.1:{door}, 127.0.0.1:{door + 1}", lines
        sub, pub = stomp.Connection12([("127.0.0.1", door)]), stomp.Connection12([("127.0.0.1", door + 1)])
        sub.set_listener("take", _Taker(got))
        for conn in (sub, pub):
            conn.connect(wait=True)
        sub.subscribe(
            "/topic/stocks", "s1", headers={"selector": "price > 100 AND symbol LIKE 'H%'", "receipt": "r"}
        )
        time.sleep(1.0)  # (the subscription reaches the other broker's routing tables)
        sent = [
            {"symbol": s, "price": p, "quantity": 1, "exchange": "NYSE", "level": 1}
            for s, p in [("HP", 101.0), ("HP", 99.0), ("IBM", 150.0), ("HAL", 120.5)]
        ]
        for event in sent:
            pub.send(
                "/topic/stocks", json.dumps(event), content_type="application/json", headers={"receipt": "x"}
            )
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # (nothing more comes)
        assert got == [sent[0], sent[3]]
        for conn in (sub, pub):
            conn.disconnect()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            assert proc.wait(30) == 0
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class _Taker(stomp.ConnectionListener):  # type: ignore[misc]
    """A stomp.py listener that keeps the events of the MESSAGEs it is given."""

    def __init__(self, got: list[dict[str, Any]]) -> None:
        self.got = got

    def on_message(self, frame: Any) -> None:
        self.got.append(json.loads(frame.body))


def test_cluster_up_refuses_stomp_ports_that_overlap_the_brokers() -> None:
    done = flowbus("cluster", "up", "--brokers", "3", "--port", "7001", "--stomp", "7002")
    assert done.returncode == 2 and "overlap" in done.stderr


# ---------------------------------------------------------------- pip install flowbus (no extra)

EXTRAS_ONLY = sorted({"matplotlib", "numba", "numpy", "pandas", "pyarrow", "pyspark", "yaml", "cryptography"})
"""Modules only an extra brings (pyproject.toml): blocked, as if ``pip install flowbus`` alone."""

_BARE = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # (import name: ModuleNotFoundError, as if not installed)
sys.argv = ["flowbus", *sys.argv[1:]]
from flowbus.cli import main
main()
"""


def bare_cmd(*args: str, blocked: list[str] = EXTRAS_ONLY) -> list[str]:
    """The command line of ``flowbus ARGS`` with the extras' modules missing."""
    return [sys.executable, "-c", _BARE.format(blocked=blocked), *args]


def bare(*args: str, blocked: list[str] = EXTRAS_ONLY) -> subprocess.CompletedProcess[str]:
    return subprocess.run(bare_cmd(*args, blocked=blocked), capture_output=True, text=True, timeout=60)


def test_pub_and_sub_need_no_extra(broker: str) -> None:
    """The client, the filter language and the CLI's pub and sub run on the base install."""
    sub = subprocess.Popen(
        bare_cmd("sub", "stocks", "price > 100", "--broker", broker, "--count", "1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    event = {"symbol": "HP", "price": 101.0, "quantity": 1, "exchange": "NYSE", "level": 1}
    out = until_received(sub, lambda: bare("pub", "stocks", "--broker", broker, "--event", json.dumps(event)))
    assert json.loads(out.splitlines()[0]) == event


@pytest.mark.parametrize(
    ("args", "blocked", "extra"),
    [
        (["bench", "match", "--subscriptions", "10", "--events", "10", "--json"], ["numpy"], "broker"),
        (["certs", "init", "{tmp}/pki"], ["cryptography"], "broker"),
        (
            ["run", "{root}/examples/stocks/flow.yaml", "--engine", "spark", "--out", "{tmp}/out"],
            ["pyspark"],
            "spark",
        ),
    ],
)
def test_a_missing_extra_is_one_line_that_names_it(
    tmp_path: Path, args: list[str], blocked: list[str], extra: str
) -> None:
    root = Path(__file__).resolve().parents[2]
    done = bare(*(a.format(tmp=tmp_path, root=root) for a in args), blocked=blocked)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pip install 'flowbus[{extra}]'" in lines[0], done.stderr
    assert not (tmp_path / "pki").exists() and not (tmp_path / "out").exists()
