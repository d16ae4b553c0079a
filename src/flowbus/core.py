"""The sans-IO core contract: the effects a protocol core returns and the :class:`Core` it is.

How it works: a protocol core (a Pastry node, an IRBR router, a ring member, a CBDLO
walker...) is a plain object that offers :class:`Core`: ``on_message(src, msg, now)``,
``on_timer(key, now)``, ``on_send_failed(dst, msg, now)`` and ``on_messages(src, msgs,
now)``, each returning a list of effects. It never touches a socket, a clock or a global
random source: it returns effects, and a driver carries them out. There are two drivers, the
discrete-event simulator (:mod:`flowbus.sim`) and the asyncio runtime of the broker network
(:mod:`flowbus.net.runtime`), so a protocol measured at 10^4 simulated nodes is the code that
runs between brokers. Node ids are ints; messages are frozen dataclasses with a wire tag
(:mod:`flowbus.wire`).

* :class:`Send` -- send ``msg`` to node ``dst`` (the transport may delay, lose
  or drop it if ``dst`` has failed).
* :class:`Deliver` -- hand ``event`` to the local subscriber ``sub`` (what the
  metrics count as a delivery).
* :class:`DeliverAll` -- hand ``event`` to each of the local subscribers ``subs``: one
  ``Deliver`` each, in one effect (a core that routes for a broker's driver gives an
  event's local deliveries together, so the driver hands them on per client connection).
* :class:`SetTimer` -- call ``on_timer(key, ...)`` after ``delay`` time units
  (setting a key again replaces the earlier timer).
* :class:`CancelTimer` -- forget the timer ``key``.

A core also reports to its driver what became of the driver's own requests, as effects too
(:class:`Outcome`; nothing a driver carries out on the network): :class:`Settled` (events
published here that every receiver is done with: a broker acknowledges their publishes),
:class:`PublishRefused` (events published here refused on the way, with the reason), and
:class:`Ended` (subscriptions the core ended: a flow's subscriptions once the flow is gone).
The simulator hands them to its ``on_outcome`` hook, the runtime to its driver's.

A core reads its messages in one place (one ``match``, or one table from message type to
handler); a message it does not know raises :class:`~flowbus.errors.ProtocolError`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from flowbus.errors import ProtocolError

__all__ = [
    "CancelTimer",
    "Core",
    "Deliver",
    "DeliverAll",
    "Effect",
    "Ended",
    "Outcome",
    "PublishRefused",
    "Send",
    "SetTimer",
    "Settled",
]


@dataclass(frozen=True, slots=True)
class Send:
    dst: int
    msg: Any

    def __post_init__(self) -> None:
        if type(self.dst) is not int:
            raise ProtocolError(f"Send: a node id is an int, got {self.dst!r}")


@dataclass(frozen=True, slots=True)
class Deliver:
    sub: Hashable
    event: Any


@dataclass(frozen=True, slots=True)
class DeliverAll:
    subs: tuple[Hashable, ...]
    event: Any


@dataclass(frozen=True, slots=True)
class SetTimer:
    delay: float
    key: Hashable

    def __post_init__(self) -> None:
        if not self.delay >= 0:
            raise ProtocolError(f"SetTimer {self.key!r}: the delay must be >= 0, got {self.delay!r}")


@dataclass(frozen=True, slots=True)
class CancelTimer:
    key: Hashable


class Outcome:
    """What became of the driver's own requests (see the module note)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Settled(Outcome):
    ids: tuple[Hashable, ...]


@dataclass(frozen=True, slots=True)
class PublishRefused(Outcome):
    items: tuple[tuple[Hashable, str], ...]  # (event id, why)


@dataclass(frozen=True, slots=True)
class Ended(Outcome):
    subs: tuple[Hashable, ...]


Effect = Send | Deliver | DeliverAll | SetTimer | CancelTimer | Settled | PublishRefused | Ended


class Core(Protocol):
    """What every sans-IO protocol core offers its drivers.

    A core may subclass :class:`Core` to take the defaults of :meth:`on_messages` (one
    message at a time) and :meth:`on_send_failed` (nothing to do). ``Core`` has no
    instance fields (empty ``__slots__``), so a slotted core stays slotted."""

    __slots__ = ()

    def on_message(self, src: int, msg: Any, now: float) -> Sequence[Effect]:
        """``msg`` arrived from node ``src`` at time ``now``."""
        ...

    def on_timer(self, key: Hashable, now: float) -> Sequence[Effect]:
        """The timer ``key`` set by a :class:`SetTimer` went off."""
        ...

    def on_messages(self, src: int, msgs: Sequence[Any], now: float) -> Sequence[Effect]:
        """Messages read together from ``src``, in order (a core may handle a run of them in
        one pass, as a broker matches a batch of events at once)."""
        effects: list[Effect] = []
        for msg in msgs:
            effects.extend(self.on_message(src, msg, now))
        return effects

    def on_send_failed(self, dst: int, msg: Any, now: float) -> Sequence[Effect]:
        """``msg`` could not reach ``dst`` (the failure notice of an acknowledged link)."""
        return []

    def on_peer_gone(self, dst: int, now: float) -> Sequence[Effect]:
        """``dst``'s process is gone: its host refused a connection (nothing listens there).
        A proof, unlike a failed send, which a partition or a paused peer also gives; it is
        told before the failed sends it explains. By default nothing."""
        return []

    def prepare(self) -> None:
        """Called by a driver now and then (the runtime's ``PREPARE_EVERY``): a core may build
        ahead what its next messages would otherwise wait for (a broker, its indexes after the
        subscriptions changed). It changes no answer and returns no effects; by default nothing."""
        return None
