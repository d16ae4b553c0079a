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
  are the ones the new way must not overtake (:meth:`Moves.moved`). A broker that joins
  between us and a live neighbour is one too, from the moment the tree changes: the
  records waiting on the old neighbour (before the joiner's subscriptions come; a paused
  old neighbour declined them on waking, and the publisher's later events, through the
  joiner, were delivered first: simulator schedule 207 of ``starve``, 225 out of order).
  What the old neighbour declines or loses then goes the new way at once
  (:meth:`RingBroker._former <flowbus.routing.ring_broker.RingBroker._former>`), which ends
  the wait.
* **Held.** Until they are confirmed (every subscriber beyond has them), the events for
  ``n`` are kept for it as for a neighbour that declined them
  (:meth:`~flowbus.routing.ring_repair.Repair.hold`): one queue per neighbour, in each
  publisher's order with what the repair keeps for it for other reasons (two queues
  released one after the other broke the order they were each built to keep).
* **Released** once the last one is confirmed (or kept again: declined, lost, its broker
  buried), or after ``MOVE_ROUNDS`` heartbeat rounds (for a joiner, rounds with the old
  neighbour heard, up to ``JOIN_CAP``; an old way cut off for longer: order is given up
  before availability is), by the repair's next flush.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from flowbus.overlay.chordal_ring import GUARD
from flowbus.routing.ring_custody import Custodian, Key

__all__ = ["JOIN_CAP", "MOVE_ROUNDS", "Moves"]

MOVE_ROUNDS = 2
"""Heartbeat rounds the events for a new way wait at most for the old way's confirmations."""

JOIN_CAP = 3 * GUARD
"""For a broker joined between us and a live neighbour, the rounds in which that neighbour
was silent (paused, cut off) do not count towards ``MOVE_ROUNDS``: it will decline what it
holds once back, or be found dead (then what it held is kept for its side, in order). Counted,
the new way opened while a paused neighbour still held the old events, which it declined on
waking, behind the later ones (simulator schedules 6 and 64 of ``starve``: 78 and 54 out of
order). The wait ends after ``JOIN_CAP`` rounds in all (availability before order)."""


@dataclass(slots=True)
class _Wait:
    before: set[Key]  # the records sent the old way, unconfirmed when the route moved
    old: frozenset[int]  # the old directions
    join: bool  # a broker joined between us and the old direction (see JOIN_CAP)
    rounds: int = 0  # heartbeat rounds counted (a joiner's: with the old direction heard)
    age: int = 0  # heartbeat rounds in all


class Moves:
    """The new directions whose events wait for the old directions' confirmations."""

    def __init__(self, custodian: Custodian) -> None:
        self.custodian = custodian
        self.waits: dict[int, _Wait] = {}
        self.moved_count = 0  # moves that held anything (for tests and status)
        self.overdue = 0  # released by the rounds' limit, not by the confirmations

    def __bool__(self) -> bool:
        return bool(self.waits)

    def __contains__(self, new: object) -> bool:
        """Whether the events for ``new`` wait."""
        return new in self.waits

    def moved(self, new: int, old: Collection[int], *, join: bool = False) -> None:
        """An origin that comes from ``old`` here was announced by the neighbour ``new`` (or,
        ``join``, ``new`` joined between us and ``old``)."""
        old_dirs = frozenset(old)
        before = {key for key, rec in self.custodian.records.items() if rec.waiting & old_dirs}
        if not before:
            return
        wait = self.waits.get(new)
        if wait is None:
            self.waits[new] = _Wait(before, old_dirs, join)
            self.moved_count += 1
        else:
            wait.before |= before
            wait.old |= old_dirs
            wait.join = wait.join or join

    def due(self) -> bool:
        """End the waits that are over (checked after each step while any waits); whether any
        ended (what was kept for them goes at the repair's flush)."""
        records = self.custodian.records
        ended = False
        for new, wait in list(self.waits.items()):
            wait.before = {k for k in wait.before if k in records and records[k].waiting & wait.old}
            if wait.before and wait.rounds < MOVE_ROUNDS and wait.age < JOIN_CAP:
                continue
            if wait.before:
                self.overdue += 1
            del self.waits[new]
            ended = True
        return ended

    def round(self, quiet: Callable[[int], bool]) -> None:
        """A heartbeat round (``quiet``: whether nothing came from an address lately)."""
        for wait in self.waits.values():
            wait.age += 1
            if not (wait.join and any(quiet(a) for a in wait.old)):
                wait.rounds += 1
