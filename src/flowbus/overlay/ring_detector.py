"""The chordal ring's failure detector: who is suspected, who tests whom, who was heard
(sans-IO, driven by :class:`~flowbus.overlay.chordal_ring.RingNode`).

How it works (Madhu Kumar, Bellur, Govindan, "Chordal Reliability Rings", section 3.4.1,
figure 5): broker A suspects its ring neighbour B (a missed heartbeat, a failed send) and
asks C, B's other ring neighbour, to test it; C probes B and answers A ``Alive`` or
``Failed``. The detector keeps the state of that exchange, one record per suspect, and
decides; the ring node does the repair (burying, closing the ring, detours).

* **Liveness.** When anything last came from each address (:meth:`heard`), and when each
  neighbour's last heartbeat came (:meth:`beat`). A neighbour silent for longer than the
  limit is suspected; a busy broker's heartbeats may come late, so anything heard counts.
* **Verdicts: proof, or silence past the guard.** A broker alive but unreachable (paused,
  cut off) looks like a dead one, and its state must not be taken over while it still
  serves. So a suspect is found dead only when the verdict is *conclusive*
  (:meth:`conclusive`): a connection to it was refused (:meth:`gone`: its host answered and
  nothing listens, the process is gone), or nothing came from it for ``guard`` (longer than
  the lease a broker serves on, :meth:`echo`: see the ring node's note). A probe or a test
  that times out before then is sent again, not taken for a death; a tester that cannot be
  reached and is not proven gone leaves the suspect suspected (two adjacent brokers paused,
  or cut off together, are waited for: burying them could take over the state of brokers
  that still serve each other).
* **Leases.** Each heartbeat carries its send time; the neighbour echoes it back at once
  (``HeartbeatAck``); :meth:`echoed` is the send time of the latest heartbeat each neighbour
  acknowledged. A neighbour finds us silent only ``guard`` after the last heartbeat it
  echoed, so while our lease (a shorter time since that send) runs, no neighbour can have
  found us dead.
* **Our suspicions** (A's side), a :class:`Suspicion` per suspect B, in one of three
  phases::

      (none) --B a ring neighbour, C known--> ASKED(C)    TestNeighbour to C, "test" timer
      (none) --B a ring neighbour, no C-----> PROBING     Probe to B ourselves, "probe" timer
      (none) --B a chord--------------------> TRACING     (the node sends a traced query)
      ASKED  --Alive-----------------------> (none)       the link A-B failed: detour via C
      ASKED  --Failed, conclusive here-----> (none)       B is dead: the node buries it
      ASKED  --Failed, B heard lately------> ASKED(C)     asked again once the guard is past
      ASKED  --timer or send failed,
               C proven gone---------------> PROBING(B, also C)   we probe B ourselves
      ASKED  --timer, C not proven gone----> ASKED(C, asked + 1)  asked again (C is busy,
                                                           or cut off: no verdict without it)
      PROBING --ProbeAck-------------------> (none)       B is up
      PROBING --probe timer, conclusive----> (none)       B is dead (and the ``also``, C)
      PROBING --probe timer, not yet-------> PROBING      probed again
      TRACING --LinkDown-------------------> (none)       the trace is B's detour
      any    --B buried--------------------> (none)

* **Probes we run** (C's side), a :class:`Probing` per suspect B, for an asker (A, or
  ourselves in the PROBING phase above)::

      (none) --TestNeighbour---------------> Probing(A)   Probe to B, "probe" timer
      Probing --ProbeAck-------------------> (none)       Alive to A (ours: suspicion ends)
      Probing --probe timer, B heard since
                the probe went-------------> (none)       as if B had answered (busy, alive)
      Probing --probe timer, conclusive----> (none)       Failed to A (A buries B if it agrees,
                                                           and tells us: we bury B then)
      Probing --probe timer, not yet-------> Probing      probed again

A broker can hold both records for one suspect at once (A and C may suspect B at the
same time, each asking the other). An answer nobody waits for (a ``ProbeAck`` after its
timer, an ``Alive`` for a suspicion that ended, a timer of a record that is gone) changes
no record.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from enum import Enum

from flowbus.core import CancelTimer, Effect, Send, SetTimer
from flowbus.errors import InternalError, ProtocolError
from flowbus.overlay.ring_messages import Alive, Peer, Probe, TestNeighbour

__all__ = ["FailureDetector", "Phase", "Probing", "Suspicion", "ask_key", "probe_key"]


def probe_key(suspect: int) -> tuple[str, str, int]:
    """The key of the timer of a probe of ``suspect`` (ours or for an asker)."""
    return ("ring", "probe", suspect)


def ask_key(suspect: int) -> tuple[str, str, int]:
    """The key of the timer of a test of ``suspect`` asked of its other neighbour."""
    return ("ring", "test", suspect)


class Phase(Enum):
    """Where our suspicion of a broker stands (see the module note)."""

    ASKED = "asked"  # its other ring neighbour was asked to test it
    PROBING = "probing"  # no third broker: we probe it ourselves
    TRACING = "tracing"  # a chord: a traced query looks for a way round the link


@dataclass(frozen=True, slots=True)
class Suspicion:
    """We suspect ``peer``: ``tester`` is the broker asked to test it (``peer`` itself
    when we probe it or trace our link to it); ``asked`` counts the tests asked again;
    ``waiting``: the next test goes when the ask timer does (not an answer overdue);
    ``also``: brokers proven gone to bury with it (a tester that died too)."""

    peer: Peer
    phase: Phase
    tester: Peer
    asked: int = 0
    waiting: bool = False
    also: tuple[Peer, ...] = ()

    def __post_init__(self) -> None:
        if (self.phase is Phase.ASKED) == (self.tester == self.peer):
            raise InternalError(f"Suspicion of {self.peer}: {self.phase.name} with tester {self.tester}")
        if self.asked < 0:
            raise InternalError(f"Suspicion of {self.peer}: asked again {self.asked} times")


@dataclass(frozen=True, slots=True)
class Probing:
    """We probe ``suspect`` for ``asker`` (this broker, in the PROBING phase); ``window``
    is the asker's side away from the suspect, what the ring closes with if it is dead;
    ``probed_at`` when the probe went (None: our own probe, never taken as answered by
    other news)."""

    suspect: Peer
    asker: Peer
    window: tuple[Peer, ...] = ()
    probed_at: float | None = None


class FailureDetector:
    """The failure detector of one ring broker (see the module note).

    ``probe_timeout`` is how long a tester waits for a probed broker (an asker waits
    twice that for its tester); ``guard`` how long a suspect must have been silent for a
    verdict without proof (0: at the first unanswered probe, the document's rule; a ring
    with leases sets it past the lease)."""

    def __init__(self, *, probe_timeout: float = 4.0, guard: float = 0.0) -> None:
        if not probe_timeout > 0:
            raise ProtocolError(f"FailureDetector: the probe timeout must be > 0, got {probe_timeout!r}")
        if not guard >= 0:
            raise ProtocolError(f"FailureDetector: the guard must be >= 0, got {guard!r}")
        self.probe_timeout = probe_timeout
        self.guard = guard
        self._suspicions: dict[int, Suspicion] = {}  # suspect id -> ours
        self._probing: dict[int, Probing] = {}  # suspect id -> the probe we run of it
        self._beats: dict[int, float] = {}  # peer id -> its last heartbeat (or Alive)
        self._heard: dict[int, float] = {}  # address -> when anything last came from it
        self._gone: dict[int, float] = {}  # broker id -> when a connection to it was refused
        self._echoed: dict[int, float] = {}  # peer id -> our send time of its latest HeartbeatAck

    # -- views

    @property
    def suspects(self) -> list[int]:
        """The ids of the brokers suspected and being tested."""
        return sorted(self._suspicions)

    @property
    def watched(self) -> int:
        """How many brokers are suspected and being tested (cheap: for a driver's log)."""
        return len(self._suspicions)

    def suspected(self, peer_id: int) -> bool:
        return peer_id in self._suspicions

    def suspicion(self, peer_id: int) -> Suspicion | None:
        return self._suspicions.get(peer_id)

    def asked_of(self, tester: int) -> list[Peer]:
        """Our suspects that broker ``tester`` was asked to test (and has not answered)."""
        return [s.peer for s in self._suspicions.values() if s.phase is Phase.ASKED and s.tester.id == tester]

    def testers(self) -> Iterator[Peer]:
        """The brokers testing our suspects, in the order the suspicions began."""
        return (s.tester for s in self._suspicions.values())

    def probing(self, suspect: int) -> Probing | None:
        """The probe we run of ``suspect``, if any."""
        return self._probing.get(suspect)

    @property
    def probed(self) -> list[int]:
        """The ids of the brokers we probe, in the order the probes began."""
        return list(self._probing)

    # -- liveness

    def heard(self, addr: int, now: float) -> None:
        """Something came from ``addr``."""
        self._heard[addr] = now

    def gone(self, peer_id: int, now: float) -> None:
        """Broker ``peer_id`` is gone: a connection to its address was refused (its host
        answered, nothing listens there), or it came back as a new process. Kept by id: a
        process restarted on the address is another broker, with an id of its own."""
        self._gone[peer_id] = now

    def is_gone(self, peer_id: int) -> bool:
        """Whether broker ``peer_id`` was proven gone."""
        return peer_id in self._gone

    def echo(self, peer_id: int, sent: float) -> None:
        """``peer_id`` acknowledged our heartbeat sent at ``sent``."""
        if sent > self._echoed.get(peer_id, -math.inf):
            self._echoed[peer_id] = sent

    def echoed(self, peer_id: int) -> float:
        """The send time of our latest heartbeat ``peer_id`` acknowledged (-inf: none)."""
        return self._echoed.get(peer_id, -math.inf)

    def silence(self, peer: Peer, now: float) -> float:
        """For how long nothing has come from ``peer`` (inf: never heard)."""
        return now - max(self._beats.get(peer.id, -math.inf), self._heard.get(peer.addr, -math.inf))

    def conclusive(self, peer: Peer, now: float) -> bool:
        """Whether ``peer`` may be found dead now: proven gone, or silent for ``guard``."""
        return peer.id in self._gone or self.silence(peer, now) >= self.guard

    def wait_left(self, peer: Peer, now: float) -> float:
        """How long until ``peer``'s silence reaches the guard (0: it has)."""
        return max(0.0, self.guard - self.silence(peer, now))

    def beat(self, peer_id: int, now: float) -> None:
        """A heartbeat came from ``peer_id`` (or a tester says it is alive)."""
        self._beats[peer_id] = now

    def quiet(self, addr: int, now: float, *, limit: float) -> bool:
        """Nothing came from the broker at ``addr`` for longer than ``limit`` (or ever)."""
        return now - self._heard.get(addr, -math.inf) > limit

    def silent(self, peer: Peer, now: float, *, limit: float) -> bool:
        """Nothing came from ``peer`` for longer than ``limit`` (a neighbour not heard of
        before counts as heard now: its heartbeats have not had time to come)."""
        last = max(self._beats.setdefault(peer.id, now), self._heard.get(peer.addr, -math.inf))
        return now - last > limit

    # -- our suspicions (A's side)

    def trace(self, b: Peer) -> None:
        """(none) -> TRACING: our chord to ``b`` looks down; the node traces a way round."""
        self._begin(Suspicion(b, Phase.TRACING, b))

    def probe(self, me: Peer, b: Peer, also: tuple[Peer, ...] = ()) -> list[Effect]:
        """(none) -> PROBING: no third broker to ask (or the one to ask, ``also``, is proven
        gone: buried with ``b`` if ``b`` is found dead), we probe ``b`` ourselves."""
        self._begin(Suspicion(b, Phase.PROBING, b, also=also))
        running = self._probing.get(b.id)  # (probing it for an asker already: ours now)
        self._probing[b.id] = Probing(b, me) if running is None else replace(running, asker=me)
        return [Send(b.addr, Probe(me)), SetTimer(self.probe_timeout, probe_key(b.id))]

    def ask(self, me: Peer, b: Peer, tester: Peer, window: tuple[Peer, ...]) -> list[Effect]:
        """(none) -> ASKED: ask ``tester``, ``b``'s other ring neighbour, to test it;
        ``window`` is our side away from ``b``."""
        self._begin(Suspicion(b, Phase.ASKED, tester))
        return self._ask(me, b, tester, window)

    def _ask(self, me: Peer, b: Peer, tester: Peer, window: tuple[Peer, ...]) -> list[Effect]:
        test = TestNeighbour(b, me, window)
        return [Send(tester.addr, test), SetTimer(2 * self.probe_timeout, ask_key(b.id))]

    def _begin(self, suspicion: Suspicion) -> None:
        if suspicion.peer.id in self._suspicions:
            raise InternalError(f"FailureDetector: {suspicion.peer} is suspected already")
        self._suspicions[suspicion.peer.id] = suspicion

    def alive(self, suspect: int, now: float) -> list[Effect]:
        """ASKED -> (none): the tester found ``suspect`` up (our link to it failed)."""
        self._suspicions.pop(suspect, None)
        self._beats[suspect] = now
        return [CancelTimer(ask_key(suspect))]

    def failed(self, suspect: int) -> list[Effect]:
        """ASKED -> (none): the tester found ``suspect`` dead."""
        self._suspicions.pop(suspect, None)
        return [CancelTimer(ask_key(suspect))]

    def ask_later(self, b: Peer, delay: float) -> list[Effect]:
        """ASKED -> ASKED (waiting): the tester is asked again in ``delay`` (it did not
        answer and is not proven gone, or its verdict came before ours could)."""
        s = self._suspicions.get(b.id)
        if s is None or s.phase is not Phase.ASKED:
            return []
        self._suspicions[b.id] = replace(s, waiting=True)
        return [SetTimer(max(delay, 0.0), ask_key(b.id))]

    def ask_again(self, me: Peer, b: Peer, window: tuple[Peer, ...]) -> list[Effect]:
        """ASKED (waiting, its timer gone off) -> ASKED: the test goes to the tester again."""
        s = self._suspicions.get(b.id)
        if s is None or s.phase is not Phase.ASKED:
            return []
        self._suspicions[b.id] = replace(s, asked=s.asked + 1, waiting=False)
        return self._ask(me, b, s.tester, window)

    def probe_instead(self, me: Peer, b: Peer) -> list[Effect]:
        """ASKED -> PROBING: the tester is proven gone; we probe ``b`` ourselves, and bury
        the tester with it if ``b`` is found dead."""
        s = self._suspicions.pop(b.id, None)
        return self.probe(me, b, (s.tester,) if s is not None and s.phase is Phase.ASKED else ())

    def reprobe(self, me: Peer, b: Peer, now: float) -> list[Effect]:
        """Probing -> Probing: no verdict yet (not proven gone, not silent for the guard):
        probe ``b`` again, the timer at least until its silence reaches the guard."""
        probing = self._probing.get(b.id)
        if probing is None:
            return []
        if probing.probed_at is not None:
            self._probing[b.id] = replace(probing, probed_at=now)
        delay = max(self.probe_timeout, self.wait_left(b, now))
        return [Send(b.addr, Probe(me)), SetTimer(delay, probe_key(b.id))]

    def end(self, suspect: int) -> Suspicion | None:
        """Any phase -> (none): the test gave up, the trace found a path, or the suspect
        was buried. The suspicion that ended, if there was one."""
        return self._suspicions.pop(suspect, None)

    # -- probes we run (C's side)

    def test(self, me: Peer, msg: TestNeighbour, now: float) -> list[Effect]:
        """(none) -> Probing: ``msg.asker`` asks us to test ``msg.suspect``."""
        suspect = msg.suspect
        self._probing[suspect.id] = Probing(suspect, msg.asker, msg.window, now)
        return [Send(suspect.addr, Probe(me)), SetTimer(self.probe_timeout, probe_key(suspect.id))]

    def answered(self, me: Peer, peer: Peer) -> list[Effect]:
        """Probing -> (none): ``peer`` answered the probe (or was heard since it went). The
        asker hears ``Alive``; our own probe ends our suspicion. An answer nobody waits
        for only cancels the timer."""
        out: list[Effect] = [CancelTimer(probe_key(peer.id))]
        probing = self._probing.pop(peer.id, None)
        if probing is None:
            return out
        if probing.asker == me:  # our own probe: the broker is up, our link to it is not
            self._suspicions.pop(peer.id, None)
            return out
        return [*out, Send(probing.asker.addr, Alive(peer, me))]

    def answered_late(self, suspect: int, peer: Peer | None) -> bool:
        """Something came from ``peer`` since we probed it for an asker: it is alive, if
        slow to answer the probe."""
        probing = self._probing.get(suspect)
        if probing is None or probing.probed_at is None or peer is None or peer.id in self._gone:
            return False  # (proven gone: what comes from its address is another process)
        return self._heard.get(peer.addr, -math.inf) >= probing.probed_at

    def unanswered(self, suspect: int) -> Probing | None:
        """Probing -> (none): the probe of ``suspect`` got no answer (its timer ran out,
        or its send failed). The probe that ended (the node buries the suspect), if any."""
        return self._probing.pop(suspect, None)
