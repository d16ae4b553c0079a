"""CBR: covering-based content routing between brokers of an acyclic overlay (sans-IO core).

How it works (the pub/sub lecture, 001: "subscription forwarding", "covering"; Siena and
PADRES style routing on a tree of brokers):

* Routing table: for each direction -- each neighbour broker, and the broker itself for its
  local clients -- the subscriptions that came from it, keyed by their origin
  ``(broker, sub_id)`` so a duplicate or a removal is exact.
* Subscription forwarding with covering: towards each neighbour ``m`` a broker forwards the
  *roots* of its candidates for ``m`` (the subscriptions of every other direction): those no
  other candidate dominates. ``a`` dominates ``b`` if ``a``'s filter covers ``b``'s and, when
  the two cover each other (identical filters, say), ``a`` has the smaller origin. So the
  forwarded set only depends on the current subscriptions, never on their order: a new
  subscription a forwarded root dominates is not sent; one that dominates roots withdraws
  them (listed in its ``Subscribe.withdraw``: one message, not one per withdrawn root); an
  unsubscription of a root re-exposes the candidates it was hiding that no remaining
  candidate dominates. ``covering=False`` forwards every candidate.
* Events: reverse path forwarding. An event from direction ``d`` (or published locally) is
  delivered to the matching local subscriptions (in the order they were subscribed here) and
  sent once to each neighbour ``m != d`` from which a matching filter came, in ascending
  order. On a tree every matching subscriber gets it exactly once. ``route_batch`` routes
  many events at once: the effects of routing each in turn.
* Reordering: each ``Subscribe``/``Unsubscribe`` carries the sender's sequence number; the
  receiver keeps the last one per (neighbour, origin) -- a tombstone after a removal -- and
  ignores older messages, so a link need not be FIFO.
* Topology changes (``set_neighbours``, the overlay's failure repair): a removed neighbour's
  subscriptions are dropped (and withdrawn from the others where they were roots); an added
  neighbour gets every root of its candidates. Since what is forwarded is a function of the
  tables, once messages settle the state equals that of building the final tree from scratch.
* Advertisements (``advertising=True``; off by default, and then nothing below happens):
  ``advertise(adv_id, filter)`` says publishers at this broker will publish events matching
  ``filter``. ``Advertise``/``Unadvertise`` are flooded along the tree (to every neighbour but
  the one they came from), with the same per-link sequence numbers and tombstones as
  subscriptions; an added neighbour gets every advertisement from the other directions, a
  removed one's are dropped and withdrawn beyond. A subscription is then a candidate for
  neighbour ``m`` only if its filter *overlaps* (:func:`~flowbus.filters.covering.overlaps`:
  some event might match both) an advertisement that came from ``m``: no subscription goes
  towards a branch with no publisher for it. When the advertisements from ``m`` change, the
  roots of ``m``'s candidates are computed again and the difference sent (a late advertisement
  pulls the subscriptions in, an unadvertisement withdraws them). Events are routed as before;
  a local publish no local advertisement matches is refused (``ProtocolError``), so every
  event published comes from a broker whose advertisements lead the subscriptions to it.
* Indexes (:mod:`flowbus.routing.cbr_index`), which change the cost, never the answer:

  - Each direction's filters are in a route index: a :class:`~flowbus.matching.Matcher`
    from 32 filters on (one ``match_batch`` per direction and batch of events), compiled
    closures below. Its sub ids are ints given in insertion order, so its sorted answers
    are in subscription order.
  - The roots forwarded to each neighbour (and, from the first re-exposure on, each
    direction's table) are in a covering index. Asked which entries may cover a filter, or
    which the filter may cover, it returns a superset of the answer, narrowed by necessary
    conditions: where a cover pins an attribute to one value (``symbol = "S1"``) the covered
    filter pins it to the same value, the cover's numbers' hull holds the covered one's, its
    finite string sets hold the covered one's. Only the candidates get the exact test, and
    where the order matters (re-exposed candidates) they are taken in the full scan's order,
    so the messages, their order and their withdraw lists are the full scan's. An insertion
    costs about its buckets' candidates instead of a test per root.

Not implemented: garbage collection of tombstones; on a ``handover`` the dead broker's own
advertisements are kept, as coming from its replacement. Messages from a former
neighbour (in flight when its link was removed) are dropped and counted in ``dropped``; a
link re-added while messages of its earlier incarnation are still in flight may keep them.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flowbus import wire
from flowbus.core import Core, Deliver, DeliverAll, Effect, Send
from flowbus.errors import ProtocolError
from flowbus.filters import Filter
from flowbus.filters.covering import overlaps
from flowbus.routing.cbr_index import CoverIndex, Forwarded, RouteIndex
from flowbus.routing.memo import compiled, covers

__all__ = [
    "Advertise",
    "ContentRouter",
    "Origin",
    "Publish",
    "RoutingState",
    "Subscribe",
    "Unadvertise",
    "Unsubscribe",
]

Origin = tuple[int, Hashable]
"""Who subscribed: (the subscriber's broker, its subscription id there)."""

RoutingState = tuple[dict[int, dict[Origin, Filter]], dict[int, dict[Origin, Filter]]]
"""(filters received per direction, filters forwarded per neighbour); empty maps left out."""


# ------------------------------------------------------------------------------- messages


def _check_origin(origin: Any, where: str) -> None:
    if not (isinstance(origin, tuple) and len(origin) == 2 and type(origin[0]) is int):
        raise ProtocolError(f"{where}: an origin is (broker id, sub id), got {origin!r}")


@wire.message("cbr.subscribe")
@dataclass(frozen=True, slots=True)
class Subscribe:
    """``origin`` wants ``filter``; ``seq`` orders the sender's messages on this link.
    ``withdraw``: origins the sender no longer forwards (mostly those this one covers),
    each as if by an ``Unsubscribe`` with the same ``seq`` -- one message instead of many."""

    origin: Origin
    filter: Filter
    seq: int
    withdraw: tuple[Origin, ...] = ()

    def __post_init__(self) -> None:
        _check_origin(self.origin, "Subscribe")
        if not isinstance(self.filter, Filter):
            raise ProtocolError(f"Subscribe: a Filter is needed, got {self.filter!r}")
        for w in self.withdraw:
            _check_origin(w, "Subscribe.withdraw")
        if self.origin in self.withdraw:
            raise ProtocolError(f"Subscribe: {self.origin!r} both added and withdrawn")


@wire.message("cbr.unsubscribe")
@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """``origin``'s subscription no longer comes from the sender's side."""

    origin: Origin
    seq: int

    def __post_init__(self) -> None:
        _check_origin(self.origin, "Unsubscribe")


@wire.message("cbr.advertise")
@dataclass(frozen=True, slots=True)
class Advertise:
    """Publishers at ``origin``'s broker will publish events matching ``filter`` (an
    advertisement, flooded along the tree); ``seq`` orders the sender's messages on this link."""

    origin: Origin
    filter: Filter
    seq: int

    def __post_init__(self) -> None:
        _check_origin(self.origin, "Advertise")
        if not isinstance(self.filter, Filter):
            raise ProtocolError(f"Advertise: a Filter is needed, got {self.filter!r}")


@wire.message("cbr.unadvertise")
@dataclass(frozen=True, slots=True)
class Unadvertise:
    """``origin``'s advertisement no longer comes from the sender's side."""

    origin: Origin
    seq: int

    def __post_init__(self) -> None:
        _check_origin(self.origin, "Unadvertise")


@wire.message("cbr.publish")
@dataclass(frozen=True, slots=True)
class Publish:
    event: Mapping[str, Any]


# ------------------------------------------------------------------------------- filters


def _okey(o: Origin) -> tuple[int, str]:
    return (o[0], repr(o[1]))


def _newer(seen: dict[Origin, int], o: Origin, seq: int) -> bool:
    """Whether ``seq`` is newer than the last message about ``o`` from one neighbour (then
    recorded); an older one was overtaken by a newer message about the same origin."""
    if seq <= seen.get(o, -1):
        return False
    seen[o] = seq
    return True


def _dominates(a: Origin, fa: Filter, b: Origin, fb: Filter) -> bool:
    """``a`` makes ``b`` unnecessary: it covers it, strictly or with a smaller origin."""
    return covers(fa, fb) and (not covers(fb, fa) or _okey(a) < _okey(b))


def _roots(entries: Iterable[tuple[Origin, Filter]]) -> dict[Origin, Filter]:
    """The entries no other entry dominates (the maximal ones: domination is a strict order)."""
    roots: dict[Origin, Filter] = {}
    index = CoverIndex()  # the roots so far
    for o, f in entries:
        if not any(_dominates(r, g, o, f) for r, g in index.covered_by(f)):
            for r in [r for r, g in index.covering(f) if _dominates(o, f, r, g)]:
                del roots[r]
                index.remove(r)
            roots[o] = f
            index.add(o, f)
    return roots


# -------------------------------------------------------------------------------- router


class ContentRouter(Core):
    """The content-based routing layer of one broker of a tree of brokers (sans-IO).

    ``Send.dst`` is a neighbour broker id; local subscribers get ``Deliver(sub_id, event)``
    (with ``grouped``, one ``DeliverAll(sub_ids, event)`` per event). The direction of local
    subscriptions is the broker's own id.
    """

    __slots__ = (
        "_adv",
        "_adv_dirs",
        "_adv_seen",
        "_cover",
        "_dirs",
        "_eligible",
        "_former",
        "_match",
        "_neighbours",
        "_next_order",
        "_order",
        "_seen",
        "_sent",
        "_seq",
        "_stale",
        "_table",
        "advertising",
        "broker",
        "changes",
        "covering",
        "dropped",
        "grouped",
    )

    def __init__(
        self,
        broker: int,
        neighbours: Iterable[int],
        *,
        covering: bool = True,
        advertising: bool = False,
        grouped: bool = False,
    ) -> None:
        if type(broker) is not int:
            raise ProtocolError(f"ContentRouter: a broker id is an int, got {broker!r}")
        self.broker = broker
        self.covering = covering
        self.advertising = advertising
        self.grouped = grouped
        self.dropped = 0  # messages from former neighbours, ignored
        self.changes = 0  # how many times a filter of the tables was set or removed
        self._neighbours: set[int] = set()
        self._former: set[int] = set()
        # direction -> origin -> filter (received), and origin -> direction -> filter
        self._table: dict[int, dict[Origin, Filter]] = {broker: {}}
        self._dirs: dict[Origin, dict[int, Filter]] = {}
        self._order: dict[Origin, int] = {}  # origin -> its rank in _dirs' insertion order
        self._next_order = 0
        self._match: dict[int, RouteIndex] = {broker: RouteIndex()}  # direction -> _table's filters
        self._cover: dict[int, CoverIndex] | None = None  # the same, for covering (once needed)
        self._sent: dict[int, Forwarded] = {}  # neighbour -> forwarded roots
        self._seen: dict[int, dict[Origin, int]] = {}  # neighbour -> origin -> last seq
        self._seq = 0
        self._stale: dict[int, set[Origin]] = {}  # renewed neighbour -> its predecessor's origins
        # advertisements: direction -> origin -> filter, origin -> direction -> filter, and
        # neighbour -> origin -> last seq; per neighbour, memoised "overlaps one of its adverts"
        self._adv: dict[int, dict[Origin, Filter]] = {broker: {}}
        self._adv_dirs: dict[Origin, dict[int, Filter]] = {}
        self._adv_seen: dict[int, dict[Origin, int]] = {}
        self._eligible: dict[int, dict[Filter, bool]] = {}
        self._add_neighbours(self._checked(neighbours))

    # -- local calls

    @property
    def neighbours(self) -> frozenset[int]:
        return frozenset(self._neighbours)

    @property
    def former(self) -> frozenset[int]:
        """Brokers that were neighbours once and are not any more."""
        return frozenset(self._former - self._neighbours)

    def subscribe(self, sub_id: Hashable, filt: Filter) -> list[Effect]:
        if not isinstance(filt, Filter):
            raise ProtocolError(f"broker {self.broker}: subscribe needs a Filter, got {filt!r}")
        if (self.broker, sub_id) in self._table[self.broker]:
            raise ProtocolError(f"broker {self.broker}: subscription {sub_id!r} exists already")
        return self._set(self.broker, (self.broker, sub_id), filt)

    def unsubscribe(self, sub_id: Hashable) -> list[Effect]:
        if (self.broker, sub_id) not in self._table[self.broker]:
            raise ProtocolError(f"broker {self.broker}: no subscription {sub_id!r}")
        return self._set(self.broker, (self.broker, sub_id), None)

    def advertise(self, adv_id: Hashable, filt: Filter) -> list[Effect]:
        """Publishers here will publish events matching ``filt`` (advertising on only)."""
        if not self.advertising:
            raise ProtocolError(f"broker {self.broker}: advertising is off")
        if not isinstance(filt, Filter):
            raise ProtocolError(f"broker {self.broker}: advertise needs a Filter, got {filt!r}")
        if (self.broker, adv_id) in self._adv[self.broker]:
            raise ProtocolError(f"broker {self.broker}: advertisement {adv_id!r} exists already")
        return self._adv_set(self.broker, (self.broker, adv_id), filt)

    def unadvertise(self, adv_id: Hashable) -> list[Effect]:
        if not self.advertising:
            raise ProtocolError(f"broker {self.broker}: advertising is off")
        if (self.broker, adv_id) not in self._adv[self.broker]:
            raise ProtocolError(f"broker {self.broker}: no advertisement {adv_id!r}")
        return self._adv_set(self.broker, (self.broker, adv_id), None)

    def publish(self, event: Mapping[str, Any]) -> list[Effect]:
        return self.route_batch([event], self.broker)

    def route_batch(self, events: Sequence[Mapping[str, Any]], src: int) -> list[Effect]:
        """Route ``events`` that came from direction ``src`` (the broker's own id: published
        here): the effects of routing each in turn, with one matching pass per direction.

        Per event: ``Deliver`` to each matching local subscription (in the order they were
        subscribed here; with ``grouped``, one ``DeliverAll`` for them), then one ``Send`` of the
        same ``Publish`` to each neighbour other than ``src`` with a matching filter, in ascending
        neighbour order."""
        if src != self.broker and src not in self._neighbours:
            raise ProtocolError(f"broker {self.broker}: events from {src}, not a neighbour")
        if not isinstance(events, list):
            events = list(events)
        if not events:
            return []
        if self.advertising and src == self.broker:
            self._check_advertised(events)
        local = self._match[self.broker].match(events) if self._table[self.broker] else None
        sends = [
            (m, self._match[m].any_match(events))
            for m in sorted(self._neighbours)
            if m != src and self._table[m]
        ]
        out: list[Effect] = []
        grouped = self.grouped
        for i, event in enumerate(events):
            if local is not None and local[i]:
                if grouped:
                    out.append(DeliverAll(tuple([o[1] for o in local[i]]), event))
                else:
                    out += [Deliver(o[1], event) for o in local[i]]
            if sends:
                msg: Publish | None = None
                for m, hit in sends:
                    if hit[i]:
                        msg = msg or Publish(event)
                        out.append(Send(m, msg))
        return out

    def set_neighbours(
        self, new: Iterable[int], *, handover: Mapping[int, int] | None = None
    ) -> list[Effect]:
        """Change the broker's links: drop what removed neighbours sent, send added ones
        every root of their candidates.

        ``handover`` maps a removed neighbour to the added one that replaces it (a dead
        broker's place in the tree, taken by the broker beyond it). What came from the
        removed one is kept as coming from its replacement, not withdrawn, so routing goes
        on while the replacement's own subscriptions arrive (make before break); what the
        replacement never sends (the dead broker's own subscriptions) stays in its direction
        until a routing message replaces or withdraws it (their taker's, once it adopted them)."""
        wanted = self._checked(new)
        out: list[Effect] = []
        for r, h in sorted((handover or {}).items()):
            if r in self._neighbours and r not in wanted and h in wanted and h not in self._neighbours:
                self._move(r, h)
        for r in sorted(self._neighbours - wanted):
            self._neighbours.discard(r)
            self._former.add(r)
            del self._sent[r], self._seen[r], self._adv_seen[r]
            self._eligible.pop(r, None)
            self._stale.pop(r, None)
            for o in list(self._adv[r]):
                out.extend(self._adv_set(r, o, None))
            for o in list(self._table[r]):
                out.extend(self._set(r, o, None))
            del self._table[r], self._match[r], self._adv[r]
            if self._cover is not None:
                del self._cover[r]
        out.extend(self._add_neighbours(wanted - self._neighbours))
        return out

    # -- the driver's entry point

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        match msg:
            case Publish():
                return [] if self._dropped(src, msg) else self._route(msg.event, src)
            case Subscribe():
                if self._dropped(src, msg):
                    return []
                out = self._receive(src, msg.origin, msg.filter, msg.seq)
                for w in msg.withdraw:  # the covered ones go after their cover came: nothing re-exposed
                    out.extend(self._receive(src, w, None, msg.seq))
                return out
            case Unsubscribe():
                return [] if self._dropped(src, msg) else self._receive(src, msg.origin, None, msg.seq)
            case Advertise() | Unadvertise() if not self.advertising:
                raise ProtocolError(f"broker {self.broker}: {type(msg).__name__} but advertising is off")
            case Advertise():
                return [] if self._dropped(src, msg) else self._advert(src, msg.origin, msg.filter, msg.seq)
            case Unadvertise():
                return [] if self._dropped(src, msg) else self._advert(src, msg.origin, None, msg.seq)
            case _:
                raise ProtocolError(f"broker {self.broker}: unknown message {msg!r} from {src}")

    def _dropped(self, src: int, msg: Any) -> bool:
        """A message from a former neighbour is dropped (and counted); one from a broker that
        never was a neighbour is an error."""
        if src in self._neighbours:
            return False
        if src in self._former:
            self.dropped += 1
            return True
        raise ProtocolError(f"broker {self.broker}: {type(msg).__name__} from {src}, not a neighbour")

    def _advert(self, src: int, o: Origin, f: Filter | None, seq: int) -> list[Effect]:
        """An advertisement (``f``) or its removal (None) from neighbour ``src``."""
        return self._adv_set(src, o, f) if _newer(self._adv_seen[src], o, seq) else []

    def prepare(self) -> None:
        """Build now what the next events would build first (each direction's matcher, up to
        date with the tables): for a quiet moment after the subscriptions changed."""
        for index in self._match.values():
            index.prepare()

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        raise ProtocolError(f"broker {self.broker}: no timer {key!r} (the router sets none)")

    # -- inspection (tests, experiments)

    def table_size(self) -> dict[int, int]:
        """Subscriptions received per direction (the broker's own id: local ones)."""
        return {d: len(t) for d, t in self._table.items()}

    def forwarded_size(self) -> dict[int, int]:
        """Subscriptions forwarded to (and held by) each neighbour."""
        return {m: len(s) for m, s in self._sent.items()}

    def advertisements(self) -> dict[int, dict[Origin, Filter]]:
        """The advertisements known here per direction (the broker's own id: local ones)."""
        return {d: dict(t) for d, t in self._adv.items() if t}

    def routing_state(self) -> RoutingState:
        tables = {d: dict(t) for d, t in self._table.items() if t}
        sent = {m: dict(s.map) for m, s in self._sent.items() if s}
        return tables, sent

    # -- transitions

    def _checked(self, neighbours: Iterable[int]) -> set[int]:
        out = set()
        for n in neighbours:
            if type(n) is not int or n == self.broker:
                raise ProtocolError(f"broker {self.broker}: bad neighbour {n!r}")
            out.add(n)
        return out

    def adopt(self, origin: Origin, filt: Filter, *, keep: Collection[int] = ()) -> list[Effect]:
        """Serve another broker's subscription here, under its own origin (a dead broker's,
        taken over): the tables elsewhere stay valid, only its direction changes. Directions
        in ``keep`` hold on to it too (a dead neighbour kept in the tree until its place is
        taken: the entry may cover subscriptions beyond it that were never sent here; taken
        out, nothing was routed that way)."""
        _check_origin(origin, "adopt")
        out = self._set(self.broker, origin, filt)
        for d in sorted(self._dirs.get(origin, {})):
            if d != self.broker and d not in keep:
                out.extend(self._set(d, origin, None))
        return out

    def renew(self, neighbour: int) -> list[Effect]:
        """``neighbour``'s address now speaks for another broker (one restarted on it): what
        came from the one before stays, as coming from the new one, until the new one's
        table is whole here (:meth:`synced`); what it has not sent again by then goes.
        Dropped at once, its withdrawal went up the tree, and the brokers beyond routed that
        side's events nowhere until the new one's subscriptions came round (a campaign run:
        events published at that moment lost there). Its sequence numbers start afresh; it
        gets our advertisements and roots again (it knows nothing of this side)."""
        if neighbour not in self._neighbours:
            raise ProtocolError(f"broker {self.broker}: {neighbour} to renew is not a neighbour")
        self._stale.setdefault(neighbour, set()).update(self._table[neighbour])
        self._seen[neighbour] = {}
        self._adv_seen[neighbour] = {}
        return self.resend(neighbour)

    def synced(self, neighbour: int) -> list[Effect]:
        """``neighbour``'s table is whole here (its ``Synced``): of what came from the broker
        before it on its address (:meth:`renew`), what it did not send again goes."""
        stale = self._stale.pop(neighbour, None)
        if not stale or neighbour not in self._neighbours:
            return []
        out: list[Effect] = []
        for o in sorted(stale & self._table[neighbour].keys(), key=self._order.__getitem__):
            out.extend(self._set(neighbour, o, None))
        return out

    def resend(self, dst: int) -> list[Effect]:
        """What this router forwarded to neighbour ``dst`` (its advertisements and roots), sent
        again with new sequence numbers: its link broke, and what was in it may be lost. The
        receiver keeps the last message per origin, so nothing is doubled; a withdrawal that
        was lost leaves a stale entry there (the events it draws are routed nowhere here)."""
        if dst not in self._neighbours:
            return []
        out: list[Effect] = []
        for o in self._adv_dirs:
            if (g := self._adv_cand(dst, o)) is not None:
                out.append(Send(dst, Advertise(o, g, self._next())))
        out.extend(Send(dst, Subscribe(o, f, self._next())) for o, f in self._sent[dst].map.items())
        return out

    def received_from(self, neighbour: int) -> dict[Origin, Filter]:
        """The subscriptions that came from ``neighbour`` (a copy)."""
        return dict(self._table.get(neighbour, {}))

    def announced(self, neighbour: int, origin: Origin) -> bool:
        """Whether ``neighbour`` itself sent word of ``origin`` (not what came from the broker
        whose place it took in the tree, :meth:`set_neighbours`)."""
        return origin in self._seen.get(neighbour, ())

    def directions(self, origin: Origin) -> frozenset[int]:
        """The directions ``origin`` comes from here (the broker's own id: local)."""
        return frozenset(self._dirs.get(origin, {}))

    def toward(self, home: int, event: Mapping[str, Any]) -> set[int]:
        """The neighbours from which subscriptions made at broker ``home`` that ``event``
        matches came here (served elsewhere now, under their own origin). A scan of every
        origin: for rare events (a hand-over relayed towards a dead broker's taker)."""
        return {
            d
            for o, dirs in self._dirs.items()
            if o[0] == home
            for d, f in dirs.items()
            if d != self.broker and f.matches(event)
        }

    def drop(self, origin: Origin) -> list[Effect]:
        """Stop serving a local (own or adopted) subscription."""
        if origin not in self._table[self.broker]:
            raise ProtocolError(f"broker {self.broker}: no local subscription {origin!r}")
        return self._set(self.broker, origin, None)

    def _move(self, old: int, new: int) -> None:
        """Direction ``old`` becomes direction ``new`` (see :meth:`set_neighbours`)."""
        table = self._table.pop(old)
        for o in table:
            dirs = self._dirs[o]
            dirs[new] = dirs.pop(old)
        self._table[new] = table
        self._match[new] = self._match.pop(old)
        if self._cover is not None:
            self._cover[new] = self._cover.pop(old)
        self._adv[new] = self._adv.pop(old)
        for o in self._adv[new]:
            dirs = self._adv_dirs[o]
            dirs[new] = dirs.pop(old)
        self._eligible.pop(old, None)
        self._neighbours.discard(old)
        self._former.add(old)
        del self._sent[old], self._seen[old], self._adv_seen[old]

    def _add_neighbours(self, added: Iterable[int]) -> list[Effect]:
        out: list[Effect] = []
        for a in sorted(added):
            self._neighbours.add(a)
            self._former.discard(a)
            self._table.setdefault(a, {})
            self._match.setdefault(a, RouteIndex())
            if self._cover is not None:
                self._cover.setdefault(a, CoverIndex())
            self._seen[a] = {}
            self._adv.setdefault(a, {})
            self._adv_seen[a] = {}
            self._eligible.pop(a, None)
            for o in self._adv_dirs:  # every advertisement known from the other directions
                if (g := self._adv_cand(a, o)) is not None:
                    out.append(Send(a, Advertise(o, g, self._next())))
            cands = [(o, f) for o in self._dirs if (f := self._cand(a, o)) is not None]
            roots = _roots(cands) if self.covering else dict(cands)
            self._sent[a] = Forwarded(roots)
            out.extend(Send(a, Subscribe(o, f, self._next())) for o, f in roots.items())
        return out

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _route(self, event: Mapping[str, Any], src: int) -> list[Effect]:
        return self.route_batch([event], src)

    def _receive(self, src: int, o: Origin, f: Filter | None, seq: int) -> list[Effect]:
        """A subscription (``f``) or its removal (None) from neighbour ``src``."""
        if not _newer(self._seen[src], o, seq):
            return []
        if self._stale:
            stale = self._stale.get(src)
            if stale is not None:
                stale.discard(o)
        return self._set(src, o, f)

    def _cand(self, m: int, o: Origin) -> Filter | None:
        """``o``'s filter as a candidate for neighbour ``m``: from its smallest direction
        other than ``m`` (on a settled tree an origin comes from one direction only); with
        advertising, only if it overlaps an advertisement that came from ``m``."""
        dirs = self._dirs.get(o)
        if not dirs:
            return None
        ds = [d for d in dirs if d != m]
        if not ds:
            return None
        f = dirs[min(ds)]
        if self.advertising and not self._wanted_by(m, f):
            return None
        return f

    # -- advertisements

    def _wanted_by(self, m: int, f: Filter) -> bool:
        """Does ``f`` overlap an advertisement from neighbour ``m`` (memoised until they change)?"""
        memo = self._eligible.get(m)
        if memo is None:
            memo = self._eligible[m] = {}
        hit = memo.get(f)
        if hit is None:
            hit = memo[f] = any(overlaps(a, f) for a in set(self._adv[m].values()))
        return hit

    def _adv_cand(self, m: int, o: Origin) -> Filter | None:
        """Advertisement ``o`` as flooded to ``m``: from its smallest direction other than ``m``."""
        dirs = self._adv_dirs.get(o)
        if not dirs:
            return None
        ds = [d for d in dirs if d != m]
        return dirs[min(ds)] if ds else None

    def _adv_set(self, d: int, o: Origin, f: Filter | None) -> list[Effect]:
        """Direction ``d`` now advertises ``o`` with filter ``f`` (None: no longer): flood the
        change, and if ``d`` is a neighbour, update what is forwarded to it."""
        others = sorted(m for m in self._neighbours if m != d)
        before = [self._adv_cand(m, o) for m in others]
        table = self._adv[d]
        was = table.get(o)
        dirs = self._adv_dirs.get(o)
        if f is None:
            table.pop(o, None)
            if dirs is not None:
                dirs.pop(d, None)
                if not dirs:
                    del self._adv_dirs[o]
        else:
            table[o] = f
            if dirs is None:
                dirs = self._adv_dirs[o] = {}
            dirs[d] = f
        out: list[Effect] = []
        for m, old in zip(others, before, strict=True):
            new = self._adv_cand(m, o)
            if old != new:
                msg = Unadvertise(o, self._next()) if new is None else Advertise(o, new, self._next())
                out.append(Send(m, msg))
        if was != f and d in self._neighbours:
            out.extend(self._refresh(d))
        return out

    def _refresh(self, m: int) -> list[Effect]:
        """The advertisements from ``m`` changed: forward to ``m`` the roots of its eligible
        candidates now, and send the difference."""
        self._eligible.pop(m, None)
        cands = [(o, f) for o in self._dirs if (f := self._cand(m, o)) is not None]
        want = _roots(cands) if self.covering else dict(cands)
        sent = self._sent[m]
        for o in [o for o, g in sent.map.items() if want.get(o) != g]:
            sent.pop(o)
        for o, f in want.items():
            if o not in sent:
                sent.put(o, f)
        return self._messages(m)

    def _check_advertised(self, events: Sequence[Mapping[str, Any]]) -> None:
        """Refuse (before any effect) events published here that no local advertisement matches."""
        tests = [compiled(f) for f in set(self._adv[self.broker].values())]
        for event in events:
            if not any(t(event) for t in tests):
                raise ProtocolError(f"broker {self.broker}: no local advertisement matches {event!r}")

    def _set(self, d: int, o: Origin, f: Filter | None) -> list[Effect]:
        """Direction ``d`` now sends ``o`` with filter ``f`` (None: no longer)."""
        self.changes += 1
        others = sorted(m for m in self._neighbours if m != d)
        before = [self._cand(m, o) for m in others]
        dirs = self._dirs.get(o)
        if f is None:
            if self._table[d].pop(o, None) is not None:
                self._match[d].remove(o)
                if self._cover is not None:
                    self._cover[d].remove(o)
            if dirs is not None:
                dirs.pop(d, None)
                if not dirs:
                    del self._dirs[o], self._order[o]
        else:
            self._table[d][o] = f
            self._match[d].put(o, f)
            if self._cover is not None:
                self._cover[d].add(o, f)
            if dirs is None:
                dirs = self._dirs[o] = {}
                self._order[o] = self._next_order
                self._next_order += 1
            dirs[d] = f
        out: list[Effect] = []
        for m, old in zip(others, before, strict=True):
            new = self._cand(m, o)
            if old != new:
                out.extend(self._update(m, o, old, new))
        return out

    def _update(self, m: int, o: Origin, old: Filter | None, new: Filter | None) -> list[Effect]:
        """``o``'s candidate filter for ``m`` went from ``old`` to ``new``: keep the roots
        forwarded to ``m`` up to date and send the difference."""
        sent = self._sent[m]
        if not self.covering:
            if new is None:
                sent.pop(o)
            else:
                sent.put(o, new)
        else:
            if old is not None and sent.get(o) == old:
                sent.pop(o)
                for r, g in self._exposed(m, o, old).items():
                    sent.put(r, g)
            if new is not None and not any(_dominates(r, g, o, new) for r, g in sent.index.covered_by(new)):
                for r in [r for r, g in sent.index.covering(new) if _dominates(o, new, r, g)]:
                    sent.pop(r)
                sent.put(o, new)
        return self._messages(m)

    def _messages(self, m: int) -> list[Effect]:
        """The messages for what changed in the roots forwarded to ``m``."""
        sent = self._sent[m]
        gone, added = sent.changes()
        if not added:
            return [Send(m, Unsubscribe(r, self._next())) for r in gone]
        # (what goes rides on the last addition: make before break. On the first, a cover
        # that left took its hidden subscriptions' way with it until the others came)
        *first, (r, g) = added
        out: list[Effect] = [Send(m, Subscribe(o, f, self._next())) for o, f in first]
        out.append(Send(m, Subscribe(r, g, self._next(), gone)))
        return out

    def _exposed(self, m: int, gone: Origin, f: Filter) -> dict[Origin, Filter]:
        """The candidates for ``m`` that the root (``gone``, ``f``) hid and that no remaining
        root dominates, reduced to their own roots (the new roots of ``m``)."""
        sent = self._sent[m]
        # an origin whose candidate f covers is in a table whose index finds it
        if self._cover is None:  # (subscribing alone never needs it)
            self._cover = {d: CoverIndex(t.items()) for d, t in self._table.items()}
        found = {o for index in self._cover.values() for o, _ in index.covering(f)}
        hidden: list[tuple[Origin, Filter]] = []
        for o in sorted(found, key=self._order.__getitem__):  # in _dirs' order
            g = self._cand(m, o)
            if (
                g is not None
                and o != gone
                and o not in sent
                and _dominates(gone, f, o, g)
                and not any(_dominates(r, h, o, g) for r, h in sent.index.covered_by(g))
            ):
                hidden.append((o, g))
        return _roots(hidden)
