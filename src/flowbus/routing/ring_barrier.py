"""A takeover's barrier: the subscriptions a broker takes over from a dead one get each
publisher's events in order (sans-IO, a part of :class:`~flowbus.routing.ring_broker.RingBroker`).

Why: what the dead broker had not confirmed is kept by its tree neighbours
(:mod:`~flowbus.routing.ring_repair`) and comes to the taker as it can: over the ring link
across the tree's cut, or round the tree, after the ring's repair. The taker announces the
subscriptions it took over at once, and a publisher's later events come to it the short
way. Delivered as they came, they overtook its earlier, kept ones (a sim run: 71 to 217 out
of order at the subscription taken over, with the publisher at the taker).

How it works:

* **Asked.** A broker that takes subscriptions over from a dead one asks the live brokers it
  links to (the dead one's former neighbours among them) :class:`Drain`: "tell me when you
  keep nothing for it". Until every one has answered, its deliveries to those subscriptions
  wait (:meth:`Barriers.hold`: counted in custody, so the publishes wait too), the kept
  ones themselves (handed over, or kept here) with the others: the kept events of one broker
  come over the ring link while another's, older, come round the tree; let through, they
  overtook them (a traced isolation: 1,023 out of order at the taker).
* **Answered.** A broker answers :class:`Drained` once it has found the dead one dead (or
  never knew it), no longer keeps it in its tree (while it does, what is routed its way is
  kept: until the taker's announcement has come, events on their way may still come), keeps
  no event for it and has no custody record waiting on it: what it kept has been sent on,
  to the broker beyond the dead one, the taker as a rule, on the link the answer then takes
  (in order behind them). A broker that never knew it answers at once. Kept events the
  taker gets wait with the others, and are released with them, in order (were the answer
  to wait for their confirmation, it would wait for itself).
* **Released.** The last answer releases the waiting deliveries, in each publisher's order.
  A broker that was asked and is found dead since answers nothing: it is no longer waited
  for from the next heartbeat round (what it kept died with it; what it had not confirmed
  is kept by its own neighbours, asked by its own taker). A barrier not released within
  ``DRAIN_ROUNDS`` heartbeat rounds (a broker that was asked is cut off) is released then:
  order is given up before availability is.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from flowbus import wire
from flowbus.core import Deliver, DeliverAll, Effect, Send
from flowbus.meta import EVENT_ID
from flowbus.routing.ring_custody import publish_order

__all__ = ["DRAIN_ROUNDS", "Barriers", "Drain", "Drained"]

DRAIN_ROUNDS = 5
"""Heartbeat rounds a takeover's barrier waits at most for the answers (see the note)."""


@wire.message("ringbroker.drain")
@dataclass(frozen=True, slots=True)
class Drain:
    """The sender took subscriptions over from the dead broker at ``dead``: answer
    :class:`Drained` once you keep nothing for it (see the note)."""

    dead: int


@wire.message("ringbroker.drained")
@dataclass(frozen=True, slots=True)
class Drained:
    """The sender keeps nothing for the dead broker at ``dead`` any more: what it kept has
    reached the subscribers."""

    dead: int


@dataclass(slots=True)
class _Barrier:
    subs: set[Hashable]
    waiting: set[int]
    held: list[tuple[Any, tuple[Hashable, ...]]] = field(default_factory=list)  # (event, subs)
    rounds: int = 0


class Barriers:
    """The barriers of one broker's takeovers, and the questions it was asked (see the note)."""

    def __init__(self) -> None:
        self._open: dict[int, _Barrier] = {}  # dead addr -> its barrier here
        self._subs: dict[Hashable, int] = {}  # a sub behind a barrier -> its dead broker
        self.asked: dict[int, set[int]] = {}  # dead addr -> brokers waiting for our Drained
        self.released = 0  # barriers released by their answers
        self.overdue = 0  # barriers released after DRAIN_ROUNDS

    def __bool__(self) -> bool:
        return bool(self._subs)

    def askers(self) -> set[int]:
        """The brokers whose barriers wait for our answer: what they get from us is held by
        them, unconfirmed, until it comes (see :class:`~flowbus.routing.ring_repair.Repair`)."""
        return set().union(*self.asked.values()) if self.asked else set()

    def open(self, dead: int, subs: Collection[Hashable], ask: Iterable[int]) -> list[Effect]:
        """``subs`` were taken over from ``dead``: their deliveries wait for the answers of
        the brokers ``ask``."""
        waiting = set(ask)
        if not subs or not waiting:
            return []
        barrier = self._open.setdefault(dead, _Barrier(set(), set()))
        barrier.subs.update(subs)
        barrier.waiting.update(waiting)
        self._subs.update(dict.fromkeys(subs, dead))
        return [Send(a, Drain(dead)) for a in sorted(waiting)]

    def hold(self, subs: tuple[Hashable, ...], event: Any) -> tuple[Hashable, ...]:
        """Of the deliveries of ``event`` to ``subs``, those that wait are kept here; the
        others. The kept events themselves wait too (handed over, or kept here): let through,
        one handed over by a broker that kept it overtook older ones that came round the tree
        and waited."""
        behind = self._subs
        if not any(s in behind for s in subs):
            return subs
        for dead in sorted({behind[s] for s in subs if s in behind}):
            barrier = self._open[dead]
            barrier.held.append((event, tuple(s for s in subs if behind.get(s) == dead)))
        return tuple(s for s in subs if s not in behind)

    def drained(self, src: int, dead: int) -> list[Effect]:
        """``src`` answered for ``dead``: the deliveries it released, if it was the last."""
        barrier = self._open.get(dead)
        if barrier is None:
            return []
        barrier.waiting.discard(src)
        if barrier.waiting:
            return []
        self.released += 1
        return self._release(dead)

    def round(self, dead: set[int] | frozenset[int] = frozenset()) -> list[Effect]:
        """A heartbeat round, the brokers at ``dead`` found dead: the deliveries of barriers
        that waited only for those (they answer nothing: two neighbours of a broker dying at
        once, each one's taker asked the other, and both waited the ``DRAIN_ROUNDS``, their
        publishers' acknowledgements with them), or waited too long, released."""
        out: list[Effect] = []
        for d, barrier in sorted(self._open.items()):
            barrier.rounds += 1
            if dead and barrier.waiting & dead:
                barrier.waiting -= dead
                if not barrier.waiting:
                    self.released += 1
                    out.extend(self._release(d))
                    continue
            if barrier.rounds >= DRAIN_ROUNDS:
                self.overdue += 1
                out.extend(self._release(d))
        return out

    def forget(self, sub: Hashable) -> None:
        """``sub`` is no longer served here: none of its deliveries wait."""
        self._subs.pop(sub, None)

    def _release(self, dead: int) -> list[Effect]:
        barrier = self._open.pop(dead)
        for s in barrier.subs:
            if self._subs.get(s) == dead:
                del self._subs[s]
        held = sorted(barrier.held, key=lambda h: publish_order(h[0][EVENT_ID]))
        return [DeliverAll(subs, event) if len(subs) > 1 else Deliver(subs[0], event) for event, subs in held]
