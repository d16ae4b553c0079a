"""A broker's Prometheus metrics: its own registry, read from its live state when scraped.

How it works (``GET /metrics`` on the console, :mod:`flowbus.broker.console`):

* **One registry per broker** (a ``prometheus_client.CollectorRegistry``, never the global
  one: several brokers may live in one process, as in the tests).
* **Counted as they happen**, and only while the console runs (:meth:`BrokerMetrics.attach`
  sets the hooks; without it nothing on the path of an event changes):

  - ``flowbus_events_in_total{space}``: events this broker's clients published, taken
    (the ledger's ``on_taken`` hook, once per batch);
  - ``flowbus_deliveries_total{space}``: deliveries the routing core made to the clients'
    subscriptions served here (a wrapper of the runtime's ``on_deliver``; a flow's state
    partitions are not counted);
  - ``flowbus_publish_latency_seconds{space}``: from a publish taken to its settling,
    when every place it went has it (the ``PubAck``), a histogram (the ledger's
    ``on_settled`` hook).
* **Read when scraped** (a collector over the broker's state; nothing kept twice):
  ``flowbus_events_out_total{space}`` (sent to subscribers' clients), ``flowbus_queue_depth``
  and ``flowbus_queue_on_disk`` and ``flowbus_subscriptions`` per space, the ring's
  ``flowbus_ring_changes_total`` (each change of this broker's view: window, suspects, dead,
  takeovers), ``flowbus_ring_links``, ``flowbus_ring_suspects``, ``flowbus_ring_dead``,
  ``flowbus_ring_load``, the load shares (``flowbus_ring_shares_pending``,
  ``flowbus_ring_shared_out``, ``flowbus_ring_shared_in``), with an express space the links'
  measured latency (``flowbus_link_latency_seconds{peer, express}``) and
  ``flowbus_express_detours_total``, ``flowbus_express_fallbacks_total``; and
  ``flowbus_in_custody``, ``flowbus_sessions``, ``flowbus_spilled_total``; the store's
  ``flowbus_store_full`` (1 while its writes fail or wait in memory) and
  ``flowbus_store_refused_total`` (deliveries refused meanwhile).

:meth:`BrokerMetrics.counts` gives the same counts as plain data for the console's pages.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from flowbus.broker.ledger import EventId
from flowbus.broker.overlays import address_text
from flowbus.meta import SPACE
from flowbus.net.runtime import DeliverAllHook, DeliverHook
from flowbus.routing.ring_broker import RingBroker

if TYPE_CHECKING:
    from flowbus.broker.view import BrokerView as Broker

__all__ = ["BrokerMetrics"]

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class BrokerMetrics:
    """The metrics of ``broker`` (see the module note)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.registry = CollectorRegistry(auto_describe=True)
        self.events_in: Counter[str] = Counter()
        self.deliveries: Counter[str] = Counter()
        self._taken: dict[Hashable, tuple[float, str]] = {}  # event id -> (when taken, space)
        self.latency = Histogram(
            "flowbus_publish_latency_seconds",
            "From a publish taken by this broker to its settling (every place it went has it).",
            ["space"],
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )
        self._latency_of: dict[str, Any] = {}  # space -> its child of the histogram
        self.registry.register(_StateCollector(self))

    def attach(self) -> None:
        """Count from now on: the ledger's hooks and the deliveries."""
        b = self.broker
        b.ledger.on_taken = self._taken_batch
        b.ledger.on_settled = self._settled
        b.runtime.on_deliver = self._counting(b.runtime.on_deliver)
        b.runtime.on_deliver_all = self._counting_all(b.runtime.on_deliver_all)

    def _counting(self, deliver: DeliverHook | None) -> DeliverHook:
        counts = self.deliveries
        subs = self.broker.queues.subs

        def on_deliver(addr: int, sub_id: Hashable, event: Any) -> None:
            sub = subs.get(sub_id) if isinstance(sub_id, str) else None
            if sub is not None:  # (not a flow's state partition)
                counts[sub.space] += 1
            if deliver is not None:
                deliver(addr, sub_id, event)

        return on_deliver

    def _counting_all(self, deliver: DeliverAllHook | None) -> DeliverAllHook:
        counts = self.deliveries
        subs = self.broker.queues.subs

        def on_deliver_all(addr: int, sub_ids: tuple[Hashable, ...], event: Any) -> None:
            sub = subs.get(sub_ids[0]) if isinstance(sub_ids[0], str) else None
            if sub is not None:  # (a DeliverAll's subscriptions are all to one space)
                counts[sub.space] += len(sub_ids)
            if deliver is not None:
                deliver(addr, sub_ids, event)

        return on_deliver_all

    def _taken_batch(self, items: list[tuple[EventId, dict[str, Any]]]) -> None:
        now = time.monotonic()
        taken = self._taken
        counts = self.events_in
        for eid, fields in items:
            space = fields.get(SPACE, "")
            counts[space] += 1
            taken[eid] = (now, space)

    def _settled(self, eids: list[Hashable]) -> None:
        now = time.monotonic()
        for eid in eids:
            got = self._taken.pop(eid, None)
            if got is None:
                continue
            child = self._latency_of.get(got[1])
            if child is None:
                child = self._latency_of[got[1]] = self.latency.labels(got[1])
            child.observe(now - got[0])

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)

    def counts(self) -> dict[str, dict[str, int]]:
        """Per space: events in, deliveries, events out, subscriptions, queue depth, on disk."""
        out: dict[str, dict[str, int]] = {}

        def row(space: str) -> dict[str, int]:
            return out.setdefault(
                space, {"in": 0, "deliveries": 0, "out": 0, "subscriptions": 0, "queued": 0, "on_disk": 0}
            )

        for space, n in self.events_in.items():
            row(space)["in"] = n
        for space, n in self.deliveries.items():
            row(space)["deliveries"] = n
        queues = self.broker.queues
        for space, n in queues.sent.items():
            row(space)["out"] = n
        for sub in queues.subs.values():
            r = row(sub.space)
            r["subscriptions"] += 1
            r["queued"] += len(sub.pending) + sub.unacked + sub.on_disk + len(sub.held)
            r["on_disk"] += sub.on_disk
        return out


class _StateCollector(Collector):
    """What is read from the broker's state when scraped (see the module note)."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        counts = m.counts()
        per_space = [
            (CounterMetricFamily, "events_in", "in", "Events published by this broker's clients, taken."),
            (CounterMetricFamily, "deliveries", "deliveries", "Deliveries to the subscriptions served here."),
            (CounterMetricFamily, "events_out", "out", "Events sent to subscribers' clients."),
            (GaugeMetricFamily, "subscriptions", "subscriptions", "Subscriptions served here."),
            (GaugeMetricFamily, "queue_depth", "queued", "Deliveries queued here, not yet acknowledged."),
            (GaugeMetricFamily, "queue_on_disk", "on_disk", "Deliveries queued in SQLite (spilled)."),
        ]
        for family, name, key, text in per_space:
            metric = family(f"flowbus_{name}", text, labels=["space"])
            for space in sorted(counts):
                metric.add_metric([space], counts[space][key])
            yield metric
        b = m.broker
        yield from _gauges(
            (
                "in_custody",
                "Events this broker keeps until every place they went confirms them.",
                b.core.in_custody(),
            ),
            ("sessions", "Client connections.", len(b.sessions.by_client)),
            (
                "store_full",
                "1 while the store cannot write (its disk full) or writes wait in memory for it.",
                float(b.store_full() is not None),
            ),
        )
        yield CounterMetricFamily("flowbus_spilled", "Deliveries spilled to SQLite.", value=b.queues.spilled)
        yield CounterMetricFamily(
            "flowbus_store_refused",
            "Deliveries refused: their subscription held its limit in memory, the store full.",
            value=b.queues.refused,
        )
        core = b.ring_core
        if core is not None and b.ring_log is not None:
            ring = core.ring
            now = asyncio.get_running_loop().time()  # (the core's clock; scraped in the loop)
            yield CounterMetricFamily(
                "flowbus_ring_changes", "Changes of this broker's view of the ring.", value=b.ring_log.changes
            )
            yield from _gauges(
                (
                    "ring_links",
                    "Ring neighbours and chords this broker links to.",
                    len(ring.links()) if ring.joined else 0,
                ),
                ("ring_suspects", "Brokers suspected and being tested.", len(ring.suspects)),
                ("ring_dead", "Brokers this broker declared dead.", len(ring.dead)),
                ("ring_load", "This broker's load (1.0: at its limit).", ring.load(now)),
                ("ring_shares_pending", "Load shares sent and not acknowledged.", len(ring.shares.pending)),
                ("ring_shared_out", "Own subscriptions a neighbour matches (load).", len(core.shared.out)),
                ("ring_shared_in", "Neighbours' subscriptions matched here (load).", len(core.shared.hosted)),
            )
            yield from _express(core)


def _express(core: RingBroker) -> Iterator[Metric]:
    """Express links as measured here, and the express events sent round a slow link."""
    judge = core.express.judge
    if judge is None:
        return
    latency = GaugeMetricFamily(
        "flowbus_link_latency_seconds",
        "Ring link latency measured from heartbeats.",
        labels=["peer", "express"],
    )
    for peer, fast in sorted(judge.express.items()):
        latency.add_metric([address_text(peer), str(fast).lower()], judge.latency.get(peer, 0.0))
    yield latency
    for name, text, value in (
        ("express_detours", "Express events sent round a slow link.", core.express.detours),
        ("express_fallbacks", "Express events with no express path (sent direct).", core.express.fallbacks),
    ):
        yield CounterMetricFamily(f"flowbus_{name}", text, value=value)


def _gauges(*rows: tuple[str, str, float]) -> Iterator[Metric]:
    for name, text, value in rows:
        yield GaugeMetricFamily(f"flowbus_{name}", text, value=value)
