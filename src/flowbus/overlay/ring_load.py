"""A ring broker's load: events routed per second over a sliding window and state held,
and what to do when it is over its limits (sans-IO, used by
:class:`~flowbus.overlay.chordal_ring.RingNode`).

How it works (Madhu Kumar, Bellur, Govindan, "Chordal Reliability Rings", section 3.4,
the three steps of a broker under load, and figure 2's "load change" and "publishing rate
variation" triggers):

* :class:`LoadMeter` counts the events the driver says were routed, with the times it
  gives (``now`` arguments: no clock), and reports the rate over the last ``window``
  time units. A broker's *load* is one number, the larger of rate / rate limit and state
  entries / entry limit (1.0 is at the limit), so neighbours configured alike or not can
  compare it. Each ring heartbeat carries the sender's load to its Left and Right.
* :func:`plan_share` is the document's decision. Over the limit (load > 1):
  (1)-(2) if a ring neighbour (Left or Right) is below its limit, pass it the fraction of
  the load that brings us back to the limit, or as much as its room takes. Which entries
  carry how much is known when the driver names the entry an event was routed for
  (``routed(now, n, key)``; counted since the last share): :func:`pick_entries` takes
  the busiest entries that fit in that fraction. Without names, entries are taken to
  carry the load equally;
  (3) if both neighbours are at or over their limits too, ask for another broker to be
  set up (the ring node says so to its driver; a cluster starts one, which joins next to
  it, and the next share goes to the newcomer).
* After a share or a request the broker waits one ``window`` before it judges again: the
  rate it measures still counts the events of the entries it gave away.
* :class:`LoadShare` is one ring node's side of all this: its meter, its limits, what its
  neighbours' heartbeats said, and the decision (:meth:`LoadShare.decide`); the ring node
  sends what it decides.
* **Shares are acknowledged** (:class:`ShareLedger`). Each ``ShareState`` a broker sends
  carries a number; the receiver, once the entries are in its state (backed up, routed
  there), answers :class:`ShareAck`. Until the answer the sender keeps the entries in
  :attr:`ShareLedger.pending`: out of its state (its load and backups no longer count them),
  but still routed by it (a ring broker drops its routing of an entry only at the
  acknowledgement, :mod:`flowbus.routing.ring_share`). Unanswered after ``timeout`` the share
  is sent again, at most ``tries`` times in all; then, or at once if the send fails or the
  receiver is found dead, the sender takes the entries back into its state. A receiver
  takes a share once: one sent again (its ack was lost) is only acknowledged again, since
  its entries may have moved on from the receiver meanwhile. An
  acknowledgement that comes after the entries were taken back is counted (``late``): both
  brokers then hold those entries, which costs a second match of their events, never a
  second delivery (deliveries are de-duplicated by event id at the subscriber's broker).
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flowbus import wire
from flowbus.core import CancelTimer, Effect, Send, SetTimer
from flowbus.errors import ProtocolError
from flowbus.overlay.ring_messages import Peer, ShareState

__all__ = [
    "LoadMeter",
    "LoadShare",
    "Overloaded",
    "ShareAck",
    "ShareLedger",
    "load_of",
    "pick_entries",
    "plan_share",
]


@wire.message("ring.overloaded")
@dataclass(frozen=True, slots=True)
class Overloaded:
    """A broker over its limit whose ring neighbours are too: a request for another broker
    (what a ring node hands its driver, ``Deliver(("ring", "overloaded"), ...)``)."""

    peer: Peer
    load: float
    rate: float
    entries: int


@wire.message("ring.share_ack")
@dataclass(frozen=True, slots=True)
class ShareAck:
    """The receiver of ``ShareState`` number ``seq`` holds its entries (and routes for them)."""

    holder: Peer
    seq: int


@dataclass(slots=True)
class Pending:
    """A share sent and not acknowledged yet: to whom, what, how many times sent."""

    to: Peer
    entries: dict[Hashable, Any]
    tries: int = 1


class LoadMeter:
    """Events routed per time unit over a sliding window of ``window`` time units."""

    def __init__(self, window: float = 1.0) -> None:
        if not window > 0:
            raise ProtocolError(f"LoadMeter: the window must be > 0, got {window!r}")
        self.window = window
        self.total = 0
        self._times: deque[tuple[float, int]] = deque()  # (time, events), oldest first
        self._in_window = 0
        self.by_key: Counter[Hashable] = Counter()  # events per named entry since the last share

    def routed(self, now: float, n: int = 1, key: Hashable | None = None) -> None:
        """``n`` events were routed at time ``now`` (for the state entry ``key``, if named)."""
        if n <= 0:
            return
        self.total += n
        if key is not None:
            self.by_key[key] += n
        if self._times and self._times[-1][0] == now:
            t, m = self._times[-1]
            self._times[-1] = (t, m + n)
        else:
            self._times.append((now, n))
        self._in_window += n

    def rate(self, now: float) -> float:
        """Events per time unit over ``(now - window, now]``."""
        times, start = self._times, now - self.window
        while times and times[0][0] <= start:
            self._in_window -= times.popleft()[1]
        return self._in_window / self.window


def load_of(rate: float, entries: int, *, rate_limit: float | None, entry_limit: int | None) -> float:
    """The larger of rate / rate limit and entries / entry limit (0 with no limits)."""
    load = 0.0
    if rate_limit is not None:
        load = rate / rate_limit
    if entry_limit is not None:
        load = max(load, entries / entry_limit)
    return load


def plan_share(load: float, neighbours: dict[Peer, float]) -> tuple[Peer, float] | None:
    """Whom to pass which fraction of our load to, for a broker of ``load`` (> 1) whose
    ring neighbours report the loads ``neighbours``; None: nobody has room (step 3, ask
    for a broker). The least loaded neighbour below 1 gets the fraction that brings us
    back to the limit, or what its room takes."""
    if load <= 1.0:
        return None
    room = {p: 1.0 - v for p, v in neighbours.items() if v < 1.0}
    if not room:
        return None
    to = max(room, key=lambda p: (room[p], -p.id))
    return to, min(1.0 - 1.0 / load, room[to] / load)


def pick_entries(
    state: Iterable[Hashable], fraction: float, counts: Mapping[Hashable, int]
) -> list[Hashable]:
    """The entries of ``state`` carrying about ``fraction`` of its load, never all of them
    and at least one: the busiest by ``counts`` that fit, or, with no counts, the last
    ``ceil(fraction * entries)`` in order of ``repr``."""
    keys = sorted(state, key=repr)
    if len(keys) < 2:
        return []
    total = sum(counts.get(k, 0) for k in keys)
    if total == 0:
        return keys[-max(1, min(math.ceil(fraction * len(keys)), len(keys) - 1)) :]
    out: list[Hashable] = []
    budget = fraction * total
    for k in sorted(keys, key=lambda k: -counts.get(k, 0)):
        c = counts.get(k, 0)
        if c and c <= budget and len(out) < len(keys) - 1:
            out.append(k)
            budget -= c
    return out or [min(keys, key=lambda k: (counts.get(k, 0), repr(k)))]


class LoadShare:
    """A ring node's load and the decision of section 3.4 (see the module note):
    ``rate_limit`` events routed per time unit over ``window``; ``movable`` which state
    entries may be passed on (None: any)."""

    def __init__(
        self,
        *,
        rate_limit: float | None = None,
        window: float = 1.0,
        movable: Callable[[Hashable], bool] | None = None,
    ) -> None:
        if rate_limit is not None and not rate_limit > 0:
            raise ProtocolError(f"RingNode: the rate limit must be > 0, got {rate_limit!r}")
        self.rate_limit = rate_limit
        self.meter = LoadMeter(window)
        self.movable = movable
        self.neighbours: dict[int, float] = {}  # ring neighbour id -> its last heartbeat's load
        self.shares = 0  # load shares decided (a takeover's excess not counted)
        self.requests = 0  # requests for another broker
        self.last_request: Overloaded | None = None
        self._calm_until = -math.inf  # no judging before (after a share or a request)

    def load(self, now: float, entries: int, entry_limit: int | None) -> float:
        return load_of(self.meter.rate(now), entries, rate_limit=self.rate_limit, entry_limit=entry_limit)

    def decide(
        self, me: Peer, now: float, state: Iterable[Hashable], near: Iterable[Peer], entry_limit: int | None
    ) -> tuple[Peer, list[Hashable]] | Overloaded | None:
        """What a broker ``me`` holding ``state`` with ring neighbours ``near`` does now:
        pass entries to a neighbour, ask for a broker, or nothing."""
        keys = list(state)
        load = self.load(now, len(keys), entry_limit)
        if now < self._calm_until or load <= 1.0:
            return None
        self._calm_until = now + self.meter.window
        loads = {p: self.neighbours.get(p.id, 1.0) for p in near}
        plan = plan_share(load, loads)
        if plan is None:
            self.requests += 1
            self.last_request = Overloaded(me, load, self.meter.rate(now), len(keys))
            return self.last_request
        to, fraction = plan
        movable = keys if self.movable is None else [k for k in keys if self.movable(k)]
        picked = pick_entries(movable, fraction, self.meter.by_key)
        if not picked:
            return None  # (a neighbour has room, but nothing here may move: a broker would not help)
        self.meter.by_key.clear()
        self.neighbours[to.id] = loads[to] + fraction * load  # (until its next heartbeat)
        self.shares += 1
        return to, picked


class ShareLedger:
    """The shares a broker sent and their acknowledgements (see the module note): a share
    unanswered after ``timeout`` is sent again, at most ``tries`` times, then taken back."""

    def __init__(self, *, timeout: float = 4.0, tries: int = 3) -> None:
        if not timeout > 0 or tries < 1:
            raise ProtocolError(f"ShareLedger: timeout > 0 and tries >= 1, got {timeout!r}, {tries!r}")
        self.timeout = timeout
        self.tries = tries
        self.pending: dict[int, Pending] = {}  # share number -> the share
        self.acked = 0  # shares acknowledged
        self.resent = 0  # shares sent again after a timeout
        self.taken_back = 0  # shares taken back (unanswered, send failed, receiver dead)
        self.late = 0  # acknowledgements of shares taken back already
        self.placed: dict[Hashable, int] = {}  # acknowledged entries -> holder (for the core above)
        self._seq = 0
        self._taken: OrderedDict[tuple[int, int], None] = OrderedDict()  # (sender id, seq) absorbed here

    def first_time(self, msg: ShareState) -> bool:
        """Whether share ``msg`` is new here (a share sent again after its ack was lost must
        not be taken twice: its entries may have moved on from here meanwhile)."""
        key = (msg.sender.id, msg.seq)
        if not msg.seq or key not in self._taken:
            if msg.seq:
                self._taken[key] = None
                if len(self._taken) > TAKEN_REMEMBERED:
                    self._taken.popitem(last=False)
            return True
        return False

    def in_flight(self) -> set[Hashable]:
        """The entries of the shares not acknowledged yet (the sender still routes them)."""
        return {k for p in self.pending.values() for k in p.entries}

    def send(self, me: Peer, to: Peer, entries: Mapping[Hashable, Any]) -> list[Effect]:
        """Share ``entries`` (out of our state already) with ``to``, numbered, timed."""
        self._seq += 1
        self.pending[self._seq] = Pending(to, dict(entries))
        return [Send(to.addr, ShareState(me, entries, self._seq)), SetTimer(self.timeout, _timer(self._seq))]

    def ack(self, msg: ShareAck) -> tuple[Pending | None, list[Effect]]:
        """The receiver holds share ``msg.seq``: the share (None if it was not pending)."""
        done = self.pending.get(msg.seq)
        if done is None or done.to.id != msg.holder.id:
            self.late += msg.seq <= self._seq
            return None, []
        del self.pending[msg.seq]
        self.acked += 1
        self.placed.update(dict.fromkeys(done.entries, done.to.addr))
        return done, [CancelTimer(_timer(msg.seq))]

    def withdraw(self, key: Hashable) -> int | None:
        """Entry ``key`` of a pending share is gone (its subscription ended): out of the
        share (never taken back); the address it was sent to (None: in no pending share)."""
        for p in self.pending.values():
            if key in p.entries:
                del p.entries[key]
                return p.to.addr
        return None

    def expired(self, me: Peer, seq: int) -> tuple[dict[Hashable, Any], list[Effect]]:
        """Share ``seq`` went unanswered: sent again, or (``tries`` used up) its entries,
        taken back."""
        p = self.pending.get(seq)
        if p is None:
            return {}, []
        if p.tries >= self.tries:
            del self.pending[seq]
            self.taken_back += 1
            return p.entries, []
        p.tries += 1
        self.resent += 1
        return {}, [Send(p.to.addr, ShareState(me, p.entries, seq)), SetTimer(self.timeout, _timer(seq))]

    def take_back(self, to: int, seq: int | None = None) -> tuple[dict[Hashable, Any], list[Effect]]:
        """The entries of the shares pending to address ``to`` (only number ``seq``, if
        given): its send failed or it died."""
        entries: dict[Hashable, Any] = {}
        out: list[Effect] = []
        for n, p in list(self.pending.items()):
            if p.to.addr == to and seq in (None, n):
                del self.pending[n]
                self.taken_back += 1
                entries.update(p.entries)
                out.append(CancelTimer(_timer(n)))
        return entries, out


TAKEN_REMEMBERED = 10_000
"""How many shares a broker remembers having taken (to acknowledge a re-sent one only)."""


def _timer(seq: int) -> tuple[str, str, int]:
    return ("ring", "share", seq)
