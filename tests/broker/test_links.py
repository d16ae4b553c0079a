"""The rule of secure spaces without sockets: which spaces are secure (the config's patterns, a
deployed flow's ``class: secure``), the class router's hop over the broker's links, a publish
refused by name when its route has a plain link, and events of secure spaces dropped (and
counted) on plain links either way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from flowbus.broker.config import BrokerConfig
from flowbus.broker.links import SecureLinks
from flowbus.core import Deliver, Effect, Send
from flowbus.errors import FlowError
from flowbus.flow.deploy import Deployment
from flowbus.routing import cbr
from flowbus.routing.ring_broker import HandedOver

FLOW = """
name: guarded
spaces:
  trades: {kind: source, schema: {price: float}}
  big: {kind: events, schema: {price: float}, subscribe: true, class: secure}
arcs:
  - {name: S1, from: trades, to: big, select: "price > 100"}
"""

ME, SAFE, PLAIN = 10, 11, 12


class _Router:
    def __init__(self) -> None:
        self.to: list[int] = []

    def route_batch(self, events: Sequence[Mapping[str, Any]], src: int) -> list[Effect]:
        return [Deliver("local", events[0]), *(Send(d, cbr.Publish(events[0])) for d in self.to)]


def _links(flows: dict[str, Deployment] | None = None) -> tuple[SecureLinks, Any]:
    core = SimpleNamespace(
        addr=ME,
        router=_Router(),
        flows=SimpleNamespace(deployments=flows or {}),
        peer_addrs=lambda: [SAFE, PLAIN],
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
