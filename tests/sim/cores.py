"""Toy sans-IO cores for the simulator tests (each a :class:`flowbus.core.Core`): a recorder,
ping-pong, flooding, timers."""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flowbus.core import CancelTimer, Core, Deliver, Effect, Send, SetTimer
from flowbus.errors import ProtocolError


@dataclass(frozen=True, slots=True)
class Ping:
    n: int


@dataclass(frozen=True, slots=True)
class Pong:
    n: int


@dataclass(frozen=True, slots=True)
class Flood:
    origin: int
    seq: int
    hops: int = 0


@dataclass(frozen=True, slots=True)
class Item:
    """What a flooding node delivers: the flooded message's id and how far it came."""

    origin: int
    seq: int
    hops: int = field(compare=False)


@dataclass(frozen=True, slots=True)
class Do:
    """An injected command: return ``effects`` as they are."""

    effects: tuple[Effect, ...]


@dataclass
class Recorder(Core):
    """Logs every message and timer as ``(now, what, ...)``; answers ``Do`` commands."""

    log: list[tuple[Any, ...]] = field(default_factory=list)

    def on_message(self, src: int, msg: Any, now: float) -> Sequence[Effect]:
        self.log.append((now, "msg", src, msg))
        return msg.effects if isinstance(msg, Do) else []

    def on_timer(self, key: Hashable, now: float) -> Sequence[Effect]:
        self.log.append((now, "timer", key))
        return []


@dataclass
class PingPong(Core):
    """Answers ``Ping(n)`` with ``Pong(n)`` and ``Pong(n)`` with ``Ping(n + 1)`` until ``limit``."""

    limit: int
    seen: list[tuple[float, int, Any]] = field(default_factory=list)

    def on_message(self, src: int, msg: Any, now: float) -> Sequence[Effect]:
        self.seen.append((now, src, msg))
        match msg:
            case Ping(n):
                return [Send(src, Pong(n))]
            case Pong(n) if n + 1 < self.limit:
                return [Send(src, Ping(n + 1))]
            case Pong():
                return []
        raise ProtocolError(f"PingPong: unknown message {msg!r}")

    def on_timer(self, key: Hashable, now: float) -> Sequence[Effect]:
        return []


@dataclass
class Flooder(Core):
    """Floods each new message to its neighbours; delivers once (or on every copy if ``naive``)."""

    me: int
    neighbours: list[int]
    naive: bool = False
    seen: set[tuple[int, int]] = field(default_factory=set)

    def on_message(self, src: int, msg: Any, now: float) -> Sequence[Effect]:
        if not isinstance(msg, Flood):
            raise ProtocolError(f"Flooder: unknown message {msg!r}")
        key = (msg.origin, msg.seq)
        fresh = key not in self.seen
        self.seen.add(key)
        out: list[Effect] = []
        if fresh or self.naive:
            out.append(Deliver(self.me, Item(msg.origin, msg.seq, msg.hops)))
        if fresh:
            nxt = Flood(msg.origin, msg.seq, msg.hops + 1)
            out.extend(Send(n, nxt) for n in self.neighbours if n != src)
        return out

    def on_timer(self, key: Hashable, now: float) -> Sequence[Effect]:
        return []


def random_graph(n: int, degree: int, seed: int) -> list[list[int]]:
    """A connected undirected graph: a ring plus random chords, ``degree`` links per node on average."""
    rng = random.Random(seed)
    adj: list[set[int]] = [{(i - 1) % n, (i + 1) % n} for i in range(n)]
    for i in range(n):
        for _ in range(max(0, degree - 2) // 2):
            j = rng.randrange(n)
            if j != i:
                adj[i].add(j)
                adj[j].add(i)
    return [sorted(a) for a in adj]


def flooding_sim_nodes(n: int, degree: int, *, seed: int = 1, naive: bool = False) -> list[Flooder]:
    return [Flooder(i, nb, naive) for i, nb in enumerate(random_graph(n, degree, seed))]


__all__ = [
    "CancelTimer",
    "Do",
    "Flood",
    "Flooder",
    "Item",
    "Ping",
    "PingPong",
    "Pong",
    "Recorder",
    "SetTimer",
    "flooding_sim_nodes",
    "random_graph",
]
