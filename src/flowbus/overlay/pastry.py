"""Pastry: prefix routing over a 128-bit circular id space (sans-IO core).

How it works (Rowstron & Druschel, "Pastry: Scalable, decentralized object location
and routing for large-scale peer-to-peer systems", Middleware 2001):

* Ids (section 2): node ids and keys are 128-bit ints, read as 32 digits of b = 4 bits
  (hex). :func:`digits`, :func:`shared_prefix_len` and :func:`circular_distance` are the
  pure helpers; the node responsible for a key is the *numerically closest* live node on
  the circle (ties go to the smaller id), see :func:`numerically_closest`.
* Node state (section 2.1): a routing table of 32 rows x 16 columns -- row r holds a node
  sharing the first r digits with us and having digit d at position r -- stored compactly
  as a list of only the rows in use; a leaf set of l = 16 nodes (the 8 numerically closest
  smaller ids and the 8 closest larger ones, on the circle); an optional neighbourhood set
  (nodes close by the proximity metric), only filled by :func:`build_static`.
* Routing (section 2.2, table 1): :meth:`PastryState.next_hop`. A key within the leaf
  set's range goes to the numerically closest leaf (or is delivered here); otherwise to
  R[l][D_l] (l = shared prefix length with the key, D_l the key's digit at l); if that
  entry is empty (the rare case), to any known node sharing at least l digits with the key
  and numerically closer to it than we are; if there is none, the key is delivered here.
* Node arrival (section 2.4): the newcomer X sends ``Join`` to a bootstrap node A; it is
  routed like a message with key X. Every node on the path sends X its routing-table rows
  0..l (l = prefix it shares with X) in a ``JoinState``; the last node Z (numerically
  closest to X) adds its leaf set and marks its reply final. Once X has every hop's
  state, it sends an ``Announce`` carrying its state to every node it knows, who add X.
* Node failure (section 2.4): a leaf is dead when it misses a heartbeat (with
  ``heartbeat=period``, each round pings every leaf; a leaf that has not answered by the
  next round is dead), or when the driver says so: :meth:`PastryNode.node_failed` (an
  external failure detector) or :meth:`PastryNode.on_send_failed` (a send that could not
  be delivered); a message from a node believed dead revives it. Leaf-set repair asks
  the farthest live leaf on the damaged side for its leaf set (``LeafSetRequest`` /
  ``LeafSetReply``); each reply makes it ask every leaf not asked yet in this repair (the
  far leaf may be repairing too when it answers). Routing-table repair is lazy:
  a dead entry found while routing is dropped, the message is re-routed (the rare-case
  rule covers the hole) and another node of the same row is asked for its row
  (``RowRequest`` / ``RowReply``).

:func:`flowbus.overlay.pastry_static.build_static` is the "correct tables" construction
used for large N: it fills every node's state from global knowledge (exact leaf sets, a
random valid node per routing-table slot) in O(N log N), instead of running N joins.

Network addresses (the driver's node ids, ints) and Pastry ids are distinct; messages
carry both, and each node keeps an :class:`AddressBook` (pastry id <-> address), which
:func:`build_static` shares between nodes to save memory (the mapping is a fact, the same
everywhere). Randomness comes only from the ``random.Random`` handed in.
"""

from __future__ import annotations

import hashlib
import random
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from flowbus import wire
from flowbus.core import Core, Deliver, Effect, Send, SetTimer
from flowbus.errors import ProtocolError

__all__ = [
    "BASE",
    "BITS",
    "HEARTBEAT",
    "ID_SPACE",
    "LEAF_SIZE",
    "NDIGITS",
    "AddressBook",
    "Announce",
    "B",
    "Join",
    "JoinState",
    "LeafSetReply",
    "LeafSetRequest",
    "PastryNode",
    "PastryState",
    "Ping",
    "Pong",
    "Removal",
    "Route",
    "RowReply",
    "RowRequest",
    "circular_distance",
    "digit",
    "digits",
    "node_id_from",
    "numerically_closest",
    "shared_prefix_len",
]

B = 4
"""Bits per digit."""
BITS = 128
NDIGITS = BITS // B
BASE = 1 << B
ID_SPACE = 1 << BITS
MASK = ID_SPACE - 1
LEAF_SIZE = 16
"""l: the leaf set holds l/2 smaller and l/2 larger ids."""

HEARTBEAT = ("pastry", "heartbeat")
"""The timer key of the leaf-set heartbeat round."""

Entries = tuple[tuple[int, int], ...]
"""(pastry id, network address) pairs, as carried in messages."""


# ---------------------------------------------------------------------------------------- ids


def _check_id(node_id: int, what: str) -> None:
    if type(node_id) is not int or not 0 <= node_id < ID_SPACE:
        raise ProtocolError(f"{what}: a Pastry id is an int in [0, 2**128), got {node_id!r}")


def digit(node_id: int, i: int) -> int:
    """The i-th base-16 digit of ``node_id`` (0 is the most significant)."""
    return (node_id >> (BITS - B - B * i)) & (BASE - 1)


def digits(node_id: int) -> tuple[int, ...]:
    """The 32 base-16 digits of ``node_id``, most significant first."""
    _check_id(node_id, "digits")
    return tuple(digit(node_id, i) for i in range(NDIGITS))


def shared_prefix_len(a: int, b: int) -> int:
    """How many leading digits ``a`` and ``b`` share (32 if equal)."""
    x = a ^ b
    if x == 0:
        return NDIGITS
    return (BITS - x.bit_length()) // B


def circular_distance(a: int, b: int) -> int:
    """Distance between ``a`` and ``b`` on the circle of 2**128 ids."""
    d = (a - b) & MASK
    return d if d <= ID_SPACE - d else ID_SPACE - d


def node_id_from(name: str | bytes | int | None = None, rng: random.Random | None = None) -> int:
    """A 128-bit Pastry id: the hash of ``name`` (a str, bytes or an int such as an address),
    or, with ``name=None``, uniformly random from ``rng`` (section 2: ids are random or the
    hash of an IP address / public key)."""
    if name is None:
        if rng is None:
            raise ProtocolError("node_id_from: give a name to hash or an rng to draw from")
        return rng.getrandbits(BITS)
    if isinstance(name, bool) or not isinstance(name, str | bytes | int):
        raise ProtocolError(f"node_id_from: expected str, bytes, int or None, got {name!r}")
    raw = name if isinstance(name, bytes) else str(name).encode()
    return int.from_bytes(hashlib.sha1(raw).digest()[: BITS // 8], "big")


def numerically_closest(sorted_ids: Sequence[int], key: int) -> int:
    """The id in ``sorted_ids`` (ascending, non-empty) numerically closest to ``key`` on the
    circle, ties to the smaller id: the node responsible for ``key``."""
    if not sorted_ids:
        raise ProtocolError("numerically_closest: no ids")
    i = bisect_left(sorted_ids, key)
    a = sorted_ids[i % len(sorted_ids)]
    b = sorted_ids[i - 1]
    da, db = circular_distance(a, key), circular_distance(b, key)
    if da != db:
        return a if da < db else b
    return min(a, b)


# ----------------------------------------------------------------------------------- messages


@wire.message("pastry.route")
@dataclass(frozen=True, slots=True)
class Route:
    """An application message routed towards the node responsible for ``key``;
    ``hops`` counts the sends so far, ``origin`` is the sender's address."""

    key: int
    payload: Any
    hops: int
    origin: int

    def __post_init__(self) -> None:
        if not 0 <= self.key < ID_SPACE or self.hops < 0:
            raise ProtocolError(f"Route: bad key {self.key!r} or hops {self.hops!r}")


@wire.message("pastry.join")
@dataclass(frozen=True, slots=True)
class Join:
    """A newcomer's join request, routed with key ``joiner_id``; ``hops`` = path index."""

    joiner_id: int
    joiner_addr: int
    hops: int

    def __post_init__(self) -> None:
        _check_id(self.joiner_id, "Join")


@wire.message("pastry.join_state")
@dataclass(frozen=True, slots=True)
class JoinState:
    """State sent to a joiner by the node at path index ``hop`` (rows, and with
    ``final`` the leaf set of the numerically closest node)."""

    node_id: int
    addr: int
    hop: int
    entries: Entries
    final: bool


@wire.message("pastry.announce")
@dataclass(frozen=True, slots=True)
class Announce:
    """A joiner's state, sent to every node it knows once it has joined."""

    node_id: int
    addr: int
    entries: Entries


@wire.message("pastry.leaf_set_request")
@dataclass(frozen=True, slots=True)
class LeafSetRequest:
    node_id: int
    addr: int


@wire.message("pastry.leaf_set_reply")
@dataclass(frozen=True, slots=True)
class LeafSetReply:
    node_id: int
    addr: int
    entries: Entries


@wire.message("pastry.ping")
@dataclass(frozen=True, slots=True)
class Ping:
    """Heartbeat to a leaf; answered by :class:`Pong`."""

    node_id: int
    addr: int


@wire.message("pastry.pong")
@dataclass(frozen=True, slots=True)
class Pong:
    node_id: int
    addr: int


@wire.message("pastry.row_request")
@dataclass(frozen=True, slots=True)
class RowRequest:
    node_id: int
    addr: int
    row: int


@wire.message("pastry.row_reply")
@dataclass(frozen=True, slots=True)
class RowReply:
    node_id: int
    addr: int
    entries: Entries


# -------------------------------------------------------------------------------------- state


class AddressBook:
    """Pastry id <-> network address; may be shared by many nodes (see :func:`build_static`)."""

    __slots__ = ("addr_of", "id_of")

    def __init__(self) -> None:
        self.addr_of: dict[int, int] = {}
        self.id_of: dict[int, int] = {}

    def learn(self, node_id: int, addr: int) -> None:
        self.addr_of[node_id] = addr
        self.id_of[addr] = node_id


class PastryState:
    """Routing table, leaf set and neighbourhood set of one node (section 2.1)."""

    __slots__ = ("half", "larger", "neighbours", "node_id", "rows", "smaller", "vacated", "wraps")

    def __init__(self, node_id: int, *, leaf_size: int = LEAF_SIZE) -> None:
        _check_id(node_id, "PastryState")
        if leaf_size < 2 or leaf_size % 2:
            raise ProtocolError(f"PastryState: leaf_size must be even and >= 2, got {leaf_size}")
        self.node_id = node_id
        self.half = leaf_size // 2
        self.rows: list[list[int | None]] = []
        self.smaller: list[int] = []  # counter-clockwise neighbours, closest first
        self.larger: list[int] = []  # clockwise neighbours, closest first
        self.neighbours: list[int] = []
        self.wraps = True  # the leaf set covers the whole circle (we know every node)
        self.vacated: dict[tuple[int, int], int] = {}  # slot -> the dead node it held, until refilled

    # -- queries

    def leaf_set(self) -> list[int]:
        """The leaf set's ids (smaller side then larger side, without repeats)."""
        return self.smaller + [n for n in self.larger if n not in self.smaller]

    def table_entries(self) -> Iterator[int]:
        for row in self.rows:
            for n in row:
                if n is not None:
                    yield n

    def known(self) -> set[int]:
        """Every node id in the leaf set, routing table and neighbourhood set."""
        out = set(self.smaller)
        out.update(self.larger, self.neighbours, self.table_entries())
        return out

    def row(self, r: int) -> list[int]:
        return [n for n in self.rows[r] if n is not None] if r < len(self.rows) else []

    def next_hop(self, key: int) -> int | None:
        """The id to forward a message for ``key`` to, or None to deliver it here."""
        me = self.node_id
        if key == me:
            return None
        if self._in_leaf_range(key):
            return self._closest_leaf(key)
        r = shared_prefix_len(key, me)
        if r < len(self.rows):
            entry = self.rows[r][(key >> (BITS - B - B * r)) & (BASE - 1)]
            if entry is not None:
                return entry
        return self._rare_case(key, r)

    def _in_leaf_range(self, key: int) -> bool:
        if self.wraps:
            return True
        lo = self.smaller[-1]
        return (key - lo) & MASK <= (self.larger[-1] - lo) & MASK

    def _closest_leaf(self, key: int) -> int | None:
        best = me = self.node_id
        best_d = circular_distance(me, key)
        for side in (self.smaller, self.larger):
            for n in side:
                d = circular_distance(n, key)
                if d < best_d or (d == best_d and n < best):
                    best, best_d = n, d
        return None if best == me else best

    def _rare_case(self, key: int, r: int) -> int | None:
        best: int | None = None
        best_d = circular_distance(self.node_id, key)
        for n in self.known():
            d = circular_distance(n, key)
            if (d < best_d or (d == best_d and best is not None and n < best)) and shared_prefix_len(
                n, key
            ) >= r:
                best, best_d = n, d
        return best

    # -- updates

    def add(self, node_id: int) -> bool:
        """Consider ``node_id`` for the leaf set and the routing table; True if kept."""
        me = self.node_id
        if node_id == me:
            return False
        changed = self._add_leaf(node_id)
        r = shared_prefix_len(node_id, me)
        while len(self.rows) <= r:
            self.rows.append([None] * BASE)
        row = self.rows[r]
        c = digit(node_id, r)
        if row[c] is None:
            row[c] = node_id
            self.vacated.pop((r, c), None)
            changed = True
        return changed

    def _add_leaf(self, node_id: int) -> bool:
        me = self.node_id
        changed = _insert_side(self.larger, node_id, (node_id - me) & MASK, me, self.half, 1)
        changed = _insert_side(self.smaller, node_id, (me - node_id) & MASK, me, self.half, -1) or changed
        if changed:
            self._update_wraps()
        return changed

    def _update_wraps(self) -> None:
        h, me = self.half, self.node_id
        self.wraps = (
            len(self.smaller) < h
            or len(self.larger) < h
            or ((self.larger[-1] - me) & MASK) + ((me - self.smaller[-1]) & MASK) >= ID_SPACE
        )

    def remove(self, node_id: int) -> Removal:
        """Forget a failed node: which leaf-set sides and routing-table slot it held."""
        in_smaller, in_larger = node_id in self.smaller, node_id in self.larger
        if in_smaller:
            self.smaller.remove(node_id)
        if in_larger:
            self.larger.remove(node_id)
        if in_smaller or in_larger:
            self._update_wraps()
        if node_id in self.neighbours:
            self.neighbours.remove(node_id)
        slot: tuple[int, int] | None = None
        r = shared_prefix_len(node_id, self.node_id)
        if r < len(self.rows):
            c = digit(node_id, r)
            if self.rows[r][c] == node_id:
                self.rows[r][c] = None
                slot = (r, c)
                self.vacated[slot] = node_id
        return Removal(in_smaller, in_larger, slot)


class Removal(NamedTuple):
    """What :meth:`PastryState.remove` took out."""

    smaller: bool
    larger: bool
    slot: tuple[int, int] | None


def _insert_side(side: list[int], node: int, dist: int, me: int, half: int, sign: int) -> bool:
    """Insert ``node`` at distance ``dist`` into one leaf-set side (kept sorted, <= half)."""
    if node in side:
        return False
    i = 0
    while i < len(side) and ((side[i] - me) * sign) & MASK < dist:
        i += 1
    if i >= half:
        return False
    side.insert(i, node)
    if len(side) > half:
        side.pop()
    return True


# --------------------------------------------------------------------------------------- node


class PastryNode(Core):
    """A Pastry node as a sans-IO core: ``on_message`` / ``on_timer`` return effects.

    ``address`` is the driver's node id (what ``Send.dst`` names); ``node_id`` the 128-bit
    Pastry id. A delivered ``Route`` becomes ``Deliver(sub=key, event=route)`` where
    ``route.hops`` is the number of sends it took.
    """

    __slots__ = (
        "_awaiting",
        "_dead",
        "_join_final",
        "_join_hops",
        "_leaf_asked",
        "address",
        "book",
        "heartbeat",
        "node_id",
        "ready",
        "rng",
        "state",
    )

    def __init__(
        self,
        address: int,
        node_id: int,
        *,
        rng: random.Random,
        book: AddressBook | None = None,
        leaf_size: int = LEAF_SIZE,
        heartbeat: float | None = None,
    ) -> None:
        if type(address) is not int:
            raise ProtocolError(f"PastryNode: an address is an int, got {address!r}")
        self.address = address
        self.node_id = node_id
        self.rng = rng
        self.state = PastryState(node_id, leaf_size=leaf_size)
        self.book = book if book is not None else AddressBook()
        self.book.learn(node_id, address)
        self.ready = False
        self._dead: set[int] = set()
        self._leaf_asked: set[int] = set()  # asked for their leaf set in the current repair
        self._join_hops: set[int] = set()
        self._join_final: int | None = None
        if heartbeat is not None and not heartbeat > 0:
            raise ProtocolError(f"PastryNode: the heartbeat period must be > 0, got {heartbeat!r}")
        self.heartbeat = heartbeat
        self._awaiting: set[int] = set()  # leaves pinged this round, not yet answered

    # -- local calls

    def route(self, key: int, payload: Any) -> list[Effect]:
        """Start routing ``payload`` towards the node responsible for ``key``."""
        return self._forward(Route(key, payload, 0, self.address))

    def join(self, bootstrap: int | None) -> list[Effect]:
        """Join through the node at address ``bootstrap`` (None: the first node); also
        starts the heartbeats if enabled."""
        out = self.start()
        if bootstrap is None:
            self.ready = True
            return out
        return [Send(bootstrap, Join(self.node_id, self.address, 0)), *out]

    def start(self) -> list[Effect]:
        """The first heartbeat timer (nothing if heartbeats are off); :meth:`join` calls it,
        nodes made by :func:`build_static` need it called once."""
        return [] if self.heartbeat is None else [SetTimer(self.heartbeat, HEARTBEAT)]

    def learn(self, node_id: int, addr: int) -> bool:
        """Add a node (id, address) to our state; False if ignored or known already."""
        if node_id in self._dead or node_id == self.node_id:
            return False
        self.book.learn(node_id, addr)
        return self.state.add(node_id)

    def entries(self, ids: Iterator[int] | list[int] | set[int]) -> Entries:
        addr_of = self.book.addr_of
        return ((self.node_id, self.address), *((n, addr_of[n]) for n in ids))

    def node_failed(self, addr: int) -> list[Effect]:
        """The failure detector says the node at ``addr`` is dead: forget it and repair."""
        node_id = self.book.id_of.get(addr)
        if node_id is None or node_id == self.node_id:
            return []
        self._dead.add(node_id)
        gone = self.state.remove(node_id)
        out = self._ask_leaf_set(gone.smaller, gone.larger)
        if gone.slot is not None:
            out.extend(self._ask_row(gone.slot[0]))
        return out

    def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
        """The driver could not deliver ``msg`` to ``dst``: forget ``dst`` and re-route
        ``msg`` if it is a ``Route`` or someone else's ``Join`` (if our own ``Join`` failed,
        the bootstrap is dead: call :meth:`join` again with another)."""
        out = self.node_failed(dst)
        match msg:
            case Join() if msg.joiner_id == self.node_id:
                pass  # our own: the bootstrap is dead
            case Join():
                out.extend(self._on_join(Join(msg.joiner_id, msg.joiner_addr, msg.hops - 1), retry=True))
            case Route():
                out.extend(self._forward(Route(msg.key, msg.payload, msg.hops - 1, msg.origin)))
        return out

    # -- driver entry points

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        match msg:
            case Route():
                return self._forward(msg)
            case Join():
                return self._on_join(msg, retry=False)
            case JoinState():
                return self._on_join_state(msg)
            case Announce():
                self._heard_from(msg.node_id, msg.addr)
                self._learn_all(msg.entries)
                return []
            case LeafSetRequest():
                self._heard_from(msg.node_id, msg.addr)
                reply = LeafSetReply(self.node_id, self.address, self.entries(self.state.leaf_set()))
                return [Send(msg.addr, reply)]
            case LeafSetReply():
                return self._on_leaf_set_reply(msg)
            case RowRequest():
                self._heard_from(msg.node_id, msg.addr)
                row = self.entries(self.state.row(msg.row))
                return [Send(msg.addr, RowReply(self.node_id, self.address, row))]
            case RowReply():
                self._heard_from(msg.node_id, msg.addr)
                self._learn_all(msg.entries)
                return []
            case Ping():
                self._heard_from(msg.node_id, msg.addr)
                return [Send(msg.addr, Pong(self.node_id, self.address))]
            case Pong():
                self._awaiting.discard(msg.node_id)
                self._heard_from(msg.node_id, msg.addr)
                return []
            case _:
                raise ProtocolError(f"Pastry node {self.address}: unknown message {msg!r} from {src}")

    def on_timer(self, key: Any, now: float) -> list[Effect]:
        if key != HEARTBEAT or self.heartbeat is None:
            raise ProtocolError(f"Pastry node {self.address}: unknown timer {key!r}")
        return self._heartbeat_round(self.heartbeat)

    # -- transitions

    def _forward(self, msg: Route) -> list[Effect]:
        nxt = self.state.next_hop(msg.key)
        if nxt is None:
            return [Deliver(msg.key, msg)]
        return [Send(self.book.addr_of[nxt], Route(msg.key, msg.payload, msg.hops + 1, msg.origin))]

    def _on_join(self, msg: Join, *, retry: bool) -> list[Effect]:
        nxt = self.state.next_hop(msg.joiner_id)
        if nxt == msg.joiner_id:  # a stale entry for a rejoining id: we are the closest
            nxt = None
        out: list[Effect] = []
        if nxt is None or not retry:
            r = shared_prefix_len(self.node_id, msg.joiner_id)
            ids: set[int] = set()
            for i in range(min(r + 1, len(self.state.rows))):
                ids.update(self.state.row(i))
            if nxt is None:
                ids.update(self.state.leaf_set())
            ids.discard(msg.joiner_id)
            state = JoinState(self.node_id, self.address, msg.hops, self.entries(ids), nxt is None)
            out.append(Send(msg.joiner_addr, state))
        if nxt is not None:
            out.append(Send(self.book.addr_of[nxt], Join(msg.joiner_id, msg.joiner_addr, msg.hops + 1)))
        return out

    def _on_join_state(self, msg: JoinState) -> list[Effect]:
        self._heard_from(msg.node_id, msg.addr)
        self._learn_all(msg.entries)
        if self.ready:
            return []
        self._join_hops.add(msg.hop)
        if msg.final:
            self._join_final = msg.hop
        if self._join_final is None or len(self._join_hops) < self._join_final + 1:
            return []
        self.ready = True
        known = self.state.known()
        ann = Announce(self.node_id, self.address, self.entries(known))
        addr_of = self.book.addr_of
        return [Send(addr_of[n], ann) for n in sorted(known)]

    def _on_leaf_set_reply(self, msg: LeafSetReply) -> list[Effect]:
        """Merge a leaf set, then ask each leaf not asked yet in this repair for its own:
        the far leaf may have been repairing too when it answered, and a leaf learnt
        meanwhile (from any message) knows the nodes beyond it. Each node is asked at most
        once per repair, so it ends."""
        self._heard_from(msg.node_id, msg.addr)
        self._learn_all(msg.entries)
        self._leaf_asked.add(msg.node_id)
        ask = [n for n in self.state.leaf_set() if n not in self._leaf_asked]
        self._leaf_asked.update(ask)
        req = LeafSetRequest(self.node_id, self.address)
        addr_of = self.book.addr_of
        return [Send(addr_of[n], req) for n in ask]

    def _heard_from(self, node_id: int, addr: int) -> None:
        """A message from the node itself: it is alive (even if we thought it dead)."""
        self._dead.discard(node_id)
        self.learn(node_id, addr)

    def _learn_all(self, entries: Entries) -> bool:
        changed = False
        for node_id, addr in entries:
            changed = self.learn(node_id, addr) or changed
        return changed

    def _heartbeat_round(self, period: float) -> list[Effect]:
        """Leaves that did not answer last round's ping are dead; ping the others."""
        out: list[Effect] = []
        addr_of = self.book.addr_of
        for silent in sorted(self._awaiting):
            if silent in self.state.smaller or silent in self.state.larger:
                out.extend(self.node_failed(addr_of[silent]))
        leaves = self.state.leaf_set()
        self._awaiting = set(leaves)
        ping = Ping(self.node_id, self.address)
        out.extend(Send(addr_of[n], ping) for n in leaves)
        out.append(SetTimer(period, HEARTBEAT))
        return out

    def _ask_leaf_set(self, smaller: bool, larger: bool) -> list[Effect]:
        """Ask the farthest live leaf of each flagged side (the other side's if it is empty)
        for its leaf set (section 2.4)."""
        st = self.state
        targets: set[int] = set()
        for flagged, side, other in ((smaller, st.smaller, st.larger), (larger, st.larger, st.smaller)):
            if flagged and (side or other):
                targets.add(side[-1] if side else other[-1])
        if targets:
            self._leaf_asked = set(targets)  # a new repair episode
        req = LeafSetRequest(self.node_id, self.address)
        return [Send(self.book.addr_of[t], req) for t in sorted(targets)]

    def _ask_row(self, r: int) -> list[Effect]:
        """Ask another node of row r (or else row r+1) for its row r."""
        for row in (r, r + 1):
            peers = self.state.row(row)
            if peers:
                peer = peers[self.rng.randrange(len(peers))]
                return [Send(self.book.addr_of[peer], RowRequest(self.node_id, self.address, r))]
        return []
