"""The chordal ring when brokers are alive but unreachable, driven by the simulator (no
sockets): a broker cut off is found dead only past the guard and after its lease ran out;
a split ring takes nobody over and is one ring again when healed; a broker found dead
that speaks again is told so and goes inert; a crash (a refused connection: a proof) is
buried at once, two adjacent ones too."""

from __future__ import annotations

import random
from typing import Any

import pytest

from flowbus.experiments.ring_sim import RingSim, ring_errors
from flowbus.overlay.chordal_ring import GUARD, LEASE, RingNode
from flowbus.overlay.ring_messages import Dead
from flowbus.sim import Partition

HB = 5.0  # the heartbeat period of these rings


def ring(n: int, *, layers: Any = (), seed: int = 1) -> RingSim:
    r = RingSim(seed=seed, backup=2, heartbeat=HB, layers=layers)
    r.grow(n)
    for nd in r.live:
        r.call(nd.addr, lambda c, a=nd.addr: c.set_state(("sub", a), f"filter {a}"))
    r.settle(100.0)
    return r


def owners(r: RingSim) -> dict[object, list[int]]:
    out: dict[object, list[int]] = {}
    for nd in r.live:
        for key in nd.state:
            out.setdefault(key, []).append(nd.addr)
    return out


def serving(r: RingSim, nd: RingNode) -> bool:
    return nd.serving(r.sim.now)


def test_a_ring_at_rest_serves_everywhere() -> None:
    r = ring(5)
    assert all(serving(r, nd) for nd in r.live)
    assert ring_errors(r.live) == [] and not any(nd.dead for nd in r.live)


def test_a_broker_cut_off_stops_serving_before_anyone_takes_it_over() -> None:
    """Its lease runs out (LEASE heartbeats with no echo) before its neighbours' verdict,
    which needs GUARD heartbeats of silence at both of them."""
    cut = Partition()
    r = ring(5, layers=[cut])
    order = r.by_id()
    b = order[2]
    others = [nd.addr for nd in order if nd is not b]
    cut.split([[b.addr], others])
    start = r.sim.now
    stopped = taken = None
    while r.sim.now < start + 20 * HB:
        r.sim.run(until=r.sim.now + 0.5)
        if stopped is None and not serving(r, b):
            stopped = r.sim.now
        if taken is None and any(b.me.id in nd.dead for nd in order if nd is not b):
            taken = r.sim.now
    assert stopped is not None and taken is not None
    assert stopped <= start + (LEASE + 1) * HB
    assert taken >= start + GUARD * HB and stopped < taken
    live = [nd for nd in order if nd is not b]
    assert ring_errors(live) == [] and all(serving(r, nd) for nd in live)
    assert [a for a in owners(r)[("sub", b.addr)] if a != b.addr] in ([order[1].addr], [order[3].addr])


def test_a_broker_found_dead_that_speaks_again_is_told_and_goes_inert() -> None:
    cut = Partition()
    r = ring(5, layers=[cut])
    order = r.by_id()
    b = order[2]
    told: list[Any] = []
    r.sim.on_deliver = lambda node, sub, event, now: told.append((node, sub, event))
    cut.split([[b.addr], [nd.addr for nd in order if nd is not b]])
    r.settle(20 * HB)
    assert all(b.me.id in nd.dead for nd in (order[1], order[3]))
    cut.heal()
    r.settle(5 * HB)
    assert b.declared_dead is not None and isinstance(b.declared_dead, Dead)
    assert (b.addr, ("ring", "dead"), b.declared_dead) in told
    assert not serving(r, b)
    live = [nd for nd in order if nd is not b]
    assert ring_errors(live) == [] and all(b.me.id in nd.dead for nd in live if b.me.id in nd.dead)


def test_a_split_ring_takes_nobody_over_and_is_one_ring_again_when_healed() -> None:
    """2 + 3: each broker at the cut still hears its other neighbour; a test through the
    cut gets no answer and proves nothing, so nobody is buried, nothing taken over."""
    cut = Partition()
    r = ring(5, layers=[cut])
    order = r.by_id()
    cut.split([[order[0].addr, order[1].addr], [nd.addr for nd in order[2:]]])
    r.settle(30 * HB)
    assert not any(nd.dead for nd in order)
    assert all(serving(r, nd) for nd in order)  # (each has a neighbour on its own side)
    assert all(len(v) == 1 for v in owners(r).values())  # nothing taken over twice
    cut.heal()
    r.settle(10 * HB)
    assert ring_errors(order) == [] and not any(nd.suspects for nd in order)


def test_two_adjacent_brokers_cut_off_together_are_waited_for() -> None:
    """Their other neighbours cannot tell them from two brokers that still serve each
    other: no verdict, no takeover (a crash of both is a proof, and is buried)."""
    cut = Partition()
    r = ring(6, layers=[cut])
    order = r.by_id()
    pair = order[2:4]
    cut.split([[nd.addr for nd in pair], [nd.addr for nd in order if nd not in pair]])
    r.settle(30 * HB)
    assert not any(nd.dead for nd in order)
    assert all(serving(r, nd) for nd in pair)  # (they echo each other)
    cut.heal()
    r.settle(10 * HB)
    assert ring_errors(order) == []


def test_a_crash_is_a_proof_buried_without_waiting_for_the_guard() -> None:
    r = ring(5)
    order = r.by_id()
    b = order[2]
    start = r.sim.now
    r.crash([b])
    while not all(b.me.id in nd.dead for nd in (order[1], order[3])):
        r.sim.run(until=r.sim.now + 0.5)
        assert r.sim.now < start + 20 * HB
    assert r.sim.now < start + GUARD * HB + 2 * HB  # (a heartbeat or two, and the notice)
    r.settle(10 * HB)
    assert ring_errors(r.live) == []
    assert len(owners(r)[("sub", b.addr)]) == 1


def test_a_broker_restarted_on_its_address_again_and_again_joins_one_ring() -> None:
    """A kill -9 and a restart on the same address, twice, at times before and after the
    ring found it dead: the new process is a new member; the ring stays one ring."""
    r = ring(5, seed=3)
    order = r.by_id()
    b = order[1]
    for gap in (2.0, 8 * HB, 0.5):
        r.crash([b])
        r.sim.run(until=r.sim.now + gap)
        through = [nd.addr for nd in r.live if nd.joined and nd is not b][:3]
        b = r.restart(b, through)
        r.settle(15 * HB)
        live = [nd for nd in r.live if nd.joined]
        assert len(live) == 5 and ring_errors(live) == [], (gap, ring_errors(live))
        assert not any(nd.suspects for nd in live)


@pytest.mark.parametrize("seed", range(1, 13))
def test_a_ring_under_churn_stays_one_consistent_ring(seed: int) -> None:
    """Rounds of a crash and a restart on the same address (after 0.5, 3 or 30 time units),
    or a broker cut off then healed (found dead: it starts again as a new member): after
    each, every live broker's window and pointers are the true ring's (ring_errors)."""
    cut = Partition()
    r = ring(5, seed=seed, layers=[cut])
    rng = random.Random(seed)
    for _ in range(8):
        live = [nd for nd in r.live if nd.joined]
        victim = rng.choice(live)
        if rng.random() < 0.5:
            r.crash([victim])
            r.sim.run(until=r.sim.now + rng.choice([0.5, 3.0, 30.0]))
        else:
            cut.split([[victim.addr], [nd.addr for nd in live if nd is not victim]])
            r.sim.run(until=r.sim.now + 40)
            cut.heal()
            r.sim.run(until=r.sim.now + 10)
            if victim.declared_dead is None:
                continue
            r.crash([victim])  # (found dead: it steps down, and starts again)
        r.restart(victim, [nd.addr for nd in r.live if nd.joined and nd is not victim][:3])
        r.settle(20 * HB)
        live = [nd for nd in r.live if nd.joined]
        assert len(live) == 5 and ring_errors(live) == []


def test_a_broker_whose_two_neighbours_die_at_once_serves_on_with_new_ones_it_had_before() -> None:
    """Both ring neighbours of a broker crashed at once; the brokers beyond them had been its
    neighbours earlier (their last echo long past). It stopped serving the moment they were
    its neighbours again, until their next echo, its clients sent away meanwhile (a
    campaign run: 1,528 deliveries lost). A new neighbour's lease runs from when it became
    one."""
    r = RingSim(seed=1, backup=2, heartbeat=HB, notice=0.5)  # (a refused connection: told at once)
    r.grow(6)
    r.settle(100.0)
    order = r.by_id()
    b = order[2]
    for far in (order[0], order[4]):
        b.detector.echo(far.me.id, r.sim.now - 20 * HB)  # (neighbours once, long ago)
    r.sim.crash(order[1].addr)
    r.sim.crash(order[3].addr)
    start, served = r.sim.now, []
    while r.sim.now < start + 10 * HB:
        r.sim.run(until=r.sim.now + 0.25)
        served.append(serving(r, b))
    assert {b.left.addr, b.right.addr} == {order[0].addr, order[4].addr}  # type: ignore[union-attr]
    assert all(served)
