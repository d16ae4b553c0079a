"""A campaign's brokers: real ``flowbus broker start`` processes in their hosts, and their faults.

How it works: broker ``i`` runs in host ``b<i>`` (:mod:`flowbus.chaos.hosts`) with its own
store (``--data``, a file system of its own in namespaces) and console (``--http``, polled
for what it serves); its log (standard error) is appended to ``logs/b<i>.log`` across
restarts. The first broker starts the ring, the others join through those already up.
:class:`Brokers` starts, kills (``SIGKILL``), pauses (``SIGSTOP``/``SIGCONT``), stops
(``SIGTERM``) and restarts them (on the same address and data), and reads their consoles'
``/api/state`` (:meth:`Brokers.poll`), all by process id.

Behind proxies (``proxied``, the runs whose faults strike links: :mod:`flowbus.chaos.proxy`),
a broker listens on ``127.0.0.1:7001`` in its host and advertises (``--advertise``) its
host's ``IP:7000``, where its proxy listens: peers and clients reach it only through the
proxy (the proxies are the campaign's to start first, and to stop).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from flowbus.broker.process import READY
from flowbus.chaos.hosts import Hosts
from flowbus.chaos.proxy import BEHIND
from flowbus.errors import ExperimentError
from flowbus.net.trace import TRACE_ENV

__all__ = ["Brokers"]

READY_WITHIN = 60.0  # seconds a starting broker has to print its ready line


class Brokers:
    """The broker processes of a campaign run (see the module note)."""

    def __init__(
        self,
        hosts: Hosts,
        names: Sequence[str],
        *,
        root: Path,
        config: Path,
        overlay: str,
        proxied: bool = False,
        trace: bool = False,
    ) -> None:
        self.hosts = hosts
        self.proxied = proxied
        self.trace = trace  # (each broker's messages in traces/NAME.jsonl: flowbus.net.trace)
        self.names = list(names)
        self.root = root
        self.config = config
        self.overlay = overlay
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.consoles: dict[str, str] = {}
        self.paused: set[str] = set()
        (root / "logs").mkdir(parents=True, exist_ok=True)

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def address(self, name: str) -> str:
        return self.hosts.address(name)

    @property
    def up(self) -> list[str]:
        """The brokers whose process runs (paused ones included)."""
        return [n for n in self.names if n in self.procs and self.procs[n].poll() is None]

    def start_all(self) -> None:
        for name in self.names:
            self.start(name)

    def start(self, name: str) -> None:
        """Start ``name`` (again: on its address and data), joining through the brokers up."""
        if name in self.up:
            raise ExperimentError(f"broker {name} runs already")
        if name not in self.names:
            self.names.append(name)
        others = [self.address(n) for n in self.up if n not in self.paused]
        argv = [sys.executable, "-m", "flowbus", "broker", "start"]
        if self.proxied:
            argv += ["--listen", BEHIND, "--advertise", self.address(name)]
        else:
            argv += ["--listen", self.address(name)]
        for a in others[:3]:
            argv += ["--join", a]
        argv += ["--data", str(self.hosts.data_dir(name)), "--config", str(self.config)]
        argv += ["--overlay", self.overlay, "--http", f"{self.hosts.ip(name)}:0"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.trace:
            (self.root / "traces").mkdir(exist_ok=True)
            env[TRACE_ENV] = str(self.root / "traces" / f"{name}.jsonl")
        with self.log(name).open("a") as log:
            log.write(f"--- {time.time():.3f} start {' '.join(argv[1:])}\n")
            log.flush()
            proc = self.hosts.launch(name, argv, stdout=subprocess.PIPE, stderr=log, env=env)
        self.procs[name] = proc
        self.consoles[name] = self._ready(name, proc)

    def _ready(self, name: str, proc: subprocess.Popen[str]) -> str:
        """Its console's URL, from its ready line (the process is killed if none comes)."""
        assert proc.stdout is not None
        pool = ThreadPoolExecutor(1)
        try:
            text = pool.submit(proc.stdout.readline).result(READY_WITHIN)
        except TimeoutError:
            proc.kill()
            raise ExperimentError(f"broker {name}: no ready line in {READY_WITHIN:.0f} s") from None
        except BaseException:  # (Ctrl-C, SIGTERM: the reader waits on a broker that will not answer)
            proc.kill()
            raise
        finally:
            pool.shutdown(wait=False)  # (its reader ends with the broker's output)
        if not text.startswith(READY):
            raise ExperimentError(f"broker {name} did not start (exit {proc.poll()}): see {self.log(name)}")
        words = text.split()
        return words[words.index("console") + 1].rstrip("/")

    def pid(self, name: str) -> int | None:
        """The process id of ``name``, if it runs."""
        return self.procs[name].pid if name in self.up else None

    def signal(self, name: str, sig: signal.Signals) -> None:
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
        if sig is signal.SIGSTOP:
            self.paused.add(name)
        elif sig is signal.SIGCONT:
            self.paused.discard(name)

    def kill(self, name: str) -> None:
        """``kill -9``: gone at once, nothing flushed."""
        self.signal(name, signal.SIGKILL)
        self._reap(name, 10.0)

    def stop(self, name: str) -> None:
        """``SIGTERM``: the broker closes (killed if it does not within 10 s)."""
        self.signal(name, signal.SIGCONT)
        self.signal(name, signal.SIGTERM)
        if not self._reap(name, 10.0):
            self.kill(name)

    def _reap(self, name: str, timeout: float) -> bool:
        proc = self.procs.get(name)
        if proc is None:
            return True
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        if proc.stdout is not None:
            proc.stdout.close()
        self.paused.discard(name)
        return True

    def close(self) -> None:
        """Every broker stopped, by its process id."""
        for name in list(self.procs):
            if self.procs[name].poll() is None:
                self.signal(name, signal.SIGCONT)
                self.signal(name, signal.SIGKILL)
            self._reap(name, 10.0)

    def poll(self, name: str, timeout: float = 0.5) -> dict[str, Any] | None:
        """The broker's ``/api/state`` (None: no answer in ``timeout``, paused or gone)."""
        url = self.consoles.get(name)
        if url is None or name not in self.up or name in self.paused:
            return None
        try:
            with urllib.request.urlopen(f"{url}/api/state", timeout=timeout) as r:
                state: dict[str, Any] = json.loads(r.read())
                return state
        except (OSError, ValueError):
            return None

    def ring_order(self) -> list[str]:
        """The brokers up, in the order of their ring ids (adjacent ones are ring neighbours)."""
        ids = {}
        for name in self.up:
            state = self.poll(name, timeout=2.0)
            if state is not None and state["broker"].get("node_id") is not None:
                ids[name] = state["broker"]["node_id"]
        return sorted(ids, key=ids.__getitem__)
