"""Shared by the command line's tests: the stock example, and the real ``flowbus`` app driven
in process."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from flowbus.cli import app

STOCKS = Path(__file__).resolve().parents[2] / "examples" / "stocks" / "flow.yaml"
SPEC = str(STOCKS)

runner = CliRunner()


def invoke(*args: str) -> Any:
    """``flowbus ARGS...`` in this process (standard output and error apart)."""
    return runner.invoke(app, list(args))


def until_received(
    sub: subprocess.Popen[str], publish: Callable[[], subprocess.CompletedProcess[str]]
) -> str:
    """Run ``publish`` (a ``flowbus pub``) until the ``flowbus sub --count N`` process ``sub``
    has what it waits for and ends (it may not be subscribed yet): what it printed. ``sub``
    is stopped whatever happens."""
    try:
        for _ in range(20):
            done = publish()
            assert done.returncode == 0, done.stderr
            try:
                out, _ = sub.communicate(timeout=1.0)
            except subprocess.TimeoutExpired:
                continue
            assert sub.returncode == 0
            return out
        raise AssertionError("the subscriber never had what was published")
    finally:
        sub.kill()
        sub.wait()
