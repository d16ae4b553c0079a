"""What a broker's log says of the ring: one line each time its view of the ring changes.

How it works (the log shows the chordal ring's failure detection and repair: Madhu Kumar,
Bellur, Govindan, "Chordal Reliability Rings", section 3.4): after every step of the core,
:meth:`RingLog.update` compares a cheap signature of the ring node's state (counters and
lengths) with the one it saw last; only when that differs does it build the view the log
shows (this broker's window, the brokers it suspects, those it declared dead, those whose
state it took over) and write a line if the view changed. So a step that changed nothing in
the ring costs a tuple of six counters. :attr:`RingLog.changes` counts the changes of the
view (the console's ``flowbus_ring_changes_total``), whatever the log level.

A ring node over its load limit whose neighbours have no room asks for another broker
(:mod:`flowbus.overlay.ring_load`): each request is logged (warning) and handed to
:attr:`RingLog.on_overloaded` if set (``flowbus broker start`` prints it for ``flowbus
cluster up --max-brokers``, which starts a broker).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flowbus.broker.overlays import address_text
from flowbus.overlay.chordal_ring import RingNode
from flowbus.overlay.ring_load import Overloaded

__all__ = ["RingLog"]


class RingLog:
    """The ring as ``log`` shows it, for the broker at ``address`` (see the module note)."""

    def __init__(self, ring: RingNode, address: str, log: logging.Logger) -> None:
        self.ring = ring
        self.address = address
        self.log = log
        self._seen: tuple[Any, ...] = ()  # what the log last said of the ring
        self._quick: tuple[int, ...] = ()  # (and a cheap signature of it)
        self._requests = 0  # the ring node's requests for a broker seen so far
        self.on_overloaded: Callable[[Overloaded], None] | None = None
        self.changes = 0  # how many times the view changed (the console's metrics)

    def update(self) -> None:
        """Log the ring's changes since the last call, if any (and if ``log`` shows info)."""
        ring = self.ring
        loads = ring.loads
        if loads.requests != self._requests and loads.last_request is not None:
            self._requests = loads.requests
            req = loads.last_request
            self.log.warning(
                "ring %s over its limit (load %.2f): asks for another broker", self.address, req.load
            )
            if self.on_overloaded is not None:
                self.on_overloaded(req)
        if not ring.joined:
            return
        quick = (
            ring.version,
            len(ring.succ),
            len(ring.pred),
            len(ring.dead),
            len(ring.taken_over),
            ring.watched,
        )
        if quick == self._quick:
            return
        self._quick = quick
        seen = (
            tuple(address_text(peer.addr) for peer in ring.window),
            tuple(ring.suspects),
            tuple(sorted(ring.dead)),
            tuple(ring.taken_over),
        )
        if seen != self._seen:
            self._seen = seen
            self.changes += 1
            if not self.log.isEnabledFor(logging.INFO):
                return
            window, suspects, dead, taken = seen
            self.log.info(
                "ring %s (id %d): window %s, suspects %s, dead %s, taken over %s",
                self.address,
                ring.id,
                list(window),
                list(suspects),
                list(dead),
                list(taken),
            )
