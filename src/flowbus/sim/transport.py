"""Transport layers: what happens to each ``Send`` between two simulated nodes.

How it works: a transport is a chain of layers. When the simulator binds a layer
it hands it a :class:`Host` (the simulator: seeded random streams, crash
scheduling) and gets back a *decide* function ``(src, dst, msg, now) -> float |
str``, or ``None`` if the layer has no per-send work (a crash schedule, a loss
probability of 0). A float is extra delay added to the message; a ``str`` drops
the message and names why (``"loss"``, ``"link"``, ``"partition"``...). The
:class:`Chain` runs the decide functions in order, stops at the first drop and
sums the delays, so a send costs one small Python call per active layer.

* :class:`ConstantLatency`, :class:`UniformLatency`, :class:`CoordinateLatency`
  (random points in a unit square, ``base + distance * scale``) -- delays.
* :class:`Loss` -- drops each message with probability ``p`` (seeded).
* :class:`Crashes` -- crashes nodes at given times (the simulator then drops
  every message to them and stops their timers).
* :class:`LinkFailure` -- a mutable set of broken links, directed or both ways.
* :class:`Partition` -- groups of nodes; messages across groups are dropped.

Randomness comes only from ``host.rng(name)`` / ``host.derive(name)``, so a
run is a function of the master seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from flowbus.errors import TransportError

__all__ = [
    "Chain",
    "ConstantLatency",
    "CoordinateLatency",
    "Crashes",
    "Decide",
    "Host",
    "Layer",
    "LinkFailure",
    "Loss",
    "Partition",
    "TransportError",
    "UniformLatency",
    "coordinate_of",
]

Decide = Callable[[int, int, Any, float], "float | str"]
"""``(src, dst, msg, now) -> extra delay`` or a drop reason."""

_UNIT = 1.0 / (1 << 53)


class Host(Protocol):
    """What a layer may ask of the simulator that binds it."""

    def rng(self, name: str) -> random.Random: ...

    def derive(self, name: str) -> int: ...

    def crash(self, node: int, *, at: float | None = None) -> None: ...


class Layer(Protocol):
    """A transport layer: bound once, then asked about every send."""

    def bind(self, host: Host) -> Decide | None: ...


class Chain:
    """The bound layers of one simulator, applied in order to each send."""

    __slots__ = ("_decides", "fate")

    def __init__(self, layers: Sequence[Layer], host: Host) -> None:
        found = (layer.bind(host) for layer in layers)
        self._decides: tuple[Decide, ...] = tuple(d for d in found if d is not None)
        self.fate: Decide = self._pick()

    def _pick(self) -> Decide:
        if not self._decides:
            return _no_delay
        if len(self._decides) == 1:
            return self._decides[0]
        return self._run_all

    def _run_all(self, src: int, dst: int, msg: Any, now: float) -> float | str:
        delay = 0.0
        for decide in self._decides:
            r = decide(src, dst, msg, now)
            if r.__class__ is str:
                return r
            delay += r  # type: ignore[operator]
        return delay


def _no_delay(src: int, dst: int, msg: Any, now: float) -> float | str:
    return 0.0


@dataclass(frozen=True, slots=True)
class ConstantLatency:
    """Every message takes ``delay`` time units."""

    delay: float = 1.0

    def __post_init__(self) -> None:
        if not self.delay >= 0:
            raise TransportError(f"ConstantLatency: the delay must be >= 0, got {self.delay!r}")

    def bind(self, host: Host) -> Decide | None:
        delay = float(self.delay)

        def decide(src: int, dst: int, msg: Any, now: float) -> float | str:
            return delay

        return decide


@dataclass(frozen=True, slots=True)
class UniformLatency:
    """Each message takes a delay drawn uniformly from ``[low, high]`` (seeded)."""

    low: float
    high: float
    stream: str = "latency"

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.high:
            raise TransportError(f"UniformLatency: need 0 <= low <= high, got {self.low!r}, {self.high!r}")

    def bind(self, host: Host) -> Decide | None:
        draw = host.rng(self.stream).random
        low, span = float(self.low), float(self.high - self.low)

        def decide(src: int, dst: int, msg: Any, now: float) -> float | str:
            return low + span * draw()

        return decide


@dataclass(frozen=True, slots=True)
class CoordinateLatency:
    """Nodes sit at random points of the unit square; latency = ``base + distance * scale``.

    A node's point is derived from the master seed and its id alone, so it does
    not depend on the order in which nodes first send.
    """

    base: float = 0.0
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not (self.base >= 0 and self.scale >= 0):
            raise TransportError(
                f"CoordinateLatency: base and scale must be >= 0, got {self.base!r}, {self.scale!r}"
            )

    def bind(self, host: Host) -> Decide | None:
        return _Coordinates(host, float(self.base), float(self.scale)).latency


class _Coordinates:
    __slots__ = ("_base", "_host", "_points", "_scale")

    def __init__(self, host: Host, base: float, scale: float) -> None:
        self._host = host
        self._base = base
        self._scale = scale
        self._points: dict[int, tuple[float, float]] = {}

    def point(self, node: int) -> tuple[float, float]:
        p = self._points.get(node)
        if p is None:
            bits = self._host.derive(f"coord/{node}")
            p = ((bits & ((1 << 53) - 1)) * _UNIT, ((bits >> 64) & ((1 << 53) - 1)) * _UNIT)
            self._points[node] = p
        return p

    def latency(self, src: int, dst: int, msg: Any, now: float) -> float | str:
        points = self._points
        a = points.get(src) or self.point(src)
        b = points.get(dst) or self.point(dst)
        return self._base + math.hypot(a[0] - b[0], a[1] - b[1]) * self._scale


def coordinate_of(layer: CoordinateLatency, host: Host, node: int) -> tuple[float, float]:
    """The point ``layer`` gives ``node`` under ``host``'s seed (for tests and plots)."""
    return _Coordinates(host, layer.base, layer.scale).point(node)


@dataclass(frozen=True, slots=True)
class Loss:
    """Drops each message with probability ``p`` (reason ``"loss"``)."""

    p: float
    stream: str = "loss"

    def __post_init__(self) -> None:
        if not 0 <= self.p <= 1:
            raise TransportError(f"Loss: p must be in [0, 1], got {self.p!r}")

    def bind(self, host: Host) -> Decide | None:
        if self.p == 0:
            return None
        draw = host.rng(self.stream).random
        p = float(self.p)

        def decide(src: int, dst: int, msg: Any, now: float) -> float | str:
            return "loss" if draw() < p else 0.0

        return decide


@dataclass(frozen=True, slots=True)
class Crashes:
    """Crashes each node of ``schedule`` at its time (node -> time); no per-send work."""

    schedule: Mapping[int, float]

    def bind(self, host: Host) -> Decide | None:
        for node, at in sorted(self.schedule.items()):
            host.crash(node, at=at)
        return None


class LinkFailure:
    """A mutable set of broken links; a message over one is dropped (reason ``"link"``).

    With ``directed=False`` failing ``(a, b)`` also breaks ``(b, a)``.
    """

    __slots__ = ("_down", "directed")

    def __init__(self, links: Iterable[tuple[int, int]] = (), *, directed: bool = False) -> None:
        self.directed = directed
        self._down: set[tuple[int, int]] = set()
        for a, b in links:
            self.fail(a, b)

    def fail(self, a: int, b: int) -> None:
        self._down.add((a, b))
        if not self.directed:
            self._down.add((b, a))

    def restore(self, a: int, b: int) -> None:
        self._down.discard((a, b))
        if not self.directed:
            self._down.discard((b, a))

    def is_down(self, a: int, b: int) -> bool:
        return (a, b) in self._down

    def bind(self, host: Host) -> Decide | None:
        down = self._down

        def decide(src: int, dst: int, msg: Any, now: float) -> float | str:
            return "link" if (src, dst) in down else 0.0

        return decide


class Partition:
    """Groups of nodes; a message between two groups is dropped (reason ``"partition"``).

    Nodes in no group form one more group together. ``split`` changes the groups
    and ``heal`` removes them, at any time (e.g. from ``Simulator.schedule``).
    """

    __slots__ = ("_group",)

    def __init__(self, groups: Iterable[Iterable[int]] = ()) -> None:
        self._group: dict[int, int] = {}
        self.split(groups)

    def split(self, groups: Iterable[Iterable[int]]) -> None:
        self._group.clear()
        for i, group in enumerate(groups):
            for node in group:
                if node in self._group:
                    raise TransportError(f"Partition: node {node} is in two groups")
                self._group[node] = i

    def heal(self) -> None:
        self._group.clear()

    def bind(self, host: Host) -> Decide | None:
        group = self._group

        def decide(src: int, dst: int, msg: Any, now: float) -> float | str:
            if group and group.get(src, -1) != group.get(dst, -1):
                return "partition"
            return 0.0

        return decide
