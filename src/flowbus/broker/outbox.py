"""What a broker's parts write to a client: the :class:`Outbox` of its connection.

How it works: a client's connection (:class:`~flowbus.broker.sessions.Session`) is, for the
parts that answer the client, only somewhere to write: the ledger writes publish
acknowledgements and refusals, the advertisements and pulled queues their replies, and the
subscription queues (:mod:`flowbus.broker.queues`, which own every delivery in flight:
their numbers, what each was for, what comes back at a reconnect) write delivery rows. They
see it through this protocol, so none of them imports the sessions that drive them.

A delivery row names the subscriptions of the connection it is for, its number on the
connection, the event's id and the event. One event's deliveries to one connection go in
one row: :meth:`Outbox.same_row` says whether the last row written (and not flushed yet) is
``event``'s, which :meth:`Outbox.extend_row` then extends.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["Outbox"]


class Outbox(Protocol):
    """A client's connection, as the broker's parts write to it."""

    @property
    def client(self) -> str:
        """The client's name (its ``Hello``)."""
        ...

    @property
    def identity(self) -> str | None:
        """Who the client is (certificate or token); None: nobody."""
        ...

    @property
    def closed(self) -> bool: ...

    def send(self, msg: Any) -> None:
        """Write ``msg`` (a reply, a refusal...) with what this step gathers."""
        ...

    def pub_ack(self, pseq: int) -> None:
        """Acknowledge the client's publish ``pseq`` (gathered in one ``PubAck``)."""
        ...

    def same_row(self, event: Any) -> bool:
        """Whether the last row gathered is ``event``'s (and may be extended)."""
        ...

    def extend_row(self, sub_ids: list[str]) -> None:
        """The last row is for ``sub_ids`` too."""
        ...

    def add_row(
        self, sub_ids: list[str], cseq: int, eid: Any, event: Any, *, extendable: bool = True
    ) -> None:
        """A delivery row: ``event`` (id ``eid``) to ``sub_ids``, numbered ``cseq``
        (``extendable``: a later delivery of the same event may join it)."""
        ...
