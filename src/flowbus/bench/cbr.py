"""The covering-based content router (``flowbus.routing.cbr``) at 1,000 to 100,000 subscriptions.

A broker ``1`` with two neighbours ``0`` and ``2`` (covering on), the broker workload: events with
``symbol`` (50 strings), ``price`` (float), ``quantity`` (int), ``exchange`` (5 strings) and ``level``
(int 0-9); each filter is ``symbol = ...`` and conditions on 2 to 4 of the others (ranges on price,
quantity and level; ``exchange =`` or ``exchange in``): the workload of :mod:`flowbus.bench.broker`.
``flowbus bench cbr --json`` prints one JSON document, per size ``K``:

* ``subscribe_s`` -- ``K`` local ``subscribe`` calls (each forwarded to both neighbours, with
  covering); ``forwarded`` -- the roots held by neighbour 0 afterwards;
* ``remote_subscribe_s`` -- the same ``K`` filters arriving from neighbour ``0`` as ``Subscribe``
  messages at a fresh router (forwarded to 2);
* ``route_events_per_s`` -- ``route_batch`` of the events from the local direction (delivered to
  the local subscriptions, sent to neighbours with matching filters: none here), and
  ``remote_route_events_per_s`` -- from neighbour 2 at the second router (sent on to 0);
  ``route_batch_ms`` -- the time of one ``route_batch`` call (``--batch`` events);
  ``matches_per_event`` -- the mean number of deliveries.

``--cbr FILE`` loads another version of the module (say the previous commit's, from
``git show HEAD:src/flowbus/routing/cbr.py``); without ``route_batch`` it is routed per event.
``--max-seconds S`` skips a size when the previous one, scaled quadratically (the old code's
growth), says its subscriptions would take longer than ``S`` (reported as ``skipped``).
"""

from __future__ import annotations

import gc
import importlib.util
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from flowbus.bench.workloads import STOCK_SYMBOLS, stock_events, stock_filters
from flowbus.filters import Filter, parse

Progress = Callable[[str, int, int], None]

# The broker workload of :mod:`flowbus.bench.broker` (from :mod:`flowbus.bench.workloads`).
SYMBOLS = STOCK_SYMBOLS
make_events = stock_events


def make_filters(k: int, seed: int) -> list[Filter]:
    """``k`` filters of the broker workload, parsed."""
    return [parse(text) for text in stock_filters(k, seed)]


def load(path: str | None) -> ModuleType:
    if path is None:
        from flowbus.routing import cbr

        return cbr
    spec = importlib.util.spec_from_file_location("cbr_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def route(router: Any, events: Sequence[dict[str, Any]], src: int) -> list[Any]:
    if hasattr(router, "route_batch"):
        return router.route_batch(events, src)  # type: ignore[no-any-return]
    out: list[Any] = []
    for e in events:
        out.extend(router._route(e, src))
    return out


def timed_route(router: Any, events: list[dict[str, Any]], src: int, batch: int) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, effects) of routing ``events`` in batches."""
    route(router, events[:batch], src)  # warm up (compiles, lazily built indexes)
    t, c = time.perf_counter(), time.process_time()
    effects = 0
    for i in range(0, len(events), batch):
        effects += len(route(router, events[i : i + batch], src))
    return time.perf_counter() - t, time.process_time() - c, effects


def run_size(
    cbr: ModuleType, k: int, events: list[dict[str, Any]], batch: int, seed: int, *, local_only: bool = False
) -> dict[str, Any]:
    filters = make_filters(k, seed)
    out: dict[str, Any] = {"K": k}
    gc.collect()
    gc.disable()
    try:
        local = cbr.ContentRouter(1, [0, 2])
        t, c = time.perf_counter(), time.process_time()
        for i, f in enumerate(filters):
            local.subscribe(i, f)
        out["subscribe_s"] = round(time.perf_counter() - t, 4)
        out["subscribe_cpu_s"] = round(time.process_time() - c, 4)
        out["forwarded"] = local.forwarded_size()[0]
        elapsed, cpu, effects = timed_route(local, events, 1, batch)
        out["route_events_per_s"] = round(len(events) / elapsed)
        out["route_batch_ms"] = round(1000 * elapsed * batch / len(events), 2)
        out["route_batch_cpu_ms"] = round(1000 * cpu * batch / len(events), 2)
        out["matches_per_event"] = round(effects / len(events), 2)

        if local_only:
            return out
        remote = cbr.ContentRouter(1, [0, 2])
        t, c = time.perf_counter(), time.process_time()
        for i, f in enumerate(filters):
            remote.on_message(0, cbr.Subscribe((0, i), f, i + 1), 0.0)
        out["remote_subscribe_s"] = round(time.perf_counter() - t, 4)
        out["remote_subscribe_cpu_s"] = round(time.process_time() - c, 4)
        elapsed, cpu, _ = timed_route(remote, events, 2, batch)
        out["remote_route_events_per_s"] = round(len(events) / elapsed)
        out["remote_route_batch_cpu_ms"] = round(1000 * cpu * batch / len(events), 2)
    finally:
        gc.enable()
    return out


def run(
    *,
    sizes: Sequence[int] = (1_000, 10_000, 100_000),
    events: int = 5_000,
    batch: int = 1_000,
    seed: int = 1,
    cbr: str | None = None,
    max_seconds: float | None = None,
    local_only: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Every size in ``sizes`` (see the module note); ``cbr``: the router's file, else
    :mod:`flowbus.routing.cbr`; ``local_only``: skip the remote (from a neighbour) phase."""
    module = load(cbr)
    evs = make_events(events, seed + 1)
    results: list[dict[str, Any]] = []
    last: tuple[int, float] | None = None
    for i, k in enumerate(sizes):
        if progress:
            progress("sizes", i, len(sizes))
        if last is not None and max_seconds is not None:
            prev_k, prev_s = last
            estimate = prev_s * (k / prev_k) ** 2  # the old code is quadratic; assume the worst
            if estimate > max_seconds:
                results.append({"K": k, "skipped": f"estimated {estimate:.0f} s to subscribe"})
                continue
        r = run_size(module, k, evs, batch, seed, local_only=local_only)
        results.append(r)
        last = (k, r["subscribe_s"] + r.get("remote_subscribe_s", 0.0))
    if progress:
        progress("sizes", len(sizes), len(sizes))
    return {
        "module": cbr or "flowbus.routing.cbr",
        "events": events,
        "batch": batch,
        "python": sys.version.split()[0],
        "results": results,
    }
