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
* **Ring-wide.** After each step, if the classes of its tree links changed, a broker
  announces them to the whole tree (:meth:`SecureLinks.after_step`, the core's
  ``announce_links``, :mod:`flowbus.routing.link_classes`): only links whose connection is
  open (their class known), stamped with the wall clock so a restarted broker's news wins.
  Every broker so holds the tree's links and their classes (``core.link_book``), and builds
  a second view from them, the *ring view* (:class:`RingView`), with its own class router.
* **Before a publish** (:meth:`SecureLinks.refusal`, the ledger's ``admit``): an event of a
  secure space is routed on paper first (the content router's ``route_batch``, which
  changes nothing). If a broker it would be sent to has no secure hop from here, or if a
  broker it must reach (the home of a matching subscription, known from the filters that
  came from that direction) has a path in the ring view but no secure one, the publish is
  refused by name (the space, the broker, the plain link), never sent in clear.
* **On every link** (:meth:`SecureLinks.filter`, the runtime's ``link_filter``): an event of
  a secure space about to leave over a link that is not secure is dropped and counted in
  ``dropped``, and released in the core as refused (:meth:`RingBroker.refuse`): the refusal
  travels back hop by hop, and the publisher's ledger answers the client ``Nack`` with the
  reason. One arriving over such a link is dropped, counted in ``violations`` (its sender
  did not keep the rule) and answered ``Refused``. So a stale view (a link turned plain, a
  subscription hidden by a covering one, an announcement not in yet) never hangs a publish.

The check before a publish sees the homes of the subscriptions that reached this broker: one
covered by another on the way (covering-based routing) is not seen, and its publish is then
refused on the way, by the broker before the plain link. A new tree neighbour is sent every
event until it is synced: a secure event refused on its plain link during that moment is
refused even if nobody beyond wanted it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import yaml

from flowbus.broker.config import BrokerConfig
from flowbus.broker.overlays import address_text
from flowbus.core import Effect, Send
from flowbus.flow.spec import space_classes
from flowbus.meta import EVENT_ID, SPACE
from flowbus.overlay.class_router import ClassRouter
from flowbus.overlay.multigraph import NORMAL_ONLY, LinkClass, Multigraph
from flowbus.routing import cbr
from flowbus.routing.link_classes import Refused
from flowbus.routing.memo import compiled
from flowbus.routing.ring_broker import HandedOver, RingBroker

__all__ = ["RingView", "SecureLinks"]

log = logging.getLogger("flowbus.broker")

_SECURE = frozenset({LinkClass.NORMAL, LinkClass.SECURE})


class SecureLinks:
    """The link classes of one broker and the rule of secure spaces (see the module note)."""

    def __init__(
        self,
        core: RingBroker,
        config: BrokerConfig,
        secure: Callable[[int], bool],
        *,
        known: Callable[[int], bool] = lambda peer: True,
        apply: Callable[[Sequence[Effect]], None] | None = None,
    ) -> None:
        self.core = core
        self.config = config
        self.secure = secure  # peer -> whether our connection to it is mutual TLS
        self.known = known  # peer -> whether a connection to it was opened (its class is known)
        self.apply = apply  # carries out effects (the runtime's); None: no announcements, refusals
        self.dropped = 0  # secure events not sent over a plain link
        self.violations = 0  # secure events that arrived over a plain link
        self._classes: dict[int, bool] = {}
        self._router = ClassRouter(core.addr, Multigraph([core.addr]))
        self._spaces: dict[str, bool] = {}  # space -> secure (cached while the flows are the same)
        self._flows: tuple[str, ...] = ()  # versions of the deployed flows the cache is for
        self._flow_secure: set[str] = set()  # spaces the deployed flows declare secure
        self._announced: tuple[tuple[int, bool], ...] | None = None  # our tree links, as last told
        self._version = 0  # of our last announcement
        self.ring = RingView(core)

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
            if not isinstance(effect, Send):
                continue
            if not self.hop(effect.dst):
                return (
                    f"space {space!r} is secure and broker {address_text(effect.dst)} on its route "
                    "has no secure (mutual TLS) link from here: refused, not sent in clear"
                )
            for home, plain in self._plain_homes(effect.dst, fields):
                return (
                    f"space {space!r} is secure and broker {address_text(home)} on its route is "
                    f"unreachable over secure links: the link {address_text(plain[0])} - "
                    f"{address_text(plain[1])} is plain (no mutual TLS): refused, not sent in clear"
                )
        return None

    def _plain_homes(
        self, direction: int, fields: Mapping[str, Any]
    ) -> Iterator[tuple[int, tuple[int, int]]]:
        """The brokers beyond ``direction`` whose subscriptions (as seen from here) want
        ``fields`` and that have no secure path from here, each with the plain link on the
        way (a filter is tested only when its broker has no secure path)."""
        plain_link, me = self.ring.plain_links(), self.core.addr
        for (home, _), filt in self.core.router.received_from(direction).items():
            plain = plain_link(home) if home != me else None
            if plain is not None and compiled(filt)(fields):
                yield home, plain

    def after_step(self) -> None:
        """Announce our tree links to the tree if their classes changed (the broker's
        ``after_step``; only while some space may be secure)."""
        core = self.core
        if self.apply is None or not core.joined or not self.any_secure:
            return
        links = tuple((n, self.secure(n)) for n in sorted(core.tree_neighbours()) if self.known(n))
        if links == self._announced:
            return
        self._announced = links
        self._version = max(self._version + 1, time.time_ns())
        version, apply = self._version, self.apply
        asyncio.get_running_loop().call_soon(lambda: apply(core.announce_links(version, links)))

    def filter(self, peer: int, msgs: list[Any], secure: bool, outgoing: bool) -> list[Any]:
        """The runtime's ``link_filter``: drop secure events on a link that is not secure."""
        if secure or not self.any_secure:
            return msgs
        kept, refused = [], []
        for msg in msgs:
            event = msg.event if type(msg) is cbr.Publish or type(msg) is HandedOver else None
            if event is not None and self.is_secure_space(event.get(SPACE)):
                self._count(peer, event.get(SPACE), outgoing=outgoing)
                if EVENT_ID in event:
                    refused.append((event[EVENT_ID], self._why(peer, event.get(SPACE), outgoing=outgoing)))
                continue
            kept.append(msg)
        if refused and self.apply is not None:
            self._refuse_soon(peer, refused, outgoing=outgoing)
        return kept

    def _why(self, peer: int, space: Any, *, outgoing: bool) -> str:
        me, there = address_text(self.core.addr), address_text(peer)
        if outgoing:
            link = f"the link from broker {me} to broker {there} is plain"
        else:
            link = f"it came to broker {me} from {there} over a plain link"
        return f"space {space!r} is secure and {link} (no mutual TLS): refused, not sent in clear"

    def _refuse_soon(self, peer: int, refused: list[tuple[Any, str]], *, outgoing: bool) -> None:
        """In a step of its own: the core releases what we did not send (refused upstream),
        or the sender of what we did not take is answered ``Refused``."""
        apply, core = self.apply, self.core
        assert apply is not None
        if outgoing:
            step: Callable[[], None] = lambda: apply(core.refuse(peer, refused))  # noqa: E731
        else:
            step = lambda: apply([Send(peer, Refused(tuple(refused)))])  # noqa: E731
        asyncio.get_running_loop().call_soon(step)

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


class RingView:
    """The tree's links as every broker announced them, and a class router over them (the
    ring view of the module note)."""

    def __init__(self, core: RingBroker) -> None:
        self.core = core
        self._seen: tuple[tuple[int, int], ...] = ()  # (broker, version) the view is of
        self._ring = ClassRouter(core.addr, Multigraph([core.addr]))
        self._plain: dict[int, tuple[int, int] | None] = {}  # home -> plain_link, for this view

    def plain_links(self) -> Callable[[int], tuple[int, int] | None]:
        """For the view as it is now: broker -> the first plain link on the view's path to it
        if it has no secure one (None: a secure path, or none known at all: the brokers on
        the way then decide); each broker's answer remembered until the view changes."""
        router, known = self._router(), self._plain

        def plain_link(home: int) -> tuple[int, int] | None:
            if home not in known:
                known[home] = self._find(router, home)
            return known[home]

        return plain_link

    def _find(self, router: ClassRouter, home: int) -> tuple[int, int] | None:
        if home not in router.view or router.send(home, None, LinkClass.SECURE, 0.0):
            return None
        path = router.view.path(self.core.addr, home)
        if path is None:
            return None
        for a, b, key in zip(path.brokers, path.brokers[1:], path.links, strict=False):
            if LinkClass.SECURE not in router.view.link(key).classes:
                return a, b
        return None

    def _router(self) -> ClassRouter:
        """The class router over the tree links every broker announced (a link is secure if
        each end that told says so), built again when an announcement changed."""
        known = self.core.link_book.known
        seen = tuple((b, msg.version) for b, msg in known.items())
        if seen != self._seen:
            edges: dict[tuple[int, int], bool] = {}
            for msg in known.values():
                for peer, secure in msg.links:
                    edge = (min(msg.broker, peer), max(msg.broker, peer))
                    edges[edge] = edges.get(edge, True) and secure
            view = Multigraph({self.core.addr, *(b for edge in edges for b in edge)})
            for (a, b), secure in sorted(edges.items()):
                view.add_link(a, b, weight=1.0, classes=_SECURE if secure else NORMAL_ONLY)
            self._ring, self._seen, self._plain = ClassRouter(self.core.addr, view), seen, {}
        return self._ring
