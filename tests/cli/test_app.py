"""The ``flowbus`` app itself (:mod:`flowbus.cli`): the version, the demo runs, errors are clean."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer

from flowbus import __version__
from flowbus.cli.common import fail

pytestmark = pytest.mark.broker


def flowbus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowbus", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_version() -> None:
    proc = flowbus("version")
    assert proc.returncode == 0 and proc.stdout.strip() == __version__


def test_demo_matches_trades() -> None:
    proc = flowbus("demo", "--subscriptions", "300", "--trades", "3000")
    assert proc.returncode == 0, proc.stderr
    assert "big NYSE trades" in proc.stdout and "trades/s" in proc.stdout
    assert "3,000 trades matched" in proc.stdout


def test_bad_option_is_a_usage_error() -> None:
    proc = flowbus("bench", "match", "--subscriptions", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_an_error_with_brackets_is_printed_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as exit_:
        fail("schema [issue: str, price: float] and [/bold] stay")
    assert exit_.value.exit_code == 2
    assert "schema [issue: str, price: float] and [/bold] stay" in capsys.readouterr().err
