"""What a broker shows of the ring adapting to load and latency: log lines, and the figures
the console's state (``GET /state``, "ring") and ``/metrics`` read.

How it works (the 003 document's adaptation triggers; the mechanisms are the core's:
:mod:`flowbus.overlay.ring_load`, :mod:`flowbus.routing.ring_share`,
:mod:`flowbus.routing.express`): after every step of the core, :meth:`AdaptLog.update`
compares a tuple of the core's counters with the one it saw last, and only when they differ
writes what changed:

* a link judged express again, or too slow for the express bound (info, with its measured
  latency);
* express events with no express path, sent over the direct link anyway (a warning at the
  first and then every 1,000th);
* shares acknowledged, sent again, taken back (info), and subscriptions this broker now
  holds for a neighbour, or has placed at one (info).

:meth:`AdaptLog.view` is the same state as plain data.
"""

from __future__ import annotations

import logging
from typing import Any

from flowbus.broker.overlays import address_text
from flowbus.routing.ring_broker import RingBroker

__all__ = ["AdaptLog"]


class AdaptLog:
    """The adaptation of ``core`` (the broker at ``address``) in ``log`` (see the module note)."""

    def __init__(self, core: RingBroker, address: str, log: logging.Logger) -> None:
        self.core = core
        self.address = address
        self.log = log
        self._seen: tuple[int, ...] = ()
        self._links: dict[int, bool] = {}
        self._fallbacks = 0

    def _signature(self) -> tuple[int, ...]:
        shares, express = self.core.ring.shares, self.core.express
        return (
            express.version,
            express.fallbacks,
            shares.acked,
            shares.resent,
            shares.taken_back,
            len(self.core.shared.out),
            len(self.core.shared.hosted),
        )

    def update(self) -> None:
        """Log what changed since the last call (a tuple of counters compared, else nothing)."""
        seen = self._signature()
        if seen == self._seen:
            return
        old, self._seen = self._seen or (0,) * len(seen), seen
        core, log = self.core, self.log
        judge = core.express.judge
        if judge is not None and seen[0] != old[0]:
            for peer, fast in judge.express.items():
                if self._links.get(peer, True) != fast:
                    log.info(
                        "link %s - %s: %s (measured %.1f ms, bound %.1f ms)",
                        self.address,
                        address_text(peer),
                        "express" if fast else "too slow for express",
                        1000 * judge.latency.get(peer, 0.0),
                        1000 * judge.bound,
                    )
            self._links = dict(judge.express)
        fallbacks = core.express.fallbacks
        if fallbacks > self._fallbacks and (
            self._fallbacks == 0 or fallbacks // 1000 > self._fallbacks // 1000
        ):
            log.warning("%d express events had no express path: sent over the direct link", fallbacks)
        self._fallbacks = fallbacks
        if seen[2:] != old[2:]:
            log.info(
                "load shares: %d acknowledged, %d sent again, %d taken back; "
                "%d subscriptions held by neighbours, %d held here for them",
                *seen[2:],
            )

    def view(self) -> dict[str, Any]:
        """The shares, and the express links as measured here, as plain data."""
        core = self.core
        shares = core.ring.shares
        express = core.express.status()
        express["links"] = {
            address_text(peer): {"latency_ms": None if lat is None else round(1000 * lat, 3), "express": fast}
            for peer, (lat, fast) in sorted(express["links"].items())
        }
        return {
            "shares": {
                "pending": len(shares.pending),
                "acknowledged": shares.acked,
                "sent_again": shares.resent,
                "taken_back": shares.taken_back,
                "late_acks": shares.late,
                "held_by_neighbours": {
                    str(s): address_text(a) for s, a in sorted(core.shared.out.items(), key=repr)
                },
                "held_here": len(core.shared.hosted),
                "delegated": core.shared.delegated,
                "received": core.shared.received,
            },
            "express": express,
        }
