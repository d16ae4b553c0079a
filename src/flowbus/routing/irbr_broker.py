"""IRBR over Pastry as the broker network's routing core (``--overlay pastry-irbr``).

How it works: :class:`IrbrBroker` gives an :class:`~flowbus.routing.irbr.IrbrNode` the
interface the broker process drives (the one :class:`~flowbus.routing.ring_broker.RingBroker`
has): ``start``/``join``, ``subscribe(sub_id, filter, meta=...)``, ``unsubscribe``,
``publish_batch`` (its ``Settled``), ``settle``, ``joined``, ``peer_addrs``.

* A broker's Pastry id is a hash of its address, so a broker that restarts on the same
  address comes back under the same id.
* Events carry their id in the ``EVENT_ID`` field, as on the ring, so the broker and the
  client de-duplicate the same way.
* Every range message between brokers is acknowledged hop by hop (``ack_timeout``, in
  seconds: :mod:`flowbus.routing.irbr_ack`), as in the simulator: a message written to a
  broker that died before reading it is re-sent into its range after the timeout.
* What IRBR does not give: custody and takeover. A publish counts as settled once this
  broker has routed it (Pastry's failure handling re-routes around dead nodes, see
  :mod:`flowbus.routing.irbr`), and a dead broker's subscriptions are not served elsewhere
  (its clients re-subscribe at another broker). The chordal ring is the default overlay
  because it has both.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

from flowbus.core import Core, Deliver, Effect, Settled
from flowbus.errors import ProtocolError
from flowbus.filters import Filter
from flowbus.meta import EVENT_ID
from flowbus.overlay.pastry import BITS, PastryNode
from flowbus.routing.irbr import IrbrNode
from flowbus.routing.ring_broker import DEDUP_WINDOW, check_new_subs

__all__ = ["ACK_TIMEOUT", "IrbrBroker", "pastry_id"]

ACK_TIMEOUT = 1.0
"""Seconds a broker waits for a range message's acknowledgement before re-sending it."""


def pastry_id(addr: int) -> int:
    """A broker's Pastry id: the first ``BITS`` bits of the SHA-256 of its address."""
    digest = hashlib.sha256(addr.to_bytes(8, "big")).digest()
    return int.from_bytes(digest, "big") >> (256 - BITS)


class IrbrBroker(Core):
    """One broker of the broker network routing with IRBR over Pastry (see the module note)."""

    def __init__(
        self, addr: int, *, heartbeat: float | None = None, ack_timeout: float = ACK_TIMEOUT
    ) -> None:
        pastry = PastryNode(addr, pastry_id(addr), rng=random.Random(addr), heartbeat=heartbeat)
        self.node = IrbrNode(pastry, ack_timeout=ack_timeout)
        self.addr = addr
        self.subs: set[Hashable] = set()
        self._meta: dict[Hashable, Any] = {}
        self._delivered: OrderedDict[tuple[Hashable, Any], None] = OrderedDict()

    # -- what the broker process reads

    @property
    def joined(self) -> bool:
        return self.node.pastry.ready

    @property
    def node_id(self) -> int:
        return self.node.node_id

    def peer_addrs(self) -> list[int]:
        """The addresses of the leaf set: the brokers a client may reconnect to."""
        book = self.node.pastry.book.addr_of
        return [book[n] for n in self.node.state.leaf_set() if n in book]

    def in_custody(self) -> int:
        return 0

    def meta_of(self, sub_id: Hashable) -> Any:
        return self._meta.get(sub_id)

    # -- local calls

    def start(self) -> list[Effect]:
        return self.node.join(None)

    def join(self, candidates: Sequence[int]) -> list[Effect]:
        if not candidates:
            raise ProtocolError("IrbrBroker.join: no broker to join through")
        return self.node.join(candidates[0])

    def subscribe(self, sub_id: Hashable, filt: Filter, *, meta: Any = None) -> list[Effect]:
        if sub_id in self.subs:
            raise ProtocolError(f"broker {self.addr}: subscription {sub_id!r} exists already")
        self.subs.add(sub_id)
        self._meta[sub_id] = meta
        return self.node.subscribe(filt, sub_id)

    def subscribe_many(self, items: Sequence[tuple[Hashable, Filter, Any]]) -> list[Effect]:
        """:meth:`subscribe` for each of ``items`` ``(sub_id, filt, meta)`` (all checked first)."""
        check_new_subs(self.addr, self.subs, [sub_id for sub_id, _, _ in items])
        return [e for sub_id, filt, meta in items for e in self.subscribe(sub_id, filt, meta=meta)]

    def unsubscribe(self, sub_id: Hashable) -> list[Effect]:
        if sub_id not in self.subs:
            raise ProtocolError(f"broker {self.addr}: no subscription {sub_id!r}")
        self.subs.discard(sub_id)
        self._meta.pop(sub_id, None)
        return self.node.unsubscribe(sub_id)

    def advertise(self, adv_id: Hashable, filt: Filter) -> list[Effect]:
        raise ProtocolError(f"broker {self.addr}: IRBR has no advertisements")

    def unadvertise(self, adv_id: Hashable) -> list[Effect]:
        raise ProtocolError(f"broker {self.addr}: IRBR has no advertisements")

    def publish_batch(self, items: Sequence[tuple[Hashable, Mapping[str, Any]]]) -> list[Effect]:
        out: list[Effect] = []
        for eid, event in items:
            out.extend(self.node.publish({**event, EVENT_ID: eid}, eid))
        out = self._out(out)
        if items:
            out.append(Settled(tuple(eid for eid, _ in items)))
        return out

    def settle(self, sub_id: Hashable, event_id: Hashable) -> list[Effect]:
        return []

    def settle_many(self, counts: Iterable[tuple[Hashable, int]]) -> list[Effect]:
        return []

    def refuse_local(self, items: Iterable[tuple[Hashable, str]]) -> list[Effect]:
        """No custody: the publishes were settled when routed; the deliveries are dropped."""
        return []

    def mark_backlog(self, sub_id: Hashable, on: bool) -> tuple[int, list[Effect]]:
        """No takeover: a queue on disk concerns nobody else (no version to wait for)."""
        return 0, []

    def backups_confirmed(self) -> int:
        return 0

    def consume(
        self, sub_id: Hashable, upto: Mapping[str, int], *, now: bool = True
    ) -> tuple[int, list[Effect]]:
        """No takeover delivers again: nothing to keep (no version to wait for)."""
        return 0, []

    def consumed(self, sub_id: Hashable) -> dict[str, int]:
        return {}

    def awaited(self, sub_id: Hashable) -> int | None:
        return None

    def backlog_done(self, sub_id: Hashable, home: int) -> list[Effect]:
        return []

    # -- the driver's entry points

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        return self._out(self.node.on_message(src, msg, now))

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        return self._out(self.node.on_timer(key, now))

    def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
        return self._out(self.node.on_send_failed(dst, msg, now))

    def _out(self, effects: list[Effect]) -> list[Effect]:
        """Deliveries to subscriptions served here, each (subscription, event) once."""
        out: list[Effect] = []
        for e in effects:
            if isinstance(e, Deliver):
                if e.sub not in self.subs:
                    continue
                key = (e.sub, e.event.get(EVENT_ID))
                if key in self._delivered:
                    continue
                self._delivered[key] = None
                if len(self._delivered) > DEDUP_WINDOW:
                    self._delivered.popitem(last=False)
            out.append(e)
        return out
