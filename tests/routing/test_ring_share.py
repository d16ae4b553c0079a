"""Subscriptions shared under load (routing/ring_share.py, overlay/ring_load.py): a broker
over its limit hands part of its subscriptions' routing to a neighbour, which matches their
events and hands the deliveries back home; shares are acknowledged, sent again when not,
taken back in the end."""

from __future__ import annotations

from flowbus.core import CancelTimer, Send, SetTimer
from flowbus.experiments.ring_sim import BrokerRing
from flowbus.filters import parse
from flowbus.overlay.ring_load import ShareAck, ShareLedger
from flowbus.overlay.ring_messages import Peer, ShareState


def test_a_loaded_broker_shares_subscriptions_and_every_subscriber_gets_each_event_once() -> None:
    ring = BrokerRing(3, seed=4, backup=2, heartbeat=1.0, share_subs=True, load_limit=2)
    home, *others = ring.order()
    subs = [f"s{i}" for i in range(4)]
    for i, s in enumerate(subs):
        ring.sim.invoke(home.addr, lambda b, s=s, i=i: b.subscribe(s, parse(f"x >= {i}")))
    ring.settle(10.0)
    holders = [b for b in others if b.shared.hosted]
    assert len(home.shared.out) == 2 and home.ring.shares.acked == 1  # load 4 / 2: half moved
    assert len(holders) == 1 and set(holders[0].shared.hosted) == set(home.shared.out)
    assert all(("sub", s, home.addr) in holders[0].ring.state for s in home.shared.out)
    assert home.subs == set(subs)  # (still served at home: the sessions are there)
    ring.got.clear()
    for n, src in enumerate([home, *others] * 2):
        ring.sim.invoke(src.addr, lambda b, n=n: b.publish({"x": n % 4, "n": n}))
    ring.settle(10.0)
    want = sorted((s, n) for n in range(6) for i, s in enumerate(subs) if n % 4 >= i)
    assert sorted((sub, ev["n"]) for sub, ev, _ in ring.got) == want  # none lost, none twice
    assert holders[0].shared.delegated > 0 and home.shared.received == holders[0].shared.delegated
    gone = min(home.shared.out)
    ring.sim.invoke(home.addr, lambda b: b.unsubscribe(gone))
    ring.settle(5.0)
    assert gone not in holders[0].shared.hosted and ("sub", gone, home.addr) not in holders[0].ring.state
    assert len(home.shared.out) == 1


def test_a_share_is_sent_again_until_acknowledged_and_taken_back_in_the_end() -> None:
    me, to = Peer(1, 100), Peer(2, 200)
    ledger = ShareLedger(timeout=2.0, tries=3)
    sent = ledger.send(me, to, {"a": 1, "b": 2})
    assert sent == [Send(200, ShareState(me, {"a": 1, "b": 2}, 1)), SetTimer(2.0, ("ring", "share", 1))]
    assert ledger.in_flight() == {"a", "b"}
    back, again = ledger.expired(me, 1)
    assert not back and again[0] == Send(200, ShareState(me, {"a": 1, "b": 2}, 1)) and ledger.resent == 1
    ledger.expired(me, 1)
    back, again = ledger.expired(me, 1)  # (3 tries used up)
    assert back == {"a": 1, "b": 2} and not again and ledger.taken_back == 1 and not ledger.in_flight()
    assert ledger.ack(ShareAck(to, 1)) == (None, []) and ledger.late == 1  # both hold them now
    ledger.send(me, to, {"c": 3})
    assert ledger.withdraw("c") == 200 and ledger.withdraw("zz") is None
    done, cancel = ledger.ack(ShareAck(to, 2))
    assert done is not None and cancel == [CancelTimer(("ring", "share", 2))] and ledger.placed == {}
    ledger.send(me, to, {"d": 4})
    ledger.ack(ShareAck(to, 3))
    assert ledger.placed == {"d": 200} and ledger.acked == 2
    ledger.send(me, to, {"e": 5})
    back, cancel = ledger.take_back(200)  # (the receiver died)
    assert back == {"e": 5} and cancel == [CancelTimer(("ring", "share", 4))]


def test_a_delegated_event_for_subscriptions_its_home_does_not_serve_comes_back_and_is_delivered() -> None:
    """A broker found dead and started again on its address serves none of the old one's
    subscriptions: the holder of their share (which judges homes by address) gets its
    ``Delegated`` back as ``Undelegated`` and delivers them itself from then on (they were
    dropped there, and confirmed: lost). A subscription that ended at home is not sent back."""
    from flowbus.core import Deliver, DeliverAll
    from flowbus.routing.ring_share import Delegated, SharedSubs, Undelegated

    home, holder = SharedSubs(1), SharedSubs(2)
    event = {"x": 1}
    holder.host({"a": (1, "a"), "b": (1, "b"), "c": (3, "c")}, dead=())
    assert holder.hosted == {"a": 1, "b": 1, "c": 3}
    home.out["gone"] = 2
    home.unshare("gone")
    back = home.deliveries(2, Delegated(("a", "b", "gone"), event), served={"b"}, grouped=True)
    assert back == [Send(2, Undelegated(("a",), event)), DeliverAll(("b",), event)]
    assert holder.undelegated(Undelegated(("a",), event), served={"a", "b", "c"}, grouped=False) == [
        Deliver("a", event)
    ]
    assert "a" not in holder.hosted and holder.redirect([Deliver("a", event)]) == [Deliver("a", event)]
    holder.host({"a": (1, "a"), "b": (1, "b")}, dead=())
    assert holder.hosted == {"b": 1}  # (it stays ours)


def test_a_refused_subscription_gets_its_events_back_in_order_before_later_ones() -> None:
    """The home refuses a shared subscription (``Undelegated``) while more ``Delegated`` for
    it are on their way: until the last one sent has come back, the holder sends its later
    events the same way round, so each comes back behind the earlier ones and the
    subscription gets them in publish order (delivered at once, they overtook the ones still
    coming back: 79 out of order in a campaign's paused home)."""
    from flowbus.core import Deliver
    from flowbus.meta import EVENT_ID
    from flowbus.routing.ring_share import Delegated, SharedSubs, Undelegated

    holder = SharedSubs(2)
    holder.host({"a": (1, "a")}, dead=())
    events = [{"x": i, EVENT_ID: ("p", i)} for i in range(1, 6)]
    wire: list[Delegated] = []  # (to the home, in order: FIFO on the link)
    got: list[int] = []

    def route(event: dict[str, object]) -> None:  # (the holder's router matched it for "a")
        for e in holder.redirect([Deliver("a", event)]):
            if type(e) is Send:
                wire.append(e.msg)
            else:
                got.append(e.event["x"])

    def back() -> None:  # (the home, a new member on the address, sends one back)
        msg = wire.pop(0)
        for e in holder.redirect(holder.undelegated(Undelegated(msg.subs, msg.event), {"a"}, grouped=False)):
            assert type(e) is Deliver  # (never sent round again)
            got.append(e.event["x"])

    for event in events[:3]:
        route(event)
    back()  # (e1 back: "a" is refused, but e2 and e3 are still on their way)
    route(events[3])  # (goes round too)
    assert got == [1] and len(wire) == 3 and "a" in holder.hosted
    back()
    back()  # (e3, the last one sent before e4, is back; e4 still is not)
    assert "a" in holder.hosted
    back()  # (e4: all back)
    assert "a" not in holder.hosted and not wire
    route(events[4])  # (delivered here at once)
    assert got == [1, 2, 3, 4, 5]
    holder.host({"a": (1, "a")}, dead=())
    assert holder.hosted == {}  # (it stays ours)
