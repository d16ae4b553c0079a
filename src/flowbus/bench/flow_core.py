"""The flow's routing core alone against plain routing's, in one process
(``flowbus bench flow-core --json``).

What ``flowbus bench flow-bus`` measures through sockets, sessions and queues, without them: the
routing core of a broker process (:func:`flowbus.broker.overlays.new_core`, alone on its ring)
with the stock flow deployed and the flow row's subscriptions, publishing the flow's generated
input in steps of ``step`` events and settling every delivery as a broker's queues would;
against a second core with the plain row's filters and events (the broker benchmark's workload,
as many deliveries: :func:`flowbus.bench.flow_bus.plain_filters`). The two alternate
``repeats`` times, each time fresh, under the broker process's collector thresholds, so a host
whose speed drifts (this one's moves by a tenth within minutes) moves both alike: a figure for a
change to the core with much less noise than the whole benchmark's.

Reported: per repeat the CPU µs per source event of each, their medians, ``flow_vs_plain``
(plain's median over the flow's: the flow's rate over plain's at equal CPU) and the deliveries
(the flow's must be the interpreter's count: the offline reference of ``flow-bus``).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from flowbus.bench import broker as plain
from flowbus.bench.flow_bus import SPACES, Progress, workload
from flowbus.broker.config import DEFAULT
from flowbus.broker.overlays import new_core
from flowbus.broker.spaces import Spaces
from flowbus.core import Deliver, DeliverAll, Effect
from flowbus.filters import parse
from flowbus.flow.deploy import Deployment
from flowbus.meta import EVENT_ID, SPACE
from flowbus.routing.ring_broker import DERIVED_TIMER, RingBroker

BROKER_GC = (50_000, 20, 100)
"""The collector thresholds of a broker process (``flowbus broker start``)."""

Event = dict[str, Any]


def _core() -> RingBroker:
    _, core = new_core("chordal-ring", 1, DEFAULT)
    assert core is not None  # (the chordal ring's)
    core.start()
    return core


def _drive(core: RingBroker, events: Sequence[Event], step: int) -> tuple[float, int]:
    """Publish ``events`` in steps, settling each step's deliveries: (CPU s, deliveries)."""
    delivered = 0
    t = time.process_time()
    for i in range(0, len(events), step):
        out: list[Effect] = core.publish_batch(
            [(("pub", i + j), e) for j, e in enumerate(events[i : i + step])]
        )
        if core.flow_side.derived:  # (what waits for DERIVED_TIMER goes now)
            out += core.on_timer(DERIVED_TIMER, 0.0)
        counts: dict[Any, int] = {}
        for e in out:
            if type(e) is DeliverAll:
                n = len(e.subs)
            elif type(e) is Deliver:
                n = 1
            else:
                continue
            eid = e.event[EVENT_ID]
            counts[eid] = counts.get(eid, 0) + n
            delivered += n
        core.settle_many(list(counts.items()))
    return time.process_time() - t, delivered


def _flow(
    d: Deployment, filters: dict[str, list[str]], events: Sequence[Event], step: int
) -> tuple[float, int]:
    core = _core()
    core.deploy(d, nonce=1)
    for space in SPACES:
        for i, f in enumerate(filters[space]):
            core.subscribe_flow(f"{space}-{i}", space, f)
    core.prepare()
    core.prepare()  # (the indexes built, as a broker's quiet moment after subscriptions does)
    return _timed(lambda: _drive(core, events, step))


def _plain(filters: Sequence[str], events: Sequence[Event], step: int) -> tuple[float, int]:
    core = _core()
    for i, f in enumerate(filters):
        core.subscribe(f"plain-{i}", Spaces.routing_filter(plain.SPACE, parse(f)))
    core.prepare()
    core.prepare()
    return _timed(lambda: _drive(core, events, step))


def _timed(fn: Callable[[], tuple[float, int]]) -> tuple[float, int]:
    """``fn`` under a broker process's collector thresholds, the heap collected first."""
    before = gc.get_threshold()
    gc.collect()
    gc.set_threshold(*BROKER_GC)
    try:
        return fn()
    finally:
        gc.set_threshold(*before)


def run(
    *,
    events: int = 20_000,
    subscriptions: int = 100,
    step: int = 200,
    repeats: int = 5,
    seed: int = 1,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """The flow's core and plain's, alternately ``repeats`` times (see the module note)."""
    w = workload(events, subscriptions, seed)
    d, setup, filters, pfilters, pcounts = (
        w.deployment,
        w.setup,
        w.setup.filters,
        w.plain_filters,
        w.plain_counts,
    )
    flow_events = [{**e, SPACE: s} for s, e in setup.events]
    plain_events = [{**e, SPACE: plain.SPACE} for e in w.plain_events]
    flow_us: list[float] = []
    plain_us: list[float] = []
    deliveries: dict[str, list[int]] = {"flow": [], "plain": []}
    for r in range(repeats):
        cpu, n = _flow(d, filters, flow_events, step)
        flow_us.append(cpu / events * 1e6)
        deliveries["flow"].append(n)
        cpu, n = _plain(pfilters, plain_events, step)
        plain_us.append(cpu / events * 1e6)
        deliveries["plain"].append(n)
        if progress:
            progress("repeats", r + 1, repeats)
    flow_median, plain_median = statistics.median(flow_us), statistics.median(plain_us)
    return {
        "benchmark": "flow-core",
        "spec": "examples/stocks/flow.yaml",
        "events": events,
        "step": step,
        "repeats": repeats,
        "subscriptions": {"flow": subscriptions * len(SPACES), "plain": len(pfilters)},
        "deliveries_expected": {"flow": setup.deliveries, "plain": int(pcounts.sum())},
        "deliveries": deliveries,
        "deliveries_match": all(n == setup.deliveries for n in deliveries["flow"])
        and all(n == int(pcounts.sum()) for n in deliveries["plain"]),
        "flow_us_per_event": flow_us,
        "plain_us_per_event": plain_us,
        "flow_us_median": flow_median,
        "plain_us_median": plain_median,
        "flow_vs_plain": plain_median / flow_median,
        "gc_threshold": BROKER_GC,
    }


def table(result: dict[str, Any]) -> str:
    """The result as a few lines of text."""
    flow, base = result["flow_us_per_event"], result["plain_us_per_event"]
    return "\n".join([
        f"flow-core: {result['events']:,} source events in steps of {result['step']}, "
        f"{result['repeats']} repeats",
        f"  flow  µs/event: {', '.join(f'{x:.1f}' for x in flow)}  (median {result['flow_us_median']:.1f})",
        f"  plain µs/event: {', '.join(f'{x:.1f}' for x in base)}  (median {result['plain_us_median']:.1f})",
        f"  flow/plain {result['flow_vs_plain']:.2f}, deliveries match: {result['deliveries_match']}",
    ])  # fmt: skip
