"""The routing cores a broker can run, and what the broker needs of one.

How it works: a broker process drives one sans-IO routing core (:class:`flowbus.core.Core`)
under the asyncio runtime. Beyond the messages and timers every core takes, a broker calls
the local operations of :class:`BrokerCore`: join the network, subscribe and unsubscribe,
advertise, publish a batch of events, settle deliveries or refuse them (the custody of the
ring broker), and it reads what a taken-over subscription was made with (``meta_of``). What
became of its requests comes back as effects (:class:`~flowbus.core.Outcome`: publishes
settled or refused, subscriptions ended). Two cores offer it:

* ``chordal-ring`` (the default): :class:`~flowbus.routing.ring_broker.RingBroker`, the
  chordal ring with backups, failure repair, covering-based routing and custody;
* ``pastry-irbr``: :class:`~flowbus.routing.irbr_broker.IrbrBroker`, IRBR over Pastry (no
  custody, no takeover, no advertisements).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from flowbus.broker.config import BrokerConfig
from flowbus.core import Core, Effect
from flowbus.errors import ConfigError
from flowbus.filters import Filter
from flowbus.net.runtime import where_of
from flowbus.routing.express import ExpressRoutes
from flowbus.routing.irbr_broker import IrbrBroker
from flowbus.routing.ring_broker import RingBroker

__all__ = ["OVERLAYS", "BrokerCore", "address_text", "check_overlay", "new_core"]

OVERLAYS = ("chordal-ring", "pastry-irbr")


class BrokerCore(Core, Protocol):
    """What a broker process needs of its routing core, beyond what every core offers."""

    @property
    def subs(self) -> Collection[Hashable]:
        """The subscriptions served here (own, and taken over from dead brokers)."""
        ...

    @property
    def joined(self) -> bool: ...
    @property
    def node_id(self) -> int: ...
    def peer_addrs(self) -> list[int]: ...
    def in_custody(self) -> int: ...
    def meta_of(self, sub_id: Hashable) -> Any: ...
    def start(self) -> list[Effect]: ...
    def join(self, candidates: Sequence[int]) -> list[Effect]: ...
    def subscribe(self, sub_id: Hashable, filt: Filter, *, meta: Any = None) -> list[Effect]: ...
    def subscribe_many(self, items: Sequence[tuple[Hashable, Filter, Any]]) -> list[Effect]:
        """:meth:`subscribe` for each of ``items`` ``(sub_id, filt, meta)``: all checked before
        any is made (a :class:`~flowbus.errors.ProtocolError` for an id served already)."""
        ...

    def unsubscribe(self, sub_id: Hashable) -> list[Effect]: ...
    def advertise(self, adv_id: Hashable, filt: Filter) -> list[Effect]: ...
    def unadvertise(self, adv_id: Hashable) -> list[Effect]: ...
    def publish_batch(self, items: Sequence[tuple[Hashable, Mapping[str, Any]]]) -> list[Effect]: ...
    def settle_many(self, counts: Iterable[tuple[Hashable, int]]) -> list[Effect]: ...
    def refuse_local(self, items: Iterable[tuple[Hashable, str]]) -> list[Effect]:
        """Local deliveries the broker gave up, ``(event id, reason)`` (a queue whose store is
        full): their publishes are refused with the reason where the core keeps custody."""
        ...

    def mark_backlog(self, sub_id: Hashable, on: bool) -> tuple[int, list[Effect]]:
        """A subscription's queue has events on this broker's disk (``on``), or none any more
        (what a taker must wait for: routing/ring_handover.py): the backup version to wait
        for before relying on it, and the effects."""
        ...

    def backups_confirmed(self) -> int: ...
    def consume(
        self, sub_id: Hashable, upto: Mapping[str, int], *, now: bool = True
    ) -> tuple[int, list[Effect]]:
        """A subscription's client has consumed each publisher's events up to a sequence
        number (a client that cannot drop what it had by id): kept where a taker that
        delivers again finds it; the backup version to wait for, and the effects."""
        ...

    def consumed(self, sub_id: Hashable) -> dict[str, int]: ...
    def awaited(self, sub_id: Hashable) -> int | None: ...
    def backlog_done(self, sub_id: Hashable, home: int) -> list[Effect]: ...


def check_overlay(overlay: str, config: BrokerConfig) -> None:
    """A :class:`ConfigError` if ``overlay`` is unknown or cannot serve ``config``."""
    if overlay not in OVERLAYS:
        raise ConfigError(f"unknown overlay {overlay!r} (expected {' or '.join(OVERLAYS)})")
    if overlay == "pastry-irbr" and config.advertising:
        raise ConfigError("advertising: the pastry-irbr overlay has no advertisements")


def new_core(overlay: str, addr: int, config: BrokerConfig) -> tuple[BrokerCore, RingBroker | None]:
    """The routing core of a broker at ``addr`` (``overlay`` checked by :func:`check_overlay`),
    and the same core again if it is the chordal ring's (None otherwise): what only the ring
    has (flows, takeovers, fencing, the ring's pages and log) the broker reads from there."""
    check_overlay(overlay, config)
    if overlay == "pastry-irbr":
        return IrbrBroker(addr, heartbeat=config.heartbeat), None
    ring = RingBroker(
        addr,
        backup=config.backup,
        heartbeat=config.heartbeat,
        custody=True,
        local_ack=True,
        grouped=True,  # (an event's local deliveries in one effect: see broker/queues.py)
        advertising=config.advertising,
        probe_timeout=2 * config.heartbeat,
        ping_timeout=2 * config.heartbeat,
        load_limit=config.load_limit,
        rate_limit=config.rate_limit,
        # over its limit it shares its clients' subscriptions' routing with a neighbour (their
        # sessions stay: routing/ring_share.py), and asks for a broker if none has room
        share_subs=config.load_limit is not None or config.rate_limit is not None,
        nonce=time.time_ns(),  # (this process's: a restart joins with another id than it had)
        express=ExpressRoutes(  # (the wall clock numbers its announcements: a restart's are newer)
            addr,
            bound=config.express_bound if "express" in config.classes.values() else None,
            is_express=lambda space: config.express(space) and not config.secure(space),  # (secure wins)
            epoch=time.time_ns(),
        ),
    )
    return ring, ring


def address_text(addr: int) -> str:
    """A broker's address as ``"host:port"`` (the number itself if it is not an address)."""
    where = where_of(addr)
    return f"{where[0]}:{where[1]}" if where else str(addr)
