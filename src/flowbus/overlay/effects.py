"""Effects: what a sans-IO protocol core asks its driver to do.

How it works: a protocol core (a Pastry node, an IRBR router, ...) is a plain
object with ``on_message(src, msg, now) -> list[Effect]`` and
``on_timer(key, now) -> list[Effect]``. It never touches a socket, a clock or a
global random source: it returns effects, and a driver -- the discrete-event
simulator (:mod:`flowbus.sim`) or the asyncio runtime of the broker network --
carries them out. Node ids are ints; messages are frozen dataclasses.

* :class:`Send` -- send ``msg`` to node ``dst`` (the transport may delay, lose
  or drop it if ``dst`` has failed).
* :class:`Deliver` -- hand ``event`` to the local subscriber ``sub`` (what the
  metrics count as a delivery).
* :class:`SetTimer` -- call ``on_timer(key, ...)`` after ``delay`` time units
  (setting a key again replaces the earlier timer).
* :class:`CancelTimer` -- forget the timer ``key``.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from flowbus.errors import ProtocolError

__all__ = ["CancelTimer", "Deliver", "Effect", "Send", "SetTimer"]


@dataclass(frozen=True, slots=True)
class Send:
    dst: int
    msg: Any

    def __post_init__(self) -> None:
        if type(self.dst) is not int:
            raise ProtocolError(f"Send: a node id is an int, got {self.dst!r}")


@dataclass(frozen=True, slots=True)
class Deliver:
    sub: Hashable
    event: Any


@dataclass(frozen=True, slots=True)
class SetTimer:
    delay: float
    key: Hashable

    def __post_init__(self) -> None:
        if not self.delay >= 0:
            raise ProtocolError(f"SetTimer {self.key!r}: the delay must be >= 0, got {self.delay!r}")


@dataclass(frozen=True, slots=True)
class CancelTimer:
    key: Hashable


Effect = Send | Deliver | SetTimer | CancelTimer
