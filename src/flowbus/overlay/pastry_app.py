"""Protocols layered on Pastry: one core that is a Pastry node plus an application.

How it works (Pastry's application interface, Rowstron & Druschel 2001, section 2):
an application on a Pastry node sees every message routed *through* the node (the
``forward`` upcall) and the ones that end there (``deliver``). :class:`PastryApp` is that
layering as one sans-IO core. It owns a :class:`~flowbus.overlay.pastry.PastryNode` and
splits what the driver hands it by one table, the application's message types
(``app_messages``):

* one of the application's messages, sent straight to this node or routed through (or to)
  it inside a ``Route``, goes to :meth:`PastryApp.on_app_message`, with the ``Route`` (or
  None if it came straight). That method is where an application reads its messages, in
  one ``match``: for a routed one it decides to handle it, pass it on with
  :meth:`PastryApp.forward`, or both. Every other message is the Pastry node's; when it
  completes the node's join, :meth:`PastryApp.on_joined` follows;
* a failed send (the driver's ``on_send_failed``): the Pastry node forgets the dead peer
  and repairs its state, then an application message goes to
  :meth:`PastryApp.on_app_send_failed`, with its ``Route`` if it was routed (by default a
  routed one is routed again from here, Pastry's own re-route: :meth:`PastryApp.reroute`);
* timers keyed ``("pastry", ...)`` are the Pastry node's, the others the application's
  (:meth:`PastryApp.on_app_timer`).

Subclasses set ``app_messages`` and implement :meth:`PastryApp.on_app_message` (and the
other hooks they need). No driver is imported: the simulator and the asyncio runtime drive
these cores the same way.
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

    app_messages: ClassVar[frozenset[type]] = frozenset()
    """The application's message types (exact types): what is not one is Pastry's."""

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

    def on_app_message(self, src: int, msg: Any, now: float, route: Route | None) -> list[Effect]:
        """An application message from ``src``: sent straight here (``route`` is None), or
        routed through or to this node, ``route`` being its Pastry envelope (Pastry's
        ``forward`` and ``deliver`` upcalls)."""
        raise ProtocolError(f"{type(self).__name__} {self.address}: unknown message {msg!r} from {src}")

    def on_joined(self, now: float) -> list[Effect]:
        """The Pastry node has just joined the network (the last state of its join came)."""
        return []

    def on_app_send_failed(self, dst: int, msg: Any, now: float, route: Route | None) -> list[Effect]:
        """An application message could not reach ``dst`` (Pastry has forgotten it already):
        by default a routed one is routed again from here (:meth:`reroute`), a direct one is
        given up."""
        return [] if route is None else self.reroute(route, now)

    def on_app_timer(self, key: Hashable, now: float) -> list[Effect]:
        raise ProtocolError(f"{type(self).__name__} {self.address}: unknown timer {key!r}")

    # -- helpers for subclasses

    def route(self, key: int, payload: Any) -> list[Effect]:
        """Start routing ``payload`` towards ``key``: handled here first, as at every hop."""
        return self.on_app_message(self.address, payload, 0.0, Route(key, payload, 0, self.address))

    def reroute(self, route: Route, now: float) -> list[Effect]:
        """Route ``route`` on from here: to the next hop, or handled here if this node is now
        its end."""
        if self.next_hop(route.key) is None:
            return self.on_app_message(self.address, route.payload, now, route)
        return self.forward(route)

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
        apps = self.app_messages
        if msg.__class__ in apps:
            return self.on_app_message(src, msg, now, None)
        if msg.__class__ is Route and msg.payload.__class__ in apps:
            return self.on_app_message(src, msg.payload, now, msg)
        joining = not self.pastry.ready
        out = self.pastry.on_message(src, msg, now)
        if joining and self.pastry.ready:
            out.extend(self.on_joined(now))
        return out

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        if isinstance(key, tuple) and key[:1] == ("pastry",):
            return self.pastry.on_timer(key, now)
        return self.on_app_timer(key, now)

    def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
        apps = self.app_messages
        if msg.__class__ in apps:
            return self.pastry.node_failed(dst) + self.on_app_send_failed(dst, msg, now, None)
        if msg.__class__ is Route and msg.payload.__class__ in apps:
            again = Route(msg.key, msg.payload, max(msg.hops - 1, 0), msg.origin)
            return self.pastry.node_failed(dst) + self.on_app_send_failed(dst, msg.payload, now, again)
        return self.pastry.on_send_failed(dst, msg, now)
