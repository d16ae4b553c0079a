"""The chordal reliability ring's ids and messages (the protocol is in
:mod:`flowbus.overlay.chordal_ring`).

Every message is a frozen dataclass; brokers are named by :class:`Peer` (ring id and
address). Ids live on a 2^32 circle, :func:`cw` measures it clockwise.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from flowbus import wire

__all__ = [
    "BACKUP_ORDER",
    "ID_SPACE",
    "MAX_HOPS",
    "SECOND_ID",
    "WINDOW",
    "Alive",
    "BackupAck",
    "BackupCopy",
    "BackupDelta",
    "BackupResync",
    "ChordQuery",
    "ChordReply",
    "Dead",
    "Failed",
    "Heartbeat",
    "HeartbeatAck",
    "Insert",
    "JoinAccept",
    "JoinRequest",
    "LinkDown",
    "Peer",
    "Ping",
    "Pong",
    "Probe",
    "ProbeAck",
    "Reconnect",
    "Redirect",
    "Restarted",
    "RingRoute",
    "SetSide",
    "ShareState",
    "TestNeighbour",
    "TracedQuery",
    "cw",
]

ID_SPACE: Final = 1 << 32
"""The size of the id circle."""

SECOND_ID: Final = (1 << 16) - 1
"""The id of the second broker (section 3.3)."""

WINDOW: Final = 2
"""Ring neighbours kept on each side: Left, Leftleft and Right, Rightright."""

BACKUP_ORDER: Final = ("right", "left", "rightright", "leftleft")

MAX_HOPS: Final = 128
"""A routed message that took this many hops is dropped (a safety net while links change)."""


def cw(a: int, b: int) -> int:
    """The clockwise distance from id ``a`` to id ``b``."""
    return (b - a) % ID_SPACE


@wire.message("ring.peer")
@dataclass(frozen=True, slots=True, order=True)
class Peer:
    """A broker: its ring id and its address."""

    id: int
    addr: int


# ------------------------------------------------------------------------------- messages


@wire.message("ring.ping")
@dataclass(frozen=True, slots=True)
class Ping:
    addr: int
    sent: float


@wire.message("ring.pong")
@dataclass(frozen=True, slots=True)
class Pong:
    addr: int
    sent: float


@wire.message("ring.join_request")
@dataclass(frozen=True, slots=True)
class JoinRequest:
    addr: int
    hops: int = 0
    nonce: int = 0  # the joiner's own (its process's start, say): ids of its incarnations differ


@wire.message("ring.join_accept")
@dataclass(frozen=True, slots=True)
class JoinAccept:
    id: int
    window: tuple[Peer, ...]


@wire.message("ring.insert")
@dataclass(frozen=True, slots=True)
class Insert:
    """A broker joined: take it into your window (and re-send your backup if needed)."""

    new: Peer


@wire.message("ring.chord_query")
@dataclass(frozen=True, slots=True)
class ChordQuery:
    level: int
    asker: Peer


@wire.message("ring.chord_reply")
@dataclass(frozen=True, slots=True)
class ChordReply:
    level: int
    chord: Peer | None  # None: the doubling went round the ring (no such chord)


@wire.message("ring.heartbeat")
@dataclass(frozen=True, slots=True)
class Heartbeat:
    peer: Peer
    load: float = 0.0  # the sender's load (1.0: at its limit; see ring_load)
    sent: float = 0.0  # the sender's clock when it sent it (echoed back: its lease)
    window: tuple[Peer, ...] = ()  # the sender's window (its neighbours fix their own by it)


@wire.message("ring.heartbeat_ack")
@dataclass(frozen=True, slots=True)
class HeartbeatAck:
    """``peer`` got the receiver's heartbeat sent at ``sent`` (the receiver's lease runs
    from it: see :mod:`flowbus.overlay.ring_detector`)."""

    peer: Peer
    sent: float


@wire.message("ring.restarted")
@dataclass(frozen=True, slots=True)
class Restarted:
    """The sender is a new process on the address of ``previous``, which is gone: a proof
    (its state may be taken over now). Answered ``Dead`` once the ring has buried it."""

    previous: Peer


@wire.message("ring.dead")
@dataclass(frozen=True, slots=True)
class Dead:
    """The ring found ``peer`` dead and took its state over (``taker``, if the sender knows
    who): an answer to a message from it. It is not a member any more, and must come back
    as a new one."""

    peer: Peer
    taker: Peer | None = None


@wire.message("ring.test_neighbour")
@dataclass(frozen=True, slots=True)
class TestNeighbour:
    suspect: Peer
    asker: Peer
    window: tuple[Peer, ...]


@wire.message("ring.probe")
@dataclass(frozen=True, slots=True)
class Probe:
    asker: Peer


@wire.message("ring.probe_ack")
@dataclass(frozen=True, slots=True)
class ProbeAck:
    peer: Peer


@wire.message("ring.alive")
@dataclass(frozen=True, slots=True)
class Alive:
    suspect: Peer
    via: Peer


@wire.message("ring.failed")
@dataclass(frozen=True, slots=True)
class Failed:
    suspect: Peer
    window: tuple[Peer, ...]
    gone: bool = False  # proven gone (a connection refused), not only silent past the guard
    taker: Peer | None = None  # buried by the sender already: who took its state over


@wire.message("ring.set_side")
@dataclass(frozen=True, slots=True)
class SetSide:
    """Your ``side`` (1: Right, Rightright; -1: Left, Leftleft) now begins with ``peers``,
    nearest first; ``dead`` are the brokers that left it."""

    side: int
    peers: tuple[Peer, ...]
    dead: tuple[Peer, ...] = ()


@wire.message("ring.redirect")
@dataclass(frozen=True, slots=True)
class Redirect:
    """Route what was meant for ``dead`` to ``to``."""

    dead: Peer
    to: Peer


@wire.message("ring.reconnect")
@dataclass(frozen=True, slots=True)
class Reconnect:
    """``asker`` lost its neighbours ``dead`` on one side: the first live broker on that side
    takes it as its neighbour (walked counter-clockwise from a chord)."""

    asker: Peer
    dead: tuple[Peer, ...]
    window: tuple[Peer, ...]  # the asker's other side
    side: int  # the side of the asker that lost them


@wire.message("ring.backup_copy")
@dataclass(frozen=True, slots=True)
class BackupCopy:
    owner: Peer
    version: int
    state: Mapping[Hashable, Any] | None  # None: you are not my backup holder any more
    links: tuple[Peer, ...]  # the owner's neighbours (window and chords)
    holders: tuple[Peer, ...] = ()  # every holder, in takeover order


@wire.message("ring.backup_delta")
@dataclass(frozen=True, slots=True)
class BackupDelta:
    """The changes of the owner's state since the copy ``base`` its holder has: keys set
    (``entries``) and keys deleted (``deleted``). A holder without that base asks for a whole
    copy (``BackupResync``)."""

    owner: Peer
    version: int
    base: int
    entries: Mapping[Hashable, Any]
    deleted: tuple[Hashable, ...]
    links: tuple[Peer, ...]
    holders: tuple[Peer, ...]


@wire.message("ring.backup_resync")
@dataclass(frozen=True, slots=True)
class BackupResync:
    """A holder missed a delta (``BackupDelta`` on a base it does not have): send it the whole state."""

    holder: Peer


@wire.message("ring.backup_ack")
@dataclass(frozen=True, slots=True)
class BackupAck:
    """The holder has the owner's copy up to ``version`` (a whole copy or a delta applied):
    the owner may rely on the changes up to it (a flow's folds, see routing/flows.py)."""

    holder: Peer
    version: int


@wire.message("ring.share_state")
@dataclass(frozen=True, slots=True)
class ShareState:
    """Part of a broker's state passed to a ring neighbour: by a broker over its load
    limit (what it routes or holds), or by one that took a dead broker's state over."""

    sender: Peer
    entries: Mapping[Hashable, Any]
    seq: int = 0  # the sender's number for it, acknowledged with ``ShareAck`` (0: no answer wanted)


@wire.message("ring.route")
@dataclass(frozen=True, slots=True)
class RingRoute:
    """An application message routed over the overlay to broker id ``target``."""

    target: int
    payload: Any
    hops: int = 0


@wire.message("ring.traced_query")
@dataclass(frozen=True, slots=True)
class TracedQuery:
    origin: Peer
    target: Peer
    trace: tuple[Peer, ...]


@wire.message("ring.link_down")
@dataclass(frozen=True, slots=True)
class LinkDown:
    origin: Peer
    target: Peer
    trace: tuple[Peer, ...]  # origin ... target
