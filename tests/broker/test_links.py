"""The rule of secure spaces without sockets: which spaces are secure (the config's patterns, a
deployed flow's ``class: secure``), the class router's hop over the broker's links, a publish
refused by name when its route has a plain link (the first hop, or a later one known from the
ring's announcements), events of secure spaces dropped (and counted) on plain links either
way and refused upstream, and the announcements of a broker's own links."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from flowbus.broker.config import BrokerConfig
from flowbus.broker.links import SecureLinks
from flowbus.core import Deliver, Effect, Send
from flowbus.errors import FlowError
from flowbus.filters import Filter, parse
from flowbus.flow.deploy import Deployment
from flowbus.meta import EVENT_ID
from flowbus.routing import cbr
from flowbus.routing.link_classes import LinkBook, LinkClasses, Refused
from flowbus.routing.ring_broker import HandedOver

FLOW = """
name: guarded
spaces:
  trades: {kind: source, schema: {price: float}}
  big: {kind: events, schema: {price: float}, subscribe: true, class: secure}
arcs:
  - {name: S1, from: trades, to: big, select: "price > 100"}
"""

ME, SAFE, PLAIN, FAR = 10, 11, 12, 13


class _Router:
    def __init__(self) -> None:
        self.to: list[int] = []
        self.received: dict[int, dict[tuple[int, Hashable], Filter]] = {}

    def received_from(self, neighbour: int) -> dict[tuple[int, Hashable], Filter]:
        return dict(self.received.get(neighbour, {}))

    def route_batch(self, events: Sequence[Mapping[str, Any]], src: int) -> list[Effect]:
        return [Deliver("local", events[0]), *(Send(d, cbr.Publish(events[0])) for d in self.to)]


def _links(flows: dict[str, Deployment] | None = None) -> tuple[SecureLinks, Any]:
    core = SimpleNamespace(
        addr=ME,
        router=_Router(),
        flows=SimpleNamespace(deployments=flows or {}),
        peer_addrs=lambda: [SAFE, PLAIN],
        link_book=LinkBook(),
    )
    config = BrokerConfig.from_mapping({"classes": {"vault*": "secure", "open": "normal"}})
    return SecureLinks(core, config, lambda peer: peer == SAFE), core  # type: ignore[arg-type]


def test_secure_spaces_are_the_configs_patterns_and_the_flows_declared_ones() -> None:
    links, core = _links()
    assert links.any_secure
    assert [links.is_secure_space(s) for s in ("vault", "vault-2", "open", "big")] == [
        True,
        True,
        False,
        False,
    ]
    core.flows.deployments["guarded"] = Deployment.from_text(FLOW)
    assert links.any_secure and links.is_secure_space("big") and not links.is_secure_space("trades")
    with pytest.raises(FlowError, match="class is normal or secure"):
        Deployment.from_text(FLOW.replace("class: secure", "class: top"))


def test_a_publish_is_refused_by_name_when_its_route_has_no_secure_hop() -> None:
    links, core = _links()
    assert links.hop(SAFE) and not links.hop(PLAIN) and not links.hop(99)
    core.router.to = [SAFE]
    assert links.refusal("vault", {"__space": "vault"}) is None
    core.router.to = [SAFE, PLAIN]
    why = links.refusal("vault", {"__space": "vault"})
    assert why is not None and "'vault' is secure" in why and "broker 0.0.0.0:12 on its route" in why
    assert links.refusal("open", {"__space": "open"}) is None  # (not secure: any link)


def test_secure_events_never_take_a_plain_link_either_way() -> None:
    links, _ = _links()
    secret, public = {"__space": "vault", "x": 1}, {"__space": "open", "x": 2}
    msgs = [cbr.Publish(secret), cbr.Publish(public), HandedOver(secret, 1), cbr.Unsubscribe((1, "a"), 1)]
    assert links.filter(SAFE, msgs, True, True) == msgs
    assert links.filter(PLAIN, msgs, False, True) == [msgs[1], msgs[3]]
    assert links.filter(PLAIN, msgs, False, False) == [msgs[1], msgs[3]]
    assert (links.dropped, links.violations) == (2, 2)


def _tell(core: Any, broker: int, version: int, *links: tuple[int, bool]) -> None:
    assert core.link_book.take(LinkClasses(broker, version, links))


def test_a_publish_is_refused_by_name_when_a_later_link_of_its_route_is_plain() -> None:
    """ME - SAFE is secure, SAFE - FAR plain: a subscription of FAR's came through SAFE."""
    links, core = _links()
    core.router.to = [SAFE]
    core.router.received[SAFE] = {(FAR, "s"): parse("x > 0")}
    _tell(core, ME, 1, (SAFE, True))
    _tell(core, SAFE, 1, (ME, True), (FAR, False))
    why = links.refusal("vault", {"__space": "vault", "x": 1})
    assert why is not None and "broker 0.0.0.0:13 on its route is unreachable over secure links" in why
    assert "the link 0.0.0.0:11 - 0.0.0.0:13 is plain" in why
    assert links.refusal("vault", {"__space": "vault", "x": 0}) is None  # (FAR does not want it)
    assert links.refusal("open", {"__space": "open", "x": 1}) is None
    _tell(core, FAR, 1, (SAFE, True))  # one end says secure, the other plain: plain
    assert links.refusal("vault", {"__space": "vault", "x": 1}) is not None
    assert not core.link_book.take(LinkClasses(SAFE, 1, ((ME, True), (FAR, True))))  # (not newer)
    assert links.refusal("vault", {"__space": "vault", "x": 1}) is not None
    _tell(core, SAFE, 2, (ME, True), (FAR, True))
    assert links.refusal("vault", {"__space": "vault", "x": 1}) is None
    core.router.received[SAFE] = {(14, "s"): parse("x > 0")}  # a broker nobody told of: let it go
    assert links.refusal("vault", {"__space": "vault", "x": 1}) is None


class _Core(SimpleNamespace):
    """What the link rule calls on the ring broker when it refuses or announces."""

    def refuse(self, dst: int, items: Sequence[tuple[Any, str]]) -> list[Effect]:
        self.refused.append((dst, list(items)))
        return []

    def announce_links(self, version: int, links: tuple[tuple[int, bool], ...]) -> list[Effect]:
        self.told.append(links)
        return []


def test_a_secure_event_not_sent_or_not_taken_is_refused_upstream_and_links_are_announced() -> None:
    async def main() -> None:
        applied: list[Sequence[Effect]] = []
        core = _Core(
            addr=ME,
            router=_Router(),
            flows=SimpleNamespace(deployments={}),
            peer_addrs=lambda: [SAFE, PLAIN],
            tree_neighbours=lambda: {SAFE, PLAIN},
            joined=True,
            refused=[],
            told=[],
        )
        config = BrokerConfig.from_mapping({"classes": {"vault": "secure"}})
        opened = {SAFE}
        links = SecureLinks(
            core,  # type: ignore[arg-type]
            config,
            lambda peer: peer == SAFE,
            known=lambda peer: peer in opened,
            apply=applied.append,
        )
        secret = {"__space": "vault", EVENT_ID: ("c", 1)}
        assert links.filter(PLAIN, [cbr.Publish(secret)], False, True) == []
        assert links.filter(PLAIN, [cbr.Publish(secret)], False, False) == []
        links.after_step()
        links.after_step()  # (nothing changed: told once)
        opened.add(PLAIN)
        links.after_step()
        await asyncio.sleep(0)
        ((dst, items),) = core.refused
        assert dst == PLAIN and items[0][0] == ("c", 1)
        assert "the link from broker 0.0.0.0:10 to broker 0.0.0.0:12 is plain" in items[0][1]
        back = [e for effects in applied for e in effects]
        assert back[0] == Send(PLAIN, Refused(((("c", 1), back[0].msg.items[0][1]),)))
        assert "came to broker 0.0.0.0:10 from 0.0.0.0:12 over a plain link" in back[0].msg.items[0][1]
        assert core.told == [((SAFE, True),), ((SAFE, True), (PLAIN, False))]

    asyncio.run(main())
