"""What the web console, its pages and its metrics read of a running broker: the
:class:`BrokerView` protocol (:class:`~flowbus.broker.server.Broker` is one), so that they
need not import the server that starts them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from flowbus.broker.adapt import AdaptLog
    from flowbus.broker.flows import BrokerFlows
    from flowbus.broker.ledger import Ledger
    from flowbus.broker.overlays import BrokerCore
    from flowbus.broker.queues import Queues
    from flowbus.broker.ringlog import RingLog
    from flowbus.broker.sessions import Sessions
    from flowbus.broker.spaces import Spaces
    from flowbus.errors import StoreFull
    from flowbus.net.runtime import Runtime
    from flowbus.routing.ring_broker import RingBroker

__all__ = ["BrokerView"]


class BrokerView(Protocol):
    """A running broker, as its console sees it."""

    @property
    def address(self) -> str: ...
    @property
    def core(self) -> BrokerCore: ...
    @property
    def ring_core(self) -> RingBroker | None: ...
    @property
    def runtime(self) -> Runtime: ...
    @property
    def spaces(self) -> Spaces: ...
    @property
    def flows(self) -> BrokerFlows: ...
    @property
    def ledger(self) -> Ledger: ...
    @property
    def queues(self) -> Queues: ...
    @property
    def sessions(self) -> Sessions: ...
    @property
    def ring_log(self) -> RingLog | None: ...
    @property
    def adapt(self) -> AdaptLog | None: ...
    def store_full(self) -> StoreFull | None: ...
    def stats(self) -> dict[str, Any]: ...
