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
* **Our suspicions** (A's side), a :class:`Suspicion` per suspect B, in one of three
  phases::

      (none) --B a ring neighbour, C known--> ASKED(C)    TestNeighbour to C, "test" timer
      (none) --B a ring neighbour, no C-----> PROBING     Probe to B ourselves, "probe" timer
      (none) --B a chord--------------------> TRACING     (the node sends a traced query)
      ASKED  --Alive-----------------------> (none)       the link A-B failed: detour via C
      ASKED  --Failed----------------------> (none)       B is dead: the node buries it
      ASKED  --timer, C heard lately,
               fewer than RETESTS retests--> ASKED(C, retests + 1)   TestNeighbour again
      ASKED  --timer or send failed--------> (none)       B and C dead: bury both, Reconnect
      PROBING --ProbeAck-------------------> (none)       B is up
      PROBING --probe timer----------------> (none)       B is dead
      TRACING --LinkDown-------------------> (none)       the trace is B's detour
      any    --B buried--------------------> (none)

* **Probes we run** (C's side), a :class:`Probing` per suspect B, for an asker (A, or
  ourselves in the PROBING phase above)::

      (none) --TestNeighbour---------------> Probing(A)   Probe to B, "probe" timer
      Probing --ProbeAck-------------------> (none)       Alive to A (ours: suspicion ends)
      Probing --probe timer, B heard since
                the probe went-------------> (none)       as if B had answered (busy, alive)
      Probing --probe timer or send failed-> (none)       B is dead: the node buries it,
                                                           closes the ring, Failed to A

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

__all__ = ["RETESTS", "FailureDetector", "Phase", "Probing", "Suspicion", "ask_key", "probe_key"]

RETESTS = 3
"""How many times a suspect's test is asked again of a tester that is slow but alive."""


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
    when we probe it or trace our link to it); ``retests`` counts the tests asked again."""

    peer: Peer
    phase: Phase
    tester: Peer
    retests: int = 0

    def __post_init__(self) -> None:
        if (self.phase is Phase.ASKED) == (self.tester == self.peer):
            raise InternalError(f"Suspicion of {self.peer}: {self.phase.name} with tester {self.tester}")
        if self.retests < 0:
            raise InternalError(f"Suspicion of {self.peer}: {self.retests} retests")


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
    twice that for its tester); ``retests`` how many times a slow but live tester is asked
    again."""

    def __init__(self, *, probe_timeout: float = 4.0, retests: int = RETESTS) -> None:
        if not probe_timeout > 0:
            raise ProtocolError(f"FailureDetector: the probe timeout must be > 0, got {probe_timeout!r}")
        if retests < 0:
            raise ProtocolError(f"FailureDetector: retests must be >= 0, got {retests!r}")
        self.probe_timeout = probe_timeout
        self.retests = retests
        self._suspicions: dict[int, Suspicion] = {}  # suspect id -> ours
        self._probing: dict[int, Probing] = {}  # suspect id -> the probe we run of it
        self._beats: dict[int, float] = {}  # peer id -> its last heartbeat (or Alive)
        self._heard: dict[int, float] = {}  # address -> when anything last came from it

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

    def beat(self, peer_id: int, now: float) -> None:
        """A heartbeat came from ``peer_id`` (or a tester says it is alive)."""
        self._beats[peer_id] = now

    def silent(self, peer: Peer, now: float, *, limit: float) -> bool:
        """Nothing came from ``peer`` for longer than ``limit`` (a neighbour not heard of
        before counts as heard now: its heartbeats have not had time to come)."""
        last = max(self._beats.setdefault(peer.id, now), self._heard.get(peer.addr, -math.inf))
        return now - last > limit

    # -- our suspicions (A's side)

    def trace(self, b: Peer) -> None:
        """(none) -> TRACING: our chord to ``b`` looks down; the node traces a way round."""
        self._begin(Suspicion(b, Phase.TRACING, b))

    def probe(self, me: Peer, b: Peer) -> list[Effect]:
        """(none) -> PROBING: no third broker to ask, we probe ``b`` ourselves."""
        self._begin(Suspicion(b, Phase.PROBING, b))
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

    def retest(self, me: Peer, b: Peer, now: float, *, window: tuple[Peer, ...]) -> list[Effect]:
        """ASKED -> ASKED: the test of ``b`` timed out, but its tester was heard from lately
        (busy, not dead): ask it again, up to ``retests`` times. No effects (and no change)
        if it is not so: the suspicion is then to be ended (:meth:`end`)."""
        s = self._suspicions.get(b.id)
        if s is None or s.tester == b or s.retests >= self.retests:
            return []
        heard = self._heard.get(s.tester.addr)
        if heard is None or now - heard > 2 * self.probe_timeout:
            return []
        self._suspicions[b.id] = replace(s, retests=s.retests + 1)
        return self._ask(me, b, s.tester, window)

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
        if probing is None or probing.probed_at is None or peer is None:
            return False
        return self._heard.get(peer.addr, -math.inf) >= probing.probed_at

    def unanswered(self, suspect: int) -> Probing | None:
        """Probing -> (none): the probe of ``suspect`` got no answer (its timer ran out,
        or its send failed). The probe that ended (the node buries the suspect), if any."""
        return self._probing.pop(suspect, None)
