"""CBDLO's node: the lower layer, CRAWL and CDM of one real node, as one sans-IO core.

How it works (the 004 document, section 2, figure 1): a :class:`CbdloNode` keeps its
Cyclon view and access-point table (:mod:`flowbus.overlay.cyclon`), walks publications
to the attribute topologies with CRAWL (:mod:`flowbus.routing.crawl`) and matches them
there with CDM (:mod:`flowbus.routing.cdm`); it holds the records of the virtual nodes it
hosts and, for the topologies it coordinates or backs up, their trees, kept by the
maintenance protocol (:mod:`flowbus.routing.cbdlo_maint`). :meth:`CbdloNode.on_message`
dispatches on one ``match``; an unknown message raises :class:`~flowbus.errors.ProtocolError`.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from typing import Any

from flowbus.core import Core, Effect, Send, SetTimer
from flowbus.errors import ProtocolError, TopologyError
from flowbus.overlay.cbdlo_tree import AttributeTree, RangeSubscription, Topologies
from flowbus.overlay.cyclon import CYCLON_TIMER, Apt, Cyclon, Descriptor, Shuffle, ShuffleReply
from flowbus.routing import cbdlo_maint as maint
from flowbus.routing import cdm, crawl
from flowbus.routing.cbdlo_maint import Replica, TakeOver, TreeCopy, TreeOp, TreePing, TreeSync, TreeUpdate
from flowbus.routing.cdm import Counts, Matched, TreeStep
from flowbus.routing.crawl import Enter, Publication, Walk

__all__ = ["CbdloNode"]


class CbdloNode(Core):
    """One real node of CBDLO: Cyclon view, APT, CRAWL walker, CDM host and subscriber.

    ``topologies`` is the directory of the attribute topologies (each one's coordinator,
    backup and predicates); ``subs`` the node's local subscriptions (id ->
    :class:`~flowbus.overlay.cbdlo_tree.RangeSubscription`), sent to the topologies by
    :meth:`subscribe`; ``replica`` the records of the virtual nodes it hosts;
    ``coordinating`` / ``backups`` the trees it coordinates / backs up; ``probe`` > 0: a
    coordinator probes its backup that often (:mod:`flowbus.routing.cbdlo_maint`).
    ``observer`` (optional) is told every walk's outcome (``walk_ended``) and every search
    that found its virtual node (``found``).
    """

    __slots__ = (
        "addr", "apt", "backups", "coordinating", "counts", "cyclon", "max_hops", "observer",
        "period", "probe", "replica", "rng", "subs", "topologies", "trace_len", "ttl",
    )  # fmt: skip

    def __init__(
        self,
        addr: int,
        *,
        topologies: Topologies,
        rng: random.Random,
        view_size: int = 10,
        shuffle_len: int = 5,
        apt_size: int = 100,
        trace_len: int = 5,
        max_hops: int = 10,
        period: float = 10.0,
        ttl: float = 1000.0,
        probe: float = 0.0,
        observer: Any = None,
    ) -> None:
        if trace_len < 0 or max_hops < 0 or period <= 0 or ttl <= 0 or probe < 0:
            raise ProtocolError(f"CBDLO node {addr}: bad trace_len, max_hops, period, ttl or probe")
        self.addr = addr
        self.rng = rng
        self.topologies = topologies
        self.cyclon = Cyclon(addr, size=view_size, shuffle_len=shuffle_len, rng=rng)
        self.apt = Apt(apt_size)
        self.trace_len = trace_len
        self.max_hops = max_hops
        self.period = period
        self.ttl = ttl
        self.probe = probe
        self.observer = observer
        self.subs: dict[Hashable, RangeSubscription] = {}
        self.counts = Counts()
        self.replica = Replica()
        self.coordinating: dict[str, AttributeTree] = {}
        self.backups: dict[str, AttributeTree] = {}

    # -- local API ----------------------------------------------------------------------

    def start(self) -> list[Effect]:
        """Start gossiping (the first shuffle after a random fraction of a period) and, if
        probing is on, probing the topologies it coordinates or backs up."""
        return [SetTimer(self.rng.random() * self.period, CYCLON_TIMER), *maint.start_probes(self)]

    def publish(self, pub: Publication) -> list[Effect]:
        return crawl.start(self, pub, max_hops=self.max_hops)

    def subscribe(self, sub: RangeSubscription) -> list[Effect]:
        """Send each predicate of ``sub`` to its attribute's coordinator."""
        if sub.node != self.addr:
            raise ProtocolError(f"node {self.addr} cannot subscribe for node {sub.node}")
        if sub.sid in self.subs:
            raise TopologyError(f"node {self.addr} already has a subscription {sub.sid!r}")
        topo = self.topologies
        for attr, lo, hi in sub.ranges:
            if not max(lo, topo.lo) < min(hi, topo.hi):
                raise TopologyError(f"subscription {sub.sid!r}: [{lo}, {hi}) misses the values of {attr!r}")
        self.subs[sub.sid] = sub
        effects: list[Effect] = []
        for attr, lo, hi in sub.ranges:
            effects += maint.submit(self, TreeOp(attr, "add", self.addr, max(lo, topo.lo), min(hi, topo.hi)))
        return effects

    def unsubscribe(self, sid: Hashable) -> list[Effect]:
        sub = self.subs.pop(sid, None)
        if sub is None:
            raise TopologyError(f"node {self.addr} has no subscription {sid!r}")
        topo = self.topologies
        effects: list[Effect] = []
        for attr, lo, hi in sub.ranges:
            effects += maint.submit(
                self, TreeOp(attr, "remove", self.addr, max(lo, topo.lo), min(hi, topo.hi))
            )
        return effects

    # -- what CRAWL and CDM need ----------------------------------------------------------

    def neighbours(self) -> list[int]:
        return self.cyclon.neighbours()

    def lookup(self, attr: str) -> int | None:
        if self.replica.hosts(attr):
            return self.addr
        return self.apt.lookup(attr)

    def forget_entry(self, attr: str, node: int) -> None:
        self.apt.forget(attr, node)

    def drop_neighbour(self, node: int) -> None:
        self.cyclon.view.pop(node, None)

    def enter(self, walk: Walk) -> list[Effect]:
        return cdm.enter(self, walk)

    def descriptor(self) -> Descriptor:
        return Descriptor(self.addr, 0, self.replica.attrs())

    def _learn(self, entries: Sequence[Descriptor]) -> None:
        for d in entries:
            if d.node != self.addr:
                for attr in d.attrs:
                    self.apt.learn(attr, d.node)

    # -- the core -------------------------------------------------------------------------

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        match msg:
            case Walk():
                return crawl.step(self, msg)
            case Enter():
                return cdm.enter(self, msg.walk)
            case TreeStep():
                return cdm.on_tree_step(self, msg)
            case Matched():
                return cdm.on_match(self, msg)
            case Shuffle():
                self._learn(msg.entries)
                return [Send(src, self.cyclon.answer(src, msg))]
            case ShuffleReply():
                self._learn(msg.entries)
                self.cyclon.reply(src, msg)
                return []
            case TreeOp():
                return maint.on_op(self, msg)
            case TreeUpdate():
                return maint.on_update(self, msg)
            case TreeSync():
                return maint.on_sync(self, msg)
            case TreeCopy():
                return maint.on_copy(self, msg)
            case TakeOver():
                return maint.on_takeover(self, msg)
            case TreePing():
                return maint.on_ping(self, msg)
            case _:
                raise ProtocolError(f"CBDLO node {self.addr}: unknown message {msg!r} from {src}")

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        if key == CYCLON_TIMER:
            effects: list[Effect] = [SetTimer(self.period, CYCLON_TIMER)]
            out = self.cyclon.start_shuffle(self.descriptor())
            if out is not None:
                effects.append(Send(out[0], out[1]))
            return effects
        if isinstance(key, tuple) and key and key[0] == "cdm":
            return cdm.cdm_timer(self, key)
        if isinstance(key, tuple) and len(key) == 3 and key[0] == maint.TIMER:
            return maint.on_timer(self, key)
        raise ProtocolError(f"CBDLO node {self.addr}: unknown timer {key!r}")

    def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
        match msg:
            case Walk():
                return crawl.on_walk_failed(self, dst, msg)
            case Enter():
                return maint.report_down(self, msg.walk.attr, dst) + crawl.on_enter_failed(
                    self, dst, msg.walk
                )
            case TreeStep():
                return maint.report_down(self, msg.walk.attr, dst) + cdm.retry_later(self, msg, msg.tries)
            case Matched():
                return maint.report_down(self, msg.attr, dst)
            case Shuffle():
                self.cyclon.pending.pop(dst, None)
                return []
            case _:
                return maint.on_failed(self, dst, msg)
