"""A broker coming back as a new ring member: the member it was is buried, its queues on disk
go to the broker that took its subscriptions over, then it joins (the ring's side of this is
:mod:`flowbus.routing.ring_handover` and :meth:`RingNode.announce
<flowbus.overlay.chordal_ring.RingNode.announce>`).

How it works: a broker remembers in its store the ring member it is (its id and its ring
neighbours' addresses, :meth:`Store.membership <flowbus.broker.store.Store.membership>`).
Started on a store that says it was a member (a restart after a crash or a stop), or found
dead by the ring while it was alive (paused, cut off: it steps down and starts again in
the same process), it does not join at once: :class:`Rejoin`

1. announces the restart to the member's old neighbours and its join candidates
   (``Restarted``); they bury the member (a proof: its process is gone) and answer ``Dead``
   with the broker that took its subscriptions over;
2. sends that broker each subscription of its store with its queue's rows, in parts of
   ``PART`` rows, each part acknowledged before the next goes (``Backlog``,
   ``BacklogAck``), and forgets the subscription once its last part is acknowledged; the
   taker puts the rows before what it queued meanwhile (it delivered none of it: it waited
   for them, see the ring state's ``("disk", ...)`` entries);
3. forgets the member it was, and joins as a new one.

If nobody names a taker (nobody knew the member, or nobody held its backup: a broker alone,
a whole ring restarted), its subscriptions stay and it serves them again once joined, as a
broker restarted on its data always did. A part not acknowledged within ``ACK_WITHIN``
seconds is sent again, ``TRIES`` times; then the subscription stays too (and the log says
so): the taker may be gone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from flowbus.broker.store import Store, SubscriptionRow
from flowbus.core import Effect
from flowbus.errors import FlowbusError
from flowbus.overlay.ring_messages import Dead, Peer
from flowbus.routing.ring_broker import RingBroker
from flowbus.routing.ring_handover import Backlog, BacklogAck

__all__ = ["ACK_WITHIN", "PART", "TRIES", "Rejoin"]

PART = 500
"""Rows of a queue per ``Backlog`` message."""

ACK_WITHIN = 5.0
"""Seconds a part of a backlog waits for its acknowledgement before it is sent again."""

TRIES = 3

log = logging.getLogger("flowbus.broker")


class Rejoin:
    """A broker's way back into the ring as a new member (see the module note). ``previous``
    is the member it was; ``candidates`` the brokers to join through; ``announce_to`` where
    the restart is told (the old neighbours and the candidates)."""

    def __init__(
        self,
        *,
        core: RingBroker,
        store: Store,
        apply: Callable[[Sequence[Effect]], None],
        previous: Peer,
        candidates: list[int],
        announce_to: list[int],
        address: str,
    ) -> None:
        self.core = core
        self.store = store
        self.apply = apply
        self.previous = previous
        self.candidates = candidates
        self.announce_to = announce_to
        self.address = address
        self.handed = 0  # subscriptions handed over
        self.kept = 0  # subscriptions kept (nobody took them over, or no answer)
        self._acks: dict[tuple[str, int], asyncio.Future[None]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        log.info(
            "broker %s was ring member %d: announcing its restart before joining anew",
            self.address,
            self.previous.id,
        )
        self.apply(self.core.ring.announce(self.previous, self.announce_to))

    def buried(self, msg: Dead) -> None:
        """The ring's answer: the member is buried, ``msg.taker`` took it over (or nobody)."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._run(msg.taker))

    def acked(self, msg: BacklogAck) -> None:
        fut = self._acks.pop((msg.sub, msg.part), None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def _run(self, taker: Peer | None) -> None:
        if taker is not None:
            for row in self.store.subscriptions():
                if await self._hand(taker, row.sub_id, _meta(row)):
                    self.handed += 1
                else:
                    self.kept += 1
        else:
            self.kept = len(self.store.subscriptions())
        log.info(
            "broker %s: member %d buried (taken over by %s): %d subscriptions handed over, %d kept; joining",
            self.address,
            self.previous.id,
            "nobody" if taker is None else taker.id,
            self.handed,
            self.kept,
        )
        try:
            self.store.forget_membership()
        except FlowbusError as e:  # (a full store: it is announced again at the next start)
            log.warning("broker %s: %s", self.address, e)
        self.apply(self.core.join(self.candidates) if self.candidates else self.core.start())

    async def _hand(self, taker: Peer, sub_id: str, meta: dict[str, object]) -> bool:
        """``sub_id``'s queue to ``taker``, part by part; forgotten here once all is
        acknowledged. Whether it was."""
        after, part = 0, 0
        while True:
            rows = self.store.pending(sub_id, limit=PART, after=after)
            last = len(rows) < PART
            payloads = tuple((r.event_id, r.payload) for r in rows)
            msg = Backlog(self.previous, sub_id, meta, part, payloads, last)
            if not await self._send(taker, msg):
                log.warning(
                    "broker %s: broker %d did not take subscription %r's queue: it stays here",
                    self.address,
                    taker.id,
                    sub_id,
                )
                return False
            if last:
                break
            after, part = rows[-1].seq, part + 1
        self.store.remove_subscription(sub_id)
        return True

    async def _send(self, taker: Peer, msg: Backlog) -> bool:
        for _ in range(TRIES):
            fut = asyncio.get_running_loop().create_future()
            self._acks[(msg.sub, msg.part)] = fut
            self.apply(self.core.hand_over(taker.addr, msg))
            try:
                await asyncio.wait_for(fut, ACK_WITHIN)
                return True
            except TimeoutError:
                continue
        return False

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()


def _meta(row: SubscriptionRow) -> dict[str, object]:
    """What serving a subscription of the store takes (the ``meta`` it is backed up with)."""
    return {
        "client": row.client,
        "space": row.space,
        "filter": row.filter,
        "durable": row.durable,
        "collapse": row.collapse,
    }
