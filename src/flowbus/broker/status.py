"""What the console shows of a broker, as plain data read from its live state (read only).

How it works: each function reads the broker's parts through their public attributes --
the routing core and its ring node, the queues and their subscriptions, the spaces, the
flows registry, the metrics' counts -- and returns dicts and lists of plain values, which
the console's pages (:mod:`flowbus.broker.pages`) format and ``/api/state`` sends as JSON.
Nothing here changes the broker, and each call is a walk over the subscriptions and the
ring window: cheap enough for a request handler in the broker's own loop.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from flowbus.broker.overlays import address_text
from flowbus.overlay.chordal_ring import RingNode

if TYPE_CHECKING:
    from flowbus.broker.metrics import BrokerMetrics
    from flowbus.broker.view import BrokerView as Broker

__all__ = ["arcs_view", "overview", "ring_view", "spaces_view", "state"]

SECURE, NORMAL = "secure", "normal"
"""A link's class as the brokers have it: secure when its connection is mutual TLS (docs/security.md),
else normal (express links are the simulator's, :mod:`flowbus.overlay.class_router`)."""


def overview(b: Broker) -> dict[str, Any]:
    """The broker in numbers (what ``Broker.stats`` gives, and its flows)."""
    return {**b.stats(), "flows": [f["name"] for f in b.flows.list()]}


def _roles(ring: RingNode) -> dict[int, list[str]]:
    roles: dict[int, list[str]] = {}
    for name in ("right", "rightright", "left", "leftleft"):
        peer = getattr(ring, name)
        if peer is not None and peer.id != ring.id:
            roles.setdefault(peer.id, []).append(name)
    for level, peer in sorted(ring.chords.items()):
        if peer.id != ring.id:
            roles.setdefault(peer.id, []).append(f"chord {level}")
    return roles


def ring_view(b: Broker) -> dict[str, Any]:
    """This broker's view of the ring: itself, the brokers it links to (window and chords),
    with their roles, link class (secure: mutual TLS) and last heard load; suspects, dead,
    takeovers."""
    core = b.ring_core
    if core is None or not core.ring.joined:
        return {"joined": False, "brokers": [], "suspects": [], "dead": [], "taken_over": []}
    ring = core.ring
    now = asyncio.get_running_loop().time()
    suspects = set(ring.suspects)
    brokers = [
        {
            "id": ring.id,
            "address": b.address,
            "roles": ["this broker"],
            "link": "",
            "load": round(ring.load(now), 3),
            "suspected": False,
        }
    ]
    roles = _roles(ring)
    judge = core.express.judge
    for peer in ring.links():
        brokers.append(
            {
                "id": peer.id,
                "address": address_text(peer.addr),
                "roles": roles.get(peer.id, []),
                "link": SECURE if b.runtime.secure(peer.addr) else NORMAL,
                "load": ring.loads.neighbours.get(peer.id),
                "suspected": peer.id in suspects,
                "latency_ms": _ms(judge.latency.get(peer.addr)) if judge is not None else None,
                "express": judge.express.get(peer.addr) if judge is not None else None,
            }
        )
    return {
        "joined": True,
        "brokers": brokers,
        "suspects": sorted(suspects),
        "dead": sorted(ring.dead),
        "taken_over": list(ring.taken_over),
        "backup": ring.backup,
        "changes": b.ring_log.changes if b.ring_log is not None else 0,
        **(b.adapt.view() if b.adapt is not None else {}),  # (shares; express links)
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 3)


def _space_kind(b: Broker, name: str) -> tuple[str, str]:
    """``(flow or "", kind)`` of a space."""
    flow = b.spaces.flow_of(name)
    if flow is None:
        return "", "configured"
    return flow.name, flow.spaces[name].kind


def spaces_view(b: Broker, metrics: BrokerMetrics) -> list[dict[str, Any]]:
    """Per space (configured, flows' and any with traffic here): its counts and its
    subscriptions served here (filter, durable, interpretation, queue)."""
    counts = metrics.counts()
    names = set(b.spaces.listed()) | set(counts)
    for d in b.flows.list():
        names.update(s["name"] for s in d["spaces"])
    subs: dict[str, list[dict[str, Any]]] = {}
    for sub in b.queues.subs.values():
        subs.setdefault(sub.space, []).append(
            {
                "id": sub.sub_id,
                "client": sub.client,
                "filter": sub.filter or "true",
                "durable": sub.durable,
                "interpretation": sub.collapse or "",
                "attached": sub.session is not None,
                "queued": len(sub.pending) + sub.unacked + sub.on_disk + len(sub.held),
                "on_disk": sub.on_disk,
            }
        )
    out = []
    for name in sorted(n for n in names if n):
        flow, kind = _space_kind(b, name)
        row = counts.get(name, {})
        out.append(
            {
                "name": name,
                "flow": flow,
                "kind": kind,
                **{k: row.get(k, 0) for k in ("in", "deliveries", "out", "queued", "on_disk")},
                "subscriptions": subs.get(name, []),
            }
        )
    return out


def arcs_view(b: Broker) -> dict[str, dict[str, int]]:
    """Per deployed flow, the events this broker saw through each route of the rewritten graph
    and each arc of the graph (as an edge, as the owner of a partition): its ``counts``."""
    core = b.ring_core
    if core is None:
        return {}
    return {name: dict(d.counts) for name, d in core.flows.deployments.items()}


def state(b: Broker, metrics: BrokerMetrics) -> dict[str, Any]:
    """Everything the pages poll (``/api/state``)."""
    return {
        "broker": overview(b),
        "ring": ring_view(b),
        "spaces": spaces_view(b, metrics),
        "arcs": arcs_view(b),
    }
