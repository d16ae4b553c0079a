"""The chordal reliability ring in the simulator: the machinery of :mod:`flowbus.experiments.ring`.

How it works: :class:`RingSim` puts :class:`~flowbus.overlay.chordal_ring.RingNode` cores
in a :class:`~flowbus.sim.engine.Simulator` whose latency comes from a 2-D coordinate
model, so "the broker with the lowest round-trip time" means something. Failure notices
are on (an acknowledged link reports a dead peer).

- :meth:`RingSim.grow` adds brokers one at a time. Each newcomer pings ``candidates``
  random brokers already in, as the document's ``ping-broker()`` returns a list, and the
  run settles before the next one joins. The messages and distinct brokers each join
  touched are recorded.
- :meth:`RingSim.refresh_chords` builds every broker's chords.
- :meth:`RingSim.drive_load` makes the brokers route events: every ``tick`` each broker
  is told it routed what the state entries it holds then attract (``rate_of(key)`` per
  time unit), so an entry passed on takes its traffic with it. The requests for another
  broker the ring nodes make (``Overloaded``) are kept in :attr:`RingSim.requests`.
- :func:`ring_errors` compares each live broker's pointers and chords with the ring
  computed from global knowledge and lists every difference; a consistent ring gives
  none.

:class:`BrokerRing` grows a ring of :class:`~flowbus.routing.ring_broker.RingBroker` cores
(the ring member plus content routing) the same way, with heartbeats every 5 and the
deliveries recorded. :class:`LinkLatency` is the transport layer of the broker multigraph
(:mod:`flowbus.overlay.multigraph`): a message takes the latency of the link it names, or
is dropped if that link is down.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from flowbus.core import Core, Effect
from flowbus.overlay.chordal_ring import ANNOUNCE, Peer, RingNode
from flowbus.overlay.class_router import Classed, LinkBeat, LinkEcho
from flowbus.overlay.multigraph import Multigraph
from flowbus.overlay.ring_load import Overloaded, ShareAck
from flowbus.overlay.ring_messages import ShareState
from flowbus.routing.ring_broker import RingBroker
from flowbus.sim.engine import Simulator, derive_seed
from flowbus.sim.transport import CoordinateLatency, Host, Layer

__all__ = ["BrokerRing", "JoinCost", "LinkLatency", "LoseShares", "RingSim", "SlowLinks", "ring_errors"]


@dataclass(frozen=True, slots=True)
class JoinCost:
    """What one join took: messages sent, and brokers other than the newcomer that received one."""

    brokers: int
    messages: int
    touched: int


@dataclass
class RingSim:
    """Brokers of one ring in a simulator (see the module note)."""

    seed: int = 1
    backup: int = 2
    heartbeat: float | None = None
    notice: float = 8.0
    probe_timeout: float = 10.0
    candidates: int = 3
    layers: Sequence[Layer] = ()
    node_options: Mapping[str, Any] = field(default_factory=dict)  # more RingNode keywords
    nodes: list[RingNode] = field(default_factory=list)
    joins: list[JoinCost] = field(default_factory=list)
    requests: list[tuple[float, Overloaded]] = field(default_factory=list)

    def __post_init__(self) -> None:
        transport = [CoordinateLatency(base=0.5, scale=2.0), *self.layers]  # 0.5 .. 3.3
        self.sim = Simulator(seed=self.seed, transport=transport, failure_notice=self.notice)
        self.rng = random.Random(self.sim.derive("ring/joins"))
        self._receivers: Counter[int] = Counter()
        self.sim.on_deliver = self._delivered

    def _delivered(self, node: int, sub: Hashable, event: Any, now: float) -> None:
        if sub == ("ring", "overloaded"):
            self.requests.append((now, event))

    @property
    def live(self) -> list[RingNode]:
        return [n for n in self.nodes if not self.sim.is_down(n.addr)]

    def call(self, addr: int, fn: Any) -> None:
        self.sim.invoke(addr, fn)

    def settle(self, span: float = 60.0) -> None:
        """Run until nothing but heartbeats is left (or ``span`` time units pass)."""
        if self.heartbeat is None:
            self.sim.run()
        else:
            self.sim.run(until=self.sim.now + span)

    def grow(self, n: int, *, chords: bool = True) -> RingSim:
        """Add ``n`` brokers, one join at a time."""
        for _ in range(n):
            self._join_one()
        if chords:
            self.refresh_chords()
        return self

    def drive_load(self, rate_of: Callable[[Hashable], float], span: float, *, tick: float = 0.25) -> None:
        """For ``span`` time units, every ``tick``: each broker routed what its state's
        entries attract then (``rate_of(key)`` events per time unit each)."""
        start = self.sim.now
        for i in range(1, int(span / tick) + 1):
            at = start + i * tick
            for nd in self.live:
                self.sim.invoke(nd.addr, partial(_route_load, rate_of, tick, at), at=at)
        self.sim.run(until=start + span)

    def join_through(self, addr: int) -> RingNode:
        """A new broker joins next to the broker at ``addr`` (a cluster answering its request)."""
        node = self._new_node()
        self.call(node.addr, lambda c: c.join([addr]))
        return node

    def _new_node(self) -> RingNode:
        addr = len(self.nodes)
        node = RingNode(
            addr, backup=self.backup, heartbeat=self.heartbeat, probe_timeout=self.probe_timeout,
            ping_timeout=self.probe_timeout, **self.node_options,
        )  # fmt: skip
        self.nodes.append(node)
        self.sim.add_node(addr, _Counting(node, self._receivers))
        return node

    def _join_one(self) -> None:
        addr = self._new_node().addr
        self._receivers.clear()
        sent = self.sim.metrics.total_sent
        if addr == 0:
            self.call(0, lambda c: c.start())
        else:
            live = [nd.addr for nd in self.live if nd.joined]
            picks = sorted(self.rng.sample(live, min(self.candidates, len(live))))
            self.call(addr, lambda c: c.join(picks))
        self.settle(4 * self.probe_timeout)
        touched = sum(1 for a in self._receivers if a != addr)
        self.joins.append(JoinCost(addr + 1, self.sim.metrics.total_sent - sent, touched))

    def refresh_chords(self) -> None:
        for nd in self.live:
            self.call(nd.addr, lambda c: c.refresh_chords())
        self.settle()

    def crash(self, brokers: Iterable[RingNode]) -> None:
        for nd in brokers:
            self.sim.crash(nd.addr)

    def reborn(self, broker: RingNode, through: Sequence[int] = ()) -> RingNode:
        """A new process on crashed ``broker``'s address, not joined yet: if ``broker`` was a
        member, it announces its restart to the member's window and to ``through``."""
        node = RingNode(
            broker.addr, backup=self.backup, heartbeat=self.heartbeat, probe_timeout=self.probe_timeout,
            ping_timeout=self.probe_timeout, nonce=1 + int(self.sim.now * 1000), **self.node_options,
        )  # fmt: skip
        self.nodes[self.nodes.index(broker)] = node
        self.sim.restart(broker.addr, _Counting(node, self._receivers))
        if broker.joined:  # (its old neighbours bury the member it was)
            old = [p.addr for p in broker.window if p.addr != broker.addr]
            self.call(node.addr, lambda c: c.announce(broker.me, [*old, *through]))
        return node

    def restart(self, broker: RingNode, through: Sequence[int]) -> RingNode:
        """A crashed ``broker`` restarted on its address: a new member, joining ``through``
        once the member it was is buried (or it announced in vain)."""
        node = self.reborn(broker, through)
        if broker.joined:
            for _ in range(ANNOUNCE + 1):
                self.sim.run(until=self.sim.now + self.probe_timeout)
                if node.buried is not None:
                    break
        self.call(node.addr, lambda c: c.join(list(through)))
        return node

    def by_id(self) -> list[RingNode]:
        """The live brokers in ring order."""
        return sorted((n for n in self.live if n.joined), key=lambda n: n.me.id)


def _route_load(rate_of: Callable[[Hashable], float], tick: float, at: float, node: RingNode) -> list[Effect]:
    for key in list(node.state):
        node.routed(at, round(rate_of(key) * tick), key)
    return []


class _Counting(Core):
    """A core wrapper counting which brokers receive messages (the brokers a join touched)."""

    def __init__(self, core: RingNode, counter: Counter[int]) -> None:
        self.core = core
        self.counter = counter

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        self.counter[self.core.addr] += 1
        return self.core.on_message(src, msg, now)

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        return self.core.on_timer(key, now)

    def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
        return self.core.on_send_failed(dst, msg, now)

    def on_peer_gone(self, dst: int, now: float) -> list[Effect]:
        return self.core.on_peer_gone(dst, now)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.core, name)


def ring_errors(nodes: Sequence[RingNode], *, chords: bool = False) -> list[str]:
    """Every pointer (and chord) of the live ``nodes`` that differs from the true ring."""
    order = sorted(nodes, key=lambda n: n.me.id)
    k = len(order)
    out: list[str] = []
    for i, nd in enumerate(order):
        truth = {
            "right": order[(i + 1) % k].me if k > 1 else None,
            "rightright": order[(i + 2) % k].me if k > 2 else (order[(i + 1) % k].me if k == 2 else None),
            "left": order[(i - 1) % k].me if k > 1 else None,
            "leftleft": order[(i - 2) % k].me if k > 2 else (order[(i - 1) % k].me if k == 2 else None),
        }
        for name, want in truth.items():
            got: Peer | None = getattr(nd, name)
            if got != want:
                out.append(f"broker {nd.addr} (#{i}): {name} is {got}, should be {want}")
        if chords:
            for level, peer in nd.chords.items():
                want_peer = order[(i + 2**level) % k].me
                if peer != want_peer:
                    out.append(f"broker {nd.addr} (#{i}): chord {level} is {peer}, should be {want_peer}")
    return out


class BrokerRing:
    """Ring brokers in a simulator, grown one join at a time, with deliveries recorded."""

    def __init__(
        self,
        n: int,
        *,
        seed: int,
        backup: int,
        heartbeat: float = 5.0,
        custody: bool = False,
        layers: Sequence[Layer] = (),
        **options: Any,
    ) -> None:
        transport = [CoordinateLatency(0.5, 2.0), *layers]
        self.sim = Simulator(seed=seed, transport=transport, failure_notice=8.0)
        self.got: list[tuple[Hashable, Any, float]] = []
        self.sim.on_deliver = lambda node, sub, event, now: self.got.append((sub, event, now))
        self.brokers: list[RingBroker] = []
        rng = random.Random(derive_seed(seed, "ring-faults/joins"))
        for a in range(n):
            b = RingBroker(
                a,
                backup=backup,
                heartbeat=heartbeat,
                probe_timeout=10.0,
                ping_timeout=10.0,
                custody=custody,
                **options,
            )
            self.brokers.append(b)
            self.sim.add_node(a, b)
            picks = rng.sample(range(a), min(3, a))
            self.sim.invoke(a, partial(_first if a == 0 else _join, picks))
            self.sim.run(until=self.sim.now + 40)

    def settle(self, span: float) -> None:
        self.sim.run(until=self.sim.now + span)

    def order(self) -> list[RingBroker]:
        return sorted((b for b in self.brokers if not self.sim.is_down(b.addr)), key=lambda b: b.ring.me.id)


def _first(picks: list[int], broker: RingBroker) -> list[Effect]:
    return broker.start()


def _join(picks: list[int], broker: RingBroker) -> list[Effect]:
    return broker.join(picks)


class LoseShares:
    """A transport layer: each ``ShareState`` and ``ShareAck`` is lost with probability ``p``
    (reason ``"share lost"``; seeded by the simulator)."""

    def __init__(self, p: float) -> None:
        self.p = p

    def bind(self, host: Host) -> Callable[[int, int, Any, float], float | str] | None:
        if not self.p:
            return None
        draw, p = host.rng("ring/share-loss").random, self.p

        def decide(src: int, dst: int, msg: Any, now: float) -> float | str:
            return "share lost" if type(msg) in (ShareState, ShareAck) and draw() < p else 0.0

        return decide


class SlowLinks:
    """A transport layer: ``slow[frozenset((a, b))]`` more time units on every message
    between ``a`` and ``b`` (either way), for as long as the entry is there."""

    def __init__(self) -> None:
        self.slow: dict[frozenset[int], float] = {}

    def bind(self, host: object) -> Callable[[int, int, Any, float], float | str]:
        slow = self.slow

        def decide(src: int, dst: int, msg: Any, now: float) -> float | str:
            return slow.get(frozenset((src, dst)), 0.0) if slow else 0.0

        return decide


class LinkLatency:
    """A transport layer: a :class:`Classed` message (or a link heartbeat) takes its link's
    latency, or is dropped (reason ``"link"``) if that link is down in ``truth``."""

    def __init__(self, truth: Multigraph) -> None:
        self.truth = truth

    def bind(self, host: object) -> Callable[[int, int, Any, float], float | str]:
        truth = self.truth

        def decide(src: int, dst: int, msg: Any, now: float) -> float | str:
            if not isinstance(msg, Classed | LinkBeat | LinkEcho):
                return 1.0
            if not truth.is_live(msg.link):
                return "link"
            latency = truth.link(msg.link).latency
            return 1.0 if latency is None else latency

        return decide
