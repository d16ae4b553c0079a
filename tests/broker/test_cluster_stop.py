"""``Cluster.stop``: a broker that does not stop on SIGTERM within ``STOP_WAIT`` is killed, so
none outlives ``flowbus cluster up``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flowbus.broker import cluster
from flowbus.broker.cluster import Cluster

pytestmark = pytest.mark.broker

OBEDIENT = "import time; print('up', flush=True); time.sleep(60)"
STUBBORN = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + OBEDIENT


def test_stop_kills_a_broker_that_ignores_sigterm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "STOP_WAIT", 0.5)
    said: list[str] = []
    c = Cluster(port=1, max_brokers=2, say=said.append)
    for code in (OBEDIENT, STUBBORN):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"  # (its handler is set)
        c.procs.append(proc)
    try:
        c.stop()
        obedient, stubborn = c.procs
        assert obedient.returncode == -15  # SIGTERM
        assert stubborn.returncode == -9  # SIGKILL, after STOP_WAIT
        assert said == [f"broker pid {stubborn.pid} did not stop in 0.5 s: killed"]
    finally:
        for proc in c.procs:
            proc.kill()
            proc.wait()
