"""IRBR: id-range based content routing over Pastry (sans-IO core).

How it works (the IRBR paper, "基于编码区间的路由协议", section 3):

* Id ranges (section 2, table 1): seen from node n, the id space splits into the sub-ranges
  of its routing table: row r, column d (d != n's digit r) is the range of ids that share
  exactly r digits with n and have digit d at position r -- the :data:`Prefix`
  ``(r + 1, first r + 1 digits)``. Every other id is n itself, the prefix ``(32, n)``.
* Filter table (section 3.1): ``FT^n = {(prefix, filter)}``: "some node of the range
  ``prefix`` wants the events of ``filter``". :class:`FilterTable` files a subscription of
  node s under the range of s seen from n (its own id for n's local subscriptions) and
  keeps, per entry, the subscriber, its subscription id and its Lamport clock.
* Publish (section 3.2): source-based forwarding down the spanning tree rooted at the
  publisher. A node responsible for the range ``(L, p)`` (the root: ``(0, 0)``, everything)
  delegates each of its row r >= L sub-ranges to that routing-table entry, *only if* some
  filter of that sub-range in its FT matches the event (pruning); every id lies in exactly
  one sub-range, so each interested node gets the event exactly once.
* Subscribe (section 3.3): the subscription goes down the subscriber's own spanning tree;
  each receiver files it under the subscriber's range as seen from itself. Covering cuts the
  tree short (the paper's figure 3): if the subscriber s already has an entry (t, g) with g
  covering f and t sharing r digits with s, every node sharing fewer than r digits with s
  files s and t under the same prefix and already has g (or a cover of g) there, so s only
  sends to its rows r.. (a covering local subscription: nothing at all). Only entries
  *older* than the subscription (by Lamport stamp ``(clock, node id)``) may be relied on,
  which keeps the "relies on" relation acyclic.
* Unsubscribe (section 3.4): goes to the same rows the subscription reached. A node that
  loses an entry re-checks its own subscriptions the removed filter covered and re-exposes
  them: a ``Subscribe`` to the rows that the lost cover used to spare.
* Message order (section 3.5, item 1): subscriptions and unsubscriptions carry the
  subscriber's Lamport clock; a removal of an entry not (yet) known leaves a tombstone, and
  a subscription not newer than its tombstone is ignored, so an unsubscribe that overtakes
  its subscribe does no harm.

* Failures (section 3.2: "a message only needs to reach some node of the target range, not
  a fixed node"): a range message goes to the routing-table entry of its range; if that
  entry is gone (a slot a failure emptied, see ``PastryState.vacated``) or the send fails
  (the driver's failure notice), it is routed through Pastry towards an id inside the range
  (the dead entry's id, or a matching subscriber's) and taken up by the first node of the
  range on the way. Pastry delivers a key to the numerically closest live node; if that
  node lies outside the range, the range's live nodes, if any, begin at its leaf-set
  neighbour towards the key. So each live node of a range with a matching filter gets the
  event once, whichever nodes on the way died (as long as no l/2 adjacent ids die at once).
* Knowing that a send failed (``ack_timeout=t``): each range message, and each Pastry hop
  of a routed one, is acknowledged by its receiver; a send not acknowledged within ``t`` is
  handled as failed (above). A real network gives no other notice of a message written just
  before its peer died. The acknowledgements, and the duplicates a slow peer taken for dead
  makes, are :mod:`flowbus.routing.irbr_ack`'s; each published event carries an id
  (``Publish.eid``) so that a node handles it once. Without ``ack_timeout`` the node relies
  on the driver's failure notice (the simulator's ``failure_notice``), if any.
* Join (section 3.5, item 3: a joining node "initialises its filter table from other
  nodes' information"). The newcomer x must end up with the entries a node in its place
  would have been sent: f of s whenever x lies in one of the rows of s that f went to (so
  x also hears of f's removal, and may rely on f for covering). Let K be the most digits x
  shares with a node it knows (its routing table's deepest row). Rows r < K: a node z
  sharing K digits with x has the same ranges in its row r, and the same place in every
  subscriber's tree, so x asks the numerically closest such z for the entries of its rows
  < K (``TableRequest``). Row K is new: nobody had x's place in the trees of the nodes
  sharing K digits with x. So x sends a :class:`Newcomer` down its row K to every such
  node; each adds x to its Pastry state (x fills an empty slot of its row K, so later
  subscriptions reach x), passes the message on down its own sub-ranges, and sends x
  those of its own subscriptions that reach row K, as the ``Subscribe`` x would have got. A copy of a
  whole table would not do: a leaf across a digit boundary of x's id lacks the entries
  covering cut short before its rows, and x would hold entries it never hears the removal
  of (relying on one for covering loses events once it is gone).
* Leave: a leaving node withdraws its subscriptions; the dead routing-table entries it
  leaves behind are repaired like failures.

Not implemented: garbage collection of tombstones and of the entries of crashed subscribers
(they only cost extra forwards); a subscription made while a node is joining (before its
table request is answered and its ``Newcomer`` has passed) may miss the newcomer.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from functools import partial
from typing import Any, Final

from flowbus import wire
from flowbus.core import Deliver, Effect, Send
from flowbus.errors import ProtocolError
from flowbus.filters import Filter
from flowbus.overlay.pastry import (
    BASE,
    BITS,
    NDIGITS,
    B,
    LeafSetRequest,
    PastryNode,
    PastryState,
    Route,
    RowRequest,
    circular_distance,
    shared_prefix_len,
)
from flowbus.overlay.pastry_app import PastryApp
from flowbus.routing.irbr_ack import ACK_TIMER, Ack, Hop, HopAcks, RepairHop, Seen
from flowbus.routing.memo import compiled, covers

__all__ = [
    "ROOT",
    "AddResult",
    "Entry",
    "FilterTable",
    "IrbrNode",
    "Newcomer",
    "Prefix",
    "Publish",
    "Subscribe",
    "Unsubscribe",
    "child_prefix",
    "in_prefix",
    "prefix_of",
    "prefix_text",
]

Prefix = tuple[int, int]
"""An id range: (length in digits, value of those leading digits)."""

ROOT: Prefix = (0, 0)
"""The whole id space: what a publisher's (or subscriber's) tree root is responsible for."""


# ------------------------------------------------------------------------------- prefixes


def prefix_of(owner: int, node: int) -> Prefix:
    """The range of ``owner``'s routing table that holds ``node`` (``owner``'s own full id
    if ``node == owner``)."""
    level = shared_prefix_len(owner, node)
    if level >= NDIGITS:
        return (NDIGITS, owner)
    return (level + 1, node >> (BITS - B * (level + 1)))


def child_prefix(owner: int, row: int, col: int) -> Prefix:
    """The range of routing-table slot R[row][col] of ``owner``."""
    return (row + 1, ((owner >> (BITS - B * row)) << B) | col)


def in_prefix(node: int, prefix: Prefix) -> bool:
    length, value = prefix
    return node >> (BITS - B * length) == value


def prefix_text(prefix: Prefix) -> str:
    """The prefix as hex digits ("" for the whole space)."""
    length, value = prefix
    return f"{value:0{length}x}" if length else ""


# --------------------------------------------------------------------------- filter table


def _roots(entries: Iterable[Entry]) -> list[Entry]:
    """The entries no other entry covers (one of each group of equal filters)."""
    roots: list[Entry] = []
    for e in entries:
        if not any(covers(r.filter, e.filter) for r in roots):
            roots = [r for r in roots if not covers(e.filter, r.filter)]
            roots.append(e)
    return roots


class AddResult(Enum):
    ADDED = "added"
    IGNORED = "ignored"  # a duplicate, or not newer than a removal already seen


@wire.message("irbr.entry")
@dataclass(frozen=True, slots=True)
class Entry:
    prefix: Prefix
    filter: Filter
    node: int  # the subscriber's Pastry id
    sub: Hashable  # the subscriber's subscription id
    clock: int  # the subscriber's Lamport clock when it subscribed

    @property
    def key(self) -> tuple[int, Hashable]:
        return (self.node, self.sub)

    @property
    def stamp(self) -> tuple[int, int]:
        """A total order consistent with causality (Lamport clock, tie broken by node id)."""
        return (self.clock, self.node)


class FilterTable:
    """``FT^n`` of node ``owner`` (section 3.1), with Lamport tombstones (section 3.5)."""

    __slots__ = ("_by_key", "_by_prefix", "_fresh", "_roots", "_tombstones", "owner")

    def __init__(self, owner: int) -> None:
        self.owner = owner
        self._by_prefix: dict[Prefix, list[Entry]] = {}
        # Per prefix, the entries no other covers (what matching tries), kept up to date
        # lazily: entries added since (``_fresh``) are merged in at the next match, and a
        # prefix whose roots lost one is recomputed then (absent from ``_roots``).
        self._roots: dict[Prefix, list[Entry]] = {}
        self._fresh: dict[Prefix, list[Entry]] = {}
        self._by_key: dict[tuple[int, Hashable], Entry] = {}
        self._tombstones: dict[tuple[int, Hashable], int] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._by_key.values())

    def get(self, node: int, sub: Hashable) -> Entry | None:
        return self._by_key.get((node, sub))

    def at(self, prefix: Prefix) -> list[Entry]:
        return list(self._by_prefix.get(prefix, ()))

    def level(self, entry: Entry) -> int:
        """How many digits the entry's subscriber shares with the owner (32: the owner)."""
        return shared_prefix_len(self.owner, entry.node)

    def add(self, node: int, sub: Hashable, filt: Filter, clock: int) -> AddResult:
        """File subscription ``sub`` of ``node`` under ``node``'s range."""
        key = (node, sub)
        if clock <= self._tombstones.get(key, -1):
            return AddResult.IGNORED
        old = self._by_key.get(key)
        if old is not None:
            if old.clock >= clock:
                return AddResult.IGNORED
            self._drop(old)
        entry = Entry(prefix_of(self.owner, node), filt, node, sub, clock)
        self._by_prefix.setdefault(entry.prefix, []).append(entry)
        if entry.prefix in self._roots:
            self._fresh.setdefault(entry.prefix, []).append(entry)
        self._by_key[key] = entry
        return AddResult.ADDED

    def remove(self, node: int, sub: Hashable, clock: int) -> tuple[Entry | None, list[Entry]]:
        """Forget subscription ``sub`` of ``node`` if it is older than ``clock``; remember
        the removal either way. Returns the removed entry and the entries of the same prefix
        it re-exposes (they were covered by it, and nothing left in the prefix covers them)."""
        key = (node, sub)
        self._tombstones[key] = max(clock, self._tombstones.get(key, -1))
        old = self._by_key.get(key)
        if old is None or old.clock >= clock:
            return None, []
        self._drop(old)
        rest = self._by_prefix.get(old.prefix, [])
        exposed = [
            e
            for e in rest
            if covers(old.filter, e.filter)
            and not any(o is not e and covers(o.filter, e.filter) for o in rest)
        ]
        return old, exposed

    def _drop(self, entry: Entry) -> None:
        del self._by_key[entry.key]
        same = self._by_prefix[entry.prefix]
        same.remove(entry)
        if not same:
            del self._by_prefix[entry.prefix]
        fresh = self._fresh.get(entry.prefix)
        if fresh is not None and entry in fresh:
            fresh.remove(entry)
        elif entry in self._roots.get(entry.prefix, ()):
            del self._roots[entry.prefix]
            self._fresh.pop(entry.prefix, None)

    def roots(self, prefix: Prefix) -> list[Entry]:
        """The entries of ``prefix`` that no other entry of it covers (one of equal filters):
        if a covered filter matches an event, so does its cover."""
        roots = self._roots.get(prefix)
        if roots is None:
            self._fresh.pop(prefix, None)
            roots = self._roots[prefix] = _roots(self._by_prefix.get(prefix, ()))
        elif fresh := self._fresh.pop(prefix, None):
            roots = self._roots[prefix] = _roots(roots + fresh)
        if not roots:
            del self._roots[prefix]
        return roots

    def matching(self, event: Mapping[str, Any], *, below: int, upto: int = NDIGITS) -> dict[Prefix, int]:
        """The ranges of length in (``below``, ``upto``] where some filter matches ``event``,
        each with the id of one matching subscriber (a key inside the range). Only the
        filters no other of their range covers are tried: if a covered one matches, its
        cover does."""
        out: dict[Prefix, int] = {}
        for p in self._by_prefix:
            if below < p[0] <= upto:
                for e in self.roots(p):
                    if compiled(e.filter)(event):
                        out[p] = e.node
                        break
        return out

    def snapshot(self, rows: int) -> TableReply:
        """The entries and tombstones of the routing-table rows < ``rows`` (subscribers
        sharing fewer than ``rows`` digits with the owner) as a message: what a joining
        node that shares ``rows`` digits with the owner takes its rows < ``rows`` from."""
        me = self.owner
        entries = tuple(
            (e.node, e.sub, e.filter, e.clock)
            for e in self._by_key.values()
            if shared_prefix_len(me, e.node) < rows
        )
        dead = tuple(
            (node, sub, clock)
            for (node, sub), clock in self._tombstones.items()
            if shared_prefix_len(me, node) < rows
        )
        return TableReply(entries, dead)

    def load(self, reply: TableReply) -> None:
        """File another node's entries under our own prefixes (tombstones first)."""
        for node, sub, clock in reply.tombstones:
            self.remove(node, sub, clock)
        for node, sub, filt, clock in reply.entries:
            self.add(node, sub, filt, clock)

    def local(self) -> list[Entry]:
        """The owner's own subscriptions."""
        return self.at((NDIGITS, self.owner))

    def cover_level(self, entry: Entry) -> int | None:
        """The deepest level (digits shared with the owner) of an entry older than ``entry``
        whose filter covers it; None if there is none."""
        levels = [
            self.level(e)
            for e in self._by_key.values()
            if e is not entry and e.stamp < entry.stamp and covers(e.filter, entry.filter)
        ]
        return max(levels, default=None)


# ------------------------------------------------------------------------------- messages


@wire.message("irbr.subscribe")
@dataclass(frozen=True, slots=True)
class Subscribe:
    node: int  # the subscriber's Pastry id
    sub: Hashable
    filter: Filter
    clock: int
    prefix: Prefix  # the range the receiver is responsible for


@wire.message("irbr.unsubscribe")
@dataclass(frozen=True, slots=True)
class Unsubscribe:
    node: int
    sub: Hashable
    clock: int
    prefix: Prefix


@wire.message("irbr.publish")
@dataclass(frozen=True, slots=True)
class Publish:
    event: Mapping[str, Any]
    prefix: Prefix
    eid: Hashable  # the event's id, the same in every copy: (publisher's id, its count) by default


@wire.message("irbr.table_request")
@dataclass(frozen=True, slots=True)
class TableRequest:
    """A node that just joined (at address ``addr``) asks a node sharing ``rows`` digits
    with it for the entries of its rows < ``rows`` (section 3.5, item 3)."""

    addr: int
    rows: int


@wire.message("irbr.table_reply")
@dataclass(frozen=True, slots=True)
class TableReply:
    """A filter table as data: ``(node, sub, filter, clock)`` rows and ``(node, sub, clock)``
    tombstones."""

    entries: tuple[tuple[int, Hashable, Filter, int], ...]
    tombstones: tuple[tuple[int, Hashable, int], ...]


@wire.message("irbr.newcomer")
@dataclass(frozen=True, slots=True)
class Newcomer:
    """Node ``node`` (at ``addr``) has just joined in a range of the receiver's rows: it
    goes down the newcomer's deepest row, every receiver being in ``prefix``."""

    node: int
    addr: int
    prefix: Prefix


RangeMessage = Publish | Subscribe | Unsubscribe | Newcomer


# ---------------------------------------------------------------------------------- node


REPAIRS: Final = (LeafSetRequest, RowRequest)
"""Pastry's repair requests, acknowledged when acknowledgements are on."""


class IrbrNode(PastryApp):
    """The IRBR event-notification layer of one Pastry node, as a sans-IO core.

    It owns its :class:`PastryNode` (routing table, leaf set, failure repair); ``Send.dst``
    are the driver's addresses. Local subscribers get ``Deliver(sub_id, event)``.
    ``covering=False`` turns off the covering optimisation of section 3.3 (every
    subscription goes to every node), for comparison.

    A message for a range goes to the routing-table entry of that range; when there is none
    (a slot emptied by a failure, or a range with a subscriber but no entry yet) or the send
    fails, it is routed through Pastry towards an id inside the range and taken up by the
    first node of the range it reaches -- "a message only needs to reach some node of the
    target range" (section 3.2). If Pastry delivers it outside the range, the range's live
    nodes (if any) are that node's leaf-set neighbours towards the key. With
    ``ack_timeout=t`` a send is known to have failed when it is not acknowledged within
    ``t`` (:mod:`flowbus.routing.irbr_ack`); without, only by the driver's failure notice.
    """

    app_messages = frozenset(
        {Publish, Subscribe, Unsubscribe, Newcomer, TableRequest, TableReply, Hop, RepairHop, Ack}
    )

    __slots__ = ("acks", "clock", "covering", "empty_ranges", "published", "rows_from", "seen", "table")

    def __init__(
        self, pastry: PastryNode, *, covering: bool = True, ack_timeout: float | None = None
    ) -> None:
        super().__init__(pastry)
        self.covering = covering
        self.table = FilterTable(pastry.node_id)
        self.clock = 0
        self.rows_from: dict[Hashable, int] = {}  # local sub id -> first row it was sent to
        self.empty_ranges = 0  # range messages dropped: no live node of the range was found
        self.acks = None if ack_timeout is None else HopAcks(ack_timeout)
        self.seen = Seen()
        self.published = 0  # events published here (their default ids)

    @property
    def state(self) -> PastryState:
        return self.pastry.state

    # -- local calls

    def subscribe(self, filt: Filter, sub_id: Hashable) -> list[Effect]:
        if sub_id in self.rows_from:
            raise ProtocolError(f"IrbrNode.subscribe: subscription {sub_id!r} exists already")
        self.clock += 1
        self.table.add(self.node_id, sub_id, filt, self.clock)
        entry = self.table.get(self.node_id, sub_id)
        if entry is None:  # pragma: no cover - our own clock only grows
            raise ProtocolError(f"IrbrNode.subscribe: {sub_id!r} was not filed")
        first = self._first_row(entry)
        self.rows_from[sub_id] = first
        return self._broadcast(first, NDIGITS, lambda p: _subscribe_msg(entry, p))

    def unsubscribe(self, sub_id: Hashable) -> list[Effect]:
        if sub_id not in self.rows_from:
            raise ProtocolError(f"IrbrNode.unsubscribe: no subscription {sub_id!r}")
        first = self.rows_from.pop(sub_id)
        self.clock += 1
        clock = self.clock
        removed, _ = self.table.remove(self.node_id, sub_id, clock)
        out = self._broadcast(first, NDIGITS, lambda p: Unsubscribe(self.node_id, sub_id, clock, p))
        if removed is not None:
            out.extend(self._reexpose(removed))
        return out

    def publish(self, event: Mapping[str, Any], eid: Hashable | None = None) -> list[Effect]:
        """Publish ``event`` under the id ``eid`` (default: our id and a count of ours)."""
        self.published += 1
        return self._on_publish(Publish(event, ROOT, (self.node_id, self.published) if eid is None else eid))

    def join(self, bootstrap: int | None) -> list[Effect]:
        """Join the Pastry network through ``bootstrap``; once joined, the filter table is
        filled row by row (section 3.5, item 3; see the module note)."""
        return self.pastry.join(bootstrap)

    def leave(self) -> list[Effect]:
        """Withdraw every local subscription before the node goes away: what is left of the
        departure (the dead routing-table entries elsewhere) is repaired like a failure."""
        out: list[Effect] = []
        for sub_id in sorted(self.rows_from, key=repr):
            out.extend(self.unsubscribe(sub_id))
        return out

    # -- what PastryApp hands us

    def on_app_message(self, src: int, msg: Any, now: float, route: Route | None) -> list[Effect]:
        """IRBR's messages, all read here. A range message sent straight here is for a range
        this node is in; a routed one is taken up by the first node of its range on the way
        (:meth:`_towards` passes it on until then)."""
        me = self.node_id
        match msg:
            case Hop() | RepairHop() if route is None:
                return [Send(src, Ack(msg.seq)), *self.on_message(src, msg.body, now)]
            case Ack() if route is None and self.acks is not None:
                return self.acks.ack(msg.seq)
            case Publish() | Subscribe() | Unsubscribe() | Newcomer() if not in_prefix(me, msg.prefix):
                if route is None:
                    where = prefix_text(msg.prefix)
                    raise ProtocolError(f"IrbrNode {me:x}: not in range {where!r}")
                return self._towards(route, msg)
            case Publish():
                return self._on_publish(msg)
            case Subscribe() | Unsubscribe() | Newcomer():
                return self._on_control(msg)
            case TableRequest() if route is None:
                return [Send(msg.addr, self.table.snapshot(msg.rows))]
            case TableReply() if route is None:
                self.table.load(msg)
                return []
            case _:
                raise ProtocolError(f"IrbrNode {me:x}: {type(msg).__name__} is never routed")

    def on_joined(self, now: float) -> list[Effect]:
        return self._ask_table() + self._announce()

    def on_app_send_failed(self, dst: int, msg: Any, now: float, route: Route | None) -> list[Effect]:
        """A routed message goes on from here as at any hop (taken up here if this node is in
        its range); a range message to a dead entry is routed into the range; a lost table
        request is asked again."""
        if route is not None:
            return self.on_app_message(self.address, msg, now, route)
        match msg:
            case Publish() | Subscribe() | Unsubscribe() | Newcomer():
                return self.route(self.pastry.book.id_of[dst], msg)
            case TableRequest():
                return self._ask_table()
            case _:
                return []

    def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
        """The driver's failure notice. For an acknowledged send it settles the send, once:
        if its timer has fired already, the send was handled as failed then."""
        if (msg.__class__ is Hop or msg.__class__ is RepairHop) and self.acks is not None:
            cancel = self.acks.failed(msg.seq)
            out = [] if cancel is None else cancel + super().on_send_failed(dst, msg.body, now)
        else:
            out = super().on_send_failed(dst, msg, now)
        return self._repairs_acked(out)

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        return self._repairs_acked(super().on_message(src, msg, now))

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        return self._repairs_acked(super().on_timer(key, now))

    def _repairs_acked(self, out: list[Effect]) -> list[Effect]:
        """Pastry's repair requests acknowledged like range messages: a leaf-set or row
        request sent to a node that died unnoticed is found out by its timer, and Pastry asks
        another node (without it, a node's leaf set could stay short of a range's live nodes)."""
        if self.acks is None or not any(e.__class__ is Send and e.msg.__class__ in REPAIRS for e in out):
            return out
        acked: list[Effect] = []
        for e in out:
            if e.__class__ is Send and e.msg.__class__ in REPAIRS:  # type: ignore[attr-defined]
                acked.extend(self.acks.send(e.dst, e.msg, RepairHop))  # type: ignore[attr-defined]
            else:
                acked.append(e)
        return acked

    def on_app_timer(self, key: Hashable, now: float) -> list[Effect]:
        """An acknowledgement did not come in time: the send failed (see the module note)."""
        if self.acks is None or not (isinstance(key, tuple) and len(key) == 3 and key[:2] == ACK_TIMER):
            return super().on_app_timer(key, now)
        sent = self.acks.expire(key[2])
        return [] if sent is None else super().on_send_failed(sent[0], sent[1], now)

    def forward(self, route: Route, payload: Any | None = None) -> list[Effect]:
        """One Pastry hop on, acknowledged like every range message's send."""
        out = super().forward(route, payload)
        if self.acks is None or not out or not isinstance(sent := out[0], Send):
            return out
        return self.acks.send(sent.dst, sent.msg)

    # -- transitions

    def _towards(self, route: Route, msg: RangeMessage) -> list[Effect]:
        """A range message routed towards a key of its range, at a node outside the range:
        on to the next hop, else (the key ends here) to a leaf-set neighbour in the range."""
        out = self.forward(route)
        if out:
            return out
        member = self._leaf_in(msg.prefix, route.key)
        if member is None:
            self.empty_ranges += 1
            return []
        return self._send(self.pastry.book.addr_of[member], msg)

    def _on_control(self, msg: Subscribe | Unsubscribe | Newcomer) -> list[Effect]:
        """A subscription, removal or newcomer notice for a range we are in: handled once,
        a later copy for a larger range passed on only to the rows the first left out
        (``irbr_ack.Seen``; copies come from re-sends after a timeout)."""
        admitted = self.seen.admit(_identity(msg), msg.prefix[0])
        if admitted is None:
            return []
        first, upto = admitted
        match msg:
            case _ if not first:
                return self._broadcast(msg.prefix[0], upto, partial(_with_prefix, msg))
            case Subscribe():
                return self._on_subscribe(msg)
            case Unsubscribe():
                return self._on_unsubscribe(msg)
            case Newcomer():
                return self._on_newcomer(msg)

    def _on_subscribe(self, msg: Subscribe) -> list[Effect]:
        """File the subscription, and pass it on to every sub-range of our rows >= its range's
        length."""
        self.clock = max(self.clock, msg.clock) + 1
        self.table.add(msg.node, msg.sub, msg.filter, msg.clock)
        return self._broadcast(msg.prefix[0], NDIGITS, partial(_subscribe_msg, msg))

    def _on_unsubscribe(self, msg: Unsubscribe) -> list[Effect]:
        """Forget the subscription, pass the removal on as the subscription went, and extend
        our own subscriptions it may have been sparing."""
        self.clock = max(self.clock, msg.clock) + 1
        removed, _ = self.table.remove(msg.node, msg.sub, msg.clock)
        out = self._broadcast(msg.prefix[0], NDIGITS, partial(_unsubscribe_msg, msg))
        if removed is not None:
            out.extend(self._reexpose(removed))
        return out

    def _on_newcomer(self, msg: Newcomer) -> list[Effect]:
        """A node joined in a range of our row r: it fills the routing-table slot of that
        range (empty so far), hears of the rest of its range from us, and gets the
        subscriptions of ours that reach row r, as the ``Subscribe`` it would have got."""
        self.pastry.learn(msg.node, msg.addr)
        out = self._broadcast(msg.prefix[0], NDIGITS, partial(_newcomer_msg, msg))
        row, there = shared_prefix_len(self.node_id, msg.node), prefix_of(self.node_id, msg.node)
        for entry in self.table.local():
            if self.rows_from[entry.sub] <= row:
                out.extend(self._send(msg.addr, _subscribe_msg(entry, there)))
        return out

    def _on_publish(self, msg: Publish) -> list[Effect]:
        """Deliver the event to the matching local subscriptions and pass it on to every
        sub-range of our rows >= its range's length where a filter matches it; a copy of
        an event handled already only to the rows the first left out (``irbr_ack.Seen``)."""
        admitted = self.seen.admit(("p", msg.eid), msg.prefix[0])
        if admitted is None:
            return []
        first, upto = admitted
        event = msg.event
        out: list[Effect] = []
        if first:
            out.extend(Deliver(e.sub, event) for e in self.table.local() if compiled(e.filter)(event))
        own = (NDIGITS, self.node_id)
        for prefix, key in self.table.matching(event, below=msg.prefix[0], upto=upto).items():
            if prefix != own:
                out.extend(self._to_range(prefix, Publish(event, prefix, msg.eid), key))
        return out

    def _to_range(self, prefix: Prefix, msg: RangeMessage, key: int) -> list[Effect]:
        """Send ``msg`` to our routing-table entry for ``prefix``, or route it into the range."""
        length, value = prefix
        row = length - 1
        rows = self.state.rows
        entry = rows[row][value & (BASE - 1)] if row < len(rows) else None
        if entry is not None:
            return self._send(self.pastry.book.addr_of[entry], msg)
        return self.route(key, msg)

    def _send(self, dst: int, msg: RangeMessage) -> list[Effect]:
        """``msg`` straight to ``dst``, acknowledged if acknowledgements are on."""
        return [Send(dst, msg)] if self.acks is None else self.acks.send(dst, msg)

    def _deepest_row(self) -> int | None:
        """The most digits we share with a node we know (None if we know none)."""
        me = self.node_id
        return max((shared_prefix_len(me, n) for n in self.state.known()), default=None)

    def _ask_table(self) -> list[Effect]:
        """Ask the numerically closest of the nodes sharing the most digits with us (K) for
        the entries of its rows < K: they are those of our rows < K."""
        rows = self._deepest_row()
        if not rows:
            return []
        me = self.node_id
        peers = [n for n in self.state.known() if shared_prefix_len(me, n) == rows]
        closest = min(peers, key=lambda n: (circular_distance(n, me), n))
        return [Send(self.pastry.book.addr_of[closest], TableRequest(self.address, rows))]

    def _announce(self) -> list[Effect]:
        """A :class:`Newcomer` to every node of our deepest row's ranges."""
        row = self._deepest_row()
        if row is None:
            return []
        return self._broadcast(row, row + 1, partial(Newcomer, self.node_id, self.address))

    def _leaf_in(self, prefix: Prefix, key: int) -> int | None:
        """The leaf of range ``prefix`` numerically closest to ``key``, if any."""
        inside = [n for n in self.state.leaf_set() if in_prefix(n, prefix)]
        return min(inside, key=lambda n: (circular_distance(n, key), n), default=None)

    def _broadcast(self, lo: int, hi: int, make: Callable[[Prefix], RangeMessage]) -> list[Effect]:
        """``make(prefix)`` to every sub-range of rows lo..hi-1: to the routing-table entries,
        and routed into the slots a failure emptied (the range may still hold live nodes)."""
        out: list[Effect] = []
        rows, vacated, addr_of = self.state.rows, self.state.vacated, self.pastry.book.addr_of
        me = self.node_id
        for r in range(lo, min(hi, len(rows))):
            base = (me >> (BITS - B * r)) << B
            for d, child in enumerate(rows[r]):
                if child is not None:
                    out.extend(self._send(addr_of[child], make((r + 1, base | d))))
                elif (r, d) in vacated:
                    out.extend(self.route(vacated[(r, d)], make((r + 1, base | d))))
        return out

    def _reexpose(self, removed: Entry) -> list[Effect]:
        """Extend our own subscriptions that ``removed`` may have been sparing (section 3.4)."""
        out: list[Effect] = []
        for entry in self._own_covered_by(removed):
            first = self._first_row(entry)
            sent = self.rows_from[entry.sub]
            if first < sent:
                self.rows_from[entry.sub] = first
                out.extend(self._broadcast(first, sent, partial(_subscribe_msg, entry)))
        return out

    def _first_row(self, entry: Entry) -> int:
        """The first routing-table row a local subscription must reach (section 3.3)."""
        level = self.table.cover_level(entry) if self.covering else None
        return 0 if level is None else level

    def _own_covered_by(self, removed: Entry) -> Iterable[Entry]:
        return [e for e in self.table.local() if e.sub in self.rows_from and covers(removed.filter, e.filter)]


def _subscribe_msg(entry: Entry | Subscribe, prefix: Prefix) -> Subscribe:
    return Subscribe(entry.node, entry.sub, entry.filter, entry.clock, prefix)


def _identity(msg: Subscribe | Unsubscribe | Newcomer) -> Hashable:
    """What makes two range messages copies of one (their prefixes aside)."""
    match msg:
        case Subscribe():
            return ("s", msg.node, msg.sub, msg.clock)
        case Unsubscribe():
            return ("u", msg.node, msg.sub, msg.clock)
        case Newcomer():
            return ("n", msg.node, msg.addr)


def _with_prefix(msg: Subscribe | Unsubscribe | Newcomer, prefix: Prefix) -> RangeMessage:
    return replace(msg, prefix=prefix)


def _unsubscribe_msg(msg: Unsubscribe, prefix: Prefix) -> Unsubscribe:
    return Unsubscribe(msg.node, msg.sub, msg.clock, prefix)


def _newcomer_msg(msg: Newcomer, prefix: Prefix) -> Newcomer:
    return Newcomer(msg.node, msg.addr, prefix)
