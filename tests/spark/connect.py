"""A real Spark Connect server for tests: ``local[2]`` behind a gRPC port on 127.0.0.1, started from pyspark.

How it works:

* :func:`connect_server` runs pyspark's bundled ``bin/spark-submit --class
  org.apache.spark.sql.connect.service.SparkConnectServer ... spark-internal``
  (what ``sbin/start-connect-server.sh`` runs, minus ``spark-daemon.sh``, which
  detaches) as a foreground child in its own session (process group):
  ``spark-submit`` execs the server's JVM, which forks the Python workers, all
  in that group. The connect jar ships in ``pyspark/jars``, so no ``--jars``.
* The gRPC port is picked by binding 127.0.0.1:0 first and is passed as
  ``spark.connect.grpc.binding.port`` with ``spark.connect.grpc.binding.address``
  127.0.0.1; the server does not look for another port when that one is taken
  (``spark.connect.grpc.port.maxRetries`` is 0), it exits, and then a new port
  is tried (up to three times). ``SPARK_LOCAL_IP`` and the ``spark.driver.*``
  settings keep the server's other ports on 127.0.0.1 too; the web UI is off.
* The server's Python workers run this interpreter (``PYSPARK_PYTHON``), which
  has flowbus installed; clients ship their flowbus as a zip all the same (see
  ``flowbus.spark.session``). Its temporary files, local dirs and the numba
  cache of that zip (``XDG_CACHE_HOME``) stay under ``base_dir``.
* Startup waits (90 s by default) until the port accepts TCP connections and a
  client in a subprocess gets ``range(3).count() == 3`` back: a Connect client
  session is never opened in the test process, where the suite's classic
  session lives (``SparkSession.builder.getOrCreate()`` could hand out either).
  If the server exits or time runs out, the error quotes the tail of its log.
* On the way out (normal or not) the process group gets SIGTERM, then SIGKILL
  after 10 s, so no JVM outlives the test.
* :func:`run_flowbus` runs ``python -m flowbus ...`` as a client subprocess with
  :meth:`ConnectServer.client_env` (pass ``--remote server.url`` yourself).
  Relative paths given to a Connect command are resolved by the *server*,
  against its working directory (``base_dir``): pass absolute paths.

A fixture is a few lines on top of :func:`connect_server` (see ``test_connect.py``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .cluster import JVM_OPTIONS, free_port, run_python_flowbus, spark_home, stop_process, tail

__all__ = [
    "SERVER_CLASS",
    "ConnectServer",
    "connect_server",
    "missing_client_modules",
    "run_flowbus",
    "server_command",
]

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"

_SRC = Path(__file__).resolve().parents[2] / "src"
_TAIL_LINES = 60
_BIND_ATTEMPTS = 3
_SESSION_ID = re.compile(r"sessionId: ([0-9a-f-]{36})")
_CLIENT_MODULES = ("grpc", "grpc_status", "google.rpc", "zstandard")

_PROBE = """\
import sys

from pyspark.sql import SparkSession

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
try:
    print(spark.range(3).count())
finally:
    spark.stop()
"""


def missing_client_modules() -> list[str]:
    """The modules a Spark Connect client needs (``pip install 'pyspark[connect]'``) that do not import."""
    missing = []
    for name in _CLIENT_MODULES:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    return missing


def _clean_env(base: Path) -> dict[str, str]:
    """This process's environment without Spark's variables, temporary files under ``base``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    tmp = base / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env.update(
        TMPDIR=str(tmp),
        PYTHONPATH=os.pathsep.join(p for p in (str(_SRC), env.get("PYTHONPATH", "")) if p),
    )
    return env


@dataclass
class ConnectServer:
    """A running Spark Connect server: where to reach it, where it logs, and its process."""

    url: str
    """``sc://127.0.0.1:PORT``, what a client passes as ``--remote``."""
    port: int
    base: Path
    """The server's working directory; everything it and its clients leave behind is under it."""
    log_path: Path
    process: subprocess.Popen[bytes]
    startup_s: float = 0.0
    """Seconds from the start of the (last) JVM until the first query answered."""

    def logs(self, lines: int = _TAIL_LINES) -> str:
        """The tail of the server's log, for a failure message."""
        return f"----- {self.log_path.name} (last {lines} lines) -----\n{tail(self.log_path, lines)}"

    def sessions(self) -> set[str]:
        """The ids of the client sessions the server's log mentions so far."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return set()
        return set(_SESSION_ID.findall(text))

    def client_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """An environment for a client process of this server (plus ``extra``)."""
        env = _clean_env(self.base)
        env.update(extra or {})
        return env


def _server_env(base: Path) -> dict[str, str]:
    env = _clean_env(base)
    local, cache = base / "local", base / "cache"
    local.mkdir(parents=True, exist_ok=True)
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_DIRS=str(local),
        PYSPARK_PYTHON=sys.executable,
        XDG_CACHE_HOME=str(cache),  # numba caches the clients' flowbus zip there, a directory per zip
        JAVA_TOOL_OPTIONS=f"{env.get('JAVA_TOOL_OPTIONS', '')} {JVM_OPTIONS}".strip(),
    )
    return env


def server_command(port: int, *, master: str = "local[2]", memory: str = "1g") -> list[str]:
    """The ``spark-submit`` command line of a Connect server on 127.0.0.1:``port``."""
    conf = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        # Python workers connect back to the JVM within this time (slow on a loaded two-core machine)
        "spark.python.authenticate.socketTimeout": "120s",
    }
    return [
        str(spark_home() / "bin" / "spark-submit"),
        "--class", SERVER_CLASS,
        "--name", "flowbus-connect-tests",
        "--master", master,
        "--driver-memory", memory,
        *(arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")),
        "spark-internal",
    ]  # fmt: skip


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _probe(server: ConnectServer, timeout: float) -> str:
    """Run one query through the server from a subprocess: ``""`` if it answered 3, else what went wrong.

    Gives up when ``timeout`` runs out or the server exits (a client of a port that is not the
    server's would wait for ever).
    """
    script = server.base / "probe.py"
    script.write_text(_PROBE)
    with subprocess.Popen(
        [sys.executable, str(script), server.url],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=server.client_env(),
        cwd=server.base,
        start_new_session=True,
    ) as probe:
        deadline = time.monotonic() + timeout
        while True:
            try:
                stdout, stderr = probe.communicate(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if server.process.poll() is not None or time.monotonic() > deadline:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(probe.pid, signal.SIGKILL)
                    probe.communicate()
                    return "the probe client got no answer"
    if probe.returncode == 0 and stdout.strip() == "3":
        return ""
    return f"the probe client exited with {probe.returncode}: {stdout.strip()!r}\n{stderr[-3000:]}"


def _wait_ready(server: ConnectServer, deadline: float) -> bool:
    """Wait until ``server`` answers a query (True) or its process exits (False); raise on time-out."""
    proc, last = server.process, "the gRPC port never accepted a connection"
    while True:
        if proc.poll() is not None:
            return False
        if _port_open(server.port):
            last = _probe(server, deadline - time.monotonic())
            if not last:
                return True
            if proc.poll() is not None:
                return False
            time.sleep(1.0)  # not ready to answer yet: do not start a client every moment
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Spark Connect server did not answer in time ({last})\n{server.logs()}")
        time.sleep(0.25)


@contextlib.contextmanager
def connect_server(base_dir: Path, timeout: float = 90.0) -> Iterator[ConnectServer]:
    """A Spark Connect server (``local[2]``) on 127.0.0.1, files under ``base_dir``; stopped on exit.

    ``timeout`` is the time one start may take, until the first query has answered.
    """
    base_dir.mkdir(parents=True, exist_ok=True)
    env = _server_env(base_dir)
    server: ConnectServer | None = None
    try:
        for attempt in range(1, _BIND_ATTEMPTS + 1):
            port = free_port()
            log_path = base_dir / f"connect-server-{attempt}.log"
            t0 = time.monotonic()
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    server_command(port),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=base_dir,
                    start_new_session=True,
                )
            server = ConnectServer(f"sc://127.0.0.1:{port}", port, base_dir, log_path, proc)
            if _wait_ready(server, t0 + timeout):
                server.startup_s = time.monotonic() - t0
                break
            text = log_path.read_text(errors="replace")
            lost_port = "BindException" in text or "Address already in use" in text
            if not lost_port or attempt == _BIND_ATTEMPTS:
                raise RuntimeError(
                    f"the Spark Connect server exited with status {proc.returncode}\n{server.logs()}"
                )
            stop_process(proc)  # another process took the port between free_port() and the bind: again
        assert server is not None
        yield server
    finally:
        if server is not None:
            stop_process(server.process)


def run_flowbus(
    server: ConnectServer,
    *args: str,
    timeout: float = 180.0,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m flowbus ARGS`` as a client of ``server`` (the caller passes ``--remote server.url``)."""
    return run_python_flowbus(
        list(args), env=server.client_env(env), timeout=timeout, cwd=cwd, logs=server.logs
    )
