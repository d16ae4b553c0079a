"""Hop-by-hop acknowledgements for IRBR's range messages, and the duplicates they may make.

How it works (the IRBR paper, "基于编码区间的路由协议", section 3.2: "a message only needs to
reach some node of the target range, not a fixed node"): a node learns that a range message
went to a dead node the way a real network can tell it, by the missing acknowledgement.

* :class:`HopAcks`: every range message an :class:`~flowbus.routing.irbr.IrbrNode` sends
  (straight to a routing-table entry, or one Pastry hop of a routed one) leaves wrapped in a
  :class:`Hop` with a sequence number of the sender's; the receiver answers :class:`Ack` and
  handles the body as if it had come bare. The sender keeps the message and sets a timer of
  ``timeout``; an acknowledgement cancels both. When the timer fires first, the peer is taken
  for dead: the node handles the message as it handles a failed send (Pastry forgets the
  peer and repairs its state; the message is routed into its range again, where any other
  live node of the range takes it up; with no live node left in the range it is dropped and
  counted, see ``IrbrNode.empty_ranges``). So the simulator's failure notice is not needed,
  and the broker runs the very same code over TCP. A failure notice that does come (the
  simulator's, opt-in) settles the pending send the same way, once.
* :class:`Seen`: a peer taken for dead may only have been slow, and then two nodes of a
  range each carry the event into it. Each node remembers, per event, the shortest range
  prefix it has handled the event for. A copy for a range no larger is dropped; a copy for a
  larger range is carried only into the rows the first copy left out; the local subscribers
  get the event once, from the first copy. So every copy's tree is honoured (no node is left
  out) and no subscriber gets an event twice. The timeout must exceed the round trip: a peer
  slower than it for good is suspected again each time Pastry hears from it (and revives it).

Pastry's repair requests (leaf set, row) leave in a :class:`RepairHop`, acknowledged the same
way: one sent to a node that died unnoticed would otherwise never be answered, and the node's
leaf set could stay short of a range's live nodes. Subscriptions, unsubscriptions and newcomer
notices are idempotent where they land (Lamport stamps, tombstones), so their rare duplicates
cost messages, not correctness. Table requests and replies are not acknowledged: a lost
request is asked again on a failure notice only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Final

from flowbus import wire
from flowbus.core import CancelTimer, Effect, Send, SetTimer
from flowbus.errors import ProtocolError
from flowbus.overlay.pastry import NDIGITS

__all__ = ["ACK_TIMER", "SEEN_WINDOW", "Ack", "Hop", "HopAcks", "RepairHop", "Seen"]

ACK_TIMER: Final = ("irbr", "ack")
"""The head of the acknowledgement timers' keys: ``("irbr", "ack", seq)``."""

SEEN_WINDOW: Final = 100_000
"""How many recent events a node remembers the handled prefixes of."""


@wire.message("irbr.hop")
@dataclass(frozen=True, slots=True)
class Hop:
    """One hop of a range message: ``body`` (a range message, or a Pastry ``Route`` carrying
    one), to be acknowledged with ``Ack(seq)``."""

    seq: int
    body: Any


@wire.message("irbr.repair_hop")
@dataclass(frozen=True, slots=True)
class RepairHop:
    """A Pastry repair request (leaf set, row) sent as :class:`Hop` is, to be acknowledged
    with ``Ack(seq)``: its own type, so an experiment counts it apart from an event's hops."""

    seq: int
    body: Any


@wire.message("irbr.ack")
@dataclass(frozen=True, slots=True)
class Ack:
    """The receiver of ``Hop(seq, ...)`` has it."""

    seq: int


class HopAcks:
    """The sends of one node awaiting their acknowledgement (see the module note)."""

    __slots__ = ("_next", "_pending", "acked", "expired", "timeout")

    def __init__(self, timeout: float) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ProtocolError(f"HopAcks: the acknowledgement timeout must be > 0, got {timeout!r}")
        self.timeout = float(timeout)
        self._next = 0
        self._pending: dict[int, tuple[int, Any]] = {}  # seq -> (destination address, message)
        self.acked = 0
        self.expired = 0

    def __len__(self) -> int:
        return len(self._pending)

    def send(self, dst: int, msg: Any, wrap: type[Hop | RepairHop] = Hop) -> list[Effect]:
        """``msg`` to ``dst`` in a :class:`Hop` (or ``wrap``), and its timer."""
        self._next += 1
        seq = self._next
        self._pending[seq] = (dst, msg)
        return [Send(dst, wrap(seq, msg)), SetTimer(self.timeout, (*ACK_TIMER, seq))]

    def ack(self, seq: int) -> list[Effect]:
        """``Ack(seq)`` came: forget the send (nothing if it was settled already)."""
        if self._pending.pop(seq, None) is None:
            return []
        self.acked += 1
        return [CancelTimer((*ACK_TIMER, seq))]

    def expire(self, seq: int) -> tuple[int, Any] | None:
        """The timer of ``seq`` fired: the send, to be handled as failed (None if settled)."""
        sent = self._pending.pop(seq, None)
        if sent is not None:
            self.expired += 1
        return sent

    def failed(self, seq: int) -> list[Effect] | None:
        """A failure notice for ``seq`` came before its timer: the timer's cancellation (None
        if the send was settled already, by its acknowledgement or its timer)."""
        if self._pending.pop(seq, None) is None:
            return None
        return [CancelTimer((*ACK_TIMER, seq))]


class Seen:
    """Per event, the shortest range prefix this node has handled it for (see the module note)."""

    __slots__ = ("_handled", "dropped", "window")

    def __init__(self, window: int = SEEN_WINDOW) -> None:
        self.window = window
        self._handled: OrderedDict[Hashable, int] = OrderedDict()
        self.dropped = 0  # copies that had nothing left to do here

    def admit(self, eid: Hashable, length: int) -> tuple[bool, int] | None:
        """An event copy for a range of prefix length ``length``: None if a copy for this
        range or a larger one was handled already; else (first copy?, the longest prefix
        length still to cover), the rows ``length .. that - 1`` being the ones to forward to."""
        handled = self._handled.get(eid)
        if handled is not None and handled <= length:
            self.dropped += 1
            return None
        self._handled[eid] = length
        if handled is not None:
            return False, handled
        if len(self._handled) > self.window:
            self._handled.popitem(last=False)
        return True, NDIGITS
