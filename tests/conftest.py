"""Suite-wide settings: under CI, hypothesis runs derandomized so a run is reproducible; the Spark
tests share one worker when the suite runs in parallel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

SPARK_TESTS = Path(__file__).parent / "spark"

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under `-n` (pytest-xdist, `--dist loadgroup`), every Spark test runs in one worker: one JVM."""
    for item in items:
        if item.path.is_relative_to(SPARK_TESTS):
            item.add_marker(pytest.mark.xdist_group("spark"))
