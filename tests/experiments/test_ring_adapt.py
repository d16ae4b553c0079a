"""ring-adapt, small: load on one broker is shared and brokers are added up to the cap;
express events leave slowed links; nothing is lost."""

from __future__ import annotations

import pytest

from flowbus.errors import ExperimentError
from flowbus.experiments.output import document
from flowbus.experiments.ring_adapt import RingAdapt, run_adapt


def test_ring_adapt_shares_grows_and_reroutes() -> None:
    c = RingAdapt(
        brokers=5, max_brokers=8, duration=30.0, ramp=10.0, nodes=24, pairs=6, slow_at=8.0, express_brokers=5
    )
    result = run_adapt(c)
    f = result.findings
    assert f["shares"] > 0 and f["requests"] > 0
    assert 0 < f["brokers_added"] <= 3 and result.rows[-1]["brokers"] <= 8
    assert f["entries_lost"] == 0 and f["entries_twice"] == 0
    assert f["hot_load_peak"] > 1.0
    lat = result.tables["latency"]
    assert f["slowed_links"] > 0
    assert all(r["delivered"] == r["sent"] for r in lat)
    late = [r for r in lat if r["t"] >= 8.0 + 2 * (c.bound + c.beat)]
    assert late and all(r["over_slowed"] == 0 for r in late)  # (the bound is per link, not per path)
    before = [r for r in lat if r["t"] + r["latency_max"] < 8.0]
    assert all(r["over_slowed"] > 0 for r in before)  # (the slowed links are those they used)
    assert document(result)["brokers_added"] == f["brokers_added"]
    assert f["share_acks"] == f["share_messages"] >= f["shares"] > 0  # (every share acknowledged)
    brokers = result.tables["brokers"]
    assert f["brokers_lost"] == 0 and f["brokers_detoured"] > 0
    slow = [r for r in brokers if 8 <= r["t"] < 8 + 2 * c.express_bound]  # (not seen yet)
    round_it = [r for r in brokers if r["detour"]]
    assert max(r["latency_max"] for r in round_it) < min(r["latency_max"] for r in slow)
    with pytest.raises(ExperimentError, match="max_brokers"):
        RingAdapt(brokers=8, max_brokers=4)


def test_ring_adapt_with_shares_lost_sends_them_again_and_loses_no_entry() -> None:
    c = RingAdapt(brokers=5, max_brokers=8, duration=30.0, ramp=10.0, nodes=12, pairs=2, share_loss=0.2)
    f = run_adapt(c).findings
    assert f["shares_resent"] > 0 and f["share_messages"] > f["shares"]
    assert f["entries_lost"] == 0  # (held twice: only after a take-back whose share had arrived)
    assert f["entries_twice"] <= f["shares_taken_back"] * c.entries
    with pytest.raises(ExperimentError, match="share_loss"):
        RingAdapt(share_loss=1.0)
