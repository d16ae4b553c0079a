"""A local ring of broker processes that grows when a broker is over its limit (what
``flowbus cluster up`` runs).

How it works (Madhu Kumar, Bellur, Govindan, "Chordal Reliability Rings", section 3.4, the
third step of a loaded broker: "request for another broker to be set up, insert it into
the ring by setting up new links"):

* :meth:`Cluster.start` starts the first brokers on 127.0.0.1, one process each, on
  ``port``, ``port + 1``...: the first makes the ring, the others join it through the
  first.
* A broker over its limit (``load_limit`` / ``rate_limit`` in its config) whose ring
  neighbours have no room prints ``flowbus broker overloaded HOST:PORT load X`` on its
  standard output (:data:`~flowbus.broker.process.OVERLOADED`). One thread per broker
  reads those lines into a queue.
* :meth:`Cluster.serve` answers them: while there are fewer than ``max_brokers``, it
  starts a broker on the next port that joins the ring *through the broker that asked*
  (the join puts it next to that broker, on the side with more id space), then ignores
  requests for ``pause`` seconds, time for the ring to take the newcomer in and for the
  heartbeats to carry its load (0) to its neighbours, which then stop asking.
* With ``tls`` (a ``flowbus certs init`` directory), broker N serves and dials its peers in
  mutual TLS with the certificate ``broker-N``.
* With ``http`` (``cluster up --http HOST:PORT``) the first broker serves the web console
  (:mod:`flowbus.broker.console`); its URL is :attr:`Cluster.console_url`.
* With ``stomp`` (``cluster up --stomp PORT``) broker *i* serves STOMP clients on
  127.0.0.1 port ``stomp + i - 1`` (:mod:`flowbus.broker.stomp`), a broker started later
  too; :attr:`Cluster.stomps` lists the addresses.
* :meth:`Cluster.stop` terminates every broker (SIGTERM: each closes its store) and waits
  ``STOP_WAIT`` seconds in all for them; one still running then is killed, so no broker
  outlives ``cluster up``.
"""

from __future__ import annotations

import contextlib
import queue
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from flowbus.broker.process import OVERLOADED, console_of, start_process, stomp_of, wait_ready
from flowbus.net.tls import broker_name

__all__ = ["Cluster"]


STOP_WAIT = 10.0
"""Seconds the brokers have, all together, to stop on SIGTERM before they are killed."""


class Cluster:
    """Broker processes on 127.0.0.1 from ``port`` on, up to ``max_brokers`` (see the module note)."""

    def __init__(
        self,
        *,
        port: int,
        max_brokers: int,
        data: Path | None = None,
        config: Path | None = None,
        pause: float = 5.0,
        say: Callable[[str], None] = lambda text: None,
        tls: Path | None = None,
        http: str | None = None,
        stomp: int | None = None,
    ) -> None:
        self.port = port
        self.max_brokers = max_brokers
        self.data = data
        self.config = config
        self.pause = pause
        self.say = say
        self.tls = tls
        self.http = http  # HOST:PORT of the first broker's web console (None: none)
        self.console_url: str | None = None
        self.stomp = stomp  # the first broker's STOMP port, the others' follow (None: none)
        self.procs: list[subprocess.Popen[str]] = []
        self._asks: queue.Queue[str] = queue.Queue()  # addresses of brokers asking for one more

    def start(self, brokers: int) -> list[str]:
        """The first ``brokers`` brokers, each ready (a member of the ring); their addresses."""
        for i in range(brokers):
            self.procs.append(self._process(join=[f"127.0.0.1:{self.port}"] if i else []))
        addresses = [self._ready(proc) for proc in self.procs]
        self.console_url = console_of(self.procs[0]) if self.procs else None
        return addresses

    @property
    def stomps(self) -> list[str]:
        """The brokers' STOMP addresses, in order (none without ``stomp``)."""
        return [a for a in map(stomp_of, self.procs) if a is not None]

    def serve(self) -> None:
        """Start a broker for each request, up to ``max_brokers``; until interrupted."""
        calm_until = 0.0
        while True:
            try:
                asker = self._asks.get(timeout=1.0)
            except queue.Empty:
                continue
            if len(self.procs) >= self.max_brokers or time.monotonic() < calm_until:
                continue
            proc = self._process(join=[asker])
            self.procs.append(proc)
            address = self._ready(proc)
            self.say(f"broker {address} (pid {proc.pid}) joined: {asker} was over its limit")
            calm_until = time.monotonic() + self.pause

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        deadline = time.monotonic() + STOP_WAIT
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.poll() is None:
                self.say(f"broker pid {proc.pid} did not stop in {STOP_WAIT:g} s: killed")
                proc.kill()
                proc.wait()

    def _process(self, *, join: list[str]) -> subprocess.Popen[str]:
        i = len(self.procs)
        data = self.data / f"broker-{i + 1}" if self.data else None
        return start_process(
            f"127.0.0.1:{self.port + i}",
            join=join,
            data=data,
            config=self.config,
            tls=self.tls,
            tls_name=broker_name(i + 1),
            http=self.http if i == 0 else None,
            stomp=f"127.0.0.1:{self.stomp + i}" if self.stomp is not None else None,
        )

    def _ready(self, proc: subprocess.Popen[str]) -> str:
        """Wait for ``proc``'s ready line, then read its requests in a thread of its own."""
        address = wait_ready(proc)
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        return address

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(OVERLOADED):
                self._asks.put(line.split()[3])
