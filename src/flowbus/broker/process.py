"""Brokers in processes of their own: what ``flowbus cluster up``, the tests and the
benchmarks start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from flowbus.errors import ExternalError

__all__ = ["OVERLOADED", "READY", "console_of", "start_process", "stomp_of", "wait_ready"]

READY = "flowbus broker ready"
"""The line a broker prints (standard output) once it is a member of the ring:
``flowbus broker ready HOST:PORT pid PID`` (and ``console URL`` with ``--http``, ``stomp
HOST:PORT`` with ``--stomp``)."""

OVERLOADED = "flowbus broker overloaded"
"""The line a broker prints (standard output) when it asks for another broker:
``flowbus broker overloaded HOST:PORT load X``."""


def start_process(
    listen: str,
    *,
    join: list[str],
    data: Path | None = None,
    config: Path | None = None,
    log: Path | None = None,
    flows: list[Path] | tuple[Path, ...] = (),
    tls: Path | None = None,
    tls_name: str | None = None,
    http: str | None = None,
    advertise: str | None = None,
    stomp: str | None = None,
) -> subprocess.Popen[str]:
    """A broker in a process of its own (``flowbus broker start``); its standard error (the
    log) goes to the file ``log`` if one is given, else to ours. With ``tls`` (a ``certs
    init`` directory), it serves and dials in TLS with the certificate ``tls_name``. With
    ``advertise`` (``"host:port"``), it listens on ``listen`` but is known in the ring and to
    clients as ``advertise`` (its ready line names that address). With ``stomp``
    (``"host:port"``, port 0: any free port), it serves STOMP clients there too
    (:func:`stomp_of` the process: the address it bound)."""
    cmd = [sys.executable, "-m", "flowbus", "broker", "start", "--listen", listen]
    if advertise is not None:
        cmd += ["--advertise", advertise]
    for j in join:
        cmd += ["--join", j]
    if data is not None:
        cmd += ["--data", str(data)]
    if config is not None:
        cmd += ["--config", str(config)]
    for f in flows:
        cmd += ["--flow", str(f)]
    if tls is not None:
        cmd += ["--tls", str(tls)] + (["--tls-name", tls_name] if tls_name else [])
    if http is not None:
        cmd += ["--http", http]
    if stomp is not None:
        cmd += ["--stomp", stomp]
    if log is None:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    with log.open("a") as stderr:  # (the child has its own copy of the descriptor)
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True)


def wait_ready(proc: subprocess.Popen[str]) -> str:
    """Wait for a broker process's ready line; its address (its console's URL is then
    :func:`console_of` the process)."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(READY):
        raise ExternalError(f"broker process {proc.pid} did not start (exit code {proc.poll()})")
    words = line.split()
    _consoles[proc.pid] = words[words.index("console") + 1] if "console" in words else None
    _stomps[proc.pid] = words[words.index("stomp") + 1] if "stomp" in words else None
    return words[3]


_consoles: dict[int, str | None] = {}  # process id -> the URL of its console, from its ready line


def console_of(proc: subprocess.Popen[str]) -> str | None:
    """The URL of the web console of a ready broker process (None: it has none)."""
    return _consoles.get(proc.pid)


_stomps: dict[int, str | None] = {}  # process id -> the address of its STOMP listener


def stomp_of(proc: subprocess.Popen[str]) -> str | None:
    """The ``host:port`` of the STOMP listener of a ready broker process (None: it has none)."""
    return _stomps.get(proc.pid)
