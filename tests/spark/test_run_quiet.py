"""``flowbus run`` on Spark (what ``make demo`` runs) shows flowbus's own output only, on a
terminal or not: the JVM's warnings and its Python workers' chatter go to the run's
``_spark.log`` -- the warm-up's too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

STOCKS = Path(__file__).parents[2] / "examples" / "stocks" / "flow.yaml"
NOISE = ("WARN", "log4j", "TransformWithStateInPandas", "Setting default log level")


def test_a_spark_run_into_a_pipe_prints_no_jvm_noise(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowbus",
            "run",
            str(STOCKS),
            "--events",
            "300",
            "--out",
            str(out),
            "--fresh",
            "--warm-up",
            "100",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "output compressed" in done.stdout + done.stderr  # (flowbus's own summary)
    assert any(line.split()[1:4] == ["warm_up_events", "│", "100"] for line in done.stdout.splitlines())
    noisy = [line for line in (done.stdout + done.stderr).splitlines() if any(n in line for n in NOISE)]
    assert noisy == []
    log = (out / "_spark.log").read_text()
    assert "TransformWithStateInPandas" in log or "WARN" in log  # (where the noise went)
