"""The stock example (examples/stocks) through the local interpreter: original against rewritten graph,
and the A* reconnect of a disconnected subscriber (the 000 document, sections 4.1 and 4.2).

Measured, in one process, on the same pre-generated trades (generating them is not timed):

* ``original_events_per_s`` / ``rewritten_events_per_s`` -- the whole flow (both
  exchanges, integration, big trades, regions 4 and 5 with their collapses and
  expands), on the graph as written and on its rewrite; each graph runs
  ``rounds`` times, alternating, and the best run counts. ``outputs_agree``
  checks that both deliver exactly the same events to every subscription point.
* ``stateless_*`` -- the same for the stateless part alone (collapse and expand
  arcs removed, their input spaces kept as subscription points): what the
  rewrite itself changes.
* ``reconnect`` -- for each disconnect length: the compressed-stream subscriber
  (expand arc E4) disconnects, that many trades are published, it reconnects;
  the length of the equivalent sequence it receives, the A* states expanded, the
  time of the expansion, and whether replaying the sequence from the rows it had
  gives the current rows.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from flowbus.bench.workloads import stock_flow_spec
from flowbus.flow.collapse import BoundRules
from flowbus.flow.generators import generate
from flowbus.flow.graph import Collapse, EventSpace, Expand, Graph, Space, StateSpace
from flowbus.flow.local import LocalRun
from flowbus.flow.rewrite import rewrite
from flowbus.flow.spec import load_spec
from flowbus.flow.validate import bind_rules

Progress = Callable[[str, int, int], None]


def stateless_view(g: Graph) -> Graph:
    """``g`` without its collapse and expand arcs and states; collapse inputs become subscription points."""
    feeds = {a.source for a in g.arcs if isinstance(a, Collapse)}
    spaces: list[Space] = []
    for s in g.spaces:
        if isinstance(s, StateSpace):
            continue
        if isinstance(s, EventSpace) and s.name in feeds and s.kind == "events":
            s = dataclasses.replace(s, subscribe=True)
        spaces.append(s)
    arcs = tuple(a for a in g.arcs if not isinstance(a, (Collapse, Expand)))
    return Graph(tuple(spaces), arcs, g.functions, g.name, g.input)


def _race(
    original: Graph, rewritten: Graph, events: list[tuple[str, dict[str, Any]]], rounds: int, what: str,
    progress: Progress | None, chunk: int = 2_000,
) -> dict[str, Any]:  # fmt: skip
    """Both graphs over the same events in chunks, alternating chunk by chunk (a paired design: both
    see the same machine load), timed in process CPU time; a chunk's time is its best over
    ``rounds`` runs, a graph's time the sum over chunks."""
    names = ("original", "rewritten")
    starts = range(0, len(events), chunk)
    best = {name: [float("inf")] * len(starts) for name in names}
    outputs: dict[str, Any] = {}
    for r in range(rounds):
        runs = {"original": LocalRun(original), "rewritten": LocalRun(rewritten)}
        for i, lo in enumerate(starts):
            part = events[lo : lo + chunk]
            for name in names if (i + r) % 2 == 0 else names[::-1]:
                t0 = time.process_time()
                runs[name].run(part)
                best[name][i] = min(best[name][i], time.process_time() - t0)
        for name, local in runs.items():
            outputs.setdefault(name, local.outputs)
        if progress:
            progress(what, r + 1, rounds)
    n = len(events)
    total = {name: sum(best[name]) for name in names}
    return {
        "original_events_per_s": n / total["original"],
        "rewritten_events_per_s": n / total["rewritten"],
        "ratio": total["original"] / total["rewritten"],
        "outputs_agree": outputs["original"] == outputs["rewritten"],
        "delivered": {k: len(v) for k, v in outputs["rewritten"].items()},
    }


def _reconnect(g: Graph, n: int, seed: int) -> dict[str, Any]:
    warmup = 1_000
    stream = list(generate(g, events=warmup + n, seed=seed + 1))
    local = LocalRun(g)
    local.run(stream[:warmup])
    local.disconnect("E4")
    before = len(local.outputs["compressed"])
    local.run(stream[warmup:])
    silent = len(local.outputs["compressed"]) == before
    result = local.reconnect("E4")
    bound = bind_rules(g, g.arc("E4"))
    replay_ok = all(_replay(bound, k.key, k.start, k.events) == k.goal for k in result.keys)
    reached = {k.key: k.goal for k in result.keys}
    current = {key: row for key, row in local.states["max_cur"].items() if key in reached}
    return {
        "published_while_disconnected": n,
        "sequence_length": len(result.events),
        "keys_changed": len(result.keys),
        "states_expanded": result.states_expanded,
        "expand_s": result.seconds,
        "form": result.form.kind,
        "silent_while_disconnected": silent,
        "replay_reaches_current_state": replay_ok and reached == current,
    }


def _replay(bound: BoundRules, key: Any, row: Any, events: Sequence[Any]) -> Any:
    for ev in events:
        nxt = bound.step(key, row, ev)
        row = row if nxt is None else nxt
    return row


def run(
    *,
    trades: int = 200_000,
    seed: int = 1,
    rounds: int = 3,
    disconnects: Sequence[int] = (10, 1_000, 100_000),
    progress: Progress | None = None,
) -> dict[str, Any]:
    g = load_spec(stock_flow_spec())
    events = list(generate(g, events=trades, seed=seed))
    full = _race(g, rewrite(g), events, rounds, "full flow", progress)
    light = stateless_view(g)
    stateless = _race(light, rewrite(light), events, rounds, "stateless part", progress)
    reconnects = []
    for i, n in enumerate(disconnects, 1):
        reconnects.append(_reconnect(g, n, seed))
        if progress:
            progress("reconnects", i, len(disconnects))
    return {
        "benchmark": "flow",
        "spec": "examples/stocks/flow.yaml",
        "trades": trades,
        "seed": seed,
        "rounds": rounds,
        "event_generation_timed": False,
        "original_events_per_s": full["original_events_per_s"],
        "rewritten_events_per_s": full["rewritten_events_per_s"],
        "ratio": full["ratio"],
        "outputs_agree": full["outputs_agree"],
        "delivered": full["delivered"],
        "stateless_original_events_per_s": stateless["original_events_per_s"],
        "stateless_rewritten_events_per_s": stateless["rewritten_events_per_s"],
        "stateless_ratio": stateless["ratio"],
        "stateless_outputs_agree": stateless["outputs_agree"],
        "reconnect": reconnects,
    }
