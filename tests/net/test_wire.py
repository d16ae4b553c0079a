"""The wire tag table, pinned: every message type that crosses the network, under its tag,
with its fields in wire order. A change here is a change of the wire protocol: brokers of
different versions stop understanding each other. Make it on purpose, and say so."""

from __future__ import annotations

import dataclasses
import enum

import pytest

import flowbus.broker.server
import flowbus.overlay.class_router
import flowbus.routing.irbr
import flowbus.routing.scribe
from flowbus import wire
from flowbus.errors import FrameError
from flowbus.net import decode, encode

assert flowbus.broker.server and flowbus.overlay.class_router  # (imported for their tags)
assert flowbus.routing.irbr and flowbus.routing.scribe

PINNED = {
    "ring.backup_ack": "BackupAck(holder, version)",
    "flows.record": "DeployRecord(name, version, text, owners, deploy_id)",
    "flows.snapshot_ask": "SnapshotAsk(sub, reply_to, flow, deploy_id, groups)",
    "flows.snapshot_rows": "SnapshotRows(sub, group, owner, rows)",
    "flows.sync": "FlowSync(deployed, withdrawn, fresh)",
    "cbr.advertise": "Advertise(origin, filter, seq)",
    "cbr.publish": "Publish(event)",
    "cbr.subscribe": "Subscribe(origin, filter, seq, withdraw)",
    "cbr.unadvertise": "Unadvertise(origin, seq)",
    "cbr.unsubscribe": "Unsubscribe(origin, seq)",
    "classes.classed": "Classed(origin, dst, cls, payload, link, sent, hops, fell_back, bound)",
    "classes.link_beat": "LinkBeat(link, sent)",
    "classes.link_class": "LinkClass: 'normal', 'express', 'secure'",
    "classes.link_echo": "LinkEcho(link, sent)",
    "client.ack": "Ack(batch)",
    "client.advertise": "Advertise(req, adv_id, space, filter)",
    "client.bye": "Bye()",
    "client.error": "Error(what)",
    "client.events": "Events(batch)",
    "client.hello": "Hello(client, version, token)",
    "client.keepalive": "Keepalive()",
    "client.nack": "Nack(pseq, error)",
    "client.pub_ack": "PubAck(batch)",
    "client.publish": "Publish(space, batch)",
    "client.queue_ack": "QueueAck(req, sub_id, upto)",
    "client.queue_open": "QueueOpen(req, sub_id, space, filter, resume)",
    "client.queue_read": "QueueRead(req, sub_id, after, upto, limit, marks)",
    "client.reply": "Reply(req, ok, error, data)",
    "client.reload_acl": "ReloadAcl(req)",
    "client.sub_ended": "SubEnded(sub_id, error)",
    "client.deploy": "Deploy(req, text)",
    "client.undeploy": "Undeploy(req, name)",
    "client.list_flows": "ListFlows(req)",
    "client.subscribe": "Subscribe(req, sub_id, space, filter, durable, collapse, resume)",
    "client.subscribe_many": "SubscribeMany(req, space, sub_ids, filters, durable, collapse)",
    "client.unadvertise": "Unadvertise(req, adv_id)",
    "client.unsubscribe": "Unsubscribe(req, sub_id)",
    "client.welcome": "Welcome(broker, peers, spaces)",
    "irbr.ack": "Ack(seq)",
    "irbr.entry": "Entry(prefix, filter, node, sub, clock)",
    "irbr.hop": "Hop(seq, body)",
    "irbr.newcomer": "Newcomer(node, addr, prefix)",
    "irbr.publish": "Publish(event, prefix, eid)",
    "irbr.repair_hop": "RepairHop(seq, body)",
    "irbr.subscribe": "Subscribe(node, sub, filter, clock, prefix)",
    "irbr.table_reply": "TableReply(entries, tombstones)",
    "irbr.table_request": "TableRequest(addr, rows)",
    "irbr.unsubscribe": "Unsubscribe(node, sub, clock, prefix)",
    "pastry.announce": "Announce(node_id, addr, entries)",
    "pastry.join": "Join(joiner_id, joiner_addr, hops)",
    "pastry.join_state": "JoinState(node_id, addr, hop, entries, final)",
    "pastry.leaf_set_reply": "LeafSetReply(node_id, addr, entries)",
    "pastry.leaf_set_request": "LeafSetRequest(node_id, addr)",
    "pastry.ping": "Ping(node_id, addr)",
    "pastry.pong": "Pong(node_id, addr)",
    "pastry.route": "Route(key, payload, hops, origin)",
    "pastry.row_reply": "RowReply(node_id, addr, entries)",
    "pastry.row_request": "RowRequest(node_id, addr, row)",
    "ring.alive": "Alive(suspect, via)",
    "ring.backup_copy": "BackupCopy(owner, version, state, links, holders)",
    "ring.backup_delta": "BackupDelta(owner, version, base, entries, deleted, links, holders)",
    "ring.backup_resync": "BackupResync(holder)",
    "ring.chord_query": "ChordQuery(level, asker)",
    "ring.chord_reply": "ChordReply(level, chord)",
    "ring.dead": "Dead(peer, taker)",
    "ring.failed": "Failed(suspect, window, gone, taker)",
    "ring.heartbeat": "Heartbeat(peer, load, sent, window)",
    "ring.heartbeat_ack": "HeartbeatAck(peer, sent)",
    "ring.insert": "Insert(new)",
    "ring.join_accept": "JoinAccept(id, window)",
    "ring.join_request": "JoinRequest(addr, hops, nonce)",
    "ring.link_down": "LinkDown(origin, target, trace)",
    "ring.overloaded": "Overloaded(peer, load, rate, entries)",
    "ring.peer": "Peer(id, addr)",
    "ring.ping": "Ping(addr, sent)",
    "ring.pong": "Pong(addr, sent)",
    "ring.probe": "Probe(asker)",
    "ring.probe_ack": "ProbeAck(peer)",
    "ring.restarted": "Restarted(previous)",
    "ring.reconnect": "Reconnect(asker, dead, window, side)",
    "ring.redirect": "Redirect(dead, to)",
    "ring.route": "RingRoute(target, payload, hops)",
    "ring.set_side": "SetSide(side, peers, dead)",
    "ring.share_ack": "ShareAck(holder, seq)",
    "ring.share_state": "ShareState(sender, entries, seq)",
    "ring.test_neighbour": "TestNeighbour(suspect, asker, window)",
    "ring.traced_query": "TracedQuery(origin, target, trace)",
    "ringbroker.again": "Again(msg)",
    "ringbroker.backlog": "Backlog(previous, sub, meta, part, rows, last)",
    "ringbroker.backlog_ack": "BacklogAck(sub, part, taken)",
    "ringbroker.confirm": "Confirm(ids)",
    "ringbroker.declined": "Declined(ids)",
    "ringbroker.delegated": "Delegated(subs, event)",
    "ringbroker.drain": "Drain(dead)",
    "ringbroker.drained": "Drained(dead)",
    "ringbroker.detour": "Detour(via, origin, event)",
    "ringbroker.handed_over": "HandedOver(event, dead)",
    "ringbroker.held_here": "HeldHere(subs)",
    "ringbroker.link_classes": "LinkClasses(broker, version, links)",
    "ringbroker.link_latency": "LinkLatency(broker, version, links)",
    "ringbroker.refused": "Refused(items)",
    "ringbroker.resume": "Resume()",
    "ringbroker.resumed": "Resumed()",
    "ringbroker.synced": "Synced()",
    "ringbroker.undelegated": "Undelegated(subs, event)",
    "ringbroker.unshare": "Unshare(keys)",
    "ringbroker.where_is": "WhereIs(asker, subs, hops)",
    "scribe.heartbeat": "Heartbeat()",
    "scribe.join_tree": "JoinTree(epoch)",
    "scribe.leave_tree": "LeaveTree(epoch)",
    "scribe.multicast": "Multicast(event)",
    "scribe.publish": "Publish(event)",
}


def _describe(cls: type) -> str:
    if issubclass(cls, enum.Enum):
        return f"{cls.__name__}: " + ", ".join(repr(m.value) for m in cls)
    fields = ", ".join(f.name for f in dataclasses.fields(cls) if f.init)
    return f"{cls.__name__}({fields})"


def test_the_tag_table_is_pinned() -> None:
    table = {
        tag: _describe(cls) for tag, cls in wire.table().items() if cls.__module__.startswith("flowbus.")
    }
    assert table == PINNED


def test_tags_are_short_and_carry_no_module_path() -> None:
    for tag, cls in wire.table().items():
        assert wire.TAG_FORMAT.fullmatch(tag)
        assert cls.__module__ not in tag and len(tag) <= 32
        assert wire.tag_of(cls) == tag and wire.type_of(tag) is cls


def test_an_unknown_tag_is_a_protocol_error_naming_it() -> None:
    body = encode(flowbus.routing.scribe.Heartbeat()).replace(b"scribe.heartbeat", b"scribe.heartbeaT")
    with pytest.raises(FrameError, match=r"scribe\.heartbeaT"):
        decode(body)
