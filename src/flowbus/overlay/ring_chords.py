"""The chordal ring's chords, built by pointer doubling (sans-IO, driven by
:class:`~flowbus.overlay.chordal_ring.RingNode`).

How it works (a choice the document, Madhu Kumar, Bellur, Govindan, "Chordal Reliability
Rings", section 3.2, leaves open): chord j of a broker is the broker 2^j ring positions
clockwise, j = 2, 3, ... while 2^j < n, about log2 n of them.

* Chord 1 is Rightright. Chord j is chord j-1 of chord j-1: each broker asks its chord
  j-1 for that broker's own chord j-1 (``ChordQuery``), and keeps the answer
  (``ChordReply``) as chord j unless it does not lie farther clockwise than chord j-1
  (the doubling went round the ring: there is no chord j).
* A broker asked for a level it does not have yet answers once it has it; once it knows it
  will never have it, it answers "none" to those waiting for it and for higher levels.
* A dead broker's chords are dropped; :meth:`Chords.refresh` builds them again.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from flowbus.core import Effect, Send
from flowbus.overlay.ring_messages import ChordQuery, ChordReply, Peer, cw

__all__ = ["Chords"]


class Chords(Mapping[int, Peer]):
    """One broker's chords, level j >= 2 -> the broker 2^j positions clockwise (see the
    module note); the ring node passes its Right and Rightright along."""

    def __init__(self) -> None:
        self._levels: dict[int, Peer] = {}
        self._waiting: dict[int, list[Peer]] = {}  # chord level -> askers to answer once known

    def __getitem__(self, level: int) -> Peer:
        return self._levels[level]

    def __iter__(self) -> Iterator[int]:
        return iter(self._levels)

    def __len__(self) -> int:
        return len(self._levels)

    def refresh(self, me: Peer, *, right: Peer | None, rightright: Peer | None) -> list[Effect]:
        """Forget the chords and build them again from Rightright."""
        self._levels.clear()
        if rightright is None or rightright == right:
            return []
        return [Send(rightright.addr, ChordQuery(1, me))]

    def drop(self, peer_id: int) -> None:
        """``peer_id`` is dead: it is no chord of ours any more."""
        self._levels = {k: p for k, p in self._levels.items() if p.id != peer_id}

    def on_query(self, msg: ChordQuery, *, rightright: Peer | None) -> list[Effect]:
        have = self._level(msg.level, rightright)
        if have is None and msg.level >= 2 and msg.level not in self._levels:
            self._waiting.setdefault(msg.level, []).append(msg.asker)
            return []
        return [Send(msg.asker.addr, ChordReply(msg.level, have))]

    def on_reply(self, msg: ChordReply, *, me: Peer, rightright: Peer | None) -> list[Effect]:
        level = msg.level + 1
        prev = self._level(msg.level, rightright)
        got = msg.chord
        if got is None or prev is None or got.id == me.id or cw(me.id, got.id) <= cw(me.id, prev.id):
            return self._answer_waiting(level, None)  # 2^level positions go round the ring
        self._levels[level] = got
        out = self._answer_waiting(level, got)
        out.append(Send(got.addr, ChordQuery(level, me)))
        return out

    def _level(self, level: int, rightright: Peer | None) -> Peer | None:
        return rightright if level == 1 else self._levels.get(level)

    def _answer_waiting(self, level: int, chord: Peer | None) -> list[Effect]:
        askers = self._waiting.pop(level, [])
        if chord is None:  # nobody will ever have this level from us: end their doubling too
            for higher in [k for k in self._waiting if k > level]:
                askers += self._waiting.pop(higher)
        return [Send(a.addr, ChordReply(level, chord)) for a in askers]
