"""The ring's repair (routing/ring_repair.py), piece by piece."""

from __future__ import annotations

from types import SimpleNamespace

from flowbus.core import Effect, Send
from flowbus.filters import parse
from flowbus.meta import EVENT_ID
from flowbus.routing import cbr
from flowbus.routing.ring_barrier import Barriers
from flowbus.routing.ring_custody import Custodian
from flowbus.routing.ring_repair import HandedOver, Repair


def _beyond_a_death(dead: set[int], taken_by: dict[int, object]) -> tuple[SimpleNamespace, SimpleNamespace]:
    """A joined ring node whose right side was refilled by the broker at 40 (id 4) after
    deaths; the broker at 30 (id 3) is a live link. Its ring and router."""
    taker, beyond = SimpleNamespace(addr=30, id=3), SimpleNamespace(addr=40, id=4)
    ring = SimpleNamespace(
        right=beyond,
        left=None,
        joined=True,
        open=set(),
        dead=dead,
        taken_by=taken_by,
        links=lambda: [beyond, taker],
        side_of_addr=lambda addr: 1 if addr in (20, 21, 40) else 0,
    )
    return ring, SimpleNamespace(neighbours={40}, broker=1)


def test_orphans_are_handed_over_only_to_a_neighbour_the_event_does_not_go_to_already() -> None:
    """A dead tree neighbour's own subscriptions (orphans) go to the ring neighbour across the
    cut as ``HandedOver``; when that neighbour is a tree neighbour by now and the router sends
    it the event, the publish is enough (it serves what it took over). Both sent, custody kept
    one message per neighbour and lost the other (a traced split run: 40 lost)."""
    ring = SimpleNamespace(right=SimpleNamespace(addr=4), left=None)
    repair = Repair(ring, SimpleNamespace(), Custodian())  # type: ignore[arg-type]
    repair.orphans = {2: {(2, "s"): parse("x > 1")}}
    repair.orphan_side = {2: 1}
    event = {"x": 5, EVENT_ID: ("p", 1)}
    alone = repair.route_orphans([], event)
    assert alone == [Send(4, HandedOver(event, 2))]  # (the router sends it nothing: handed over)
    routed: list[Effect] = [Send(4, cbr.Publish(event)), Send(7, cbr.Publish(event))]
    assert repair.route_orphans(routed, event) == routed  # (it gets the publish: no second message)
    elsewhere: list[Effect] = [Send(7, cbr.Publish(event))]
    assert repair.route_orphans(elsewhere, event) == [*elsewhere, Send(4, HandedOver(event, 2))]
    assert repair.route_orphans([], {"x": 0, EVENT_ID: ("p", 2)}) == []  # (no orphan wants it)


def test_an_orphans_event_is_handed_over_behind_the_events_of_its_publisher_kept_for_the_dead() -> None:
    """Events routed to a dead tree neighbour kept in the tree were kept for it; once its
    orphans are known, a later event of the same publisher is handed over straight away,
    the kept ones only at the next flush: it overtook them (a traced mixed run, 7 out of
    order at the orphans' taker). It is kept behind them, and all go in order."""
    ring = SimpleNamespace(
        right=SimpleNamespace(addr=4), left=None, joined=True, open=set(), dead=set(), links=lambda: []
    )
    router = SimpleNamespace(neighbours={3})
    repair = Repair(ring, router, Custodian())  # type: ignore[arg-type]
    repair.orphans = {2: {(2, "s"): parse("x > 1")}}
    repair.orphan_side = {2: 1}
    first, second = ({"x": 5, EVENT_ID: ("p", i)} for i in (1, 2))
    assert repair.keep(first, 2, 1, None) == []  # (routed its way while it was kept in the tree)
    assert repair.route_orphans([], second) == []  # (not handed over ahead of it)
    assert repair.resend() == [Send(4, HandedOver(first, 2)), Send(4, HandedOver(second, 2))]
    third = {"x": 5, EVENT_ID: ("p", 3)}
    assert repair.route_orphans([], third) == [Send(4, HandedOver(third, 2))]  # (nothing kept now)


def test_an_event_held_for_a_live_tree_neighbour_goes_to_it_whoever_is_on_its_side_now() -> None:
    """In a ring of three, the other two brokers are both our sides; an event routed to the
    left one, held behind what was kept for the right side, was kept "for the right side"
    and went, at the flush, to whoever was our right neighbour by then: a broker that routed
    it back towards us, the way it came, and confirmed it (a simulator schedule: 130 events
    lost once a flush waited a round longer). Held for a live tree neighbour, it goes there."""
    peers = {a: SimpleNamespace(addr=a, id=a) for a in (0, 4)}
    ring = SimpleNamespace(
        right=peers[4],
        left=peers[0],
        joined=True,
        open=set(),
        dead=set(),
        links=lambda: [peers[4], peers[0]],
        side_of_addr=lambda addr: 1,  # (both sides: the first found)
    )
    router = SimpleNamespace(neighbours={0, 4}, broker=1)
    repair = Repair(ring, router, Custodian())  # type: ignore[arg-type]
    first, second = ({"x": 5, EVENT_ID: ("p", i)} for i in (1, 2))
    repair.keep(first, 2, 1, None)  # (kept for the right side: a neighbour there failed)
    assert repair.behind_kept(0, second)  # (routed to the left one: held behind it)
    assert repair.resend() == [Send(4, cbr.Publish(first)), Send(0, cbr.Publish(second))]


def test_a_takeovers_drain_names_the_taker_of_what_is_kept_for_the_dead() -> None:
    """What is kept for a dead broker waits for its taker's word, then goes to the new
    neighbour on its side and to the taker, handed over. Only the dead one's ring
    neighbours get the taker's ``Redirect``; a broker that joined next to its place since
    never did, waited the rounds out and sent the events to the new neighbour only, which
    did not serve what was taken over (a simulator schedule: 408 of 432 losses). The
    taker's ``Drain`` (only a taker asks it) is its word too."""
    ring, router = _beyond_a_death({7}, {})
    barriers = Barriers()
    repair = Repair(ring, router, Custodian(), barriers)  # type: ignore[arg-type]
    repair.known = {7: 20, 3: 30, 4: 40}
    event = {"x": 5, EVENT_ID: ("p", 1)}
    repair.keep(event, 20, 1, None)
    assert repair.resend() == []  # (the taker's word not come yet)
    barriers.asked[20] = {30}
    assert repair.resend() == [Send(30, HandedOver(event, 20)), Send(40, cbr.Publish(event))]


def test_what_is_kept_for_a_restarted_broker_that_died_again_waits_for_its_own_taker() -> None:
    """The member at an address died, was taken over by the broker at 50, came back as a new
    member and died again. What was kept for the new one was handed to the old one's taker,
    which delivered it to nothing (it had taken only the old one's subscriptions) and
    confirmed it; the events reached their subscribers 25 s later, another way, after
    later ones of their publisher (a simulator schedule: 173 out of order). A dead address's
    taker is the last member's there."""
    old_taker, taker = SimpleNamespace(addr=50, id=5), SimpleNamespace(addr=30, id=3)
    ring, router = _beyond_a_death({7, 8}, {7: old_taker})
    repair = Repair(ring, router, Custodian())  # type: ignore[arg-type]
    repair.known = {7: 20, 3: 30, 4: 40, 8: 20}  # (ids 7, then 8, at address 20)
    repair.found_dead([20])
    event = {"x": 5, EVENT_ID: ("p", 1)}
    repair.keep(event, 20, 1, None)
    assert repair.resend() == []  # (not the old one's taker: the word of the new one's waited for)
    ring.taken_by[8] = taker
    assert repair.resend() == [Send(30, HandedOver(event, 20)), Send(40, cbr.Publish(event))]


def test_what_is_kept_for_a_dead_broker_goes_to_the_takers_of_the_others_found_dead_on_its_side() -> None:
    """Two adjacent brokers died; we kept events for the near one. A subscription the far one
    had taken over is at the far one's taker now, maybe on our other side, where no table
    routed them (a simulator schedule: 207 lost). What is kept for the near one goes to the
    new neighbour on its side and, handed over, to the taker of each: one hand-over per
    dead broker, the same taker or not (a taker delivers a hand-over to what it took from
    the broker it names; one per taker, a taker of both got half: 387 out of order)."""
    taker = SimpleNamespace(addr=30, id=3)
    ring, router = _beyond_a_death({7, 8}, {7: taker, 8: taker})
    repair = Repair(ring, router, Custodian())  # type: ignore[arg-type]
    repair.known = {7: 20, 8: 21, 3: 30, 4: 40}
    repair.found_dead([20, 21])
    event = {"x": 5, EVENT_ID: ("p", 1)}
    repair.keep(event, 20, 1, None)
    assert repair.resend() == [
        Send(30, HandedOver(event, 20)),
        Send(30, HandedOver(event, 21)),
        Send(40, cbr.Publish(event)),
    ]


def test_a_live_tree_neighbour_past_a_join_hands_its_place_to_the_joiner_on_its_tree_side() -> None:
    """A broker joined between us and a live tree neighbour; that neighbour's address had
    been a member's that died on our other side earlier (a restart), and by the address its
    side was that one's: its place went to nobody, its entries were withdrawn up the tree
    until the joiner synced us, and what was published at the far end meanwhile was
    confirmed and lost (a traced campaign run: 44 deliveries in 30 ms). Its side is its tree
    side by its id now."""
    me, left, joiner, far = (SimpleNamespace(addr=a, id=i) for a, i in ((2, 20), (3, 10), (4, 30), (1, 40)))
    ring = SimpleNamespace(
        me=me,
        right=joiner,
        left=left,
        joined=True,
        dead=set(),
        links=lambda: [joiner, far, left],
        side_of_addr=lambda addr: -1 if addr == 1 else 1 if addr == 4 else -1 if addr == 3 else 0,
    )
    router = SimpleNamespace(neighbours={1, 3})
    repair = Repair(ring, router, Custodian())  # type: ignore[arg-type]
    assert repair.handover({3, 4}) == {1: 4}


def test_a_flush_over_many_kept_events_after_ring_messages_is_made_at_most_every_flush_every() -> None:
    """After a long partition a broker kept tens of thousands of events for a side with no
    neighbour, and passed over all of them after every ring message (starved brokers busy
    for a minute after the heal). Past FLUSH_MANY, a flush after a ring message waits
    FLUSH_EVERY after the last; without a time (a heartbeat round's) it is made at once.
    Kept in each publisher's order, they go when their side has a neighbour again."""
    from flowbus.routing.ring_repair import FLUSH_EVERY, FLUSH_MANY

    right = SimpleNamespace(addr=4, id=4)
    ring = SimpleNamespace(right=None, left=None, joined=True, open={1}, dead=set(), links=lambda: [])
    repair = Repair(ring, SimpleNamespace(neighbours={4}, broker=1), Custodian())  # type: ignore[arg-type]
    n = FLUSH_MANY + 10
    events = [{"x": 5, EVENT_ID: ("p", i)} for i in range(n)]
    for e in reversed(events):  # (kept out of order: sent in the publisher's)
        repair.keep(e, 4, 1, None)
    assert repair.resend(10.0) == []  # (nobody on the side: all kept)
    ring.right, ring.open = right, set()
    repair.heard.add(4)
    assert repair.resend(10.0 + FLUSH_EVERY / 2) == []  # (too soon after the last pass)
    assert len(repair.retry) == n
    sent = repair.resend(10.0 + 2 * FLUSH_EVERY)
    assert sent == [Send(4, cbr.Publish(e)) for e in events] and not repair.retry
