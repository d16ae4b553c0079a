"""CDM: counter-based distributed matching inside CBDLO's attribute topologies (sans-IO).

How it works (the 004 document, section 4, figure 4):

* First conversion (:func:`enter`). The entry point a walk reached (a real node) looks the
  attribute up in its *virtual node list*: the virtual nodes of that attribute's topology
  it hosts. If it hosts none -- the subscriber left, or its virtual nodes moved, while an
  APT still named it -- the lower-layer search starts again from here with its maximum hops
  halved (:func:`flowbus.routing.crawl.restart`), so repeated misses cannot loop.
* Matching in the tree (:func:`route`). From the hosted virtual node nearest the value,
  the pair climbs the balanced binary tree until the subtree spans the value, then goes
  down to the one virtual node whose sub-range holds it
  (:func:`flowbus.overlay.cbdlo_tree.record_next`, on the records the host holds: see
  :mod:`flowbus.routing.cbdlo_maint`). A step to a virtual node hosted elsewhere is a
  :class:`TreeStep` message; steps between virtual nodes of one host are local. A step to a
  record the host no longer holds (an update in flight) starts the search again, as a
  step to a moved virtual node does; so does a path longer than :data:`MAX_TREE_HOPS`.
* Second conversion. The virtual node found sends a :class:`Matched` to every real node of
  its node list: the nodes with a subscription whose predicate on the attribute holds the
  value (read from the topology's predicates, :meth:`~flowbus.overlay.cbdlo_tree.Topologies.node_list_at`).
* Counting (:func:`on_match`). A subscriber counts, per event and subscription, the
  attributes that matched; when the count reaches the subscription's number of
  attributes it accepts the event (``Deliver``). The document says "when the count
  *exceeds* the subscription's attributes"; a count can never exceed it (one count per
  attribute), so equal is taken as a match. The counts of an event are forgotten
  ``ttl`` time units after its first match (a timer).

Every (event, attribute) search that reaches its virtual node is reported to the host's
``observer`` (``found(...)``) with its lower-layer hops H1 and tree hops H2, the two terms
of the document's matching cost ``|APT| x H1 + 1 x H2`` (section 5.4).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from flowbus.core import Deliver, Effect, Send, SetTimer
from flowbus.overlay.cbdlo_tree import RangeSubscription, Topologies, VRec, record_next
from flowbus.routing.cbdlo_maint import Replica
from flowbus.routing.crawl import Publication, Walk, WalkHost, restart

__all__ = ["Counts", "MatchHost", "Matched", "TreeStep", "enter", "on_match", "on_tree_step", "route"]


@dataclass(frozen=True, slots=True)
class TreeStep:
    """Host to host inside ``walk.attr``'s topology: go on from virtual node ``vid``.

    ``tree_hops``: virtual-node steps so far (H2); ``tries``: how many times this step was
    routed again after meeting a dead host (:func:`retry_later`)."""

    walk: Walk
    vid: int
    tree_hops: int
    tries: int = 0


@dataclass(frozen=True, slots=True)
class Matched:
    """Virtual node to a real node of its node list: ``attr``'s value of ``pub`` is inside
    one of your predicates on ``attr``."""

    pub: Publication
    attr: str
    value: float


class MatchHost(WalkHost, Protocol):
    """What CDM needs of the node it runs on, besides CRAWL's needs."""

    @property
    def topologies(self) -> Topologies: ...

    @property
    def replica(self) -> Replica: ...

    @property
    def subs(self) -> Mapping[Hashable, RangeSubscription]: ...

    @property
    def counts(self) -> Counts: ...

    @property
    def ttl(self) -> float: ...


class Counts:
    """A subscriber's attribute counts: event id -> subscription id -> matched attributes."""

    __slots__ = ("delivered", "matched")

    def __init__(self) -> None:
        self.matched: dict[int, dict[Hashable, set[str]]] = {}
        self.delivered: dict[int, set[Hashable]] = {}

    def forget(self, eid: int) -> None:
        self.matched.pop(eid, None)
        self.delivered.pop(eid, None)


MAX_TREE_HOPS: Final = 128
"""Far above any AVL path (2 x 1.44 log2 of 10^12 virtual nodes): only stale records loop."""


def _nearest(vnodes: list[VRec], value: float) -> VRec:
    def distance(v: VRec) -> float:
        return 0.0 if v.contains(value) else min(abs(v.lo - value), abs(v.hi - value))

    return min(vnodes, key=distance)


def enter(host: MatchHost, walk: Walk) -> list[Effect]:
    """First conversion at the entry point, then matching in the tree."""
    hosted = host.replica.vnodes_of(walk.attr)
    if not hosted:
        return restart(host, walk, reason="departed")
    if host.observer is not None:
        host.observer.walk_ended(walk, "hit", host.addr)
    return route(host, walk, _nearest(hosted, walk.value), 0)


def route(host: MatchHost, walk: Walk, v: VRec, tree_hops: int) -> list[Effect]:
    """From ``v`` (hosted here) towards the virtual node holding the value; at it, the
    second conversion."""
    while True:
        nxt = record_next(v, walk.value)
        if nxt is None:
            break
        tree_hops += 1
        vid, where = nxt
        if tree_hops > MAX_TREE_HOPS:
            return restart(host, walk, reason="stale")
        if where != host.addr:
            return [Send(where, TreeStep(walk, vid, tree_hops))]
        here = host.replica.get(walk.attr, vid)
        if here is None:
            return restart(host, walk, reason="stale")
        v = here
    members = host.topologies.node_list_at(walk.attr, walk.value)
    if host.observer is not None:
        host.observer.found(walk, tree_hops, len(members))
    match = Matched(walk.pub, walk.attr, walk.value)
    effects: list[Effect] = []
    for node in members:
        if node == host.addr:
            effects += on_match(host, match)
        else:
            effects.append(Send(node, match))
    return effects


def on_tree_step(host: MatchHost, step: TreeStep) -> list[Effect]:
    """A tree step arrived; if the virtual node is no longer here (moved, merged away),
    the search starts again from the lower layer with halved hops."""
    v = host.replica.get(step.walk.attr, step.vid)
    if v is None:
        return restart(host, step.walk, reason="departed")
    return route(host, step.walk, v, step.tree_hops)


def on_match(host: MatchHost, m: Matched) -> list[Effect]:
    """Counting: one more matched attribute for each local subscription whose predicate on
    ``m.attr`` holds the value; a subscription with all its attributes matched accepts."""
    eid = m.pub.eid
    counts = host.counts
    effects: list[Effect] = []
    per_sub = counts.matched.get(eid)
    if per_sub is None:
        per_sub = counts.matched[eid] = {}
        effects.append(SetTimer(host.ttl, ("cdm", eid)))
    done = counts.delivered.setdefault(eid, set())
    for sid, sub in host.subs.items():
        if sid in done:
            continue
        r = sub.range_of(m.attr)
        if r is None or not r[0] <= m.value < r[1]:
            continue
        got = per_sub.setdefault(sid, set())
        got.add(m.attr)
        if len(got) == len(sub.ranges):
            done.add(sid)
            effects.append(Deliver(sid, m.pub))
    return effects


def cdm_timer(host: MatchHost, key: Any) -> list[Effect]:
    """The ``("cdm", eid)`` timer: forget the event's counts; ``("cdm", "retry", step, n)``:
    route a tree step that met a dead host again (:func:`retry_later`)."""
    if key[1] == "retry":
        return on_retry(host, key[2], key[3])
    host.counts.forget(key[1])
    return []


RETRY_AFTER: Final = 3.0
"""Time units a host waits before routing again a tree step that met a dead host: the
failure notice, the report to the coordinator and its update (three latencies) fit in it."""
RETRIES: Final = 2


def retry_later(host: MatchHost, step: TreeStep, n: int = 0) -> list[Effect]:
    """A tree step could not reach its host (dead; the caller reports it): route it again
    from here once the coordinator has moved the virtual node (ours: the document has the
    search restart only at an entry point without virtual nodes). After :data:`RETRIES`
    tries the search restarts from the lower layer with halved hops."""
    if n >= RETRIES:
        return restart(host, step.walk, reason="departed")
    return [SetTimer(RETRY_AFTER, ("cdm", "retry", step, n + 1))]


def on_retry(host: MatchHost, step: TreeStep, n: int) -> list[Effect]:
    hosted = host.replica.vnodes_of(step.walk.attr)
    if not hosted:
        return restart(host, step.walk, reason="departed")
    effects = route(host, step.walk, _nearest(hosted, step.walk.value), step.tree_hops)
    return [_numbered(e, n) for e in effects]


def _numbered(e: Effect, n: int) -> Effect:
    """A tree step sent by a retry carries its try number, so a second failure counts."""
    if isinstance(e, Send) and isinstance(e.msg, TreeStep):
        return Send(e.dst, TreeStep(e.msg.walk, e.msg.vid, e.msg.tree_hops, n))
    return e
