"""CBDLO's lower layer: the Cyclon-gossiped random graph and the access-point table (sans-IO).

How it works (the 004 document, section 2, figure 1):

* Lower layer: an unstructured random graph. Each node keeps a *view* of ``view_size``
  neighbours, refreshed by Cyclon (Voulgaris, Gavidia & van Steen, "CYCLON: Inexpensive
  membership management for unstructured P2P overlays", JNSM 2005), a gossip
  peer-sampling protocol (:class:`Cyclon`): every ``period`` a node ages its descriptors,
  removes the *oldest* neighbour Q from its view and sends Q a :class:`Shuffle` of
  ``shuffle_len - 1`` random descriptors plus a fresh one of itself; Q answers with a
  :class:`ShuffleReply` of ``shuffle_len`` random descriptors of its own; each side keeps
  what it received, in the empty slots first, then in place of what it sent. We chose
  Cyclon over Newscast because the document needs the graph "close to a random graph
  under churn": Cyclon's shuffles swap (rather than copy) links, so every node keeps an
  in-degree near the view size (a narrow, almost binomial spread; Newscast's is skewed
  and lets hubs form), and contacting the oldest neighbour removes a dead node's
  descriptors within about ``view_size`` periods without any failure detector.
* The access-point lookup table (:class:`Apt`): attribute -> a real node hosting a
  virtual node of that attribute's topology, at most ``apt_size`` entries. A descriptor
  carries the attributes its node hosts, so every shuffle teaches the APT entry points;
  the table keeps the most recently learnt attributes (LRU), which favours attributes
  with many subscribers, as the walks need.
* Upper layer: one attribute topology per subscribed attribute
  (:mod:`flowbus.overlay.cbdlo_tree`), kept by messages (:mod:`flowbus.routing.cbdlo_maint`).
* The node (:class:`flowbus.routing.cbdlo.CbdloNode`) runs this lower layer, CRAWL
  (:mod:`flowbus.routing.crawl`) and CDM (:mod:`flowbus.routing.cdm`).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from flowbus.errors import ProtocolError

__all__ = [
    "CYCLON_TIMER",
    "Apt",
    "Cyclon",
    "Descriptor",
    "Shuffle",
    "ShuffleReply",
]

CYCLON_TIMER: Final = ("cyclon",)


# ------------------------------------------------------------------------------ messages


@dataclass(frozen=True, slots=True)
class Descriptor:
    """A node as gossip knows it: its address, the age of this copy, and the attributes
    whose topology it hosts (an APT's source of entry points)."""

    node: int
    age: int
    attrs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Shuffle:
    entries: tuple[Descriptor, ...]


@dataclass(frozen=True, slots=True)
class ShuffleReply:
    entries: tuple[Descriptor, ...]


# ------------------------------------------------------------------------------------ APT


class Apt:
    """The access-point lookup table: attribute -> entry point, at most ``size`` entries,
    the least recently learnt one evicted first."""

    __slots__ = ("_table", "size")

    def __init__(self, size: int, entries: Iterable[tuple[str, int]] = ()) -> None:
        if size < 0:
            raise ProtocolError(f"APT size must be >= 0, got {size}")
        self.size = size
        self._table: OrderedDict[str, int] = OrderedDict()
        for attr, node in entries:
            self.learn(attr, node)

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, attr: object) -> bool:
        return attr in self._table

    def lookup(self, attr: str) -> int | None:
        return self._table.get(attr)

    def learn(self, attr: str, node: int) -> None:
        if self.size == 0:
            return
        table = self._table
        table[attr] = node
        table.move_to_end(attr)
        if len(table) > self.size:
            table.popitem(last=False)

    def load(self, entries: Sequence[tuple[str, int]]) -> None:
        """Replace the table with ``entries`` (distinct attributes, oldest first): the same state
        as learning them in that order into an empty table."""
        self._table = OrderedDict(list(entries)[-self.size :] if self.size else [])

    def forget(self, attr: str, node: int) -> None:
        if self._table.get(attr) == node:
            del self._table[attr]

    def items(self) -> list[tuple[str, int]]:
        return list(self._table.items())


# --------------------------------------------------------------------------------- Cyclon


class Cyclon:
    """One node's Cyclon view (see the module note); the node sends what it returns."""

    __slots__ = ("addr", "pending", "rng", "shuffle_len", "size", "view")

    def __init__(self, addr: int, *, size: int, shuffle_len: int, rng: random.Random) -> None:
        if size < 1 or not 1 <= shuffle_len <= size:
            raise ProtocolError(
                f"Cyclon: need size >= 1 and 1 <= shuffle_len <= size, got {size}, {shuffle_len}"
            )
        self.addr = addr
        self.size = size
        self.shuffle_len = shuffle_len
        self.rng = rng
        self.view: dict[int, Descriptor] = {}
        self.pending: dict[int, tuple[int, ...]] = {}  # peer -> the nodes we sent it

    def neighbours(self) -> list[int]:
        return list(self.view)

    def seed(self, nodes: Iterable[int]) -> None:
        for n in nodes:
            if n != self.addr and len(self.view) < self.size:
                self.view[n] = Descriptor(n, 0)

    def start_shuffle(self, own: Descriptor) -> tuple[int, Shuffle] | None:
        """Age the view, pick the oldest neighbour, remove it, and build the shuffle for it."""
        if not self.view:
            return None
        self.view = {n: Descriptor(d.node, d.age + 1, d.attrs) for n, d in self.view.items()}
        peer = max(self.view.values(), key=lambda d: (d.age, -d.node)).node
        del self.view[peer]
        sent = self._sample(self.shuffle_len - 1)
        self.pending[peer] = tuple(d.node for d in sent)
        return peer, Shuffle((own, *sent))

    def answer(self, src: int, shuffle: Shuffle) -> ShuffleReply:
        """A shuffle came from ``src``: reply with a sample of ours, then keep what came."""
        reply = self._sample(self.shuffle_len, exclude=src)
        self._integrate(shuffle.entries, tuple(d.node for d in reply))
        return ShuffleReply(reply)

    def reply(self, src: int, reply: ShuffleReply) -> None:
        self._integrate(reply.entries, self.pending.pop(src, ()))

    def _sample(self, k: int, exclude: int | None = None) -> tuple[Descriptor, ...]:
        pool = [d for n, d in self.view.items() if n != exclude]
        if len(pool) <= k:
            return tuple(pool)
        return tuple(self.rng.sample(pool, k))

    def _integrate(self, entries: Sequence[Descriptor], sent: Sequence[int]) -> None:
        replaceable = [n for n in sent if n in self.view]
        for d in entries:
            if d.node == self.addr:
                continue
            old = self.view.get(d.node)
            if old is not None:
                if d.age < old.age:
                    self.view[d.node] = d
            elif len(self.view) < self.size:
                self.view[d.node] = d
            elif replaceable:
                del self.view[replaceable.pop()]
                self.view[d.node] = d
