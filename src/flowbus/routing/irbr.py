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

Not implemented: node arrival/departure (section 3.5, item 3: FT initialisation of a
joining node, re-routing around a dead routing-table entry) and tombstone garbage
collection.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from functools import lru_cache, partial
from typing import Any

from flowbus.errors import ProtocolError
from flowbus.filters import Filter
from flowbus.overlay.effects import Deliver, Effect, Send
from flowbus.overlay.pastry import BITS, NDIGITS, AddressBook, B, PastryState, shared_prefix_len

__all__ = [
    "ROOT",
    "AddResult",
    "Entry",
    "FilterTable",
    "IrbrNode",
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


@lru_cache(maxsize=1 << 16)
def _covers(f: Filter, g: Filter) -> bool:
    """``f`` covers ``g`` (memoised: the same filters meet again at every node)."""
    return f == g or f.covers(g)


class AddResult(Enum):
    NEW = "new"  # no other filter of the prefix covers it
    COVERED = "covered"  # kept, but an existing filter of the same prefix covers it
    IGNORED = "ignored"  # a duplicate, or not newer than a removal already seen


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

    __slots__ = ("_by_key", "_by_prefix", "_tombstones", "owner")

    def __init__(self, owner: int) -> None:
        self.owner = owner
        self._by_prefix: dict[Prefix, list[Entry]] = {}
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
        same = self._by_prefix.setdefault(entry.prefix, [])
        covered = any(_covers(e.filter, filt) for e in same)
        same.append(entry)
        self._by_key[key] = entry
        return AddResult.COVERED if covered else AddResult.NEW

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
            if _covers(old.filter, e.filter)
            and not any(o is not e and _covers(o.filter, e.filter) for o in rest)
        ]
        return old, exposed

    def _drop(self, entry: Entry) -> None:
        del self._by_key[entry.key]
        same = self._by_prefix[entry.prefix]
        same.remove(entry)
        if not same:
            del self._by_prefix[entry.prefix]

    def matching_prefixes(self, event: Mapping[str, Any]) -> set[Prefix]:
        """The ranges where some filter matches ``event``."""
        return {p for p, entries in self._by_prefix.items() if any(e.filter.matches(event) for e in entries)}

    def local(self) -> list[Entry]:
        """The owner's own subscriptions."""
        return self.at((NDIGITS, self.owner))

    def cover_level(self, entry: Entry) -> int | None:
        """The deepest level (digits shared with the owner) of an entry older than ``entry``
        whose filter covers it; None if there is none."""
        levels = [
            self.level(e)
            for e in self._by_key.values()
            if e is not entry and e.stamp < entry.stamp and _covers(e.filter, entry.filter)
        ]
        return max(levels, default=None)


# ------------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class Subscribe:
    node: int  # the subscriber's Pastry id
    sub: Hashable
    filter: Filter
    clock: int
    prefix: Prefix  # the range the receiver is responsible for


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    node: int
    sub: Hashable
    clock: int
    prefix: Prefix


@dataclass(frozen=True, slots=True)
class Publish:
    event: Mapping[str, Any]
    prefix: Prefix


# ---------------------------------------------------------------------------------- node


class IrbrNode:
    """The IRBR event-notification layer of one Pastry node, as a sans-IO core.

    ``state`` gives the routing table (the children of each sub-range); ``book`` maps Pastry
    ids to the driver's addresses (what ``Send.dst`` names). Local subscribers get
    ``Deliver(sub_id, event)``. ``covering=False`` turns off the covering optimisation of
    section 3.3 (every subscription goes to every node), for comparison.
    """

    __slots__ = ("book", "clock", "covering", "rows_from", "state", "table")

    def __init__(self, state: PastryState, book: AddressBook, *, covering: bool = True) -> None:
        self.state = state
        self.covering = covering
        self.book = book
        self.table = FilterTable(state.node_id)
        self.clock = 0
        self.rows_from: dict[Hashable, int] = {}  # local sub id -> first row it was sent to

    @property
    def node_id(self) -> int:
        return self.state.node_id

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

    def publish(self, event: Mapping[str, Any]) -> list[Effect]:
        return self._on_publish(Publish(event, ROOT))

    # -- messages

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        if isinstance(msg, Publish):
            return self._on_publish(msg)
        if isinstance(msg, Subscribe):
            return self._on_subscribe(msg)
        if isinstance(msg, Unsubscribe):
            return self._on_unsubscribe(msg)
        raise ProtocolError(f"IrbrNode: unknown message {msg!r} from {src}")

    def _on_publish(self, msg: Publish) -> list[Effect]:
        self._check_range(msg.prefix)
        event = msg.event
        out: list[Effect] = [Deliver(e.sub, event) for e in self.table.local() if e.filter.matches(event)]
        matching = self.table.matching_prefixes(event)
        for prefix, child in self._children(msg.prefix[0], NDIGITS):
            if prefix in matching:
                out.append(Send(self.book.addr_of[child], Publish(event, prefix)))
        return out

    def _on_subscribe(self, msg: Subscribe) -> list[Effect]:
        self._check_range(msg.prefix)
        self.clock = max(self.clock, msg.clock) + 1
        self.table.add(msg.node, msg.sub, msg.filter, msg.clock)
        return self._broadcast(msg.prefix[0], NDIGITS, lambda p: replace(msg, prefix=p))

    def _on_unsubscribe(self, msg: Unsubscribe) -> list[Effect]:
        self._check_range(msg.prefix)
        self.clock = max(self.clock, msg.clock) + 1
        removed, _ = self.table.remove(msg.node, msg.sub, msg.clock)
        out = self._broadcast(msg.prefix[0], NDIGITS, lambda p: replace(msg, prefix=p))
        if removed is not None:
            out.extend(self._reexpose(removed))
        return out

    # -- helpers

    def _check_range(self, prefix: Prefix) -> None:
        if not in_prefix(self.node_id, prefix):
            raise ProtocolError(f"IrbrNode {self.node_id:x}: not in range {prefix_text(prefix)!r}")

    def _children(self, lo: int, hi: int) -> Iterator[tuple[Prefix, int]]:
        """(sub-range, routing-table entry) of rows lo..hi-1: the tree below a node responsible
        for its own range of length ``lo``."""
        rows = self.state.rows
        for r in range(lo, min(hi, len(rows))):
            for d, child in enumerate(rows[r]):
                if child is not None:
                    yield child_prefix(self.node_id, r, d), child

    def _broadcast(self, lo: int, hi: int, make: Callable[[Prefix], object]) -> list[Effect]:
        return [Send(self.book.addr_of[child], make(prefix)) for prefix, child in self._children(lo, hi)]

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
        return [
            e for e in self.table.local() if e.sub in self.rows_from and _covers(removed.filter, e.filter)
        ]


def _subscribe_msg(entry: Entry, prefix: Prefix) -> Subscribe:
    return Subscribe(entry.node, entry.sub, entry.filter, entry.clock, prefix)
