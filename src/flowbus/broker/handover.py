"""A broker coming back as a new ring member: the member it was is buried, it joins, and its
queues on disk go to the brokers that serve their subscriptions now (the ring's side of this
is :mod:`flowbus.routing.ring_handover` and :meth:`RingNode.announce
<flowbus.overlay.chordal_ring.RingNode.announce>`).

How it works: a broker remembers in its store the ring member it is (its id and its ring
neighbours' addresses, :meth:`Store.membership <flowbus.broker.store.Store.membership>`).
Started on a store that says it was a member (a restart after a crash or a stop), or found
dead by the ring while it was alive (paused, cut off: it steps down and starts again in
the same process), it comes back through :class:`Rejoin`:

1. It announces the restart to the member's old neighbours and its join candidates
   (``Restarted``); they bury the member (a proof: its process is gone) and answer
   ``Dead``. It forgets the member it was and joins as a new one. The subscriptions of its
   store are *pending*: not served here (a client re-attaching is told "not here" and goes
   on to the broker that serves them).
2. Once joined, it asks the ring where each pending subscription is served now
   (``WhereIs`` round the ring): the broker that took it over, or the one that took that
   one over if it died too (a taker named in ``Dead`` may be gone by now, and a broker
   that did not know the taker names none: neither can be trusted).
3. To each, part by part, the subscription's queue (``Backlog``, ``PART`` rows, each part
   acknowledged before the next goes, within ``ACK_WITHIN`` seconds, ``TRIES`` times); the
   subscription is forgotten here once its last part is acknowledged. The taker puts the
   rows before what it queued meanwhile (it delivered none of it: it waited for them, see
   the ring state's ``("disk", ...)`` entries).
4. What is not handed over yet is asked about again, every 0.5 s at first, then at most
   every ``AGAIN_MAX`` seconds. A subscription that nobody has served for ``nobody_after``
   seconds (the question went round the whole ring each time) is served here again, as a
   broker restarted on its data always did: nobody took it over (a broker alone, a whole
   ring restarted, a backup lost).

A durable subscription asked for afresh (a client's ``Subscribe`` without ``resume``: a
new subscription, or one its client found served nowhere for its ``resume_timeout``) is
opened here only if the ring does not serve it elsewhere (:class:`Finder`, the same
``WhereIs`` round): a second copy here would take the new events while the first kept
what it had queued (acknowledged events, lost to its client; the fault campaign's overload
mix: a taker cut off from the ring on and off for 40 s, its subscriptions made afresh at
another broker, 3,128 deliveries out of order). A subscription served elsewhere, or held
on this broker's disk for a hand-over, is answered "not here"; one the ring cannot vouch
for within ``WHERE_WITHIN`` too: the client goes on looking.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from flowbus.broker.store import Store, SubscriptionRow
from flowbus.core import Effect
from flowbus.errors import FlowbusError
from flowbus.overlay.ring_messages import Dead, Peer
from flowbus.routing.ring_broker import RingBroker
from flowbus.routing.ring_handover import Backlog, BacklogAck, HeldHere, WhereIs

__all__ = ["ACK_WITHIN", "AGAIN_MAX", "PART", "TRIES", "WHERE_WITHIN", "Finder", "Rejoin"]

PART = 500
"""Rows of a queue per ``Backlog`` message."""

ACK_WITHIN = 5.0
"""Seconds a part of a backlog waits for its acknowledgement before it is sent again."""

TRIES = 3
"""Sends of a part before its subscription is asked about again."""

WHERE_WITHIN = 5.0
"""Seconds a ``WhereIs`` may take round the ring (else nothing is concluded from it)."""

AGAIN_MAX = 5.0
"""Seconds at most between two rounds of questions about what is not handed over yet."""

log = logging.getLogger("flowbus.broker")


class Rejoin:
    """A broker's way back into the ring as a new member (see the module note). ``previous``
    is the member it was; ``candidates`` the brokers to join through; ``announce_to`` where
    the restart is told (the old neighbours and the candidates); ``restore`` serves a
    subscription of the store here (nobody else does); ``nobody_after`` the seconds a
    subscription must be found served nowhere before that."""

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
        restore: Callable[[str], None],
        nobody_after: float,
    ) -> None:
        self.core = core
        self.store = store
        self.apply = apply
        self.previous = previous
        self.candidates = candidates
        self.announce_to = announce_to
        self.address = address
        self.restore = restore
        self.nobody_after = nobody_after
        self.pending: set[str] = {row.sub_id for row in store.subscriptions()}  # (not served here)
        self._rows: dict[str, SubscriptionRow] = {row.sub_id: row for row in store.subscriptions()}
        self.handed = 0  # subscriptions handed over
        self.kept = 0  # subscriptions served here again (nobody else serves them)
        self.done = asyncio.Event()  # (every subscription handed over or kept)
        self._acks: dict[tuple[str, int], asyncio.Future[bool]] = {}
        self._answers: dict[str, int] = {}  # subscription -> the broker that said it serves it
        self._walk: asyncio.Future[tuple[str, ...]] | None = None  # (the question's way round)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        log.info(
            "broker %s was ring member %d: announcing its restart before joining anew",
            self.address,
            self.previous.id,
        )
        self.apply(self.core.ring.announce(self.previous, self.announce_to))

    def buried(self, msg: Dead) -> None:
        """The ring's answer: the member is buried (or nobody answered): join, then hand over."""
        if self._task is not None:
            return
        try:
            self.store.forget_membership()
        except FlowbusError as e:  # (a full store: it is announced again at the next start)
            log.warning("broker %s: %s", self.address, e)
        self.apply(self.core.join(self.candidates))
        self._task = asyncio.ensure_future(self._run())

    # -- the ring's answers (the broker's ``("ring", "handover")`` notices)

    def acked(self, msg: BacklogAck) -> None:
        fut = self._acks.pop((msg.sub, msg.part), None)
        if fut is not None and not fut.done():
            fut.set_result(msg.taken)

    def held(self, src: int, msg: HeldHere) -> None:
        for sub in msg.subs:
            self._answers[sub] = src

    def walked(self, msg: WhereIs) -> None:
        """The question came back round the ring: nobody on the way serves ``msg.subs``."""
        if self._walk is not None and not self._walk.done():
            self._walk.set_result(msg.subs)

    # -- the hand-over

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.core.joined:
            await asyncio.sleep(0.05)
        nowhere: dict[str, float] = {}  # subscription -> since when it is served nowhere
        pause = 0.5
        while self.pending:
            holders, unserved = await self._where(sorted(self.pending))
            now = loop.time()
            for sub, holder in sorted(holders.items()):
                nowhere.pop(sub, None)
                if sub in self.pending and await self._hand(holder, sub):
                    self.pending.discard(sub)
                    self.handed += 1
            for sub in sorted(unserved & self.pending):
                if now - nowhere.setdefault(sub, now) >= self.nobody_after or self.core.ring.right is None:
                    log.info("broker %s: subscription %r is served nowhere else: here", self.address, sub)
                    self.pending.discard(sub)
                    self.kept += 1
                    self.restore(sub)
            if self.pending:
                await asyncio.sleep(pause)
                pause = min(2 * pause, AGAIN_MAX)
        log.info(
            "broker %s: member %d's subscriptions: %d handed over, %d served here",
            self.address,
            self.previous.id,
            self.handed,
            self.kept,
        )
        self.done.set()

    async def _where(self, subs: list[str]) -> tuple[dict[str, int], set[str]]:
        """Who serves ``subs``, and which nobody serves (empty unless the question came back
        round the ring)."""
        if self.core.ring.right is None:  # (alone in the ring: nobody else serves anything)
            return {}, set(subs)
        self._answers = {}
        self._walk = asyncio.get_running_loop().create_future()
        self.apply(self.core.ask_where(subs))
        unserved: set[str] = set()
        with contextlib.suppress(TimeoutError):
            unserved = set(await asyncio.wait_for(self._walk, WHERE_WITHIN))
        self._walk = None
        holders = {s: a for s, a in self._answers.items() if s in subs}
        return holders, unserved - set(holders)

    async def _hand(self, holder: int, sub_id: str) -> bool:
        """``sub_id``'s queue to ``holder``, part by part; forgotten here once all is
        acknowledged. Whether it was."""
        meta = _meta(self._rows[sub_id])
        after, part = 0, 0
        while True:
            rows = self.store.pending(sub_id, limit=PART, after=after)
            last = len(rows) < PART
            payloads = tuple((r.event_id, r.payload) for r in rows)
            msg = Backlog(self.previous, sub_id, meta, part, payloads, last)
            if not await self._send(holder, msg):
                return False  # (asked about again: the holder died, or gave it up)
            if last:
                break
            after, part = rows[-1].seq, part + 1
        self.store.remove_subscription(sub_id)
        return True

    async def _send(self, holder: int, msg: Backlog) -> bool:
        for _ in range(TRIES):
            fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._acks[(msg.sub, msg.part)] = fut
            self.apply(self.core.hand_over(holder, msg))
            try:
                return await asyncio.wait_for(fut, ACK_WITHIN)
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


class Finder:
    """Whether another broker serves a durable subscription, asked round the ring before one
    is opened afresh here (see the module note); ``pending`` gives the subscriptions of this
    broker's disk not handed over yet."""

    def __init__(
        self,
        *,
        core: RingBroker,
        apply: Callable[[Sequence[Effect]], None],
        pending: Callable[[], set[str]],
    ) -> None:
        self.core = core
        self.apply = apply
        self.pending = pending
        self._asked: dict[str, list[asyncio.Future[int | None]]] = {}
        self._to_ask: set[str] = set()  # (asked in this turn of the loop: one question for all)

    async def holder(self, sub_id: str) -> int | None:
        """The broker that serves ``sub_id`` (this one's address if its disk holds it for a
        hand-over); None if the question went round the ring and nobody does. A
        :class:`TimeoutError` if the ring did not say within ``WHERE_WITHIN`` seconds."""
        if sub_id in self.pending():
            return self.core.addr
        if self.core.ring.right is None:  # (alone in the ring: nobody else serves anything)
            return None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int | None] = loop.create_future()
        self._asked.setdefault(sub_id, []).append(fut)
        if not self._to_ask:
            loop.call_soon(self._ask)
        self._to_ask.add(sub_id)
        try:
            return await asyncio.wait_for(fut, WHERE_WITHIN)
        finally:
            waiting = self._asked.get(sub_id, [])
            if fut in waiting:
                waiting.remove(fut)
            if not waiting:
                self._asked.pop(sub_id, None)

    def _ask(self) -> None:
        """One question round the ring for every subscription asked about in a turn (a
        client back at a broker asks for all of its subscriptions at once)."""
        subs, self._to_ask = sorted(self._to_ask), set()
        if subs:
            self.apply(self.core.ask_where(subs))

    def held(self, src: int, msg: HeldHere) -> None:
        self._answer(msg.subs, src)

    def walked(self, msg: WhereIs) -> None:
        """A question came back round the ring: nobody on the way serves ``msg.subs``."""
        self._answer(msg.subs, None)

    def _answer(self, subs: Sequence[str], holder: int | None) -> None:
        for sub in subs:
            for fut in self._asked.pop(sub, []):
                if not fut.done():
                    fut.set_result(holder)
