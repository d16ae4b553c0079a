"""The wire codec: every message type round-trips, random values round-trip inside a
message, and the decoders (body and frame) only ever raise FrameError on garbage."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import struct
import tracemalloc
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowbus import wire
from flowbus.client import protocol as bp
from flowbus.errors import InternalError
from flowbus.filters import Filter, parse
from flowbus.net import (
    MAX_DEPTH,
    MAX_FRAME,
    FrameDecoder,
    FrameError,
    decode,
    encode,
    frame,
    registered,
)
from flowbus.overlay import class_router, pastry, ring_load
from flowbus.overlay import ring_messages as rm
from flowbus.overlay.multigraph import LinkClass
from flowbus.routing import (
    cbr,
    express,
    flows,
    irbr,
    irbr_ack,
    link_classes,
    ring_barrier,
    ring_broker,
    ring_custody,
    ring_handover,
    ring_share,
    scribe,
)
from strategies import canonical_filters

BIG = 2**127 + 5
P1, P2, P3 = rm.Peer(5, 3), rm.Peer(2**31 + 7, 11), rm.Peer(rm.SECOND_ID, 0)
F1 = parse("x > 1")
F2 = parse('price > 100 & issue = "IBM" | volume <= -3.5')
EVENT: dict[str, Any] = {
    "issue": "IBM",
    "price": 120.25,
    "volume": -(2**70),
    "ok": True,
    "none": None,
    "raw": b"\x00\xff",
    "nested": {"a": [1, [2, {"b": (3, 4)}], {5, 6}], 7: frozenset({"u"}), (1, "k"): []},
}

CASES: list[object] = [
    # ring_messages
    P1,
    rm.Ping(addr=3, sent=1.5),
    rm.Pong(addr=3, sent=0.0),
    rm.JoinRequest(addr=9, hops=4),
    rm.JoinAccept(id=2**32 - 1, window=(P1, P2)),
    rm.Insert(new=P2),
    rm.ChordQuery(level=3, asker=P1),
    rm.ChordReply(level=3, chord=None),
    rm.ChordReply(level=1, chord=P3),
    rm.Heartbeat(peer=P1),
    rm.Heartbeat(peer=P2, load=1.25),
    rm.Heartbeat(peer=P2, load=0.5, sent=12345.678),
    rm.HeartbeatAck(peer=P3, sent=12345.678),
    rm.Dead(peer=P2, taker=P3),
    rm.Dead(peer=P2),
    rm.Restarted(previous=P1),
    ring_load.Overloaded(peer=P1, load=1.5, rate=150.0, entries=10),
    rm.TestNeighbour(suspect=P2, asker=P1, window=(P1, P3)),
    rm.Probe(asker=P1),
    rm.ProbeAck(peer=P2),
    rm.Alive(suspect=P2, via=P3),
    rm.Failed(suspect=P2, window=()),
    rm.Failed(suspect=P2, window=(P1,), gone=True),
    rm.SetSide(side=-1, peers=(P1, P2), dead=(P3,)),
    rm.Redirect(dead=P2, to=P3),
    rm.Reconnect(asker=P1, dead=(P2,), window=(P3, P1), side=1),
    rm.BackupCopy(
        owner=P1, version=7, state={("sub", 1): F2, 3: [1, 2], "s": EVENT}, links=(P2,), holders=(P3, P2)
    ),
    rm.BackupCopy(owner=P1, version=0, state=None, links=(), holders=()),
    rm.BackupDelta(
        owner=P1,
        version=8,
        base=7,
        entries={("sub", 2): F1},
        deleted=(3, ("sub", 1)),
        links=(P2,),
        holders=(P3,),
    ),
    rm.BackupResync(holder=P3),
    rm.ShareState(sender=P2, entries={(1, "a"): {"f": F1}, 2: None}),
    rm.ShareState(sender=P2, entries={("sub", "s", 7): "x > 1"}, seq=3),
    ring_load.ShareAck(holder=P1, seq=3),
    rm.RingRoute(target=12345, payload={"x": 1}, hops=2),
    rm.RingRoute(target=1, payload=cbr.Publish(event=EVENT), hops=0),
    rm.TracedQuery(origin=P1, target=P2, trace=(P1, P3)),
    rm.LinkDown(origin=P1, target=P2, trace=()),
    # pastry
    pastry.Route(key=BIG, payload=irbr.Publish(event=EVENT, prefix=(1, 0xA), eid=(BIG, 7)), hops=3, origin=4),
    pastry.Join(joiner_id=2**128 - 1, joiner_addr=6, hops=0),
    pastry.JoinState(node_id=BIG, addr=2, hop=1, entries=((BIG, 2), (0, 9)), final=True),
    pastry.Announce(node_id=17, addr=1, entries=((2**100, 3),)),
    pastry.LeafSetRequest(node_id=BIG, addr=8),
    pastry.LeafSetReply(node_id=BIG, addr=8, entries=()),
    pastry.Ping(node_id=0, addr=1),
    pastry.Pong(node_id=2**128 - 2, addr=1),
    pastry.RowRequest(node_id=BIG, addr=4, row=31),
    pastry.RowReply(node_id=BIG, addr=4, entries=((BIG - 1, 5),)),
    # irbr
    irbr.Entry(prefix=(2, 0x21), filter=F2, node=BIG, sub=("s", 1), clock=9),
    irbr.Subscribe(node=BIG, sub="s", filter=F1, clock=3, prefix=(2, 0x21)),
    irbr.Unsubscribe(node=BIG, sub=7, clock=4, prefix=(0, 0)),
    irbr.Publish(event=EVENT, prefix=(1, 3), eid=("client", 12)),
    irbr_ack.Hop(seq=3, body=irbr.Subscribe(node=BIG, sub="s", filter=F1, clock=3, prefix=(2, 0x21))),
    irbr_ack.Hop(seq=4, body=pastry.Route(BIG, irbr.Publish(EVENT, (1, 3), (BIG, 1)), 2, 4)),
    irbr_ack.RepairHop(seq=5, body=pastry.LeafSetRequest(BIG, 7)),
    irbr_ack.Ack(seq=9),
    irbr.TableRequest(addr=5, rows=3),
    irbr.Newcomer(node=BIG, addr=7, prefix=(3, 0x2A1)),
    irbr.TableReply(entries=((BIG, "s", F1, 1), (3, ("t", 2), F2, 2)), tombstones=((BIG, "old", 0),)),
    # scribe
    scribe.JoinTree(epoch=1),
    scribe.LeaveTree(epoch=2),
    scribe.Publish(event=EVENT),
    scribe.Multicast(event={"a": 1}),
    scribe.Heartbeat(),
    ring_custody.Again(cbr.Publish({"x": 1, "__flowbus_event_id": ("c", 1)})),
    ring_handover.Backlog(P1, "sub-1", {"client": "c", "durable": True}, 2, (("('c', 1)", b"\x92"),), True),
    ring_handover.BacklogAck("sub-1", 2),
    ring_handover.BacklogAck("sub-1", 0, False),
    ring_handover.WhereIs(7, ("sub-1", "sub-2"), 3),
    ring_handover.HeldHere(("sub-2",)),
    bp.Keepalive(),
    # cbr
    cbr.Subscribe(origin=(1, "s1"), filter=F2, seq=5, withdraw=((2, "s2"), (3, 7))),
    cbr.Unsubscribe(origin=(1, "s1"), seq=6),
    cbr.Publish(event=EVENT),
    cbr.Advertise(origin=(1, "p1"), filter=F2, seq=7),
    cbr.Unadvertise(origin=(1, "p1"), seq=8),
    # ring_broker
    ring_broker.HandedOver(event=EVENT, dead=42),
    ring_broker.Confirm(ids=(("client-1", 7), (3, 9))),
    ring_broker.Declined(ids=(("client-1", 8),)),
    ring_custody.Resume(),
    ring_custody.Resumed(),
    ring_barrier.Drain(dead=42),
    ring_barrier.Drained(dead=42),
    ring_share.Delegated(subs=(("client-1", 2), "s"), event=EVENT),
    ring_share.Undelegated(subs=("s",), event=EVENT),
    ring_share.Unshare(keys=(("sub", ("client-1", 2), 42),)),
    express.LinkLatency(
        broker=42, version=1_764_000_000_000_000_001, links=((7, True, 0.0004), (9, False, 0.21))
    ),
    express.Detour(via=(9, 7), origin=42, event=EVENT),
    link_classes.LinkClasses(
        broker=2130706433 << 16 | 7001, version=1_700_000_000_000_000_000, links=((5, True), (6, False))
    ),
    link_classes.Refused(items=((("client-1", 7), "space 'vault' is secure: refused"),)),
    ring_broker.Synced(),
    # the client protocol
    bp.Hello(client="c1"),
    bp.Hello(client="c2", token="s3cret"),
    bp.Welcome(broker="127.0.0.1:7001", peers=("127.0.0.1:7002",), spaces={"s": {"x": "int"}, "any": None}),
    bp.Publish(space="s", batch=bp.pack_publish([(1, {"x": 1}), (2, {"x": 2})])),
    bp.PubAck(batch=bp.pack_pubacks([1, 2])),
    bp.Nack(pseq=3, error="field 'x' is missing"),
    bp.Subscribe(req=1, sub_id="c1/a", space="s", filter="x > 1", durable=True, collapse="last", resume=True),
    bp.SubscribeMany(req=2, space="s", sub_ids=("c1/a", "c1/b"), filters=("x > 1", "true"), durable=True),
    bp.Unsubscribe(req=2, sub_id="c1/a"),
    bp.Advertise(req=3, adv_id="ibm", space="s", filter='symbol = "IBM"'),
    bp.Unadvertise(req=4, adv_id="ibm"),
    bp.Reply(req=2, ok=False, error="no subscription"),
    bp.Reply(req=3, ok=True, data=[{"name": "stocks", "version": "039db452e525333e", "owners": 3}]),
    bp.Deploy(req=4, text="name: stocks\nspaces: {}\n"),
    bp.Undeploy(req=5, name="stocks"),
    bp.ListFlows(req=6),
    bp.QueueOpen(req=7, sub_id="spark/NYSE", space="NYSE", filter="price > 10"),
    bp.QueueRead(req=8, sub_id="spark/NYSE", after=3, upto=90, limit=2000),
    bp.QueueAck(req=9, sub_id="spark/NYSE", upto=90),
    rm.BackupAck(holder=rm.Peer(5, 65535), version=12),
    flows.DeployRecord("stocks", "039db452e525333e", "name: stocks\n", (0,), (0, 1)),
    flows.FlowSync(
        deployed=(flows.DeployRecord("stocks", "039db452e525333e", "name: stocks\n", (0, 65535), (0, 17)),),
        withdrawn=((65535, 3),),
        fresh=True,
    ),
    flows.SnapshotAsk(sub="s-1", reply_to=7, flow="stocks", deploy_id=(0, 17), groups=("g0",)),
    flows.SnapshotRows(sub=("c", 1), group="g0", owner=65535, rows=(("max_cur", ("IBM",), 4, (12.5, 11.0)),)),
    bp.Ack(batch=bp.pack_acks([(1, 4), (6, 6)])),
    bp.Events(batch=bp.pack_events([(["c1/a", "c1/b"], 1, ("c2", 5), {"x": 3})])),
    bp.Bye(),
    bp.Error(what="frame too large"),
    bp.ReloadAcl(req=4),
    bp.SubEnded(sub_id="c-1", error="identity 'alice' has no subscribe right on 'vault'"),
    # class_router
    class_router.Classed(
        origin=1,
        dst=2,
        cls=LinkClass.EXPRESS,
        payload=cbr.Publish(event={"k": [1]}),
        link=3,
        sent=0.25,
        hops=1,
        fell_back=False,
        bound=2.5,
    ),
    class_router.LinkBeat(link=3, sent=1.5),
    class_router.LinkEcho(link=3, sent=1.5),
    LinkClass.SECURE,
]


def _same(a: object, b: object) -> bool:
    """Equal and of the same types all the way down (1 == True == 1.0 would hide bugs)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b  # type: ignore[arg-type]
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a) and not isinstance(a, Filter):
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return a == b


@pytest.mark.parametrize(
    "msg", CASES, ids=lambda m: type(m).__module__.rsplit(".", 1)[-1] + "." + repr(m)[:40]
)
def test_round_trip(msg: object) -> None:
    body = encode(msg)
    back = decode(body)
    assert back == msg
    assert _same(back, msg)


def test_every_registered_type_has_a_case() -> None:
    covered = {type(m) for m in CASES}
    # the project's message types (this file tags a test class of its own)
    ours = {tag: cls for tag, cls in registered().items() if cls.__module__.startswith("flowbus.")}
    missing = [tag for tag, cls in ours.items() if cls not in covered]
    assert not missing, f"registered types without a round-trip case in CASES: {missing}"


def test_same_named_classes_are_told_apart() -> None:
    for msg in (cbr.Publish(event={"a": 1}), scribe.Publish(event={"a": 1}), rm.Ping(1, 2.0)):
        assert type(decode(encode(msg))) is type(msg)
    assert decode(encode(pastry.Ping(node_id=1, addr=2))) == pastry.Ping(node_id=1, addr=2)


def test_big_ints() -> None:
    for n in (2**63 - 1, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 2**128 - 1, -(2**128), -(2**1000) + 1):
        assert decode(encode(n)) == n
    assert len(encode(2**64 - 1)) == 9  # msgpack uint64
    assert encode(2**64)[2] == 1  # ext type 1


def test_documented_example_bytes() -> None:
    tag = b"ring.peer"
    expected = msgpack.packb([msgpack.ExtType(2, tag), 5, 3])
    assert encode(rm.Peer(5, 3)) == expected
    assert decode(expected) == rm.Peer(5, 3)


# ------------------------------------------------------------------------ random values


def _floats() -> st.SearchStrategy[float]:
    return st.floats(allow_nan=True, allow_infinity=True)


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    _floats(),
    st.text(max_size=20),
    st.binary(max_size=20),
)
hashables = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8), st.binary(max_size=8)),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=5,
)
json_like = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        | st.dictionaries(hashables, inner, max_size=3)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_like)
def test_random_values_round_trip_in_a_message(value: Any) -> None:
    msg = rm.RingRoute(target=1, payload=value, hops=0)
    back = decode(encode(msg))
    assert isinstance(back, rm.RingRoute)
    assert _same(back.payload, value)
    assert _same(decode(encode(value)), value)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=8), json_like, max_size=5), st.integers(0, 2**128 - 1))
def test_random_events_round_trip(event: dict[str, Any], key: int) -> None:
    msg = pastry.Route(key=key, payload=irbr.Publish(event, (0, 0), (1, 2)), hops=1, origin=2)
    back = decode(encode(msg))
    assert isinstance(back, pastry.Route) and isinstance(back.payload, irbr.Publish)
    assert back.payload.prefix == (0, 0) and back.key == key
    assert _same(back.payload.event, event)


@settings(max_examples=100, deadline=None)
@given(canonical_filters())
def test_random_filters_round_trip(f: Filter) -> None:
    msg = cbr.Subscribe(origin=(1, "s"), filter=f, seq=0, withdraw=())
    assert decode(encode(msg)) == msg


# ------------------------------------------------------------------------ encode errors


class _Unknown:
    pass


@dataclasses.dataclass(frozen=True)
class _Unregistered:
    x: int


@wire.message("test.local")
@dataclasses.dataclass(frozen=True)
class _Local:
    n: int
    name: str
    peer: rm.Peer | None = None

    def __post_init__(self) -> None:
        if self.n < 0:
            raise ValueError("n must be >= 0")


@pytest.mark.parametrize(
    "value",
    [_Unknown(), _Unregistered(1), [1, object()], {"a": {1.5j}}, rm.Peer("x", 1), rm.Ping(1, "now")],  # type: ignore[arg-type]
    ids=["object", "unregistered", "nested", "complex", "peer-str-id", "ping-str-sent"],
)
def test_encode_rejects(value: object) -> None:
    with pytest.raises(FrameError):
        encode(value)


def test_encode_rejects_deep_nesting_and_cycles() -> None:
    deep: list[object] = []
    for _ in range(2000):
        deep = [deep]
    with pytest.raises(FrameError, match="deeper"):
        encode(deep)
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(FrameError):
        encode(loop)


def _nested(depth: int, wrap: Any) -> object:
    value: object = 0
    for _ in range(depth):
        value = wrap(value)
    return value


@pytest.mark.parametrize(
    "build",
    [
        lambda d: _nested(d, lambda v: [v]),
        lambda d: _nested(d, lambda v: {"k": v}),
        lambda d: _nested(d, lambda v: (v, 1)),
        lambda d: cbr.Publish({"k": _nested(d - 2, lambda v: {"k": v})}),  # a message and its map: 2
    ],
    ids=["list", "map", "tuple", "message"],
)
def test_decode_refuses_values_nested_past_max_depth(build: Any) -> None:
    """The decoder counts every container, whichever hook built it, as one level."""
    fits = build(MAX_DEPTH)
    assert decode(encode(fits)) == fits
    with pytest.raises(FrameError, match="deeper"):
        decode(encode(build(MAX_DEPTH + 1)))


def test_wire_tags() -> None:
    assert decode(encode(_Local(1, "a", P1))) == _Local(1, "a", P1)
    assert wire.message("test.local")(_Local) is _Local  # again: no-op
    with pytest.raises(InternalError, match="neither"):
        wire.message("test.int")(int)
    with pytest.raises(InternalError, match="taken"):
        wire.message("test.local")(_Unregistered)
    with pytest.raises(InternalError, match=r"family\.name"):
        wire.message("flowbus.overlay:Peer")


# ------------------------------------------------------------------------ decode errors


def _tagged(tag: str, *items: object) -> bytes:
    return bytes(msgpack.packb([msgpack.ExtType(2, tag.encode()), *items]))


PEER = "ring.peer"


@pytest.mark.parametrize(
    ("body", "what"),
    [
        (b"", "malformed"),
        (b"\xc1", "malformed"),  # never used
        (b"\x01\x02", "malformed"),  # trailing bytes
        (b"\xa3ab", "malformed"),  # truncated str
        (b"\xa2\xff\xfe", "malformed"),  # bad UTF-8
        (_tagged("no.such:Thing", 1), "unknown type tag"),
        (_tagged(PEER, 1), "2 fields expected"),
        (_tagged(PEER, 1, 2, 3), "2 fields expected"),
        (_tagged(PEER, "x", 2), "bad field 'id'"),
        (_tagged(PEER, True, 2), "bad field 'id'"),
        (_tagged("pastry.join", -1, 2, 0), "constructor"),
        (
            _tagged("pastry.join", msgpack.ExtType(1, b"\x01" + bytes(16)), 2, 0),
            "constructor",
        ),
        (_tagged("test.local", -1, "a", None), "constructor"),
        (_tagged("test.local", 1, "a", 5), "bad field 'peer'"),
        (_tagged("classes.link_class", "nope"), "no member"),
        (_tagged("flowbus.overlay.ring_messages:Peer", 1, 2), "unknown type tag"),
        (_tagged("filter", "x >"), "bad filter"),
        (_tagged("filter", 3), "one string"),
        (_tagged("set", [1], 2), "unhashable"),
        (_tagged("frozenset", 1, 1), "duplicate"),
        (b"\x82\x01\x01\x01\x02", "duplicate"),  # {1: 1, 1: 2}
        (bytes(msgpack.packb([1, msgpack.ExtType(2, b"tuple")])), "outside"),
        (bytes(msgpack.packb(msgpack.ExtType(2, b"tuple"))), "outside"),
        (bytes(msgpack.packb(msgpack.ExtType(2, b"\xff"))), "UTF-8"),
        (bytes(msgpack.packb(msgpack.ExtType(9, b""))), "ext type 9"),
        (bytes(msgpack.packb(msgpack.ExtType(1, b"\x05"))), "non-canonical"),
        (bytes(msgpack.packb(msgpack.ExtType(1, b""))), "non-canonical"),
        (bytes(msgpack.packb(msgpack.ExtType(1, b"\x00" + (2**64).to_bytes(9, "big")))), "non-canonical"),
        (b"\xd6\xff\x00\x00\x00\x00", "unexpected"),  # msgpack timestamp (ext -1)
        (b"\x91" * 2000 + b"\x01", "deeper|malformed"),
    ],
)
def test_decode_rejects(body: bytes, what: str) -> None:
    with pytest.raises(FrameError, match=what):
        decode(body)


def test_decode_errors_name_huge_values_safely() -> None:
    huge = msgpack.ExtType(1, (2**20000).to_bytes(2501, "big", signed=True))
    with pytest.raises(FrameError, match="bad field 'addr'"):
        decode(_tagged("ring.ping", [huge], 1.0))
    with pytest.raises(FrameError, match="constructor"):
        decode(_tagged("pastry.join", huge, 2, 0))
    assert decode(_tagged(PEER, huge, 1)) == rm.Peer(2**20000, 1)


def test_decode_map_with_unhashable_key() -> None:
    body = b"\x81\x91\x01\x02"  # {[1]: 2}
    with pytest.raises(FrameError, match="unhashable"):
        decode(body)


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_decode_garbage(body: bytes) -> None:
    with contextlib.suppress(FrameError):
        decode(body)


_TAGS = [*registered(), "tuple", "set", "frozenset", "filter", "", "no.such:Thing", "no.such"]
_wire_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.builds(msgpack.ExtType, st.integers(0, 3), st.binary(max_size=20)),
    st.sampled_from(["x > 1", "a = 1 | b < 2", "x >"]),
)
_wire = st.recursive(
    _wire_scalars,
    lambda inner: (
        st.lists(inner, max_size=9)
        | st.dictionaries(st.one_of(st.integers(-9, 9), st.text(max_size=4)), inner, max_size=3)
        | st.builds(
            lambda tag, items: [msgpack.ExtType(2, tag.encode()), *items],
            st.sampled_from(_TAGS),
            st.lists(inner, max_size=9),
        )
    ),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_wire)
def test_fuzz_structured_bodies(tree: object) -> None:
    """Well-formed msgpack with real tags and random contents: a value or a FrameError."""
    with contextlib.suppress(FrameError):
        decode(bytes(msgpack.packb(tree)))


_VALID = [encode(m) for m in CASES]


@settings(max_examples=1000, deadline=None)
@given(
    st.sampled_from(_VALID),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(0, 10_000),
)
def test_fuzz_mutated_bodies(body: bytes, flips: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(body)
    for pos, byte in flips:
        data[pos % len(data)] = byte
    for candidate in (bytes(data), bytes(data[: cut % (len(data) + 1)])):
        with contextlib.suppress(FrameError):
            decode(candidate)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_VALID), st.integers(0, 10_000), st.binary(min_size=1, max_size=8))
def test_fuzz_inserted_bytes(body: bytes, pos: int, junk: bytes) -> None:
    pos %= len(body) + 1
    with contextlib.suppress(FrameError):
        decode(body[:pos] + junk + body[pos:])


# ------------------------------------------------------------------------------ framing


def test_frame_layout() -> None:
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert frame(b"") == b"\x00\x00\x00\x00"
    assert FrameDecoder().feed(frame(b"")) == [b""]


def test_frame_limit_edges() -> None:
    assert frame(b"x" * 10, limit=10) == struct.pack(">I", 10) + b"x" * 10
    with pytest.raises(FrameError, match="over the limit"):
        frame(b"x" * 11, limit=10)
    dec = FrameDecoder(limit=10)
    assert dec.feed(frame(b"y" * 10, limit=10)) == [b"y" * 10]
    with pytest.raises(FrameError):
        dec.feed(struct.pack(">I", 11))


def test_max_frame_edges() -> None:
    body = bytes(MAX_FRAME)
    framed = frame(body)
    assert FrameDecoder().feed(framed) == [body]
    with pytest.raises(FrameError):
        frame(body + b"\x00")
    with pytest.raises(FrameError):
        FrameDecoder().feed(struct.pack(">I", MAX_FRAME + 1))


def test_oversized_prefix_fails_at_once_without_allocating() -> None:
    dec = FrameDecoder()
    assert dec.feed(b"\xff\xff") == []  # half a prefix: just wait
    tracemalloc.start()
    try:
        with pytest.raises(FrameError, match="4294967295"):
            dec.feed(b"\xff\xff")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024
    assert dec.pending == 0
    with pytest.raises(FrameError, match="broken"):
        dec.feed(frame(b"ok"))  # the connection is to be closed


def test_oversized_prefix_after_good_frames() -> None:
    dec = FrameDecoder(limit=100)
    with pytest.raises(FrameError):
        dec.feed(frame(b"a") + struct.pack(">I", 101))
    with pytest.raises(FrameError):
        dec.feed(b"")


def test_truncated_frames_stay_pending() -> None:
    data = frame(b"hello") + frame(b"world!")
    dec = FrameDecoder()
    assert dec.feed(data[:3]) == []
    assert dec.pending == 3
    assert dec.feed(data[3:8]) == []
    assert dec.feed(data[8:12]) == [b"hello"]
    assert dec.pending == 3
    assert dec.feed(data[12:-1]) == []
    assert dec.feed(data[-1:]) == [b"world!"]
    assert dec.pending == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=8), st.lists(st.integers(0, 3000), max_size=10))
def test_fuzz_split_stream(bodies: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(b) for b in bodies)
    assert FrameDecoder().feed(stream) == bodies
    points = sorted({c % (len(stream) + 1) for c in cuts})
    dec = FrameDecoder()
    got: list[bytes] = []
    prev = 0
    for p in [*points, len(stream)]:
        got += dec.feed(stream[prev:p])
        prev = p
    assert got == bodies
    assert dec.pending == 0


def _reference(stream: bytes, limit: int) -> tuple[list[bytes], bool]:
    """Straightforward framing: the complete bodies, and whether a prefix is over the limit."""
    bodies: list[bytes] = []
    pos = 0
    while len(stream) - pos >= 4:
        (n,) = struct.unpack_from(">I", stream, pos)
        if n > limit:
            return bodies, True
        if len(stream) - pos - 4 < n:
            break
        bodies.append(stream[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return bodies, False


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.binary(max_size=40) | st.binary(max_size=40).map(frame), max_size=6),
    st.lists(st.integers(0, 400), max_size=6),
    st.integers(0, 60),
)
def test_fuzz_random_stream(chunks: list[bytes], cuts: list[int], limit: int) -> None:
    """Any byte stream, in any pieces: the bodies a reference framer finds, and a FrameError
    where it finds an oversized prefix (the bodies before it may come out first)."""
    stream = b"".join(chunks)
    expected, oversized = _reference(stream, limit)
    points = sorted({c % (len(stream) + 1) for c in cuts})
    bounds = [0, *points, len(stream)]
    for pieces in ([stream], [stream[a:b] for a, b in itertools.pairwise(bounds)]):
        dec = FrameDecoder(limit=limit)
        got: list[bytes] = []
        failed = False
        for piece in pieces:
            try:
                got += dec.feed(piece)
            except FrameError:
                failed = True
                break
        assert failed == oversized
        if oversized:
            assert got == expected[: len(got)]
            with pytest.raises(FrameError):
                dec.feed(b"")
        else:
            assert got == expected


def test_messages_through_frames() -> None:
    stream = b"".join(frame(encode(m)) for m in CASES)
    dec = FrameDecoder()
    out: list[object] = []
    for i in range(0, len(stream), 7):
        out += [decode(b) for b in dec.feed(stream[i : i + 7])]
    assert out == CASES
