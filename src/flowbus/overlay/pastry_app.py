"""Protocols layered on Pastry: one core that is a Pastry node plus an application.

How it works (Pastry's application interface, Rowstron & Druschel 2001, section 2):
an application on a Pastry node sees every message routed *through* the node (the
``forward`` upcall) and the ones that end there (``deliver``). :class:`PastryApp` is that
layering as one sans-IO core. It owns a :class:`~flowbus.overlay.pastry.PastryNode` and
splits what the driver hands it:

* a ``Route`` whose payload is one of the application's message types goes to
  :meth:`PastryApp.on_route` at every hop (the app decides: handle, forward with
  :meth:`PastryApp.forward`, or both); any other Pastry message goes to the Pastry node;
* any other message is the application's own (sent directly, not routed):
  :meth:`PastryApp.on_app_message`;
* a failed send (the driver's ``on_send_failed``): the Pastry node forgets the dead peer
  and repairs its state; a routed application message is routed again from here (Pastry's
  own re-route, :meth:`PastryApp.on_route_failed`), a direct application message goes to
  :meth:`PastryApp.on_app_send_failed`;
* timers keyed ``("pastry", ...)`` are the Pastry node's, the others the application's.

Subclasses set ``app_messages`` and implement the three hooks. No driver is imported: the
simulator and the asyncio runtime drive these cores the same way.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, ClassVar

from flowbus.core import Core, Effect, Send
from flowbus.errors import ProtocolError
from flowbus.overlay.pastry import PastryNode, Route

__all__ = ["PastryApp"]


class PastryApp(Core):
    """Base of a sans-IO application core on a :class:`PastryNode` (see the module note)."""

    app_messages: ClassVar[tuple[type, ...]] = ()

    __slots__ = ("pastry",)

    def __init__(self, pastry: PastryNode) -> None:
        self.pastry = pastry

    @property
    def address(self) -> int:
        return self.pastry.address

    @property
    def node_id(self) -> int:
        return self.pastry.node_id

    # -- what subclasses implement

    def on_route(self, src: int, route: Route, now: float) -> list[Effect]:
        """An application message routed through (or to) this node."""
        raise NotImplementedError

    def on_app_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        """An application message sent straight to this node."""
        raise ProtocolError(f"{type(self).__name__} {self.address}: unknown message {msg!r} from {src}")

    def on_route_failed(self, dst: int, route: Route, now: float) -> list[Effect]:
        """Forwarding ``route`` to ``dst`` failed (Pastry has forgotten ``dst``): by default
        it goes on to the next hop, or is handled here if this node is now its end."""
        if self.next_hop(route.key) is None:
            return self.on_route(self.address, route, now)
        return self.forward(route)

    def on_app_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
        """A direct application message could not reach ``dst`` (Pastry has forgotten it)."""
        return []

    def on_app_timer(self, key: Hashable, now: float) -> list[Effect]:
        raise ProtocolError(f"{type(self).__name__} {self.address}: unknown timer {key!r}")

    # -- helpers for subclasses

    def route(self, key: int, payload: Any) -> list[Effect]:
        """Start routing ``payload`` towards ``key``: handled here first, as at every hop."""
        return self.on_route(self.address, Route(key, payload, 0, self.address), 0.0)

    def next_hop(self, key: int) -> int | None:
        """The address of the next hop towards ``key``; None if this node is responsible."""
        nxt = self.pastry.state.next_hop(key)
        return None if nxt is None else self.pastry.book.addr_of[nxt]

    def forward(self, route: Route, payload: Any | None = None) -> list[Effect]:
        """Send ``route`` (with a new payload if given) one hop on; [] if we are its end."""
        nxt = self.next_hop(route.key)
        if nxt is None:
            return []
        body = route.payload if payload is None else payload
        return [Send(nxt, Route(route.key, body, route.hops + 1, route.origin))]

    # -- the driver's entry points

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        if isinstance(msg, Route):
            if isinstance(msg.payload, self.app_messages):
                return self.on_route(src, msg, now)
            return self.pastry.on_message(src, msg, now)
        if isinstance(msg, self.app_messages):
            return self.on_app_message(src, msg, now)
        return self.pastry.on_message(src, msg, now)

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        if isinstance(key, tuple) and key[:1] == ("pastry",):
            return self.pastry.on_timer(key, now)
        return self.on_app_timer(key, now)

    def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
        if isinstance(msg, Route) and isinstance(msg.payload, self.app_messages):
            again = Route(msg.key, msg.payload, max(msg.hops - 1, 0), msg.origin)
            return self.pastry.node_failed(dst) + self.on_route_failed(dst, again, now)
        if isinstance(msg, self.app_messages):
            return self.pastry.node_failed(dst) + self.on_app_send_failed(dst, msg, now)
        return self.pastry.on_send_failed(dst, msg, now)
