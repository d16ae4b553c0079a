"""The client's protocol without a socket (``ClientState``): messages in, bytes out, as
h11's state tables are tested. Every test here is a unit test: no broker, no event loop."""

from __future__ import annotations

from typing import Any

import pytest

from flowbus.client import protocol as p
from flowbus.client.state import BATCH, ClientState, Happened, ranges
from flowbus.errors import ClientError, ProtocolError, PublishError, SchemaError, SubscribeError
from flowbus.net.codec import FrameDecoder, decode

STOCKS = {"symbol": "str", "price": "float"}


def _state(**kw: Any) -> ClientState:
    s = ClientState("c", ["b1:1", "b2:2"], **kw)
    s.welcomed(p.Welcome("b1:1", ("b3:3",), {"stocks": STOCKS, "any": None}))
    return s


def _messages(data: bytes) -> list[Any]:
    return [decode(body) for body in FrameDecoder().feed(data)]


def _events(*rows: tuple[list[str], int, tuple[str, int], dict[str, Any]]) -> p.Events:
    return p.Events(p.pack_events(list(rows)))


def test_publishes_go_out_in_order_across_spaces_and_again_after_a_reconnect() -> None:
    s = _state()
    a = s.publish("stocks", {"symbol": "IBM", "price": 1.0}, now=0.0)
    b = s.publish("any", {"x": 1}, now=0.0)
    c = s.publish("stocks", {"symbol": "HP", "price": 2.0}, now=0.0)
    assert (a, b, c) == (1, 2, 3)
    (msg,) = _messages(s.outgoing())
    assert isinstance(msg, p.Publish)
    assert [(pseq, space) for pseq, _, space in msg.items()] == [(1, "stocks"), (2, "any"), (3, "stocks")]
    assert s.outgoing() == b""  # (sent once on a connection)
    s.receive(p.PubAck(p.pack_pubacks([2])))
    s.lost()
    s.resend()
    (again,) = _messages(s.outgoing())
    assert [pseq for pseq, _, _ in again.items()] == [1, 3]  # what was not acknowledged


def test_a_big_backlog_goes_in_frames_of_at_most_a_batch() -> None:
    s = _state()
    for i in range(BATCH + 5):
        s.publish("any", {"i": i}, now=0.0)
    frames = _messages(s.outgoing())
    assert [len(f.items()) for f in frames] == [BATCH, 5]


def test_the_window_fills_and_an_acknowledgement_or_a_refusal_empties_it() -> None:
    s = _state(window=2)
    s.publish("any", {}, now=0.0)
    s.publish("any", {}, now=0.0)
    assert s.full
    assert s.receive(p.PubAck(p.pack_pubacks([1]))).acked and not s.full
    h = s.receive(p.Nack(2, "no right to publish"))
    assert h.acked and not s.unacked
    with pytest.raises(PublishError, match="no right to publish"):
        s.raise_errors()
    s.raise_errors()  # (raised once)


def test_an_event_is_checked_against_its_space_before_it_is_numbered() -> None:
    s = _state()
    with pytest.raises(ClientError, match="unknown space 'nowhere'"):
        s.check("nowhere", {})
    with pytest.raises(SchemaError, match="space 'stocks'"):
        s.check("stocks", {"symbol": 1, "price": 1.0})
    with pytest.raises(SchemaError, match="a mapping"):
        s.check("any", [1])  # type: ignore[arg-type]
    s.check("any", {"whatever": [1]})
    assert s.pseq == 0


def test_publishes_unacknowledged_for_too_long_are_given_up_oldest_first() -> None:
    s = _state()
    s.publish("any", {}, now=0.0)
    s.publish("any", {}, now=5.0)
    assert s.expire(8.0, 6.0, "connected to b1:1") and list(s.unacked) == [2]
    assert not s.expire(8.0, 6.0, "connected to b1:1")
    (error,) = s.take_errors()
    assert error.pseq == 1 and error.reason == "not acknowledged within 6 s (connected to b1:1)"


def test_deliveries_go_to_their_subscriptions_once_and_are_acknowledged_when_all_took_them() -> None:
    s = _state()
    s.connected()
    s.add("a", "any", "true", durable=False, collapse=None, handle="A")
    s.add("b", "any", "true", durable=False, collapse=None, handle="B")
    h = s.receive(_events((["a", "b"], 1, ("p", 1), {"x": 1}), (["a", "gone"], 2, ("p", 2), {"x": 2})))
    assert [(handle, cseq) for handle, _, cseq, _ in h.offers] == [("A", 1), ("B", 1), ("A", 2)]
    assert h.offers[0][3] is not h.offers[1][3]  # (the second subscription gets a copy)
    epoch = s.epoch
    assert not s.took(epoch, 1) and s.took(epoch, 1)  # (both had to take it)
    assert s.took(epoch, 2)
    (ack,) = _messages(s.outgoing())
    assert isinstance(ack, p.Ack) and ack.ranges() == [(1, 2)]
    again = s.receive(_events((["a"], 3, ("p", 1), {"x": 1})))  # (a broker sent it again)
    assert again.offers == [] and again.acks_due and s.subs["a"].duplicates == 1
    assert _messages(s.outgoing())[0].ranges() == [(3, 3)]  # (dropped, and acknowledged)


def test_a_delivery_of_a_connection_gone_is_not_acknowledged_on_the_next() -> None:
    s = _state()
    s.connected()
    s.add("a", "any", "true", durable=False, collapse=None, handle="A")
    s.receive(_events((["a"], 1, ("p", 1), {})))
    old = s.epoch
    s.lost()
    s.connected()
    assert not s.took(old, 1) and s.outgoing() == b""


def test_dedup_keeps_at_least_the_last_ids() -> None:
    s = _state(dedup=2)
    s.connected()
    s.add("a", "any", "true", durable=False, collapse=None, handle="A")
    rows = [(["a"], i, ("p", i), {}) for i in (1, 2, 3)]
    assert len(s.receive(_events(*rows)).offers) == 3
    assert s.receive(_events((["a"], 4, ("p", 2), {}))).offers == []  # (among the last 2)


def test_re_attaching_resumes_until_asked_afresh_and_ended_subscriptions_are_told() -> None:
    s = _state()
    s.add("a", "any", "true", durable=True, collapse=None, handle="A")
    s.add("b", "stocks", 'symbol = "IBM"', durable=False, collapse="last", handle="B")
    reqs, data = s.resubscribe(["a", "b"], fresh=False)
    sent = _messages(data)
    assert sorted(reqs.values()) == ["a", "b"] and all(m.resume for m in sent)
    assert [(m.sub_id, m.durable, m.collapse) for m in sent] == [("a", True, None), ("b", False, "last")]
    _, fresh = s.resubscribe(["a"], fresh=True)
    assert not _messages(fresh)[0].resume
    h = s.receive(p.SubEnded("a", "the right to subscribe is gone"))
    ((handle, error),) = h.ended
    assert handle == "A" and isinstance(error, SubscribeError) and "a" not in s.subs
    with pytest.raises(SubscribeError, match="open in this client already"):
        s.add("b", "any", "true", durable=False, collapse=None, handle="B2")


def test_brokers_named_are_tried_after_those_given_and_replies_come_out() -> None:
    s = _state()
    assert list(s.addresses) == ["b1:1", "b2:2", "b3:3"]
    assert [s.next_address() for _ in range(4)] == ["b1:1", "b2:2", "b3:3", "b1:1"]
    assert s.receive(p.Reply(7, True)).reply == p.Reply(7, True)
    assert s.receive(p.Keepalive()) == Happened()  # (nothing to do: its coming is what counts)
    with pytest.raises(ClientError, match="closed the connection: overloaded"):
        s.receive(p.Error("overloaded"))
    with pytest.raises(ProtocolError, match="unexpected Hello"):
        s.receive(p.Hello("x"))


def test_advertisements_go_again_on_each_connection_and_ranges_merge() -> None:
    s = _state()
    s.adverts["x"] = ("stocks", "price > 1")
    first = s.connected()
    (adv,) = _messages(first)
    assert isinstance(adv, p.Advertise)
    assert (adv.adv_id, adv.space, adv.filter) == ("x", "stocks", "price > 1")
    assert s.epoch == 1 and _messages(s.connected())[0].req != adv.req and s.epoch == 2
    assert ranges([5, 1, 2, 3, 7, 8]) == [(1, 3), (5, 5), (7, 8)]
    with pytest.raises(ClientError, match="window and dedup"):
        ClientState("c", ["b:1"], window=0)
