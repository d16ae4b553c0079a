"""Shared by the command line's tests: the stock example, and the real ``flowbus`` app driven
in process."""

from __future__ import annotations

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
