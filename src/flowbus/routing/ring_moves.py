"""A subscription's route that moves: what goes the new way waits for what went the old way
(sans-IO, a part of :class:`~flowbus.routing.ring_broker.RingBroker`, with custody).

Why: a subscription taken over, or a tree changed by a join or a repair, is learned here from
a new direction while the old one still has it (the tables catch up one message at a time). A
publisher's events sent the old way before the change take the longer path (round the tree,
or handed over across its cut) and the later ones overtook them on the new, shorter one (a
simulator schedule: 12 to 49 events out of order at a subscription taken over after two
brokers restarted).

How it works:

* **A move.** A tree neighbour ``n`` announces an origin (``Subscribe``) that comes from
  other directions here too: the custody records waiting on those directions at that moment
  are the ones the new way must not overtake (:meth:`Moves.moved`).
* **Held.** Until they are confirmed (every subscriber beyond has them), the events sent to
  ``n`` wait here, in order, counted in custody as sent (:meth:`Moves.hold`): their
  publishes wait with them.
* **Released** in order once the last one is confirmed, or after ``MOVE_ROUNDS`` heartbeat
  rounds (an old way cut off: order is given up before availability is; fewer rounds than
  the custody's re-send, which would send them ahead of the queue). A neighbour that died
  or left the tree meanwhile gets them all the same: a failed send keeps them for its side,
  a former neighbour routes them as if they came from the one now on our side.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from flowbus.core import Send
from flowbus.routing.ring_custody import Custodian, Key

__all__ = ["MOVE_ROUNDS", "Moves"]

MOVE_ROUNDS = 2
"""Heartbeat rounds the events for a new way wait at most for the old way's confirmations."""


@dataclass(slots=True)
class _Wait:
    before: set[Key]  # the records sent the old way, unconfirmed when the route moved
    old: frozenset[int]  # the old directions
    queue: list[Send] = field(default_factory=list)
    rounds: int = 0


class Moves:
    """The new directions whose events wait for the old directions' confirmations."""

    def __init__(self, custodian: Custodian) -> None:
        self.custodian = custodian
        self.waits: dict[int, _Wait] = {}
        self.moved_count = 0  # moves that held anything (for tests and status)
        self.overdue = 0  # released by the rounds' limit, not by the confirmations

    def __bool__(self) -> bool:
        return bool(self.waits)

    def moved(self, new: int, old: Collection[int]) -> None:
        """An origin that comes from ``old`` here was announced by the neighbour ``new``."""
        old_dirs = frozenset(old)
        before = {key for key, rec in self.custodian.records.items() if rec.waiting & old_dirs}
        if not before:
            return
        wait = self.waits.get(new)
        if wait is None:
            self.waits[new] = _Wait(before, old_dirs)
            self.moved_count += 1
        else:
            wait.before |= before
            wait.old |= old_dirs

    def hold(self, send: Send) -> bool:
        """Queue ``send`` (an event for a neighbour that waits) and say so; False: it goes."""
        wait = self.waits.get(send.dst)
        if wait is None:
            return False
        wait.queue.append(send)
        return True

    def due(self) -> list[Send]:
        """The queues whose wait is over, in order (checked after each step while any waits)."""
        records = self.custodian.records
        out: list[Send] = []
        for new, wait in list(self.waits.items()):
            wait.before = {k for k in wait.before if k in records and records[k].waiting & wait.old}
            if wait.before and wait.rounds < MOVE_ROUNDS:
                continue
            if wait.before:
                self.overdue += 1
            del self.waits[new]
            out.extend(wait.queue)
        return out

    def round(self) -> None:
        """A heartbeat round."""
        for wait in self.waits.values():
            wait.rounds += 1
