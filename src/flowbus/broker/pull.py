"""Pulled durable subscriptions: a reader reads a subscription's queue by position, as often as
it likes, and acknowledges up to a position when it is done (Spark's streaming source,
:mod:`flowbus.spark.bus`).

How it works:

* **Open** (``QueueOpen``). The subscription is made as a durable one of the session's
  client (:meth:`flowbus.broker.queues.Queues.subscribe`: its space, filter and schema are
  checked as for any subscription) and detached at once, in the same step, before any event
  reaches it. A durable subscription with no connection attached spills every delivery to
  the broker's SQLite queue (:mod:`flowbus.broker.queues`), so each of its events waits there
  at a *position*, the queue table's increasing key. Opening it again (a restarted reader)
  finds it; another space or filter under the same name is refused.
* **Read** (``QueueRead``): the rows at positions ``(after, upto]``, and the highest position
  queued (``top``). Nothing changes: a reader that dies re-reads the same rows.
* **Acknowledge** (``QueueAck``): the rows up to a position leave the queue (if the store is
  full, the acknowledgement is refused, naming it: the reader acknowledges again later).
* **Positions are one increasing sequence per store**, over all its subscriptions: once a
  read has seen ``top`` for some subscriptions, no row at or below it can still come for
  any of them, so one position cuts several subscriptions consistently. Every answer names
  the store (:attr:`~flowbus.broker.store.Store.identity`): positions of another store (the
  subscription taken over by another broker) mean nothing here.
* **Marks** (``QueueRead(marks=True)``): per publisher, the highest sequence number queued
  at positions ``(after, upto]`` (ids only read), what a reader that must not depend on one
  store's positions keeps (:class:`flowbus.client.pull.Mark`).
* **Taken over** (:mod:`flowbus.broker.handover`): a subscription this broker took over from
  a dead one waits for the dead one's queue (its older events, put before what came here
  meanwhile, and the positions numbered anew); until it has come (or is given up), a read
  answers no rows, ``top`` 0 and ``awaiting``. ``QueueOpen(resume=True)`` at a broker that
  does not serve the subscription answers ``not here``: a reader that finds its subscription
  after a takeover does not make a second one elsewhere.

A subscription another connection has attached (a plain ``Subscribe``) is not pulled: its
events go to that connection, and a read is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgpack  # type: ignore[import-untyped]

from flowbus.client import protocol as p
from flowbus.errors import FlowbusError, StoreFull
from flowbus.filters import parse

if TYPE_CHECKING:
    from flowbus.broker.outbox import Outbox as Session
    from flowbus.broker.queues import Queues, SubQueue

__all__ = ["MAX_ROWS", "Pulls"]

MAX_ROWS = 2000
"""Rows one read answers at most (frames stay well under the size limit)."""

Answer = tuple[bool, str | None, Any]


class Pulls:
    """The pulled subscriptions' requests (see the module note)."""

    def __init__(self, queues: Queues) -> None:
        self.queues = queues

    def open(self, session: Session, msg: p.QueueOpen) -> Answer:
        queues = self.queues
        sub = queues.subs.get(msg.sub_id)
        if sub is not None:
            why = self._clash(sub, msg)
            if why is not None:
                return False, why, None
            return True, None, {"top": queues.store.top(sub.sub_id), "store": queues.store.identity}
        subscribe = p.Subscribe(msg.req, msg.sub_id, msg.space, msg.filter, True, resume=msg.resume)
        ok, error = queues.subscribe(session, subscribe)
        if not ok:
            return False, error, None
        sub = queues.subs[msg.sub_id]  # (made now, or taken over from a dead broker)
        queues.detach(sub)  # (in this step: no delivery reached it)
        return True, None, {"top": queues.store.top(sub.sub_id), "store": queues.store.identity}

    def read(self, session: Session, msg: p.QueueRead) -> Answer:
        sub, why = self._pulled(msg.sub_id)
        if sub is None:
            return False, why, None
        store = self.queues.store
        if sub.awaiting is not None:  # (its former broker's queue comes first, renumbered)
            return True, None, {"top": 0, "rows": [], "marks": {}, "store": store.identity, "awaiting": True}
        top = store.top(sub.sub_id)
        if msg.marks:
            marks = store.marks(sub.sub_id, msg.after, min(msg.upto, top))
            return True, None, {"top": top, "marks": marks, "store": store.identity}
        limit = max(0, min(msg.limit, MAX_ROWS))
        rows = []
        for row in store.between(sub.sub_id, msg.after, msg.upto, limit) if limit else ():
            (publisher, pseq), event = msgpack.unpackb(row.payload)
            rows.append([row.seq, publisher, pseq, event])
        return True, None, {"top": top, "rows": rows, "store": store.identity}

    def ack(self, session: Session, msg: p.QueueAck) -> Answer:
        sub, why = self._pulled(msg.sub_id)
        if sub is None:
            return False, why, None
        store = self.queues.store
        try:
            store.ack(sub.sub_id, msg.upto)
        except StoreFull as e:
            return False, str(e), None
        sub.on_disk = store.depth(sub.sub_id)
        return True, None, {"top": store.top(sub.sub_id), "depth": sub.on_disk}

    def _pulled(self, sub_id: str) -> tuple[SubQueue | None, str]:
        sub = self.queues.subs.get(sub_id)
        if sub is None or not sub.durable:
            return None, f"no pulled subscription {sub_id!r} here"
        if sub.session is not None:
            return None, f"subscription {sub_id!r} is attached to a connection: it is not pulled"
        return sub, ""

    @staticmethod
    def _clash(sub: SubQueue, msg: p.QueueOpen) -> str | None:
        if not sub.durable or sub.session is not None:
            return f"subscription {msg.sub_id!r} exists and is not a pulled one"
        if sub.space != msg.space:
            return f"subscription {msg.sub_id!r} reads space {sub.space!r}, not {msg.space!r}"
        if sub.filter not in (msg.filter, _canonical(msg.filter)):
            return f"subscription {msg.sub_id!r} has filter {sub.filter!r}, not {msg.filter!r}"
        return None


def _canonical(text: str) -> str:
    try:
        return parse(text).to_text()
    except FlowbusError:  # (a bad filter differs from any stored one)
        return text
