"""Metrics: what a simulation run counts, ready to dump as JSON.

How it works: the simulator calls a handful of tiny methods on a
:class:`Metrics` object -- ``sent`` for every ``Send`` a core returns,
``received`` when a message reaches a live core, ``lost`` when a transport layer
or a crash drops one, ``deliver`` for every ``Deliver`` effect. Counters keyed by
message class are kept as classes while running (cheap) and turned into class
names by :meth:`Metrics.to_dict`. A ``Deliver`` whose ``(sub, event)`` pair was
already seen counts as a duplicate; a delivered event with an int ``hops``
attribute adds to the hop histogram (a core may also call :meth:`record_hops`).
With ``log=True`` every delivery is kept as a :class:`DeliveryRecord`.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

__all__ = ["DeliveryRecord", "Metrics"]


@dataclass(frozen=True, slots=True)
class DeliveryRecord:
    """One ``Deliver`` effect: when, at which node, to whom, what."""

    time: float
    node: int
    sub: Hashable
    event: Any

    def to_json(self) -> list[Any]:
        """A JSON-able form (``sub`` and ``event`` as their ``repr``)."""
        return [self.time, self.node, repr(self.sub), repr(self.event)]


class Metrics:
    """Counters of one run: sends by type, losses by reason, deliveries, duplicates, hops."""

    __slots__ = (
        "_hops",
        "_lost",
        "_seen",
        "_sent",
        "deliveries",
        "duplicates",
        "events",
        "failure_notices",
        "injected",
        "log",
        "received",
        "timers_fired",
    )

    def __init__(self, *, log: bool = False) -> None:
        self._sent: dict[type, int] = {}
        self._lost: dict[str, int] = {}
        self._hops: dict[int, int] = {}
        self._seen: set[tuple[Hashable, Any]] = set()
        self.deliveries = 0
        self.duplicates = 0
        self.received = 0
        self.injected = 0
        self.timers_fired = 0
        self.failure_notices = 0
        self.events = 0
        self.log: list[DeliveryRecord] | None = [] if log else None

    def sent(self, msg: Any) -> None:
        c = msg.__class__
        self._sent[c] = self._sent.get(c, 0) + 1

    def lost(self, reason: str) -> None:
        self._lost[reason] = self._lost.get(reason, 0) + 1

    def record_hops(self, hops: int) -> None:
        self._hops[hops] = self._hops.get(hops, 0) + 1

    def deliver(self, node: int, sub: Hashable, event: Any, now: float) -> bool:
        """Count one delivery; return ``False`` if ``(sub, event)`` was delivered before."""
        self.deliveries += 1
        if self.log is not None:
            self.log.append(DeliveryRecord(now, node, sub, event))
        hops = getattr(event, "hops", None)
        if hops.__class__ is int:
            self.record_hops(hops)
        key: tuple[Hashable, Any] = (sub, event)
        try:
            seen = key in self._seen
        except TypeError:  # an unhashable event: compare by repr
            key = (sub, repr(event))
            seen = key in self._seen
        if seen:
            self.duplicates += 1
            return False
        self._seen.add(key)
        return True

    @property
    def total_sent(self) -> int:
        return sum(self._sent.values())

    @property
    def total_lost(self) -> int:
        return sum(self._lost.values())

    def sent_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for cls, n in self._sent.items():
            out[cls.__name__] = out.get(cls.__name__, 0) + n
        return dict(sorted(out.items()))

    def lost_by_reason(self) -> dict[str, int]:
        return dict(sorted(self._lost.items()))

    def hops(self) -> dict[int, int]:
        return dict(sorted(self._hops.items()))

    def to_dict(self) -> dict[str, Any]:
        """Every counter, JSON-able, with sorted keys (hop counts as string keys)."""
        return {
            "events": self.events,
            "sent": self.total_sent,
            "sent_by_type": self.sent_by_type(),
            "received": self.received,
            "injected": self.injected,
            "lost": self.total_lost,
            "lost_by_reason": self.lost_by_reason(),
            "deliveries": self.deliveries,
            "duplicates": self.duplicates,
            "hops": {str(h): n for h, n in self.hops().items()},
            "timers_fired": self.timers_fired,
            "failure_notices": self.failure_notices,
        }
