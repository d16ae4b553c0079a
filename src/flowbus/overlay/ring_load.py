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
  (1)-(2) if a ring neighbour (Left or Right) is below its limit, pass it the share of
  the state that brings us back to the limit, or as much as its room takes: entries are
  assumed to carry the load equally, so ``k`` entries are ``k * load / entries`` of it;
  (3) if both neighbours are at or over their limits too, ask for another broker to be
  set up (the ring node says so to its driver; a cluster starts one, which joins next to
  it, and the next share goes to the newcomer).
* After a share or a request the broker waits one ``window`` before it judges again: the
  rate it measures still counts the events of the entries it gave away.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from flowbus import wire
from flowbus.errors import ProtocolError
from flowbus.overlay.ring_messages import Peer

__all__ = ["LoadMeter", "Overloaded", "load_of", "plan_share"]


@wire.message("ring.overloaded")
@dataclass(frozen=True, slots=True)
class Overloaded:
    """A broker over its limit whose ring neighbours are too: a request for another broker
    (what a ring node hands its driver, ``Deliver(("ring", "overloaded"), ...)``)."""

    peer: Peer
    load: float
    rate: float
    entries: int


class LoadMeter:
    """Events routed per time unit over a sliding window of ``window`` time units."""

    def __init__(self, window: float = 1.0) -> None:
        if not window > 0:
            raise ProtocolError(f"LoadMeter: the window must be > 0, got {window!r}")
        self.window = window
        self.total = 0
        self._times: deque[tuple[float, int]] = deque()  # (time, events), oldest first
        self._in_window = 0

    def routed(self, now: float, n: int = 1) -> None:
        """``n`` events were routed at time ``now``."""
        if n <= 0:
            return
        self.total += n
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


def plan_share(load: float, entries: int, neighbours: dict[Peer, float]) -> tuple[Peer, int] | None:
    """Whom to pass how many entries to, for a broker of ``load`` (> 1) holding ``entries``
    whose ring neighbours report the loads ``neighbours``; None: nobody has room (step 3,
    ask for a broker). The least loaded neighbour below 1 gets the entries that bring us
    back to the limit, or as many as its room takes (at least one)."""
    if load <= 1.0 or entries < 2:
        return None
    room = {p: 1.0 - v for p, v in neighbours.items() if v < 1.0}
    if not room:
        return None
    to = max(room, key=lambda p: (room[p], -p.id))
    per_entry = load / entries
    shed = math.ceil(entries * (1.0 - 1.0 / load))
    fits = math.floor(room[to] / per_entry)
    return to, max(1, min(shed, fits, entries - 1))
