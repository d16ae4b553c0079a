"""``flowbus chaos sim``: random restart schedules of the ring's cores in the simulator."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flowbus.chaos.restarts import BAD, CustodyRing, RestartSchedules, judge, restarts, run_schedules
from flowbus.cli import app
from flowbus.errors import ExperimentError
from flowbus.meta import EVENT_ID

runner = CliRunner()


def _clean_run(seed: int, faults: str) -> tuple[CustodyRing, int]:
    """Schedule ``seed`` of ``faults`` on the brokers' clocks, 6,000 events, the flow's derived
    space judged too: asserted to lose, reorder and leave unsettled nothing. The ring, and
    the brokers struck."""
    w, subs, pubs, struck = restarts(seed, flow=True, n=6000, timers="broker", faults=faults, derived=True)
    row = judge(w, subs, pubs, 6000)
    assert row["delivered"] == row["expected"] > 0
    assert {key: row[key] for key in BAD if row[key]} == {}
    return w, struck


def test_a_schedule_is_replayed_exactly_from_its_seed() -> None:
    """The same seed gives the same crashes and the same deliveries, one by one."""
    one = restarts(3, flow=False, n=1500)
    two = restarts(3, flow=False, n=1500)
    assert one[3] == two[3] > 0
    assert one[0].got == two[0].got


def test_the_judge_counts_a_lost_and_a_misplaced_delivery() -> None:
    w, subs, pubs, _ = restarts(3, flow=False, n=1500)
    clean = judge(w, subs, pubs, 1500)
    assert clean["lost"] == clean["wrong"] == clean["out_of_order"] == 0 < clean["delivered"]
    node, sub, _ = next(g for g in w.got if g[2] == ("p1", 1))  # (x = 1)
    w.got[:] = [g for g in w.got if g[1:] != (sub, ("p1", 1))]  # (never delivered to it)
    w.got.append((node, sub, ("p0", 2)))  # (x = 2: not this subscription's)
    w.got.append((node, sub, ("p1", 1)))  # (after later ones of p1)
    hurt = judge(w, subs, pubs, 1500)
    assert (hurt["lost"], hurt["wrong"], hurt["out_of_order"]) == (0, 1, 1)
    w.got.pop()
    assert judge(w, subs, pubs, 1500)["lost"] == 1


@pytest.mark.broker
def test_the_command_writes_its_rows_plot_and_document(tmp_path: Path) -> None:
    result = runner.invoke(app, ["chaos", "sim", "--seeds", "3,", "--events", "1500", "--no-flow",
                                 "--out", str(tmp_path), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["experiment"] == "chaos-sim" and doc["config"]["seeds"] == [3]
    assert doc["bad"] == [] and doc["schedules"] == 1 and doc["totals"]["crashed"] > 0
    with (tmp_path / "rows.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert row["seed"] == "3" and row["lost"] == "0" and int(row["expected"]) > 0
    assert (tmp_path / "chaos-sim.png").stat().st_size > 0
    assert json.loads((tmp_path / "result.json").read_text())["rows"] == doc["rows"]


def test_bad_input_is_refused_before_anything_runs(tmp_path: Path) -> None:
    for args in (["--seeds", "x"], ["--events", "10"], ["--seeds", "3-1"]):
        result = runner.invoke(app, ["chaos", "sim", *args, "--out", str(tmp_path / "o"), "--json"])
        assert result.exit_code == 2 and "error" in result.stderr
        assert result.stdout == ""
    assert not (tmp_path / "o").exists()
    try:
        RestartSchedules(seeds=(-1,))
    except ExperimentError as e:
        assert "seeds" in str(e)
    else:
        raise AssertionError("a negative seed was taken")


@pytest.mark.broker
def test_schedules_run_side_by_side_give_the_same_rows_in_the_order_of_the_seeds() -> None:
    config = RestartSchedules(seeds=(5, 3), events=1500, flow=False)
    told: list[str] = []
    one = run_schedules(config)
    two = run_schedules(config, jobs=2, say=told.append)
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in one.rows]
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in two.rows] == strip
    assert [r["seed"] for r in two.rows] == [5, 3] and len(told) == 2
    assert one.findings == two.findings


def test_bad_timers_are_refused() -> None:
    try:
        RestartSchedules(timers="fast")
    except ExperimentError as e:
        assert "timers" in str(e) and "broker" in str(e)
    else:
        raise AssertionError("unknown timers were taken")
    result = runner.invoke(app, ["chaos", "sim", "--timers", "fast", "--seeds", "1", "--json"])
    assert result.exit_code == 2 and "timers" in result.stderr and result.stdout == ""


def test_the_judge_counts_a_delivery_no_client_subscription_takes() -> None:
    """A delivery to a flow's partition that reaches the driver is never settled there."""
    w, subs, pubs, _ = restarts(3, flow=False, n=1500)
    w._delivered(0, ("part", "chaos", (0, 1), "g0", 7), {EVENT_ID: ("p0", 4)}, w.sim.now)
    row = judge(w, subs, pubs, 1500)
    assert row["unserved"] == 1 and row["lost"] == 0


@pytest.mark.slow  # (a few seconds of simulation: not in make check)
def test_a_delegated_delivery_whose_home_died_is_made_by_its_holder() -> None:
    """On the brokers' clocks, schedule 16: a broker holds a subscription taken over from one
    that died (its entry still names that broker's address as its home); a new broker there
    dies with 2 others' crash, while a Delegated of an event to it is on its way. Released as
    'gone with its sessions', handed over round the ring as a kept event to nobody serving it,
    it was lost (1 delivery): the holder makes it, once the home is found dead."""
    w, subs, pubs, crashed = restarts(16, flow=True, n=6000, timers="broker")
    row = judge(w, subs, pubs, 6000)
    assert crashed == 8 and row["delivered"] == row["expected"] > 0
    assert {key: row[key] for key in BAD if row[key]} == {}


@pytest.mark.slow  # (a few seconds of simulation: not in make check)
def test_kept_events_delivered_to_a_partition_taken_over_are_folded_not_sent_to_the_driver() -> None:
    """On the brokers' clocks, schedule 1: events kept for a dead neighbour not replaced yet
    are delivered to what was taken over from it, a flow's partitions among them; read after
    the flow side, they went to the driver as plain deliveries (66 in this schedule), which
    never settles them: their publishes were never acknowledged."""
    w, subs, pubs, _ = restarts(1, flow=True, n=6000, timers="broker")
    row = judge(w, subs, pubs, 6000)
    assert row["unserved"] == 0 and row["unsettled"] == 0
    assert row["delivered"] == row["expected"] > 0


@pytest.mark.slow  # (a few seconds of simulation: not in make check)
def test_a_publishers_events_for_its_live_side_do_not_wait_for_the_repair_of_the_other() -> None:
    """Schedule 236: two brokers to the right of the publisher's die at once, then two more.
    Its events for the live neighbour on its left waited behind those kept and sent again
    to the right until these were confirmed: a minute of barriers and placeholders beyond,
    while a hand-over round the ring brought its later events to the left neighbour first
    (246 out of order at one subscription). Now only the side they were kept for waits."""
    w, subs, pubs, crashed = restarts(236, flow=True, n=2500)
    row = judge(w, subs, pubs, 2500)
    assert crashed == 4 and row["delivered"] == row["expected"] > 0
    assert {key: row[key] for key in BAD if row[key]} == {}


@pytest.mark.slow  # (a few seconds of simulation: not in make check)
def test_what_came_from_a_dead_neighbour_reaches_its_taker_not_only_its_replacement() -> None:
    """Schedule 131: a broker died while its new process waited to be buried, and another
    joined next to its place. Buried, its neighbour gave the joiner its place in the tables
    (make before break); the joiner had none of its subscriptions (their taker was at the
    other end of the tree) and confirmed the events they drew until the taker's word came
    round: 24 deliveries lost. Those events are now kept for the dead one too and handed to
    its taker, which the neighbour remembers once its barrier asked (then forgot it: the
    dead one's address came back to life before the kept events went)."""
    w, subs, pubs, crashed = restarts(131, flow=True, n=2500)
    row = judge(w, subs, pubs, 2500)
    assert crashed >= 3 and row["delivered"] == row["expected"] > 0
    assert {key: row[key] for key in BAD if row[key]} == {}


def test_bad_publishers_are_refused() -> None:
    for places in ((1, 1), (0, 5), (2,)):
        try:
            RestartSchedules(publishers=places)
        except ExperimentError as e:
            assert "publishers" in str(e)
        else:
            raise AssertionError(f"publishers {places} were taken")
    for arg in ("x", "1,1", "7,2"):
        result = runner.invoke(app, ["chaos", "sim", "--publishers", arg, "--seeds", "1", "--json"])
        assert result.exit_code == 2 and "publishers" in result.stderr and result.stdout == "", arg


def test_a_paused_broker_found_dead_steps_down_and_joins_again() -> None:
    """Schedule 1 of pauses (the brokers' clocks): a broker paused past the guard comes back,
    reads its backlog late, is told it was found dead, steps down and joins as a new member;
    nothing is lost, and the ring is whole again."""
    w, subs, pubs, struck = restarts(1, flow=True, n=3000, timers="broker", faults="pause", derived=True)
    row = judge(w, subs, pubs, 3000)
    assert struck > 0 and w.stepped_down and all(what != "crashed" for _, what, _ in w.log)
    assert row["delivered"] == row["expected"] > 0
    assert {key: row[key] for key in BAD if row[key]} == {}
    assert {sub for sub in w.derived} == {(b.addr, "big") for b in w.brokers}


def test_bad_faults_are_refused() -> None:
    for bad in ({"faults": "flood"}, {"derived": True, "flow": False}):
        with pytest.raises(ExperimentError):
            RestartSchedules(**bad)  # type: ignore[arg-type]


@pytest.mark.slow  # (a few seconds of simulation: not in make check)
def test_events_sent_to_a_former_neighbour_are_not_overtaken_by_those_through_the_joiner() -> None:
    """Schedule 207 of ``starve`` (the brokers' clocks): a broker found dead joins again
    between a publisher's broker and its old neighbour while that one is paused. What the
    publisher's broker had sent the old neighbour came back ``Declined`` once it woke, and was
    left to be sent again there rounds later, while the publisher's later events went through
    the joiner and were delivered first (225 out of order, the campaign's pause-3 at
    ``c9ec30e`` in the simulator). Now the new way waits for what went the old one, and what
    it declined goes the new way at once, first."""
    w, struck = _clean_run(207, "starve")
    assert struck == 8 and len(w.stepped_down) == 3


@pytest.mark.slow  # (a few seconds of simulation: not in make check)
def test_the_new_way_through_a_joiner_waits_while_the_old_neighbour_is_paused() -> None:
    """Schedule 6 of ``starve``: the old neighbour, paused for three heartbeats, still held
    the publisher's events when the new way through the joiner opened two rounds after the
    join; it declined them on waking, behind later ones (78 out of order). The new way waits
    as long as a silent neighbour takes to decline or be found dead (``JOIN_ROUNDS``)."""
    w, subs, pubs, _ = restarts(6, flow=True, n=6000, timers="broker", faults="starve", derived=True)
    row = judge(w, subs, pubs, 6000)
    assert w.stepped_down and row["delivered"] == row["expected"] > 0
    assert {key: row[key] for key in BAD if row[key]} == {}


@pytest.mark.slow  # (a few seconds of simulation: not in make check)
def test_the_rounds_an_old_neighbour_is_silent_do_not_count_towards_the_new_ways_wait() -> None:
    """Schedule 64 of ``starve``: the old neighbour was paused 5.5 heartbeats, longer than
    the guard, but not found dead (its other neighbour had heard it); a wait of GUARD + 1
    rounds opened the new way 30 ms before it woke and declined what it held (54 out of
    order). The rounds it is silent do not count."""
    _clean_run(64, "starve")


@pytest.mark.slow  # (a few seconds of simulation: not in make check)
def test_a_member_found_dead_where_one_died_before_is_buried_before_what_goes_its_way() -> None:
    """Schedule 141 of ``starve``: the broker at the end of the tree, found dead before and back
    as a new member on its address, is paused and found dead again. Its neighbour took it for
    buried already (by address), so what waited on it was kept only at the next change,
    after a later event routed its way had gone to its taker (64 out of order). Buried by
    ring id, what waited on it goes first."""
    w, subs, pubs, _ = restarts(141, flow=True, n=6000, timers="broker", faults="starve", derived=True)
    row = judge(w, subs, pubs, 6000)
    assert w.stepped_down.count(4) >= 2 and row["delivered"] == row["expected"] > 0
    assert {key: row[key] for key in BAD if row[key]} == {}


@pytest.mark.slow  # (a few seconds of simulation: not in make check)
def test_a_broker_paused_after_both_its_neighbours_tested_it_is_found_dead() -> None:
    """Schedule 99 of ``starve``: broker 2, just back from a hiccup, answered the tests both
    its neighbours had asked of each other, and was paused 13 s. Each neighbour took the
    other's "alive" for a broken link of its own and reached 2 the long way round; neither
    tested it again, and 2 stayed a member the whole pause. The publisher's events routed
    into it came out at its waking, past the taker's barrier, and were confirmed by a new
    member on the address of another dead broker (3), whose taker never saw them: 120
    deliveries lost. Now 2 is found dead, and steps down as it wakes, with 3."""
    w, _ = _clean_run(99, "starve")
    assert any(what == "stepped down" and b == 2 and 215 < t < 216 for t, what, b in w.log)


@pytest.mark.slow  # (a few seconds of simulation: not in make check)
def test_a_broker_buried_by_one_neighbour_is_not_vouched_for_to_the_other() -> None:
    """Schedule 186 of ``starve``: broker 3 buried paused broker 2 and took it over, not
    knowing that 4 had joined on 2's other side; 4 asked 3 to test 2, 3 probed it, and 2,
    waking, answered from its backlog before it read that it was dead. 3 told 4 "alive":
    4 kept 2 as its neighbour 12 s, then found it dead itself and took its state over a
    second time; the subscriptions' routes were withdrawn and made again meanwhile, and
    243 deliveries were lost. A tester answers ``Failed`` for a broker it buried."""
    _clean_run(186, "starve")


@pytest.mark.slow  # (a few seconds of simulation: not in make check)
def test_a_broker_told_who_took_a_suspect_over_does_not_take_it_over_again() -> None:
    """Schedule 15 of ``starve``: a paused broker, found dead and taken over by 0, woke and,
    before it read that it was dead, sent its state to a broker that had joined next to it,
    naming it the first holder; that broker asked a tester who had buried the paused one,
    was told ``Failed``, and took the state over a second time: the subscriptions' routes
    went to and fro, 567 deliveries out of order. The tester names the taker."""
    _clean_run(15, "starve")


@pytest.mark.slow  # (a few seconds of simulation: not in make check)
@pytest.mark.parametrize("seed", [5, 7, 79])
def test_members_killed_as_they_join_lose_nothing_and_keep_order(seed: int) -> None:
    """Schedules 5 and 7 of ``rejoin`` (the campaign's crash-1 at ``f11c79d``: a member killed
    80 ms after it joined, with the broker two places away, 124 deliveries lost). A new
    member on a dead broker's address took a dead neighbour's state over and announced it
    through a broker whose tree had not changed yet, which took it for the former neighbour
    on that address and dropped the announcement: the events were routed nowhere for
    seconds (5: 260 lost). And a holder delegated a subscription's deliveries to its home's
    address, where a new member we never linked to had died as it joined: they waited there
    until a broker spoke from it again, behind later ones (5: 492, 7: 87 out of order). Only
    the new member's subscriptions wait for our tree, not its events: kept, one waited for its
    sender's ``Again`` behind later ones (79: 24 out of order)."""
    w, struck = _clean_run(seed, "rejoin")
    assert struck >= 20 and any(what == "crashed as it joined" for _, what, _ in w.log)
