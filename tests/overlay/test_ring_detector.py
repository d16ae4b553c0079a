"""The chordal ring's failure detector, driven directly (no simulator, no ring node): each
transition of a suspicion (ASKED, PROBING, TRACING) and of a probe run for an asker, the
liveness stamps, and answers nobody waits for, which change no record."""

from __future__ import annotations

from typing import Any

import pytest

from flowbus.core import CancelTimer, Send, SetTimer
from flowbus.errors import InternalError, ProtocolError
from flowbus.overlay import ring_messages as msgs
from flowbus.overlay.ring_detector import (
    FailureDetector,
    Phase,
    Probing,
    Suspicion,
    ask_key,
    probe_key,
)
from flowbus.overlay.ring_messages import Alive, Peer, Probe

ME, A, B, C = Peer(100, 1), Peer(50, 0), Peer(200, 2), Peer(300, 3)
FAR = (A, Peer(40, 9))  # our side away from B
PT = 4.0


def records(d: FailureDetector) -> Any:
    """Every record the detector holds (what a transition may change)."""
    ids = sorted({*d.suspects, *d.probed})
    return ([d.suspicion(i) for i in ids], [d.probing(i) for i in ids], d.probed)


def asked() -> FailureDetector:
    d = FailureDetector(probe_timeout=PT)
    d.ask(ME, B, C, FAR)
    return d


# -- our suspicions (A's side)


def test_ask_sends_the_test_to_the_other_neighbour_and_waits_twice_the_probe_timeout() -> None:
    d = FailureDetector(probe_timeout=PT)
    test = msgs.TestNeighbour(B, ME, FAR)
    assert d.ask(ME, B, C, FAR) == [Send(C.addr, test), SetTimer(2 * PT, ask_key(B.id))]
    assert d.suspicion(B.id) == Suspicion(B, Phase.ASKED, C)
    assert d.suspects == [B.id] and d.watched == 1 and d.suspected(B.id)
    assert list(d.testers()) == [C]


def test_a_suspect_is_suspected_once() -> None:
    d = asked()
    with pytest.raises(InternalError, match="suspected already"):
        d.ask(ME, B, C, FAR)
    with pytest.raises(InternalError, match="suspected already"):
        d.probe(ME, B)
    assert d.suspicion(B.id) == Suspicion(B, Phase.ASKED, C)


def test_alive_ends_the_suspicion_and_counts_as_a_heartbeat() -> None:
    d = asked()
    assert d.alive(B.id, 7.0) == [CancelTimer(ask_key(B.id))]
    assert not d.suspected(B.id) and d.watched == 0
    assert not d.silent(B, 7.0 + 2 * PT, limit=2 * PT)  # heard at 7.0 (through C)


def test_failed_ends_the_suspicion() -> None:
    d = asked()
    assert d.failed(B.id) == [CancelTimer(ask_key(B.id))]
    assert d.suspects == []


def test_a_tester_is_asked_again_later_then_the_test_goes_again() -> None:
    """No verdict without the tester (busy, or cut off with the suspect): asked again, with
    no limit, and never a burial of both."""
    d = asked()
    assert d.ask_later(B, 3.0) == [SetTimer(3.0, ask_key(B.id))]
    assert d.suspicion(B.id) == Suspicion(B, Phase.ASKED, C, waiting=True)
    for n in range(1, 6):
        again = d.ask_again(ME, B, FAR)
        assert again == [Send(C.addr, msgs.TestNeighbour(B, ME, FAR)), SetTimer(2 * PT, ask_key(B.id))]
        assert d.suspicion(B.id) == Suspicion(B, Phase.ASKED, C, asked=n)


def test_a_tester_proven_gone_is_replaced_by_our_own_probe_and_buried_with_the_suspect() -> None:
    d = asked()
    assert d.probe_instead(ME, B) == [Send(B.addr, Probe(ME)), SetTimer(PT, probe_key(B.id))]
    assert d.suspicion(B.id) == Suspicion(B, Phase.PROBING, B, also=(C,))
    assert d.probing(B.id) == Probing(B, ME)


def test_a_verdict_needs_a_proof_or_silence_past_the_guard() -> None:
    d = FailureDetector(probe_timeout=PT, guard=10.0)
    d.heard(B.addr, 100.0)
    assert not d.conclusive(B, 109.0) and d.wait_left(B, 104.0) == 6.0
    assert d.conclusive(B, 110.0) and d.wait_left(B, 111.0) == 0.0
    d.gone(B.id, 101.0)
    assert d.is_gone(B.id) and d.conclusive(B, 101.0)  # refused: its process is gone
    d.heard(B.addr, 102.0)  # (a process restarted on that address is another broker)
    assert d.is_gone(B.id) and not d.conclusive(Peer(B.id + 1, B.addr), 103.0)
    assert FailureDetector(probe_timeout=PT).conclusive(B, 0.0)  # no guard: at once


def test_a_reprobe_waits_at_least_until_the_guard() -> None:
    d = FailureDetector(probe_timeout=PT, guard=10.0)
    d.test(C, msgs.TestNeighbour(B, ME, FAR), 100.0)
    d.heard(B.addr, 99.0)
    assert d.reprobe(C, B, 101.0) == [Send(B.addr, Probe(C)), SetTimer(8.0, probe_key(B.id))]
    assert d.probing(B.id) == Probing(B, ME, FAR, 101.0)  # (heard after this counts as an answer)
    assert d.reprobe(C, B, 120.0) == [Send(B.addr, Probe(C)), SetTimer(PT, probe_key(B.id))]
    assert d.reprobe(C, A, 120.0) == []  # (not probed)


def test_echoes_keep_the_latest_heartbeat_acknowledged() -> None:
    d = FailureDetector(probe_timeout=PT)
    assert d.echoed(B.id) == float("-inf")
    d.echo(B.id, 5.0)
    d.echo(B.id, 3.0)  # (a late acknowledgement of an older heartbeat)
    assert d.echoed(B.id) == 5.0


def test_probe_ourselves_when_there_is_no_third_broker() -> None:
    d = FailureDetector(probe_timeout=PT)
    assert d.probe(ME, B) == [Send(B.addr, Probe(ME)), SetTimer(PT, probe_key(B.id))]
    assert d.suspicion(B.id) == Suspicion(B, Phase.PROBING, B)
    assert d.probing(B.id) == Probing(B, ME)
    assert d.ask_later(B, 1.0) == [] and d.ask_again(ME, B, FAR) == []  # (nobody else to ask)


def test_our_own_probe_answered_ends_the_suspicion() -> None:
    d = FailureDetector(probe_timeout=PT)
    d.probe(ME, B)
    assert d.answered(ME, B) == [CancelTimer(probe_key(B.id))]  # no Alive to send: we asked
    assert records(d) == ([], [], [])


def test_our_own_probe_unanswered_is_a_dead_suspect_the_node_buries() -> None:
    d = FailureDetector(probe_timeout=PT)
    d.probe(ME, B)
    d.heard(B.addr, 5.0)
    assert not d.answered_late(B.id, B)  # our own probe: other news does not count
    assert d.unanswered(B.id) == Probing(B, ME)
    assert d.probed == [] and d.suspicion(B.id) == Suspicion(B, Phase.PROBING, B)
    assert d.end(B.id) == Suspicion(B, Phase.PROBING, B)  # (the node's burial)


def test_a_chord_is_traced_until_a_path_is_found() -> None:
    d = FailureDetector(probe_timeout=PT)
    d.trace(B)
    assert d.suspicion(B.id) == Suspicion(B, Phase.TRACING, B) and d.probed == []
    assert d.end(B.id) == Suspicion(B, Phase.TRACING, B)  # LinkDown came back
    assert d.suspects == []


# -- probes we run (C's side)


def test_a_test_asked_of_us_probes_the_suspect() -> None:
    d = FailureDetector(probe_timeout=PT)
    effects = d.test(ME, msgs.TestNeighbour(B, A, FAR), 3.0)
    assert effects == [Send(B.addr, Probe(ME)), SetTimer(PT, probe_key(B.id))]
    assert d.probing(B.id) == Probing(B, A, FAR, 3.0)
    assert d.suspects == []  # (not our suspicion)


def test_an_answered_probe_tells_the_asker_alive() -> None:
    d = FailureDetector(probe_timeout=PT)
    d.test(ME, msgs.TestNeighbour(B, A, FAR), 3.0)
    assert d.answered(ME, B) == [CancelTimer(probe_key(B.id)), Send(A.addr, Alive(B, ME))]
    assert records(d) == ([], [], [])


def test_a_suspect_heard_from_since_the_probe_went_is_alive() -> None:
    d = FailureDetector(probe_timeout=PT)
    d.test(ME, msgs.TestNeighbour(B, A, FAR), 3.0)
    d.heard(B.addr, 2.0)
    assert not d.answered_late(B.id, B)  # heard before the probe went
    d.heard(B.addr, 3.0)
    assert d.answered_late(B.id, B)
    assert not d.answered_late(B.id, None)  # (not a broker we know)


def test_an_unanswered_probe_is_a_dead_suspect() -> None:
    d = FailureDetector(probe_timeout=PT)
    d.test(ME, msgs.TestNeighbour(B, A, FAR), 3.0)
    assert d.unanswered(B.id) == Probing(B, A, FAR, 3.0)  # the node buries B, Failed to A
    assert records(d) == ([], [], [])


def test_a_later_test_of_the_same_suspect_replaces_the_first() -> None:
    d = FailureDetector(probe_timeout=PT)
    d.test(ME, msgs.TestNeighbour(B, A, FAR), 3.0)
    d.test(ME, msgs.TestNeighbour(B, C, (C,)), 4.0)
    assert d.probing(B.id) == Probing(B, C, (C,), 4.0) and d.probed == [B.id]


def test_probing_ourselves_a_suspect_we_probe_for_an_asker_takes_that_probe_over() -> None:
    d = FailureDetector(probe_timeout=PT)
    d.test(ME, msgs.TestNeighbour(B, A, FAR), 3.0)
    d.probe(ME, B)
    assert d.probing(B.id) == Probing(B, ME, FAR, 3.0)
    assert d.answered(ME, B) == [CancelTimer(probe_key(B.id))]
    assert records(d) == ([], [], [])


def test_both_roles_at_once_for_one_suspect() -> None:
    """A and C both suspect B and ask each other: each holds a suspicion and a probe."""
    d = asked()
    d.test(ME, msgs.TestNeighbour(B, C, (C,)), 3.0)
    assert d.answered(ME, B) == [CancelTimer(probe_key(B.id)), Send(C.addr, Alive(B, ME))]
    assert d.suspicion(B.id) == Suspicion(B, Phase.ASKED, C)  # ours waits for C's answer
    assert d.failed(B.id) == [CancelTimer(ask_key(B.id))]
    assert records(d) == ([], [], [])


# -- answers nobody waits for


def test_late_or_unknown_answers_change_no_record() -> None:
    d = asked()
    d.test(ME, msgs.TestNeighbour(C, A, FAR), 3.0)
    before = records(d)
    assert d.answered(ME, A) == [CancelTimer(probe_key(A.id))]  # a ProbeAck nobody waits for
    assert d.alive(A.id, 9.0) == [CancelTimer(ask_key(A.id))]  # an Alive for no suspicion
    assert d.failed(A.id) == [CancelTimer(ask_key(A.id))]  # a Failed for no suspicion
    assert d.unanswered(A.id) is None  # a probe timer of a probe that is over
    assert d.end(A.id) is None  # a test timer of a suspicion that is over
    assert d.ask_later(A, 1.0) == [] and d.ask_again(ME, A, FAR) == []  # a test timer too late
    assert d.reprobe(ME, A, 9.0) == []
    assert not d.answered_late(A.id, A)
    assert records(d) == before


def test_an_answer_after_the_record_ended_changes_nothing() -> None:
    d = FailureDetector(probe_timeout=PT)
    d.test(ME, msgs.TestNeighbour(B, A, FAR), 3.0)
    assert d.unanswered(B.id) is not None
    assert d.answered(ME, B) == [CancelTimer(probe_key(B.id))]  # the ProbeAck came too late
    d.ask(ME, C, A, FAR)
    assert d.failed(C.id) == [CancelTimer(ask_key(C.id))]
    assert d.alive(C.id, 5.0) == [CancelTimer(ask_key(C.id))]  # a second answer
    assert records(d) == ([], [], [])


# -- liveness


def test_silence_counts_from_the_last_heartbeat_or_anything_heard() -> None:
    d = FailureDetector(probe_timeout=PT)
    assert not d.silent(B, 10.0, limit=5.0)  # never heard of: counts as heard now
    assert d.silent(B, 16.0, limit=5.0)
    d.heard(B.addr, 14.0)  # (anything from its address)
    assert not d.silent(B, 16.0, limit=5.0)
    d.beat(B.id, 20.0)
    assert not d.silent(B, 24.0, limit=5.0) and d.silent(B, 25.5, limit=5.0)


def test_records_and_options_are_checked() -> None:
    with pytest.raises(InternalError, match="ASKED"):
        Suspicion(B, Phase.ASKED, B)
    with pytest.raises(InternalError, match="PROBING"):
        Suspicion(B, Phase.PROBING, C)
    with pytest.raises(InternalError, match="asked again"):
        Suspicion(B, Phase.ASKED, C, asked=-1)
    with pytest.raises(ProtocolError, match="probe timeout"):
        FailureDetector(probe_timeout=0.0)
    with pytest.raises(ProtocolError, match="guard"):
        FailureDetector(guard=-1.0)
