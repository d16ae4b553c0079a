"""The discrete-event simulator: one heap, one virtual clock, many sans-IO cores.

How it works: every pending happening -- a message in flight, a timer, a crash,
a scheduled control call -- is one tuple ``(time, seq, kind, node, x, y)`` in a
binary heap. ``seq`` comes from one counter, so events at the same time run in
the order they were scheduled and a run never compares two messages. Popping an
event advances the clock and hands it to the node's core (``on_message`` or
``on_timer``); the effects the core returns are carried out at once:

* ``Send`` -- counted, then sent through the transport :class:`~flowbus.sim.transport.Chain`
  (a drop is counted as a loss with its reason, otherwise the message is pushed
  at ``now + delay``);
* ``Deliver`` -- counted by :class:`~flowbus.sim.metrics.Metrics` (duplicates
  detected) and passed to the optional ``on_deliver`` callback (``DeliverAll``: the same
  for each of its subscriptions);
* a :class:`~flowbus.core.Outcome` (``Settled``, ``PublishRefused``, ``Ended``) -- passed to
  the optional ``on_outcome`` callback;
* ``SetTimer`` / ``CancelTimer`` -- each node maps a timer key to the ``seq`` of
  its live heap entry; setting a key again or cancelling it makes the old entry
  stale, and a stale entry is skipped when popped.

A crashed node gets no more messages (those in flight or sent later are counted
as ``"crash"`` losses) and its timers are dropped. A *paused* node (:meth:`Simulator.pause`,
a process stopped with SIGSTOP) handles nothing until its pause ends: what comes for it
meanwhile (messages, which its kernel buffers; its timers; calls to it; notices) waits, and
is handled then, in the order it came, on the clock of then. With ``failure_notice=d`` the
transport behaves like an acknowledged link: a message dropped because its
destination is unreachable (crashed, or a ``"link"`` / ``"partition"`` drop) is
reported back to its live sender ``d`` time units later through the core's
``on_send_failed(dst, msg, now)`` (a :class:`~flowbus.core.Core` that has nothing to do
with it keeps the default, which does nothing), after ``on_peer_gone(dst, now)`` when the
destination crashed (what a refused connection tells on real sockets: its process is gone;
a cut link or a partition proves nothing of the kind); random loss is never reported. All
randomness derives from the master seed through ``rng(name)`` (SHA-256 of
``"{seed}/{name}"``, never the salted built-in ``hash``), so one config and seed give
byte-identical results. The cores are :class:`flowbus.core.Core` objects: the asyncio
runtime (:mod:`flowbus.net.runtime`) drives the same ones.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
import random
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Final

from flowbus.core import CancelTimer, Core, Deliver, DeliverAll, Effect, Outcome, Send, SetTimer
from flowbus.errors import ProtocolError, SimError
from flowbus.sim.metrics import Metrics
from flowbus.sim.transport import Chain, Layer

__all__ = ["EXTERNAL", "UNREACHABLE", "SimError", "Simulator", "derive_seed"]

EXTERNAL: Final = -1
"""The ``src`` of a message injected from outside the simulated network."""

_MSG: Final = 0
_TIMER: Final = 1
_CRASH: Final = 2
_CALL: Final = 3
_FAILED: Final = 4
_GONE: Final = 5
_RESUME: Final = 6

UNREACHABLE: Final = frozenset({"crash", "link", "partition"})
"""The drop reasons a ``failure_notice`` reports to the sender (a dead peer, a cut link)."""

Entry = tuple[float, int, int, int, Any, Any]
DeliverHook = Callable[[int, Hashable, Any, float], object]
OutcomeHook = Callable[[int, Outcome, float], object]
ProgressHook = Callable[[int, float], object]


def derive_seed(seed: int | str, name: str) -> int:
    """A 256-bit integer derived from the master ``seed`` and a stream ``name``."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest(), "big")


class Simulator:
    """A heap-based event loop over integer-addressed protocol cores."""

    def __init__(
        self,
        *,
        seed: int | str = 0,
        transport: Sequence[Layer] = (),
        metrics: Metrics | None = None,
        on_deliver: DeliverHook | None = None,
        on_outcome: OutcomeHook | None = None,
        progress: ProgressHook | None = None,
        progress_every: int = 100_000,
        failure_notice: float | None = None,
    ) -> None:
        if progress_every < 1:
            raise SimError(f"progress_every must be >= 1, got {progress_every}")
        if failure_notice is not None and not failure_notice >= 0:
            raise SimError(f"failure_notice must be >= 0, got {failure_notice!r}")
        self.failure_notice = failure_notice
        self.seed = seed
        self.metrics = metrics if metrics is not None else Metrics()
        self.on_deliver = on_deliver
        self.on_outcome = on_outcome
        self.progress = progress
        self.progress_every = progress_every
        self._now = 0.0
        self._heap: list[Entry] = []
        self._next_seq = itertools.count().__next__
        self._cores: dict[int, Core] = {}
        self._timers: dict[int, dict[Hashable, int]] = {}
        self._down: set[int] = set()
        self._paused: dict[int, float] = {}  # node -> when its pause ends
        self._waiting: dict[int, list[Entry]] = {}  # a paused node -> what came for it, in order
        self._events = 0
        self._chain = Chain(transport, self)
        self._fate = self._chain.fate

    # -- set-up ---------------------------------------------------------------

    def rng(self, name: str) -> random.Random:
        """A random stream named ``name``, derived from the master seed only."""
        return random.Random(derive_seed(self.seed, name))

    def derive(self, name: str) -> int:
        """A 256-bit integer derived from the master seed and ``name``."""
        return derive_seed(self.seed, name)

    def add_node(self, node_id: int, core: Core) -> None:
        if type(node_id) is not int:
            raise SimError(f"a node id is an int, got {node_id!r}")
        if node_id in self._cores:
            raise SimError(f"node {node_id} already exists")
        self._cores[node_id] = core
        self._timers[node_id] = {}

    def core(self, node_id: int) -> Core:
        return self._cores[node_id]

    @property
    def nodes(self) -> list[int]:
        return list(self._cores)

    @property
    def now(self) -> float:
        return self._now

    @property
    def pending(self) -> int:
        """How many heap entries wait (stale timers included)."""
        return len(self._heap)

    @property
    def events_processed(self) -> int:
        return self._events

    def is_down(self, node_id: int) -> bool:
        return node_id in self._down

    def is_paused(self, node_id: int) -> bool:
        return node_id in self._paused

    # -- scheduling from outside ------------------------------------------------

    def _at(self, at: float | None) -> float:
        if at is None:
            return self._now
        if not at >= self._now:
            raise SimError(f"cannot schedule at {at!r}: the clock is already at {self._now!r}")
        return float(at)

    def inject(self, node: int, msg: Any, *, at: float | None = None, src: int = EXTERNAL) -> None:
        """Hand ``msg`` to ``node`` at time ``at`` (default now), bypassing the transport."""
        if node not in self._cores:
            raise SimError(f"inject: no node {node}")
        heapq.heappush(self._heap, (self._at(at), self._next_seq(), _MSG, node, src, msg))
        self.metrics.injected += 1

    def crash(self, node: int, *, at: float | None = None) -> None:
        """Stop ``node`` at time ``at`` (default now): no more messages, no more timers."""
        when = self._at(at)
        if when <= self._now:
            self._crash_now(node)
        else:
            heapq.heappush(self._heap, (when, self._next_seq(), _CRASH, node, None, None))

    def pause(self, node: int, until: float) -> None:
        """Stop ``node`` from now until ``until`` (see the module note; paused again meanwhile,
        it runs again at the later end); a crash meanwhile still kills it at once."""
        if node not in self._cores:
            raise SimError(f"pause: no node {node}")
        if not until >= self._now:
            raise SimError(f"pause: {until!r} is before the clock, {self._now!r}")
        if node not in self._paused:
            self._waiting[node] = []
            heapq.heappush(self._heap, (float(until), self._next_seq(), _RESUME, node, None, None))
        self._paused[node] = max(float(until), self._paused.get(node, 0.0))

    def _held(self, entry: Entry) -> bool:
        """Whether ``entry`` is for a paused node: then it waits, in the order it came."""
        if entry[2] == _CRASH or entry[2] == _RESUME or entry[3] not in self._paused:
            return False
        self._waiting[entry[3]].append(entry)
        return True

    def _resume(self, node: int, now: float) -> None:
        """``node``'s pause ends (unless it was made longer): what waited is handled now, in
        order, until the node is paused again or dies."""
        until = self._paused.get(node)
        if until is None:
            return
        if until > now:
            heapq.heappush(self._heap, (until, self._next_seq(), _RESUME, node, None, None))
            return
        del self._paused[node]
        waiting = self._waiting.pop(node, [])
        for i, entry in enumerate(waiting):
            if node in self._paused:  # (paused again by what it did: the rest waits on)
                self._waiting[node][:0] = waiting[i:]
                return
            self._process((now, *entry[1:]))

    def restart(self, node: int, core: Core) -> None:
        """A crashed ``node`` comes back now as ``core``: a new process on the same address,
        with none of the old one's state or timers (what a restarted broker is)."""
        if node not in self._down:
            raise SimError(f"restart: node {node} is not down")
        self._down.discard(node)
        self._cores[node] = core
        self._timers[node] = {}

    def schedule(self, at: float, action: Callable[[], object]) -> None:
        """Call ``action()`` at time ``at`` (a control step: fail a link, heal a partition...)."""
        heapq.heappush(self._heap, (self._at(at), self._next_seq(), _CALL, EXTERNAL, action, None))

    def invoke(self, node: int, call: Callable[[Any], Sequence[Effect]], *, at: float | None = None) -> None:
        """At time ``at`` (default now), if ``node`` is alive, call ``call(core)`` -- a local
        API call such as ``subscribe`` or ``publish`` -- and carry out the effects it returns."""
        if node not in self._cores:
            raise SimError(f"invoke: no node {node}")

        def act() -> None:
            if node not in self._down:
                effects = call(self._cores[node])
                if effects:
                    self._apply(node, effects, self._now)

        heapq.heappush(self._heap, (self._at(at), self._next_seq(), _CALL, node, act, None))

    def _crash_now(self, node: int) -> None:
        self._down.add(node)
        self._paused.pop(node, None)
        for entry in self._waiting.pop(node, ()):  # (what waited for it is lost with it)
            if entry[2] == _MSG:
                self.metrics.lost("crash")
                self._notify(entry[4], node, entry[5], self._now, gone=True)
        timers = self._timers.get(node)
        if timers:
            timers.clear()

    # -- running -------------------------------------------------------------

    def step(self) -> bool:
        """Process the next event; ``False`` if there was none (no progress report)."""
        if not self._heap:
            return False
        entry = heapq.heappop(self._heap)
        self._now = entry[0]
        self._events += 1
        self.metrics.events += 1
        if not (self._paused and self._held(entry)):
            self._process(entry)
        return True

    def run(self, *, until: float | None = None, max_events: int | None = None) -> int:
        """Process events up to time ``until`` and/or ``max_events`` of them; return how many.

        When the run stops because the next event lies past ``until`` (or none is
        left), the clock is moved to ``until``.
        """
        heap, pop, process, apply = self._heap, heapq.heappop, self._process, self._apply
        cores, down, paused, held = self._cores, self._down, self._paused, self._held
        limit = math.inf if until is None else until
        budget = -1 if max_events is None else max_events
        every = self.progress_every if self.progress is not None else 0
        report = (self._events // every + 1) * every if every else -1
        done = received = 0
        try:
            while heap and done != budget:
                if heap[0][0] > limit:
                    break
                entry = pop(heap)
                now = self._now = entry[0]
                done += 1
                node = entry[3]
                if paused and node in paused and held(entry):
                    continue
                if entry[2] == _MSG and node not in down:  # the hot path, inlined
                    received += 1
                    effects = cores[node].on_message(entry[4], entry[5], now)
                    if effects:
                        apply(node, effects, now)
                else:
                    process(entry)
                if done + self._events == report:
                    report += every
                    self.progress(done + self._events, now)  # type: ignore[misc]
        finally:
            self._events += done
            self.metrics.events += done
            self.metrics.received += received
        if until is not None and (not heap or heap[0][0] > until) and self._now < until:
            self._now = float(until)
        return done

    def _process(self, entry: Entry) -> None:
        now, seq, kind, node, x, y = entry
        if kind == _MSG:
            if node in self._down:
                self.metrics.lost("crash")
                self._notify(x, node, y, now, gone=True)
                return
            self.metrics.received += 1
            effects = self._cores[node].on_message(x, y, now)
        elif kind == _TIMER:
            timers = self._timers[node]
            if timers.get(x) != seq:
                return
            del timers[x]
            self.metrics.timers_fired += 1
            effects = self._cores[node].on_timer(x, now)
        elif kind == _CRASH:
            self._crash_now(node)
            return
        elif kind == _RESUME:
            self._resume(node, now)
            return
        elif kind == _FAILED:
            if node in self._down:
                return
            effects = self._cores[node].on_send_failed(x, y, now)
        elif kind == _GONE:
            gone = getattr(self._cores[node], "on_peer_gone", None)
            if node in self._down or gone is None:
                return
            effects = gone(x, now)
        else:
            x()
            return
        if effects:
            self._apply(node, effects, now)

    def _apply(self, node: int, effects: Sequence[Effect], now: float) -> None:
        metrics = self.metrics
        for e in effects:
            c = e.__class__
            if c is Send:
                self._send(node, e.dst, e.msg, now)  # type: ignore[union-attr]
            elif c is Deliver:
                metrics.deliver(node, e.sub, e.event, now)  # type: ignore[union-attr]
                if self.on_deliver is not None:
                    self.on_deliver(node, e.sub, e.event, now)  # type: ignore[union-attr]
            elif c is DeliverAll:
                for sub in e.subs:  # type: ignore[union-attr]
                    metrics.deliver(node, sub, e.event, now)  # type: ignore[union-attr]
                    if self.on_deliver is not None:
                        self.on_deliver(node, sub, e.event, now)  # type: ignore[union-attr]
            elif c is SetTimer:
                self._set_timer(node, e.key, now + e.delay)  # type: ignore[union-attr]
            elif c is CancelTimer:
                self._timers[node].pop(e.key, None)  # type: ignore[union-attr]
            elif isinstance(e, Outcome):
                if self.on_outcome is not None:
                    self.on_outcome(node, e, now)
            else:
                raise ProtocolError(f"node {node} returned {e!r}, which is not an Effect")

    def _send(self, src: int, dst: int, msg: Any, now: float) -> None:
        metrics = self.metrics
        metrics.sent(msg)
        if dst not in self._cores:
            metrics.lost("no_node")
            return
        if dst in self._down:
            metrics.lost("crash")
            self._notify(src, dst, msg, now, gone=True)
            return
        r = self._fate(src, dst, msg, now)
        if r.__class__ is str:
            metrics.lost(r)  # type: ignore[arg-type]
            if r in UNREACHABLE:
                self._notify(src, dst, msg, now, gone=r == "crash")
            return
        heapq.heappush(self._heap, (now + r, self._next_seq(), _MSG, dst, src, msg))  # type: ignore[operator]

    def _notify(self, src: int, dst: int, msg: Any, now: float, *, gone: bool = False) -> None:
        """Tell ``src`` (later) that ``msg`` could not reach ``dst``, if notices are on; a
        crashed ``dst`` is ``gone`` (told first: a refused connection, on real sockets)."""
        if self.failure_notice is None or src not in self._cores:
            return
        if gone:
            heapq.heappush(self._heap, (now + self.failure_notice, self._next_seq(), _GONE, src, dst, None))
        heapq.heappush(self._heap, (now + self.failure_notice, self._next_seq(), _FAILED, src, dst, msg))
        self.metrics.failure_notices += 1

    def _set_timer(self, node: int, key: Hashable, when: float) -> None:
        if node in self._down:
            return
        seq = self._next_seq()
        self._timers[node][key] = seq
        heapq.heappush(self._heap, (when, seq, _TIMER, node, key, None))
