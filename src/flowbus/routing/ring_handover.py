"""What a broker hands over when it comes back as a new member: its subscriptions' queues on
disk, to the broker that took them over (the wire messages, and what the ring state says of
them; the broker's side is :mod:`flowbus.broker.handover`).

How it works:

* **A queue on disk is ring state's business too.** A subscription's events spilled to a
  broker's SQLite queue are settled (its publishers acknowledged) and live on that disk
  only; if the broker is found dead, its subscriptions are taken over from their backups,
  and the taker must not serve a subscription whose older events lie on the dead broker's
  disk as if there were none: it would deliver newer events first. So when a subscription's
  queue first goes to disk, its broker sets the ring state entry ``(DISK, sub, home
  address)`` (backed up with the rest; the spill is settled only once the backups have it)
  and deletes it when the queue on disk is empty again (:func:`disk_key`).
* **The taker waits for it.** A broker that took over a subscription with such an entry of
  another home (:func:`awaited`) queues the subscription's events on its own disk and
  delivers none until that home's backlog has come.
* **The backlog comes with the restart.** A broker found dead comes back as a new member
  (paused, cut off, or restarted on its data). Once it has joined, it asks the ring where
  each subscription of its store is served now (``WhereIs``, passed round the ring to the
  right; each broker that serves some answers ``HeldHere`` at once, and the question comes
  back to the asker with those nobody serves): the taker, or the taker's taker if that one
  died too. It sends each one's queue there (``Backlog``: the subscription, what serving it
  takes, and its queue's rows in order, in parts), each part acknowledged (``BacklogAck``;
  ``taken=False`` from a broker that does not serve it, or no more: asked again). The taker
  puts the rows before what it queued meanwhile and clears the entry on the last part; the
  sender forgets the subscription once every part is acknowledged.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flowbus import wire
from flowbus.overlay.ring_messages import Peer
from flowbus.routing.ring_keys import DiskKey, disk_key, record

__all__ = ["MAX_HOPS", "Backlog", "BacklogAck", "HeldHere", "WhereIs", "awaited", "disk_key"]

MAX_HOPS = 256
"""How far a ``WhereIs`` goes round the ring at most (a ring changing under it)."""


def awaited(keys: Iterable[Hashable], me: int) -> int | None:
    """The address of another broker whose disk holds older events of a subscription (taken
    over from it: wait for its backlog), if the ring state says so: ``keys``, its entries
    ``(DISK, sub, broker)`` (the state's index gives them)."""
    others = sorted(key.home for key in map(record, keys) if isinstance(key, DiskKey) and key.home != me)
    return others[0] if others else None


@wire.message("ringbroker.backlog")
@dataclass(frozen=True, slots=True)
class Backlog:
    """Part ``part`` of subscription ``sub``'s queue on the disk of ``previous`` (a member the
    sender was): ``rows`` are ``(event id, payload)`` in queue order; ``meta`` what serving
    the subscription takes; ``last``: no more parts."""

    previous: Peer
    sub: str
    meta: Mapping[str, Any]
    part: int
    rows: tuple[tuple[str, bytes], ...]
    last: bool


@wire.message("ringbroker.backlog_ack")
@dataclass(frozen=True, slots=True)
class BacklogAck:
    """The receiver has part ``part`` of ``sub``'s backlog on its disk (``taken``), or does
    not serve ``sub`` and took nothing."""

    sub: str
    part: int
    taken: bool = True


@wire.message("ringbroker.where_is")
@dataclass(frozen=True, slots=True)
class WhereIs:
    """Which brokers serve these subscriptions? Asked by the broker at ``asker`` and passed
    round the ring to the right, ``hops`` so far; what is left comes back to the asker
    (nobody on the way serves it)."""

    asker: int
    subs: tuple[str, ...]
    hops: int


@wire.message("ringbroker.held_here")
@dataclass(frozen=True, slots=True)
class HeldHere:
    """The sender serves these subscriptions (an answer to :class:`WhereIs`)."""

    subs: tuple[str, ...]
