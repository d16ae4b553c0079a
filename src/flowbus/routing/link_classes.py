"""Link classes known ring-wide, and refusals that travel back upstream (secure spaces).

How it works (Chordal Reliability Rings, section 3.5: secure events over secure links; the
rule itself is :mod:`flowbus.broker.links`):

* **Announcements.** Each broker announces the class of its content-tree links (its tree
  neighbours, each secure or not): :class:`LinkClasses`, numbered by its sender's driver
  with an ever-growing ``version`` (a wall-clock stamp survives a restart). A broker keeps
  the newest announcement of each broker (:class:`LinkBook`) and floods a new one on to its
  other tree neighbours; a broker that gets a new tree neighbour sends it every
  announcement it knows, so a broker that joins learns the whole tree. From these the
  publisher's broker knows every link an event would take to each broker it must reach,
  and refuses a secure space's publish whose route has a plain link before sending it.
* **Refusals upstream** (:class:`Refused`). When a view was stale (a link turned plain, an
  announcement not in yet), the broker that would have to send a secure event over a plain
  link does not send it: for custody, the receiver is done with the event, refused. A
  custody record with a refusal in it does not confirm upstream when it is done: it
  answers :class:`Refused` with the reason, and so on hop by hop back to the publisher's
  broker, which reports the publish in a ``PublishRefused`` effect (its ledger answers the
  client ``Nack`` with the reason) instead of ``Settled``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from flowbus import wire
from flowbus.core import Effect, Send

__all__ = ["LinkBook", "LinkClasses", "Refused"]


@wire.message("ringbroker.link_classes")
@dataclass(frozen=True, slots=True)
class LinkClasses:
    """Broker ``broker``'s content-tree links: ``(neighbour, secure)`` pairs, as of ``version``."""

    broker: int
    version: int
    links: tuple[tuple[int, bool], ...]


@wire.message("ringbroker.refused")
@dataclass(frozen=True, slots=True)
class Refused:
    """The sender is done with these events the receiver sent it, without carrying them all
    the way: ``(event id, reason)`` pairs (custody released, the publish refused)."""

    items: tuple[tuple[Any, str], ...]


class Announcement(Protocol):
    """A broker's news of its links (:class:`LinkClasses`, or their latency:
    :class:`~flowbus.routing.express.LinkLatency`), the newest version wins."""

    @property
    def broker(self) -> int: ...
    @property
    def version(self) -> int: ...


A = TypeVar("A", bound=Announcement)


class LinkBook(Generic[A]):
    """The newest announcement (:class:`LinkClasses`...) of each broker (see the module note)."""

    def __init__(self) -> None:
        self.known: dict[int, A] = {}

    def take(self, msg: A) -> bool:
        """Keep ``msg`` if it is newer than what we know of its broker; whether it was."""
        old = self.known.get(msg.broker)
        if old is not None and old.version >= msg.version:
            return False
        self.known[msg.broker] = msg
        return True

    def flood(self, msg: A, neighbours: Iterable[int], src: int | None) -> list[Effect]:
        """``msg`` on to the tree neighbours, but the one it came from."""
        return [Send(n, msg) for n in sorted(neighbours) if n != src]

    def welcome(self, added: Iterable[int]) -> list[Effect]:
        """Every announcement we know, to new tree neighbours."""
        known = [self.known[b] for b in sorted(self.known)]
        return [Send(n, msg) for n in sorted(added) for msg in known]
