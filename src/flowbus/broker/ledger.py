"""The publish ledger: a client's publishes from ``Publish`` to ``PubAck``, each once.

How it works (flowbus's own exactly-once publishing, on the custody of
:mod:`flowbus.routing.ring_broker`):

* **Numbering.** A client numbers its publishes from 1 up (``pseq``); ``(client, pseq)``
  is the event's id everywhere. The ledger keeps, per publisher, the highest ``pseq`` it
  has taken.
* **A batch.** A client's ``Publish`` frame is one batch. Each event in it is checked
  against its space's schema (:mod:`flowbus.broker.spaces`) and, with advertising on,
  against its client's advertisements (:mod:`flowbus.broker.adverts`); a refused one is
  answered ``Nack`` with the reason. The good ones go to the core in one call
  (``publish_batch``).
* **Who may publish.** With an ``admit`` hook (the broker's: the identity's ``publish``
  right on the space, :mod:`flowbus.broker.acl`; a ``secure`` space's route,
  :mod:`flowbus.broker.links`), an event it refuses is answered ``Nack`` with its reason
  and never reaches the core.
* **Custody.** The core keeps each publish in custody until every broker and local
  subscription it went to is done with it; then it lists the id in ``settled``, and the
  ledger sends ``PubAck`` (:meth:`Ledger.settled`). A publish is thus acknowledged once it
  is where every matching subscriber will get it: with its subscriber's client, or in the
  queue on that subscriber's broker's disk. One that a broker on the way refused to carry
  (a secure space's event before a plain link) comes back refused: ``Nack`` with the
  reason (:meth:`Ledger.refused`).
* **Re-sends.** A re-sent publish (same ``(client, pseq)``, at or below the highest taken)
  is not published twice: it is acknowledged at once if it is settled, and when it settles
  if it is still in flight.
* **The mark in SQLite.** The store keeps, per publisher, the highest ``pseq`` up to which
  every publish was settled (or refused), not the highest taken (:meth:`Ledger._keep`).
  After a restart, a re-send at or below the mark is acknowledged; one above it (taken,
  maybe not settled when the broker died: its events waited in memory, in custody) is
  published again, and its id de-duplicates it downstream. A mark the store cannot take
  (:class:`~flowbus.errors.StoreFull`: its disk is full) is kept in memory and written
  again with the publisher's next batch or the broker's retry (:meth:`Ledger.retry`); the
  mark on disk lags meanwhile, which is safe.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from flowbus.broker.adverts import Adverts
from flowbus.broker.overlays import BrokerCore
from flowbus.broker.spaces import Spaces
from flowbus.broker.store import Store
from flowbus.client import protocol as p
from flowbus.core import Effect
from flowbus.errors import StoreFull

if TYPE_CHECKING:
    from flowbus.broker.outbox import Outbox as Session

__all__ = ["EventId", "Ledger"]

EventId = tuple[str, int]
"""A published event's id: ``(publisher client, pseq)``."""


class Ledger:
    """The publishes taken at this broker (see the module note)."""

    def __init__(
        self,
        *,
        core: BrokerCore,
        apply: Callable[[Sequence[Effect]], None],
        store: Store,
        spaces: Spaces,
        adverts: Adverts,
        admit: Callable[[Session, str, dict[str, Any]], str | None] | None = None,
    ) -> None:
        self.core = core
        self.admit = admit
        self.apply = apply
        self.store = store
        self.spaces = spaces
        self.adverts = adverts
        self.published = 0
        # (the console's metrics, when it runs: each batch taken, each list of publishes settled)
        self.on_taken: Callable[[list[tuple[EventId, dict[str, Any]]]], None] | None = None
        self.on_settled: Callable[[list[Any]], None] | None = None
        self._last: dict[str, int] = {}  # publisher -> the highest pseq taken
        self._in_flight: dict[EventId, None] = {}  # published here, not settled
        self._open: dict[str, list[int]] = {}  # publisher -> heap of its pseqs published here
        # (those still in _in_flight are not settled; the others are dropped lazily)
        self._marks: dict[str, int] = {}  # publisher -> a mark the store did not take yet
        self.full: StoreFull | None = None  # what the store failed with while a mark waits

    def publish(self, session: Session, msgs: Sequence[p.Publish]) -> None:
        """Take a client's batches (those one read brought): refuse, acknowledge (re-sends) or
        publish each event, all of them in one step of the core (each batch's events are new
        past the highest sequence number of the batches before it, as if taken one by one)."""
        client = session.client
        last = self._last_of(client)
        items: list[tuple[EventId, dict[str, Any]]] = []
        top = last
        for msg in msgs:
            taken = len(items)
            top = self._check_batch(session, msg, top, items)
            self._track(client, items[taken:])  # (a re-send in a later batch waits for these)
        if items:
            if self.on_taken is not None:
                self.on_taken(items)
            self.apply(self.core.publish_batch(items))
        if top > last:
            self._last[client] = top
            self._keep(client, top)

    def _check_batch(
        self, session: Session, msg: p.Publish, last: int, items: list[tuple[EventId, dict[str, Any]]]
    ) -> int:
        """Check one batch's events into ``items`` (``last``: the highest sequence number
        taken before it); the highest taken after it."""
        client = session.client
        check = self.spaces.check_event
        adverts = self.adverts if self.adverts.enabled else None
        top = last
        for pseq, event, space in msg.items():
            if type(pseq) is not int or pseq < 1:
                session.send(
                    p.Nack(pseq if type(pseq) is int else -1, f"bad publish sequence number {pseq!r}")
                )
                continue
            if pseq <= last:  # a re-send: acknowledged at once if settled, later if not
                if (client, pseq) not in self._in_flight:
                    session.pub_ack(pseq)
                continue
            top = max(top, pseq)
            fields, error = check(space, event)
            if fields is not None and adverts is not None and not adverts.admits(session, fields):
                fields, error = None, f"no advertisement of this client matches the event in {space!r}"
            if fields is not None and self.admit is not None:
                refusal = self.admit(session, space, fields)
                if refusal is not None:
                    fields, error = None, refusal
            if fields is None:
                session.send(p.Nack(pseq, error))
                continue
            items.append(((client, pseq), fields))
        return top

    def settled(self, eids: list[Any], sessions: Mapping[str, Session], *, tell: bool = True) -> None:
        """The core settled these publishes: acknowledge them to their clients if connected
        (not if ``tell`` is False: the broker lost its lease, its clients are going; a
        re-send of one is acknowledged at once wherever it is settled)."""
        in_flight = self._in_flight
        if self.on_settled is not None:
            self.on_settled(eids)
        for eid in eids:
            if eid not in in_flight:  # (published by the core itself: a flow's derived event)
                continue
            del in_flight[eid]
            if isinstance(eid, tuple):
                session = sessions.get(eid[0]) if tell else None
                if session is not None:
                    session.pub_ack(eid[1])
                self._lowest_open(eid[0])  # (drops what is settled from the heap)

    def refused(self, items: list[tuple[Any, str]], sessions: Mapping[str, Session]) -> None:
        """The core gave these publishes up on the way (``(id, reason)``: a broker further on
        could not carry a secure space's event over a secure link): each is answered ``Nack``."""
        in_flight = self._in_flight
        for eid, why in items:
            if eid not in in_flight:
                continue
            del in_flight[eid]
            session = sessions.get(eid[0])
            if session is not None:
                session.send(p.Nack(eid[1], why))
            self._lowest_open(eid[0])

    def last_taken(self, client: str) -> int:
        """The highest ``pseq`` taken from ``client`` (0: none; kept in SQLite over a restart).
        A STOMP connection, whose client does not number its publishes, numbers them on from
        here (:mod:`flowbus.broker.stomp`): a lower one would be taken for a re-send."""
        return self._last_of(client)

    def _last_of(self, client: str) -> int:
        last = self._last.get(client)
        if last is None:
            last = self._last[client] = self.store.last_seq(client) or 0
        return last

    def _track(self, client: str, items: list[tuple[EventId, dict[str, Any]]]) -> None:
        """``items`` of ``client`` go to the core: in flight until settled."""
        heap = self._open.setdefault(client, [])
        for eid, _ in items:
            self._in_flight[eid] = None
            heapq.heappush(heap, eid[1])
        self.published += len(items)

    def _keep(self, client: str, top: int) -> None:
        """Keep in SQLite the highest ``pseq`` of ``client`` up to which every publish is
        settled or refused, not the highest taken: a publish taken but not settled when
        this broker dies (its events waited in memory, in custody) must be published
        again when its publisher re-sends it after the restart, not acknowledged and lost.
        (A mark lagging behind is safe: it only lets more re-sends be published again.)"""
        lowest = self._lowest_open(client)
        self._mark(client, top if lowest is None else lowest - 1)

    def _mark(self, client: str, mark: int) -> None:
        """Write ``client``'s mark (not above the kept one: no-op); if the store is full, it
        waits in memory, written again later (:meth:`retry`)."""
        mark = max(mark, self._marks.pop(client, mark))
        try:
            self.store.accept(client, mark)
        except StoreFull as e:
            self._marks[client] = mark
            self.full = e
            return
        if not self._marks:
            self.full = None

    def retry(self) -> None:
        """Write the marks the store did not take (until one fails again)."""
        for client, mark in list(self._marks.items()):
            self._mark(client, mark)
            if client in self._marks:
                return

    def _lowest_open(self, client: str) -> int | None:
        """The lowest ``pseq`` of ``client`` published here and not settled yet, if any."""
        heap = self._open.get(client)
        while heap and (client, heap[0]) not in self._in_flight:
            heapq.heappop(heap)
        if heap:
            return heap[0]
        self._open.pop(client, None)
        return None
