"""CRAWL: content-based routing with a labelled trace, CBDLO's lower-layer search (sans-IO).

How it works (the 004 document, section 3, figures 2 and 3):

* Step 1 (:func:`start`). The publisher splits the event into attribute-value pairs and
  starts one random walk (:class:`Walk`) per attribute, all in parallel. The publisher is
  the walk's hop 0: it looks the attribute up in its own access-point table (APT) first
  (the document's step 1 sends straight to a neighbour; looking up first costs nothing
  and never hurts).
* Step 2 (:func:`step`). A node holding a walk looks the attribute up in its APT
  (a node hosting a virtual node of the attribute's topology is itself an entry point):
  2.1 on a hit it sends the walk to the entry point (:class:`Enter`), where CDM
  (:mod:`flowbus.routing.cdm`) takes over, and the search ends; 2.2 otherwise, if the walk
  has made ``max_hops`` hops it stops (a miss); if not, the node adds itself to the walk's
  *trace* (the last ``k`` nodes visited) and forwards it to a random neighbour of its view
  that is not in the trace.
* Blocking and recovery (section 3.2, figure 3). When every neighbour is in the trace the
  path is blocked: the walk restarts from a random node of the trace with its maximum hops
  halved (:func:`restart`), so blocking and recovery cannot loop forever; a walk whose
  halved budget is 0 gives up.
* Failures. A walk sent to a neighbour that turns out dead (the driver's failure notice)
  is retried at once to another neighbour, the dead one dropped from the view; an
  :class:`Enter` sent to a dead entry point makes the sender forget that APT entry and
  restart the search with halved hops (the document's "the subscriber may have left",
  section 4).

The functions act on a :class:`WalkHost` -- the CBDLO node (:class:`flowbus.routing.cbdlo.CbdloNode`)
-- and return effects. The outcome of every walk (hit, expired, gave up) is reported to the
host's ``observer``, if any, for the experiments.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from flowbus.core import Effect, Send
from flowbus.errors import ProtocolError

__all__ = [
    "Enter",
    "Publication",
    "Walk",
    "WalkHost",
    "WalkObserver",
    "on_enter_failed",
    "on_walk_failed",
    "restart",
    "start",
    "step",
]


@dataclass(frozen=True, slots=True)
class Publication:
    """A published event: its id and its attribute-value pairs (sorted by attribute)."""

    eid: int
    values: tuple[tuple[str, float], ...]

    def __post_init__(self) -> None:
        attrs = [a for a, _ in self.values]
        if len(set(attrs)) != len(attrs):
            raise ProtocolError(f"event {self.eid}: an attribute appears twice in {attrs}")
        object.__setattr__(self, "values", tuple(sorted(self.values)))

    @classmethod
    def of(cls, eid: int, values: Mapping[str, float]) -> Publication:
        return cls(eid, tuple(values.items()))

    def as_dict(self) -> dict[str, float]:
        return dict(self.values)


@dataclass(frozen=True, slots=True)
class Walk:
    """The search for ``attr``'s topology, carrying the event ``pub``.

    ``trace``: the last ``k`` nodes visited; ``hops``: hops since this (re)start;
    ``max_hops``: this start's budget (halved at each restart); ``walked``: lower-layer
    hops since the publication, restarts included; ``restarts``: how many restarts.
    """

    pub: Publication
    attr: str
    value: float
    trace: tuple[int, ...]
    hops: int
    max_hops: int
    walked: int = 0
    restarts: int = 0

    def __post_init__(self) -> None:
        if self.hops < 0 or self.max_hops < 0 or self.hops > self.max_hops:
            raise ProtocolError(f"walk for {self.attr!r}: hops {self.hops} of {self.max_hops}")


@dataclass(frozen=True, slots=True)
class Enter:
    """Lower layer to upper layer: the walk found an entry point of ``walk.attr``'s topology."""

    walk: Walk


class WalkObserver(Protocol):
    def walk_ended(self, walk: Walk, outcome: str, node: int) -> None: ...


class WalkHost(Protocol):
    """What CRAWL needs of the node it runs on."""

    addr: int
    rng: random.Random
    trace_len: int
    observer: Any

    def neighbours(self) -> Sequence[int]: ...

    def lookup(self, attr: str) -> int | None: ...

    def forget_entry(self, attr: str, node: int) -> None: ...

    def drop_neighbour(self, node: int) -> None: ...

    def enter(self, walk: Walk) -> list[Effect]: ...


def _end(host: WalkHost, walk: Walk, outcome: str) -> list[Effect]:
    if host.observer is not None:
        host.observer.walk_ended(walk, outcome, host.addr)
    return []


def start(host: WalkHost, pub: Publication, *, max_hops: int) -> list[Effect]:
    """Step 1: one walk per attribute of ``pub``, from ``host`` (hop 0)."""
    if max_hops < 0:
        raise ProtocolError(f"max_hops must be >= 0, got {max_hops}")
    effects: list[Effect] = []
    for attr, value in pub.values:
        effects += step(host, Walk(pub, attr, value, (), 0, max_hops))
    return effects


def step(host: WalkHost, walk: Walk) -> list[Effect]:
    """Step 2 at ``host``: enter the topology on an APT hit, else forward or stop."""
    entry = host.lookup(walk.attr)
    if entry is not None:
        if entry == host.addr:
            return host.enter(walk)
        return [Send(entry, Enter(walk))]
    if walk.hops >= walk.max_hops:
        return _end(host, walk, "expired")
    trace = (*walk.trace, host.addr)[-host.trace_len :] if host.trace_len else ()
    free = [n for n in host.neighbours() if n not in trace and n != host.addr]
    if not free:
        return restart(host, walk, trace=trace, reason="blocked")
    nxt = free[host.rng.randrange(len(free))]
    moved = Walk(walk.pub, walk.attr, walk.value, trace, walk.hops + 1, walk.max_hops,
                 walk.walked + 1, walk.restarts)  # fmt: skip
    return [Send(nxt, moved)]


def restart(host: WalkHost, walk: Walk, *, trace: tuple[int, ...] | None = None, reason: str) -> list[Effect]:
    """Start the search again with half the maximum hops: from a random other node of the
    trace when the path is blocked, from ``host`` otherwise (a missing entry point)."""
    budget = walk.max_hops // 2
    if budget < 1:
        return _end(host, walk, f"gave-up-{reason}")
    trace = walk.trace if trace is None else trace
    again = Walk(walk.pub, walk.attr, walk.value, trace, 0, budget, walk.walked, walk.restarts + 1)
    if reason == "blocked":
        others = [n for n in trace if n != host.addr]
        if others:
            hop = Walk(walk.pub, walk.attr, walk.value, trace, 0, budget, walk.walked + 1, walk.restarts + 1)
            return [Send(others[host.rng.randrange(len(others))], hop)]
    return step(host, again)


def on_walk_failed(host: WalkHost, dst: int, walk: Walk) -> list[Effect]:
    """A walk could not reach neighbour ``dst`` (dead): drop it and choose again, same hop."""
    host.drop_neighbour(dst)
    back = Walk(walk.pub, walk.attr, walk.value, walk.trace[:-1], walk.hops - 1 if walk.hops else 0,
                walk.max_hops, max(walk.walked - 1, 0), walk.restarts)  # fmt: skip
    return step(host, back)


def on_enter_failed(host: WalkHost, dst: int, walk: Walk) -> list[Effect]:
    """The entry point ``dst`` is gone: forget it, search again with halved hops."""
    host.forget_entry(walk.attr, dst)
    return restart(host, walk, reason="departed")
