"""The chordal ring's backups, driven directly (no simulator, no ring node): whole copies
and deltas, a holder that missed one, stale copies, takeover by the first live holder,
sharing."""

from __future__ import annotations

from flowbus.core import Send, SetTimer
from flowbus.overlay.ring_backups import Backups, Held
from flowbus.overlay.ring_messages import BackupAck, BackupCopy, BackupDelta, BackupResync, Peer

ME, R, L, RR = Peer(100, 1), Peer(200, 2), Peer(50, 3), Peer(300, 4)
LINKS = (L, R, RR)


def test_one_copy_per_step_on_a_timer() -> None:
    b = Backups()
    b.set("a", 1)
    assert b.soon() == [SetTimer(0.0, ("ring", "backup"))]
    b.set("b", 2)
    assert b.soon() == []  # one copy for the step's changes
    b.timer_went_off()
    assert b.soon() == [SetTimer(0.0, ("ring", "backup"))]


def test_whole_copy_to_new_holders_then_the_changes() -> None:
    b = Backups()
    b.set("a", 1)
    b.set("b", 2)
    first = b.send(ME, (R, L), LINKS)
    whole = BackupCopy(ME, 1, {"a": 1, "b": 2}, LINKS, (R, L))
    assert first == [Send(R.addr, whole), Send(L.addr, whole)]
    b.set("c", 3)
    b.delete("a")
    delta = BackupDelta(ME, 2, 1, {"c": 3}, ("a",), LINKS, (R, L))
    assert b.send(ME, (R, L), LINKS) == [Send(R.addr, delta), Send(L.addr, delta)]
    assert b.state == {"b": 2, "c": 3} and b.version == 2


def test_new_holders_get_the_whole_state_and_a_former_one_is_told() -> None:
    b = Backups()
    b.set("a", 1)
    b.send(ME, (R, L), LINKS)
    out = b.send(ME, (R, RR), LINKS)
    whole = BackupCopy(ME, 2, {"a": 1}, LINKS, (R, RR))
    assert out == [Send(R.addr, whole), Send(RR.addr, whole), Send(L.addr, BackupCopy(ME, 2, None, ()))]
    assert b.holders == (R, RR)


def test_a_holder_keeps_the_copy_applies_deltas_and_asks_again_after_a_missed_one() -> None:
    owner, holder = Backups(), Backups()
    owner.set("a", 1)
    (copy, _) = owner.send(ME, (R, L), LINKS)
    holder.on_copy(copy.msg, addr=L.addr)
    assert holder.held[ME.id] == Held(1, {"a": 1}, LINKS, (R, L), rank=1)
    owner.set("b", 2)
    (delta, _) = owner.send(ME, (R, L), LINKS)
    assert holder.on_delta(ME.addr, delta.msg, me=L) == [Send(ME.addr, BackupAck(L, 2))]
    assert holder.held[ME.id].state == {"a": 1, "b": 2} and holder.held[ME.id].version == 2
    assert owner.confirmed() == 0  # (nothing acknowledged yet by both holders)
    owner.on_ack(BackupAck(L, 2))
    owner.on_ack(BackupAck(R, 1))
    assert owner.confirmed() == 1  # the version both holders have
    owner.on_ack(BackupAck(R, 2))
    assert owner.confirmed() == 2
    owner.set("c", 3)
    owner.send(ME, (R, L), LINKS)  # (lost on the way)
    owner.set("d", 4)
    (late, _) = owner.send(ME, (R, L), LINKS)
    assert holder.on_delta(ME.addr, late.msg, me=L) == [Send(ME.addr, BackupResync(L))]
    assert holder.held[ME.id].version == 2  # unchanged until the whole state comes
    assert owner.resend(ME, L, LINKS) == [Send(L.addr, BackupCopy(ME, 4, owner.state, LINKS, (R, L)))]
    assert owner.resend(ME, RR, LINKS) == []  # not a holder


def test_stale_copies_and_deltas_are_dropped() -> None:
    holder = Backups()
    holder.on_copy(BackupCopy(ME, 5, {"new": 1}, LINKS, (R,)), addr=R.addr)
    assert not holder.on_copy(BackupCopy(ME, 4, {"old": 1}, LINKS, (R,)), addr=R.addr)
    assert holder.on_delta(ME.addr, BackupDelta(ME, 3, 2, {"x": 1}, (), LINKS, (R,)), me=R) == []
    assert holder.held[ME.id].state == {"new": 1}
    holder.on_copy(BackupCopy(ME, 6, None, ()), addr=R.addr)  # no longer a holder
    assert holder.held == {}


def test_the_first_live_holder_takes_over() -> None:
    first, second = Backups(), Backups()
    copy = BackupCopy(ME, 1, {"a": 1}, LINKS, (R, L))
    first.on_copy(copy, addr=R.addr)
    second.on_copy(copy, addr=L.addr)
    second.set("own", 0)
    assert second.take_over(ME, dead={ME.id}) is None  # R, before us, is alive: it takes over
    assert second.state == {"own": 0} and second.foreign == 0 and second.orphans == {ME.id: ME}
    assert first.take_over(ME, dead={ME.id}) == Held(1, {"a": 1}, LINKS, (R, L), 0)
    assert first.state == {"a": 1} and first.foreign == 1
    second.drop(ME.id)  # (R said it took over)
    assert second.held == {} and second.orphans == {}
    second.on_copy(copy, addr=L.addr)
    assert second.take_over(ME, dead={ME.id, R.id}) is not None  # R died too
    assert second.state == {"own": 0, "a": 1}


def test_a_copy_kept_for_an_earlier_holder_is_taken_over_when_that_one_is_found_dead_too() -> None:
    """The owner and its first holder died together, and the second holder heard of the
    owner first: it keeps the copy, and takes it over once it finds the first one dead."""
    second = Backups()
    second.on_copy(BackupCopy(ME, 1, {"a": 1}, LINKS, (R, L)), addr=L.addr)
    assert second.take_over(ME, dead={ME.id}) is None
    assert second.orphans_due({ME.id}) == []
    assert second.orphans_due({ME.id, R.id}) == [ME]
    assert second.take_over(ME, dead={ME.id, R.id}) is not None
    assert second.state == {"a": 1} and second.orphans == {} and second.held == {}


def test_after_a_takeover_or_a_share_the_next_copy_is_whole() -> None:
    b = Backups()
    b.set("a", 1)
    b.send(ME, (R,), LINKS)
    b.absorb({"x": 1})
    assert b.foreign == 1
    ((_, copy),) = [(e.dst, e.msg) for e in b.send(ME, (R,), LINKS)]
    assert isinstance(copy, BackupCopy) and copy.state == {"a": 1, "x": 1}
    assert b.hand_over(["x", "missing"]) == {"x": 1}
    assert b.state == {"a": 1} and b.foreign == 2
    ((_, copy),) = [(e.dst, e.msg) for e in b.send(ME, (R,), LINKS)]
    assert isinstance(copy, BackupCopy)
    assert b.load_of(ME.id) is None


def test_alone_the_changes_are_not_kept_and_the_first_holder_gets_the_whole_state() -> None:
    b = Backups()
    b.send(ME, (), LINKS)  # (alone: a copy to no one)
    b.set("a", 1)
    b.set("b", 2)
    b.delete("a")
    assert b.send(ME, (), LINKS) == [] and not b._changed  # (nothing kept for no holder)
    b.set("c", 3)
    whole = BackupCopy(ME, 3, {"b": 2, "c": 3}, LINKS, (R,))
    assert b.send(ME, (R,), LINKS) == [Send(R.addr, whole)]
    b.set("d", 4)  # (a holder now: the changes go as a delta)
    assert b.send(ME, (R,), LINKS) == [Send(R.addr, BackupDelta(ME, 4, 3, {"d": 4}, (), LINKS, (R,)))]


def test_an_orphan_no_earlier_holder_claims_is_taken_over_after_its_rounds() -> None:
    """The owner's copy names a live holder before us that never got it (a new member that
    joined next to the owner moments before both died with the copy to it on its way): it
    takes nothing over and says nothing. After ``limit`` silent heartbeat rounds the copy is
    ours to take over, forced; a Redirect meanwhile (the earlier holder did) drops it."""
    second = Backups()
    second.on_copy(BackupCopy(ME, 1, {"a": 1}, LINKS, (R, L)), addr=L.addr)
    assert second.take_over(ME, dead={ME.id}) is None and second.orphans == {ME.id: ME}
    assert [second.orphans_waited(4) for _ in range(3)] == [[], [], []]
    assert second.orphans_waited(4) == [ME]
    assert second.take_over(ME, dead={ME.id}, force=True) is not None
    assert second.state == {"a": 1} and second.orphans == {} and second.orphan_rounds == {}
    other = Backups()
    other.on_copy(BackupCopy(ME, 1, {"a": 1}, LINKS, (R, L)), addr=L.addr)
    other.take_over(ME, dead={ME.id})
    other.orphans_waited(4)
    other.drop(ME.id)  # (R's Redirect: it took over)
    assert other.orphans_waited(4) == [] and other.orphan_rounds == {} and other.held == {}


def test_the_index_of_the_state_finds_what_a_scan_finds() -> None:
    """``keys_of`` and ``keys_where`` after any mix of sets, deletions, takeovers and
    hand-overs: the keys a scan of the whole state would find."""
    import random

    rng = random.Random(4)
    b = Backups()
    tags, firsts = ("sub", "disk", "frow"), ("a", "b", ("part", "f", 1))
    for _ in range(2000):
        key = (rng.choice(tags), rng.choice(firsts), rng.randrange(4))
        match rng.randrange(4):
            case 0 | 1:
                b.set(key, rng.random())
            case 2:
                b.delete(key)
            case _:
                if rng.random() < 0.5:
                    b.absorb({key: 1, ("sub", "c", 9): 2, "plain": 3})
                else:
                    b.hand_over([key, ("sub", "c", 9)])
        tag, first = rng.choice(tags), rng.choice(firsts)
        scan = {k for k in b.state if type(k) is tuple and k[:2] == (tag, first)}
        assert b.keys_of(tag, first) == scan
    where = b.keys_where("frow", lambda f: isinstance(f, tuple))
    assert where == {k for k in b.state if type(k) is tuple and k[0] == "frow" and isinstance(k[1], tuple)}
    assert sum(len(b.keys_of(*slot)) for slot in b.by_tag) == sum(1 for k in b.state if type(k) is tuple)
