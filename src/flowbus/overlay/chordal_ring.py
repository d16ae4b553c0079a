"""The chordal reliability ring: a broker overlay that survives broker and link failures
(sans-IO core).

How it works (Madhu Kumar, Bellur, Govindan, "Chordal Reliability Rings", section 3):

* Ids (section 3.3): a 2^32 circle. The first broker takes 0, the second 2^16 - 1, and
  every later one the id midway between its two neighbours-to-be.
* The ring (figure 4): each broker links to Left, Right, Leftleft and Rightright. It keeps
  them as its *window*: the up-to-four other brokers nearest to it on each side, sorted
  clockwise. With five brokers or fewer the window is everyone else, so the pointers
  coincide, or point back to the broker itself, and nothing special-cases small rings.
* Chords (a choice the document leaves open): the brokers 2^j ring positions clockwise,
  j = 2, 3, ... while 2^j < n, about log2 n of them, built by pointer doubling from
  Rightright (:class:`~flowbus.overlay.ring_chords.Chords`). Greedy clockwise routing
  through these chords (the farthest known broker that does not overshoot the target)
  takes at most about log2 n hops, and the degree stays 4 + log2 n - 2, bounded by log n
  as the document assumes.
* Join (section 3.3, Process-join-request): the newcomer pings the candidate brokers it is
  given and sends a ``JoinRequest`` to the one with the lowest round-trip time. That broker
  y takes the newcomer as its left neighbour if there is at least as much id space on its
  left as on its right (and some), else as its right neighbour if there is space there,
  else it forwards the request to its Rightright.
  - The newcomer gets the midway id and its window.
  - The brokers whose window changes (at most four besides the newcomer) get an
    ``Insert``. The document's pseudo-code updates four of them and omits the
    far-left broker's Rightright; here all are updated.
  - The document's left-case formula reads ``id[y] + gap/2``. That lies on y's *right*;
    the midway point meant is ``id[Left] + gap/2``.
* Backups (section 3.5): a broker's state (an opaque mapping the layers above own:
  subscriptions, routing entries, undelivered events) is copied to its first ``backup``
  holders in the order Right, Left, Rightright, Leftleft, again whenever the window
  changes; while the holders stay the same, only the changes go
  (:class:`~flowbus.overlay.ring_backups.Backups`, whose note has the details).
* Node failure (section 3.4.1, figure 5): A suspects its neighbour B, from a missed
  heartbeat or a failed send. Who is suspected, tested and heard is
  :class:`~flowbus.overlay.ring_detector.FailureDetector`'s (one record per suspect, its
  note has the state diagram); what is done about a verdict is this module's.
  - A asks C, B's other ring neighbour, to test B (``TestNeighbour``). C probes B.
  - If B does not answer and C's verdict is conclusive (B proven gone: a connection to it
    refused; or silent at C for the guard), C tells A ``Failed``. If A agrees (the proof,
    or B silent at A for the guard too), A and C run *divide-neighbour(B)*: A closes the
    ring over B and tells C (``SetSide`` naming B dead), the brokers whose windows held B
    are told, B's other neighbours (its chords, known from B's backup) are ``Redirect``-ed
    to A or C. The holder of B's backup takes B's state over. All of this costs
    O(degree(B)) messages.
  - If B answers, the failure was of the link A-B. A then sends B's traffic through C.
  - If C is proven gone too (two adjacent crashes), A probes B itself, and buries both once
    B is found dead; it looks for the next live broker beyond them through its chords and
    walks back counter-clockwise to it (``Reconnect``). If C cannot be reached but is not
    proven gone, A asks it again and again, and buries nobody: B and C may be cut off
    together and still serve each other.
* Brokers alive but unreachable (not in the document; flowbus's own rule, measured by the
  fault campaign, ``flowbus chaos``). Both of B's ring neighbours must find B dead (or it
  must be proven gone) before its state is taken over, and a verdict without proof waits
  until B has been silent for the guard (``GUARD`` heartbeats). Meanwhile B *serves* (its
  driver acknowledges publishes and takes clients) only while a ring neighbour echoed one
  of its heartbeats sent within the lease (``LEASE`` heartbeats, :meth:`RingNode.serving`),
  so when its state is taken over, B has stopped serving already. Once found dead, a
  broker is dead for good under its id: what it sends later (heartbeats, backups, probes)
  is answered ``Dead``, and a broker told so goes inert (:attr:`RingNode.declared_dead`,
  and ``Deliver(("ring", "dead"), ...)`` to its driver, which comes back as a new member).
  A ring split in two takes nobody over (each broker at the cut still has a neighbour on
  its side, and no verdict through the cut); it is one ring again when the links are back.
* Restarts. A process restarted on a member's address is not that member: before joining it
  tells the member's old neighbours (``Restarted``, :meth:`RingNode.announce`), a proof that
  the member is gone; they bury it at once (its state taken over as after a crash) and
  answer ``Dead`` with its taker, and the process joins as a new member. An id is never
  given twice (a broker restarted into the same gap gets the next free one).
* Link failure off the ring (section 3.4.2 b): when a chord A-B fails, A routes a
  ``TracedQuery`` to B through other links, each hop appending itself. B answers with
  ``LinkDown`` along the reversed trace, and A keeps the trace as its route to B.
* Load (section 3.4, the three steps of a loaded broker): the driver says what was routed
  (:meth:`RingNode.routed`, with its ``now``); each heartbeat round the broker weighs its
  rate and state against ``rate_limit`` and ``load_limit``, passes part of its state to a
  ring neighbour with room (``ShareState``), or, none having room, hands its driver
  ``Deliver(("ring", "overloaded"), Overloaded(...))``, a request for another broker
  (:mod:`flowbus.overlay.ring_load` has the rules). A share is acknowledged (``ShareAck``);
  unanswered it is sent again, then taken back (:class:`~flowbus.overlay.ring_load.ShareLedger`).

Addresses are the driver's node ids (``Send.dst``). Randomness is never needed: every
choice is deterministic.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

from flowbus.core import CancelTimer, Core, Deliver, Effect, Send, SetTimer
from flowbus.errors import ProtocolError
from flowbus.overlay.ring_backups import Backups
from flowbus.overlay.ring_chords import Chords
from flowbus.overlay.ring_detector import FailureDetector, Phase
from flowbus.overlay.ring_load import LoadShare, Overloaded, ShareAck, ShareLedger
from flowbus.overlay.ring_messages import (
    BACKUP_ORDER,
    ID_SPACE,
    MAX_HOPS,
    SECOND_ID,
    WINDOW,
    Alive,
    BackupAck,
    BackupCopy,
    BackupDelta,
    BackupResync,
    ChordQuery,
    ChordReply,
    Dead,
    Failed,
    Heartbeat,
    HeartbeatAck,
    Insert,
    JoinAccept,
    JoinRequest,
    LinkDown,
    Peer,
    Ping,
    Pong,
    Probe,
    ProbeAck,
    Reconnect,
    Redirect,
    Restarted,
    RingRoute,
    SetSide,
    ShareState,
    TestNeighbour,
    TracedQuery,
    cw,
)

__all__ = [
    "ANNOUNCE",
    "GUARD",
    "ID_SPACE",
    "LEASE",
    "MESSAGES",
    "ORPHAN_ROUNDS",
    "SECOND_ID",
    "Peer",
    "RingNode",
    "RingRoute",
]

LEASE = 3
"""A broker serves while a ring neighbour acknowledged one of its heartbeats sent within
this many heartbeat periods (:meth:`RingNode.serving`)."""

GUARD = 4
"""A suspect is found dead without proof only once silent for this many heartbeat periods:
past any lease it could still hold (the detector's ``guard``)."""

ANNOUNCE = 5
"""How many times a restart is announced before joining without an answer (:meth:`RingNode.announce`)."""

ORPHAN_ROUNDS = 4
"""Heartbeat rounds a holder waits for an earlier live holder of a dead broker's backup to
say it took it over (``Redirect``) before taking it over itself: past the ``GUARD`` in which
that holder, a ring neighbour of the dead one too, finds it dead."""


# ---------------------------------------------------------------------------------- node


class RingNode(Core):
    """One broker of the chordal reliability ring (see the module note): membership, the
    window, chords, routing and repair; its backups in :attr:`backups`, its failure
    detector in :attr:`detector`.

    ``backup`` (1..4) is how many ring neighbours hold a copy of this broker's state;
    ``heartbeat`` the period of the ring-neighbour heartbeats (None: failures are only
    found through failed sends, the driver's failure notices); ``probe_timeout`` how long
    a tester waits for a probed broker; ``load_limit`` the state entries above which a
    broker passes some on (after a takeover, or in a heartbeat round); ``rate_limit`` the
    events routed per time unit (over ``load_window``) above which it does; ``movable``
    which state entries a load share may pass on (None: any; a broker whose entries are
    its own clients' subscriptions passes none, and only asks for brokers); ``keyed`` what
    a state key taken over or shared from another broker is here (the layer above's typed
    record of a plain tuple off the wire; None: the key as it came); ``nonce`` is
    this process's own number (its start time, say), sent with its join: a broker restarted
    into the gap it left gets another id than it had (0: the document's midway ids).
    """

    def __init__(
        self,
        addr: int,
        *,
        backup: int = 2,
        heartbeat: float | None = None,
        probe_timeout: float = 4.0,
        ping_timeout: float = 4.0,
        load_limit: int | None = None,
        rate_limit: float | None = None,
        load_window: float = 1.0,
        movable: Callable[[Hashable], bool] | None = None,
        keyed: Callable[[Hashable], Hashable] | None = None,
        nonce: int = 0,
    ) -> None:
        if not 1 <= backup <= 4:
            raise ProtocolError(f"RingNode: the backup factor is 1..4, got {backup!r}")
        if heartbeat is not None and not heartbeat > 0:
            raise ProtocolError(f"RingNode: the heartbeat period must be > 0, got {heartbeat!r}")
        if load_limit is not None and load_limit < 1:
            raise ProtocolError(f"RingNode: the load limit is >= 1 state entries, got {load_limit!r}")
        self.addr = addr
        self.nonce = nonce  # (sent with our join: see _offset)
        self._admitted: dict[tuple[int, int], Peer] = {}  # (address, nonce) -> the member we made
        self.id: int | None = None
        self.backup = backup
        self.load_limit = load_limit
        self.heartbeat = heartbeat
        self.ping_timeout = ping_timeout
        self.lease: float | None = LEASE * heartbeat if heartbeat is not None else None
        self._beating = False  # (the heartbeat timer is set)
        self.detector = FailureDetector(
            probe_timeout=probe_timeout, guard=GUARD * heartbeat if heartbeat is not None else 0.0
        )
        self.declared_dead: Dead | None = None  # the ring found us dead (we must come back anew)
        self.previous: Peer | None = None  # the member we were before a restart (announce)
        self.buried: Dead | None = None  # the ring's answer: it is buried (and who took it over)
        self._told_restart: tuple[int, ...] = ()  # where the restart was announced
        self._announced = 0  # how many times
        self.backups = Backups(keyed)
        self.succ: list[Peer] = []  # Right, Rightright (the nearest others clockwise)
        self.pred: list[Peer] = []  # Left, Leftleft (the nearest others counter-clockwise)
        self.open: set[int] = set()  # sides (1: right, -1: left) that lost a broker, not yet refilled
        self.chords = Chords()  # level j >= 2 -> the broker 2^j positions clockwise
        self.redirect: dict[int, Peer] = {}  # dead broker id -> who took over
        self.taken_by: dict[int, Peer] = {}  # the same, as the taker itself told (or us)
        self.detour: dict[int, tuple[Peer, ...]] = {}  # broker id -> path when our link to it is down
        self.dead: set[int] = set()
        self.dead_at: dict[int, int] = {}  # dead member id -> its address
        self._near: set[int] = set()  # the ring neighbours at the last lease check (serving)
        self._rtt: dict[int, float] = {}
        self._candidates: set[int] = set()
        self._was_side: dict[int, int] = {}  # dead neighbour id -> the side it was on
        self._was_side_addr: dict[int, int] = {}  # the same by address
        self.dropped = 0  # routed messages given up (hop limit, no next hop)
        self.taken_over: list[int] = []  # ids of the dead brokers whose state we took over
        self.loads = LoadShare(rate_limit=rate_limit, window=load_window, movable=movable)
        self.shares = ShareLedger(timeout=probe_timeout)  # shares sent, until acknowledged

    # -- views

    @property
    def me(self) -> Peer:
        if self.id is None:
            raise ProtocolError(f"RingNode {self.addr}: not in the ring yet")
        return Peer(self.id, self.addr)

    @property
    def suspects(self) -> list[int]:
        """The ids of the brokers suspected and being tested."""
        return self.detector.suspects

    @property
    def watched(self) -> int:
        """How many brokers are suspected and being tested (cheap: for a driver's log)."""
        return self.detector.watched

    @property
    def state(self) -> Mapping[Hashable, Any]:
        """This broker's backed-up state (change it with :meth:`set_state`, :meth:`del_state`)."""
        return self.backups.state

    def keys_of(self, tag: Any, first: Any) -> set[Hashable]:
        """The keys ``(tag, first, ...)`` of the state, from its index (no scan)."""
        return self.backups.keys_of(tag, first)

    def keys_where(self, tag: Any, test: Callable[[Any], bool]) -> set[Hashable]:
        """The keys ``(tag, first, ...)`` of the state whose ``first`` passes ``test``."""
        return self.backups.keys_where(tag, test)

    @property
    def version(self) -> int:
        """The version of the last copy of the state (it changes with every copy)."""
        return self.backups.version

    @property
    def joined(self) -> bool:
        return self.id is not None

    @property
    def window(self) -> list[Peer]:
        """The ring neighbours we know, without repeats, clockwise from us."""
        if not self.joined:
            return []
        me = self.me.id
        return sorted({p.id: p for p in (*self.succ, *self.pred)}.values(), key=lambda p: cw(me, p.id))

    def _at(self, side: int, k: int) -> Peer | None:
        """The k-th (1 or 2) neighbour clockwise (side = 1) or counter-clockwise (-1); in a
        ring of fewer brokers the pointers wrap round (Rightright may be Left, or us)."""
        w = self.succ if side > 0 else self.pred
        if not w:
            return None
        if len(w) < k and side in self.open:
            return None  # a gap: not known until the ring is closed again
        return w[(k - 1) % len(w)]

    @property
    def right(self) -> Peer | None:
        return self._at(1, 1)

    @property
    def rightright(self) -> Peer | None:
        return self._at(1, 2)

    @property
    def left(self) -> Peer | None:
        return self._at(-1, 1)

    @property
    def leftleft(self) -> Peer | None:
        return self._at(-1, 2)

    def links(self) -> list[Peer]:
        """Every broker we link to: the window and the chords, without repeats."""
        out = {p.id: p for p in self.window}
        out.update((p.id, p) for p in self.chords.values())
        out.pop(self.id, None)  # type: ignore[arg-type]
        return sorted(out.values(), key=lambda p: cw(self.me.id, p.id))

    def side_of_addr(self, addr: int) -> int:
        """1 if the broker at ``addr`` is (or, dead, was) our Right, -1 our Left, else 0."""
        right, left = self.right, self.left
        if right is not None and right.addr == addr:
            return 1
        if left is not None and left.addr == addr:
            return -1
        return self._was_side_addr.get(addr, 0)

    def holders(self) -> tuple[Peer, ...]:
        """The ring neighbours that hold our backup (distinct, at most ``backup``)."""
        out: list[Peer] = []
        for name in BACKUP_ORDER:
            p = getattr(self, name)
            if p is not None and p not in out:
                out.append(p)
        return tuple(out[: self.backup])

    def _merge_window(self, peers: Iterable[Peer], *, closes: bool = False) -> bool:
        """Merge ``peers`` into the window: the 2 nearest known brokers on each side. A side
        that lost a broker is not refilled from what we know until news that ``closes`` the
        gap (the window of a broker beyond it); without it, a lone side would fill up with
        the other side's brokers. A broker the news names on that side (nearer there than on
        the other: a join, ``Insert``) is taken in, though: a broker that heard of a death
        only by a ``Redirect`` (in a small ring nobody sends it the closing ``SetSide``)
        would otherwise never take a new neighbour in. True if the window changed."""
        me = self.me
        known = {p.id: p for p in (*self.succ, *self.pred)}
        news = [p for p in peers if p.id != me.id and p.id not in self.dead and p.addr != me.addr]
        known.update((p.id, p) for p in news)
        if closes:
            self.open.clear()
        peers_ = known.values()

        def right(p: Peer) -> int:
            return cw(me.id, p.id)

        def left(p: Peer) -> int:
            return cw(p.id, me.id)

        if 1 in self.open:
            near = {p.id: p for p in (*self.succ, *(p for p in news if right(p) < left(p)))}
            succ = sorted(near.values(), key=right)[:WINDOW]
        else:
            succ = sorted(peers_, key=right)[:WINDOW]
        if -1 in self.open:
            near = {p.id: p for p in (*self.pred, *(p for p in news if left(p) < right(p)))}
            pred = sorted(near.values(), key=left)[:WINDOW]
        else:
            pred = sorted(peers_, key=left)[:WINDOW]
        changed = (succ, pred) != (self.succ, self.pred)
        self.succ, self.pred = succ, pred
        return changed

    # -- local calls

    def start(self) -> list[Effect]:
        """Be the first broker of a new ring (id 0)."""
        self.id = 0
        return self._after_change()

    def join(self, candidates: Sequence[int]) -> list[Effect]:
        """Join through the candidate with the lowest round-trip time (pinged first)."""
        if self.joined:
            raise ProtocolError(f"RingNode {self.addr}: already in the ring")
        if not candidates:
            raise ProtocolError(f"RingNode {self.addr}: no broker to join through")
        self._candidates = set(candidates)
        out: list[Effect] = [Send(c, Ping(self.addr, -1.0)) for c in sorted(self._candidates)]
        out.append(SetTimer(self.ping_timeout, ("ring", "join")))
        return out

    def announce(self, previous: Peer, peers: Sequence[int]) -> list[Effect]:
        """Before joining: we are a new process on the address of ``previous`` (a restart).
        ``Restarted`` goes to ``peers`` (its old ring neighbours and our join candidates),
        again every ``ping_timeout`` until one answers ``Dead`` naming who took it over (at
        most ``ANNOUNCE`` times); then ``Deliver(("ring", "buried"), Dead(...))`` tells the
        driver (its taker is None if nobody answered with one), which joins next."""
        if self.joined:
            raise ProtocolError(f"RingNode {self.addr}: announce a restart before joining")
        if not peers:
            raise ProtocolError(f"RingNode {self.addr}: no broker to announce a restart to")
        self.previous, self.buried = previous, None
        self._told_restart, self._announced = tuple(sorted(set(peers))), 0
        return self._announce()

    def met(self, src: int) -> list[Effect]:
        """``src`` spoke to us while we announce a restart: it takes us for the member we were
        (it joined next to that member's place after we died, so we never knew it): it is
        told ``Restarted`` too, now and at each announcement. Untold, it heard a process at
        the address and took the dead member for alive: its tests of it said "alive" for 65 s
        while the member's subscriptions were served by nobody (a simulator schedule, 889
        deliveries lost)."""
        if self.id is not None or self.previous is None or self.buried is not None:
            return []
        if src == self.addr or src in self._told_restart:
            return []
        self._told_restart = tuple(sorted({*self._told_restart, src}))
        return [Send(src, Restarted(self.previous))]

    def _announce(self) -> list[Effect]:
        assert self.previous is not None
        self._announced += 1
        if self._announced > ANNOUNCE:  # (nobody knows it, or nobody took it over)
            self.buried = Dead(self.previous, None)
            return [Deliver(("ring", "buried"), self.buried)]
        out: list[Effect] = [Send(a, Restarted(self.previous)) for a in self._told_restart]
        return [*out, SetTimer(self.ping_timeout, ("ring", "announce"))]

    def set_state(self, key: Hashable, value: Any) -> list[Effect]:
        """Set a key of the backed-up state. The copy to the holders goes out on a timer of
        delay 0, so the changes of one step of the driver (a burst of subscriptions, say)
        cost one copy, not one each."""
        self.backups.set(key, value)
        return self.backups.soon() if self.joined else []

    def set_states(self, changes: Mapping[Hashable, Any]) -> list[Effect]:
        """:meth:`set_state` for each of ``changes`` (one copy for them all, as there)."""
        backups = self.backups
        for key, value in changes.items():
            backups.set(key, value)
        return backups.soon() if self.joined and changes else []

    def del_state(self, key: Hashable) -> list[Effect]:
        self.backups.delete(key)
        return self.backups.soon() if self.joined else []

    def flush_backups(self) -> list[Effect]:
        """The changes of the state made so far, to the holders now (not at the step's end):
        for a change that must be backed up before the step's other effects are relied on
        (the copy the step's timer would have sent then has nothing to send: it is cancelled)."""
        if not self.joined:
            return []
        return self._send_backups(force=True) + self.backups.flushed()

    def start_heartbeats(self, period: float) -> list[Effect]:
        """Turn on the ring-neighbour heartbeats (a ring built without them, then watched),
        and with them the leases and the guard (see the module note)."""
        if not period > 0:
            raise ProtocolError(f"RingNode: the heartbeat period must be > 0, got {period!r}")
        self.heartbeat = period
        self.lease = LEASE * period
        self.detector.guard = GUARD * period
        self._beating = True
        return [SetTimer(period, ("ring", "heartbeat"))]

    def serving(self, now: float) -> bool:
        """Whether this broker may serve (acknowledge publishes, take subscriptions): it is
        in the ring, not found dead, and a ring neighbour acknowledged one of its heartbeats
        sent within the lease (alone, or without heartbeats, it always may)."""
        if self.declared_dead is not None or self.id is None:
            return False
        if self.lease is None:
            return True
        near = self._note_neighbours(now)
        if not near:
            return True
        since = now - self.lease
        return any(self.detector.echoed(i) >= since for i in near)

    def _note_neighbours(self, now: float) -> set[int]:
        """The ring neighbours' ids, noted after every message and timer: a new one's lease
        runs from when it became one, as it saw us just then. Also when it had been a
        neighbour before: by its old echo, a broker whose two neighbours died at once
        stopped serving the moment it had new ones, its clients sent away (1,528 deliveries
        lost in a campaign run). Noted only when asked whether we serve, a broker that read
        nothing for longer than its lease took its neighbours for new ones and served on."""
        near = {p.id for p in (self.left, self.right) if p is not None and p.id != self.id}
        for i in near - self._near:
            self.detector.echo(i, now)
        self._near = near
        return near

    def refresh_chords(self) -> list[Effect]:
        """(Re)build the chords by pointer doubling from Rightright."""
        if not self.joined:
            return []  # (no chords yet)
        return self.chords.refresh(self.me, right=self.right, rightright=self.rightright)

    def route(self, target: int, payload: Any) -> list[Effect]:
        """Send ``payload`` over the overlay to the broker with id ``target``."""
        return self._on_route(RingRoute(target, payload, 0))

    def routed(self, now: float, n: int = 1, key: Hashable | None = None) -> None:
        """``n`` events were routed by this broker at ``now`` (its load's rate), for the
        state entry ``key`` if the driver names it (then the busiest entries move first)."""
        self.loads.meter.routed(now, n, key)

    def load(self, now: float) -> float:
        """The larger of rate / ``rate_limit`` and state entries / ``load_limit`` (1.0: at the limit)."""
        return self.loads.load(now, len(self.state), self.load_limit)

    def check_load(self, now: float) -> list[Effect]:
        """Over the limit: pass part of the state to a ring neighbour with room, or, if
        none has, ask the driver for another broker (section 3.4's steps; ring_load)."""
        if not self.joined:
            return []
        me = self.me
        near = [p for p in (self.left, self.right) if p is not None and p.id != me.id]
        match self.loads.decide(me, now, self.state, near, self.load_limit):
            case Overloaded() as request:
                return [Deliver(("ring", "overloaded"), request)]
            case (Peer() as to, list(keys)):
                moved = self.backups.hand_over(keys)
                return [*self.shares.send(me, to, moved), *self._send_backups(force=True)]
        return []

    # -- driver entry points

    def heard_from(self, addr: int, now: float) -> None:
        """Something came from ``addr`` (a driver calls this for its other layers' messages)."""
        self.detector.heard(addr, now)

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        self.detector.heard(src, now)
        handler = _HANDLERS.get(type(msg))
        if handler is None:
            raise ProtocolError(f"RingNode {self.addr}: unknown message {msg!r} from {src}")
        if self.declared_dead is not None:
            return []  # (found dead: we are not a member any more, whatever comes)
        if self.id is None and type(msg) not in _BEFORE_JOINING:
            return self.met(src)  # (meant for a member: maybe the one we were before a restart)
        out = handler(self, src, msg, now)
        self._note_neighbours(now)
        return out

    def on_peer_gone(self, dst: int, now: float) -> list[Effect]:
        """``dst``'s process is gone (a refused connection): a proof, for the detector's
        verdicts, that the brokers we know at that address are gone (the failed sends it
        explains come next); a ring neighbour is suspected."""
        if not self.joined or self.declared_dead is not None:
            return []
        for p in self._at_addr(dst):
            self.detector.gone(p.id, now)
        near = next((p for p in (self.left, self.right) if p is not None and p.addr == dst), None)
        return self._suspect(near) if near is not None and near.id != self.id else []

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        if self.declared_dead is not None:
            return []
        match key:
            case ("ring", "join"):
                return self._choose_bootstrap()
            case ("ring", "announce"):
                return [] if self.buried is not None or self.previous is None else self._announce()
            case ("ring", "heartbeat"):
                out = self._heartbeat_round(now)
                self._note_neighbours(now)
                return out
            case ("ring", "backup"):
                self.backups.timer_went_off()
                return self._send_backups(force=True)
            case ("ring", "probe", int(suspect)):
                return self._probe_expired(suspect, now, timer=True)
            case ("ring", "test", int(suspect)):
                return self._test_expired(suspect, now, timer=True)
            case ("ring", "share", int(seq)):
                back, out = self.shares.expired(self.me, seq)
                return out + self._take_back(back)
        raise ProtocolError(f"RingNode {self.addr}: unknown timer {key!r}")

    def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
        """A send could not reach ``dst``: suspect it if it is a neighbour, re-route a route."""
        if self.declared_dead is not None:
            return []
        peer = next((p for p in self.links() if p.addr == dst), None) if self.joined else None
        out: list[Effect] = []
        if isinstance(msg, Probe):  # (a verdict now only if the probed is proven gone)
            probed = [i for i in self.detector.probed if self.detector.probing(i).suspect.addr == dst]  # type: ignore[union-attr]
            return [e for i in probed for e in self._probe_expired(i, now, timer=False)]
        if isinstance(msg, TestNeighbour):
            return self._test_expired(msg.suspect.id, now, timer=False)
        if isinstance(msg, ShareState) and msg.sender.addr == self.addr:  # not passed on: ours again
            _, out = self.shares.take_back(dst, msg.seq)
            out.extend(self._take_back(msg.entries))
        if peer is not None:
            out.extend(self._suspect(peer))
        if isinstance(msg, RingRoute | TracedQuery | LinkDown):
            self.detour.setdefault(self._peer_id(dst), ())
        if isinstance(msg, RingRoute):
            out.extend(self._on_route(msg))
        elif isinstance(msg, TracedQuery):  # the query goes on by another link
            nxt = self._next_hop(msg.target.id)
            if nxt is not None:
                out.append(Send(nxt.addr, msg))
        return out

    def _at_addr(self, addr: int) -> list[Peer]:
        """The brokers we know at ``addr``: window, chords, suspects, testers, probed."""
        d = self.detector
        known = [*self.window, *self.chords.values(), *d.testers()]
        known += [s.peer for i in d.suspects if (s := d.suspicion(i)) is not None]
        known += [pr.suspect for i in d.probed if (pr := d.probing(i)) is not None]
        return [p for p in dict.fromkeys(known) if p.addr == addr and p.id != self.id]

    def _peer_id(self, addr: int) -> int:
        for p in (*self.window, *self.chords.values(), *self.detector.testers()):
            if p.addr == addr:
                return p.id
        return next(iter(self.detector.probed), -1)  # (else the first broker we probe)

    def _known(self, peer_id: int) -> Peer | None:
        """The broker of id ``peer_id`` in our window or among our suspects' testers."""
        return next((p for p in (*self.window, *self.detector.testers()) if p.id == peer_id), None)

    # -- join

    def _on_ping(self, src: int, msg: Ping, now: float) -> list[Effect]:
        if not self.joined:  # (it cannot take a join: answered, two adjacent brokers restarted
            return []  # together took each other for the nearest way in, for ever)
        return [Send(msg.addr, Pong(self.addr, msg.sent))]

    def _on_pong(self, src: int, msg: Pong, now: float) -> list[Effect]:
        if msg.addr in self._candidates and not self.joined:
            self._rtt[msg.addr] = now
            if len(self._rtt) == len(self._candidates):  # all answered: no need to wait on
                return [CancelTimer(("ring", "join")), *self._choose_bootstrap()]
        return []

    def _choose_bootstrap(self) -> list[Effect]:
        if self.joined or not self._rtt:
            return [] if self.joined else self.join(sorted(self._candidates))
        best = min(self._rtt, key=lambda a: (self._rtt[a], a))
        self._rtt.clear()
        # (asked again if no JoinAccept comes: the broker asked may die with the request,
        # and a broker restarted in a rolling restart then never joined)
        return [
            Send(best, JoinRequest(self.addr, 0, self.nonce)),
            SetTimer(3 * self.ping_timeout, ("ring", "join")),
        ]

    def _on_join_request(self, src: int, msg: JoinRequest, now: float) -> list[Effect]:
        me = self.me
        made = self._admitted.get((msg.addr, msg.nonce))
        if made is not None and made in self.window:  # (asked again: the answer was slow)
            others = [me, *(p for p in self.window if p != made)]
            return [Send(made.addr, JoinAccept(made.id, tuple(_window_of(made, others))))]
        if not self.succ:
            new_id = SECOND_ID if me.id == 0 else (me.id + ID_SPACE // 2) % ID_SPACE
            new_id = _offset(new_id, ID_SPACE // 2, msg.nonce)
        else:
            left, right = self.left or self.right, self.right or self.left  # (one side lost)
            assert left is not None and right is not None  # (succ is not empty)
            lgap, rgap = cw(left.id, me.id), cw(me.id, right.id)
            if lgap >= rgap and lgap > 1:
                new_id = _offset((left.id + lgap // 2) % ID_SPACE, lgap, msg.nonce)
            elif rgap > 1:
                new_id = _offset((me.id + rgap // 2) % ID_SPACE, rgap, msg.nonce)
            else:  # no id space next to us: ask our Rightright
                rr = self.rightright
                assert rr is not None
                return [Send(rr.addr, JoinRequest(msg.addr, msg.hops + 1, msg.nonce))]
        while new_id in self.dead or new_id == me.id:  # (an id is never given twice: a broker
            new_id = (new_id + 1) % ID_SPACE  # restarted into the same gap is another member)
        new = Peer(new_id, msg.addr)
        self._admitted[(msg.addr, msg.nonce)] = new
        everyone = [me, *self.window]
        self._merge_window([new])
        affected = {p.id: p for p in _window_of(new, everyone) if p.id != me.id}
        window = tuple(_window_of(new, everyone))
        out: list[Effect] = [Send(new.addr, JoinAccept(new_id, window))]
        out.extend(Send(p.addr, Insert(new)) for p in sorted(affected.values()))
        return out + self._after_change()

    def _on_join_accept(self, src: int, msg: JoinAccept, now: float) -> list[Effect]:
        """We are member ``msg.id``. An answer to a request asked again at another broker,
        once we are a member, made a second member at our address: its window is told at
        once that it is gone (``Restarted``), and buries it."""
        if self.id is not None:
            if msg.id == self.id:
                return []
            gone = Restarted(Peer(msg.id, self.addr))
            return [Send(p.addr, gone) for p in msg.window if p.addr != self.addr]
        self.id = msg.id
        self._merge_window(msg.window, closes=True)
        for p in msg.window:  # (our lease starts here: they have just taken us in)
            self.detector.echo(p.id, now)
        return self._after_change()

    def _on_insert(self, src: int, msg: Insert, now: float) -> list[Effect]:
        return self._after_change() if self._merge_window([msg.new]) else []

    def _after_change(self) -> list[Effect]:
        """Our window changed: re-send the backup if its holders changed; start heartbeats
        (if they are not running: set again at each change, a ring that changes often, under
        churn, would starve them, and the lease with them)."""
        out = self._send_backups(force=False)
        if self.heartbeat is not None and not self._beating:
            self._beating = True
            out.append(SetTimer(self.heartbeat, ("ring", "heartbeat")))
        return out

    # -- chords

    def _on_chord_query(self, src: int, msg: ChordQuery, now: float) -> list[Effect]:
        return self.chords.on_query(msg, rightright=self.rightright)

    def _on_chord_reply(self, src: int, msg: ChordReply, now: float) -> list[Effect]:
        return self.chords.on_reply(msg, me=self.me, rightright=self.rightright)

    # -- routing

    def _on_route_msg(self, src: int, msg: RingRoute, now: float) -> list[Effect]:
        return self._on_route(RingRoute(msg.target, msg.payload, msg.hops + 1))

    def _on_route(self, msg: RingRoute) -> list[Effect]:
        me = self.me
        target = self.redirect.get(msg.target, None)
        target_id = target.id if target is not None else msg.target
        if target_id == me.id or self._responsible(target_id):
            return [Deliver(("ring", msg.target), msg)]  # (a gone broker's id: its successor's)
        nxt = self._next_hop(target_id)
        if nxt is None or msg.hops >= MAX_HOPS:
            self.dropped += 1
            return []
        return [Send(nxt.addr, RingRoute(target_id, msg.payload, msg.hops))]

    def _responsible(self, target: int) -> bool:
        """``target`` lies between our Left (excluded) and us: with no broker of that id
        alive, we answer for it, as a successor does in Chord."""
        left = self.left
        return left is not None and 0 < cw(left.id, target) < cw(left.id, self.me.id)

    def _next_hop(self, target: int) -> Peer | None:
        """The farthest known broker clockwise that does not overshoot ``target`` (a broker
        we link to directly is used at once; a link that is down goes through its detour)."""
        me = self.me
        links = [p for p in self.links() if p.id not in self.dead]
        direct = next((p for p in links if p.id == target), None)
        if direct is not None and direct.id not in self.detour:
            return direct
        if self.detour.get(target):  # our link to it is down, and a way round is known
            return self.detour[target][0]
        usable = [p for p in links if p.id not in self.detour]
        goal = cw(me.id, target)
        ahead = [p for p in usable if cw(me.id, p.id) < goal]
        if ahead:
            return max(ahead, key=lambda p: cw(me.id, p.id))
        return min(usable, key=lambda p: cw(p.id, target), default=None)

    # -- backups (section 3.5)

    def _send_backups(self, *, force: bool) -> list[Effect]:
        """A copy of the state to its holders: if they changed, or ``force``d."""
        if not self.joined:
            return []
        holders = self.holders()
        if not force and holders == self.backups.holders:
            return []
        return self.backups.send(self.me, holders, tuple(self.links()))

    def _on_backup(self, src: int, msg: BackupCopy, now: float) -> list[Effect]:
        if msg.owner.id in self.dead:  # (a copy of a state taken over already: not again)
            return self._tell_dead(src, msg.owner)
        if self.backups.on_copy(msg, addr=self.addr) and self.id is not None:
            return [Send(msg.owner.addr, BackupAck(self.me, msg.version))]
        return []

    def _on_backup_ack(self, src: int, msg: BackupAck, now: float) -> list[Effect]:
        self.backups.on_ack(msg)
        return []

    def _on_backup_delta(self, src: int, msg: BackupDelta, now: float) -> list[Effect]:
        if msg.owner.id in self.dead:
            return self._tell_dead(src, msg.owner)
        return self.backups.on_delta(src, msg, me=self.me)

    def _on_backup_resync(self, src: int, msg: BackupResync, now: float) -> list[Effect]:
        if not self.joined:
            return []
        return self.backups.resend(self.me, msg.holder, tuple(self.links()))

    # -- failure detection (section 3.4.1): the detector decides, the ring is repaired here

    def _heartbeat_round(self, now: float) -> list[Effect]:
        assert self.heartbeat is not None
        out: list[Effect] = self.check_load(now)
        if self.backups.orphans:  # (an earlier holder silent about a dead owner: see Backups.orphans_waited)
            taken = self._take_over(self.backups.orphans_waited(ORPHAN_ROUNDS), force=True)
            if taken:
                out += taken + self._send_backups(force=True)
        load = self.load(now)
        for p in {self.left, self.right} - {None}:
            assert p is not None
            # (anything from it shows it alive: a busy broker's heartbeats may come late)
            silent = self.detector.silent(p, now, limit=2 * self.heartbeat)
            if silent and not self.detector.suspected(p.id):
                if not self.detour.get(p.id):
                    out.extend(self._suspect(p))
                elif self.detector.conclusive(p, now):  # (a way round hides no death: silent for
                    # the guard, it is tested again, the detour kept meanwhile. Never tested
                    # again, a neighbour paused just after it answered a test was a member for
                    # good: simulator schedule 99 of starve, two brokers each with a detour
                    # through the other, neither heard it for 13 s)
                    out.extend(self._suspect(p, again=True))
            # (sent over a link known to be down too: if it comes back, the far end hears it)
            out.append(Send(p.addr, Heartbeat(self.me, load, now, tuple(self.window))))
        out.append(SetTimer(self.heartbeat, ("ring", "heartbeat")))
        return out

    def _on_heartbeat(self, src: int, msg: Heartbeat, now: float) -> list[Effect]:
        """A neighbour is heard over our direct link: if we thought the link down (a broker
        too busy to answer a probe in time looks like that), it is up. Were the detour kept,
        the neighbour would never be suspected again, and its death never noticed. Its
        heartbeat is acknowledged at once (its lease); one from a broker found dead is
        answered ``Dead`` instead."""
        if msg.peer.id in self.dead:
            return self._tell_dead(src, msg.peer)
        self.detector.beat(msg.peer.id, now)
        self.loads.neighbours[msg.peer.id] = msg.load
        if self.detour.get(msg.peer.id) and msg.peer in (self.left, self.right):
            del self.detour[msg.peer.id]
        if not self.joined:
            return []
        return [Send(src, HeartbeatAck(self.me, msg.sent)), *self._stabilize(msg.peer, msg.window)]

    def _stabilize(self, peer: Peer, window: tuple[Peer, ...]) -> list[Effect]:
        """A ring neighbour's window, from its heartbeat (Chord's stabilization, in a ring
        of windows): our side towards it is filled from it (our second neighbour there is
        its neighbour; a broker that joined between us, an ``Insert`` we missed, is taken
        in), and a gap on that side is closed. Under churn, a broker that heard of a death
        or a join only in part keeps wrong second pointers (testers, backup holders) for
        good otherwise. A heartbeat from a broker that is not our neighbour (heartbeats go
        to Left and Right only): see :meth:`_claimed`."""
        side = 1 if peer == self.right else -1 if peer == self.left else 0
        me = self.me.id
        if not side:
            return self._claimed(peer, window)
        if not window:
            return []
        here = self.me.addr  # (a broker on our own address is one we were: see _set_side)
        valid = {p.id: p for p in (peer, *window) if p.id != me and p.id not in self.dead and p.addr != here}
        dist = (lambda p: cw(me, p.id)) if side > 0 else (lambda p: cw(p.id, me))
        fresh = sorted(valid.values(), key=dist)[:WINDOW]
        self.open.discard(side)
        if fresh == self._side(side):
            return []
        if side > 0:
            self.succ = fresh
        else:
            self.pred = fresh
        return self._after_change()

    def _claimed(self, peer: Peer, window: tuple[Peer, ...]) -> list[Effect]:
        """A heartbeat from a broker that is not our neighbour takes us for its own (its
        window is in ring order from it: its Right first, its Left last). If one of ours is
        between us, it missed that broker's join: its ``Insert`` goes to it; else it is our
        neighbour on that side: one we lost (the side stayed open, its closing news lost
        with a broker that died too: found in a simulator run of a crash schedule, the side
        open for good and 1,673 publishes unsettled), or never heard of."""
        me = self.me.id
        if not window or peer.id in self.dead:
            return []
        side = 1 if window[-1].id == me else -1 if window[0].id == me else 0
        if not side:
            return []
        ours = self.right if side > 0 else self.left

        def dist(p: Peer) -> int:
            return cw(me, p.id) if side > 0 else cw(p.id, me)

        if ours is not None and ours.id != peer.id and dist(ours) < dist(peer):
            return [Send(peer.addr, Insert(ours))]
        beyond = window[:-1] if side > 0 else tuple(reversed(window[1:]))
        return self._set_side(side, (peer, *beyond))

    def _on_heartbeat_ack(self, src: int, msg: HeartbeatAck, now: float) -> list[Effect]:
        self.detector.echo(msg.peer.id, msg.sent)
        return self._speaks(msg.peer, now)

    def _speaks(self, peer: Peer, now: float) -> list[Effect]:
        """``peer`` answered from its address: a broker we know there under another id is
        gone (a new process on its address: a proof), and is suspected if it is our
        neighbour. Else its address's answers kept it alive for us for good: a neighbour
        that missed the news of its death took the new process's answers for its (a
        simulator run of a crash schedule: a dead incarnation kept as Right, 1,672
        publishes unsettled)."""
        out: list[Effect] = []
        for p in self._at_addr(peer.addr):
            if p.id != peer.id and p.id not in self.dead and not self.detector.is_gone(p.id):
                self.detector.gone(p.id, now)
                if p in (self.left, self.right) and not self.detector.suspected(p.id):
                    out += self._suspect(p)
        return out

    def _tell_dead(self, src: int, peer: Peer) -> list[Effect]:
        """``peer``, found dead, still speaks (it was paused or cut off): tell it, and who
        took its state over if we know."""
        return [Send(src, Dead(peer, self.redirect.get(peer.id)))]

    def _on_dead(self, src: int, msg: Dead, now: float) -> list[Effect]:
        """The ring found us dead: from now on we are inert; the driver must come back as a
        new member (a broker restarts, handing over what it holds). Before joining, the
        answer to our ``Restarted``: the member we were is buried (and who took it over)."""
        if self.id is None:
            if self.previous is None or msg.peer != self.previous or self.buried is not None:
                return []
            if msg.taker is None and self._announced < ANNOUNCE:
                return []  # (not who took it over yet: asked again at the next announce)
            self.buried = msg
            return [CancelTimer(("ring", "announce")), Deliver(("ring", "buried"), msg)]
        if msg.peer.id != self.id or self.declared_dead is not None:
            return []
        self.declared_dead = msg
        return [Deliver(("ring", "dead"), msg)]

    def _side_of(self, b: Peer) -> int:
        """1 if ``b`` is (or, dead, was) our Right, -1 our Left, 0 otherwise (a chord...)."""
        if b == self.right:
            return 1
        if b == self.left:
            return -1
        return self._was_side.get(b.id, 0)

    def _far_side(self, side: int) -> tuple[Peer, ...]:
        """Our neighbours away from ``side`` (1: Left, Leftleft; else Right, Rightright)."""
        return tuple(self.pred if side > 0 else self.succ)

    def _suspect(self, b: Peer, *, again: bool = False) -> list[Effect]:
        """A thinks B failed: ask C, B's other ring neighbour, to test it (figure 5); ``again``:
        though our link to it is known down (a detour), as it was silent for the guard."""
        if self.detector.suspected(b.id) or b.id in self.dead or (self.detour.get(b.id) and not again):
            return []
        me = self.me
        side = self._side_of(b)
        if side == 0:  # a chord: confirm the link through a traced query (section 3.4.2 b)
            self.detour[b.id] = ()
            self.detector.trace(b)
            return self._traced_query(b)
        c = self._at(side, 2)
        if c is None or c in (b, me):  # no third broker: test it ourselves
            return self.detector.probe(me, b)
        if self.detector.is_gone(c.id):  # (C restarted too: we test B, and bury C with it)
            return self.detector.probe(me, b, (c,))
        return self.detector.ask(me, b, c, self._far_side(side))

    def _on_test(self, src: int, msg: TestNeighbour, now: float) -> list[Effect]:
        if msg.asker.id in self.dead:
            return self._tell_dead(src, msg.asker)
        b = msg.suspect
        if self.detector.is_gone(b.id) or b.id in self.dead:  # (a proof here, or buried here: no
            # probe. Probed, a broker we had buried, paused, answered it from its backlog before
            # it read that it was dead; our "alive" kept it the asker's neighbour, which took its
            # state over again 12 s later: simulator schedule 186 of starve. Its taker named)
            window = (self.me, *self._side(-self._side_of(b)))
            return [Send(msg.asker.addr, Failed(b, window, True, self.taken_by.get(b.id)))]
        return self.detector.test(self.me, msg, now)

    def _on_restarted(self, src: int, msg: Restarted, now: float) -> list[Effect]:
        """A new process speaks from the address of ``msg.previous``: that member is gone (a
        proof). Answered ``Dead`` once buried; a ring neighbour is suspected (or asked about
        again) so that its burial comes at once."""
        prev = msg.previous
        if prev.id in self.dead:
            return self._tell_dead(src, prev)
        if prev.id == self.id or not any(p.id == prev.id for p in self._at_addr(prev.addr)):
            return []
        self.detector.gone(prev.id, now)
        out: list[Effect] = []
        for b in self.detector.asked_of(prev.id):  # (it was to test them: we probe them)
            out += self._test_expired(b.id, now, timer=True)
        if prev not in (self.left, self.right):
            return out
        s = self.detector.suspicion(prev.id)
        if s is None:
            return out + self._suspect(prev)
        if s.phase is Phase.ASKED:  # (its tester proven gone too: we probe it ourselves)
            return out + self._test_expired(prev.id, now, timer=True)
        return out

    def _on_probe(self, src: int, msg: Probe, now: float) -> list[Effect]:
        if msg.asker.id in self.dead:
            return self._tell_dead(src, msg.asker)
        return [Send(msg.asker.addr, ProbeAck(self.me))]

    def _on_probe_ack(self, src: int, msg: ProbeAck, now: float) -> list[Effect]:
        return self.detector.answered(self.me, msg.peer) + self._speaks(msg.peer, now)

    def _on_alive(self, src: int, msg: Alive, now: float) -> list[Effect]:
        """B is up: the link A-B failed. B's traffic now goes through C. Unless B is proven
        gone here (a new process announced its restart to us): C heard the new process on
        B's address (a broker that joined next to B's place since, never told of the restart)
        and took it for B; we probe B ourselves, and bury it. Believed, the answer kept B a
        member: asked again at each announcement, C said "alive" each time, for 65 s, and
        the subscriptions B had taken over were served by nobody (a simulator schedule: 889
        deliveries lost)."""
        if self.detector.is_gone(msg.suspect.id):
            b = next((p for p in self.window if p.id == msg.suspect.id), None)
            out = self.detector.failed(msg.suspect.id)  # (the test is over)
            return out + (self.detector.probe(self.me, b) if b is not None else [])
        b = msg.suspect
        direct = self.heartbeat is not None and not self.detector.quiet(b.addr, now, limit=2 * self.heartbeat)
        out = self.detector.alive(b.id, now)
        if not direct:  # (heard lately over our own link, B was slow, not cut off from us: a
            # detour then hid it from our heartbeat rounds; two neighbours that tested it for
            # each other each took the other's way round, and it was paused next: see
            # _heartbeat_round)
            self.detour[b.id] = (msg.via,)
        return out

    def _probe_expired(self, suspect: int, now: float, *, timer: bool) -> list[Effect]:
        """A probe of B got no answer: its timer ran out (``timer``), or its send failed.

        A verdict only if it is conclusive (B proven gone, or silent for the guard; a failed
        send is conclusive only with the proof); else B is probed again when the timer goes.
        Something heard from B since the probe went, when the timer runs out, is an answer
        (B busy, alive). Our own probe (PROBING) buries B, with the tester that died too; a
        probe for an asker A tells A ``Failed``: A buries B if it agrees, and tells us."""
        probing = self.detector.probing(suspect)
        if probing is None:
            return []
        peer = self._known(suspect) or probing.suspect
        if timer and self.detector.answered_late(suspect, peer):
            return self.detector.answered(self.me, peer)
        gone = self.detector.is_gone(peer.id)
        if not (gone or (timer and self.detector.conclusive(peer, now))):
            return self.detector.reprobe(self.me, peer, now) if timer else []
        self.detector.unanswered(suspect)
        me = self.me
        if probing.asker == me:  # our own probe: a ring of two, or the tester died too
            s = self.detector.suspicion(suspect)
            also = s.also if s is not None else ()
            return self._bury_beyond((peer, *also)) if also else self._bury((peer,))
        side = self._side_of(peer)  # where B is, seen from C
        return [Send(probing.asker.addr, Failed(peer, (me, *self._side(-side)), gone))]

    def _on_failed(self, src: int, msg: Failed, now: float) -> list[Effect]:
        """C found B dead: if we agree (B proven gone, or silent here for the guard too), we
        close the ring with C (divide-neighbour(B)) and tell C, which buries B then; if B was
        heard here lately, C is asked again once B's silence here reaches the guard."""
        b = msg.suspect
        if b.id in self.dead:
            return []
        if not (msg.gone or self.detector.conclusive(b, now)):
            wait = self.detector.wait_left(b, now)
            return self.detector.ask_later(b, wait + self.detector.probe_timeout / 4)
        side = self._side_of(b)
        out = self.detector.failed(b.id)
        far = (self.me, *self._far_side(side)) if side else ()
        if msg.taker is not None and msg.taker.id != self.me.id:  # (taken over already: not by
            # us again. A copy of its state it sent us as it woke, before it read that it was
            # dead, named us its first holder: taken over twice, the subscriptions' routes
            # went to and fro, 567 deliveries out of order in simulator schedule 15 of starve)
            self.redirect[b.id] = self.taken_by[b.id] = msg.taker
            self.backups.drop(b.id)
        out += self._bury((b,))
        if side:
            out += self._set_side(side, msg.window, gone=(b,))
            out.append(Send(src, SetSide(-side, far, (b,))))
        return out

    def _test_expired(self, suspect: int, now: float, *, timer: bool) -> list[Effect]:
        """C did not answer our test of B (its timer ran out, or the send failed), or it is
        time to ask again (a ``Failed`` we could not agree with yet).

        C proven gone: we probe B ourselves, and bury both if B is found dead (two adjacent
        crashes). Else C is asked again, now (its timer) or later (a failed send): C may be
        busy, or cut off from us with B, and then no verdict is safe."""
        s = self.detector.suspicion(suspect)
        b = next((p for p in self.window if p.id == suspect), None)
        if s is None or s.phase is not Phase.ASKED:
            return []
        if b is None:
            self.detector.end(suspect)
            return []
        far = self._far_side(self._side_of(b))
        if self.detector.is_gone(s.tester.id):
            return self.detector.probe_instead(self.me, b)
        if timer:
            return self.detector.ask_again(self.me, b, far)
        return self.detector.ask_later(b, self.detector.probe_timeout)

    def _bury_beyond(self, gone: tuple[Peer, ...]) -> list[Effect]:
        """Adjacent brokers ``gone`` are dead: bury them, and walk from the first live broker
        beyond them back to the gap (``Reconnect``)."""
        side = self._side_of(gone[0])
        beyond = self._first_beyond(gone, side)
        out = self._bury(gone)
        if beyond is not None and side:
            out.append(Send(beyond.addr, Reconnect(self.me, gone, tuple(self._side(-side)), side)))
        return out

    def _first_beyond(self, gone: Sequence[Peer], side: int) -> Peer | None:
        me = self.me
        skip = {p.id for p in gone} | self.dead
        cands = [p for p in (*self.window, *self.chords.values()) if p.id not in skip and p.id != me.id]
        dist = (lambda p: cw(me.id, p.id)) if side > 0 else (lambda p: cw(p.id, me.id))
        return min(cands, key=dist, default=None)

    def _on_reconnect(self, src: int, msg: Reconnect, now: float) -> list[Effect]:
        """Walk back towards the asker until the broker next to the gap, which closes it."""
        out = self._bury(msg.dead)
        me, asker = self.me, msg.asker
        back = self._at(-msg.side, 1)  # the next broker towards the asker
        if back is not None and back.id != asker.id and back.id not in self.dead:
            d_back = cw(asker.id, back.id) if msg.side > 0 else cw(back.id, asker.id)
            d_me = cw(asker.id, me.id) if msg.side > 0 else cw(me.id, asker.id)
            if 0 < d_back < d_me:
                return [*out, Send(back.addr, msg)]
        out += self._set_side(-msg.side, (asker, *msg.window), gone=msg.dead)
        out.append(Send(asker.addr, SetSide(msg.side, (me, *self._side(msg.side)), msg.dead)))
        return out

    # -- divide-neighbour(B)

    def _side(self, side: int) -> list[Peer]:
        return self.succ if side > 0 else self.pred

    def _set_side(self, side: int, peers: Iterable[Peer], *, gone: Sequence[Peer] = ()) -> list[Effect]:
        """Our ``side`` now begins with ``peers`` (nearest first). If our nearest neighbour
        there changed (``gone`` left it), the neighbour on the other side must update its
        second one."""
        me = self.me
        peers = list(dict.fromkeys(peers))
        # (a broker on our own address is one we were: a restart joined before the news of
        # its death went round, and took itself in as a neighbour, its tree neighbour itself)
        fresh = [p for p in peers if p.id != me.id and p.id not in self.dead and p.addr != me.addr][:WINDOW]
        old = list(self._side(side))
        if any(p.id == me.id for p in peers):  # it wraps round to us: the whole ring is known
            cut = next(i for i, p in enumerate(peers) if p.id == me.id)
            # (to the teller: a broker that joined next to us while its news was on its way is
            # in our window only; dropped, it was lost from it for good, the ring's pointers
            # wrong after a rolling restart in the simulator)
            known = [p for p in (*self.succ, *self.pred) if p.id not in self.dead and p not in gone]
            self.open.clear()
            self.succ, self.pred = [], []
            self._merge_window([*peers[:cut], *known], closes=True)
        elif side > 0:
            self.succ = fresh
        else:
            self.pred = fresh
        self.open.discard(side)
        if not self.succ and not self.pred:
            self.open.clear()
        out: list[Effect] = []
        other = self._at(-side, 1)
        # (brokers died: the other neighbour is told even if it is in the side sent, a ring of
        # three: it may hold a dead one's backup, found dead by nobody else; not the one the
        # side begins with, a ring of two: it is the one that told us)
        tell = {p.id for p in fresh[:1]} if gone else {p.id for p in fresh}
        if (gone or fresh[:1] != old[:1]) and other is not None and other.id not in tell:
            out.append(Send(other.addr, SetSide(side, (me, *fresh), tuple(gone))))
        return out + self._after_change()

    def _on_set_side(self, src: int, msg: SetSide, now: float) -> list[Effect]:
        """A neighbour's news of our side; brokers it names dead that we knew (in our window,
        or holding their backup) are told on to our other neighbour too: it may be the first
        holder of a dead one's backup, no neighbour of it any more (a broker joined in
        between before it died), and nobody else tells it (a simulator schedule: its
        subscriptions served by no one for good, 880 events lost)."""
        known = {p.id for p in self.window} | set(self.backups.held)
        newly = tuple(d for d in msg.dead if d.id not in self.dead and d.id in known)
        out = self._bury(msg.dead)
        return out + self._set_side(msg.side, msg.peers, gone=newly)

    def _bury(self, gone: Iterable[Peer]) -> list[Effect]:
        """Forget dead brokers; take over the state of those whose backup we are the first
        live holder of, and redirect their other neighbours to us (O(degree))."""
        out: list[Effect] = []
        me = self.me
        fresh = [d for d in dict.fromkeys(gone) if d.id not in self.dead and d.id != me.id]
        for dead in fresh:  # all of them first: a dead holder must not block a takeover
            self._forget(dead)
            back, cancel = self.shares.take_back(dead.addr)  # (shares it never acknowledged)
            out += cancel + self._take_back(back)
        # (then copies kept for a holder before us that turned out dead too)
        out += self._take_over([*fresh, *self.backups.orphans_due(self.dead)])
        if out:
            out += self._send_backups(force=True)
        return out

    def _take_over(self, owners: Iterable[Peer], *, force: bool = False) -> list[Effect]:
        """Take over the state of each dead broker in ``owners`` whose copy we hold (and are
        its first live holder, unless ``force``); tell its other neighbours (``Redirect``)."""
        out: list[Effect] = []
        me = self.me
        for dead in owners:
            held = self.backups.take_over(dead, dead=self.dead, force=force)
            if held is None:
                continue
            self.redirect[dead.id] = self.taken_by[dead.id] = me
            self.taken_over.append(dead.id)
            notify = {p.id: p for p in held.links if p.id not in self.dead and p.id != me.id}
            out += [Send(p.addr, Redirect(dead, me)) for p in sorted(notify.values())]
            out += self._share(held.state, away_from=self._was_side.get(dead.id, 1))
        return out

    def _share(self, taken: Mapping[Hashable, Any], *, away_from: int) -> list[Effect]:
        """Over the load limit after a takeover: pass the excess of what was taken to the
        next neighbour on the other side, if its load (as its backup with us says) leaves
        room (section 3.4: "shared with next neighbours when the load limit is exceeded")."""
        if self.load_limit is None or len(self.state) <= self.load_limit:
            return []
        nxt = self._at(-away_from, 1)
        if nxt is None:
            return []
        theirs = self.backups.load_of(nxt.id)
        room = self.load_limit - (theirs if theirs is not None else self.load_limit)
        excess = min(len(self.state) - self.load_limit, room)
        if excess <= 0:
            return []
        moved = self.backups.hand_over(sorted(taken, key=repr)[:excess])
        return self.shares.send(self.me, nxt, moved)

    def _on_share(self, src: int, msg: ShareState, now: float) -> list[Effect]:
        ack: list[Effect] = [Send(src, ShareAck(self.me, msg.seq))] if msg.seq else []
        if not self.shares.first_time(msg):  # (sent again: its ack was lost)
            return ack
        self.backups.absorb(msg.entries)
        return self._send_backups(force=True) + ack

    def _on_share_ack(self, src: int, msg: ShareAck, now: float) -> list[Effect]:
        return self.shares.ack(msg)[1]

    def _take_back(self, entries: Mapping[Hashable, Any]) -> list[Effect]:
        """Entries of a share that did not arrive (or was not acknowledged): ours again."""
        if not entries:
            return []
        self.backups.absorb(entries)
        return self._send_backups(force=True)

    def _forget(self, dead: Peer) -> None:
        side = self._side_of(dead)
        if side:
            self._was_side[dead.id] = side
            self._was_side_addr[dead.addr] = side
        self.dead.add(dead.id)
        self.dead_at[dead.id] = dead.addr
        self.detector.end(dead.id)
        for side, lst in ((1, self.succ), (-1, self.pred)):
            if any(p.id == dead.id for p in lst):
                lst[:] = [p for p in lst if p.id != dead.id]
                self.open.add(side)
        if not self.succ and not self.pred:
            self.open.clear()
        self.chords.drop(dead.id)
        self.detour.pop(dead.id, None)

    def _on_redirect(self, src: int, msg: Redirect, now: float) -> list[Effect]:
        out = self._bury((msg.dead,))
        if self.redirect.get(msg.dead.id) == self.me:  # (we took it over in that burial: the
            return out  # sender, a broker that answered a query for it, named itself)
        self.redirect[msg.dead.id] = msg.to
        if msg.to.addr == src:  # (not a broker that answered a query naming itself)
            self.taken_by[msg.dead.id] = msg.to
        if msg.to.id != self.me.id:  # (it took the state over: a copy kept here is not needed)
            self.backups.drop(msg.dead.id)
        return out

    # -- link failures off the ring (section 3.4.2 b)

    def _traced_query(self, b: Peer) -> list[Effect]:
        q = TracedQuery(self.me, b, (self.me,))
        nxt = self._next_hop(b.id)
        return [] if nxt is None else [Send(nxt.addr, q)]

    def _on_traced(self, src: int, msg: TracedQuery, now: float) -> list[Effect]:
        me = self.me
        trace = (*msg.trace, me)
        if msg.target.id == me.id:
            back = trace[-2]
            return [Send(back.addr, LinkDown(msg.origin, me, trace))]
        if msg.target.id in self.dead or self._responsible(msg.target.id):  # B itself is gone
            to = self.redirect.get(msg.target.id, me)
            return [Send(msg.origin.addr, Redirect(msg.target, to))]
        if len(trace) > MAX_HOPS:
            return []
        nxt = self._next_hop(msg.target.id)
        return [] if nxt is None else [Send(nxt.addr, TracedQuery(msg.origin, msg.target, trace))]

    def _on_link_down(self, src: int, msg: LinkDown, now: float) -> list[Effect]:
        me = self.me
        i = msg.trace.index(me)
        if i == 0:  # we are the origin: keep the path as our route to the target
            self.detour[msg.target.id] = msg.trace[1:]
            self.detector.end(msg.target.id)
            return []
        return [Send(msg.trace[i - 1].addr, msg)]


def _offset(mid: int, gap: int, nonce: int) -> int:
    """The id midway in a gap of ``gap``, moved by up to an eighth of it either way by the
    joiner's ``nonce`` (0: midway exactly, the document's rule). A broker restarted into the
    gap it left would otherwise get the id it had, and brokers that found that one dead
    would never take the new one in."""
    spread = gap // 4
    if not nonce or spread < 2:
        return mid
    h = int.from_bytes(hashlib.blake2b(nonce.to_bytes(16, "big", signed=True), digest_size=8).digest(), "big")
    return (mid + h % spread - spread // 2) % ID_SPACE


def _window_of(who: Peer, everyone: Iterable[Peer]) -> list[Peer]:
    """The window ``who`` would have among ``everyone`` (2 nearest on each side)."""
    others = sorted({p for p in everyone if p.id != who.id}, key=lambda p: cw(who.id, p.id))
    if len(others) > 2 * WINDOW:
        others = others[:WINDOW] + others[-WINDOW:]
    return others


_Handler = Callable[[RingNode, int, Any, float], list[Effect]]

# (the one place a ring node reads its messages)
_HANDLERS: dict[type, _Handler] = {
    Ping: RingNode._on_ping,
    Pong: RingNode._on_pong,
    JoinRequest: RingNode._on_join_request,
    JoinAccept: RingNode._on_join_accept,
    Insert: RingNode._on_insert,
    ChordQuery: RingNode._on_chord_query,
    ChordReply: RingNode._on_chord_reply,
    RingRoute: RingNode._on_route_msg,
    BackupCopy: RingNode._on_backup,
    BackupDelta: RingNode._on_backup_delta,
    BackupResync: RingNode._on_backup_resync,
    BackupAck: RingNode._on_backup_ack,
    Heartbeat: RingNode._on_heartbeat,
    HeartbeatAck: RingNode._on_heartbeat_ack,
    Dead: RingNode._on_dead,
    Restarted: RingNode._on_restarted,
    TestNeighbour: RingNode._on_test,
    Probe: RingNode._on_probe,
    ProbeAck: RingNode._on_probe_ack,
    Alive: RingNode._on_alive,
    Failed: RingNode._on_failed,
    SetSide: RingNode._on_set_side,
    ShareState: RingNode._on_share,
    ShareAck: RingNode._on_share_ack,
    Redirect: RingNode._on_redirect,
    Reconnect: RingNode._on_reconnect,
    TracedQuery: RingNode._on_traced,
    LinkDown: RingNode._on_link_down,
}

_BEFORE_JOINING = frozenset({Ping, Pong, JoinAccept, Dead})
"""What a broker not in the ring yet reads (the rest is meant for a member)."""

MESSAGES: frozenset[type] = frozenset(_HANDLERS)
"""The message types a :class:`RingNode` reads (a core it runs inside passes these on)."""
