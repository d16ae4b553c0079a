"""The event loop: ordering, tie-breaking, timers, crashes, injection, run limits."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import pytest

from flowbus.core import CancelTimer, Core, Deliver, Effect, Ended, PublishRefused, Send, SetTimer, Settled
from flowbus.errors import FlowbusError, ProtocolError
from flowbus.sim import EXTERNAL, ConstantLatency, LinkFailure, Loss, SimError, Simulator, derive_seed

from .cores import Do, Ping, PingPong, Pong, Recorder


def test_ping_pong_alternates_with_constant_latency() -> None:
    sim = Simulator(transport=[ConstantLatency(2.0)])
    a, b = PingPong(limit=3), PingPong(limit=3)
    sim.add_node(0, a)
    sim.add_node(1, b)
    sim.inject(1, Ping(0), src=0)
    sim.run()
    assert b.seen == [(0.0, 0, Ping(0)), (4.0, 0, Ping(1)), (8.0, 0, Ping(2))]
    assert a.seen == [(2.0, 1, Pong(0)), (6.0, 1, Pong(1)), (10.0, 1, Pong(2))]
    assert sim.now == 10.0
    m = sim.metrics.to_dict()
    assert m["sent_by_type"] == {"Ping": 2, "Pong": 3}
    assert m["received"] == 6 and m["injected"] == 1 and m["lost"] == 0


def test_same_time_events_run_in_scheduling_order() -> None:
    sim = Simulator()
    r = Recorder()
    sim.add_node(0, r)
    sim.add_node(1, Recorder())
    sends = tuple(Send(0, f"m{i}") for i in range(5))
    sim.inject(1, Do(sends), at=1.0)
    sim.inject(0, "early", at=1.0)
    sim.run()
    assert [e[3] for e in r.log] == ["early", "m0", "m1", "m2", "m3", "m4"]
    assert all(e[0] == 1.0 for e in r.log)


def test_injection_defaults_and_source() -> None:
    sim = Simulator()
    r = Recorder()
    sim.add_node(3, r)
    sim.inject(3, "x", at=5.0)
    sim.inject(3, "y", at=2.0, src=7)
    sim.run()
    assert r.log == [(2.0, "msg", 7, "y"), (5.0, "msg", EXTERNAL, "x")]


def test_errors_are_flowbus_errors() -> None:
    sim = Simulator()
    sim.add_node(0, Recorder())
    with pytest.raises(SimError, match="already exists"):
        sim.add_node(0, Recorder())
    with pytest.raises(SimError, match="no node 9"):
        sim.inject(9, "x")
    sim.inject(0, "x", at=3.0)
    sim.run()
    with pytest.raises(SimError, match=r"clock is already at 3\.0"):
        sim.inject(0, "x", at=1.0)
    sim.inject(0, Do(("not an effect",)))  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="not an Effect"):
        sim.run()
    assert issubclass(SimError, FlowbusError)


def test_run_until_and_max_events() -> None:
    sim = Simulator()
    r = Recorder()
    sim.add_node(0, r)
    for t in (1.0, 2.0, 3.0, 4.0):
        sim.inject(0, t, at=t)
    assert sim.run(until=2.5) == 2
    assert sim.now == 2.5
    assert sim.run(max_events=1) == 1
    assert sim.now == 3.0
    assert sim.step() and sim.now == 4.0
    assert not sim.step()
    assert sim.run(until=10.0) == 0 and sim.now == 10.0
    assert sim.events_processed == 4 and sim.metrics.events == 4


def test_progress_callback() -> None:
    calls: list[tuple[int, float]] = []
    sim = Simulator(progress=lambda n, t: calls.append((n, t)), progress_every=3)
    sim.add_node(0, Recorder())
    for t in range(7):
        sim.inject(0, t, at=float(t))
    sim.run(max_events=4)
    sim.run()
    assert calls == [(3, 2.0), (6, 5.0)]


def _timer_sim() -> tuple[Simulator, Recorder]:
    sim = Simulator()
    r = Recorder()
    sim.add_node(0, r)
    return sim, r


def _timers(r: Recorder) -> list[tuple[float, Hashable]]:
    return [(e[0], e[2]) for e in r.log if e[1] == "timer"]


def test_timer_fires_after_its_delay() -> None:
    sim, r = _timer_sim()
    sim.inject(0, Do((SetTimer(2.5, "a"), SetTimer(1.0, "b"))), at=1.0)
    sim.run()
    assert _timers(r) == [(2.0, "b"), (3.5, "a")]
    assert sim.metrics.timers_fired == 2


def test_setting_a_key_again_replaces_the_timer() -> None:
    sim, r = _timer_sim()
    sim.inject(0, Do((SetTimer(1.0, "a"),)))
    sim.inject(0, Do((SetTimer(5.0, "a"),)), at=0.5)
    sim.run()
    assert _timers(r) == [(5.5, "a")]


def test_cancelled_timer_never_fires() -> None:
    sim, r = _timer_sim()
    sim.inject(0, Do((SetTimer(1.0, "a"), SetTimer(1.0, "b"))))
    sim.inject(0, Do((CancelTimer("a"), CancelTimer("missing"))), at=0.5)
    sim.run()
    assert _timers(r) == [(1.0, "b")]


def test_timer_can_be_set_again_after_firing() -> None:
    class Ticker(Core):
        def __init__(self) -> None:
            self.ticks: list[float] = []

        def on_message(self, src: int, msg: Any, now: float) -> Sequence[Effect]:
            return [SetTimer(1.0, "tick")]

        def on_timer(self, key: Hashable, now: float) -> Sequence[Effect]:
            self.ticks.append(now)
            return [SetTimer(1.0, "tick")] if len(self.ticks) < 3 else []

    sim = Simulator()
    t = Ticker()
    sim.add_node(0, t)
    sim.inject(0, "start")
    sim.run()
    assert t.ticks == [1.0, 2.0, 3.0]


def test_crash_stops_messages_and_timers() -> None:
    sim, r = _timer_sim()
    sim.add_node(1, Recorder())
    sim.inject(0, Do((SetTimer(5.0, "late"), SetTimer(1.0, "early"))))
    sim.inject(0, "before", at=2.0)
    sim.crash(0, at=3.0)
    sim.inject(0, "after", at=4.0)
    sim.inject(1, Do((Send(0, "to-dead"),)), at=6.0)
    sim.run()
    assert [e[3] for e in r.log if e[1] == "msg"][1:] == ["before"]
    assert _timers(r) == [(1.0, "early")]
    assert sim.is_down(0) and not sim.is_down(1)
    assert sim.metrics.lost_by_reason() == {"crash": 2}


def test_crashed_node_cannot_set_timers_and_crash_now() -> None:
    sim, r = _timer_sim()
    sim.crash(0)
    sim.inject(0, Do((SetTimer(1.0, "x"),)))
    sim.run()
    assert r.log == []


def test_send_to_unknown_node_is_a_loss() -> None:
    sim = Simulator()
    sim.add_node(0, Recorder())
    sim.inject(0, Do((Send(42, "x"),)))
    sim.run()
    assert sim.metrics.lost_by_reason() == {"no_node": 1}


def test_deliver_goes_to_metrics_and_callback() -> None:
    got: list[tuple[int, Hashable, Any, float]] = []
    sim = Simulator(on_deliver=lambda n, s, e, t: got.append((n, s, e, t)))
    sim.add_node(0, Recorder())
    sim.inject(0, Do((Deliver("s", "e1"), Deliver("s", "e1"))), at=2.0)
    sim.run()
    assert got == [(0, "s", "e1", 2.0), (0, "s", "e1", 2.0)]
    assert sim.metrics.deliveries == 2 and sim.metrics.duplicates == 1


def test_outcomes_go_to_the_outcome_callback_and_nowhere_else() -> None:
    got: list[tuple[int, Any, float]] = []
    sim = Simulator(on_outcome=lambda n, o, t: got.append((n, o, t)))
    sim.add_node(0, Recorder())
    outcomes = (Settled((("p", 1),)), PublishRefused(((("p", 2), "no"),)), Ended(("s",)))
    sim.inject(0, Do(outcomes), at=2.0)
    sim.run()
    assert got == [(0, o, 2.0) for o in outcomes]
    assert sim.metrics.deliveries == 0 and sim.metrics.sent_by_type() == {}
    quiet = Simulator()  # (no callback: an outcome is dropped, not an error)
    quiet.add_node(0, Recorder())
    quiet.inject(0, Do(outcomes), at=1.0)
    quiet.run()


def test_schedule_runs_a_control_action() -> None:
    sim = Simulator()
    seen: list[float] = []
    sim.schedule(4.0, lambda: seen.append(sim.now))
    sim.run()
    assert seen == [4.0]


def test_rng_streams_are_derived_from_seed_and_name() -> None:
    a, b = Simulator(seed=7), Simulator(seed=7)
    assert a.rng("x").random() == b.rng("x").random()
    assert a.rng("x").random() != a.rng("y").random()
    assert Simulator(seed=8).rng("x").random() != a.rng("x").random()
    assert derive_seed(7, "x") == derive_seed(7, "x") and derive_seed(7, "x").bit_length() <= 256


class _Notified(Recorder):
    """A recorder that also logs the failure notices it gets."""

    def on_send_failed(self, dst: int, msg: Any, now: float) -> Sequence[Effect]:
        self.log.append((now, "failed", dst, msg))
        return [Deliver("notice", (dst, msg))]


def test_failure_notice_reports_sends_to_dead_nodes_after_the_delay() -> None:
    sim = Simulator(transport=[ConstantLatency(1.0)], failure_notice=3.0)
    a, b, c = _Notified(), Recorder(), Recorder()
    for i, core in enumerate((a, b, c)):
        sim.add_node(i, core)
    sim.crash(1)
    sim.inject(0, Do((Send(1, "x"), Send(2, "y"))))  # 1 is dead at send time
    sim.inject(0, Do((Send(2, "z"),)), at=0.5)
    sim.crash(2, at=1.2)  # "z" is in flight when 2 dies: reported too, from its arrival time
    sim.run()
    failed = [e for e in a.log if e[1] == "failed"]
    assert failed == [(3.0, "failed", 1, "x"), (4.5, "failed", 2, "z")]
    assert sim.metrics.failure_notices == 2 and sim.metrics.lost_by_reason() == {"crash": 2}
    assert [e[3] for e in c.log] == ["y"]


def test_failure_notices_are_off_by_default_and_cores_without_the_hook_keep_cores_default() -> None:
    for notice, core in ((None, _Notified()), (1.0, Recorder())):
        sim = Simulator(failure_notice=notice)
        sim.add_node(0, core)
        sim.add_node(1, Recorder())
        sim.crash(1)
        sim.inject(0, Do((Send(1, "x"),)))
        sim.run()
        assert not [e for e in core.log if e[1] == "failed"]
        assert sim.metrics.deliveries == 0
    with pytest.raises(SimError, match="failure_notice"):
        Simulator(failure_notice=-1.0)


def test_failure_notice_for_cut_links_but_not_random_loss() -> None:
    links = LinkFailure([(0, 1)])
    sim = Simulator(transport=[links, Loss(1.0)], failure_notice=0.0)
    a = _Notified()
    sim.add_node(0, a)
    sim.add_node(1, Recorder())
    sim.add_node(2, Recorder())
    sim.inject(0, Do((Send(1, "cut"), Send(2, "lossy"))))
    sim.run()
    assert [e[2:] for e in a.log if e[1] == "failed"] == [(1, "cut")]
    assert sim.metrics.lost_by_reason() == {"link": 1, "loss": 1}


def test_a_dead_sender_gets_no_notice() -> None:
    sim = Simulator(transport=[ConstantLatency(1.0)], failure_notice=1.0)
    a = _Notified()
    sim.add_node(0, a)
    sim.add_node(1, Recorder())
    sim.inject(0, Do((Send(1, "x"),)))
    sim.crash(1, at=0.5)
    sim.crash(0, at=1.5)
    sim.run()
    assert not [e for e in a.log if e[1] == "failed"]


def test_invoke_applies_the_effects_of_a_local_call() -> None:
    sim = Simulator(transport=[ConstantLatency(1.0)])
    a, b = Recorder(), Recorder()
    sim.add_node(0, a)
    sim.add_node(1, b)
    sim.invoke(0, lambda core: [Send(1, ("hello", len(core.log)))], at=2.0)
    sim.crash(0, at=3.0)
    sim.invoke(0, lambda core: [Send(1, "never")], at=4.0)  # a dead node makes no calls
    sim.run()
    assert b.log == [(3.0, "msg", 0, ("hello", 0))]
    with pytest.raises(SimError, match="no node 7"):
        sim.invoke(7, lambda core: [])


def test_a_paused_node_handles_what_came_meanwhile_in_order_when_its_pause_ends() -> None:
    sim = Simulator()
    a, b = Recorder(), Recorder()
    sim.add_node(0, a)
    sim.add_node(1, b)
    sim.inject(1, Do((SetTimer(2.0, "t"),)), at=0.5)
    sim.run(until=0.7)
    sim.pause(1, until=5.0)
    for i, at in enumerate((1.0, 3.0, 4.0)):
        sim.inject(1, f"m{i}", at=at)
    sim.inject(0, "other", at=2.5)
    sim.run()
    assert a.log == [(2.5, "msg", EXTERNAL, "other")]
    assert b.log[1:] == [  # (in the order they came: the timer was due at 2.5)
        (5.0, "msg", EXTERNAL, "m0"),
        (5.0, "timer", "t"),
        (5.0, "msg", EXTERNAL, "m1"),
        (5.0, "msg", EXTERNAL, "m2"),
    ]
    assert not sim.is_paused(1)


def test_a_paused_node_still_dies_at_once() -> None:
    sim = Simulator()
    r = Recorder()
    sim.add_node(0, r)
    sim.pause(0, until=10.0)
    sim.inject(0, "lost", at=1.0)
    sim.crash(0, at=2.0)
    sim.run()
    assert r.log == [] and sim.is_down(0) and not sim.is_paused(0)


def test_a_pause_made_longer_keeps_the_order_of_what_waits() -> None:
    sim = Simulator()
    r = Recorder()
    sim.add_node(0, r)
    sim.pause(0, until=2.0)
    sim.inject(0, "a", at=1.0)
    sim.run(until=1.5)
    sim.pause(0, until=4.0)  # (paused again before the first pause ended)
    sim.inject(0, "b", at=1.6)
    sim.inject(0, "c", at=3.0)
    sim.run()
    assert [(t, m) for t, _, _, m in r.log] == [(4.0, "a"), (4.0, "b"), (4.0, "c")]
