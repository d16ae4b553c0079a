"""A real Spark standalone cluster for tests: one master and one worker on 127.0.0.1, started from pyspark.

How it works:

* :func:`standalone` starts ``spark-class org.apache.spark.deploy.master.Master``
  and ``...deploy.worker.Worker`` from pyspark's bundled ``bin/`` (``SPARK_HOME``
  is the pyspark package directory), each in its own session (process group):
  ``spark-class`` runs a launcher JVM and then ``exec``s the daemon's JVM, and
  the worker forks executor JVMs and their Python workers, all in that group.
* Every daemon binds port 0 (the kernel's pick, never a port chosen ahead, which
  another process of the parallel suite may take in between): the master's RPC and
  web UI ports are read off its log (``Successfully started service 'sparkMaster'
  on port N``) before the worker starts; its REST server (a fixed port, 6066) is
  off. ``SPARK_LOCAL_IP``
  pins every bind address to 127.0.0.1, the worker gets a fresh ``--work-dir``
  (executor logs land there), and each daemon logs to a file under ``log_dir``.
* Startup waits (60 s by default) until the master's ``/json/`` lists a worker
  whose state is ``ALIVE``; if a daemon exits or time runs out, the error quotes
  the tail of both logs. On the way out (normal or not) each process group gets
  SIGTERM, then SIGKILL after a grace period, so no JVM outlives the test.
* Every JVM (daemons, executors, the driver) runs with :data:`JVM_OPTIONS`
  (C1 only, serial GC): on a small shared machine that roughly halves the
  start-up of each, and it changes nothing a test observes.
* :func:`run_flowbus` runs ``python -m flowbus ...`` as a driver subprocess with
  :meth:`StandaloneCluster.driver_env`: ``PYSPARK_PYTHON`` is this interpreter
  (the executors run on this machine), and ``SPARK_LOCAL_IP`` with
  ``SPARK_LOCAL_HOSTNAME`` make the driver bind to, and advertise, 127.0.0.1
  (by default it would advertise the machine's canonical name).
* Whatever the applications leave behind stays under ``base``: ``TMPDIR`` (the
  driver's zip of flowbus for the executors), ``SPARK_LOCAL_DIRS``, and the
  executors' ``XDG_CACHE_HOME``: they import flowbus from that zip, which numba
  caches under ``~/.cache/numba`` (``NUMBA_CACHE_DIR`` does not apply to zips)
  in a new directory per application, as the zip's path differs each time.

A fixture is a few lines on top of :func:`standalone` (see ``test_cluster.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "JVM_OPTIONS",
    "StandaloneCluster",
    "free_port",
    "master_state",
    "run_flowbus",
    "spark_home",
    "standalone",
    "stop_process",
]

_SRC = Path(__file__).resolve().parents[2] / "src"
_TAIL_LINES = 40

JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Passed to every JVM of the cluster and its drivers through ``JAVA_TOOL_OPTIONS`` (faster start-up)."""


def spark_home() -> Path:
    """The pyspark package directory: it holds ``bin/spark-class`` and the jars."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def master_state(web_url: str, *, timeout: float = 2.0) -> dict[str, Any]:
    """The master web UI's JSON: ``url``, ``workers`` (with ``state``), ``activeapps``, ``completedapps``."""
    with urllib.request.urlopen(f"{web_url}/json/", timeout=timeout) as response:
        doc: dict[str, Any] = json.load(response)
        return doc


def tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def stop_process(proc: subprocess.Popen[bytes], *, grace: float = 10.0) -> None:
    """Terminate ``proc``'s whole process group (it was started with ``start_new_session=True``)."""
    pgid = proc.pid  # a session leader's process group id is its pid
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            if not _group_alive(pgid):
                proc.wait()
                return
            time.sleep(0.1)
    proc.wait(timeout=5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal still counts as alive
        return True
    return True


@dataclass
class StandaloneCluster:
    """A running master and worker: where to reach them, where they log, and their processes."""

    master_url: str
    """``spark://127.0.0.1:PORT``, what a driver passes as ``--master``."""
    base: Path
    """The directory holding everything below (and the temporary files of the drivers and executors)."""
    web_url: str
    """The master's web UI, ``http://127.0.0.1:PORT`` (its ``/json/`` describes the cluster)."""
    work_dir: Path
    """The worker's ``--work-dir``: ``app-*/<executor>/stderr`` are the executors' logs."""
    log_dir: Path
    """``master.log`` and ``worker.log``."""
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def state(self) -> dict[str, Any]:
        """The master's view of the cluster now (see :func:`master_state`)."""
        return master_state(self.web_url)

    def alive_workers(self) -> list[dict[str, Any]]:
        return [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]

    def completed_apps(self) -> list[dict[str, Any]]:
        """The applications that have ended, each with ``id``, ``name``, ``state`` (``FINISHED`` if well)."""
        apps: list[dict[str, Any]] = self.state().get("completedapps", [])
        return apps

    def apps_completed_since(self, before: set[str], *, timeout: float = 20.0) -> list[dict[str, Any]]:
        """The applications completed and not in ``before`` (ids), once none is running any more.

        The master learns that a driver has stopped a moment after its process exits: this polls.
        """
        deadline = time.monotonic() + timeout
        while True:
            doc = self.state()
            new = [app for app in doc.get("completedapps", []) if app["id"] not in before]
            if (new and not doc.get("activeapps")) or time.monotonic() > deadline:
                return new
            time.sleep(0.25)

    def executor_logs(self, app_id: str = "app-*") -> list[Path]:
        """The ``stderr`` of each executor the worker has launched for ``app_id`` (a glob: all by default)."""
        return sorted(self.work_dir.glob(f"{app_id}/*/stderr"))

    def logs(self) -> str:
        """The tail of each daemon's log, for a failure message."""
        return "\n".join(
            f"----- {name}.log (last {_TAIL_LINES} lines) -----\n{tail(self.log_dir / f'{name}.log')}"
            for name in self.processes
        )

    def driver_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """An environment for a driver process on this machine against this cluster (plus ``extra``)."""
        env = _base_env(self.base)
        env.update(
            SPARK_LOCAL_HOSTNAME="127.0.0.1",  # spark.driver.host; else the canonical name of 127.0.0.1
            PYSPARK_DRIVER_PYTHON=sys.executable,
            PYTHONPATH=os.pathsep.join(p for p in (str(_SRC), env.get("PYTHONPATH", "")) if p),
        )
        env.update(extra or {})
        return env


def _base_env(base: Path) -> dict[str, str]:
    """What the daemons, their executors and the drivers share."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    tmp, local = base / "tmp", base / "local"
    for directory in (tmp, local):
        directory.mkdir(parents=True, exist_ok=True)
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_DIRS=str(local),
        PYSPARK_PYTHON=sys.executable,
        TMPDIR=str(tmp),
        JAVA_TOOL_OPTIONS=f"{env.get('JAVA_TOOL_OPTIONS', '')} {JVM_OPTIONS}".strip(),
    )
    return env


def _daemon_env(base: Path, work_dir: Path) -> dict[str, str]:
    env = _base_env(base)
    env.update(
        SPARK_WORKER_DIR=str(work_dir),
        SPARK_DAEMON_MEMORY="256m",  # the master and the worker JVMs themselves; executors are apart
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",  # else it binds 6066, shared by every master
        XDG_CACHE_HOME=str(base / "cache"),  # the executors' numba cache (see above)
    )
    return env


def _start(name: str, args: Sequence[str], env: dict[str, str], log_dir: Path) -> subprocess.Popen[bytes]:
    with open(log_dir / f"{name}.log", "wb") as log:
        return subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=log_dir,
            start_new_session=True,
        )


def _bound_ports(cluster: StandaloneCluster, name: str, services: Sequence[str], timeout: float) -> list[int]:
    """The ports the daemon ``name`` bound for ``services``, as its log reports them."""
    patterns = [re.compile(rf"Successfully started service '{re.escape(s)}' on port (\d+)") for s in services]
    deadline = time.monotonic() + timeout
    while True:
        text = (cluster.log_dir / f"{name}.log").read_text(errors="replace")
        found = [m.group(1) for m in (p.search(text) for p in patterns) if m]
        if len(found) == len(patterns):
            return [int(port) for port in found]
        proc = cluster.processes[name]
        if proc.poll() is not None:
            raise RuntimeError(f"the Spark {name} exited with status {proc.returncode}\n{cluster.logs()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Spark {name} bound no {services} in {timeout:.0f} s\n{cluster.logs()}")
        time.sleep(0.1)


def _wait_alive(cluster: StandaloneCluster, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "the master's web UI never answered"
    while True:
        for name, proc in cluster.processes.items():
            if proc.poll() is not None:
                raise RuntimeError(f"the Spark {name} exited with status {proc.returncode}\n{cluster.logs()}")
        try:
            doc = cluster.state()
        except (OSError, ValueError) as exc:  # not listening yet (URLError is an OSError), or half a reply
            last = f"the master's web UI: {exc}"
        else:
            if doc.get("url") != cluster.master_url:
                raise RuntimeError(
                    f"the master listens on {doc.get('url')}, not {cluster.master_url}\n{cluster.logs()}"
                )
            workers = doc.get("workers", [])
            if any(w.get("state") == "ALIVE" for w in workers):
                return
            last = f"workers: {[(w.get('id'), w.get('state')) for w in workers]}"
        if time.monotonic() > deadline:
            raise RuntimeError(f"no ALIVE worker after {timeout:.0f} s ({last})\n{cluster.logs()}")
        time.sleep(0.25)


@contextlib.contextmanager
def standalone(
    base: Path, *, cores: int = 1, memory: str = "1g", timeout: float = 60.0
) -> Iterator[StandaloneCluster]:
    """A master and one worker (``cores``, ``memory``) on 127.0.0.1, files under ``base``; stopped on exit."""
    log_dir, work_dir = base / "logs", base / "work"
    log_dir.mkdir(parents=True, exist_ok=True)
    work_dir.mkdir(parents=True, exist_ok=True)
    cluster = StandaloneCluster(master_url="", base=base, web_url="", work_dir=work_dir, log_dir=log_dir)
    env = _daemon_env(base, work_dir)
    try:
        cluster.processes["master"] = _start(
            "master",
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
             "--webui-port", "0"],
            env,
            log_dir,
        )  # fmt: skip
        port, web_port = _bound_ports(cluster, "master", ("sparkMaster", "MasterUI"), timeout)
        cluster.master_url, cluster.web_url = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web_port}"
        cluster.processes["worker"] = _start(
            "worker",
            ["org.apache.spark.deploy.worker.Worker", cluster.master_url, "--host", "127.0.0.1",
             "--webui-port", "0", "--cores", str(cores), "--memory", memory, "--work-dir", str(work_dir)],
            env,
            log_dir,
        )  # fmt: skip
        _wait_alive(cluster, timeout)
        yield cluster
    finally:
        for proc in reversed(cluster.processes.values()):  # the worker first: it stops its executors
            stop_process(proc)


def run_flowbus(
    cluster: StandaloneCluster,
    *args: str,
    timeout: float = 180.0,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m flowbus ARGS`` as a driver on this machine, with ``env`` added to its environment."""
    return run_python_flowbus(
        list(args), env=cluster.driver_env(env), timeout=timeout, cwd=cwd, logs=cluster.logs
    )


def run_python_flowbus(
    args: list[str], *, env: dict[str, str], timeout: float, cwd: Path | None, logs: Any
) -> subprocess.CompletedProcess[str]:
    """``python -m flowbus ARGS`` in a process group of its own, killed (JVM included) when it ends.

    Still running after ``timeout`` seconds: an AssertionError quoting its output and ``logs()``.
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "flowbus", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(
            f"flowbus {' '.join(args)} did not finish in {timeout:.0f} s\n"
            f"stdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-5000:]}\n{logs()}"
        ) from None
    finally:
        with contextlib.suppress(ProcessLookupError):  # a JVM it left behind
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
