"""Secure links made real: the events of a ``secure`` space cross only mutual-TLS links.

How it works (Chordal Reliability Rings, section 3.5: secure events over secure links; the
class router of :mod:`flowbus.overlay.class_router`):

* **The view.** A broker's links are its ring peers (:meth:`BrokerCore.peer_addrs`). Each
  is of class ``NORMAL``, and also ``SECURE`` when this broker's connection to the peer is
  mutual TLS: both ends presented a broker certificate of the ring's authority
  (:meth:`flowbus.net.runtime.Runtime.secure`). :class:`SecureLinks` keeps them in a
  :class:`~flowbus.overlay.multigraph.Multigraph`, rebuilt when a peer or a class changes,
  and asks a :class:`~flowbus.overlay.class_router.ClassRouter` over it for the hop of a
  ``SECURE`` event: one exists only over secure links, and a secure event never falls back.
* **Secure spaces** are those matching a ``classes:`` pattern of class ``secure`` in the
  broker's config, and those a deployed flow declares ``class: secure``
  (:func:`~flowbus.flow.spec.space_classes`).
* **Before a publish** (:meth:`SecureLinks.refusal`, the ledger's ``admit``): an event of a
  secure space is routed on paper first (the content router's ``route_batch``, which
  changes nothing); if a broker it would be sent to has no secure hop, the publish is
  refused by name, never sent in clear.
* **On every link** (:meth:`SecureLinks.filter`, the runtime's ``link_filter``): an event of
  a secure space about to leave over a link that is not secure is dropped and counted in
  ``dropped`` (a broker further on the route whose next link is plain: the event stops
  there, in custody, rather than cross it); one arriving over such a link is dropped and
  counted in ``violations`` (its sender did not keep the rule).

What a broker sees is its own links only: a route whose first hop is secure but a later
one is not is refused at that later broker (``dropped``), not at the publisher's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from flowbus.broker.config import BrokerConfig
from flowbus.broker.overlays import address_text
from flowbus.broker.spaces import SPACE
from flowbus.core import Send
from flowbus.flow.spec import space_classes
from flowbus.overlay.class_router import ClassRouter
from flowbus.overlay.multigraph import NORMAL_ONLY, LinkClass, Multigraph
from flowbus.routing import cbr
from flowbus.routing.ring_broker import HandedOver, RingBroker

__all__ = ["SecureLinks"]

log = logging.getLogger("flowbus.broker")

_SECURE = frozenset({LinkClass.NORMAL, LinkClass.SECURE})


class SecureLinks:
    """The link classes of one broker and the rule of secure spaces (see the module note)."""

    def __init__(self, core: RingBroker, config: BrokerConfig, secure: Callable[[int], bool]) -> None:
        self.core = core
        self.config = config
        self.secure = secure  # peer -> whether our connection to it is mutual TLS
        self.dropped = 0  # secure events not sent over a plain link
        self.violations = 0  # secure events that arrived over a plain link
        self._classes: dict[int, bool] = {}
        self._router = ClassRouter(core.addr, Multigraph([core.addr]))
        self._spaces: dict[str, bool] = {}  # space -> secure (cached while the flows are the same)
        self._flows: tuple[str, ...] = ()  # versions of the deployed flows the cache is for
        self._flow_secure: set[str] = set()  # spaces the deployed flows declare secure

    @property
    def any_secure(self) -> bool:
        """Whether any space may be secure (the config's classes, the flows'): else every
        event may take every link."""
        self._sync_flows()
        return bool(self._flow_secure) or any(c == "secure" for c in self.config.classes.values())

    def _sync_flows(self) -> None:
        """The spaces the deployed flows declare secure, read again when the flows change."""
        deployments = self.core.flows.deployments
        if len(deployments) == len(self._flows) and (
            not deployments or tuple(d.version for d in deployments.values()) == self._flows
        ):
            return
        self._flows = tuple(d.version for d in deployments.values())
        self._flow_secure = {
            name
            for d in deployments.values()
            for name, cls in space_classes(yaml.safe_load(d.text)).items()
            if cls == "secure"
        }
        self._spaces = {}

    def is_secure_space(self, space: Any) -> bool:
        """Whether ``space`` is secure (call :attr:`any_secure` first: it reads the flows)."""
        known = self._spaces.get(space)
        if known is None:
            known = self._spaces[space] = isinstance(space, str) and (
                space in self._flow_secure or self.config.secure(space)
            )
        return known

    def hop(self, dst: int) -> bool:
        """Whether a secure event may go to peer ``dst`` (the class router has a hop for it)."""
        self._refresh()
        if dst not in self._router.view:
            return False
        sends = self._router.send(dst, None, LinkClass.SECURE, 0.0)
        return bool(sends) and isinstance(sends[0], Send) and sends[0].dst == dst

    def refusal(self, space: str, fields: Mapping[str, Any]) -> str | None:
        """Why an event of ``space`` may not be published here (None: it may)."""
        if not self.any_secure or not self.is_secure_space(space):
            return None
        for effect in self.core.router.route_batch([fields], self.core.addr):
            if isinstance(effect, Send) and not self.hop(effect.dst):
                return (
                    f"space {space!r} is secure and broker {address_text(effect.dst)} on its route "
                    "has no secure (mutual TLS) link from here: refused, not sent in clear"
                )
        return None

    def filter(self, peer: int, msgs: list[Any], secure: bool, outgoing: bool) -> list[Any]:
        """The runtime's ``link_filter``: drop secure events on a link that is not secure."""
        if secure or not self.any_secure:
            return msgs
        kept = []
        for msg in msgs:
            event = msg.event if type(msg) is cbr.Publish or type(msg) is HandedOver else None
            if event is not None and self.is_secure_space(event.get(SPACE)):
                self._count(peer, event.get(SPACE), outgoing=outgoing)
                continue
            kept.append(msg)
        return kept

    def _count(self, peer: int, space: Any, *, outgoing: bool) -> None:
        if outgoing:
            self.dropped += 1
        else:
            self.violations += 1
        if (self.dropped + self.violations) & 0x3FF == 1:  # (a line now and then, not per event)
            way = "to" if outgoing else "from"
            log.warning(
                "an event of secure space %r not taken %s %s: a plain link", space, way, address_text(peer)
            )

    def _refresh(self) -> None:
        """The view again if a peer or its class changed."""
        classes = {peer: self.secure(peer) for peer in self.core.peer_addrs()}
        if classes == self._classes:
            return
        self._classes = classes
        view = Multigraph([self.core.addr, *classes])
        for peer, secure in classes.items():
            view.add_link(self.core.addr, peer, weight=1.0, classes=_SECURE if secure else NORMAL_ONLY)
        self._router = ClassRouter(self.core.addr, view)
