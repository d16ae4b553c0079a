"""One run of the IRBR fault experiment (the IRBR paper's section 4, figure 4): the
machinery :mod:`flowbus.experiments.irbr` sweeps.

How it works: :func:`run` takes an :class:`IrbrRun` and builds a static Pastry network of
``nodes`` nodes (correct tables, :func:`~flowbus.overlay.pastry_static.build_static`) and
puts one protocol core on every node -- :class:`~flowbus.routing.irbr.IrbrNode`, or the
Scribe-based baseline :class:`~flowbus.routing.scribe.ScribeNode` without repair
(``scribe``, as in the paper's experiment) or with Scribe's own (``scribe-repair``: parents
heartbeat their children every ``heartbeat``; a child that misses them re-joins) -- in a
:class:`~flowbus.sim.engine.Simulator` with a constant latency of 1. IRBR learns of a dead
peer from its hop-by-hop acknowledgements (``acks``: a send not acknowledged within
``ack_timeout`` is re-sent into its range, :mod:`flowbus.routing.irbr_ack`). The
simulator's failure notice (a send to a dead node reported to its sender ``notice`` time
units later, an oracle no real network has) is off unless ``notice`` is given.

1. *Subscribe.* A fraction ``subscribers`` of the nodes subscribe, one subscription each,
   one per time unit; the run goes on until every message has arrived.
2. *Fail.* ``round(failure * nodes)`` nodes crash at once (before any repair, as in the
   paper). The live nodes each *reachable* node is computed from the nodes' state at
   that instant: a subscriber is reachable from a publisher when a chain of live nodes,
   each knowing the next (leaf set, routing table, neighbourhood set), leads to it.
   The failed nodes are the first ones of a seeded permutation: a higher rate fails a
   superset of a lower rate's nodes.
3. *Publish.* ``events`` events, each from a random live node, one at a time: each runs
   until no message is left, so the messages it took (its *forwards*, and its
   acknowledgements) are counted alone. ``scribe-repair`` never runs out of messages (its
   heartbeats): there an event runs for ``gap`` time units, the next one starts then.

Per event: the interested live subscribers (their filter evaluated offline), how many of
them were reachable, delivered, lost, and duplicated, the forwards and acknowledgements,
and the delivery delay (mean and worst, from publish to delivery). The result's ``row``
sums them up (total loss = lost / interested; reachable loss = lost among the reachable /
reachable); ``events`` keeps one small row per event for the forwards plot (figure 4b).

The workload ("quotes"): events ``{id, symbol, price}`` with ``symbols`` symbols drawn
from a Zipf law of exponent ``zipf`` and a price uniform in [0, 100); subscriptions are
``symbol = s & lo <= price < lo + w`` (70 %), ``symbol = s`` (20 %) or ``price >= t``
(10 %, t in 80..99): narrow and broad interests, with covering among them.

Every random draw comes from a stream derived from the seed, so a config gives the same
row and events on every run, byte for byte (``run_s`` aside). :func:`run_group` runs the
failure rates of one (protocol, seed) from one shared subscription phase, in forked
copies of the process: the same rows, at a fraction of the cost (the subscription phase is
most of an IRBR run).
"""

from __future__ import annotations

import os
import pickle
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any, Final

from flowbus.core import Effect
from flowbus.errors import ExperimentError, InternalError
from flowbus.experiments.config import fraction, integer, number, one_of
from flowbus.experiments.output import ProgressFn
from flowbus.filters import Filter, parse
from flowbus.overlay.pastry_app import PastryApp
from flowbus.overlay.pastry_static import build_static, random_ids
from flowbus.sim.engine import Simulator, derive_seed
from flowbus.sim.transport import ConstantLatency

__all__ = [
    "PROTOCOLS",
    "TIMING_FIELDS",
    "IrbrRun",
    "IrbrRunResult",
    "QuoteWorkload",
    "dead_run",
    "reachable_sets",
    "run",
    "run_group",
]

PROTOCOLS: Final = ("irbr", "scribe", "scribe-repair")

TIMING_FIELDS: Final = ("run_s",)
"""The fields of a result row that vary from run to run."""


@dataclass(frozen=True, slots=True)
class IrbrRun:
    """What one run simulates; every field is recorded with the results."""

    protocol: str
    nodes: int = 1000
    failure: float = 0.0
    seed: int = 1
    events: int = 200
    subscribers: float = 0.5
    symbols: int = 20
    zipf: float = 1.0
    covering: bool = True
    latency: float = 1.0
    acks: bool = True
    ack_timeout: float = 3.0
    notice: float | None = None
    heartbeat: float = 5.0
    gap: float = 10.0

    def __post_init__(self) -> None:
        one_of("protocol", self.protocol, PROTOCOLS)
        integer("nodes", self.nodes, 2)
        integer("events", self.events, 1)
        integer("symbols", self.symbols, 1)
        integer("seed", self.seed, 0)
        fraction("failure", self.failure, open_high=True)
        fraction("subscribers", self.subscribers, open_low=True)
        number("zipf", self.zipf, low=0)
        number("latency", self.latency, low=0, strict=True)
        if self.notice is not None:
            number("notice", self.notice, low=0)
        for key in ("ack_timeout", "heartbeat", "gap"):
            number(key, getattr(self, key), low=0, strict=True)
        for key in ("covering", "acks"):
            if type(getattr(self, key)) is not bool:
                raise ExperimentError(f"{key} must be true or false, got {getattr(self, key)!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class IrbrRunResult:
    """One run's row (its config, counts and rates, ``run_s``) and its per-event rows."""

    row: dict[str, Any]
    events: list[dict[str, Any]]


# ------------------------------------------------------------------------------- workload


class QuoteWorkload:
    """Subscriptions and events over ``{id, symbol, price}`` (see the module note)."""

    def __init__(self, symbols: int, zipf: float) -> None:
        weights = [1.0 / (k + 1) ** zipf for k in range(symbols)]
        total = sum(weights)
        self.names = [f"s{k}" for k in range(symbols)]
        self.cum = [sum(weights[: k + 1]) / total for k in range(symbols)]

    def symbol(self, rng: random.Random) -> str:
        x = rng.random()
        lo, hi = 0, len(self.cum) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.cum[mid] < x:
                lo = mid + 1
            else:
                hi = mid
        return self.names[lo]

    def subscription(self, rng: random.Random) -> Filter:
        kind = rng.random()
        if kind < 0.7:
            lo, width = rng.randrange(0, 90, 5), rng.choice((5, 10, 20))
            return parse(f'symbol = "{self.symbol(rng)}" & price >= {lo} & price < {lo + width}')
        if kind < 0.9:
            return parse(f'symbol = "{self.symbol(rng)}"')
        return parse(f"price >= {rng.randrange(80, 100)}")

    def event(self, rng: random.Random, i: int) -> dict[str, Any]:
        return {"id": i, "symbol": self.symbol(rng), "price": round(rng.uniform(0.0, 100.0), 2)}


# ------------------------------------------------------------------------------ protocols


@dataclass(frozen=True, slots=True)
class _Protocol:
    make: Callable[[Any, IrbrRun], PastryApp]
    event_messages: frozenset[str]  # the message types an event's forwards are made of
    periodic: bool = False  # timers run for ever: each step runs for a while, not until idle


def _irbr(pastry: Any, c: IrbrRun) -> PastryApp:
    from flowbus.routing.irbr import IrbrNode

    return IrbrNode(pastry, covering=c.covering, ack_timeout=c.ack_timeout if c.acks else None)


def _scribe(pastry: Any, c: IrbrRun, *, repair: bool) -> PastryApp:
    from flowbus.routing.scribe import ScribeNode

    return ScribeNode(pastry, heartbeat=c.heartbeat if repair else None)


_PROTOCOLS: Final = {
    "irbr": _Protocol(_irbr, frozenset({"Publish", "Route", "Hop"})),
    "scribe": _Protocol(partial(_scribe, repair=False), frozenset({"Multicast", "Route"})),
    "scribe-repair": _Protocol(
        partial(_scribe, repair=True), frozenset({"Multicast", "Route"}), periodic=True
    ),
}


# ----------------------------------------------------------------------------------- run


def reachable_sets(cores: Sequence[PastryApp], live: set[int]) -> Callable[[int], set[int]]:
    """``reach(src)``: the live addresses reachable from ``src`` through live nodes' state.
    One forward and one backward search first: if the live nodes are strongly connected
    (the usual case) every answer is ``live`` itself."""
    addr_of = cores[0].pastry.book.addr_of
    out = {a: [addr_of[n] for n in cores[a].pastry.state.known() if addr_of[n] in live] for a in live}
    back: dict[int, list[int]] = {a: [] for a in live}
    for a, succ in out.items():
        for b in succ:
            back[b].append(a)

    def search(src: int, edges: Mapping[int, list[int]]) -> set[int]:
        seen, todo = {src}, deque([src])
        while todo:
            for b in edges[todo.popleft()]:
                if b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen

    start = min(live)
    if len(search(start, out)) == len(live) == len(search(start, back)):
        return lambda src: live
    cache: dict[int, set[int]] = {}
    return lambda src: cache.setdefault(src, search(src, out))


def run(config: IrbrRun, *, progress: ProgressFn | None = None) -> IrbrRunResult:
    """Simulate one run (see the module note)."""
    return _finish(_prepare(config, progress), config, progress)


def run_group(configs: Sequence[IrbrRun], *, progress: ProgressFn | None = None) -> list[IrbrRunResult]:
    """Runs that differ only in ``failure``, with the same results as :func:`run` each.

    Their set-up and subscription phase are the same, so it is simulated once; each run
    then goes on in a forked copy of this process (copy-on-write, nothing is copied up
    front) that sends its result back through a pipe. Where ``os.fork`` is missing, each
    run is simulated in full.
    """
    if not configs:
        return []
    base = replace(configs[0], failure=0.0)
    if any(replace(c, failure=0.0) != base for c in configs):
        raise ExperimentError("run_group: the configs may differ in their failure rate only")
    if len(configs) == 1 or not hasattr(os, "fork"):
        return [run(c, progress=progress) for c in configs]
    prepared = _prepare(configs[0], progress)
    return [_in_child(partial(_finish, prepared, c, None)) for c in configs]


def _in_child(work: Callable[[], IrbrRunResult]) -> IrbrRunResult:
    """``work()`` in a forked child process; its pickled result comes back through a pipe."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compute, send, leave without running any cleanup
        status = 0
        try:
            os.close(read_fd)
            with os.fdopen(write_fd, "wb") as out:
                pickle.dump(work(), out, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as got:
        data = got.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        raise InternalError(f"run_group: the forked run failed (wait status {status})")
    result = pickle.loads(data)
    assert isinstance(result, IrbrRunResult)
    return result


@dataclass(slots=True)
class _Prepared:
    """A network after its subscription phase, ready to fail and publish."""

    proto: _Protocol
    cores: list[PastryApp]
    sim: Simulator
    work: QuoteWorkload
    subs: dict[int, Filter]
    deliveries: list[tuple[Any, int, Hashable, float]]
    subscribe_messages: int
    setup_s: float


def _stream(c: IrbrRun, name: str) -> random.Random:
    return random.Random(derive_seed(c.seed, f"irbr/{name}"))


def _prepare(c: IrbrRun, progress: ProgressFn | None) -> _Prepared:
    t0 = time.perf_counter()
    proto = _PROTOCOLS[c.protocol]
    ids = random_ids(c.nodes, _stream(c, "ids"))
    cores = [proto.make(p, c) for p in build_static(ids, _stream(c, "tables"))]
    deliveries: list[tuple[Any, int, Hashable, float]] = []
    sim = Simulator(
        seed=c.seed,
        transport=[ConstantLatency(c.latency)],
        failure_notice=c.notice,
        on_deliver=lambda node, sub, event, now: deliveries.append((event["id"], node, sub, now)),
    )
    for core in cores:
        sim.add_node(core.address, core)
    work = QuoteWorkload(c.symbols, c.zipf)
    subs = _subscribe(sim, proto, work, c, _stream(c, "subscriptions"), progress)
    setup_s = time.perf_counter() - t0
    sent = sim.metrics.sent_by_type()
    subscribe_messages = sim.metrics.total_sent - sent.get("Ack", 0) - sent.get("Heartbeat", 0)
    return _Prepared(proto, cores, sim, work, subs, deliveries, subscribe_messages, setup_s)


def _settle(sim: Simulator, proto: _Protocol, c: IrbrRun) -> None:
    """Run until no message is left (a protocol with periodic timers: for ``gap``)."""
    if proto.periodic:
        sim.run(until=sim.now + c.gap)
    else:
        sim.run()


def _failed(c: IrbrRun) -> set[int]:
    """The addresses of the nodes ``c`` fails (see :func:`_finish`)."""
    order = _stream(c, "failures").sample(range(c.nodes), c.nodes)
    return set(order[: round(c.failure * c.nodes)])


def dead_run(c: IrbrRun) -> int:
    """The most adjacent ids (round the id space) among the nodes run ``c`` fails: IRBR reaches
    every live node of a range only while fewer than half a leaf set (``l/2``) of adjacent
    ids die at once (see :mod:`flowbus.routing.irbr`)."""
    failed = _failed(c)
    dead = [
        a in failed for _, a in sorted((i, a) for a, i in enumerate(random_ids(c.nodes, _stream(c, "ids"))))
    ]
    if all(dead):
        return len(dead)
    start = dead.index(False)  # (count from a live one: a run across the wrap is whole)
    best = run = 0
    for k in range(1, len(dead) + 1):
        run = run + 1 if dead[(start + k) % len(dead)] else 0
        best = max(best, run)
    return best


def _finish(p: _Prepared, c: IrbrRun, progress: ProgressFn | None) -> IrbrRunResult:
    """Fail nodes at once (the first ``failure x nodes`` of one seeded permutation, so a
    higher rate fails a superset), then publish the events one at a time."""
    t0 = time.perf_counter()
    sim = p.sim
    failed = _failed(c)
    for addr in sorted(failed):
        sim.crash(addr)
    live = set(range(c.nodes)) - failed
    reach = reachable_sets(p.cores, live)
    rng = _stream(c, "events")
    published: list[dict[str, Any]] = []
    publishers = sorted(live)
    p.deliveries.clear()
    for i in range(c.events):
        src, event = rng.choice(publishers), p.work.event(rng, i)
        published.append(_publish(sim, p.proto, c, src, event))
        if progress is not None:
            progress("publishing", i + 1, c.events)
    if p.proto.periodic:
        _settle(sim, p.proto, c)  # the last event's stragglers
    by_event: dict[Any, list[tuple[Any, int, Hashable, float]]] = {}
    for d in p.deliveries:
        by_event.setdefault(d[0], []).append(d)
    per_event = [
        _tally(e, by_event.get(e["event"], []), p.subs, live, reach(e["publisher"])) for e in published
    ]
    run_s = p.setup_s + time.perf_counter() - t0
    timeouts = sum(getattr(getattr(core, "acks", None), "expired", 0) for core in p.cores)
    row = _row(c, per_event, len(failed), len(p.subs), p.subscribe_messages, sim, run_s)
    row["timeouts"] = timeouts
    return IrbrRunResult(row, per_event)


def _subscribe(
    sim: Simulator,
    proto: _Protocol,
    work: QuoteWorkload,
    c: IrbrRun,
    rng: random.Random,
    progress: ProgressFn | None,
) -> dict[int, Filter]:
    """One subscription on each chosen node (sub id = its address), one per time unit."""
    chosen = sorted(rng.sample(range(c.nodes), round(c.subscribers * c.nodes)))
    subs = {addr: work.subscription(rng) for addr in chosen}
    start = sim.now
    for k, (addr, filt) in enumerate(subs.items()):
        sim.invoke(addr, partial(_call_subscribe, filt, addr), at=start + k)
    for k in range(0, len(subs), 50):
        sim.run(until=start + k)
        if progress is not None:
            progress("subscribing", k, len(subs))
    sim.run(until=start + len(subs))
    _settle(sim, proto, c)
    return subs


def _call_subscribe(filt: Filter, sub: int, core: Any) -> list[Effect]:
    return core.subscribe(filt, sub)  # type: ignore[no-any-return]


def _publish(sim: Simulator, proto: _Protocol, c: IrbrRun, src: int, event: dict[str, Any]) -> dict[str, Any]:
    """Publish one event and run it out: its id, publisher, time, forwards and acknowledgements."""
    before = sim.metrics.sent_by_type()
    at = sim.now
    sim.invoke(src, lambda core: core.publish(event))
    _settle(sim, proto, c)
    after = sim.metrics.sent_by_type()
    forwards = sum(after.get(t, 0) - before.get(t, 0) for t in proto.event_messages)
    acks = after.get("Ack", 0) - before.get("Ack", 0)
    return {
        "event": event["id"],
        "publisher": src,
        "at": at,
        "fields": event,
        "forwards": forwards,
        "ack_messages": acks,
    }


def _tally(
    published: Mapping[str, Any],
    deliveries: Sequence[tuple[Any, int, Hashable, float]],
    subs: Mapping[int, Filter],
    live: set[int],
    reachable: set[int],
) -> dict[str, Any]:
    """One event's row: who wanted it, who got it (how often), how late."""
    event = published["fields"]
    got = Counter(node for _, node, _, _ in deliveries)
    first: dict[int, float] = {}
    for _, node, _, now in deliveries:
        first[node] = min(now, first.get(node, now))
    interested = {a for a, f in subs.items() if a in live and f.matches(event)}
    lost = interested - set(got)
    delays = [first[a] - published["at"] for a in interested & set(got)]
    return {
        "event": published["event"],
        "publisher": published["publisher"],
        "interested": len(interested),
        "reachable": len(interested & reachable),
        "delivered": len(interested & set(got)),
        "lost": len(lost),
        "lost_reachable": len(lost & reachable),
        "duplicates": sum(n - 1 for n in got.values()),
        "wrong": len(set(got) - interested),
        "forwards": published["forwards"],
        "ack_messages": published["ack_messages"],
        "delay": sum(delays) / len(delays) if delays else 0.0,
        "delay_max": max(delays, default=0.0),
    }


def _ratio(part: float, whole: int) -> float:
    return part / whole if whole else 0.0


def _row(
    c: IrbrRun,
    per_event: list[dict[str, Any]],
    failed: int,
    subscribers: int,
    subscribe_messages: int,
    sim: Simulator,
    run_s: float,
) -> dict[str, Any]:
    skip = ("event", "publisher", "delay", "delay_max")
    total = {k: sum(e[k] for e in per_event) for k in per_event[0] if k not in skip}
    delayed = sum(e["delay"] * e["delivered"] for e in per_event)
    return {
        **c.to_dict(),
        "failed": failed,
        "subscriptions": subscribers,
        "subscribe_messages": subscribe_messages,
        **total,
        "loss_rate": _ratio(total["lost"], total["interested"]),
        "reachable_loss_rate": _ratio(total["lost_reachable"], total["reachable"]),
        "forwards_per_event": total["forwards"] / len(per_event),
        "acks_per_event": total["ack_messages"] / len(per_event),
        "delay": _ratio(delayed, total["delivered"]),
        "delay_max": max(e["delay_max"] for e in per_event),
        "messages": sim.metrics.total_sent,
        "run_s": run_s,
    }
