"""A broker's message trace, for finding out afterwards why an event went late or astray.

How it works: with ``FLOWBUS_TRACE=FILE`` in its environment (``flowbus chaos run --trace``
sets it for each broker of a run), a broker's runtime writes one JSON line to ``FILE`` for
each run of messages it takes from a peer and for each it sends to one:
``[t, "in"|"out", peer, [[type, event ids...], ...]]``, ``t`` the wall clock, ``peer`` the
other broker's address (``host:port``), each message its type's name and the ids of the
events it carries (a publish's, a hand-over's, ...). Nothing of the events' fields is
written. Lines are buffered and written at least every second, and when the broker closes.
A message trace of a fault campaign's run is a few megabytes a broker.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any

from flowbus.meta import EVENT_ID

__all__ = ["TRACE_ENV", "Trace"]

TRACE_ENV = "FLOWBUS_TRACE"
"""The environment variable that names a broker's trace file."""

FLUSH_EVERY = 1.0


class Trace:
    """The message trace written to ``out`` (see the module note); ``name`` gives a peer's
    address as text."""

    def __init__(self, out: IO[str], name: Callable[[int], str]) -> None:
        self._out = out
        self._name = name
        self._lines: list[str] = []
        self._flushed = time.monotonic()

    @classmethod
    def from_env(cls, name: Callable[[int], str]) -> Trace | None:
        """The trace ``FLOWBUS_TRACE`` names (appended to), or None if it names none."""
        path = os.environ.get(TRACE_ENV)
        if not path:
            return None
        return cls(open(path, "a", encoding="utf-8"), name)

    def __call__(self, way: str, peer: int, msgs: Iterable[Any]) -> None:
        line = [round(time.time(), 4), way, self._name(peer), [_summary(m) for m in msgs]]
        self._lines.append(json.dumps(line, default=str))
        if time.monotonic() - self._flushed >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        if self._lines:
            self._out.write("\n".join(self._lines) + "\n")
            self._out.flush()
            self._lines = []
        self._flushed = time.monotonic()

    def close(self) -> None:
        self.flush()
        self._out.close()


def _summary(msg: Any) -> list[Any]:
    """``[type, event ids...]`` of one message (the ids of the events it carries, if any)."""
    out: list[Any] = [type(msg).__name__]
    for attr in ("event", "events"):
        found = getattr(msg, attr, None)
        if isinstance(found, Mapping):
            out.append(found.get(EVENT_ID))
        elif isinstance(found, (list, tuple)):
            out.extend(e.get(EVENT_ID) for e in found if isinstance(e, Mapping))
    return out
