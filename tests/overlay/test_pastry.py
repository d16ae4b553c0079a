"""Pastry core: id helpers, next_hop cases, static tables at N=1000/10000, joins, failures."""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

from flowbus.core import Deliver, Effect, Send, SetTimer
from flowbus.errors import ProtocolError
from flowbus.overlay.pastry import (
    HEARTBEAT,
    ID_SPACE,
    Join,
    LeafSetRequest,
    PastryNode,
    PastryState,
    Ping,
    Pong,
    Route,
    RowRequest,
    circular_distance,
    digit,
    digits,
    node_id_from,
    numerically_closest,
    shared_prefix_len,
)
from flowbus.overlay.pastry_static import build_static


@dataclass
class Net:
    """A tiny message loop: Send effects are delivered instantly, in FIFO order."""

    nodes: dict[int, PastryNode]
    dead: set[int] = field(default_factory=set)
    queue: deque[tuple[int, int, Any]] = field(default_factory=deque)
    delivered: list[tuple[int, Route]] = field(default_factory=list)
    sent: list[Any] = field(default_factory=list)
    silent: bool = False  # drop messages to dead nodes without telling the sender
    shuffle: random.Random | None = None  # deliver queued messages in random order

    def push(self, src: int, effects: Iterable[Effect]) -> None:
        for e in effects:
            if isinstance(e, Send):
                self.queue.append((src, e.dst, e.msg))
            elif isinstance(e, Deliver):
                assert isinstance(e.event, Route) and e.sub == e.event.key
                self.delivered.append((src, e.event))

    def run(self) -> None:
        while self.queue:
            if self.shuffle is not None:
                self.queue.rotate(-self.shuffle.randrange(len(self.queue)))
            src, dst, msg = self.queue.popleft()
            self.sent.append(msg)
            if dst in self.dead and self.silent:
                continue
            if dst in self.dead:
                self.push(src, self.nodes[src].on_send_failed(dst, msg, 0.0))
            else:
                self.push(dst, self.nodes[dst].on_message(src, msg, 0.0))

    def lookup(self, src: int, key: int) -> tuple[int, int]:
        """Route one message; (address where delivered, hops)."""
        self.delivered.clear()
        self.push(src, self.nodes[src].route(key, "x"))
        self.run()
        assert len(self.delivered) == 1
        addr, msg = self.delivered[0]
        return addr, msg.hops


def check_lookups(net: Net, live: list[PastryNode], rng: random.Random, count: int) -> list[int]:
    """Random lookups from random live nodes all reach the numerically closest live node."""
    sorted_ids = sorted(nd.node_id for nd in live)
    hops = []
    for _ in range(count):
        key = rng.getrandbits(128)
        src = live[rng.randrange(len(live))].address
        addr, h = net.lookup(src, key)
        assert net.nodes[addr].node_id == numerically_closest(sorted_ids, key)
        hops.append(h)
    return hops


def check_leaf_sets(live: list[PastryNode]) -> None:
    ring = sorted(nd.node_id for nd in live)
    n = len(ring)
    pos = {x: i for i, x in enumerate(ring)}
    for nd in live:
        st = nd.state
        k = min(st.half, n - 1)
        i = pos[nd.node_id]
        assert st.larger == [ring[(i + j) % n] for j in range(1, k + 1)]
        assert st.smaller == [ring[(i - j) % n] for j in range(1, k + 1)]


# ---------------------------------------------------------------------------------- helpers


def test_digits_and_digit() -> None:
    x = int("0123456789abcdef" * 2, 16)
    assert digits(x) == tuple(range(16)) * 2
    assert digit(x, 0) == 0 and digit(x, 31) == 15
    assert digits(0) == (0,) * 32
    with pytest.raises(ProtocolError):
        digits(ID_SPACE)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (0, 0, 32),
        (0, 1, 31),
        (0, 1 << 127, 0),
        (0xAB << 120, 0xAC << 120, 1),
        (0xAB << 120, (0xAB << 120) | (1 << 119), 2),
        (ID_SPACE - 1, ID_SPACE - 2, 31),
    ],
)
def test_shared_prefix_len(a: int, b: int, expected: int) -> None:
    assert shared_prefix_len(a, b) == expected == shared_prefix_len(b, a)


def test_circular_distance_wraps() -> None:
    assert circular_distance(5, 9) == 4
    assert circular_distance(1, ID_SPACE - 1) == 2
    assert circular_distance(0, ID_SPACE // 2) == ID_SPACE // 2


def test_node_id_from() -> None:
    a = node_id_from("10.0.0.1")
    assert a == node_id_from("10.0.0.1") != node_id_from("10.0.0.2")
    assert 0 <= a < ID_SPACE and node_id_from(7) == node_id_from("7") == node_id_from(b"7")
    r1, r2 = random.Random(3), random.Random(3)
    assert node_id_from(None, r1) == node_id_from(None, r2)
    with pytest.raises(ProtocolError):
        node_id_from(None)
    with pytest.raises(ProtocolError):
        node_id_from(1.5)  # type: ignore[arg-type]


def test_numerically_closest_wraps_and_ties() -> None:
    ids = [10, 20, ID_SPACE - 10]
    assert numerically_closest(ids, 14) == 10
    assert numerically_closest(ids, 15) == 10  # tie: smaller id
    assert numerically_closest(ids, 16) == 20
    assert numerically_closest(ids, ID_SPACE - 1) == ID_SPACE - 10
    assert numerically_closest(ids, 0) == 10


# ------------------------------------------------------------------------------- next_hop


def small_state() -> PastryState:
    st = PastryState(0x10 << 120, leaf_size=2)
    for n in (0x11 << 120, 0x0F << 120, 0x3 << 124, 0x8 << 124):
        st.add(n)
    return st


def test_next_hop_cases() -> None:
    st = small_state()
    assert st.larger == [0x11 << 120] and st.smaller == [0x0F << 120] and not st.wraps
    assert st.next_hop(0x10 << 120) is None
    assert st.next_hop((0x10 << 120) | 1) is None  # in leaf range, we are closest
    assert st.next_hop(0x10F << 116) == 0x11 << 120  # in leaf range, a leaf is closer
    assert st.next_hop((0x3 << 124) | 5) == 0x3 << 124  # R[0][3]
    assert st.next_hop(0x8F << 120) == 0x8 << 124  # R[0][8]
    assert st.next_hop(0x5 << 124) == 0x3 << 124  # rare case: closer, same prefix length
    st.remove(0x3 << 124)
    assert st.next_hop((0x3 << 124) | 5) == 0x11 << 120  # hole: the closest known node with prefix >= 0
    assert st.row(0) == [0x0F << 120, 0x8 << 124]


def test_next_hop_small_ring_knows_everyone() -> None:
    ids = [1 << 100, 1 << 120, 1 << 126, 3 << 125]
    st = PastryState(ids[0])
    for n in ids[1:]:
        st.add(n)
    assert st.wraps
    for key in (0, 1 << 119, 1 << 125, ID_SPACE - 1):
        want = numerically_closest(sorted(ids), key)
        assert st.next_hop(key) == (None if want == ids[0] else want)


def test_add_remove_leaf_set_order() -> None:
    st = PastryState(1000, leaf_size=4)
    for n in (1001, 1005, 1003, 990, 995, 999, 980):
        st.add(n)
    assert st.larger == [1001, 1003] and st.smaller == [999, 995]
    assert st.remove(1001) == (False, True, (31, 9))
    assert st.larger == [1003]
    assert st.remove(12345) == (False, False, None)


# ---------------------------------------------------------------------------- static tables


def static_net(n: int, seed: int) -> tuple[Net, list[PastryNode]]:
    rng = random.Random(seed)
    ids = [rng.getrandbits(128) for _ in range(n)]
    nodes = build_static(ids, rng)
    return Net({nd.address: nd for nd in nodes}), nodes


def test_static_1000_routes_to_closest_with_few_hops() -> None:
    net, nodes = static_net(1000, 1)
    check_leaf_sets(nodes)
    hops = check_lookups(net, nodes, random.Random(2), 3000)
    mean = sum(hops) / len(hops)
    assert 2.0 <= mean <= 3.0, mean
    assert max(hops) <= math.ceil(math.log(1000, 16)) + 1


def test_static_10000_routes_to_closest() -> None:
    net, nodes = static_net(10_000, 3)
    hops = check_lookups(net, nodes, random.Random(4), 2000)
    assert max(hops) <= math.ceil(math.log(10_000, 16)) + 1
    assert 2.5 <= sum(hops) / len(hops) <= 4.0


def test_static_tables_hold_valid_entries() -> None:
    _, nodes = static_net(500, 5)
    for nd in nodes[:50]:
        for r, row in enumerate(nd.state.rows):
            for c, e in enumerate(row):
                if e is not None:
                    assert shared_prefix_len(e, nd.node_id) == r and digit(e, r) == c


def test_static_with_proximity_fills_neighbours_and_routes() -> None:
    rng = random.Random(6)
    ids = [rng.getrandbits(128) for _ in range(300)]
    pos = {a: (rng.random(), rng.random()) for a in range(300)}

    def prox(a: int, b: int) -> float:
        return math.dist(pos[a], pos[b])

    nodes = build_static(ids, rng, proximity=prox)
    assert all(len(nd.state.neighbours) == 16 for nd in nodes)
    check_lookups(Net({nd.address: nd for nd in nodes}), nodes, random.Random(7), 300)


def test_static_tiny_networks() -> None:
    for n in (1, 2, 5, 17, 18):
        net, nodes = static_net(n, n)
        check_leaf_sets(nodes)
        check_lookups(net, nodes, random.Random(n), 50)


def test_build_static_rejects_duplicates() -> None:
    with pytest.raises(ProtocolError):
        build_static([1, 1], random.Random(0))
    with pytest.raises(ProtocolError):
        build_static([1, 2], random.Random(0), addresses=[5, 5])


# ------------------------------------------------------------------------------------- joins


def grow(net: Net, n: int, rng: random.Random) -> list[PastryNode]:
    """n nodes join one by one, each through a random node already in."""
    live: list[PastryNode] = []
    for addr in range(n):
        nd = PastryNode(addr, rng.getrandbits(128), rng=rng)
        net.nodes[addr] = nd
        boot = live[rng.randrange(len(live))].address if live else None
        net.push(addr, nd.join(boot))
        net.run()
        assert nd.ready
        live.append(nd)
    return live


def test_join_200_one_by_one() -> None:
    net = Net({})
    live = grow(net, 200, random.Random(8))
    check_leaf_sets(live)
    hops = check_lookups(net, live, random.Random(9), 1000)
    assert max(hops) <= 5
    assert all(len(nd.state.rows) >= 2 for nd in live)


def test_join_with_messages_out_of_order() -> None:
    net = Net({}, shuffle=random.Random(17))
    live = grow(net, 100, random.Random(18))
    check_leaf_sets(live)
    check_lookups(net, live, random.Random(19), 300)


# ---------------------------------------------------------------------------------- failures


def kill(net: Net, nodes: list[PastryNode], victims: list[PastryNode]) -> list[PastryNode]:
    """Kill ``victims``; a stand-in for heartbeats: every live node holding a dead leaf is told
    (node_failed) and repairs, in rounds, until no leaf set holds a dead node (a repair may
    learn a dead node second-hand from a stale routing-table row)."""
    dead_ids = {v.node_id for v in victims}
    net.dead.update(v.address for v in victims)
    live = [nd for nd in nodes if nd.node_id not in dead_ids]
    for _ in range(10):
        told = 0
        for nd in live:
            for v in victims:
                if v.node_id in nd.state.smaller or v.node_id in nd.state.larger:
                    net.push(nd.address, nd.node_failed(v.address))
                    told += 1
        net.run()
        if not told:
            return live
    raise AssertionError("leaf sets did not settle")


def test_failures_repair_leaf_sets_and_lookups_reach_closest_live() -> None:
    net, nodes = static_net(1000, 10)
    rng = random.Random(11)
    ring = sorted(nodes, key=lambda nd: nd.node_id)
    # groups of up to 7 adjacent nodes (fewer than l/2), 50 apart on the ring
    victims = [ring[i + j] for i in range(0, 1000, 50) for j in range(rng.randrange(1, 8))]
    live = kill(net, nodes, victims)
    check_leaf_sets(live)
    check_lookups(net, live, random.Random(12), 2000)  # dead table entries: lazy repair
    assert any(isinstance(m, LeafSetRequest) for m in net.sent)
    assert any(isinstance(m, RowRequest) for m in net.sent)


def test_random_failures_after_joins() -> None:
    rng = random.Random(13)
    net = Net({})
    live = grow(net, 150, rng)
    live = kill(net, live, rng.sample(live, 10))
    check_leaf_sets(live)
    check_lookups(net, live, random.Random(14), 500)


def test_heartbeats_detect_silent_failures() -> None:
    rng = random.Random(20)
    ids = [rng.getrandbits(128) for _ in range(300)]
    nodes = build_static(ids, rng, heartbeat=1.0)
    assert nodes[0].start() == [SetTimer(1.0, HEARTBEAT)]
    net = Net({nd.address: nd for nd in nodes}, silent=True)
    ring = sorted(nodes, key=lambda nd: nd.node_id)
    victims = ring[10:15] + ring[100:101] + ring[200:207]
    net.dead.update(v.address for v in victims)
    live = [nd for nd in nodes if nd not in victims]
    for rnd in range(4):  # heartbeat rounds: ping, then declare the silent leaves dead
        for nd in live:
            effects = nd.on_timer(HEARTBEAT, float(rnd))
            assert effects[-1] == SetTimer(1.0, HEARTBEAT)
            net.push(nd.address, effects)
        net.run()
    check_leaf_sets(live)
    net.silent = False  # dead routing-table entries: the sender learns of the failed send
    check_lookups(net, live, random.Random(21), 500)


def test_send_failed_reroutes_route() -> None:
    net, nodes = static_net(300, 15)
    src = nodes[0]
    key = rng_key = random.Random(16).getrandbits(128)
    nxt = src.state.next_hop(rng_key)
    assert nxt is not None
    victim = next(nd for nd in nodes if nd.node_id == nxt)
    live = [nd for nd in nodes if nd is not victim]
    net.dead.add(victim.address)
    addr, _ = net.lookup(src.address, key)
    assert net.nodes[addr].node_id == numerically_closest(sorted(nd.node_id for nd in live), key)
    assert nxt not in src.state.known()


def test_false_suspicion_is_undone_by_a_message_from_the_node() -> None:
    _, nodes = static_net(50, 22)
    a = nodes[0]
    b = next(nd for nd in nodes if nd.node_id == a.state.larger[0])
    a.node_failed(b.address)
    assert b.node_id not in a.state.known()
    a.learn(b.node_id, b.address)  # second-hand news of a dead node is ignored
    assert b.node_id not in a.state.known()
    pong = Send(b.address, Pong(a.node_id, a.address))
    assert a.on_message(b.address, Ping(b.node_id, b.address), 0.0) == [pong]
    assert a.state.larger[0] == b.node_id


def test_own_join_to_dead_bootstrap_is_dropped() -> None:
    nd = PastryNode(1, 5, rng=random.Random(0))
    boot = PastryNode(0, 9, rng=random.Random(0), book=nd.book)
    (send,) = nd.join(boot.address)
    assert isinstance(send, Send) and isinstance(send.msg, Join)
    assert nd.on_send_failed(boot.address, send.msg, 0.0) == []
    assert not nd.ready


# ------------------------------------------------------------------------------------ errors


def test_unknown_message_and_timer_raise() -> None:
    nd = PastryNode(0, 1, rng=random.Random(0))
    with pytest.raises(ProtocolError):
        nd.on_message(1, "hello", 0.0)
    with pytest.raises(ProtocolError):
        nd.on_timer("nope", 0.0)
    with pytest.raises(ProtocolError):
        nd.on_timer(HEARTBEAT, 0.0)  # heartbeats are off
    with pytest.raises(ProtocolError):
        PastryNode(0, 1, rng=random.Random(0), heartbeat=0.0)
    with pytest.raises(ProtocolError):
        Route(ID_SPACE, None, 0, 0)
    with pytest.raises(ProtocolError):
        PastryState(-1)
