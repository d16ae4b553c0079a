"""PastryApp: what it hands an application -- its messages (sent straight, or routed with their
``Route`` at every hop) in one ``on_app_message``, the end of Pastry's join in ``on_joined``,
its failed sends in ``on_app_send_failed`` (a routed one re-routed by default) -- and what it
keeps for Pastry."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest

from flowbus.core import Core, Effect, Send
from flowbus.errors import ProtocolError
from flowbus.overlay.pastry import HEARTBEAT, PastryNode, Ping, Route, numerically_closest
from flowbus.overlay.pastry_app import PastryApp
from flowbus.overlay.pastry_static import build_static
from flowbus.sim import ConstantLatency, Simulator


@dataclass(frozen=True, slots=True)
class Note:
    text: str


@dataclass(frozen=True, slots=True)
class Other:
    """A message neither the application nor Pastry knows."""


class Toy(PastryApp):
    """Logs what it is handed; a routed ``Note`` goes on to its end, where it is kept."""

    app_messages = frozenset({Note})

    __slots__ = ("ended", "failed", "joined", "seen")

    def __init__(self, pastry: PastryNode) -> None:
        super().__init__(pastry)
        self.seen: list[tuple[int, Any, Route | None]] = []
        self.ended: list[Route] = []
        self.failed: list[tuple[int, Any, Route | None]] = []
        self.joined = 0

    def on_app_message(self, src: int, msg: Any, now: float, route: Route | None) -> list[Effect]:
        match msg:
            case Note():
                self.seen.append((src, msg, route))
                if route is None:
                    return []
                out = self.forward(route)
                if not out:
                    self.ended.append(route)
                return out
            case _:
                raise ProtocolError(f"Toy {self.address}: unknown message {msg!r}")

    def on_joined(self, now: float) -> list[Effect]:
        self.joined += 1
        return []

    def on_app_send_failed(self, dst: int, msg: Any, now: float, route: Route | None) -> list[Effect]:
        self.failed.append((dst, msg, route))
        return super().on_app_send_failed(dst, msg, now, route)


def _static(n: int, seed: int = 3) -> tuple[Simulator, list[Toy]]:
    rng = random.Random(seed)
    apps = [Toy(p) for p in build_static([rng.getrandbits(128) for _ in range(n)], rng)]
    sim = Simulator(seed=seed, transport=[ConstantLatency(1.0)], failure_notice=2.0)
    for app in apps:
        sim.add_node(app.address, app)
    return sim, apps


def _end(apps: list[Toy], key: int, dead: frozenset[int] = frozenset()) -> Toy:
    """The node Pastry delivers ``key`` to: the numerically closest live one."""
    live = [a for a in apps if a.address not in dead]
    closest = numerically_closest(sorted(a.node_id for a in live), key)
    return next(a for a in live if a.node_id == closest)


def test_an_app_is_a_core_and_pastry_keeps_its_own_messages() -> None:
    _, apps = _static(2)
    assert Core in type(apps[0]).__mro__
    out = apps[0].on_message(apps[1].address, Ping(apps[1].node_id, apps[1].address), 0.0)
    assert [type(e.msg).__name__ for e in out if isinstance(e, Send)] == ["Pong"]
    assert apps[0].seen == []
    with pytest.raises(ProtocolError, match="unknown message"):
        apps[0].on_message(1, Other(), 0.0)  # Pastry's, then: unknown there
    with pytest.raises(ProtocolError, match=r"Toy .*unknown timer"):
        apps[0].on_timer("not-pastry's", 0.0)
    with pytest.raises(ProtocolError, match=r"Pastry node .*unknown timer"):
        apps[0].on_timer(HEARTBEAT, 0.0)  # Pastry's key, and its heartbeats are off


def test_a_direct_message_comes_without_a_route() -> None:
    sim, apps = _static(4)
    a, b = apps[0], apps[1]
    sim.invoke(a.address, lambda _: [Send(b.address, Note("hi"))])
    sim.run()
    assert b.seen == [(a.address, Note("hi"), None)]
    assert all(x.seen == [] for x in apps if x is not b)


def test_a_routed_message_comes_with_its_route_at_every_hop() -> None:
    sim, apps = _static(300)
    key = random.Random(5).getrandbits(128)
    start = apps[7]
    sim.invoke(start.address, lambda app: app.route(key, Note("on")))
    sim.run()
    hops = sorted((r.hops, app.address) for app in apps for _, _, r in app.seen if r is not None)
    assert [h for h, _ in hops] == list(range(len(hops)))  # once per hop, the first one here
    assert hops[0][1] == start.address and hops[-1][1] == _end(apps, key).address
    assert [app for app in apps if app.ended] == [_end(apps, key)]
    for app in apps:
        for _, msg, route in app.seen:
            assert msg == Note("on") and route is not None and route.key == key and route.payload == msg
            assert route.origin == start.address


def test_a_routed_message_whose_hop_died_is_routed_again_by_default() -> None:
    sim, apps = _static(300)
    key = random.Random(6).getrandbits(128)
    start = apps[11]
    first = start.next_hop(key)
    assert first is not None
    sim.crash(first)
    sim.invoke(start.address, lambda app: app.route(key, Note("around")))
    sim.run()
    assert [(dst, msg) for dst, msg, route in start.failed] == [(first, Note("around"))]
    assert start.failed[0][2] is not None  # the failed send's route came with it
    assert [app for app in apps if app.ended] == [_end(apps, key, frozenset({first}))]


def test_a_direct_message_to_a_dead_node_is_given_up() -> None:
    sim, apps = _static(4)
    a, b = apps[0], apps[1]
    sim.crash(b.address)
    sim.invoke(a.address, lambda _: [Send(b.address, Note("gone"))])
    sim.run()
    assert a.failed == [(b.address, Note("gone"), None)]
    assert sim.metrics.failure_notices == 1 and all(x.seen == [] for x in apps)


def test_on_joined_follows_the_end_of_pastrys_join_once() -> None:
    rng = random.Random(9)
    sim = Simulator(seed=9, transport=[ConstantLatency(1.0)])
    apps = [Toy(PastryNode(a, rng.getrandbits(128), rng=rng)) for a in range(12)]
    for app in apps:
        sim.add_node(app.address, app)
    sim.invoke(0, lambda app: app.pastry.join(None))
    sim.run()
    for app in apps[1:]:
        sim.invoke(app.address, lambda app: app.pastry.join(0))
        sim.run()
    assert apps[0].joined == 0  # the first node: ready at once, no join to finish
    assert [app.joined for app in apps[1:]] == [1] * 11
    assert all(app.pastry.ready for app in apps)
