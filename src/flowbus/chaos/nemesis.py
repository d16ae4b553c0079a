"""The faults of a campaign: what each one does, the mixes they come in, and seeded schedules.

How it works:

* A :class:`Fault` is data: its kind, when it begins (seconds after the workload is ready),
  how long it lasts, the hosts it strikes, chosen when the schedule is made (ring
  positions: ``adjacent`` means ring neighbours, by the brokers' ids), and its parameters
  (``params``: a link fault's delay, loss... an ``ack-cut``'s ``when``), drawn then too.
* The faults of links (:data:`LINKS`, and ``ack-cut``) are made by the proxy in front of
  each broker (:mod:`flowbus.chaos.proxy`): a run whose mix has one runs every broker
  behind its own proxy, and a fault writes the proxies' rules; its heal removes them. A
  link fault strikes one to three links between ring neighbours (link ``i`` joins
  ``targets[i]`` and ``others[i]``), both ways. An ``ack-cut``'s ``targets[0]`` picks a
  publisher instead: it strikes the broker that publisher is connected to when the fault
  is made (the workload's ``where.json``), where its acknowledgements flow.
* A *mix* (:data:`MIXES`) names the kinds a run draws from; :func:`schedule` draws a run's
  faults from it with a seeded generator: kinds, victims, durations, and the quiet time
  after each heal (the recovery the checker measures); a mix with ``each`` set (``links``)
  meets every one of its kinds once per round; a mix with ``under`` set (``overload``)
  holds that fault from before its first fault to the end of its last, beneath them all.
  The same mix and seed give the same schedule, whatever the machine.
* :class:`Nemesis` carries a fault out on the hosts and brokers and heals it, and logs both
  with their wall-clock times (``faults.jsonl``). Ring positions are read in the ring's
  order *when the fault is made* (brokers restarted by earlier faults joined with new ids
  elsewhere in the ring: by the order of the run's start, a "split 2 + 3" cut the ring into
  interleaved sides); the heal mends the same brokers. A fault that cannot be made here (a
  network fault on loopback) is an :class:`~flowbus.errors.ExperimentError` before the run
  starts (:func:`check_mixes`).

The kinds (``heal`` is what ends them):

=================  ===================================================================
``kill``           ``kill -9`` of one broker; heal: restarted on its address and data
``kill-adjacent``  ``kill -9`` of two ring neighbours; heal: both restarted
``kill-minority``  ``kill -9`` of a minority (2 of 5); heal: all restarted
``pause``          ``SIGSTOP`` for longer than failure detection; heal: ``SIGCONT``
``isolate``        one broker cut off from every other broker (its clients still reach it)
``link-down``      one broker's link down: cut off from brokers and clients alike
``split``          the ring split into a minority and a majority of consecutive brokers
``cut-two``        the ring cut in two places (two arcs that cannot reach each other)
``one-way``        one broker's packets to a ring neighbour dropped (not the other way)
``bridge``         two sides that reach one bridge broker but not each other
``client-cut``     the clients' link to one broker cut (publishes and deliveries in flight)
``disk-full``      one broker's file system full (ENOSPC); heal: space given back
``power-loss``     ``kill -9`` and what was not written to the disk lost; heal: restarted
``restart``        ``SIGTERM`` of one broker and a restart on its data (a rolling step)
``starve``         every broker starved of CPU, each to its own share of one core,
                   drawn from 2-20 % (a cpu cgroup's quota; a broker needs 10-15 %
                   at the campaign's rate): heartbeats come late, unevenly, and events
                   queue, as on an overloaded machine; heal: the quotas lifted (a broker
                   restarted meanwhile is not starved). Beneath a whole run (a mix's
                   ``under``), the shares are drawn from 8-30 %
``delay``          1-3 broker links delayed 20-200 ms, with a jitter of 20-100 % of it
                   (frames stay in order); heal: the rules removed
``loss``           1-3 broker links losing 1-10 % of their segments (each sent again after
                   TCP's retransmission timeout, the frames behind it waiting)
``dup``            1-3 broker links doubling 1-10 % of their segments (dropped by TCP)
``reorder``        1-3 broker links delivering 2-20 % of their segments 20-150 ms late,
                   after later ones (held by TCP until it comes)
``ack-cut``        the link of a publisher (drawn) to the broker it is connected to cut
                   just ``before`` or ``after`` a publish acknowledgement (once; ``when``
                   drawn); heal: the rule removed
``redeploy``       one broker cut off from the other brokers, and a second flow (with a
                   state: :data:`EXTRA_FLOW`) deployed through a broker of the other
                   side; heal: mended, then that flow undeployed through the broker that
                   was cut off (its clients' other brokers if it refuses). Every broker
                   must end with the same flows (the checker's ``registry_mismatch``)
=================  ===================================================================
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from flowbus.chaos.brokers import Brokers
from flowbus.chaos.hosts import Hosts
from flowbus.errors import ExperimentError

if TYPE_CHECKING:
    from flowbus.chaos.proxy import Proxies

__all__ = [
    "EXTRA_FLOW",
    "KINDS",
    "LINKS",
    "MIXES",
    "NETWORK",
    "PROXIED",
    "Fault",
    "FlowOps",
    "Mix",
    "Nemesis",
    "check_mixes",
    "proxied",
    "schedule",
]

KINDS = (
    "kill",
    "kill-adjacent",
    "kill-minority",
    "pause",
    "isolate",
    "link-down",
    "split",
    "cut-two",
    "one-way",
    "bridge",
    "client-cut",
    "disk-full",
    "power-loss",
    "restart",
    "starve",
    "delay",
    "loss",
    "dup",
    "reorder",
    "ack-cut",
    "redeploy",
)

EXTRA_FLOW = """\
name: extra
description: A flow deployed and undeployed by the fault campaign's redeploy fault.
spaces:
  extra_in: {kind: source, schema: {k: str, v: int}}
  extra_sum: {kind: state, schema: {k: str, total: int}, key: [k], initial: {total: 0}}
  extra_out: {kind: sink, schema: {k: str, v: int}}
rulesets:
  add: {key: {k: k}, rules: [{set: {total: total + v}}]}
  totals: {key: {k: k}, rules: [{set: {total: event.v}}]}
arcs:
  - {name: C, from: extra_in, to: extra_sum, collapse: add}
  - {name: E, from: extra_sum, to: extra_out, expand: totals}
"""
"""The flow a ``redeploy`` fault deploys during a partition and undeploys at its heal (its
state's partitions are subscriptions of its owners: ring state that changes under fire)."""


class FlowOps(Protocol):
    """Deploys and undeploys flows through a broker (its clients' other brokers after it);
    each gives None, or what went wrong."""

    def deploy(self, broker: str, text: str) -> str | None: ...
    def undeploy(self, broker: str, name: str) -> str | None: ...


LINKS = ("delay", "loss", "dup", "reorder")
"""Kinds that strike links between brokers (through their proxies)."""

PROXIED = frozenset({*LINKS, "ack-cut"})
"""Kinds made by the brokers' proxies (:mod:`flowbus.chaos.proxy`)."""

NETWORK = frozenset(
    {
        "isolate",
        "link-down",
        "split",
        "cut-two",
        "one-way",
        "bridge",
        "client-cut",
        "disk-full",
        "power-loss",
        "redeploy",
        "starve",
        *PROXIED,
    }
)
"""Kinds that need root: network namespaces, disks, cpu cgroups of their own."""


@dataclass(frozen=True, slots=True)
class Mix:
    """A named set of fault kinds a run draws from, ``faults`` of them per run (``each``:
    every kind once per round of ``len(kinds)`` faults, in a seeded order; else each fault's
    kind drawn on its own); ``under``, a kind held beneath them all (``""``: none)."""

    name: str
    kinds: tuple[str, ...]
    faults: int
    about: str
    each: bool = False
    under: str = ""

    @property
    def all_kinds(self) -> tuple[str, ...]:
        """The kinds a run of this mix makes (``under`` included)."""
        return (*self.kinds, self.under) if self.under else self.kinds

    def __post_init__(self) -> None:
        unknown = [k for k in self.all_kinds if k not in KINDS]
        if unknown or not self.kinds or self.faults < 1:
            raise ExperimentError(f"mix {self.name!r}: unknown kinds {unknown} or no faults")


MIXES: dict[str, Mix] = {
    m.name: m
    for m in (
        Mix(
            "crash", ("kill", "kill-adjacent", "kill-minority"), 5, "kill -9 of one, two adjacent, a minority"
        ),
        Mix("pause", ("pause",), 5, "SIGSTOP longer than failure detection, then SIGCONT"),
        Mix("isolate", ("isolate", "link-down"), 5, "one broker cut off (from brokers; from everyone)"),
        Mix("split", ("split", "cut-two"), 5, "the ring split 2 + 3; cut in two places"),
        Mix("partial", ("one-way", "bridge"), 5, "one-way drops; two sides and a bridge broker"),
        Mix("clients", ("client-cut",), 6, "the clients' link to a broker cut, acknowledgements in flight"),
        Mix("disk", ("disk-full", "power-loss"), 5, "a full disk; a power loss"),
        Mix("membership", ("restart", "kill"), 5, "a rolling restart; crashes"),
        Mix("starve", ("starve",), 5, "every broker starved of CPU, as on an overloaded machine"),
        Mix(
            "overload",
            ("split", "cut-two", "isolate", "one-way"),
            5,
            "partitions on brokers starved of CPU all along",
            under="starve",
        ),
        Mix(
            "mixed",
            ("kill", "pause", "isolate", "split", "one-way", "client-cut", "disk-full", "restart"),
            6,
            "a bit of everything",
        ),
        Mix("links", LINKS, 4, "broker links delayed with jitter, lossy, duplicating, reordering", each=True),
        Mix("acks", ("ack-cut",), 6, "a publisher's link cut just before or after a publish acknowledgement"),
        Mix("flows", ("redeploy", "kill", "isolate"), 5, "a flow deployed and undeployed across a partition"),
        Mix("short", ("kill", "pause", "isolate"), 3, "what CI runs (--short)"),
        Mix("process", ("kill", "kill-adjacent", "pause", "restart"), 5, "faults of processes only"),
    )
}
"""The mixes, by name (``flowbus chaos mixes`` lists them)."""


def proxied(mix: Mix) -> bool:
    """Whether a run of ``mix`` runs its brokers behind proxies (it has faults of links)."""
    return bool(set(mix.all_kinds) & PROXIED)


def check_mixes(names: Sequence[str], *, isolated: bool) -> list[Mix]:
    """The mixes ``names``; an :class:`ExperimentError` naming one unknown or not possible here."""
    out = []
    for name in names:
        mix = MIXES.get(name)
        if mix is None:
            raise ExperimentError(f"unknown mix {name!r} (mixes: {', '.join(MIXES)})")
        needs = sorted(set(mix.all_kinds) & NETWORK)
        if needs and not isolated:
            raise ExperimentError(f"mix {name!r} needs network namespaces (root) for {', '.join(needs)}")
        out.append(mix)
    return out


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault of a schedule: ``kind`` on ``targets`` from ``start`` for ``duration``
    seconds (after the workload is ready); ``others`` is the far side of a partition (of a
    link fault: link ``i`` joins ``targets[i]`` and ``others[i]``); ``params``, what the
    fault needs more: ``(name, value)`` pairs (a link's rules, an ``ack-cut``'s ``when``)."""

    kind: str
    start: float
    duration: float
    targets: tuple[int, ...]  # ring positions (0 .. n-1)
    others: tuple[int, ...] = ()
    params: tuple[tuple[str, float | str], ...] = ()

    @property
    def end(self) -> float:
        return self.start + self.duration

    @property
    def rules(self) -> dict[str, float | str]:
        """``params`` as a dict."""
        return dict(self.params)


def schedule(mix: Mix, seed: int, *, brokers: int, detect: float, warmup: float = 4.0) -> list[Fault]:
    """``mix.faults`` faults drawn with ``seed`` for a ring of ``brokers``; ``detect`` is the
    brokers' failure detection time (pauses and cuts last longer than it)."""
    rng = random.Random(f"{mix.name}/{seed}")
    t = warmup
    out = []
    round_: list[str] = []
    for _ in range(mix.faults):
        if mix.each:
            if not round_:
                round_ = rng.sample(mix.kinds, len(mix.kinds))
            kind = round_.pop()
        else:
            kind = rng.choice(mix.kinds)
        duration = round(rng.uniform(detect + 2.0, detect + 10.0), 1)
        if kind in ("kill", "kill-adjacent", "kill-minority", "power-loss", "restart"):
            duration = round(rng.uniform(1.0, detect + 6.0), 1)  # (restarted before or after detection)
        if kind == "client-cut":
            duration = round(rng.uniform(0.5, 6.0), 1)
        if kind == "ack-cut":
            duration = round(rng.uniform(1.0, 5.0), 1)
        targets, others = _victims(kind, rng, brokers)
        out.append(Fault(kind, round(t, 1), duration, targets, others, _params(kind, rng, brokers)))
        t += duration + rng.uniform(detect + 4.0, detect + 8.0)
    if mix.under:
        start = warmup / 2
        end = max(f.end for f in out)
        targets, others = _victims(mix.under, rng, brokers)
        params = _params(mix.under, rng, brokers, under=True)
        out.insert(0, Fault(mix.under, start, round(end - start, 1), targets, others, params))
    return out


def _victims(kind: str, rng: random.Random, n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ring positions a fault strikes (and, for a partition, the far side)."""
    first = rng.randrange(n)
    ring = [(first + i) % n for i in range(n)]
    minority = (n - 1) // 2
    if kind in ("kill-adjacent",):
        return tuple(ring[:2]), ()
    if kind == "kill-minority":
        return tuple(sorted(rng.sample(range(n), minority))), ()
    if kind == "split":
        return tuple(ring[:minority]), tuple(ring[minority:])
    if kind == "cut-two":
        k = rng.randrange(1, n - 1)
        return tuple(ring[:k]), tuple(ring[k:])
    if kind == "one-way":
        return (ring[0],), (ring[1],)
    if kind == "bridge":
        half = (n - 1) // 2
        return tuple(ring[1 : 1 + half]), tuple(ring[1 + half :])  # (ring[0] reaches both)
    if kind == "redeploy":  # (cut off; the deploy goes through a broker of the other side)
        return (first,), (ring[rng.randrange(1, n)],)
    if kind == "starve":
        return tuple(range(n)), ()
    if kind in LINKS:  # (links between ring neighbours: those the events take)
        starts = sorted(rng.sample(range(n), rng.randint(1, min(3, n))))
        return tuple(starts), tuple((p + 1) % n for p in starts)
    return (first,), ()


def _params(
    kind: str, rng: random.Random, n: int, *, under: bool = False
) -> tuple[tuple[str, float | str], ...]:
    """A fault's parameters (a link fault's rules for the proxies, see the kinds' table)."""
    if kind == "delay":
        delay = round(rng.uniform(20.0, 200.0))
        return (("delay_ms", delay), ("jitter_ms", round(delay * rng.uniform(0.2, 1.0))))
    if kind == "loss":
        return (("loss", round(rng.uniform(0.01, 0.10), 3)),)
    if kind == "dup":
        return (("dup", round(rng.uniform(0.01, 0.10), 3)),)
    if kind == "reorder":
        return (
            ("reorder", round(rng.uniform(0.02, 0.20), 3)),
            ("reorder_ms", round(rng.uniform(20.0, 150.0))),
        )
    if kind == "ack-cut":
        return (("when", rng.choice(("before", "after"))),)
    if kind == "starve":  # (each broker's share, in ring order)
        low, high = (0.08, 0.3) if under else (0.02, 0.2)
        return (("cpu", " ".join(f"{rng.uniform(low, high):.2f}" for _ in range(n))),)
    return ()


class Nemesis:
    """Carries faults out on a run's hosts and brokers, and logs them (see the module note)."""

    def __init__(
        self,
        hosts: Hosts,
        brokers: Brokers,
        *,
        order: Sequence[str],
        clients: str,
        log: Path,
        proxies: Proxies | None = None,
        publishers: Mapping[str, str] | None = None,
        where: Path | None = None,
        ring_order: Callable[[], Sequence[str]] | None = None,
        flows: FlowOps | None = None,
    ) -> None:
        self.hosts = hosts
        self.brokers = brokers
        self.order = list(order)  # broker names in ring order (positions index it)
        self.ring_order = ring_order  # the order now (read at each fault; None: fixed)
        self.clients = clients
        self.log = log
        self.proxies = proxies  # the brokers' proxies (runs of mixes with faults of links)
        self.publishers = dict(publishers or {})  # publisher -> the broker it is given first
        self.where = where  # the workload's where.json: publisher -> "host:port" it is connected to
        self.flows = flows  # deploys and undeploys (redeploy faults)
        self.injected = 0
        self._struck: dict[Fault, tuple[list[str], list[str]]] = {}  # fault -> (victims, others) made

    def _names(self, positions: Sequence[int]) -> list[str]:
        return [self.order[i % len(self.order)] for i in positions]

    def _publisher(self, fault: Fault) -> str | None:
        """An ``ack-cut``'s publisher (``targets[0]`` indexes them)."""
        names = list(self.publishers)
        return names[fault.targets[0] % len(names)] if names else None

    def _sides(self, fault: Fault) -> tuple[list[str], list[str]]:
        """The brokers ``fault`` strikes and, for a partition or links, the far side: as it
        was made (see :meth:`inject`)."""
        made = self._struck.get(fault)
        return made if made is not None else (self._victims(fault), self._names(fault.others))

    def _victims(self, fault: Fault) -> list[str]:
        """The brokers ``fault`` strikes: at its ring positions; an ``ack-cut``'s is the
        broker its publisher is connected to when it is made (the workload's ``where``; else
        the one the publisher is given first), where acknowledgements flow."""
        if fault.kind != "ack-cut" or not self.publishers:
            return self._names(fault.targets)
        publisher = self._publisher(fault)
        assert publisher is not None
        victim = self.publishers[publisher]
        try:
            at = json.loads(self.where.read_text()).get(publisher) if self.where is not None else None
        except (OSError, ValueError):
            at = None
        if isinstance(at, str):
            victim = {self.brokers.address(n): n for n in self.order}.get(at, victim)
        return [victim]

    def _links(self, fault: Fault) -> list[tuple[str, str]]:
        """A link fault's links (both ends)."""
        return list(zip(*self._sides(fault), strict=True))

    def _note(self, what: str, fault: Fault, **more: Any) -> None:
        row = {"t": time.time(), "what": what, **asdict(fault), "hosts": self._sides(fault)[0], **more}
        row["params"] = fault.rules
        if fault.kind in LINKS:
            links = self._links(fault)
            row["links"] = [list(link) for link in links]
            row["hosts"] = sorted({h for link in links for h in link})
        if fault.kind == "ack-cut":
            row["publisher"] = self._publisher(fault)
        with self.log.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def _flows(self, fault: Fault) -> FlowOps:
        if self.flows is None:
            raise ExperimentError(f"a {fault.kind} fault needs a way to deploy flows")
        return self.flows

    def _proxies(self, fault: Fault) -> Proxies:
        if self.proxies is None:
            raise ExperimentError(f"a {fault.kind} fault needs the brokers behind proxies")
        return self.proxies

    def inject(self, fault: Fault) -> None:
        if self.ring_order is not None and fault.kind != "ack-cut":
            now = list(self.ring_order())
            if sorted(now) == sorted(self.order):  # (all answered: else the order known last)
                self.order = now
        victims, others = self._victims(fault), self._names(fault.others)
        self._struck[fault] = (victims, others)
        kind, hosts, brokers = fault.kind, self.hosts, self.brokers
        self._note("inject", fault)
        self.injected += 1
        if kind in LINKS:
            rules = {k: v for k, v in fault.params if isinstance(v, int | float)}
            for a, b in self._links(fault):
                self._proxies(fault).set_link(a, b, rules)
        elif kind == "ack-cut":
            self._proxies(fault).set_ack_cut(victims[0], self.clients, str(fault.rules["when"]))
        elif kind in ("kill", "kill-adjacent", "kill-minority", "power-loss"):
            for v in victims:
                brokers.kill(v)
            if kind == "power-loss":
                for v in victims:
                    hosts.power_loss(v)
        elif kind == "pause":
            for v in victims:
                brokers.signal(v, signal.SIGSTOP)
        elif kind == "restart":
            for v in victims:
                brokers.stop(v)
        elif kind in ("isolate", "link-down", "redeploy"):
            for v in victims:
                if kind == "link-down":
                    hosts.link(v, up=False)
                else:
                    for o in self.order:
                        if o != v:
                            hosts.cut(v, o)
            if kind == "redeploy":
                error = self._flows(fault).deploy(others[0], EXTRA_FLOW)
                self._note("deploy", fault, flow="extra", through=others[0], error=error)
        elif kind in ("split", "cut-two", "bridge"):
            for a in victims:
                for b in others:
                    hosts.cut(a, b)
        elif kind == "one-way":
            hosts.cut(victims[0], others[0], both=False)
        elif kind == "client-cut":
            hosts.cut(self.clients, victims[0])
        elif kind == "disk-full":
            hosts.fill(victims[0])
        elif kind == "starve":
            for v, share in zip(victims, str(fault.rules["cpu"]).split(), strict=True):
                pid = brokers.pid(v)
                hosts.throttle(v, [pid] if pid is not None else [], float(share))
        else:
            raise ExperimentError(f"unknown fault kind {kind!r}")

    def heal(self, fault: Fault) -> None:
        victims, others = self._sides(fault)
        kind, hosts, brokers = fault.kind, self.hosts, self.brokers
        failed: list[str] = []
        if kind in LINKS:
            for a, b in self._links(fault):
                self._proxies(fault).clear_link(a, b)
        elif kind == "ack-cut":
            self._proxies(fault).clear_ack_cut(victims[0])
        elif kind in ("kill", "kill-adjacent", "kill-minority", "power-loss", "restart"):
            for v in victims:
                try:
                    brokers.start(v)
                except ExperimentError as e:  # (a broker that does not come back is a finding:
                    failed.append(str(e))  # the run goes on without it, the checker counts it)
        elif kind == "pause":
            for v in victims:
                brokers.signal(v, signal.SIGCONT)
        elif kind == "link-down":
            hosts.link(victims[0], up=True)
        elif kind in ("isolate", "redeploy"):
            for o in self.order:
                if o != victims[0]:
                    hosts.mend(victims[0], o)
            if kind == "redeploy":
                error = self._flows(fault).undeploy(victims[0], "extra")
                self._note("undeploy", fault, flow="extra", through=victims[0], error=error)
        elif kind in ("split", "cut-two", "bridge"):
            for a in victims:
                for b in others:
                    hosts.mend(a, b)
        elif kind == "one-way":
            hosts.mend(victims[0], others[0], both=False)
        elif kind == "client-cut":
            hosts.mend(self.clients, victims[0])
        elif kind == "disk-full":
            hosts.drain(victims[0])
        elif kind == "starve":
            hosts.unthrottle()
        self._note("heal", fault, **({"failed": failed} if failed else {}))
        self._struck.pop(fault, None)
