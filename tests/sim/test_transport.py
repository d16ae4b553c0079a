"""Transport layers: latency models, loss, crashes, link failures, partitions, chaining."""

from __future__ import annotations

import math
from typing import Any

import pytest

from flowbus.core import Send
from flowbus.sim import (
    Chain,
    ConstantLatency,
    CoordinateLatency,
    Crashes,
    Layer,
    LinkFailure,
    Loss,
    Partition,
    Simulator,
    TransportError,
    UniformLatency,
)
from flowbus.sim.transport import coordinate_of

from .cores import Do, Recorder


def _net(n: int, layers: list[Any], *, seed: int = 0) -> tuple[Simulator, list[Recorder]]:
    sim = Simulator(seed=seed, transport=layers)
    recs = [Recorder() for _ in range(n)]
    for i, r in enumerate(recs):
        sim.add_node(i, r)
    return sim, recs


def _send(sim: Simulator, src: int, dst: int, msg: Any = "m", *, at: float | None = None) -> None:
    sim.inject(src, Do((Send(dst, msg),)), at=at)


def _arrivals(r: Recorder) -> list[tuple[float, int, Any]]:
    return [(e[0], e[2], e[3]) for e in r.log if e[1] == "msg" and not isinstance(e[3], Do)]


def test_no_layers_means_zero_delay() -> None:
    sim, recs = _net(2, [])
    _send(sim, 0, 1, at=3.0)
    sim.run()
    assert _arrivals(recs[1]) == [(3.0, 0, "m")]


def test_uniform_latency_stays_in_range_and_is_seeded() -> None:
    def delays(seed: int) -> list[float]:
        sim, recs = _net(2, [UniformLatency(1.0, 3.0)], seed=seed)
        for _ in range(500):
            _send(sim, 0, 1)
        sim.run()
        return [t for t, _, _ in _arrivals(recs[1])]

    d = delays(1)
    assert len(d) == 500 and all(1.0 <= x <= 3.0 for x in d)
    assert 1.8 < sum(d) / len(d) < 2.2
    assert d == delays(1) and d != delays(2)


def test_coordinate_latency_is_symmetric_and_triangle_ish() -> None:
    sim = Simulator(seed=3)
    layer = CoordinateLatency(base=0.5, scale=10.0)
    decide = layer.bind(sim)
    assert decide is not None
    lat = [[decide(a, b, None, 0.0) for b in range(12)] for a in range(12)]
    for a in range(12):
        assert lat[a][a] == 0.5
        for b in range(12):
            assert lat[a][b] == lat[b][a]
            for c in range(12):
                assert lat[a][c] <= lat[a][b] + lat[b][c] + 1e-9  # type: ignore[operator]
    pa, pb = coordinate_of(layer, sim, 1), coordinate_of(layer, sim, 2)
    assert all(0 <= v < 1 for v in pa + pb)
    assert lat[1][2] == pytest.approx(0.5 + 10.0 * math.dist(pa, pb))
    assert coordinate_of(layer, Simulator(seed=4), 1) != pa


def test_loss_rate_is_about_p() -> None:
    sim, recs = _net(2, [Loss(0.2)], seed=11)
    n = 20_000
    for _ in range(n):
        _send(sim, 0, 1)
    sim.run()
    lost = sim.metrics.lost_by_reason()["loss"]
    assert abs(lost / n - 0.2) < 0.015
    assert len(_arrivals(recs[1])) == n - lost


def test_loss_zero_and_one() -> None:
    sim, recs = _net(2, [Loss(0.0)])
    _send(sim, 0, 1)
    sim.run()
    assert len(_arrivals(recs[1])) == 1
    sim, recs = _net(2, [Loss(1.0)])
    _send(sim, 0, 1)
    sim.run()
    assert _arrivals(recs[1]) == [] and sim.metrics.total_lost == 1


def test_crash_schedule_drops_messages_in_flight_and_later() -> None:
    sim, recs = _net(3, [ConstantLatency(1.0), Crashes({2: 2.5})])
    _send(sim, 0, 2, "ok", at=1.0)  # arrives 2.0
    _send(sim, 0, 2, "in-flight", at=2.0)  # would arrive 3.0
    _send(sim, 0, 2, "later", at=4.0)  # dropped at send time
    _send(sim, 0, 1, "other", at=4.0)
    sim.run()
    assert [m for _, _, m in _arrivals(recs[2])] == ["ok"]
    assert [m for _, _, m in _arrivals(recs[1])] == ["other"]
    assert sim.metrics.lost_by_reason() == {"crash": 2}
    assert sim.metrics.sent_by_type() == {"str": 4}


def test_link_failure_both_ways_and_directed() -> None:
    both = LinkFailure([(0, 1)])
    sim, recs = _net(3, [both])
    for a, b in [(0, 1), (1, 0), (0, 2)]:
        _send(sim, a, b)
    sim.run()
    assert sim.metrics.lost_by_reason() == {"link": 2}
    assert len(_arrivals(recs[2])) == 1

    one = LinkFailure([(0, 1)], directed=True)
    sim, recs = _net(2, [one])
    _send(sim, 0, 1, "a")
    _send(sim, 1, 0, "b")
    sim.schedule(1.0, lambda: one.restore(0, 1))
    _send(sim, 0, 1, "c", at=2.0)
    sim.run()
    assert [m for _, _, m in _arrivals(recs[0])] == ["b"]
    assert [m for _, _, m in _arrivals(recs[1])] == ["c"]
    assert sim.metrics.lost_by_reason() == {"link": 1}


def test_partition_drops_across_groups_until_healed() -> None:
    part = Partition([{0, 1}, {2}])
    sim, recs = _net(4, [part])
    _send(sim, 0, 1, "same")
    _send(sim, 0, 2, "across")
    _send(sim, 3, 2, "rest-to-group")
    sim.schedule(1.0, part.heal)
    _send(sim, 0, 2, "healed", at=2.0)
    sim.run()
    assert [m for _, _, m in _arrivals(recs[1])] == ["same"]
    assert [m for _, _, m in _arrivals(recs[2])] == ["healed"]
    assert sim.metrics.lost_by_reason() == {"partition": 2}
    with pytest.raises(TransportError, match="node 1 is in two groups"):
        Partition([{0, 1}, {1}])


def test_chain_sums_delays_and_stops_at_first_drop() -> None:
    calls: list[str] = []

    class Spy:
        def bind(self, host: Any) -> Any:
            def decide(src: int, dst: int, msg: Any, now: float) -> float | str:
                calls.append("spy")
                return 0.25

            return decide

    sim = Simulator()
    layers: list[Layer] = [ConstantLatency(1.0), Spy(), ConstantLatency(2.0)]
    assert Chain(layers, sim).fate(0, 1, "m", 0.0) == 3.25
    layers = [LinkFailure([(0, 1)]), Spy()]
    assert Chain(layers, sim).fate(0, 1, "m", 0.0) == "link"
    assert calls == ["spy"]


def test_bad_configs_are_rejected() -> None:
    with pytest.raises(TransportError):
        ConstantLatency(-1.0)
    with pytest.raises(TransportError):
        UniformLatency(3.0, 1.0)
    with pytest.raises(TransportError):
        Loss(1.5)
    with pytest.raises(TransportError):
        CoordinateLatency(scale=-1.0)
