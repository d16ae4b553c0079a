"""Suite-wide settings: under CI, hypothesis runs derandomized so a run is reproducible
(``make check`` runs fewer examples: the ``check`` profile); the Spark tests share one worker
when the suite runs in parallel.

Markers say what a test needs (``pyproject.toml`` lists them; ``make check`` runs ``-m unit``):
``broker`` (processes: brokers, the command line; servers or sockets), ``spark`` (the JVM:
every test under ``tests/spark``), ``browser`` (Chromium), ``peer`` (another broker product:
ActiveMQ), ``slow`` (seconds or more each: the whole suite runs it, ``make check`` does
not). A test marked with none of them is ``unit``, and a unit test that starts a process or
binds or connects a socket fails at once (an audit hook): it is not a unit test, mark it."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

SPARK_TESTS = Path(__file__).parent / "spark"

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("check", max_examples=25)  # (make check, the fast loop: fewer examples)
if os.environ.get("CI"):
    settings.load_profile("ci")


NEEDS = ("broker", "spark", "browser", "peer", "slow")
"""The markers of a test that needs more than the Python process it runs in (or a minute)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/spark is ``spark``; under ``-n`` (pytest-xdist, ``--dist
    loadgroup``) those that use the shared session (the ``spark`` fixture) run in one worker:
    one JVM. The others start their own (``flowbus run``, a standalone cluster, Spark
    Connect) and run in any worker: kept in the group, they made its worker the suite's
    critical path (about 15 of its 17 minutes). A test with no marker of :data:`NEEDS` is
    ``unit``."""
    for item in items:
        if item.path.is_relative_to(SPARK_TESTS):
            item.add_marker(pytest.mark.spark)
            if "spark" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group("spark"))
        if not any(item.get_closest_marker(m) for m in NEEDS):
            item.add_marker(pytest.mark.unit)


_unit_running: list[str] = []
"""The unit test running now, if one is (its node id)."""

_NOT_IN_UNIT = {"subprocess.Popen", "os.fork", "os.posix_spawn", "socket.bind", "socket.connect"}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _unit_running and event in _NOT_IN_UNIT:
        raise RuntimeError(
            f"{_unit_running[-1]}: a unit test may not {event} (mark it broker: tests/conftest.py)"
        )


platform.platform()  # (its first call may run ``uname`` in a process: once here, for every test)
sys.addaudithook(_audit)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    unit = item.get_closest_marker("unit") is not None
    if unit:
        _unit_running.append(item.nodeid)
    try:
        yield
    finally:
        if unit:
            _unit_running.pop()
