"""The stock flow deployed on brokers on loopback, against plain content routing of the same
brokers (``flowbus bench flow-bus --json``; ``--out DIR`` adds a CSV and a PNG).

This measures issue 17's claim, from the 000 document's sections 3 and 4: a rewritten information
flow graph runs on a broker network as content routing toward the publisher (selects pulled
back), transforms at the edge, and states partitioned over the ring. Per broker count (1 and
3, fresh processes, the ``bench`` space of :mod:`flowbus.bench.broker` in their config) and per
publishing mode (flat out, and paced at ``rate`` source events/s) two rows:

* ``kind = flow`` -- ``examples/stocks/flow.yaml`` deployed by a client once the ring has
  settled (so every broker owns a partition of each state), K filtered subscriptions on each
  of ``combined``, ``big_trades``, ``compressed`` and ``alarms`` (seeded: equality on the company
  and a range over the quantiles of that company's price, cap or drop in the reference output),
  spread over ``clients`` subscriber connections spread over the brokers; one publisher on the
  first broker publishes the flow's generated input (N source events) in the interpreter's order.
* ``kind = plain`` -- the broker benchmark's workload (:mod:`flowbus.bench.broker`) on the same
  setup: N events into ``bench``, as many filters of its generator as give the flow row's
  deliveries (the expected deliveries per event match, within one filter's count).

Figures: ``events_per_s_in`` (N / first publish .. ``flush()`` done), ``deliveries_per_s``
(deliveries / first publish .. the last delivery), ``latency_p50_ms`` / ``latency_p99_ms``,
``deliveries`` and ``deliveries_match``, CPU and RSS as in the broker benchmark, and on flow rows
``flow_vs_plain`` = flow deliveries/s / plain deliveries/s.

What each subscription should receive is computed offline and not timed: the local interpreter
(:class:`flowbus.flow.local.LocalRun`, what ``flowbus run --engine local`` does) run one source
event at a time, so every output event has the index of the source event it derives from, and
each subscription's filter (the matcher) over its space's outputs. ``deliveries_match``: the same
multiset per subscription of a stateless space, the same sequence per company downstream of a
state. Latency of a delivery = its receive time minus the publish time of its source event: with
one publisher, the k-th delivery of a subscription to a stateless space derives from the k-th
expected output (per-publisher FIFO), and downstream of a state the k-th delivery of a company
from the k-th expected output of that company (the owner's order). The plain rows take each
event's ``t`` stamp, as the broker benchmark does.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import statistics
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from flowbus.bench import broker as plain
from flowbus.bench.workloads import stock_flow_spec
from flowbus.client import Client, Subscription, connect
from flowbus.errors import ExternalError, UserError
from flowbus.experiments.cpu import machine_busy_s, process_cpu_s
from flowbus.filters import parse
from flowbus.flow.deploy import Deployment
from flowbus.flow.graph import EventSpace, Graph
from flowbus.flow.local import LocalRun
from flowbus.flow.rewrite import exit_name
from flowbus.matching import Matcher

SPACES = ("combined", "big_trades", "compressed", "alarms")
KEYED = {"compressed": "name", "alarms": "name"}  # spaces downstream of a state: their key field
COMPANY = {"combined": "com", "big_trades": "com", "compressed": "name", "alarms": "name"}
MEASURE = {"combined": "price", "big_trades": "cap", "compressed": "price", "alarms": "drop"}
PROBE = "__probe"
GOAL = {"flow_vs_plain": 0.5, "latency_p99_ms": 50.0, "paced_rate": 5_000, "brokers": 1}

Progress = plain.Progress
Event = dict[str, Any]
Output = Mapping[str, Any]  # (what the interpreter gives)


# ------------------------------------------------------------------------------------ offline


@dataclass
class Reference:
    """Per subscription space, the interpreter's outputs and the source event each derives from."""

    outputs: dict[str, list[Output]]
    origin: dict[str, np.ndarray]


def reference(d: Deployment, events: Sequence[tuple[str, Event]]) -> Reference:
    """The local interpreter's outputs at :data:`SPACES`, one source event at a time."""
    g = d.graph
    marked = tuple(
        replace(sp, subscribe=True) if isinstance(sp, EventSpace) and sp.name in SPACES else sp
        for sp in g.spaces
    )
    g = Graph(spaces=marked, arcs=g.arcs, functions=g.functions, name=g.name)
    run = LocalRun(g)
    outs = {s: run.outputs[exit_name(g, s)] for s in SPACES}
    origin: dict[str, list[int]] = {s: [] for s in SPACES}
    for i, (space, event) in enumerate(events):
        run.publish(space, event)
        for s, out in outs.items():
            o = origin[s]
            if len(out) > len(o):
                o.extend([i] * (len(out) - len(o)))
    return Reference(outs, {s: np.asarray(o, np.int64) for s, o in origin.items()})


def flow_filters(ref: Reference, k: int, seed: int) -> dict[str, list[str]]:
    """``k`` seeded filters per space: the company, and a quantile band of its measure."""
    rng = random.Random(seed)
    out: dict[str, list[str]] = {}
    for space in SPACES:
        com, measure = COMPANY[space], MEASURE[space]
        values: dict[str, list[float]] = defaultdict(list)
        for e in ref.outputs[space]:
            values[e[com]].append(float(e[measure]))
        names = sorted(values)
        filters = []
        for _ in range(k):
            if not names:  # (nothing reaches the space: a range alone)
                filters.append(f"{measure} >= {rng.uniform(0, 100):.2f}")
                continue
            name = rng.choice(names)
            lo_q = rng.uniform(0.0, 0.9)
            hi_q = min(1.0, lo_q + rng.uniform(0.05, 0.4))
            lo, hi = np.quantile(values[name], [lo_q, hi_q])
            filters.append(f'{com} = "{name}" & {measure} >= {lo:.2f} & {measure} <= {hi:.2f}')
        out[space] = filters
    return out


def expected_indices(ref: Reference, filters: dict[str, list[str]]) -> dict[str, list[list[int]]]:
    """Per space and filter, the indices (into the space's outputs) of what the filter passes."""
    out: dict[str, list[list[int]]] = {}
    for space, texts in filters.items():
        m = Matcher()
        m.add_many(list(enumerate(parse(t) for t in texts)))
        want: list[list[int]] = [[] for _ in texts]
        events = ref.outputs[space]
        for lo in range(0, len(events), 5_000):
            for j, ids in enumerate(m.match_batch(events[lo : lo + 5_000]), lo):
                for i in ids.tolist():
                    want[i].append(j)
        out[space] = want
    return out


def _canon(e: Output) -> tuple[tuple[str, Any], ...]:
    return tuple(
        sorted((k, float(v) if isinstance(v, int) and not isinstance(v, bool) else v) for k, v in e.items())
    )


def _by_key(pairs: Sequence[tuple[Any, Output]], key: str) -> dict[Any, list[tuple[Any, Output]]]:
    out: dict[Any, list[tuple[Any, Output]]] = defaultdict(list)
    for x, e in pairs:
        out[e[key]].append((x, e))
    return out


def check(
    space: str, got: Sequence[tuple[float, Output]], want: list[int], ref: Reference, published: np.ndarray
) -> tuple[bool, list[float]]:
    """Whether one subscription got what it should, and the latencies (s) of its deliveries."""
    outs, origin = ref.outputs[space], ref.origin[space]
    got = [(t, e) for t, e in got if e.get(COMPANY[space]) != PROBE]
    pairs = [(origin[j], outs[j]) for j in want]
    key = KEYED.get(space)
    if key is None:
        ok = Counter(_canon(e) for _, e in got) == Counter(_canon(e) for _, e in pairs)
        streams = [(got, pairs)]
    else:
        have, should = _by_key(got, key), _by_key(pairs, key)
        ok = have.keys() == should.keys() and all(
            [_canon(e) for _, e in have[c]] == [_canon(e) for _, e in should[c]] for c in have
        )
        streams = [(have[c], should.get(c, [])) for c in have]
    latency = [t - published[i] for g, w in streams for (t, _), (i, _) in zip(g, w, strict=False)]
    return ok and len(got) == len(pairs), latency


# ------------------------------------------------------------------------------------ the flow run


@dataclass
class _Inbox:
    """What every subscription received: (receive perf_counter, event), and a count."""

    expected: int
    got: list[list[tuple[float, Event]]] = field(default_factory=list)
    total: int = 0
    last: float = 0.0
    done: asyncio.Event = field(default_factory=asyncio.Event)


async def _receive_into(conn: Client, boxes: dict[str, list[tuple[float, Event]]], inbox: _Inbox) -> None:
    """What ``conn``'s merged subscriptions receive, into their boxes (by subscription id)."""
    async for batch in conn.merged():
        inbox.last = now = time.perf_counter()
        for sub, event in batch:
            boxes[sub.id].append((now, event))
        inbox.total += len(batch)
        if inbox.total >= inbox.expected:
            inbox.done.set()


async def _sentinel(sub: Subscription, seen: asyncio.Event) -> None:
    async for _ in sub:
        seen.set()


@dataclass
class _Setup:
    """A flow row's offline part: the input, the subscriptions and what each should get."""

    spec: Path
    events: list[tuple[str, Event]]
    ref: Reference
    filters: dict[str, list[str]]
    want: dict[str, list[list[int]]]

    @property
    def subscriptions(self) -> list[tuple[str, int]]:
        return [(s, i) for s in SPACES for i in range(len(self.filters[s]))]

    @property
    def deliveries(self) -> int:
        return sum(len(w) for ws in self.want.values() for w in ws)


async def _connect(ring: plain.Ring, setup: _Setup, clients: int, window: int) -> list[Client]:
    """Deploy the flow, open the subscriber connections and the publisher (the last), and wait
    until each of them sees the flow."""
    addresses = ring.addresses
    async with connect(addresses[0], name="bench-admin") as admin:
        await admin.deploy(setup.spec)
    subs = [connect(addresses[c % len(addresses)], name=f"bench-sub-{c}") for c in range(clients)]
    conns = [*subs, connect(addresses[0], name="bench-pub", window=window)]
    await asyncio.gather(*(c.open() for c in conns))
    for c in conns:
        for _ in range(200):  # (the deploy is flooded to every broker)
            if await c.flows():
                break
            await asyncio.sleep(0.05)
        else:
            raise ExternalError(f"the flow deployed at {addresses[0]} did not reach {c.broker} in 10 s")
    return conns


async def _subscribe(
    conns: list[Client], setup: _Setup, inbox: _Inbox, tasks: list[asyncio.Task[None]]
) -> None:
    """Every subscription, then a sentinel per connection; probes until each sentinel has one."""
    subs, pub = conns[:-1], conns[-1]
    todo = setup.subscriptions
    boxes: dict[str, list[tuple[float, Event]]] = {}
    tasks.extend(asyncio.create_task(_receive_into(c, boxes, inbox)) for c in subs)
    for lo in range(0, len(todo), 200):
        chunk = todo[lo : lo + 200]
        got = await asyncio.gather(
            *(
                subs[(lo + n) % len(subs)].subscribe(s, setup.filters[s][i], merged=True)
                for n, (s, i) in enumerate(chunk)
            )
        )
        for sub in got:
            inbox.got.append([])
            boxes[sub.id] = inbox.got[-1]
    seen = [asyncio.Event() for _ in subs]
    for c, ev in zip(subs, seen, strict=True):
        tasks.append(asyncio.create_task(_sentinel(await c.subscribe("combined", f'com = "{PROBE}"'), ev)))
    t0 = time.perf_counter()
    while not all(e.is_set() for e in seen):
        if time.perf_counter() - t0 > 120:
            raise ExternalError("subscriptions not routed to the publisher's broker after 120 s")
        await pub.publish("combined", {"com": PROBE, "price": 0.0, "vol": 0})
        await pub.flush(60)
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)  # (the owners' brokers route the derived spaces' subscriptions too)


async def _publish(
    pub: Client, events: list[tuple[str, Event]], rate: float, progress: Progress | None, label: str
) -> tuple[np.ndarray, float]:
    """Publish ``events`` (paced at ``rate``/s unless 0); their publish times and the start."""
    published = np.zeros(len(events))
    t0 = time.perf_counter()
    for n, (space, event) in enumerate(events):
        if rate:
            ahead = t0 + n / rate - time.perf_counter()
            if ahead > 0.001:
                await asyncio.sleep(ahead)
        published[n] = time.perf_counter()
        await pub.publish(space, event)
        if progress and n % 1000 == 999:
            progress(f"{label}: publish", n + 1, len(events))
    await pub.flush(max(120.0, len(events) / 50))
    return published, t0


async def _flow_clients(
    ring: plain.Ring, row: dict[str, Any], setup: _Setup, *, clients: int, window: int, rate: float,
    progress: Progress | None, label: str,
) -> None:  # fmt: skip
    """Fill ``row`` in as the run goes; stop the brokers before the clients close."""
    inbox = _Inbox(setup.deliveries)
    tasks: list[asyncio.Task[None]] = []
    conns: list[Client] = []
    try:
        t0 = time.perf_counter()
        conns = await _connect(ring, setup, clients, window)
        await _subscribe(conns, setup, inbox, tasks)
        row["routed_s"] = time.perf_counter() - t0
        inbox.total = 0
        for box in inbox.got:  # (nothing the probes made counts)
            box.clear()
        plain.hold_gc()
        cpu0, bcpu0, busy0 = time.process_time(), [process_cpu_s(p.pid) for p in ring.procs], machine_busy_s()
        published, t0 = await _publish(conns[-1], setup.events, rate, progress, label)
        t_in = time.perf_counter() - t0
        row["client_cpu_s"] = time.process_time() - cpu0
        row["broker_cpu_s"] = sum(process_cpu_s(p.pid) - c for p, c in zip(ring.procs, bcpu0, strict=True))
        row["other_cpu_s"] = max(0.0, machine_busy_s() - busy0 - row["broker_cpu_s"] - row["client_cpu_s"])
        while not inbox.done.is_set():  # stragglers, while they keep coming
            before = inbox.total
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(inbox.done.wait(), 3.0)
            if inbox.total == before:
                break
        plain.release_gc()
        row.update(publish_s=t_in, events_per_s_in=len(setup.events) / t_in, deliveries=inbox.total)
        row["deliveries_per_s"] = inbox.total / (inbox.last - t0) if inbox.total else 0.0
        _judge(row, setup, inbox, published)
    finally:
        plain.release_gc()
        _stop(ring, row)
        for c in conns:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.close(), 10)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _judge(row: dict[str, Any], setup: _Setup, inbox: _Inbox, published: np.ndarray) -> None:
    """Latencies and whether every subscription got what the interpreter gives it."""
    latency: list[float] = []
    wrong: list[str] = []
    per_space: Counter[str] = Counter()
    space_latency: dict[str, list[float]] = {}
    for (space, i), got in zip(setup.subscriptions, inbox.got, strict=True):
        ok, lat = check(space, got, setup.want[space][i], setup.ref, published)
        latency += lat
        space_latency.setdefault(space, []).extend(lat)
        per_space[space] += len(got)
        if not ok:
            wrong.append(
                f"{space}[{i}] {setup.filters[space][i]!r}: got {len(got)}, want {len(setup.want[space][i])}"
            )
    ms = np.asarray(latency) * 1000.0 if latency else np.zeros(1)
    row.update(
        latency_p50_ms=float(np.percentile(ms, 50)),
        latency_p99_ms=float(np.percentile(ms, 99)),
        latency_max_ms=float(ms.max()),
        deliveries_per_space=dict(per_space),
        latency_p99_ms_per_space={
            space: round(float(np.percentile(np.asarray(lat) * 1000.0, 99)), 1)
            for space, lat in space_latency.items()
            if lat
        },
        deliveries_match=not wrong,
    )
    if wrong:
        row["mismatched"] = wrong[:10] + ([f"... {len(wrong) - 10} more"] if len(wrong) > 10 else [])


def _stop(ring: plain.Ring, row: dict[str, Any]) -> None:
    status = [plain._proc_status(p.pid) for p in ring.procs]
    row["broker_rss_mb"] = max((s["VmRSS"] for s in status if "VmRSS" in s), default=None)
    row["broker_hwm_mb"] = max((s["VmHWM"] for s in status if "VmHWM" in s), default=None)
    ring.stop()


# ------------------------------------------------------------------------------------ rows


@dataclass
class _Options:
    config: Path
    clients: int
    window: int
    profile_dir: Path | None
    progress: Progress | None


def _flow_row(brokers: int, rate: float, setup: _Setup, o: _Options) -> dict[str, Any]:
    k = len(setup.filters[SPACES[0]])
    row: dict[str, Any] = {
        "kind": "flow", "brokers": brokers, "rate": rate or None, "events": len(setup.events),
        "subscriptions": k * len(SPACES), "deliveries_expected": setup.deliveries,
        "deliveries_per_event": setup.deliveries / max(1, len(setup.events)), "publish_window": o.window,
    }  # fmt: skip
    ring = plain.Ring()
    label = f"flow, {brokers} broker(s), rate {rate or 'max'}"
    try:
        tag = f"-flow-b{brokers}-r{int(rate)}"
        plain.start_ring(brokers, o.config, o.profile_dir, tag=tag, ring=ring)
        asyncio.run(
            _flow_clients(
                ring,
                row,
                setup,
                clients=o.clients,
                window=o.window,
                rate=rate,
                progress=o.progress,
                label=label,
            )
        )
    except Exception:
        row["error"] = traceback.format_exc()
        row["deliveries_match"] = False
    finally:
        ring.stop()
    return row


def plain_filters(events: list[Event], deliveries: int, seed: int) -> tuple[list[str], np.ndarray]:
    """Filters of the broker benchmark's generator whose matches over ``events`` add up to about
    ``deliveries`` (the first ones of a pool grown until it has enough), and their counts."""
    pool = max(10, math.ceil(1.3 * deliveries * 500 / max(1, len(events))))
    while True:
        filters = plain.make_filters(pool, seed)
        counts, _ = plain.offline_counts(filters, events)
        total = np.cumsum(counts)
        if total.size and total[-1] >= deliveries:
            n = int(np.searchsorted(total, deliveries)) + 1
            return filters[:n], counts[:n]
        pool *= 2


def _plain_row(brokers: int, rate: float, events: list[Event], filters: list[str], counts: np.ndarray,
               o: _Options) -> dict[str, Any]:  # fmt: skip
    row: dict[str, Any] = {
        "kind": "plain", "brokers": brokers, "rate": rate or None, "events": len(events),
        "subscriptions": len(filters), "deliveries_expected": int(counts.sum()),
        "deliveries_per_event": float(counts.sum()) / max(1, len(events)), "publish_window": o.window,
    }  # fmt: skip
    ring = plain.Ring()
    try:
        plain.start_ring(brokers, o.config, o.profile_dir, tag=f"-plain-b{brokers}-r{int(rate)}", ring=ring)
        asyncio.run(
            plain._clients_run(
                ring, row, filters, events, counts, clients=o.clients, window=o.window, rate=rate,
                chunk=2_000, subscribe_timeout=600.0, progress=o.progress,
                label=f"plain, {brokers} broker(s), rate {rate or 'max'}",
            )
        )  # fmt: skip
        row["deliveries_match"] = row.pop("deliveries_match_offline")
    except Exception:
        row["error"] = traceback.format_exc()
        row["deliveries_match"] = False
    finally:
        ring.stop()
    return row


@dataclass
class Workload:
    """Both rows' input, made offline: the flow's (its deployment, events, subscriptions and
    what each should get) and plain's (events, and as many filters as give the same deliveries)."""

    deployment: Deployment
    setup: _Setup
    plain_events: list[Event]
    plain_filters: list[str]
    plain_counts: np.ndarray


def workload(events: int, subscriptions: int, seed: int) -> Workload:
    """The stock flow's ``events`` generated source events, ``subscriptions`` seeded filters per
    subscription space and the reference, and the plain baseline's events and filters."""
    spec = stock_flow_spec()
    d = Deployment.from_file(spec)
    evs = list(d.generate(events=events))
    ref = reference(d, evs)
    filters = flow_filters(ref, subscriptions, seed)
    setup = _Setup(spec, evs, ref, filters, expected_indices(ref, filters))
    plain_events = plain.make_events(events, seed)
    pfilters, pcounts = plain_filters(plain_events, setup.deliveries, seed)
    return Workload(d, setup, plain_events, pfilters, pcounts)


def run(
    *,
    brokers: Sequence[int] = (1, 3),
    events: int = 100_000,
    subscriptions: int = 100,
    rate: float = 5_000.0,
    seed: int = 1,
    clients: int = 4,
    window: int = 10_000,
    profile_dir: Path | None = None,
    progress: Progress | None = None,
    repeats: int = 1,
) -> dict[str, Any]:
    """Per broker count, flat out and paced at ``rate``: a flow row and its plain baseline (see
    the module note); flat out ``repeats`` times, the pairs alternating (the goals judge each
    configuration's median ratio). ``subscriptions``: K per subscription space;
    ``profile_dir``: run each broker under cProfile, writing
    ``broker-<kind>-b<B>-r<rate>-<i>.prof`` there."""
    if repeats < 1:
        raise UserError(f"repeats must be at least 1, got {repeats}")
    t = time.perf_counter()
    w = workload(events, subscriptions, seed)
    setup, filters, ref = w.setup, w.setup.filters, w.setup.ref
    plain_events, pfilters, pcounts = w.plain_events, w.plain_filters, w.plain_counts
    offline_s = time.perf_counter() - t
    rows = []
    with tempfile.TemporaryDirectory(prefix="flowbus-bench-") as tmp:
        o = _Options(plain.write_config(Path(tmp)), clients, window, profile_dir, progress)
        for b in brokers:
            for r in [0.0] * repeats + [rate]:
                flow = _flow_row(b, r, setup, o)
                base = _plain_row(b, r, plain_events, pfilters, pcounts, o)
                if flow.get("deliveries_per_s") and base.get("deliveries_per_s"):
                    flow["flow_vs_plain"] = flow["deliveries_per_s"] / base["deliveries_per_s"]
                rows += [flow, base]
                if progress:
                    progress("rows", len(rows), 2 * (repeats + 1) * len(brokers))
    return {
        "benchmark": "flow-bus",
        "spec": "examples/stocks/flow.yaml",
        "rows": rows,
        "repeats": repeats,
        "goal": GOAL,
        "goals_met": goals_met(rows, rate),
        "filters_per_space": subscriptions,
        "flow_filter_examples": {s: f[:3] for s, f in filters.items()},
        "reference_outputs": {s: len(v) for s, v in ref.outputs.items()},
        "offline_s": offline_s,
        "clients": "one process, one event loop",
        "subscriber_connections": clients,
        "publisher": "one connection, to the first broker",
        "seed": seed,
        "machine": {"cpu_count": os.cpu_count(), "cpu": plain._cpu_model()},
    }


def goals_met(rows: list[dict[str, Any]], rate: float) -> dict[str, Any]:
    """Issue 17's goals, on the rows that measure them (None: not measured). The ratio is each
    configuration's (brokers, rate) median over its repeats, and must hold for every one; also
    per broker count (``"1"``, ``"3"``)."""
    flows = [r for r in rows if r["kind"] == "flow" and "error" not in r]
    medians = median_ratios(rows)
    ratios = list(medians.values())
    by_brokers: dict[str, list[float]] = {}
    for (b, _), ratio in medians.items():
        by_brokers.setdefault(str(b), []).append(ratio)
    paced = [r for r in flows if r["brokers"] == 1 and r["rate"] == GOAL["paced_rate"] == rate]
    return {
        "flow_vs_plain_at_least_0.5": min(ratios) >= GOAL["flow_vs_plain"] if ratios else None,
        "flow_vs_plain_at_least_0.5_by_brokers": {
            b: min(rs) >= GOAL["flow_vs_plain"] for b, rs in sorted(by_brokers.items())
        },
        "p99_under_50_ms_paced_1_broker": paced[0]["latency_p99_ms"] < GOAL["latency_p99_ms"]
        if paced
        else None,
        "deliveries_match": all(r.get("deliveries_match") for r in rows) if rows else None,
    }


def median_ratios(rows: list[dict[str, Any]]) -> dict[tuple[int, float], float]:
    """Per configuration (brokers, rate; 0: flat out), the median flow/plain ratio of its repeats."""
    by_config: dict[tuple[int, float], list[float]] = {}
    for r in rows:
        if r["kind"] == "flow" and "error" not in r and "flow_vs_plain" in r:
            by_config.setdefault((r["brokers"], r["rate"] or 0.0), []).append(r["flow_vs_plain"])
    return {c: statistics.median(rs) for c, rs in sorted(by_config.items())}


# --------------------------------------------------------------------------------------- output

COLUMNS = [
    ("kind", "run", "{}"),
    ("brokers", "B", "{}"),
    ("rate", "rate /s", "{:,.0f}"),
    ("subscriptions", "subs", "{:,}"),
    ("events_per_s_in", "events/s in", "{:,.0f}"),
    ("deliveries", "deliveries", "{:,}"),
    ("deliveries_per_s", "deliv/s", "{:,.0f}"),
    ("latency_p50_ms", "p50 ms", "{:.1f}"),
    ("latency_p99_ms", "p99 ms", "{:.1f}"),
    ("flow_vs_plain", "flow/plain", "{:.2f}"),
    ("broker_cpu_s", "broker CPU s", "{:.1f}"),
    ("client_cpu_s", "client CPU s", "{:.1f}"),
    ("broker_rss_mb", "RSS MB", "{:.0f}"),
    ("deliveries_match", "ok", "{}"),
]


def table(result: dict[str, Any]) -> str:
    """The rows as a Markdown table (rate "-": flat out), then any row's error."""
    lines = plain.markdown_rows(result["rows"], COLUMNS)
    for r in result["rows"]:
        for key in ("error", "mismatched"):
            if key in r:
                lines.append(f"\n{r['kind']} B={r['brokers']} rate={r['rate']}: {key}: {r[key]}")
    return "\n".join(lines)


def write(result: dict[str, Any], directory: Path) -> None:
    """``rows.csv`` and ``flow-bus.png`` in ``directory``: deliveries/s and p99 latency, flow and
    plain side by side per (brokers, rate)."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    rows = result["rows"]
    columns = [c for c in dict.fromkeys(k for r in rows for k in r) if c != "deliveries_per_space"]
    with (directory / "rows.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    configs = sorted({(r["brokers"], r["rate"] or 0) for r in rows})
    labels = [f"{b} broker{'s' if b > 1 else ''}\n{f'{r:,.0f}/s' if r else 'flat out'}" for b, r in configs]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    x = np.arange(len(configs))
    panels = (("deliveries_per_s", "deliveries/s"), ("latency_p99_ms", "p99 latency (ms)"))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for j, kind in enumerate(("flow", "plain")):
            vals = [_median_of(rows, kind, c, key) for c in configs]
            ax.bar(x + (j - 0.5) * 0.4, vals, 0.4, label=f"{kind}")
        ax.set_xticks(x, labels)
        ax.set_title(title)
        ax.legend()
    axes[1].set_yscale("log")
    axes[1].axhline(GOAL["latency_p99_ms"], color="r", lw=0.8, ls=":")
    axes[1].text(
        x[-1] + 0.45, GOAL["latency_p99_ms"], "goal (1 broker, paced)", color="r", ha="right", va="bottom"
    )
    repeats = result.get("repeats", 1)
    medians = f" (flat out: the median of {repeats} runs)" if repeats > 1 else ""
    events = f"{rows[0]['events']:,} events"
    fig.suptitle(f"flowbus bench flow-bus: the stock flow vs plain content routing, {events}{medians}")
    fig.tight_layout()
    fig.savefig(directory / "flow-bus.png", dpi=110)
    plt.close(fig)


def _median_of(rows: list[dict[str, Any]], kind: str, config: tuple[int, float], key: str) -> float:
    """The median of ``key`` over the repeats of a configuration's ``kind`` rows (0: none)."""
    vals = [r.get(key) or 0 for r in rows if r["kind"] == kind and (r["brokers"], r["rate"] or 0) == config]
    return statistics.median(vals) if vals else 0
