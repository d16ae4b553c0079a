"""Custody of a ring broker: the events it holds until everyone it handed them to is done
(sans-IO, a part of :class:`~flowbus.routing.ring_broker.RingBroker`).

How it works:

* **Records.** Each event a step routes in custody gets a record, keyed by the broker it came
  from (None: published here) and its event id (:data:`EVENT_ID`, carried between brokers).
  :meth:`Custodian.open` makes it and marks it as the step's record for that id; while the
  broker core turns the step's effects into sends and deliveries, each party the event is
  handed to (a neighbour's address, a backup version, a partition's grace period) is put in
  the record's ``waiting`` (:meth:`Custodian.hold`), and each local delivery counts in
  ``local``.
* **Done.** A record is done once nothing waits (:meth:`Custodian.release`, a neighbour's
  :class:`Confirm`; :meth:`Custodian.settle_many`, the driver settled local deliveries) and
  no kept copy waits for a repair (``retries``). Then an event published here is listed in
  :attr:`Custodian.settled`, or in :attr:`Custodian.refused` if a broker further on refused
  it (secure spaces), which the broker reports to its driver as effects (``Settled``,
  ``PublishRefused``); one from a neighbour is confirmed to it, or refused upstream.
  :meth:`Custodian.end_step` gives those messages once per step.
* **Sent again.** A message written into a connection that then broke is lost without a
  notice, and a neighbour cut off for a while, not found dead, may have dropped what came.
  So each heartbeat round (:meth:`Custodian.stale`), what has waited ``RESEND_ROUNDS``
  rounds on a neighbour is sent to it again, as :class:`Again`; a receiver takes a copy of an
  event it is still handling as nothing new (:meth:`Custodian.seen`), answers one it is done
  with, from the last ``DONE`` it finished, with its confirmation again (the first was lost),
  and handles any other as if it came the first time.
* **Declined.** A broker without its ring lease takes no event (it may have been taken over)
  and answers :class:`Declined` with their ids; from then on it declines every event from
  that sender, lease or not, until the sender's :class:`Resume`. The sender keeps what was
  declined as it keeps what it could not send (the ring's repair,
  :mod:`~flowbus.routing.ring_repair`), sends ``Resume`` at once, and keeps whatever it
  would send that broker until the answer, :class:`Resumed`: by then every event sent
  before ``Resume`` was taken or declined (the answer comes after those ``Declined`` on
  the link). Then the kept events go, in each publisher's order (or to the broker that took
  the other's place). Dropped without a word, they would come again only after later ones
  it took once its lease was back: out of order.
* **Refused here.** A local delivery the driver gives up (its subscription's queue full:
  :meth:`Custodian.refuse_local`) counts as settled and refuses the record with the reason,
  as a refusal from a broker further on does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from flowbus import wire
from flowbus.core import Effect, Send
from flowbus.meta import EVENT_ID
from flowbus.routing.link_classes import Refused

RESEND_ROUNDS = 3
"""Heartbeat rounds an event waits on a neighbour before it is sent to it again."""

DONE = 50_000
"""How many finished records a broker remembers: to confirm a copy from another broker again,
and to know an event it published or routed already when a hand-over of it comes back."""


RELAY = "__flowbus_relay"


def relay_id(eid: Any, trail: tuple[int, ...]) -> tuple[str, Any, tuple[int, ...]]:
    """The id a hand-over travels under while brokers that did not take the dead one's
    subscriptions over relay it towards the one that did (``trail``: the relays so far):
    its custody records are its own, apart from the event's (see
    :meth:`RingBroker._relay <flowbus.routing.ring_broker.RingBroker._relay>`)."""
    return (RELAY, eid, trail)


def relayed(eid: Any) -> Any:
    """The event id a relay id stands for (None: not a relay id)."""
    if type(eid) is tuple and len(eid) == 3 and eid[0] == RELAY:
        return eid[1]
    return None


def publish_order(eid: Any) -> tuple[str, int]:
    """An event id's place in its publisher's order (``(publisher, sequence number)``)."""
    inner = relayed(eid)
    if inner is not None:  # (a relayed hand-over: its event's place)
        eid = inner
    if isinstance(eid, tuple) and len(eid) == 2 and isinstance(eid[1], int):
        return (repr(eid[0]), eid[1])
    return (repr(eid), 0)


@wire.message("ringbroker.again")
@dataclass(frozen=True, slots=True)
class Again:
    """``msg`` (an event's Publish, HandedOver or Delegated) sent again after it waited long
    on the receiver (see the note): a copy of one under way there is dropped, one finished
    there is confirmed again."""

    msg: Any


@wire.message("ringbroker.confirm")
@dataclass(frozen=True, slots=True)
class Confirm:
    """The sender is done with these events the receiver sent it (custody, see the note)."""

    ids: tuple[Any, ...]


@wire.message("ringbroker.declined")
@dataclass(frozen=True, slots=True)
class Declined:
    """The sender, without its ring lease, did not take these events (see the note)."""

    ids: tuple[Any, ...]


@wire.message("ringbroker.resume")
@dataclass(frozen=True, slots=True)
class Resume:
    """The sender keeps what the receiver declined: events after this one are new (see the
    note)."""


@wire.message("ringbroker.resumed")
@dataclass(frozen=True, slots=True)
class Resumed:
    """The answer to :class:`Resume`: every event before it was taken or declined."""


class Record:
    """An event this broker is responsible for until everyone it handed it to is done."""

    __slots__ = ("event", "local", "refused", "retries", "round", "sent", "src", "waiting")

    def __init__(self, event: Mapping[str, Any], src: int | None, round: int = 0) -> None:
        self.event = event
        self.src = src  # the broker it came from; None: published here
        self.round = round  # the heartbeat round it was (last) sent in
        self.sent: dict[int, Any] | None = None  # neighbour -> the message, if not a Publish
        self.waiting: set[Hashable] = set()  # neighbour addrs it was handed to
        self.local = 0  # deliveries to subscriptions here not settled by the driver yet
        self.retries = 0  # kept for the broker that takes a dead one's place
        self.refused: str | None = None  # why a broker further on did not carry it (secure spaces)


Key = tuple[int | None, Any]
"""A custody record's key: (the broker the event came from or None, the event id)."""


class _Step(dict[Any, "Key"]):
    """Event id -> its record, for the step under way; a record displaced by another of the
    same event in the step (from another broker, or kept again) is remembered, so the step's
    end finishes it too: forgotten, a record a flush had just done with stayed for good once
    a copy of its event came from another broker in the same step (a simulator schedule on
    the brokers' clocks: one publish never settled)."""

    __slots__ = ("displaced",)

    def __init__(self) -> None:
        super().__init__()
        self.displaced: list[Key] = []

    def __setitem__(self, eid: Any, key: Key) -> None:
        old = self.get(eid)
        if old is not None and old != key:
            self.displaced.append(old)
        super().__setitem__(eid, key)


class Custodian:
    """The custody records of one broker, and what their ends make due."""

    def __init__(self) -> None:
        self.records: dict[Key, Record] = {}  # (src, event id) -> record
        self.step = _Step()  # event id -> its record, for the step under way
        self.by_id: dict[Any, set[int | None]] = {}  # event id -> the srcs of its records
        self.confirms: dict[int, list[Any]] = {}  # confirmations due, per upstream broker
        self.refusals: dict[int, list[tuple[Any, str]]] = {}  # refusals due, per upstream broker
        self.settled: list[Any] = []  # ids of events published here that everyone is done with
        self.refused: list[tuple[Any, str]] = []  # (id, reason) of those refused on the way instead
        self.done: OrderedDict[Key, str | None] = OrderedDict()  # finished records: their refusal
        self.relays: dict[Any, Key] = {}  # relay id -> the record it relays (see relay_id)
        self.unwrapped: dict[Any, set[Key]] = {}  # event id -> relays' records sent on under it
        self.on_done: Callable[[Key], None] | None = None  # (told when all a record went to are done)
        self.round = 0  # heartbeat rounds so far (see stale)

    def open(self, src: int | None, event: Mapping[str, Any]) -> None:
        """This step routes ``event`` (from ``src``; None: published here) in custody."""
        eid = event[EVENT_ID]
        key = (src, eid)
        if key not in self.records:
            self.records[key] = Record(event, src, self.round)
            self.by_id.setdefault(eid, set()).add(src)
        self.step[eid] = key

    def seen(self, src: int, eid: Any) -> bool:
        """Whether an event ``src`` sent is a copy of one we are handling (nothing to do), or
        have finished (its confirmation or refusal is due again: the first was lost)."""
        key = (src, eid)
        if key in self.records:
            return True
        done = self.done
        if key not in done:
            return False
        why = done[key]
        if why is None:
            self.confirms.setdefault(src, []).append(eid)
        else:
            self.refusals.setdefault(src, []).append((eid, why))
        return True

    def hold(self, key: Key | None, party: Hashable) -> None:
        rec = self.records.get(key) if key is not None else None
        if rec is not None:
            rec.waiting.add(party)

    def unwrap(self, key: Key, dst: int | None = None, msg: Any = None) -> None:
        """A relay's record (keyed by its relay id) goes on under the event's own id: its
        deliveries here (a hand-over to what we took over: the driver settles them by that
        id), or a copy to ``dst`` as ``msg`` (a kept hand-over sent again as a publish:
        ``dst`` confirms that id, and a copy sent again is ``msg``, not the relay's event).
        Either way the record ends by that id: by its relay id, the deliveries never
        settled, and a publish carried the relay id to subscribers (652 deliveries under it
        in a simulator schedule, 753 records never done)."""
        if dst is not None:
            self.note(key, dst, msg)
        inner = relayed(key[1])
        if inner is not None:
            self.unwrapped.setdefault(inner, set()).add(key)

    def note(self, key: Key | None, dst: int, msg: Any) -> None:
        """What went to ``dst`` was ``msg`` (not a plain Publish: sent again as it was)."""
        rec = self.records.get(key) if key is not None else None
        if rec is not None:
            if rec.sent is None:
                rec.sent = {}
            rec.sent[dst] = msg

    def stale(self) -> Iterator[tuple[int, Record]]:
        """A heartbeat round: ``(neighbour, record)`` for each neighbour a record has waited on
        for ``RESEND_ROUNDS`` rounds (the record counts as sent again now)."""
        self.round += 1
        due = self.round - RESEND_ROUNDS
        for rec in list(self.records.values()):
            if rec.round <= due and rec.waiting:
                rec.round = self.round
                for party in list(rec.waiting):
                    if type(party) is int:
                        yield party, rec

    def waiting_on(self, party: Hashable, eid: Any) -> list[Key]:
        keys = [(s, eid) for s in self.by_id.get(eid, ())]
        if self.unwrapped and eid in self.unwrapped:  # (relays' records sent on under it)
            keys.extend(k for k in self.unwrapped[eid] if k in self.records)
        return [k for k in keys if party in self.records[k].waiting]

    def release(self, party: Hashable, eid: Any, *, only: Key | None = None) -> None:
        if only is not None:
            keys: Iterable[Key] = (only,)
        else:
            srcs = self.by_id.get(eid)
            if not srcs:
                relaying = self.relays.get(eid) if self.relays else None
                if relaying is None:
                    return
                keys = (relaying,)  # (a relay's confirmation: the record it relays)
            else:
                keys = [(s, eid) for s in srcs]
            if self.unwrapped and eid in self.unwrapped:
                keys = [*keys, *self.unwrapped[eid]]
        records = self.records
        for key in keys:
            rec = records.get(key)
            if rec is not None and (only is not None or party in rec.waiting):
                rec.waiting.discard(party)
                self.maybe_done(key)

    def maybe_done(self, key: Key) -> None:
        rec = self.records.get(key)
        if rec is None or rec.waiting or rec.local:
            return
        if self.on_done is not None:  # (every party it went to is done: only kept copies may wait)
            self.on_done(key)
        if rec.retries:
            return
        del self.records[key]
        if self.relays:
            for rid in [r for r, k in self.relays.items() if k == key]:
                del self.relays[rid]
        src, eid = key
        inner = relayed(eid) if self.unwrapped else None
        if inner is not None and inner in self.unwrapped:
            self.unwrapped[inner].discard(key)
            if not self.unwrapped[inner]:
                del self.unwrapped[inner]
        srcs = self.by_id[eid]
        srcs.discard(src)
        if not srcs:
            del self.by_id[eid]
        self.done[key] = rec.refused  # (one published here too: a hand-over of it coming back
        if len(self.done) > DONE:  # is nothing new, RingBroker._routed)
            self.done.popitem(last=False)
        if rec.refused is not None:
            if src is None:
                self.refused.append((eid, rec.refused))
            else:
                self.refusals.setdefault(src, []).append((eid, rec.refused))
        elif src is None:
            self.settled.append(eid)
        else:
            self.confirms.setdefault(src, []).append(eid)

    def settle_many(self, counts: Iterable[tuple[Hashable, int]], aliases: dict[Any, Any]) -> None:
        """``(event id, n)``: ``n`` of its local deliveries settled by the driver (an id in
        ``aliases``, a 2nd, 3rd... delivery of one event, is taken out of it instead)."""
        by_id, records = self.by_id, self.records
        for event_id, n in counts:
            if aliases and event_id in aliases:
                aliases.pop(event_id)  # (the event's first delivery settles it)
                continue
            srcs = by_id.get(event_id)
            if srcs:
                for src in (next(iter(srcs)),) if len(srcs) == 1 else list(srcs):
                    rec = records[(src, event_id)]
                    took = min(n, rec.local)
                    if took:
                        rec.local -= took
                        n -= took
                        if not rec.local:
                            self.maybe_done((src, event_id))  # (may change srcs: iterated on a copy)
                    if not n:
                        break
            if n and self.unwrapped and event_id in self.unwrapped:  # (delivered from a relay's)
                for key in list(self.unwrapped[event_id]):
                    relay = records.get(key)
                    took = min(n, relay.local) if relay is not None else 0
                    if took and relay is not None:
                        relay.local -= took
                        n -= took
                        if not relay.local:
                            self.maybe_done(key)
                    if not n:
                        break

    def refuse_local(self, items: Iterable[tuple[Hashable, str]], aliases: dict[Any, Any]) -> None:
        """``(event id, reason)``: one local delivery of the event the driver gave up (its
        subscription's queue could not take it). It counts as settled, and the event's record
        is refused with the reason (the first one kept): its publish is refused, not settled,
        once the record is done (an alias id refuses its event without counting, as in
        :meth:`settle_many`)."""
        by_id, records = self.by_id, self.records
        for event_id, why in items:
            n = 1
            if aliases and event_id in aliases:
                event_id, n = aliases.pop(event_id), 0
            keys = [(src, event_id) for src in by_id.get(event_id, ())]
            if self.unwrapped and event_id in self.unwrapped:  # (delivered from a relay's)
                keys.extend(self.unwrapped[event_id])
            for key in keys:
                rec = records.get(key)
                if rec is None or not rec.local:
                    continue
                if rec.refused is None:
                    rec.refused = why
                rec.local -= n
                if not rec.local:
                    self.maybe_done(key)
                break

    def refuse(self, dst: int, items: Iterable[tuple[Any, str]]) -> None:
        """Broker ``dst`` is done with these events without carrying them on (see
        :meth:`RingBroker.refuse <flowbus.routing.ring_broker.RingBroker.refuse>`)."""
        for eid, why in items:
            for key in self.waiting_on(dst, eid):
                self.records[key].refused = why
                self.release(dst, eid, only=key)

    def end_step(self) -> list[Effect]:
        """The step's records that are done now end; the confirmations and refusals due go."""
        step = self.step
        if step:
            self.step = _Step()
            for key in step.values():
                self.maybe_done(key)
            for key in step.displaced:
                self.maybe_done(key)
        out: list[Effect] = []
        if self.confirms:
            out.extend(Send(dst, Confirm(tuple(ids))) for dst, ids in sorted(self.confirms.items()))
            self.confirms = {}
        if self.refusals:
            out.extend(Send(dst, Refused(tuple(items))) for dst, items in sorted(self.refusals.items()))
            self.refusals = {}
        return out
