"""The chordal reliability ring, driven by the simulator without sockets: ids and joins
(small rings included), chords, routing, the document's figure 5, node failures (single,
adjacent, one apart) with state takeover for backup factors 1..4, link failures on and off
the ring."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from flowbus.core import Send
from flowbus.errors import ProtocolError
from flowbus.experiments.ring_sim import RingSim, ring_errors
from flowbus.overlay.chordal_ring import ID_SPACE, SECOND_ID, RingNode, RingRoute
from flowbus.overlay.ring_messages import (
    Alive,
    Failed,
    Heartbeat,
    HeartbeatAck,
    Insert,
    JoinAccept,
    JoinRequest,
    Peer,
    Probe,
    Restarted,
    cw,
)
from flowbus.overlay.ring_messages import TestNeighbour as AskToTest  # (not a test class)
from flowbus.sim import LinkFailure


def ring(n: int, *, seed: int = 1, backup: int = 2, heartbeat: float | None = 5.0, **kw: Any) -> RingSim:
    r = RingSim(seed=seed, backup=backup, heartbeat=heartbeat, **kw)
    r.grow(n)
    for nd in r.live:  # every broker's state: one subscription of its own
        r.call(nd.addr, lambda c, a=nd.addr: c.set_state(("sub", a), f"filter {a}"))
    r.settle(100.0)
    return r


def owners(r: RingSim) -> dict[object, list[int]]:
    out: dict[object, list[int]] = {}
    for nd in r.live:
        for key in nd.state:
            out.setdefault(key, []).append(nd.addr)
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 9])
def test_small_rings_have_consistent_pointers(n: int) -> None:
    r = ring(n)
    assert ring_errors(r.live, chords=True) == []
    if n == 1:
        assert r.nodes[0].right is None and r.nodes[0].holders() == ()
    if n == 2:
        a, b = r.nodes
        assert a.right == a.left == a.rightright == b.me  # the pointers coincide
        assert a.holders() == (b.me,)


def test_ids_first_second_and_midway() -> None:
    r = RingSim(heartbeat=None).grow(3, chords=False)
    ids = sorted(nd.me.id for nd in r.nodes)
    assert ids[:2] == [0, SECOND_ID]
    third = next(nd.me.id for nd in r.nodes if nd.me.id not in (0, SECOND_ID))
    assert third == SECOND_ID + (ID_SPACE - SECOND_ID) // 2  # midway in the larger gap


def test_join_is_constant_cost_and_touches_few_brokers() -> None:
    r = RingSim(heartbeat=None, backup=2).grow(200, chords=False)
    assert ring_errors(r.live) == []
    later = r.joins[20:]
    assert max(j.touched for j in later) <= 4 + r.candidates  # the four neighbours and the pinged
    small, large = later[:30], later[-30:]
    mean = lambda js: sum(j.messages for j in js) / len(js)  # noqa: E731
    assert mean(large) < 1.3 * mean(small)  # flat in n


def test_chords_double_and_route_in_log_hops() -> None:
    r = RingSim(heartbeat=None).grow(128)
    assert ring_errors(r.live, chords=True) == []
    order = r.by_id()
    assert all(len(nd.chords) == int(math.log2(128)) - 2 for nd in order)
    rng = random.Random(3)
    hops = []
    got: list[tuple[int, RingRoute]] = []
    r.sim.on_deliver = lambda node, sub, event, now: got.append((node, event))
    for _ in range(200):
        a, b = rng.sample(order, 2)
        got.clear()
        r.call(a.addr, lambda c, t=b.me.id: c.route(t, "hello"))
        r.settle()
        ((node, route),) = got
        assert node == b.addr
        hops.append(route.hops)
    assert max(hops) <= math.ceil(math.log2(128)) + 1


def test_figure_5_three_brokers_node_failure() -> None:
    r = ring(3, backup=2)
    a, b, c = r.by_id()
    r.crash([b])
    r.settle(100.0)
    assert ring_errors(r.live) == []
    assert a.right == c.me and c.left == a.me
    assert owners(r)[("sub", b.addr)] in ([a.addr], [c.addr])  # taken over once
    assert b.me.id in a.dead and b.me.id in c.dead


@pytest.mark.parametrize("backup", [1, 2, 3, 4])
def test_single_failure_keeps_the_ring_and_the_state(backup: int) -> None:
    r = ring(24, seed=backup, backup=backup)
    order = r.by_id()
    victim = order[7]
    r.crash([victim])
    r.settle(100.0)
    assert ring_errors(r.live) == []
    took = owners(r)[("sub", victim.addr)]
    assert len(took) == 1 and took[0] in {order[6].addr, order[8].addr}
    assert all(len(v) == 1 for v in owners(r).values())  # nothing duplicated


@pytest.mark.parametrize(
    ("gap", "backup", "survives"), [(1, 2, True), (2, 2, True), (1, 1, False), (1, 3, True)]
)
def test_two_failures_at_once(gap: int, backup: int, survives: bool) -> None:
    """Adjacent brokers (gap 1) or a broker and its neighbour's neighbour (gap 2). With
    backup 1 the only copy of B's state is on its Right, which dies with it."""
    r = ring(24, seed=5, backup=backup)
    order = r.by_id()
    b, other = order[10], order[10 + gap]
    r.crash([b, other])
    r.settle(150.0)
    assert ring_errors(r.live) == []
    state = owners(r)
    assert (("sub", b.addr) in state) is survives
    assert ("sub", other.addr) in state
    assert all(len(v) == 1 for v in state.values())


def test_link_failure_on_the_ring_is_told_from_a_node_failure() -> None:
    cut = LinkFailure()
    r = ring(12, layers=[cut])
    order = r.by_id()
    a, b, c = order[3], order[4], order[5]
    cut.fail(a.addr, b.addr)
    r.settle(100.0)
    assert ring_errors(r.live) == []  # nobody was declared dead
    assert not any(b.me.id in nd.dead for nd in r.live)
    assert a.detour[b.me.id] == (c.me,)  # A reaches B through C
    got: list[RingRoute] = []
    r.sim.on_deliver = lambda node, sub, event, now: got.append(event)
    r.call(a.addr, lambda n: n.route(b.me.id, "x"))
    r.settle(30.0)
    assert [g.payload for g in got] == ["x"] and got[0].hops == 2


def test_a_ring_link_that_comes_back_is_used_again_and_its_far_end_watched() -> None:
    """A link taken for down (a broker too busy to send heartbeats looks the same) is used
    again once heartbeats come over it; else the neighbour would never be suspected again,
    and its crash not noticed (in a ring of three where every link had been taken for down
    once, nobody noticed a kill -9)."""
    cut = LinkFailure()
    r = ring(3, layers=[cut])
    a, b, c = r.by_id()
    cut.fail(a.addr, b.addr)
    r.settle(100.0)
    assert a.detour.get(b.me.id) == (c.me,) and b.detour.get(a.me.id) == (c.me,)
    cut.restore(a.addr, b.addr)
    r.settle(30.0)
    assert b.me.id not in a.detour and a.me.id not in b.detour
    r.crash([b])
    r.settle(100.0)
    assert ring_errors(r.live) == []
    assert b.me.id in a.dead and b.me.id in c.dead
    assert owners(r)[("sub", b.addr)] in ([a.addr], [c.addr])


def test_backups_go_as_changes_and_a_holder_that_missed_one_gets_the_whole_state() -> None:
    r = ring(6, backup=2)
    owner = r.by_id()[2]
    sent = r.sim.metrics.sent_by_type
    copies, deltas = sent().get("BackupCopy", 0), sent().get("BackupDelta", 0)
    for i in range(30):
        r.call(owner.addr, lambda c, i=i: c.set_state(("sub", "x", i), f"filter {i}"))
    r.call(owner.addr, lambda c: c.del_state(("sub", owner.addr)))
    r.settle(20.0)
    assert sent().get("BackupDelta", 0) > deltas and sent().get("BackupCopy", 0) == copies
    holders = [nd for nd in r.live if owner.me.id in nd.backups.held]
    assert len(holders) == 2
    for nd in holders:
        assert nd.backups.held[owner.me.id].state == owner.state
    lagging = holders[0]
    lagging.backups.held[owner.me.id].version -= 1  # as if it had missed a delta
    r.call(owner.addr, lambda c: c.set_state(("sub", "y"), "filter y"))
    r.settle(20.0)
    assert sent().get("BackupResync", 0) == 1
    for nd in holders:
        assert nd.backups.held[owner.me.id].state == owner.state and ("sub", "y") in owner.state


def test_a_flush_sends_the_steps_changes_once_and_cancels_the_backup_timer() -> None:
    r = ring(6, backup=2)
    owner = r.by_id()[2]
    sent = r.sim.metrics.sent_by_type
    r.settle(20.0)
    deltas = sent().get("BackupDelta", 0)
    r.call(owner.addr, lambda c: c.set_state(("sub", "z"), "filter z") + c.flush_backups())
    r.settle(20.0)
    assert sent().get("BackupDelta", 0) - deltas == 2  # (one per holder: no empty copy after it)
    for nd in [nd for nd in r.live if owner.me.id in nd.backups.held]:
        assert nd.backups.held[owner.me.id].state == owner.state and ("sub", "z") in owner.state


def test_a_slow_tester_is_asked_again_not_buried_with_the_suspect() -> None:
    """A suspects B and asks C to test it; C is busy and answers late, but A hears from C
    meanwhile: A asks again instead of burying both B and C (which split a ring of three)."""

    class SlowFirstTest:  # the first TestNeighbour takes 40 time units (A waits 20)
        held = 0

        def bind(self, host: object) -> object:
            def decide(src: int, dst: int, msg: object, now: float) -> float:
                if type(msg).__name__ == "TestNeighbour" and not self.held:
                    self.held = 1
                    return 40.0
                return 0.0

            return decide

    slow = SlowFirstTest()
    r = ring(3, layers=[slow])
    a, b, _ = r.by_id()
    tests = r.sim.metrics.sent_by_type().get("TestNeighbour", 0)
    r.call(a.addr, lambda n: n._suspect(b.me))
    r.settle(100.0)
    assert slow.held == 1 and r.sim.metrics.sent_by_type()["TestNeighbour"] - tests == 2
    assert ring_errors(r.live) == []
    assert not any(nd.dead for nd in r.live)  # (before: A buried B and C, and C buried A)


def test_a_suspect_heard_from_while_probed_is_alive_though_its_answer_is_late() -> None:
    """C probes B for A; B's answer comes late (B busy), but B's heartbeats reach C
    meanwhile: C tells A that B is alive instead of burying it."""

    class LateProbeAcks:
        def bind(self, host: object) -> object:
            return lambda src, dst, msg, now: 40.0 if type(msg).__name__ == "ProbeAck" else 0.0

    r = ring(3, layers=[LateProbeAcks()])
    a, b, _ = r.by_id()
    r.call(a.addr, lambda n: n._suspect(b.me))
    r.settle(100.0)
    assert ring_errors(r.live) == []
    assert not any(nd.dead for nd in r.live)


def test_chord_link_failure_finds_a_traced_path() -> None:
    cut = LinkFailure()
    r = ring(64, heartbeat=None, layers=[cut])
    a = r.by_id()[0]
    far = a.chords[4]
    cut.fail(a.addr, far.addr)
    got: list[RingRoute] = []
    r.sim.on_deliver = lambda node, sub, event, now: got.append(event)
    r.call(a.addr, lambda n: n.route(far.id, "first"))  # the send fails: traced query, re-route
    r.settle()
    path = a.detour[far.id]
    assert path and path[-1] == far and len(path) >= 2
    assert [g.payload for g in got] == ["first"]
    r.call(a.addr, lambda n: n.route(far.id, "second"))
    r.settle()
    assert [g.payload for g in got] == ["first", "second"]


def test_errors() -> None:
    with pytest.raises(ProtocolError, match="backup"):
        RingNode(0, backup=5)
    with pytest.raises(ProtocolError, match="heartbeat"):
        RingNode(0, heartbeat=0.0)
    nd = RingNode(0)
    with pytest.raises(ProtocolError, match="no broker"):
        nd.join([])
    nd.start()
    with pytest.raises(ProtocolError, match="already"):
        nd.join([1])
    with pytest.raises(ProtocolError, match="unknown message"):
        nd.on_message(1, "hello", 0.0)
    with pytest.raises(ProtocolError, match="unknown timer"):
        nd.on_timer("tick", 0.0)


def test_a_dead_chord_is_redirected_to_who_took_over() -> None:
    r = ring(64, seed=2)
    order = r.by_id()
    a = order[0]
    far = a.chords[4]
    dead = next(nd for nd in order if nd.me == far)
    r.crash([dead])
    r.settle(100.0)  # its ring neighbours close the ring and take its state over
    taker = next(nd for nd in r.live if dead.me.id in nd.taken_over)
    got: list[tuple[int, RingRoute]] = []
    r.sim.on_deliver = lambda node, sub, event, now: got.append((node, event))
    r.call(a.addr, lambda n: n.route(far.id, "late"))
    r.settle(100.0)
    assert [(node, e.payload) for node, e in got] == [(taker.addr, "late")]
    assert ring_errors(r.live) == []


def test_a_taker_over_its_load_limit_shares_with_the_next_neighbour() -> None:
    r = RingSim(seed=4, backup=2, heartbeat=5.0, probe_timeout=10.0)
    r.grow(10)
    for nd in r.live:
        nd.load_limit = 3
    order = r.by_id()
    victim, taker, beyond = order[4], order[5], order[6]
    for k in range(3):  # the victim holds 3 entries, everyone else 1
        r.call(victim.addr, lambda c, k=k: c.set_state(("v", k), k))
    for nd in order:
        if nd is not victim:
            r.call(nd.addr, lambda c, a=nd.addr: c.set_state(("own", a), a))
    r.settle(100.0)
    r.crash([victim])
    r.settle(150.0)
    assert victim.me.id in taker.taken_over
    assert len(taker.state) == 3 and len(beyond.state) == 2  # 1 + 3 = 4 > 3: one passed on
    keys = [k for nd in r.live for k in nd.state]
    assert sorted(keys, key=repr) == sorted({*keys}, key=repr)  # nothing twice
    assert {("v", k) for k in range(3)} <= set(keys)
    with pytest.raises(ProtocolError, match="load limit"):
        RingNode(0, load_limit=0)


@pytest.mark.parametrize("seed", [1, 3, 5])
def test_two_adjacent_brokers_restarted_before_found_dead_are_buried_within_a_probe(seed: int) -> None:
    """Two adjacent brokers crash and come back on their addresses 3 s later, before the
    ring found them dead. A neighbour told of one restart asks the other one, its far
    neighbour, to test it: that one is a new process too and answers nothing. Each further
    ``Restarted`` asked it again and put the test's timer off, so both were buried only
    once the announcements stopped (70 s in a traced run, with the dead brokers'
    subscriptions served nowhere). A tester proven gone is asked nothing: the neighbour
    probes the suspect itself, and buries both when the probe runs out."""
    r = ring(8, seed=seed)
    order = r.by_id()
    dying = order[3:5]
    r.crash(dying)
    r.sim.run(until=r.sim.now + 3)
    back = [r.reborn(b) for b in dying]
    t0 = r.sim.now
    while r.sim.now < t0 + 120 and not all(n.buried is not None for n in back):
        r.sim.run(until=r.sim.now + 0.25)
    assert all(n.buried is not None and n.buried.taker is not None for n in back)
    assert r.sim.now - t0 <= 2 * r.probe_timeout + 4  # (a probe, then the next announcement)
    for n in back:
        r.call(n.addr, lambda c: c.join([order[0].addr]))
    r.settle(150.0)
    assert ring_errors(r.live) == []
    assert all(len(v) == 1 for v in owners(r).values())
    assert {("sub", b.addr) for b in dying} <= owners(r).keys()


def test_a_broker_whose_left_side_is_lost_still_places_a_joining_broker() -> None:
    """A rolling restart in the simulator left a broker with a Right and no Left (its left
    side all found dead, not refilled yet) when a restarted broker asked it to join: the
    join's placement assumed both and failed an assertion, the broker's step with it. The
    one side it has stands for both, as in a ring of two."""
    r = ring(4, seed=3)
    node = r.by_id()[1]
    node.pred = []
    assert node.left is None and node.right is not None
    out = node.on_message(99, JoinRequest(99, 0, 7), r.sim.now)
    accept = [e.msg for e in out if isinstance(e, Send) and isinstance(e.msg, JoinAccept)]
    assert len(accept) == 1 and accept[0].id not in {p.id for p in node.window if p.addr != 99}


def test_a_heartbeat_from_a_broker_that_takes_us_for_its_neighbour() -> None:
    """A broker's side lost its neighbour and stayed open (the news that closes it died
    with a broker): its new neighbour there heartbeats it as its own and must be taken in
    (a crash schedule in the simulator: the side open for good, 1,673 publishes unsettled).
    If one of ours is between us, the sender missed its join: it gets that one's Insert."""
    r = ring(5, seed=2)
    order = r.by_id()
    node, right, beyond = order[0], order[1], order[2]
    node.succ = []
    node.open.add(1)
    out = node.on_message(right.addr, Heartbeat(right.me, 0.0, r.sim.now, tuple(right.window)), r.sim.now)
    assert node.right == right.me and node.rightright == beyond.me and 1 not in node.open
    assert any(isinstance(e, Send) and e.dst == right.addr for e in out)  # (its heartbeat acknowledged)
    out = node.on_message(beyond.addr, Heartbeat(beyond.me, 0.0, r.sim.now, tuple(beyond.window)), r.sim.now)
    assert node.right == right.me  # (beyond knows right: it heartbeats right, not us)
    stale = (*beyond.window[:-1], node.me)  # (a window from before right joined: node its Left)
    out = node.on_message(beyond.addr, Heartbeat(beyond.me, 0.0, r.sim.now, stale), r.sim.now)
    assert node.right == right.me
    assert [
        e.msg for e in out if isinstance(e, Send) and e.dst == beyond.addr and isinstance(e.msg, Insert)
    ] == [Insert(right.me)]


def test_an_answer_from_a_dead_brokers_address_under_another_id_proves_it_gone() -> None:
    """A neighbour that missed the news of a broker's death heartbeat its address, where a
    new process answered: the answers kept the dead one alive for it for good (a dead
    incarnation kept as Right, 1,672 publishes unsettled in a simulator run). An answer
    under another id is a proof that the one we knew there is gone, and it is suspected."""
    r = ring(5, seed=2)
    node = r.by_id()[0]
    old = node.right
    assert old is not None
    new = Peer(old.id + 1, old.addr)
    node.on_message(old.addr, HeartbeatAck(new, r.sim.now), r.sim.now)
    assert node.detector.is_gone(old.id) and node.detector.suspected(old.id)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_the_holder_of_a_dead_brokers_backup_is_told_though_a_join_moved_it_off_the_gap(seed: int) -> None:
    """Four brokers; two adjacent ones, C and D, crash, and at once a new broker N joins
    through A, D's Right (the first holder of D's backup), into the gap between D and A.
    B and N, the dead ones' neighbours now, close the ring; A is no neighbour of the dead
    any more, and it is in the window of both, so the side each changed went to nobody:
    A heard of D's death only by chance (a query to D that another answered, naming
    itself, or, sent through C, never: D's subscriptions then served by no one, 859
    events lost in a simulated schedule). A ring closed round dead brokers now tells the
    other neighbour, A takes D over, and says so to the process restarted on D's address."""
    r = ring(4, seed=seed)
    order = r.by_id()
    a = order[0]
    assert a.left is not None and a.right is not None
    into_left = cw(a.left.id, a.me.id) >= cw(a.me.id, a.right.id)  # (the larger gap next to A)
    d, c = (order[3], order[2]) if into_left else (order[1], order[2])
    r.crash([c, d])
    new = r.join_through(a.addr)
    r.settle(200.0)
    assert new.joined
    assert ring_errors(r.live) == []
    state = owners(r)
    assert state[("sub", d.addr)] == [a.addr] and ("sub", c.addr) in state
    assert all(len(v) == 1 for v in state.values())
    back = r.reborn(d)
    r.settle(3 * r.probe_timeout)
    assert back.buried is not None and back.buried.taker == a.me


def test_a_broker_that_speaks_to_a_restarted_members_address_is_told_of_the_restart() -> None:
    """A broker joined next to a dead member's place after it died (the member never knew
    it): the member's new process announced its restart only to the member's old window,
    and the newcomer, hearing a process at the address, took the member for alive; asked to
    test it, it answered "alive" for 65 s (a simulator schedule: 889 deliveries lost).
    Whoever speaks to a process announcing a restart is told ``Restarted`` too, once, then
    at each announcement."""
    r = ring(5, seed=2)
    order = r.by_id()
    dying, newcomer = order[2], order[4]
    r.crash([dying])
    back = r.reborn(dying)
    told_before = [e for e in back.announce(dying.me, [order[1].addr]) if isinstance(e, Send)]
    assert {e.dst for e in told_before} == {order[1].addr}
    beat = Heartbeat(newcomer.me, 0.0, r.sim.now, tuple(newcomer.window))
    out = back.on_message(newcomer.addr, beat, r.sim.now)
    assert out == [Send(newcomer.addr, Restarted(dying.me))]
    assert back.on_message(newcomer.addr, beat, r.sim.now) == []  # (once)
    again = back.on_timer(("ring", "announce"), r.sim.now)
    assert {e.dst for e in again if isinstance(e, Send)} == {order[1].addr, newcomer.addr}
    assert back.met(newcomer.addr) == [] and back.met(back.addr) == []


def test_alive_from_a_tester_is_not_believed_of_a_broker_proven_gone_here() -> None:
    """We hold the proof that B is gone (its new process told us); C, asked to test B,
    heard that new process on B's address and answered "alive". Believed, B stayed a
    member (a simulator schedule: asked again at each announcement, for 65 s). We probe B
    ourselves, and the probe's verdict buries it."""
    r = ring(5, seed=2)
    order = r.by_id()
    node, b = order[0], order[1]
    c = next(p for p in node.window if p.id == order[2].me.id)
    node.detector.gone(b.me.id, r.sim.now)
    node._suspect(b.me)
    out = node.on_message(c.addr, Alive(b.me, c), r.sim.now)
    assert any(isinstance(e, Send) and e.dst == b.addr and isinstance(e.msg, Probe) for e in out)
    assert not node.detour.get(b.me.id)
    r.crash([b])
    r.settle(60.0)
    assert b.me.id in node.dead


def test_a_join_asked_again_is_answered_with_the_same_member() -> None:
    """A starved bootstrap answered a join after the joiner had asked again: each request
    made a member, one process had three ids at its address in the brokers' windows (an
    overload run: 10 derived events lost while the extra two were found dead). A request
    asked again (same address, same nonce) is answered with the member it made."""
    r = ring(4, seed=3)
    node = r.by_id()[1]
    accepts = []
    for _ in range(2):
        out = node.on_message(99, JoinRequest(99, 0, 7), r.sim.now)
        accepts += [e.msg for e in out if isinstance(e, Send) and isinstance(e.msg, JoinAccept)]
    assert len(accepts) == 2 and accepts[0] == accepts[1]
    assert [p.id for p in node.window if p.addr == 99] == [accepts[0].id]
    out = node.on_message(99, JoinRequest(99, 0, 8), r.sim.now)  # (another process: another member)
    (other,) = [e.msg for e in out if isinstance(e, Send) and isinstance(e.msg, JoinAccept)]
    assert other.id != accepts[0].id


def test_a_second_answer_to_a_join_is_told_gone_at_once() -> None:
    """Asked again at another broker, a join may be answered twice: the joiner keeps the
    first id, and tells the window of the second that its member is gone (``Restarted``):
    the extra member is buried at once, not after failure detection."""
    r = ring(4, seed=3)
    a, b = r.by_id()[0], r.by_id()[2]
    joiner = RingNode(99, heartbeat=5.0)
    first = [e.msg for e in a.on_message(99, JoinRequest(99, 0, 7), r.sim.now) if isinstance(e, Send)]
    second = [e.msg for e in b.on_message(99, JoinRequest(99, 0, 7), r.sim.now) if isinstance(e, Send)]
    (acc1,) = [m for m in first if isinstance(m, JoinAccept)]
    (acc2,) = [m for m in second if isinstance(m, JoinAccept)]
    assert acc1.id != acc2.id
    joiner.on_message(a.addr, acc1, r.sim.now)
    assert joiner.id == acc1.id
    out = joiner.on_message(b.addr, acc2, r.sim.now)
    told = {e.dst for e in out if isinstance(e, Send) and e.msg == Restarted(Peer(acc2.id, 99))}
    assert told == {p.addr for p in acc2.window if p.addr != 99} and joiner.id == acc1.id


def test_a_tester_heard_from_directly_takes_no_way_round() -> None:
    """B answered our own probe just before C's ``Alive`` came: our link to B works (B was
    slow, not cut off from us), so no detour is taken; with one, B was hidden from our
    heartbeat rounds."""
    r = ring(5, seed=2, heartbeat=1.0)
    order = r.by_id()
    node, b = order[0], order[1]
    c = next(p for p in node.window if p.id == order[2].me.id)
    node._suspect(b.me)
    node.on_message(b.addr, HeartbeatAck(b.me, r.sim.now), r.sim.now)  # (heard: its link works)
    node.on_message(c.addr, Alive(b.me, c), r.sim.now)
    assert not node.detour.get(b.me.id)
    r.settle(2.0)
    node._suspect(b.me)
    node.on_message(c.addr, Alive(b.me, c), r.sim.now + 3.0)  # (silent here: the link is down)
    assert node.detour.get(b.me.id) == (c,)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_neighbour_paused_after_both_its_neighbours_tested_it_is_found_dead(seed: int) -> None:
    """Both ring neighbours of B suspect it at once and ask each other to test it; B answers
    both probes, then is paused for good. Each took the other's "alive" for a broken link
    of its own and kept a detour through the other; neither tested B again, and B stayed a
    member as long as it was paused (simulator schedule 99 of starve: 13 s, and what was
    routed into it lost). Heard over its own link, B takes no detour: it is found dead."""
    r = ring(5, seed=seed, heartbeat=1.0)
    a, b, c = r.by_id()[:3]
    r.sim.invoke(a.addr, lambda n: n._suspect(b.me))
    r.sim.invoke(c.addr, lambda n: n._suspect(b.me))
    r.settle(0.01)
    while a.detector.suspected(b.me.id) or c.detector.suspected(b.me.id):  # (the tests answered)
        r.settle(0.1)
    assert not a.detour.get(b.me.id) and not c.detour.get(b.me.id)  # (heard: no way round)
    r.sim.pause(b.addr, r.sim.now + 1000.0)
    r.settle(30.0)
    assert b.me.id in a.dead and b.me.id in c.dead
    assert ring_errors([n for n in r.live if n is not b]) == []


def test_a_neighbour_reached_the_long_way_is_tested_again_once_silent_for_the_guard() -> None:
    """A detour to B (our link to it taken for down) hides no death: once B has been silent
    here for the guard, our heartbeat round asks its other neighbour to test it again (the
    detour kept meanwhile); before that, it does not."""
    r = ring(5, seed=1, heartbeat=1.0)
    a, b, c = r.by_id()[:3]
    r.sim.pause(b.addr, r.sim.now + 1000.0)
    r.settle(0.2)
    a.detour[b.me.id] = (c.me,)
    guard = a.detector.guard

    def tests(at: float) -> list[Any]:
        out = a.on_timer(("ring", "heartbeat"), at)
        return [e.msg for e in out if isinstance(e, Send) and getattr(e.msg, "suspect", None) == b.me]

    assert tests(r.sim.now + guard / 2) == []
    (test,) = tests(r.sim.now + guard + 1.0)
    assert test.suspect == b.me and a.detour[b.me.id] == (c.me,)


def test_a_tester_that_buried_the_suspect_says_failed_without_probing_it() -> None:
    """C buried B; A, which never heard (B's death was settled on C's side only), asks C to
    test B. Probed, a B that was only paused answered from its backlog before it read that
    it was dead, and C's "alive" kept B A's neighbour until A took B's state over a second
    time (simulator schedule 186 of starve: 243 deliveries lost). C answers ``Failed``, as
    proven, at once."""
    r = ring(5, seed=2, heartbeat=1.0)
    a, b, c = r.by_id()[:3]
    c.dead.add(b.me.id)
    out = c.on_message(a.addr, AskToTest(b.me, a.me, (a.me,)), r.sim.now)
    assert [type(e.msg) for e in out if isinstance(e, Send)] == [Failed]
    (failed,) = [e.msg for e in out if isinstance(e, Send)]
    assert failed.suspect == b.me and failed.gone and failed.window[0] == c.me


@pytest.mark.parametrize("named", [True, False])
def test_an_asker_told_who_took_the_suspect_over_does_not_take_it_over_again(named: bool) -> None:
    """A ``Failed`` from a tester that buried B names B's taker: the asker buries B and keeps
    the taker's word, and does not take B's state over a second time, though its copy names
    it B's first holder (a copy B sent as it woke, before it read that it was dead:
    simulator schedule 15 of starve, taken over twice, 567 deliveries out of order). Not
    named, the first holder takes it over, as the ring's repair does."""
    r = ring(5, seed=2, heartbeat=1.0)
    b = r.by_id()[1]
    asker = next(
        n for n in r.live if n is not b and b.me.id in n.backups.held and n.backups.held[b.me.id].rank == 0
    )
    taker = next(n for n in r.live if n not in (asker, b))
    out = asker.on_message(
        taker.addr, Failed(b.me, (taker.me,), True, taker.me if named else None), r.sim.now
    )
    assert b.me.id in asker.dead
    redirects = [e for e in out if isinstance(e, Send) and type(e.msg).__name__ == "Redirect"]
    if named:
        assert ("sub", b.addr) not in asker.state and redirects == []
        assert asker.taken_by[b.me.id] == taker.me
    else:
        assert ("sub", b.addr) in asker.state and redirects
