"""``flowbus sim`` on Spark shows flowbus's own output only: the JVM's warnings go to the
user's cache (``$XDG_CACHE_HOME/flowbus/spark/APP.log``), not to the terminal or the pipe.
(Outside tests/spark: a process of its own, so it need not wait for the Spark tests' worker.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

NOISE = ("WARN", "log4j", "Setting default log level", "NativeCodeLoader")


def test_a_simulation_on_spark_prints_no_jvm_noise(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "flowbus", "sim", "irbr-forwards", "--nodes", "40", "--seeds", "1",
         "--events", "10", "--out", str(tmp_path / "out"), "--json"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"experiment"' in done.stdout  # (flowbus's own JSON document)
    noisy = [line for line in (done.stdout + done.stderr).splitlines() if any(n in line for n in NOISE)]
    assert noisy == []
    log = tmp_path / "cache" / "flowbus" / "spark" / "flowbus-irbr-forwards.log"
    assert "WARN" in log.read_text() or "log4j" in log.read_text()  # (where the noise went)
