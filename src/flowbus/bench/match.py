"""Matching throughput on the W1, W1-mixed and W-REIN workloads, against brute force in the same run.

Measured, in one process:

* ``build_s`` -- bulk ``add_many`` of all subscriptions (building the filters'
  canonical form is not timed: it is reported as ``filter_build_s``);
* ``add_per_s`` / ``remove_per_s`` -- single ``add`` / ``remove`` calls on the
  full index;
* ``events_per_s`` -- ``match_batch`` over events already in an Arrow table
  (``input="arrow"``) or a list of dicts (``input="dicts"``): parsing events is
  not timed;
* ``brute_force_events_per_s`` -- ``Filter.matches`` of every subscription, on
  a sample of events, while the filters stream past; ``agrees_with_brute_force``
  compares the matcher's answer on that sample.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from flowbus.bench.workloads import Workload, WorkloadName
from flowbus.matching import Matcher, Strategy


def _sample_size(n: int) -> int:
    return int(max(2, min(50, 2_000_000 // max(1, n))))


def run(
    *,
    workload: WorkloadName = "w1",
    subscriptions: int = 100_000,
    events: int = 20_000,
    seed: int = 1,
    strategy: Strategy = "counting",
    input: str = "arrow",
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    wl = Workload(workload, seed)
    table = wl.events(events)
    sample = table.slice(0, _sample_size(subscriptions)).to_pylist()
    expected: list[list[int]] = [[] for _ in sample]
    matcher = Matcher(strategy=strategy)
    build_s = filter_s = brute_s = 0.0
    done = 0
    gc.disable()  # millions of small filter objects: the cyclic collector would dominate the build
    t = time.perf_counter()
    for chunk in wl.filters(subscriptions):
        filter_s += time.perf_counter() - t
        t = time.perf_counter()
        for i, event in enumerate(sample):
            expected[i].extend(sid for sid, f in chunk if f.matches(event))
        brute_s += time.perf_counter() - t
        t = time.perf_counter()
        matcher.add_many(chunk)
        build_s += time.perf_counter() - t
        done += len(chunk)
        if progress:
            progress("subscriptions", done, subscriptions)
        t = time.perf_counter()
    gc.enable()

    batch: Any = table if input == "arrow" else table.to_pylist()
    matcher.match_batch(batch[:64] if input != "arrow" else table.slice(0, 64))  # warm-up
    t = time.perf_counter()
    results = matcher.match_batch(batch)
    match_s = time.perf_counter() - t
    got_sample = [r.tolist() for r in matcher.match_batch(sample)]

    add_per_s, remove_per_s = _churn(matcher, wl, subscriptions)
    return {
        "benchmark": "match",
        "workload": workload,
        "strategy": strategy,
        "subscriptions": subscriptions,
        "events": events,
        "seed": seed,
        "input": input,
        "event_parsing_timed": False,
        "events_per_s": events / match_s,
        "ms_per_event": 1000.0 * match_s / events,
        "mean_matches_per_event": float(np.mean([len(r) for r in results])),
        "build_s": build_s,
        "filter_build_s": filter_s,
        "add_per_s": add_per_s,
        "remove_per_s": remove_per_s,
        "bytes_per_subscription": matcher.nbytes() / subscriptions,
        "brute_force_events_per_s": len(sample) / brute_s if brute_s else None,
        "brute_force_sample_events": len(sample),
        "speedup_vs_brute_force": (events / match_s) / (len(sample) / brute_s) if brute_s else None,
        "agrees_with_brute_force": got_sample == [sorted(x) for x in expected],
    }


def _churn(matcher: Matcher, wl: Workload, n: int, k: int = 2_000) -> tuple[float, float]:
    extra = [pair for chunk in wl.filters(k, start=n + 1_000_000) for pair in chunk]
    t = time.perf_counter()
    for sid, f in extra:
        matcher.add(sid, f)
    add_s = time.perf_counter() - t
    t = time.perf_counter()
    for sid, _ in extra:
        matcher.remove(sid)
    remove_s = time.perf_counter() - t
    return k / add_s, k / remove_s
