"""IRBR joins, in the simulator: a newcomer's filter table holds every entry its ranges
need, also the ones covering cut short on their way (a newcomer just past a digit boundary
of its id), and only entries whose removal it will hear of; exactly once for every
subscriber after joins interleaved with subscribes and unsubscribes, with covering on (a
property over random networks, orders and newcomer ids)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from flowbus.filters import Filter, parse
from flowbus.overlay.pastry import BITS, B, PastryNode, shared_prefix_len
from flowbus.overlay.pastry_static import build_static
from flowbus.routing.irbr import IrbrNode
from flowbus.sim import ConstantLatency, Simulator

from .test_irbr import hex_id


@dataclass
class Net:
    """IRBR nodes in a simulator: a static network, then joins one at a time."""

    sim: Simulator
    cores: dict[int, IrbrNode]
    rng: random.Random
    got: list[tuple[int, Hashable]] = field(default_factory=list)

    def subscribe(self, addr: int, filt: Filter, sub: Hashable) -> None:
        self.sim.invoke(addr, lambda core: core.subscribe(filt, sub))
        self.sim.run()

    def unsubscribe(self, addr: int, sub: Hashable) -> None:
        self.sim.invoke(addr, lambda core: core.unsubscribe(sub))
        self.sim.run()

    def join(self, node_id: int, bootstrap: int) -> int:
        addr = len(self.cores)
        core = IrbrNode(PastryNode(addr, node_id, rng=random.Random(self.rng.random())))
        self.cores[addr] = core
        self.sim.add_node(addr, core)
        self.sim.invoke(addr, lambda c: c.join(bootstrap))
        self.sim.run()
        assert core.pastry.ready
        return addr

    def publish(self, addr: int, event: Mapping[str, Any]) -> Counter[tuple[int, Hashable]]:
        self.got.clear()
        self.sim.invoke(addr, lambda core: core.publish(event))
        self.sim.run()
        return Counter(self.got)

    def check_exact_tables(self) -> None:
        """Each node holds an entry only if it is in a row its subscriber sent the
        subscription to: it will hear of its removal (so it may rely on it for covering)."""
        by_id = {c.node_id: c for c in self.cores.values()}
        for core in self.cores.values():
            for e in core.table:
                level = shared_prefix_len(core.node_id, e.node)
                assert by_id[e.node].rows_from[e.sub] <= level, (f"{core.node_id:x}", e)


def make_net(ids: list[int], seed: int) -> Net:
    rng = random.Random(seed)
    cores = {p.address: IrbrNode(p) for p in build_static(ids, rng)}
    net = Net(Simulator(seed=seed, transport=[ConstantLatency(1.0)]), cores, rng)
    net.sim.on_deliver = lambda node, sub, event, now: net.got.append((node, sub))
    for addr, core in cores.items():
        net.sim.add_node(addr, core)
    return net


def test_a_newcomer_past_a_digit_boundary_gets_the_entries_covering_cut_short() -> None:
    heads = ["0fff", "13", "12", "5", "8", "a", "c"]
    net = make_net([hex_id(h) for h in heads], seed=1)
    t, s = heads.index("13"), heads.index("12")
    net.subscribe(t, parse("x >= 0"), "t")
    net.subscribe(s, parse("x >= 50"), "s")  # covered by t's, which shares a digit: rows >= 1 only
    assert net.cores[heads.index("0fff")].table.get(hex_id("12"), "s") is None  # never heard of it
    new = net.join(hex_id("1") + 1, bootstrap=heads.index("a"))  # "0fff" is its closest leaf
    assert net.publish(new, {"x": 60}) == Counter({(t, "t"): 1, (s, "s"): 1})
    assert net.publish(new, {"x": 10}) == Counter({(t, "t"): 1})
    entry = net.cores[new].table.get(hex_id("12"), "s")
    assert entry is not None and entry.prefix == (2, 0x12)
    net.check_exact_tables()


def test_a_newcomer_holds_no_entry_it_would_not_hear_the_removal_of() -> None:
    """s's subscription, covered by t's two digits deep, never went to the row of s where
    the newcomer "1a" sits: holding it there (as a copy of a whole table would) makes the
    newcomer keep relying on it after s left, and its own subscription then misses the
    events published beyond its cover's reach."""
    heads = ["120", "121", "5", "8", "c"]
    net = make_net([hex_id(h) for h in heads], seed=2)
    t, s = heads.index("120"), heads.index("121")
    net.subscribe(t, parse("x >= 0"), "t")
    net.subscribe(s, parse("x >= 50"), "s")  # covered by t's, two digits deep: rows >= 2
    new = net.join(hex_id("1a"), bootstrap=heads.index("8"))
    assert net.cores[new].table.get(hex_id("121"), "s") is None
    net.check_exact_tables()
    net.subscribe(heads.index("8"), parse("y = 1"), "u")  # the newcomer's clock passes s's
    net.subscribe(new, parse("x >= 60"), "n")  # covered by t's (and s's), one digit deep: rows >= 1
    net.unsubscribe(s, "s")
    net.unsubscribe(t, "t")  # "n" must now reach row 0 ("5", "8", "c") too
    assert net.publish(heads.index("5"), {"x": 70}) == Counter({(new, "n"): 1})


def random_filter(rng: random.Random) -> Filter:
    """Ranges over one attribute: many cover one another."""
    lo = rng.randrange(0, 100, 10)
    if rng.random() < 0.5:
        return parse(f"x >= {lo}")
    return parse(f"x >= {lo} & x < {lo + rng.randrange(10, 50, 10)}")


def newcomer_id(net: Net, rng: random.Random, near_boundary: bool) -> int:
    """A fresh id: random, or within a few ids of a digit boundary of an existing node's id
    (where the numerically closest leaf shares fewer digits than the nodes beyond it)."""
    taken = {c.node_id for c in net.cores.values()}
    while True:
        if near_boundary:
            level = rng.randrange(1, 4)
            shift = BITS - B * level
            head = rng.choice(sorted(taken)) >> shift
            new = (((head + rng.choice((0, 1))) << shift) + rng.randrange(-2, 3)) % (1 << BITS)
        else:
            new = rng.getrandbits(BITS)
        if new not in taken:
            return new


@settings(max_examples=100, deadline=None)
@given(
    nodes=st.integers(4, 40),
    ops=st.lists(st.sampled_from(("subscribe", "join", "unsubscribe")), min_size=1, max_size=40),
    near_boundary=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_exactly_once_for_every_subscriber_after_joins_among_subscribes_and_unsubscribes(
    nodes: int, ops: list[str], near_boundary: bool, seed: int
) -> None:
    """Covering on (the default); each operation runs to its end before the next."""
    rng = random.Random(seed)
    net = make_net([rng.getrandbits(BITS) for _ in range(nodes)], seed)
    subs: dict[tuple[int, Hashable], Filter] = {}
    for i, op in enumerate(ops):
        if op == "join":
            net.join(newcomer_id(net, rng, near_boundary), bootstrap=rng.randrange(len(net.cores)))
        elif op == "unsubscribe" and subs:
            key = rng.choice(sorted(subs, key=repr))
            net.unsubscribe(*key)
            del subs[key]
        else:
            addr, f = rng.randrange(len(net.cores)), random_filter(rng)
            net.subscribe(addr, f, i)
            subs[(addr, i)] = f
    newcomers = list(range(nodes, len(net.cores)))
    for publisher in newcomers + [rng.randrange(len(net.cores)) for _ in range(10)]:
        event = {"x": rng.randrange(0, 110)}
        got = net.publish(publisher, event)
        assert set(got) == {key for key, f in subs.items() if f.matches(event)}, (publisher, event)
        assert set(got.values()) <= {1}
    net.check_exact_tables()
