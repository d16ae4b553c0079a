"""IRBR's hop-by-hop acknowledgements, without any failure notice from the simulator: a send
not acknowledged in time goes to another live node of its range, a copy that a slow peer
makes is handled once, a range with no live node left is given up, and the broker's core
acknowledges the same way."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from flowbus.core import CancelTimer, Send, SetTimer
from flowbus.errors import ProtocolError
from flowbus.filters import parse
from flowbus.overlay.pastry import BITS, PastryNode
from flowbus.overlay.pastry_static import build_static
from flowbus.routing.irbr import ROOT, IrbrNode, Publish, prefix_of
from flowbus.routing.irbr_ack import ACK_TIMER, Ack, Hop, HopAcks, Seen
from flowbus.routing.irbr_broker import IrbrBroker
from flowbus.sim import ConstantLatency, Simulator
from flowbus.sim.transport import Host


@dataclass(frozen=True, slots=True)
class SlowTo:
    """Messages sent to ``node`` from time ``start`` to ``end`` take ``extra`` more time units:
    a live peer that pauses for longer than the timeout."""

    node: int
    extra: float
    start: float
    end: float

    def bind(self, host: Host) -> Any:
        def decide(src: int, dst: int, msg: Any, now: float) -> float:
            return self.extra if dst == self.node and self.start <= now < self.end else 0.0

        return decide


@dataclass
class World:
    """IRBR nodes with acknowledgements (timeout 3, latency 1) and no failure notice."""

    sim: Simulator
    cores: dict[int, IrbrNode]
    got: list[tuple[int, Hashable]] = field(default_factory=list)

    def subscribe(self, addr: int, sub: Hashable) -> None:
        self.sim.invoke(addr, lambda core: core.subscribe(parse("x > 1"), sub))
        self.sim.run()

    def publish(self, addr: int, event: Mapping[str, Any]) -> Counter[tuple[int, Hashable]]:
        self.got.clear()
        self.sim.invoke(addr, lambda core: core.publish(event))
        self.sim.run()
        return Counter(self.got)

    def range_of_first_child(self, pub: int) -> tuple[int, list[int]]:
        """The address of ``pub``'s first routing-table entry and the nodes of its range."""
        me = self.cores[pub]
        child = next(c for c in me.state.rows[0] if c is not None)
        prefix = prefix_of(me.node_id, child)
        members = [a for a, c in self.cores.items() if prefix_of(me.node_id, c.node_id) == prefix]
        return me.pastry.book.addr_of[child], members


def make_world(n: int, seed: int, *, slow: SlowTo | None = None) -> World:
    rng = random.Random(seed)
    ids = [rng.getrandbits(BITS) for _ in range(n)]
    cores = {p.address: IrbrNode(p, ack_timeout=3.0) for p in build_static(ids, rng)}
    layers: list[Any] = [ConstantLatency(1.0)] + ([slow] if slow is not None else [])
    world = World(Simulator(seed=seed, transport=layers), cores)
    world.sim.on_deliver = lambda node, sub, event, now: world.got.append((node, sub))
    for addr, core in cores.items():
        world.sim.add_node(addr, core)
    return world


def test_a_lost_message_is_resent_to_another_live_node_of_the_range() -> None:
    world = make_world(200, 7)
    dead, members = world.range_of_first_child(3)
    assert len(members) >= 3
    for i, addr in enumerate(members):
        world.subscribe(addr, i)
    world.sim.crash(dead)
    got = world.publish(3, {"x": 5})
    assert got == Counter({(a, i): 1 for i, a in enumerate(members) if a != dead})
    assert world.sim.metrics.failure_notices == 0  # no oracle: the timeout found it
    pub = world.cores[3]
    assert pub.acks is not None and pub.acks.expired >= 1 and len(pub.acks) == 0
    assert world.cores[3].pastry.book.id_of[dead] not in set(pub.state.table_entries())
    assert all(c.acks is not None and len(c.acks) == 0 for c in world.cores.values())


def test_a_slow_peer_taken_for_dead_makes_no_duplicate() -> None:
    probe = make_world(200, 7)
    slow, members = probe.range_of_first_child(3)
    world = make_world(200, 7, slow=SlowTo(slow, 10.0, 1000.0, 1002.0))  # acks come after the timeout
    for i, addr in enumerate(members):
        world.subscribe(addr, i)
    world.sim.run(until=1000.0)
    sent = world.sim.metrics.sent_by_type().get("Ack", 0)
    dropped = world.cores[slow].seen.dropped
    got = world.publish(3, {"x": 5})
    assert got == Counter({(a, i): 1 for i, a in enumerate(members)})  # the slow one too, once
    assert world.cores[slow].seen.dropped == dropped + 1  # the late original, dropped
    assert world.cores[3].acks is not None and world.cores[3].acks.expired >= 1
    assert world.sim.metrics.sent_by_type()["Ack"] > sent
    assert world.sim.metrics.duplicates == 0


def test_a_timeout_with_no_live_node_of_the_range_gives_up() -> None:
    world = make_world(120, 6)
    _, members = world.range_of_first_child(0)
    world.subscribe(members[0], "s")
    for addr in members:
        world.sim.crash(addr)
    assert world.publish(0, {"x": 5}) == Counter()
    assert sum(c.empty_ranges for c in world.cores.values()) == 1  # one search, given up once
    live = [c for a, c in world.cores.items() if a not in members]
    assert all(c.acks is not None and len(c.acks) == 0 for c in live)  # nothing left waiting
    assert world.sim.pending == 0


def test_hop_acks_settle_each_send_once() -> None:
    acks = HopAcks(2.0)
    out = acks.send(7, "m")
    assert out == [Send(7, Hop(1, "m")), SetTimer(2.0, (*ACK_TIMER, 1))]
    assert acks.ack(1) == [CancelTimer((*ACK_TIMER, 1))] and acks.ack(1) == []
    acks.send(8, "n")
    assert acks.expire(2) == (8, "n") and acks.expire(2) is None
    assert acks.failed(2) is None  # the timer handled it: a late failure notice does nothing
    acks.send(9, "o")
    assert acks.failed(3) == [CancelTimer((*ACK_TIMER, 3))] and acks.expire(3) is None
    assert (acks.acked, acks.expired, len(acks)) == (1, 1, 0)
    with pytest.raises(ProtocolError, match="timeout must be > 0"):
        HopAcks(0)


def test_seen_handles_a_copy_only_for_the_rows_left_out() -> None:
    seen = Seen(window=2)
    assert seen.admit("e", 3) == (True, 32)
    assert seen.admit("e", 3) is None and seen.admit("e", 5) is None
    assert seen.admit("e", 1) == (False, 3)  # a larger range: rows 1 and 2 only
    assert seen.admit("f", 0) == (True, 32) and seen.admit("g", 0) == (True, 32)
    assert seen.admit("e", 4) == (True, 32)  # forgotten beyond the window
    assert seen.dropped == 2


def test_the_broker_core_acknowledges_and_waits_for_acknowledgements() -> None:
    broker = IrbrBroker(1, ack_timeout=0.5)
    broker.start()
    other = PastryNode(2, 5 << (BITS - 4), rng=random.Random(1))
    broker.node.pastry.learn(other.node_id, other.address)
    broker.subscribe("s", parse("x > 1"))
    out = broker.on_message(2, Hop(4, Publish({"x": 3}, ROOT, ("c", 1))), 0.0)
    assert out[0] == Send(2, Ack(4)) and [e.sub for e in out if hasattr(e, "sub")] == ["s"]
    broker.node.table.add(other.node_id, "t", parse("x > 1"), 1)
    out = broker.publish_batch([(("c", 2), {"x": 3})])
    hops = [e for e in out if isinstance(e, Send) and isinstance(e.msg, Hop)]
    assert [h.dst for h in hops] == [2] and isinstance(hops[0].msg.body, Publish)
    seq = hops[0].msg.seq
    assert broker.on_message(2, Ack(seq), 0.1) == [CancelTimer((*ACK_TIMER, seq))]
    assert broker.on_message(2, Hop(4, Publish({"x": 3}, ROOT, ("c", 1))), 0.2) == [Send(2, Ack(4))]
