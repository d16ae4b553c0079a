"""Whether a broker may serve its clients: the ring's lease, seen from the broker process.

How it works (the ring's side is :meth:`flowbus.overlay.chordal_ring.RingNode.serving`): a
broker of the chordal ring serves only while a ring neighbour has acknowledged one of its
heartbeats sent within the lease. A broker paused (``SIGSTOP``) or cut off from its ring
neighbours loses its lease before they can find it dead and take its subscriptions over,
so that two brokers never serve one subscription, and a broker that may have been taken
over never acknowledges a publish.

* :meth:`Fence.ok` is asked where a client is served: each read of a client connection,
  each new session, each delivery that would go straight to a connection, each publish
  acknowledgement. It reads the core's lease at most every ``CHECK_EVERY`` seconds (the
  event loop's clock: after a ``SIGCONT`` the time paused counts, so the first question
  after a pause sees the lease gone, whatever the loop runs first).
* When the lease is lost, every client connection is closed with an ``Error`` that says
  why, and new ones are refused the same way, until it is back: the clients go to another
  broker (their subscriptions are re-attached where the ring serves them, their
  unacknowledged publishes sent again). Nothing else stops: the ring keeps trying to reach
  the neighbours, and the lease comes back with their first echo, unless the ring found the
  broker dead meanwhile (``Dead``: the broker then steps down, see :mod:`flowbus.broker.server`).
* A core without leases (the pastry-irbr overlay) always serves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

__all__ = ["CHECK_EVERY", "Fence"]

CHECK_EVERY = 0.05
"""Seconds during which an answer of :meth:`Fence.ok` is reused."""

log = logging.getLogger("flowbus.broker")


class Fence:
    """The lease of the broker at ``address`` as its parts see it (see the module note);
    ``close_all(reason)`` closes every client connection."""

    def __init__(
        self,
        *,
        serving: Callable[[float], bool] | None,
        address: str,
        close_all: Callable[[str], None],
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._serving = serving
        self.address = address
        self.close_all = close_all
        self._clock = clock
        self._ok = True
        self._checked = -1.0
        self._served = False  # (not before it served once: joining is no loss of the lease)
        self.lost = 0  # how many times the lease was lost
        self.gone = False  # the ring found this broker dead: it serves no more

    def ok(self) -> bool:
        """Whether the broker may serve its clients now (see the module note)."""
        if self._serving is None:
            return not self.gone
        now = self._clock() if self._clock is not None else asyncio.get_running_loop().time()
        if now - self._checked < CHECK_EVERY:
            return self._ok
        self._checked = now
        ok = self._serving(now) and not self.gone
        if not self._served:
            self._served, self._ok = ok, ok
            return ok
        if ok != self._ok:
            self._ok = ok
            if ok:
                log.warning("broker %s: a ring neighbour answers again: serving clients", self.address)
            else:
                self.lost += 1
                log.warning("broker %s: %s", self.address, self.reason)
                asyncio.get_running_loop().call_soon(self.close_all, self.reason)
        return ok

    @property
    def reason(self) -> str:
        """Why clients are not served now (what their ``Error`` says)."""
        if self.gone:
            return (
                f"broker {self.address} was found dead by the ring (paused or cut off too long): "
                "connect to another broker"
            )
        return (
            f"broker {self.address} is cut off from the ring (no ring neighbour answered its "
            "heartbeats lately): connect to another broker"
        )

    def step_down(self) -> None:
        """The ring found this broker dead: no client is served any more."""
        self.gone = True
        self._ok = False
        log.warning("broker %s: %s", self.address, self.reason)
        self.close_all(self.reason)
