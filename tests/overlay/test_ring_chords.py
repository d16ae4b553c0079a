"""The chordal ring's chords, driven directly (no simulator, no ring node): pointer
doubling from Rightright, askers kept until a level is known, the end of the doubling when
it goes round the ring, a dead chord dropped."""

from __future__ import annotations

from flowbus.core import Send
from flowbus.overlay.ring_chords import Chords
from flowbus.overlay.ring_messages import ChordQuery, ChordReply, Peer

ME, R, RR, FAR, FARTHER = Peer(0, 0), Peer(10, 1), Peer(20, 2), Peer(40, 4), Peer(80, 8)
ASKER = Peer(5, 5)


def test_refresh_asks_rightright_for_its_rightright() -> None:
    c = Chords()
    assert c.refresh(ME, right=R, rightright=RR) == [Send(RR.addr, ChordQuery(1, ME))]
    assert c.refresh(ME, right=R, rightright=R) == []  # (a ring of two: no chords)
    assert c.refresh(ME, right=None, rightright=None) == []


def test_each_reply_is_the_next_level_and_the_next_query() -> None:
    c = Chords()
    assert c.on_reply(ChordReply(1, FAR), me=ME, rightright=RR) == [Send(FAR.addr, ChordQuery(2, ME))]
    assert c.on_reply(ChordReply(2, FARTHER), me=ME, rightright=RR) == [Send(FARTHER.addr, ChordQuery(3, ME))]
    assert dict(c) == {2: FAR, 3: FARTHER} and len(c) == 2 and c[3] == FARTHER


def test_a_reply_that_goes_round_the_ring_ends_the_doubling() -> None:
    c = Chords()
    c.on_reply(ChordReply(1, FAR), me=ME, rightright=RR)
    assert c.on_reply(ChordReply(2, R), me=ME, rightright=RR) == []  # R is not past FAR: round
    assert c.on_reply(ChordReply(2, ME), me=ME, rightright=RR) == []
    assert dict(c) == {2: FAR}


def test_an_asker_waits_for_a_level_not_known_yet() -> None:
    c = Chords()
    assert c.on_query(ChordQuery(1, ASKER), rightright=RR) == [Send(ASKER.addr, ChordReply(1, RR))]
    assert c.on_query(ChordQuery(2, ASKER), rightright=RR) == []  # not known yet: answered later
    assert c.on_query(ChordQuery(3, ME), rightright=RR) == []
    out = c.on_reply(ChordReply(1, FAR), me=ME, rightright=RR)
    assert out == [Send(ASKER.addr, ChordReply(2, FAR)), Send(FAR.addr, ChordQuery(2, ME))]
    # level 3 goes round: its askers, and those of any higher level, hear "none"
    assert c.on_reply(ChordReply(2, R), me=ME, rightright=RR) == [Send(ME.addr, ChordReply(3, None))]


def test_a_dead_chord_is_dropped() -> None:
    c = Chords()
    c.on_reply(ChordReply(1, FAR), me=ME, rightright=RR)
    c.on_reply(ChordReply(2, FARTHER), me=ME, rightright=RR)
    c.drop(FAR.id)
    assert dict(c) == {3: FARTHER}
