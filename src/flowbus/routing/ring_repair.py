"""Events sent into a failure, kept for the ring's repair (sans-IO, a part of
:class:`~flowbus.routing.ring_broker.RingBroker`).

How it works:

* **Kept.** An event whose send to a tree neighbour fails (the driver's failure notice), or
  that a dead neighbour had not confirmed (custody, :meth:`Repair.bury`), is kept with the
  side of the ring it was going to (:meth:`Repair.keep`); later events of its publisher
  for that side wait behind it (:meth:`Repair.behind_kept`), so each publisher's order
  holds. Those held behind go only once what was sent again before them to that side is
  *confirmed* (the custody chain: every subscriber beyond has it), not only sent: it may
  take a longer way (across the tree's cut, or routed on by a broker restarted on the dead
  one's address) than they would. The other side does not wait: the subscriptions a
  dead broker's taker serves there get the kept events behind its takeover's barrier
  (:mod:`~flowbus.routing.ring_barrier`), in order. Held for the other side too, until
  what was sent again was confirmed, a publisher's events for its live neighbour waited
  out every barrier and placeholder of the repair beyond, a minute, while a hand-over
  round the ring brought its later ones there first (simulator schedules 236 and 249:
  246 and 221 out of order at one subscription).
* **Resent.** When the ring has a new neighbour on that side, the kept events go there, in
  each publisher's order (:meth:`Repair.resend`); those kept for a dead broker once the
  ring has said who took it over, to the taker too (handed over). That broker is the first one of the part
  of the tree the dead broker led to, so nothing there had the event yet; across the tree's
  cut only the dead broker's own subscriptions are there, so the event goes as
  :class:`HandedOver`.
* **Declined.** A neighbour without its ring lease declines events (see
  :mod:`~flowbus.routing.ring_custody`): they are kept for it as if their send failed, and
  so is all else for it (:meth:`Repair.hold`) while it is :attr:`Repair.paused`.
* **Or to the same broker.** A neighbour whose sends failed but that is not found dead (cut
  off for a while, then back) gets its kept events again at the next heartbeat round
  (:meth:`Repair.retry_live`), in each publisher's order; were they kept for a new
  neighbour only, they would wait for ever once the link came back.
* **Delivered to what was taken over.** When this broker takes the dead one's
  subscriptions over itself (:meth:`Repair.taken_over`), the kept events are delivered to
  them, and a handed-over event is delivered to the subscriptions taken from its dead
  broker (:meth:`Repair.handed_over`).
* **Orphans.** A dead tree neighbour with no replacement (the tree's cut moved onto it):
  what came from it was its own subscriptions, taken over across the cut. Until they come
  back through the tree, events for them are handed over the ring link
  (:meth:`Repair.keep_orphans`, :meth:`Repair.route_orphans`).

So one crash loses no event, as long as its subscriptions were backed up and the failure is
detected (heartbeats or failed sends).
"""

from __future__ import annotations

from collections.abc import Collection, Container, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flowbus import wire
from flowbus.core import Deliver, Effect, Send
from flowbus.filters import Filter
from flowbus.meta import EVENT_ID
from flowbus.overlay.chordal_ring import RingNode
from flowbus.overlay.ring_messages import Peer
from flowbus.routing import cbr
from flowbus.routing.memo import compiled
from flowbus.routing.ring_barrier import Barriers
from flowbus.routing.ring_custody import Custodian, Key, publish_order, relayed

TAKER_ROUNDS = 2
"""Heartbeat rounds what is kept for a dead broker waits at most to learn who took it over
(see :meth:`Repair.resend`)."""

AFTERMATH_ROUNDS = 6
"""Heartbeat rounds after a broker is found dead during which what is kept for another dead
broker on its side goes to its taker too (see :meth:`Repair._others`)."""

FLUSH_MANY = 1000
"""Kept events past which a flush after a ring message waits :data:`FLUSH_EVERY` seconds
after the last one (see :meth:`Repair.resend`)."""

FLUSH_EVERY = 0.2


@wire.message("ringbroker.handed_over")
@dataclass(frozen=True, slots=True)
class HandedOver:
    """An event that a broker could not send to the dead broker ``dead``, handed to the ring
    neighbour that took its place across the tree's cut."""

    event: Mapping[str, Any]
    dead: int


def _own(event: Mapping[str, Any]) -> Mapping[str, Any]:
    """``event`` under its own id (a relayed hand-over kept here goes on, or is delivered,
    as what it is)."""
    inner = relayed(event[EVENT_ID])
    return event if inner is None else {**event, EVENT_ID: inner}


class Repair:
    """The events one broker keeps for brokers that take dead ones' places, and the
    subscriptions it took over from dead brokers."""

    def __init__(
        self,
        ring: RingNode,
        router: cbr.ContentRouter,
        custodian: Custodian,
        barriers: Barriers | None = None,
    ) -> None:
        self.ring = ring
        self.barriers = barriers  # (the takeovers' barriers, ours and those waiting on us)
        self.router = router
        self.custodian = custodian
        self.retry: list[tuple[Mapping[str, Any], int, int]] = []  # (event, dead addr, ring side)
        self.retry_for: list[Key | None] = []  # the custody record of each
        self._held: set[tuple[Any, int]] = set()  # (event id, to) kept only behind others
        self._going: set[tuple[Any, int]] = set()  # (event id, to) the last flush sent: in order
        self._targets: dict[str, set[tuple[int, int]]] = {}  # publisher -> (to, side) of its kept
        self._unconfirmed: dict[str, dict[Key, int]] = {}  # publisher -> its events sent again,
        # not confirmed yet -> where they went
        self.release_due = False  # (a publisher's last one was confirmed: what waits behind may go)
        self._flushed = float("-inf")  # (when a flush after a ring message was last made)
        self.paused: set[int] = set()  # neighbours that declined events, until they resume
        self.moving: Container[int] = ()  # neighbours whose events wait for an old way (ring_moves)
        self._taker_rounds: dict[int, int] = {}  # dead addr -> heartbeat rounds its taker is unknown
        self._told: dict[int, Peer] = {}  # dead member id -> its taker, as its barrier's Drain said
        self._found_dead: dict[int, int] = {}  # dead addr -> the heartbeat round it was found dead in
        self.heard: set[int] = set()  # neighbours that confirmed since we last kept for them
        custodian.on_done = self._confirmed
        self.known: dict[int, int] = {}  # ring id -> address of the brokers we have linked to
        self.orphans: dict[int, dict[Any, Filter]] = {}  # dead addr -> its subs, across the cut
        self.orphan_side: dict[int, int] = {}
        self.taken_from: dict[Hashable, tuple[Filter, set[int]]] = {}  # sub -> (filter, dead addrs)
        self._taken_by_dead: dict[int, list[tuple[Hashable, Any]]] | None = None  # (see _taken)

    def found_dead(self, addrs: Iterable[int]) -> None:
        """The brokers at ``addrs`` were found dead now (see :meth:`_others`)."""
        for a in addrs:
            self._found_dead[a] = self.custodian.round

    def dead_addrs(self) -> set[int]:
        """The addresses of the brokers we linked to that the ring found dead."""
        return {self.known[d] for d in self.ring.dead if d in self.known}

    def gone_addrs(self) -> set[int]:
        """The same, less those a live ring member speaks from now (a broker restarted on its
        address, or one found dead while paused that joined anew): what is kept for a broker
        there waits for a live one, as for any neighbour cut off for a while."""
        return self.dead_addrs() - {p.addr for p in self.ring.links()}

    def keep(self, event: Mapping[str, Any], dead: int, side: int, key: Key | None) -> list[Effect]:
        """``event`` could not go to ``dead``: keep it for the broker that takes its place,
        and deliver it now to the subscriptions we took over from ``dead`` already."""
        self._append(event, dead, side, key)
        self.heard.discard(dead)
        rec = self.custodian.records.get(key) if key is not None else None
        if key is not None and self._unconfirmed:  # (kept again: no longer under way; left
            # as under way to a dead broker, it held its publisher's later events back until
            # that broker's address spoke again, 20 s, while the newer ones went round: a
            # simulator schedule, 57 out of order)
            publisher = publish_order(event[EVENT_ID])[0]
            waiting = self._unconfirmed.get(publisher)
            if waiting is not None and waiting.pop(key, None) is not None and not waiting:
                del self._unconfirmed[publisher]
                self.release_due = True
        if rec is not None and key is not None:
            rec.waiting.discard(dead)
            rec.retries += 1
            self.custodian.step[event[EVENT_ID]] = key
        return self._to_taken(event, dead, side)

    def wait_for_taker(self, dead: int) -> None:
        """What is kept for ``dead`` from now waits up to ``TAKER_ROUNDS`` rounds again for the
        word of its taker (events routed to its replacement by what came from it: the taker
        is the only broker that serves its subscriptions, and the replacement confirms them
        having none)."""
        self._taker_rounds.pop(dead, None)

    def _append(self, event: Mapping[str, Any], to: int, side: int, key: Key | None) -> None:
        self.retry.append((event, to, side))
        self.retry_for.append(key)
        self._targets.setdefault(publish_order(event[EVENT_ID])[0], set()).add((to, side))

    def resending(self, event: Mapping[str, Any], dst: int) -> bool:
        """Whether ``event``'s send to ``dst`` is the last flush's (:meth:`resend`)."""
        return (event[EVENT_ID], dst) in self._going

    def behind_kept(self, dst: int, event: Mapping[str, Any]) -> bool:
        """Events of ``event``'s publisher kept for ``dst``'s side, or sent again to that side
        and not confirmed yet: it waits behind them, for ``dst``, so each publisher's order
        holds across a repair (the other side's taken-over subscriptions are ordered by their
        taker's barrier: see the module note). Whether it was kept."""
        eid = event[EVENT_ID]
        if (eid, dst) in self._going:  # (sent by a flush, in its publisher's order)
            self._going.discard((eid, dst))
            return False
        publisher = publish_order(eid)[0]
        side = self.ring.side_of_addr(dst)
        kept = self._targets.get(publisher, ())
        if all(s != side for _, s in kept) and not self._sent_again(publisher, side):
            return False
        self.hold(event, dst)
        return True

    def _sent_again(
        self, publisher: str, side: int, but: tuple[Key | None, int, Collection[int]] | None = None
    ) -> bool:
        """Whether events of ``publisher`` sent again to a neighbour on ``side`` wait for their
        confirmation (``but``: not the event's own record, nor those sent down the link it
        takes, ahead of it already, nor those at a broker whose barrier waits for our answer)."""
        waiting = self._unconfirmed.get(publisher)
        if not waiting:
            return False
        own, link, barred = but if but is not None else (None, None, ())
        at = self.ring.side_of_addr
        return any(k != own and d != link and d not in barred and at(d) == side for k, d in waiting.items())

    def hold(self, event: Mapping[str, Any], dst: int) -> None:
        """``event``, routed to the neighbour ``dst``, is kept for it, behind what is kept before
        it (in its publisher's order) or until ``dst`` resumes (:attr:`paused`)."""
        eid = event[EVENT_ID]
        key = self.custodian.step.get(eid)
        self._append(event, dst, self.ring.side_of_addr(dst), key)
        self._held.add((eid, dst))
        rec = self.custodian.records.get(key) if key is not None else None
        if rec is not None:
            rec.retries += 1
            rec.waiting.discard(dst)

    def bury(self, dead: int) -> list[Effect]:
        """A broker we sent events to died: what it had not confirmed is kept, as if its
        send failed, for its side of the ring (by the window, else by its ring id: the ring
        may be repaired already, its place taken; by the window alone, the side was unknown
        and the events were released as if confirmed: 8 deliveries lost in a simulator run
        of two restarts)."""
        side = self.side_of(dead)
        out: list[Effect] = []
        for key, rec in list(self.custodian.records.items()):
            if dead in rec.waiting:
                out.extend(self._keep_or_release(rec.event, dead, side, (key,)))
        return out

    def failed(self, event: Mapping[str, Any], dst: int, keys: Sequence[Key | None]) -> list[Effect]:
        """``event``'s send to ``dst`` failed (``keys``: its custody records waiting on
        ``dst``, or ``[None]`` without custody): kept as :meth:`bury` keeps."""
        return self._keep_or_release(event, dst, self.side_of(dst), keys)

    def _keep_or_release(
        self, event: Mapping[str, Any], dst: int, side: int, keys: Sequence[Key | None]
    ) -> list[Effect]:
        """Kept for ``side`` (see :meth:`bury`); with no side known (a broker we never
        placed), its records' waits on ``dst`` end."""
        if side:
            return [e for key in keys for e in self.keep(event, dst, side, key)]
        for key in keys:
            if key is not None:
                self.custodian.release(dst, key[1], only=key)
        return []

    def taken_over(self, sub: Hashable, filt: Filter, fresh_dead: list[int | None]) -> list[Effect]:
        """``sub`` (its filter ``filt``) is taken over from the brokers ``fresh_dead``: the
        events kept for them that it wants are delivered to it."""
        fresh = {a for a in fresh_dead if a is not None}
        self.taken_from[sub] = (filt, fresh)
        self._taken_by_dead = None
        matches = compiled(filt)
        out: list[Effect] = []
        kept = sorted(
            zip(self.retry, self.retry_for, strict=True), key=lambda k: publish_order(k[0][0][EVENT_ID])
        )
        # (kept for a broker found dead on the same side: it stood in for the dead one in our
        # tree, its tables had come from it; sent on to the broker beyond, they would be
        # routed back towards us, the way the subscription came, and not delivered: lost.
        # The side of a broker dead for a while, out of the window already, is by its id)
        sides = {self.side_of(a) for a in fresh} - {0}
        dead = self.dead_addrs() if sides else set()
        held = self._held
        for (e, d, s), rkey in kept:
            # (held only behind others, for a live neighbour: routed before this broker served
            # the subscription, and on their way where it is not any more)
            if (d in fresh or (s in sides and d in dead) or (e[EVENT_ID], d) in held) and matches(e):
                out.append(Deliver(sub, _own(e)))
                if rkey is not None:
                    self.custodian.step[e[EVENT_ID]] = rkey
        return out

    def forget(self, sub: Hashable) -> None:
        """``sub`` is no longer served here: no handed-over event goes to it."""
        if self.taken_from.pop(sub, None) is not None:
            self._taken_by_dead = None

    def keep_orphans(self, wanted: set[int], handover: Mapping[int, int]) -> None:
        """A dead tree neighbour with no replacement: its own subscriptions (received from
        it) are orphans until they come back through the tree."""
        dead_addrs = self.dead_addrs()
        for a in self.router.neighbours - wanted - set(handover):
            if a in dead_addrs:
                side = self.ring.side_of_addr(a)
                orphans = self.router.received_from(a)
                if side and orphans:
                    self.orphans[a] = orphans
                    self.orphan_side[a] = side

    def drop_orphans(self) -> None:
        """Orphans adopted and routed by now (they come from another direction) are dropped."""
        for dead, orphans in list(self.orphans.items()):
            for o in [o for o in orphans if self.router.directions(o) - {dead}]:
                del orphans[o]
            if not orphans:
                del self.orphans[dead]

    def route_orphans(self, effects: list[Effect], event: Mapping[str, Any] | None) -> list[Effect]:
        """``effects`` (the routing of ``event``), and ``event`` handed over the ring link to
        the neighbour that serves a dead one's orphans it matches. Not to one the event goes
        to as a :class:`~flowbus.routing.cbr.Publish` already (a tree neighbour by now): it
        routes it to what it serves, the taken-over subscriptions included. Both sent, the
        custody record kept one message per neighbour, the hand-over: declined by the
        neighbour (no lease) and sent again, the publish was lost for the brokers beyond.
        While events of its publisher are kept, it is kept behind them, for the same dead
        broker (:meth:`keep`): handed over at once, it overtook them (their hand-overs went
        at the next flush; a traced mixed run: 7 out of order)."""
        if event is None or not self.orphans:
            return effects
        out = list(effects)
        published: set[int] | None = None
        for dead, orphans in self.orphans.items():
            side = self.orphan_side[dead]
            now = self.ring.right if side > 0 else self.ring.left
            if now is None or now.addr == dead or not any(f.matches(event) for f in orphans.values()):
                continue
            if published is None:
                published = {e.dst for e in effects if type(e) is Send and type(e.msg) is cbr.Publish}
            if now.addr in published:
                continue
            publisher = publish_order(event[EVENT_ID])[0]
            if self._targets.get(publisher) or self._unconfirmed.get(publisher):
                out.extend(self.keep(event, dead, side, self.custodian.step.get(event[EVENT_ID])))
            else:
                out.append(Send(now.addr, HandedOver(event, dead)))
        return out

    def handover(self, wanted: set[int]) -> dict[int, int]:
        """A tree neighbour's place goes to our new neighbour on the same side: a dead one's to
        the broker beyond it, a live one's to a broker that joined between us (the new one's
        tables come from the old one; until it synced us, what came from the old one is routed
        to it, not withdrawn: withdrawn, this side was cut off from our other neighbours'
        events for a moment, and those events were confirmed and lost). A live one's side is
        its tree side by its id now: by the address, a side recorded when an earlier member
        there died could be the other one, and the place went to nobody (a traced campaign
        run: the entries withdrawn up the tree for the 30 ms until the new one synced us,
        the events published meanwhile at the far end confirmed and lost, 44 deliveries)."""
        out: dict[int, int] = {}
        ring = self.ring
        live = {p.addr: p for p in ring.links() if p.id not in ring.dead} if ring.joined else {}
        for a in self.router.neighbours - wanted:
            peer = live.get(a)
            side = (1 if peer.id > ring.me.id else -1) if peer is not None else self.side_of(a)
            now = ring.right if side > 0 else ring.left if side < 0 else None
            if now is not None and now.addr in wanted and now.addr not in self.router.neighbours:
                out[a] = now.addr
        return out

    def side_of(self, addr: int) -> int:
        """The side of the ring a broker is (or, dead, was) on: by the ring's window, else by
        its ring id (one dead for a while is out of the window); 0 if unknown."""
        return self.ring.side_of_addr(addr) or self.side_by_id(addr)

    def ids_at(self, addr: int) -> list[int]:
        """The ring ids of the members we linked to at ``addr``, the last one first (a broker
        restarted on its address comes back under a new id, and ids are never given twice)."""
        return [i for i, a in reversed(self.known.items()) if a == addr]

    def side_by_id(self, addr: int) -> int:
        """The side a broker we linked to is on by its ring id (the tree is the ring cut at the
        wrap: a smaller id is to our left), 0 if unknown."""
        old = next(iter(self.ids_at(addr)), None)
        if old is None or not self.ring.joined or old == self.ring.me.id:
            return 0
        return -1 if old < self.ring.me.id else 1

    def resend(self, now: float | None = None) -> list[Effect]:
        """Kept events go to the new neighbour on their side once the ring has one (those
        kept only behind others, to their neighbour), in each publisher's order: one that
        cannot go yet holds its publisher's later ones back. One kept for a dead broker
        waits until the ring says who took it over (at most ``TAKER_ROUNDS`` heartbeat
        rounds), and goes to the taker too, handed over: what it took over is there
        wherever the tables route the event. Sent to the new neighbour only, before the
        taker's announcement came, it was confirmed there and lost for them when the taker
        was on the other side of the tree (simulator schedules of restarts: 10 and 653
        events lost).

        Called with the time ``now`` (after a ring message), a flush over more than
        :data:`FLUSH_MANY` kept events is made at most every :data:`FLUSH_EVERY` seconds:
        each is a pass over all of them, and after a long partition a broker kept tens of
        thousands while ring messages came by the dozen a second (starved brokers busy for a
        minute after the heal, answering nobody). What waits goes at the next flush, at the
        latest the heartbeat round's (:meth:`retry_live`)."""
        if now is not None and len(self.retry) > FLUSH_MANY:
            if now - self._flushed < FLUSH_EVERY:
                return []
            self._flushed = now
        self.release_due = False
        return self._flush(live=False)

    def retry_live(self, *, round: bool = True) -> list[Effect]:
        """The same, and kept events whose side still has the neighbour they failed to reach,
        alive as far as the ring knows, go to it again (a heartbeat ``round``'s: it was cut
        off for a while, then came back; or a neighbour that resumed). Only a heartbeat
        round counts towards ``TAKER_ROUNDS``: counted at each ``Resumed`` too, the wait for
        a taker's word ended 3 s after the broker was found dead, half a second before the
        word came (a simulator schedule)."""
        return self._flush(live=True, round=round)

    def _flush(self, *, live: bool, round: bool = False) -> list[Effect]:
        if not self.retry or not self.ring.joined:
            return []
        # (an address a live broker speaks from again is no dead one's: a broker restarted on
        # it; what was kept for the dead one waited for ever, and its publisher's later events)
        dead = self.gone_addrs()
        out: list[Effect] = []
        keep: list[tuple[Mapping[str, Any], int, int]] = []
        keep_for: list[Key | None] = []
        blocked: set[tuple[str, int]] = set()  # (publisher, side) held back; side 0: all its sides
        self._going = set()
        # (each kept event's place in its publisher's order computed once: a flush runs after
        # every ring message, and after a long partition tens of thousands are kept)
        kept = sorted(
            (
                (publish_order(item[0][EVENT_ID]), item, key)
                for item, key in zip(self.retry, self.retry_for, strict=True)
            ),
            key=lambda k: k[0],
        )
        links: list[Peer] | None = None  # (the ring's links, read once if needed)
        # (a broker whose takeover's barrier waits for our answer holds what we sent it,
        # unconfirmed, until the answer: waited for, the answer waited for what was kept for
        # its dead one, behind that; a cycle, its publishers' acknowledgements stalled the
        # DRAIN_ROUNDS. Its barrier puts what we sent it in order)
        barred = self.barriers.askers() if self.barriers is not None else set()
        # (kept for a dead broker: its taker told first, see the note on resend)
        takers = {to: self._taker(to) for _, to, _ in self.retry if to in dead}
        recent = self._recent(dead)
        takers.update((d, self._taker(d)) for d in recent)
        if round:
            rounds = self._taker_rounds
            self._taker_rounds = {to: rounds.get(to, 0) + 1 for to, t in takers.items() if t is None}
        due_rounds = {to for to, n in self._taker_rounds.items() if n >= TAKER_ROUNDS}
        others: dict[tuple[int, int], tuple[list[int], list[int]]] = {}  # (to, side) -> see _others
        left, right = self.ring.left, self.ring.right
        targets: dict[str, set[tuple[int, int]]] = {}
        for (publisher, _), (event, to, side), key in kept:
            if (publisher, side) in blocked or (publisher, 0) in blocked:  # (behind one kept: kept)
                keep.append((event, to, side))
                keep_for.append(key)
                targets.setdefault(publisher, set()).add((to, side))
                continue
            eid = event[EVENT_ID]
            now = (right if side > 0 else left) if side else None
            also = others.get((to, side))
            if also is None:
                also = others[(to, side)] = self._others(to, side, dead, recent)
            held = (eid, to) in self._held
            if held and to in self.router.neighbours and to not in dead:  # (routed to a live tree
                # neighbour, it goes there, whoever is on its side now: in a ring of three the
                # other two are both sides, and held for the left one, an event went to the
                # new right one, which routed it back towards us, the way it came: dropped)
                if links is None:
                    links = self.ring.links()
                now = next((p for p in links if p.addr == to), now)
            same = now is not None and now.addr == to
            go = (
                (publisher, side) not in blocked
                and (publisher, 0) not in blocked
                and now is not None
                and now.addr not in self.paused
                and now.addr not in self.moving
                and not self.ring.open & {side}
                and all(d not in takers or takers[d] is not None or d in due_rounds for d in (to, *also[1]))
                and (not same or ((held or live or to in self.heard) and to not in dead))
                # (sent again, older, to this side: one another way, not this event's own, must be
                # confirmed first; one down the same link is ahead of it)
                and not (held and self._sent_again(publisher, side, but=(key, now.addr, barred)))
            )
            if not go:
                keep.append((event, to, side))
                keep_for.append(key)
                targets.setdefault(publisher, set()).add((to, side))
                blocked.add((publisher, side))
                continue
            assert now is not None
            rec = self.custodian.records.get(key) if key is not None else None
            if now.addr not in self.router.neighbours and to in dead and self._took(to, takers):
                # (across the tree's cut only the dead broker's own subscriptions were beyond it,
                # and we took them over: delivered here when kept or taken up. Handed over, the
                # new neighbour, not their taker, routed it on into the tree, round to brokers it
                # had passed: a custody cycle, its publisher's later events held for ever. But a
                # broker beyond it found dead too was taken over across the cut: its own share
                # goes there, handed over for it, see _beyond. Taken over here with no
                # subscriptions of its own, it is ours all the same: handed over for it, the
                # taker of the one beyond did not know it, relayed the events round the ring
                # and nobody delivered them, 530 in a simulator schedule)
                beyond = self._beyond(to, side, dead)
                for d in beyond:
                    out.append(Send(now.addr, HandedOver(_own(event), d)))
                if rec is not None and key is not None:
                    rec.retries -= 1
                    self.custodian.step[eid] = key
                    if beyond:
                        rec.waiting.add(now.addr)
                continue
            taker = takers.get(to)
            handed = taker is not None and taker.addr not in (now.addr, self.router.broker)
            hands = [(to, taker.addr)] if handed and taker is not None else []
            if also[0]:  # (one hand-over per dead broker, to its taker: a taker delivers what
                # is handed over for a dead one to the subscriptions it took from that one only;
                # one per taker, a taker of two got the events of one: 387 out of order, late)
                skip = {now.addr, self.router.broker}
                for d in also[0]:
                    other = takers.get(d)
                    if other is not None and other.addr not in skip:
                        hands.append((d, other.addr))
            for d, at in hands:  # (what they took over is there, wherever the tables route the event)
                hand = HandedOver(_own(event), d)
                out.append(Send(at, hand))
                if rec is not None and key is not None:
                    rec.waiting.add(at)
                    self.custodian.unwrap(key, at, hand)
            if now.addr in self.router.neighbours:
                publish = cbr.Publish(_own(event))
                out.append(Send(now.addr, publish))
                if key is not None and relayed(key[1]) is not None:
                    self.custodian.unwrap(key, now.addr, publish)
            else:  # across the tree's cut: only the dead broker's own subscriptions are there
                out.append(Send(now.addr, HandedOver(event, to)))
            self._held.discard((eid, to))
            self._going.add((eid, now.addr))
            if rec is not None and key is not None:
                rec.retries -= 1
                rec.waiting.add(now.addr)
                self.custodian.step[eid] = key
                if not held:  # (sent again: what its publisher holds behind waits for its confirmation)
                    self._unconfirmed.setdefault(publisher, {})[key] = now.addr
        self.retry, self.retry_for = keep, keep_for
        self._targets = targets
        return out

    def _took(self, dead: int, takers: Mapping[int, Peer | None]) -> bool:
        """Whether the dead broker at ``dead`` was taken over here (its subscriptions, or,
        with none, the member itself)."""
        taker = takers.get(dead)
        return self.took_from(dead) or (taker is not None and taker.addr == self.router.broker)

    def _taker(self, dead: int) -> Peer | None:
        """Who took over the dead broker at address ``dead``, if the taker told us (a broker
        that answered a query about it may have named itself; or its takeover's barrier asks
        us, ``Drain``: only the taker asks, and a broker that is not the dead one's ring
        neighbour gets no ``Redirect``) and is not found dead since. The member is the last
        one known at the address: the taker of one that died there before it, a restart
        earlier, took the events kept for it and delivered none (they matched no subscription
        it had taken from the earlier one; 173 out of order in a simulator schedule)."""
        last = next((i for i in self.ids_at(dead) if i in self.ring.dead), None)
        taker = (self.ring.taken_by.get(last) or self._told.get(last)) if last is not None else None
        if taker is None and self.barriers is not None:
            askers = self.barriers.asked.get(dead, ())
            if len(askers) == 1:
                taker = next((p for p in self.ring.links() if p.addr in askers), None)
                if taker is not None and last is not None:  # (remembered: the barrier forgets
                    self._told[last] = taker  # it once answered; kept events may go later)
        return None if taker is None or taker.id in self.ring.dead else taker

    def _recent(self, dead: set[int]) -> set[int]:
        """The dead brokers (of ``dead``) found dead in the last ``AFTERMATH_ROUNDS`` rounds."""
        since = self.custodian.round - AFTERMATH_ROUNDS
        return {d for d in dead if self._found_dead.get(d, since) > since}

    def _others(self, to: int, side: int, dead: set[int], recent: set[int]) -> tuple[list[int], list[int]]:
        """The brokers found dead lately on ``side`` besides the dead ``to``, that another
        broker took over, and those of them found dead with ``to`` or after it: what was kept
        for ``to`` goes to the takers of the first (handed over), and waits for the word of
        the second's (at most ``TAKER_ROUNDS``). ``to`` stood between us and them in the
        tree: what it had not confirmed may have been going their way, and their
        subscriptions are at their takers now, maybe on our other side, where no table
        routed it (a simulator schedule: a subscription taken over once, then from its
        taker, both dead with the broker before them: 207 of its events confirmed by the new
        neighbour beyond, never delivered). Waiting for the takers of older deaths too held
        a side back for rounds for a taker we are never told of (another schedule)."""
        if to not in dead:
            return [], []
        also = sorted(d for d in recent - {to} if self.side_of(d) == side and not self.took_from(d))
        found = self._found_dead
        since = found.get(to, self.custodian.round) - 1
        return also, [d for d in also if found.get(d, since) >= since]

    def _beyond(self, to: int, side: int, dead: set[int]) -> list[int]:
        """The brokers found dead on ``side`` besides ``to`` whose subscriptions we did not
        take over (they were beyond ``to``, nearer the tree's cut: their taker is across it).
        Two adjacent brokers die at once at the end of the tree: the near one's other
        neighbour takes it over and keeps what went its way; the far one's, across the cut,
        takes the far one over. What was kept for the near one was owed to both (a simulator
        run: 323-485 acknowledged events lost of each subscription of the far one)."""
        return sorted(d for d in dead if d != to and self.side_of(d) == side and not self.took_from(d))

    def handed_over(self, msg: HandedOver) -> list[Effect]:
        """An event that was going to a dead broker: deliver it to the subscriptions we took
        over from that broker (the tree did not reach it, nobody else serves them)."""
        event = msg.event
        inner = relayed(event[EVENT_ID])
        if inner is not None:  # (relayed here by a broker that was no taker: its own id again)
            key = self.custodian.step.get(event[EVENT_ID])
            event = {**event, EVENT_ID: inner}
            if key is not None:
                self.custodian.step[inner] = key
                self.custodian.unwrap(key)
        return [Deliver(sub, event) for sub, matches in self._taken().get(msg.dead, ()) if matches(event)]

    def _to_taken(self, event: Mapping[str, Any], dead: int, side: int) -> list[Effect]:
        """The deliveries of ``event``, kept for ``dead`` on ``side``, to the subscriptions
        taken over here from ``dead``, or from a broker found dead on the same side (``dead``
        stood in for it in our tree: the event was going its way, and nobody beyond serves
        them now; the kept events a takeover finds are delivered the same way, see
        :meth:`taken_over`)."""
        taken = self._taken()
        if not taken:
            return []
        out: list[Effect] = []
        gone = self.dead_addrs() if side else set()
        for d, subs in taken.items():
            if d == dead or (d in gone and self.side_of(d) == side):
                out.extend(Deliver(sub, _own(event)) for sub, matches in subs if matches(event))
        return out

    def _confirmed(self, key: Key) -> None:
        """Every party a custody record went to is done (the custodian's ``on_done``; copies
        kept for others may still wait): if it was sent again, its publisher's events held
        behind it may go once it is its last (see the note)."""
        if not self._unconfirmed:
            return
        publisher = publish_order(key[1])[0]
        waiting = self._unconfirmed.get(publisher)
        if waiting is not None and key in waiting:
            del waiting[key]
            if not waiting:
                del self._unconfirmed[publisher]
                self.release_due = True

    def took_from(self, dead: int) -> bool:
        """Whether subscriptions were taken over here from the dead broker at ``dead``."""
        return dead in self._taken()

    def _taken(self) -> dict[int, list[tuple[Hashable, Any]]]:
        """Dead broker -> the subscriptions taken over from it, in order, with their
        compiled filters (built again only after ``taken_from`` changed)."""
        if self._taken_by_dead is None:
            index: dict[int, list[tuple[Hashable, Any]]] = {}
            for sub, (filt, dead) in sorted(self.taken_from.items(), key=lambda kv: repr(kv[0])):
                for d in dead:
                    index.setdefault(d, []).append((sub, compiled(filt)))
            self._taken_by_dead = index
        return self._taken_by_dead
