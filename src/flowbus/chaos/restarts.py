"""Random restart schedules in the simulator: the campaign's crash-and-rejoin faults on the
ring's own cores, many schedules a minute, each replayable from its seed.

The campaign (:mod:`flowbus.chaos.campaign`) strikes real brokers, a few minutes a run; a
run's losses are traced by hand. The same protocol core (:class:`RingBroker` in custody,
``local_ack``) runs here in the discrete-event simulator (:mod:`flowbus.sim`), where one
schedule takes seconds and any schedule that goes wrong can be run again, event by event,
from its seed.

How it works: :class:`CustodyRing` is a ring of brokers in custody whose "clients" settle
each delivery ``ack_delay`` later. :func:`streaming` sets up the workload of one schedule:
5 brokers, two subscriptions each (``x = (broker + k) % 4``), two publishers (the first
two brokers in ring order, or the two at ``publishers``: the 2nd and 3rd put the lowest
broker and the pairs across the ring's wrap among the victims) publishing ``n`` events at
50 a second, and, with ``flow``, the campaign's flow deployed and fed. :func:`restarts`
runs schedule ``seed``: from 4 s on, every 8 to 20 s, one broker or two adjacent ones
(neither publisher's) crash for 1-4 s or 14-25 s and come back as new members on their
addresses (:meth:`CustodyRing.restart_soon`, as a broker process restarted on its data
does); on the brokers' clocks the others hear of a crashed one's closed connections at
once (``on_link_lost``: a process killed or stopped, its sockets close with it); then it
runs to quiet. :func:`judge` reads what happened: deliveries lost (filters evaluated
offline), out of order (a delivery after a later one of the same publisher, per
subscription), delivered to a subscription that did not ask (``wrong``), publishes never
settled, deliveries to anything but a client's subscription (``unserved``: a broker's
queues never settle those, so their publishes are never acknowledged), brokers not joined,
ring pointers that disagree. A schedule is *bad* when any of those is not zero. A schedule
runs on one of two clocks (:data:`TIMERS`): slow links and slow failure detection
(``sim``), or the broker network's own (``broker``). ``flowbus chaos sim`` runs
:class:`RestartSchedules` (:func:`run_schedules`, in ``--jobs`` processes side by side:
the same rows): one row per seed to ``rows.csv``, the document to ``result.json``, a plot
to ``chaos-sim.png``.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from functools import partial
from operator import methodcaller
from pathlib import Path
from typing import Any, ClassVar

from flowbus.chaos.workload import FLOW, event_of
from flowbus.core import Core, Effect, Outcome, Settled
from flowbus.errors import ExperimentError
from flowbus.experiments.config import config_dict, integer
from flowbus.experiments.output import Csv, OutputFiles, ProgressFn, Result, pyplot, save
from flowbus.experiments.ring_sim import ring_errors
from flowbus.filters import Filter, parse
from flowbus.flow.deploy import Deployment
from flowbus.meta import EVENT_ID, SPACE
from flowbus.routing.ring_broker import RingBroker
from flowbus.sim import CoordinateLatency, Simulator

__all__ = [
    "TIMERS",
    "CustodyRing",
    "RestartSchedules",
    "Timers",
    "judge",
    "lost",
    "out_of_order",
    "restarts",
    "run_schedules",
    "streaming",
]

RATE = 50
"""Events a second of the two publishers together."""


@dataclass(frozen=True, slots=True)
class Timers:
    """A schedule's clocks: the brokers' heartbeat and probe timeouts, the links' latency
    (``base + distance * scale`` seconds, :class:`~flowbus.sim.CoordinateLatency`), how soon a
    send to a dead broker is reported failed, and how long a client takes to settle."""

    heartbeat: float
    probe: float
    base: float
    scale: float
    failure_notice: float
    ack_delay: float
    closes: bool = False  # a crashed broker's connections close at once (on_link_lost at the others)
    grouped: bool = False  # an event's local deliveries in one effect, as the broker's driver has them


TIMERS = {
    "sim": Timers(heartbeat=5.0, probe=10.0, base=0.5, scale=2.0, failure_notice=8.0, ack_delay=0.5),
    "broker": Timers(
        heartbeat=1.0,
        probe=2.0,
        base=0.001,
        scale=0.004,
        failure_notice=0.01,
        ack_delay=0.02,
        closes=True,
        grouped=True,
    ),
}
"""``sim``: slow links (0.5-2.5 s) and slow failure detection, where many events are under
way at each crash. ``broker``: the broker network's own clocks (1 s heartbeats, probes of
2 s, links of a few ms, a refused connection reported at once), where a crash is found in
milliseconds and the ring repaired while the events sent into it are still coming back; it
found a loss the other did not (a ``Delegated`` to a dead home, :meth:`RingBroker._bury`)."""

Subs = dict[tuple[int, int], Filter]


class CustodyRing:
    """Ring brokers in custody mode; the 'clients' settle each delivery ``ack_delay`` later."""

    def __init__(
        self,
        n: int,
        seed: int,
        ack_delay: float = 3.0,
        grouped: bool = False,
        layers: tuple[Any, ...] = (),
        timers: Timers = TIMERS["sim"],
    ) -> None:
        self.timers = timers
        transport = [CoordinateLatency(timers.base, timers.scale), *layers]
        self.sim = Simulator(seed=seed, transport=transport, failure_notice=timers.failure_notice)
        self.got: list[tuple[int, Hashable, Any]] = []
        self.taken_at: dict[tuple[Hashable, Any], float] = {}  # (sub, event id) -> first delivery
        self.notices: list[tuple[int, Hashable, Any]] = []
        self.clients: set[Hashable] = set()  # the clients' subscriptions (see _delivered)
        self.unserved: list[tuple[int, Hashable, Any]] = []  # deliveries to anything else
        self.step_down = False  # a broker told it was found dead steps down (see _step_down)
        self.stepped_down: list[int] = []  # brokers that did
        self.derived: set[tuple[int, str]] = set()  # subscriptions to a flow's derived space (see _delivered)
        self.log: list[tuple[float, str, int]] = []  # (time, what, broker): the faults and comebacks
        self.after_join: Callable[[int, list[int]], object] | None = None  # (broker, its old window)
        self._rejoining: dict[int, list[int]] = {}  # stepped down, joining once buried -> through whom
        self._nonces = iter(range(100_000, 10**9))
        self.ack_delay = ack_delay
        self.grouped = grouped
        self.sim.on_deliver = self._delivered
        self.sim.on_outcome = self._outcome
        self._settled: dict[Core, list[Hashable]] = {}  # broker -> the ids of its publishes settled
        self.brokers: list[RingBroker] = []
        rng = random.Random(seed)
        for a in range(n):
            b = self._broker(a)
            self.brokers.append(b)
            self.sim.add_node(a, b)
            picks = rng.sample(range(a), min(3, a))
            self.sim.invoke(a, methodcaller("start") if a == 0 else methodcaller("join", picks))
            self.sim.run(until=self.sim.now + 8 * timers.heartbeat)

    def _broker(self, addr: int, nonce: int = 0) -> RingBroker:
        t = self.timers
        return RingBroker(addr, backup=2, heartbeat=t.heartbeat, probe_timeout=t.probe, ping_timeout=t.probe,
                          custody=True, local_ack=True, grouped=self.grouped, nonce=nonce)  # fmt: skip

    def _outcome(self, node: int, outcome: Outcome, now: float) -> None:
        if type(outcome) is Settled:
            self._settled.setdefault(self.sim.core(node), []).extend(outcome.ids)

    def settled_of(self, broker: RingBroker) -> list[Hashable]:
        """The ids of the events published at ``broker`` it reported settled, in order."""
        return self._settled.get(broker, [])

    def _delivered(self, node: int, sub: Hashable, event: Any, now: float) -> None:
        if type(sub) is tuple and sub[:1] == ("ring",):  # (the ring's notices to the driver)
            self.notices.append((node, sub, event))
            if sub == ("ring", "dead") and self.step_down:
                self._step_down(node, now)
            elif sub == ("ring", "buried") and node in self._rejoining:  # (its old self is buried:
                window = self._rejoining.pop(node)
                self.sim.invoke(node, methodcaller("join", window))  # it joins)
                self.log.append((now, "joins", node))
                if self.after_join is not None:
                    self.after_join(node, window)
            return
        if self.clients and sub not in self.clients:  # (a broker's queues serve its clients'
            self.unserved.append((node, sub, event[EVENT_ID]))  # subscriptions only: a delivery
            return  # to anything else, a flow's partition say, is never settled there)
        eid = (DERIVED, event["quantity"]) if sub in self.derived else event[EVENT_ID]  # (a derived
        self.got.append((node, sub, eid))  # event is known by the one it came from)
        self.taken_at.setdefault((sub, eid), now)
        self.sim.invoke(node, methodcaller("settle", sub, event[EVENT_ID]), at=now + self.ack_delay)

    def pause(self, addr: int, length: float, what: str) -> None:
        """The broker at ``addr`` (whoever is there now, if alive) paused ``length`` from now,
        logged as ``what``."""
        if not self.sim.is_down(addr):
            self.sim.pause(addr, self.sim.now + length)
            self.log.append((self.sim.now, f"{what} {length:.2f}", addr))

    def _step_down(self, addr: int, now: float) -> None:
        """The broker at ``addr``, told it was found dead, steps down at once (as a broker
        process does): its connections close (each broker linked to it hears so, on the
        broker network's clocks), and a new member on its address announces the one it
        was, then joins through the brokers that one knew once it is buried."""
        self.sim.crash(addr)  # (now: nothing more of the old one's step is carried out)
        self.stepped_down.append(addr)
        self.log.append((now, "stepped down", addr))
        self.sim.schedule(now, partial(self._come_back, addr, now))

    def _come_back(self, addr: int, now: float) -> None:
        old = next(b for b in self.brokers if b.addr == addr)
        new = self._broker(addr, next(self._nonces))
        self.sim.restart(addr, new)
        self.brokers[self.brokers.index(old)] = new
        if self.timers.closes:
            for b in self.brokers:
                if b.addr != addr and b.ring.joined:
                    self.sim.invoke(b.addr, methodcaller("on_link_lost", addr, now))
        self._rejoining[addr] = [p.addr for p in old.ring.window if p.addr != addr]
        self.sim.invoke(addr, partial(_announce, old, self._rejoining[addr]))

    def order(self) -> list[RingBroker]:
        return sorted(self.brokers, key=lambda b: b.ring.me.id)

    def subscribe(self, subs: dict[tuple[int, int], Any]) -> None:
        """Each ``(broker, k)`` subscribes with its filter at that broker; the tables settle."""
        self.clients.update(subs)
        for s in subs:
            self.sim.invoke(s[0], methodcaller("subscribe", s, subs[s]))
        self.sim.run(until=self.sim.now + 60)

    def restart(self, old: RingBroker, nonce: int, contact: int) -> RingBroker:
        """A new broker on the crashed ``old`` one's address: it announces the member it was,
        and joins the ring through ``contact`` 40 s later (as a broker process does)."""
        new = self._broker(old.addr, nonce)
        self.sim.restart(old.addr, new)
        self.brokers[self.brokers.index(old)] = new
        window = [p.addr for p in old.ring.window]
        self.sim.invoke(new.addr, partial(_announce, old, window))
        self.sim.run(until=self.sim.now + 40)
        self.sim.invoke(new.addr, methodcaller("join", [contact]))
        return new

    def restart_soon(self, olds: list[RingBroker], nonce: int) -> list[RingBroker]:
        """As :meth:`restart`, for each of ``olds`` at once, but each new broker joins as a
        broker process does: as soon as a broker told of its restart answers that the old one
        is dead (its ``buried`` notice), through the brokers it knew."""
        news: dict[int, tuple[RingBroker, list[int]]] = {}
        for i, old in enumerate(olds):
            new = self._broker(old.addr, nonce + i)
            self.sim.restart(old.addr, new)
            self.brokers[self.brokers.index(old)] = new
            window = [p.addr for p in old.ring.window if p.addr != old.addr]
            self.sim.invoke(new.addr, partial(_announce, old, window))
            news[new.addr] = (new, window)
        waiting, until, seen = set(news), self.sim.now + 120, len(self.notices)
        while waiting and self.sim.now < until:
            self.sim.run(until=self.sim.now + 0.25)
            for node, sub, _ in self.notices[seen:]:  # (not a notice of an earlier restart there)
                if sub == ("ring", "buried") and node in waiting:
                    waiting.discard(node)
                    self.sim.invoke(node, methodcaller("join", news[node][1]))
        return [new for new, _ in news.values()]

    def stream(self, pub: RingBroker, n: int) -> float:
        """``pub`` publishes ``{"x": i % 3}`` as ``("p", i)``, 20 a second from now (returned)."""
        start = self.sim.now
        for i in range(n):
            self.sim.invoke(
                pub.addr, methodcaller("publish", {"x": i % 3}, event_id=("p", i)), at=start + i / 20
            )
        return start


DERIVED = "big"
"""The flow's derived space the schedules with ``derived`` subscribe to (``x`` of the stream's
events is not in it: these are the flow's own events, derived from the ``fpub`` ones)."""


def _ring_id(broker: RingBroker) -> int:
    return broker.ring.me.id


def _announce(old: RingBroker, window: list[int], new: RingBroker) -> list[Effect]:
    return new.ring.announce(old.ring.me, window)


def _deploy(deployment: Deployment, broker: RingBroker) -> list[Effect]:
    return broker.deploy(deployment, nonce=1)[1]


def streaming(
    seed: int,
    *,
    flow: bool,
    n: int,
    timers: str = "sim",
    publishers: tuple[int, ...] = (0, 1),
    derived: bool = False,
) -> tuple[CustodyRing, Subs, list[int], float]:
    """Schedule ``seed``'s workload, set to start now (see the module note): the ring, the
    subscriptions, the publishers' brokers and the stream's start (``timers``: see
    :data:`TIMERS`; ``publishers``: the places in ring order of the two publishers' brokers;
    ``derived``, with ``flow``: each broker also subscribes to the flow's :data:`DERIVED`
    space, whose events keep ``fpub``'s order and are judged too)."""
    clocks = TIMERS[timers]
    w = CustodyRing(5, seed=seed, ack_delay=clocks.ack_delay, grouped=clocks.grouped, timers=clocks)
    if flow:
        deployment = Deployment.from_text(FLOW)
        w.sim.invoke(0, partial(_deploy, deployment))
        w.sim.run(until=w.sim.now + 60)
    order = w.order()
    subs = {(b.addr, k): parse(f"x = {(b.addr + k) % 4}") for b in order for k in range(2)}
    if flow and derived:
        w.derived = {(b.addr, DERIVED) for b in order}
        for sid in sorted(w.derived):
            w.sim.invoke(sid[0], methodcaller("subscribe_flow", sid, DERIVED))
    w.subscribe(subs)
    w.clients.update(w.derived)
    w.got.clear()
    pubs = [order[publishers[0]].addr, order[publishers[1]].addr]
    start = w.sim.now
    for i in range(n):
        at = start + i / RATE
        event_id = (f"p{i % 2}", i)
        w.sim.invoke(pubs[i % 2], methodcaller("publish", {"x": i % 4}, event_id=event_id), at=at)
        if flow and i % 3 == 0:
            ev = {**event_of(2, i + 1), SPACE: "trades"}
            w.sim.invoke(pubs[0], methodcaller("publish", ev, event_id=("fpub", i)), at=at + 0.001)
    return w, subs, pubs, start


FAULTS = ("crash", "pause", "starve", "rejoin")
"""What a schedule does to its victims: ``crash`` (killed, back on their addresses as new
members), ``pause`` (stopped, as SIGSTOP does, then running on: see :func:`restarts`),
``starve``: ``pause``, and hiccups besides (any broker, publishers' too, stopped for a
moment now and then, as one starved of CPU is: :func:`_hiccups`), or ``rejoin``: two
brokers at any distance killed, and a member killed with another as it joins again
(:func:`_rejoin`)."""


PAUSES = ("pause", "starve")
"""The faults that pause their victims (the others kill them)."""


def restarts(
    seed: int,
    *,
    flow: bool,
    n: int = 2500,
    timers: str = "sim",
    publishers: tuple[int, ...] = (0, 1),
    faults: str = "crash",
    derived: bool = False,
) -> tuple[CustodyRing, Subs, list[int], int]:
    """Schedule ``seed`` (see the module note), run to quiet: the ring, the subscriptions, the
    publishers' brokers and the number of brokers struck.

    With ``faults="pause"`` the victims are paused, not crashed: ``quick``, for 2.5 to 3.9
    heartbeats (their lease runs out, and the events that waited for them come back
    ``Declined``; too short to be found dead); ``slow``, for 5 to 20 heartbeats (found dead:
    back, each reads its backlog late, is told so, steps down and joins again as a new
    member, :meth:`CustodyRing.restart_soon`). ``starve`` adds :func:`_hiccups`."""
    rng = random.Random(seed)
    w, subs, pubs, start = streaming(
        seed, flow=flow, n=n, timers=timers, publishers=publishers, derived=derived
    )
    w.step_down = faults != "crash"  # (crash schedules as they were: they pin traced runs)
    if faults == "starve":
        _hiccups(w, random.Random(seed + 1_000_003), start, start + n / RATE, pubs)
        w.after_join = partial(_neighbour_hiccup, w, random.Random(seed + 2_000_003), pubs)
    t, nonce, struck = 4.0, 40, 0
    beat = w.timers.heartbeat
    while faults == "rejoin" and t < n / RATE - 15:
        w.sim.run(until=start + t)
        nonce += 20
        struck += _rejoin(w, rng, pubs, nonce)
        t = (w.sim.now - start) + rng.uniform(6, 12)
    while faults != "rejoin" and t < n / RATE - 10:
        kind = rng.choice(["quick", "slow", "pair-quick", "pair-slow"])
        if faults != "crash":
            down = rng.uniform(2.5, 3.9) * beat if "quick" in kind else rng.uniform(5, 20) * beat
        else:
            down = rng.uniform(1, 4) if "quick" in kind else rng.uniform(14, 25)
        w.sim.run(until=start + t)
        live = sorted((b for b in w.brokers if b.ring.joined and b.addr not in pubs), key=_ring_id)
        i0 = rng.randrange(len(live))
        picked = [live[i0], live[(i0 + 1) % len(live)]] if kind.startswith("pair") else [live[i0]]
        victims = list({v.addr: v for v in picked}.values())
        struck += len(victims)
        nonce += 2
        if faults != "crash":
            _pause(w, victims, down)
        else:
            _crash(w, victims, down, nonce)
        t = (w.sim.now - start) + rng.uniform(8, 20)
    w.sim.run(until=start + n / RATE + 400)
    return w, subs, pubs, struck


def _rejoin(w: CustodyRing, rng: random.Random, pubs: list[int], nonce: int) -> int:
    """Two brokers (neither publisher's, at any distance) killed at once, back 1 to 4 s later
    as new members; as soon as one has joined, 0 to 0.2 s on, it dies with another broker,
    back 2 to 6 s later (the campaign's crash-1 at ``f11c79d``: a member killed 80 ms after it
    joined, with the broker two places away, 124 deliveries lost). How many were killed."""
    live = [b for b in w.brokers if b.ring.joined and b.addr not in pubs]
    if len(live) < 2:
        return 0
    news = _crash(w, rng.sample(live, 2), rng.uniform(1, 4), nonce)
    for _ in range(300):  # (restart_soon returns as the first is buried: its join is under way)
        if any(b.ring.joined for b in news):
            break
        w.sim.run(until=w.sim.now + 0.01)
    w.sim.run(until=w.sim.now + rng.uniform(0.0, 0.2))
    joined = [b for b in news if b.ring.joined]
    others = [b for b in w.brokers if b.ring.joined and b.addr not in pubs and b not in joined]
    if not joined or not others:
        return 2
    victims = [joined[0], rng.choice(others)]
    _crash(w, victims, rng.uniform(2, 6), nonce + 10, ("crashed as it joined",))
    return 4


def _crash(
    w: CustodyRing, victims: list[RingBroker], down: float, nonce: int, what: tuple[str, ...] = ()
) -> list[RingBroker]:
    """``victims`` crash now (logged as ``what``, each in turn; by default "crashed"), and
    come back ``down`` later as new members (returned: joined, or joining)."""
    for i, v in enumerate(victims):
        w.sim.crash(v.addr)
        w.log.append((w.sim.now, what[i] if i < len(what) else "crashed", v.addr))
    _closed(w, [v.addr for v in victims])
    w.sim.run(until=w.sim.now + down)
    return w.restart_soon(victims, nonce)


def _closed(w: CustodyRing, gone: list[int]) -> None:
    """The brokers ``gone`` crashed or stepped down: their connections close with them, and
    each broker that linked to one hears so at once (on the broker network's clocks)."""
    if not w.timers.closes:
        return
    for v in gone:
        for b in w.brokers:
            if b.addr not in gone and b.ring.joined:
                w.sim.invoke(b.addr, methodcaller("on_link_lost", v, w.sim.now))


def _hiccups(w: CustodyRing, rng: random.Random, start: float, end: float, pubs: list[int]) -> None:
    """From ``start`` to ``end``, every 2 to 10 heartbeats, one broker (by its address,
    whoever is there then) stopped for a moment, as one starved of CPU on a busy machine is:
    0.2 to 3.9 heartbeats, its lease lost now and then, found dead seldom; the publishers'
    brokers (``pubs``) too, for at most 1.5 heartbeats: never found dead, as the simulator has
    no client to send their unacknowledged publishes again."""
    beat, addrs = w.timers.heartbeat, sorted(b.addr for b in w.brokers)
    t = start + rng.uniform(2, 10) * beat
    while t < end:
        addr = rng.choice(addrs)
        length = rng.uniform(0.2, 1.5 if addr in pubs else 3.9) * beat

        w.sim.schedule(t, partial(w.pause, addr, length, "hiccup"))
        t += rng.uniform(2, 10) * beat


def _neighbour_hiccup(
    w: CustodyRing, rng: random.Random, pubs: list[int], node: int, window: list[int]
) -> None:
    """As a broker found dead joins again, one of the brokers it knew (not a publisher's)
    loses its lease within 3 heartbeats, for 2.5 to 3.9: a taker busy with the hand-over of
    the other's queues, as on a busy machine (the campaign's pause-3 at ``c9ec30e``)."""
    near = [a for a in window if a not in pubs]
    if not near:
        return
    beat, addr = w.timers.heartbeat, rng.choice(near)
    at, length = w.sim.now + rng.uniform(0, 3) * beat, rng.uniform(2.5, 3.9) * beat
    w.sim.schedule(at, partial(w.pause, addr, length, "neighbour hiccup"))


def _pause(w: CustodyRing, victims: list[RingBroker], down: float) -> None:
    """``victims`` paused now for ``down``; a victim told, once back, that it was found dead
    steps down and joins again as a new member (:meth:`CustodyRing._step_down`)."""
    for v in victims:
        w.pause(v.addr, down, "paused")
    w.sim.run(until=w.sim.now + down)


def _wanted(subs: Subs, n: int, derived: Iterable[Hashable] = ()) -> set[tuple[Hashable, Any]]:
    plain = {(s, (f"p{i % 2}", i)) for i in range(n) for s, f in subs.items() if f.matches({"x": i % 4})}
    big = [event_of(2, i + 1)["quantity"] for i in range(0, n, 3) if event_of(2, i + 1)["level"] >= 3]
    return plain | {(s, (DERIVED, q)) for s in derived for q in big}  # (the flow's select: level >= 3)


def lost(w: CustodyRing, subs: Subs, n: int = 2500) -> int:
    """Deliveries the filters ask for that never came."""
    return len(_wanted(subs, n) - {(sub, eid) for _, sub, eid in w.got})


def out_of_order(w: CustodyRing) -> int:
    """Deliveries that came after a later one of the same publisher, per subscription."""
    last: dict[tuple[Hashable, str], int] = {}
    late = 0
    for sub, (publisher, seq) in dict.fromkeys((sub, eid) for _, sub, eid in w.got):  # (first deliveries)
        if seq < last.get((sub, publisher), -1):
            late += 1
        last[(sub, publisher)] = max(seq, last.get((sub, publisher), -1))
    return late


def judge(w: CustodyRing, subs: Subs, pubs: list[int], n: int) -> dict[str, int]:
    """What went wrong in a schedule's run, counted (see the module note)."""
    want = _wanted(subs, n, w.derived)
    firsts = Counter((sub, eid) for _, sub, eid in w.got if sub in subs or sub in w.derived)
    rings = [b.ring for b in w.brokers]
    return {
        "expected": len(want),
        "delivered": len(want & firsts.keys()),
        "lost": len(want - firsts.keys()),
        "wrong": len(firsts.keys() - want),
        "out_of_order": out_of_order(w),
        "redelivered": sum(c - 1 for c in firsts.values()),
        "unsettled": sum(b.in_custody() for b in w.brokers if b.addr in pubs),
        "unserved": len(w.unserved),
        "not_joined": sum(not r.joined for r in rings),
        "ring_errors": len(ring_errors(rings)) if all(r.joined for r in rings) else 0,
    }


BAD = ("lost", "wrong", "out_of_order", "unsettled", "unserved", "not_joined", "ring_errors")
"""The counts that make a schedule bad when not zero (``redelivered`` is allowed: a
subscriber takes an event once by its id)."""


@dataclass(frozen=True, slots=True)
class RestartSchedules:
    """Schedules ``seeds`` of :func:`restarts`, each with ``events`` events, the flow if
    ``flow``, on the clocks ``timers`` (a key of :data:`TIMERS`)."""

    NAME: ClassVar[str] = "chaos-sim"

    seeds: tuple[int, ...] = tuple(range(260))
    events: int = 2500
    flow: bool = True
    timers: str = "sim"
    publishers: tuple[int, ...] = (0, 1)
    faults: str = "crash"
    derived: bool = False

    def __post_init__(self) -> None:
        if not self.seeds or any(type(s) is not int or s < 0 for s in self.seeds):
            raise ExperimentError(f"chaos-sim: seeds must be ints >= 0, got {list(self.seeds)[:8]}")
        integer("chaos-sim: events", self.events, 1500)
        if type(self.flow) is not bool:
            raise ExperimentError(f"chaos-sim: flow must be true or false, got {self.flow!r}")
        if self.timers not in TIMERS:
            known = ", ".join(TIMERS)
            raise ExperimentError(f"chaos-sim: timers must be one of {known}, got {self.timers!r}")
        if type(self.derived) is not bool or (self.derived and not self.flow):
            raise ExperimentError(f"chaos-sim: derived needs the flow (true or false), got {self.derived!r}")
        if self.faults not in FAULTS:
            raise ExperimentError(
                f"chaos-sim: faults must be one of {', '.join(FAULTS)}, got {self.faults!r}"
            )
        pubs = tuple(self.publishers)
        if len(pubs) != 2 or len(set(pubs)) != 2 or any(type(p) is not int or not 0 <= p < 5 for p in pubs):
            raise ExperimentError(f"chaos-sim: publishers are two places in ring order, 0 to 4, got {pubs}")
        object.__setattr__(self, "publishers", pubs)
        object.__setattr__(self, "seeds", tuple(dict.fromkeys(self.seeds)))

    @property
    def experiment(self) -> str:
        return self.NAME

    def to_dict(self) -> dict[str, Any]:
        return config_dict(self)


def schedule_row(
    seed: int,
    *,
    flow: bool,
    events: int,
    timers: str = "sim",
    publishers: tuple[int, ...] = (0, 1),
    faults: str = "crash",
    derived: bool = False,
) -> dict[str, Any]:
    """Schedule ``seed`` run and judged: its row (``crashed``: the brokers struck)."""
    s0 = time.perf_counter()
    w, subs, pubs, crashed = restarts(
        seed, flow=flow, n=events, timers=timers, publishers=publishers, faults=faults, derived=derived
    )
    row = {"seed": seed, "crashed": crashed, **judge(w, subs, pubs, events)}
    return {**row, "seconds": round(time.perf_counter() - s0, 2)}


def run_schedules(
    config: RestartSchedules,
    *,
    progress: ProgressFn | None = None,
    say: Callable[[str], object] | None = None,
    jobs: int = 1,
) -> Result:
    """One row per schedule, in the order of the seeds (``say`` told of each as it ends; with
    ``jobs`` > 1 that many processes run them, the rows the same); findings: the bad
    schedules and the totals."""
    t0 = time.perf_counter()
    run = partial(
        schedule_row,
        flow=config.flow,
        events=config.events,
        timers=config.timers,
        publishers=config.publishers,
        faults=config.faults,
        derived=config.derived,
    )
    done: dict[int, dict[str, Any]] = {}

    def took(row: dict[str, Any]) -> None:
        done[row["seed"]] = row
        if progress is not None:
            progress("restart schedules", len(done), len(config.seeds))
        if say is not None:
            wrong = ", ".join(f"{row[key]} {key.replace('_', ' ')}" for key in BAD if row[key])
            struck = "paused" if config.faults in PAUSES else "crashed"
            where = f"{len(done)}/{len(config.seeds)}, {row['crashed']} brokers {struck}"
            say(f"schedule {row['seed']} ({where}): {wrong or 'ok'}")

    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for future in as_completed([pool.submit(run, seed) for seed in config.seeds]):
                took(future.result())
    else:
        for seed in config.seeds:
            took(run(seed))
    rows = [done[seed] for seed in config.seeds]
    bad = [r["seed"] for r in rows if any(r[key] for key in BAD)]
    totals = {key: sum(r[key] for r in rows) for key in ("crashed", "expected", "redelivered", *BAD)}
    findings = {"bad": bad, "bad_count": len(bad), "schedules": len(rows), "totals": totals}
    return Result(
        config, FILES, rows, findings=findings, timing={"wall_s": time.perf_counter() - t0, "jobs": jobs}
    )


def plot_schedules(result: Result, png: Path) -> None:
    """Lost and out-of-order deliveries per schedule (the bad ones named), over the crashes
    each schedule made (grey, right axis)."""
    rows = result.rows
    fig, ax = pyplot().subplots(figsize=(12, 4))
    seeds = [r["seed"] for r in rows]
    crashes = ax.twinx()
    struck = "brokers paused" if getattr(result.config, "faults", "crash") in PAUSES else "brokers crashed"
    crashes.plot(seeds, [r["crashed"] for r in rows], ".", color="0.6", label=struck)
    crashes.set_ylabel(struck, color="0.4")
    crashes.set_ylim(bottom=0)
    ax.set_zorder(crashes.get_zorder() + 1)  # (the bars over the dots)
    ax.patch.set_visible(False)
    ax.bar(seeds, [r["lost"] for r in rows], width=0.9, label="lost", color="tab:red")
    ax.bar(seeds, [r["out_of_order"] for r in rows], width=0.9, bottom=[r["lost"] for r in rows],
           label="out of order", color="tab:orange")  # fmt: skip
    for r in rows:
        if any(r[key] for key in BAD):
            ax.annotate(str(r["seed"]), (r["seed"], r["lost"] + r["out_of_order"]), ha="center", va="bottom")
    ax.set_ylim(bottom=0, top=None if any(r["lost"] + r["out_of_order"] for r in rows) else 1)
    ax.yaxis.get_major_locator().set_params(integer=True)  # (deliveries: whole numbers)
    ax.set_xlabel("schedule (seed)")
    ax.set_ylabel("deliveries lost or out of order")
    bad = result.findings["bad_count"]
    clocks = getattr(result.config, "timers", "sim")
    faults = getattr(result.config, "faults", "crash")
    kinds = {"crash": "restart", "pause": "pause", "starve": "pause-and-hiccup", "rejoin": "kill-as-it-joins"}
    kind = kinds[faults]
    struck = "brokers paused" if faults in PAUSES else "crashes"
    ax.set_title(f"{len(rows)} {kind} schedules in the simulator ({clocks} clocks): {bad} bad, "
                 f"{result.findings['totals']['crashed']} {struck}")  # fmt: skip
    handles = ax.get_legend_handles_labels()
    more = crashes.get_legend_handles_labels()
    ax.legend(handles[0] + more[0], handles[1] + more[1], loc="upper right")
    ax.grid(alpha=0.3, axis="y")
    save(fig, png)


FILES = OutputFiles((Csv("rows", "rows.csv"),), plot_schedules)
