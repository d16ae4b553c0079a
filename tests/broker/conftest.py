"""Broker processes for the tests: ``flowbus broker start`` in subprocesses, always stopped
(terminate, then kill) when the test ends, passed or failed. Each one's log (standard
error) goes to a file in the test's directory, and its last lines are printed at the end of
the test (pytest shows them when the test fails)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import pytest

from flowbus.broker.process import start_process, wait_ready
from flowbus.errors import FlowbusError
from flowbus.matching.matcher import warm_up

StartBroker = Callable[..., tuple["subprocess.Popen[str]", str]]


def _ready(proc: subprocess.Popen[str], timeout: float) -> str:
    """The address of the broker's ready line; the process is killed if none comes in time."""
    with ThreadPoolExecutor(1) as pool:
        line = pool.submit(wait_ready, proc)
        try:
            return line.result(timeout)
        except FutureTimeout:
            proc.kill()  # (the reader thread then sees end of file)
            raise FlowbusError(f"broker process {proc.pid}: no ready line in {timeout} s") from None


def stop(proc: subprocess.Popen[str]) -> None:
    """Terminate a broker process, kill it if it does not go."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    if proc.stdout is not None:
        with contextlib.suppress(OSError):
            proc.stdout.close()


LOG_TAIL = 60  # lines of each broker's log printed at the end of a test


@pytest.fixture(scope="session")
def _matching_compiled() -> None:
    """The matcher's kernels compiled once, here, and saved in numba's cache before any
    broker process starts (each then loads them instead of compiling them at once)."""
    warm_up()


@pytest.fixture
def start_broker(tmp_path: Path, _matching_compiled: None) -> Iterator[StartBroker]:
    """``start_broker(listen, join=[...], data=DIR, config=FILE, stomp=HOST:PORT)`` starts a
    broker process and waits for its ready line: ``(process, "host:port")`` (its STOMP
    listener's address: ``stomp_of(process)``). Every process started is
    stopped at the end of the test."""
    procs: list[subprocess.Popen[str]] = []
    logs: list[Path] = []

    def start(
        listen: str = "127.0.0.1:0",
        *,
        join: list[str] | None = None,
        data: Path | None = None,
        config: Path | None = None,
        timeout: float = 30.0,
        stomp: str | None = None,
    ) -> tuple[subprocess.Popen[str], str]:
        log = tmp_path / f"broker-log-{len(procs)}.txt"
        proc = start_process(listen, join=join or [], data=data, config=config, log=log, stomp=stomp)
        procs.append(proc)
        logs.append(log)
        return proc, _ready(proc, timeout)

    try:
        yield start
    finally:
        for proc in procs:
            stop(proc)
        for n, log in enumerate(logs):
            lines = log.read_text(errors="replace").splitlines() if log.exists() else []
            print(f"--- broker {n} (pid {procs[n].pid}): last {LOG_TAIL} of {len(lines)} log lines")
            print("\n".join(lines[-LOG_TAIL:]))
