"""A campaign run checked offline: what was acknowledged against what each subscription got.

How it works: the workload's logs (:mod:`flowbus.chaos.workload`) say what was published,
when, and what became of each publish; what every subscription took, from which broker,
when. Every event is recomputed from ``(publisher, k)`` and every filter evaluated by
flowbus's own compiled filters (the semantics the brokers route by), so the check needs
nothing from the brokers but what their stores still queue at the end. :func:`check_run` gives one row:

* ``acknowledged`` publishes, and the ``expected_deliveries`` they make (each acknowledged
  event once to each subscription whose filter it matches); ``delivered``, those taken;
  ``lost``, the others, split by when the event was published: before the first fault
  (``lost_prefix``), until the last heal (``lost_middle``), after it (``lost_postfix``);
  ``stranded``, those not taken but still queued for the subscription in a broker's store
  at the end (``queued.csv``, read by the campaign once the brokers are stopped): kept,
  not lost, but not delivered by the end either (a catch-up not made, which the goal
  counts as a failure as it counts a loss).
* ``caught_up``: downstream of the flow's state, expected events not taken by a
  subscription that took a later event of the same key (a catch-up after an absence gives
  the shortest sequence to the state, by design: not counted lost; the last change of each
  key must come).
* ``duplicated``: an event taken twice by one subscription (each extra time counts);
  ``misrouted``: taken by a subscription whose filter it does not match; ``wrong_values``:
  an event downstream of the flow's state whose count is not the reference interpreter's;
  ``phantom``: taken but never published; ``out_of_order``: an acknowledged event taken
  after a later acknowledged event of the same publisher (of the same key of the state,
  downstream of one): the order promised. ``unacknowledged_taken``: events taken whose
  publish was given up (refused, or not acknowledged in time; such a publish may or may
  not be delivered, and is not ordered with the acknowledged ones); of those,
  ``unacknowledged_late`` were taken after a later event of their publisher.
* ``hung_publishes``: neither acknowledged nor refused by the end; ``refused``: publishes
  refused (by a broker, or a timeout: each with its reason, counted by reason).
* ``recovery_p99_s`` / ``recovery_max_s``: per heal and subscription, how long after the heal
  the last event it expects from before the heal came (0 if all had come before).
* ``unavailable_s``: seconds in which a publisher got fewer than half of its rate's events
  acknowledged (blocked or refused), summed over publishers.
* ``double_served_s``: seconds in which two brokers' consoles listed one durable subscription
  as served (from the campaign's polls, ``states.jsonl``).
* ``registry_mismatch``: brokers whose flows at the last poll are not the ones deployed and
  not undeployed (the campaign's flow; a ``redeploy`` fault's, deployed during a partition
  and undeployed at its heal).
* ``tracebacks``: Python tracebacks in the brokers' and the workload's logs.
* ``heal_failures``: brokers that did not come back at a heal (no ready line in 60 s after
  their restart: they did not rejoin the ring; the run went on without them).

:func:`timeline` bins the same logs by second for the plot (sent, acknowledged, taken,
delivery latency percentiles).
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from flowbus.chaos.workload import STRIDE, Spec, event_of
from flowbus.filters import parse
from flowbus.routing.memo import compiled

__all__ = ["check_run", "timeline"]


def _read_csv(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


class _Publishes:
    """What became of each publish: ``sent[q]`` its time, ``acked[q]``, ``refused[q]`` (reason)."""

    def __init__(self, spec: Spec, rows: Iterable[dict[str, str]]) -> None:
        index = {c.name: i for i, c in enumerate(spec.publishers)}
        self.sent: dict[int, float] = {}
        self.acked: dict[int, float] = {}
        self.refused: dict[int, str] = {}
        for row in rows:
            q = index[row["publisher"]] * STRIDE + int(row["k"])
            if row["sent"]:
                self.sent[q] = float(row["sent"])
            elif row["acked"]:
                self.acked[q] = float(row["acked"])
            else:
                self.refused[q] = row["error"]


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1)]


def check_run(root: Path) -> dict[str, Any]:
    """The row of the run whose files are in ``root`` (see the module note)."""
    spec = Spec.from_json((root / "spec.json").read_text())
    pubs = _Publishes(spec, _read_csv(root / "publishes.csv"))
    faults = [json.loads(line) for line in _lines(root / "faults.jsonl")]
    first = min((f["t"] for f in faults if f["what"] == "inject"), default=math.inf)
    last = max((f["t"] for f in faults if f["what"] == "heal"), default=-math.inf)
    deliveries = _read_csv(root / "deliveries.csv")
    wanted = _Wants(spec, pubs, {int(row["quantity"]) for row in deliveries})
    expected = {sid: {q for q in pubs.acked if wants(q)} for sid, wants in wanted.subs.items()}
    # (sub -> the acknowledged events it must get)
    got: dict[str, Counter[int]] = defaultdict(Counter)
    taken_at: dict[tuple[str, int], float] = {}
    order_errors = misrouted = phantom = wrong = unacked = unacked_late = 0
    highest: dict[tuple[Any, ...], int] = {}  # (of the acknowledged events taken)
    highest_any: dict[tuple[Any, ...], int] = {}
    for row in deliveries:
        sid, q, t = row["sub"], int(row["quantity"]), float(row["t"])
        got[sid][q] += 1
        if got[sid][q] > 1:
            continue
        taken_at[(sid, q)] = t
        if q not in pubs.sent:
            phantom += 1
            continue
        if not wanted.subs[sid](q):
            misrouted += 1
        elif row.get("n") and row["n"] != str(wanted.count(sid, q)):
            wrong += 1
        key, k = wanted.order_key(sid, q), q % STRIDE
        if q not in pubs.acked:
            unacked += 1
            unacked_late += k < highest_any.get(key, 0)
        elif k < highest.get(key, 0):
            order_errors += 1
        else:
            highest[key] = k
        highest_any[key] = max(highest_any.get(key, 0), k)
    queued = {(r["sub"], int(r["quantity"])) for r in _read_csv(root / "queued.csv")}
    lost = {"prefix": 0, "middle": 0, "postfix": 0}
    delivered = caught_up = stranded = 0
    for sid, want in expected.items():
        passed = wanted.passed(sid, got[sid])
        for q in want:
            if got[sid][q]:
                delivered += 1
                continue
            if passed(q):
                caught_up += 1
                continue
            if (sid, q) in queued:
                stranded += 1
                continue
            t = pubs.sent[q]
            lost["prefix" if t < first else "postfix" if t > last else "middle"] += 1
    heals = [f["t"] for f in faults if f["what"] == "heal"]
    recovery = _recovery(heals, expected, pubs.sent, taken_at)
    refused = Counter(_reason(r) for r in pubs.refused.values())
    return {
        "faults_injected": sum(1 for f in faults if f["what"] == "inject"),
        "heal_failures": sum(len(f.get("failed", ())) for f in faults if f["what"] == "heal"),
        "published": len(pubs.sent),
        "acknowledged": len(pubs.acked),
        "expected_deliveries": sum(len(w) for w in expected.values()),
        "delivered": delivered,
        "caught_up": caught_up,
        "lost": sum(lost.values()),
        **{f"lost_{k}": v for k, v in lost.items()},
        "stranded": stranded,
        "duplicated": sum(n - 1 for c in got.values() for n in c.values() if n > 1),
        "misrouted": misrouted,
        "wrong_values": wrong,
        "phantom": phantom,
        "out_of_order": order_errors,
        "unacknowledged_taken": unacked,
        "unacknowledged_late": unacked_late,
        "hung_publishes": refused.pop("hung", 0),
        "refused": sum(refused.values()),
        "refused_by_reason": dict(refused),
        "recovery_p99_s": round(_percentile(recovery, 99), 3),
        "recovery_max_s": round(max(recovery, default=0.0), 3),
        "unavailable_s": _unavailable(spec, pubs),
        "double_served_s": _double_served(root / "states.jsonl"),
        "registry_mismatch": _registry_mismatch(root / "states.jsonl", spec, faults),
        "tracebacks": _tracebacks(root),
    }


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _reason(error: str) -> str:
    """A refusal's reason, as a short key (the text before its first colon)."""
    return error.split(":", 1)[0].strip() or "refused"


class _Wants:
    """What each subscription wants, and what the flow derives (see :meth:`__init__`)."""

    def __init__(self, spec: Spec, pubs: _Publishes, seen: set[int]) -> None:
        """Per subscription, whether it wants event ``q`` (one that was published): a plain
        one, the events of its space its filter matches; one of the flow's derived spaces,
        the events the flow (run by the reference interpreter) derives there that its filter
        matches. A derived event keeps the quantity of the event it came from.

        The interpreter runs on the events of the flow's source the network took, in the
        order they were sent: the acknowledged ones, and those ``seen`` (delivered anywhere:
        an event whose acknowledgement was lost may have been taken, and a state counts
        it). The events of a space downstream of a state keep their order per key of the
        state (per partition), not per publisher: :meth:`order_key`."""
        space = [c.space or spec.space for c in spec.publishers]
        events = {q: event_of(q // STRIDE, q % STRIDE) for q in pubs.sent}
        self.derived: dict[str, dict[int, dict[str, Any]]] = {}
        self.keyed: dict[str, tuple[str, ...]] = {}  # space downstream of a state -> its key
        if spec.flow:
            from flowbus.flow.deploy import Deployment
            from flowbus.flow.graph import Expand, StateSpace
            from flowbus.flow.local import run_graph

            graph = Deployment.from_text(spec.flow).graph
            taken = [q for q in events if space[q // STRIDE] != spec.space and (q in pubs.acked or q in seen)]
            ins = [(space[q // STRIDE], events[q]) for q in sorted(taken, key=pubs.sent.__getitem__)]
            for name, evs in run_graph(graph, ins).items():
                self.derived[name] = {int(e["quantity"]): dict(e) for e in evs}
            for arc in graph.arcs:
                state = graph.space(arc.source) if isinstance(arc, Expand) else None
                if isinstance(state, StateSpace):
                    fields = graph.space(arc.target).schema.fields
                    self.keyed[arc.target] = tuple(k for k in state.key if k in fields)
        plain = {q: e for q, e in events.items() if space[q // STRIDE] == spec.space}
        self.subs: dict[str, Callable[[int], bool]] = {}
        self.space: dict[str, str] = {}
        for c in spec.subscribers:
            for s in c.subs:
                match = compiled(parse(s.filter)) if s.filter.strip() else _everything
                self.subs[s.id] = _in(self.derived.get(s.space, {}) if s.space else plain, match)
                self.space[s.id] = s.space

    def count(self, sid: str, q: int) -> Any:
        """The ``n`` the derived event ``q`` of ``sid``'s space carries (None: no such field)."""
        return self.derived.get(self.space[sid], {}).get(q, {}).get("n")

    def passed(self, sid: str, got: Counter[int]) -> Callable[[int], bool]:
        """Whether ``sid`` took a later event of the key of its event ``q`` (downstream of
        a state: a subscriber back from an absence is caught up with the shortest sequence
        to the state, not every change; the change it skipped is caught up, not lost)."""
        key = self.keyed.get(self.space[sid])
        if not key:
            return lambda q: False
        derived = self.derived[self.space[sid]]
        latest: dict[tuple[Any, ...], int] = {}
        for q in got:
            k = tuple(derived.get(q, {}).get(f) for f in key)
            latest[k] = max(latest.get(k, 0), q % STRIDE)
        return lambda q: latest.get(tuple(derived[q].get(f) for f in key), 0) > q % STRIDE

    def order_key(self, sid: str, q: int) -> tuple[Any, ...]:
        """What ``sid``'s events of event ``q``'s publisher keep their order within: the
        publisher, and the state's key for a space downstream of a state."""
        key = self.keyed.get(self.space[sid])
        if not key:
            return (sid, q // STRIDE)
        event = self.derived[self.space[sid]].get(q, {})
        return (sid, q // STRIDE, *(event.get(k) for k in key))


def _everything(event: Any) -> bool:
    """An empty filter's: every event of the space."""
    return True


def _in(events: dict[int, dict[str, Any]], match: Callable[[Any], bool]) -> Callable[[int], bool]:
    """Whether event ``q`` is one of ``events`` that ``match`` holds for."""

    def wants(q: int) -> bool:
        event = events.get(q)
        return event is not None and match(event)

    return wants


def _recovery(
    heals: list[float],
    expected: dict[str, set[int]],
    sent: dict[int, float],
    taken_at: dict[tuple[str, int], float],
) -> list[float]:
    """Per heal and subscription: the last expected event published before the heal, taken
    how long after it (lost events are the checker's other count)."""
    out = []
    for h in heals:
        for sid, want in expected.items():
            late = [taken_at[(sid, q)] - h for q in want if sent[q] < h and (sid, q) in taken_at]
            out.append(max(0.0, max(late, default=0.0)))
    return out


def _unavailable(spec: Spec, pubs: _Publishes) -> int:
    """Publisher-seconds with fewer than half the publisher's rate's events acknowledged."""
    if not pubs.sent:
        return 0
    start = min(pubs.sent.values())
    per: Counter[tuple[int, int]] = Counter()
    for q in pubs.acked:
        per[(q // STRIDE, int(pubs.sent[q] - start))] += 1
    seconds = int(spec.publish_for)
    rates = [c.rate or spec.rate for c in spec.publishers]
    return sum(1 for p, rate in enumerate(rates) for s in range(seconds) if per[(p, s)] < rate / 2)


def _double_served(path: Path) -> float:
    """Seconds in which two brokers served one durable subscription (from the polls)."""
    rounds = [json.loads(line) for line in _lines(path)]
    seconds = 0.0
    for r in rounds:
        where: Counter[str] = Counter()
        for subs in r["served"].values():
            where.update(subs)
        if any(n > 1 for n in where.values()):
            seconds += r.get("every", 1.0)
    return seconds


def _registry_mismatch(path: Path, spec: Spec, faults: list[dict[str, Any]]) -> int:
    """Brokers whose flows, at the last poll, are not those deployed and not undeployed
    (the campaign's, and a ``redeploy`` fault's while its undeploy has not been made): a
    registry that did not converge."""
    rounds = [json.loads(line) for line in _lines(path)]
    if not rounds or "flows" not in rounds[-1]:
        return 0
    want: set[str] = set()
    if spec.flow:
        from flowbus.flow.deploy import Deployment

        want.add(Deployment.from_text(spec.flow).name)
    for f in faults:
        if f["what"] == "deploy" and not f.get("error"):
            want.add(f["flow"])
        elif f["what"] == "undeploy" and not f.get("error"):
            want.discard(f["flow"])
    return sum(1 for flows in rounds[-1]["flows"].values() if set(flows) != want)


def _tracebacks(root: Path) -> int:
    return sum(
        p.read_text(errors="replace").count("Traceback (most recent call last)")
        for p in [*sorted((root / "logs").glob("*.log")), root / "workload.log"]
        if p.exists()
    )


def timeline(root: Path) -> list[dict[str, Any]]:
    """Per second of the run: events sent, acknowledged, taken; delivery latency p50, p99."""
    spec = Spec.from_json((root / "spec.json").read_text())
    pubs = _Publishes(spec, _read_csv(root / "publishes.csv"))
    if not pubs.sent:
        return []
    start = min(pubs.sent.values())
    sent, acked, taken = Counter[int](), Counter[int](), Counter[int]()
    latency: dict[int, list[float]] = defaultdict(list)
    for t in pubs.sent.values():
        sent[int(t - start)] += 1
    for t in pubs.acked.values():
        acked[int(t - start)] += 1
    for row in _read_csv(root / "deliveries.csv"):
        q, t = int(row["quantity"]), float(row["t"])
        s = int(t - start)
        taken[s] += 1
        if q in pubs.sent:
            latency[s].append(t - pubs.sent[q])
    end = max([*sent, *acked, *taken]) + 1
    return [
        {
            "t": s,
            "sent": sent[s],
            "acked": acked[s],
            "taken": taken[s],
            "latency_p50_ms": round(1000 * _percentile(latency[s], 50), 1),
            "latency_p99_ms": round(1000 * _percentile(latency[s], 99), 1),
        }
        for s in range(end)
    ]
