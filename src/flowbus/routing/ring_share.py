"""Subscriptions a loaded ring broker shares with a neighbour: the neighbour matches their
events, the subscriptions' own broker still delivers them (sans-IO, a part of
:class:`~flowbus.routing.ring_broker.RingBroker`).

How it works (Chordal Reliability Rings, section 3.4: a broker over its limit "shares the
tasks" with a neighbour "by passing the information"; the decision and the acknowledged
``ShareState`` are :mod:`flowbus.overlay.ring_load`'s):

* **What moves.** A broker's routing state is its subscriptions' entries
  ``("sub", sub_id, home)`` in the ring state; the entries a share may pass on are the
  broker's own plain subscriptions (:meth:`SharedSubs.movable`: not a deployed flow's
  partition or subscription, whose state and edge transforms live at home; not one adopted
  from another broker). The ring node picks the busiest (the broker counts deliveries per
  entry while a limit is set).
* **Make before break.** The receiver takes the entries into its state and *adopts* them in
  its content router under their origin ``(home, sub_id)`` (as for a takeover): their
  filters now travel the tree from it. The sender keeps matching them until the
  ``ShareAck``; then (:meth:`SharedSubs.placed`) it drops them from its router and notes
  where each went (:attr:`SharedSubs.out`). Until then an event may be matched at both:
  the home delivers it once (deliveries are de-duplicated by event id).
* **Deliveries go home.** The session of a shared subscription stays at its home. The
  receiver, matching an event for a subscription whose home is alive
  (:attr:`SharedSubs.hosted`), does not deliver it: it sends :class:`Delegated` (the
  subscriptions and the event) to the home, in custody like an event sent on the tree. The
  home opens a custody record for it, delivers it to those subscriptions and confirms it
  once they are settled, so nothing is lost or delivered twice.
* **Ends.** The client unsubscribes at home: :class:`Unshare` tells the holder to drop the
  entries. The home dies: the holder's entries now have a dead home, so the holder delivers
  them itself (the takeover path: the clients re-attach there). The holder dies: its state,
  the shared entries with it, is taken over from its backups; if the home takes it over it
  routes its subscriptions itself again (:meth:`SharedSubs.back`), another broker hosts
  them as the dead one did.

* **A home that is not one.** The holder judges a home alive by its address. A broker found
  dead and started again on its address is a new member that serves none of the old one's
  subscriptions (it handed them over): a :class:`Delegated` for subscriptions it does not
  serve comes back as :class:`Undelegated` (in custody, as the other way), and the holder
  delivers them itself from then on (:attr:`SharedSubs.refused`; their clients re-attach
  there, where the ring serves them). Dropped and confirmed there, they were lost. Each
  ``Delegated`` still on its way comes back too, in order on the link: until the last one
  sent has (:attr:`SharedSubs.pending`), the subscription's later events go the same way
  round, so its publishers' order holds (delivered at once, they overtook those coming back).
  An ``Undelegated`` is the answer to the ``Delegated``: where the holder had the event
  from that very broker, its record of it stops waiting there (it waited for the answer,
  the other broker for the record's confirmation: neither came).
  A deployed flow's subscriptions and partitions are never hosted (:meth:`SharedSubs.host`):
  their deliveries are transformed or folded where they are held.

Not done: an ``Unshare`` sent to a holder that died meanwhile is lost, and the broker that
took over its state keeps matching that subscription (its deliveries to the home are dropped
there: the subscription is gone).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flowbus import wire
from flowbus.core import Deliver, DeliverAll, Effect, Send
from flowbus.filters import parse
from flowbus.meta import EVENT_ID
from flowbus.overlay.chordal_ring import RingNode
from flowbus.routing.cbr import ContentRouter
from flowbus.routing.ring_keys import SubKey, record, sub_key

__all__ = ["Delegated", "SharedSubs", "Undelegated", "Unshare"]


@wire.message("ringbroker.delegated")
@dataclass(frozen=True, slots=True)
class Delegated:
    """``event`` matched the subscriptions ``subs`` of the receiver, their home, at the
    sender, which holds their entries (a load share): the home delivers it to them."""

    subs: tuple[Hashable, ...]
    event: Mapping[str, Any]


@wire.message("ringbroker.undelegated")
@dataclass(frozen=True, slots=True)
class Undelegated:
    """A :class:`Delegated` back to its sender: the receiver does not serve ``subs`` (it is
    not their home: a new broker on the home's address); the holder delivers them itself."""

    subs: tuple[Hashable, ...]
    event: Mapping[str, Any]


@wire.message("ringbroker.unshare")
@dataclass(frozen=True, slots=True)
class Unshare:
    """The sender's subscriptions of these entries ended: the holder drops them."""

    keys: tuple[Hashable, ...]


class SharedSubs:
    """Broker ``addr``'s subscriptions held elsewhere and others' held here (see the module note)."""

    def __init__(self, addr: int) -> None:
        self.addr = addr
        self.out: dict[Hashable, int] = {}  # own sub id -> the broker that holds (matches) it
        self.hosted: dict[Hashable, int] = {}  # sub id held here -> its live home
        self.refused: set[Hashable] = set()  # held here, their home's address serves them not
        self.ended: set[Hashable] = set()  # own shared ones ended here (their Delegated: dropped)
        self.pending: dict[Hashable, tuple[int, Any]] = {}  # hosted sub -> (home, the last event
        # id delegated to it); a refused one stays hosted until that one is back (see the note)
        self._back: set[Any] = set()  # ids of the events that came back in this step (not redirected)
        self.delegated = 0  # deliveries handed to their home
        self.received = 0  # deliveries handed to us by a holder

    def movable(self, key: Hashable, own: Collection[Hashable], *fixed: Collection[Hashable]) -> bool:
        """Whether a share may pass the state entry ``key`` on: a subscription of ours among
        ``own``, in none of ``fixed`` (flows' partitions and subscriptions, adopted ones)."""
        key = record(key)
        return (
            isinstance(key, SubKey)
            and key.home == self.addr
            and key.sub in own
            and not any(key.sub in f for f in fixed)
        )

    def after_step(
        self,
        ring: RingNode,
        router: ContentRouter,
        adopted: Mapping[Hashable, tuple[int, Hashable]],
        dead: Collection[int],
        *,
        changed: bool,
        flows: Collection[Hashable] = (),
    ) -> list[Effect]:
        """After a ring step (``changed``: its state changed from outside): ours acknowledged
        elsewhere no longer routed here, ours back in our state (taken over from their
        holder) routed again; who hosts what (``adopted`` subs, ``dead`` addresses, ``flows``
        the deployed flows' subscriptions and partitions served here: see :meth:`host`)."""
        out: list[Effect] = []
        if ring.shares.placed:
            placed, ring.shares.placed = ring.shares.placed, {}
            for sub in self.placed(placed):
                if self.addr in router.directions((self.addr, sub)):
                    out.extend(router.drop((self.addr, sub)))
        if changed:
            for sub in self.back(ring.state):
                text = ring.state[sub_key(sub, self.addr)]
                out.extend(
                    router.adopt((self.addr, sub), parse(text[0] if isinstance(text, tuple) else text))
                )
            self.host(adopted, dead, flows)
        return out

    def placed(self, keys: Mapping[Hashable, int]) -> list[Hashable]:
        """Acknowledged shares (entry -> holder): the sub ids of ours to drop from the router."""
        gone = []
        for key, holder in keys.items():
            key = record(key)  # (off the wire: a share's acknowledgement)
            if isinstance(key, SubKey) and key.home == self.addr:
                self.out[key.sub] = holder
                gone.append(key.sub)
        return gone

    def back(self, state: Collection[Hashable]) -> list[Hashable]:
        """Subscriptions of ours held elsewhere whose entries are in our ``state`` again (the
        holder died and we took its state over): ours to route again."""
        came = [s for s in self.out if sub_key(s, self.addr) in state]
        for s in came:
            del self.out[s]
        return came

    def host(
        self,
        adopted: Mapping[Hashable, tuple[int, Hashable]],
        dead: Collection[int],
        flows: Collection[Hashable] = (),
    ) -> None:
        """The adopted subscriptions whose home is another, live broker (a refused one still
        waiting for its events to come back, too). Not a deployed flow's subscription or
        partition (``flows``): never shared (:meth:`movable`), one has a live home here only
        when it was taken over (twice, say) from a broker whose address now speaks for a new
        member we never knew was one. Its deliveries are transformed here before they are
        redirected: a :class:`Delegated` carried the derived event, the new member sent it
        back, and our edge transformed it again, into nothing (acknowledged, lost)."""
        self.pending = {s: p for s, p in self.pending.items() if p[0] not in dead}
        self.hosted = {
            s: home
            for s, (home, _) in adopted.items()
            if home != self.addr
            and home not in dead
            and s not in flows
            and (s not in self.refused or s in self.pending)
        }

    def undelegated(self, msg: Undelegated, served: Collection[Hashable], grouped: bool) -> list[Effect]:
        """Our :class:`Delegated` came back: those subscriptions are ours to deliver (see the
        module note): once the last one sent for a subscription is back, its later events are
        delivered here at once."""
        self.refused.update(msg.subs)
        eid = msg.event.get(EVENT_ID)
        for s in msg.subs:
            last = self.pending.get(s)
            if last is None or last[1] == eid:
                self.pending.pop(s, None)
                self.hosted.pop(s, None)
        subs = tuple(s for s in msg.subs if s in served)
        if not subs:
            return []
        if eid is not None and any(s in self.hosted for s in subs):  # (still going round: not again)
            self._back.add(eid)
        return [DeliverAll(subs, msg.event)] if grouped else [Deliver(s, msg.event) for s in subs]

    def unshare(self, sub_id: Hashable) -> list[Effect]:
        """Our subscription ``sub_id`` held elsewhere ended: tell its holder."""
        holder = self.out.pop(sub_id)
        self.ended.add(sub_id)
        return [Send(holder, Unshare((sub_key(sub_id, self.addr),)))]

    def redirect(self, effects: Iterable[Effect]) -> list[Effect]:
        """Deliveries to hosted subscriptions become :class:`Delegated` sends to their home
        (not those of an event that came back from it in this step)."""
        hosted, back = self.hosted, self._back
        out: list[Effect] = []
        for e in effects:
            if back and _event_id(e) in back:
                out.append(e)
            elif type(e) is DeliverAll and not hosted.keys().isdisjoint(e.subs):
                mine = tuple(s for s in e.subs if s not in hosted)
                if mine:
                    out.append(DeliverAll(mine, e.event))
                out.extend(self._home(hosted, [s for s in e.subs if s in hosted], e.event))
            elif type(e) is Deliver and e.sub in hosted:
                out.extend(self._home(hosted, [e.sub], e.event))
            else:
                out.append(e)
        back.clear()
        return out

    def _home(self, hosted: Mapping[Hashable, int], subs: list[Hashable], event: Any) -> list[Effect]:
        by_home: dict[int, list[Hashable]] = {}
        eid = event.get(EVENT_ID)
        for s in subs:
            by_home.setdefault(hosted[s], []).append(s)
            self.pending[s] = (hosted[s], eid)
        self.delegated += len(subs)
        return [Send(home, Delegated(tuple(ss), event)) for home, ss in sorted(by_home.items())]

    def deliveries(
        self, src: int, msg: Delegated, served: Collection[Hashable], grouped: bool
    ) -> list[Effect]:
        """A holder's :class:`Delegated`: the deliveries to those of its subscriptions still
        served here; those not served go back to the holder (:class:`Undelegated`)."""
        subs = tuple(s for s in msg.subs if s in served)
        self.received += len(subs)
        out: list[Effect] = []
        back = tuple(s for s in msg.subs if s not in served and s not in self.ended)
        if back:
            out.append(Send(src, Undelegated(back, msg.event)))
        if subs:
            out.extend([DeliverAll(subs, msg.event)] if grouped else [Deliver(s, msg.event) for s in subs])
        return out


def _event_id(e: Effect) -> Any:
    """The id of the event a delivery carries (None if it is not one)."""
    if type(e) is Deliver or type(e) is DeliverAll:
        event = e.event
        return event.get(EVENT_ID) if isinstance(event, Mapping) else None
    return None
