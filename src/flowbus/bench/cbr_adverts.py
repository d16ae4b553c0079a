"""Advertisements in the covering-based content router (``flowbus.routing.cbr``): what they save.

31 brokers in a random tree (covering on), wired by direct message passing (FIFO). 5 publisher
brokers advertise disjoint sets of symbols (``symbol in {...}``, 10 of the 50 each); 3,000
subscriptions of the broker workload (:mod:`flowbus.bench.cbr`: ``symbol = ...`` and 2-4
conditions on price, quantity, level, exchange) at random brokers. ``flowbus bench
cbr-adverts --json`` prints one JSON document, per mode -- ``off`` (no advertisements),
``on`` (advertisements first, then subscriptions) and ``on_late`` (subscriptions first,
then advertisements):

* ``table_entries`` -- subscriptions held over all brokers, local ones included
  (``remote_entries``: without them); ``forwarded`` -- roots forwarded over all links;
* ``subscription_messages`` -- ``Subscribe`` + ``Unsubscribe`` sent (and each type apart),
  ``advertise_messages``; ``setup_s`` -- the time to settle;
* ``publish_messages`` -- ``Publish`` hops for the events, ``deliveries``.

2,000 events of the workload are published each at the broker advertising its symbol; the
deliveries of every mode are compared with each other and with brute force (``delivery_equal``),
and ``on_late``'s tables with ``on``'s (``late_state_equal``); the command exits with status 1
when either is false.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Hashable
from typing import Any

from flowbus.bench.cbr import SYMBOLS, make_events, make_filters
from flowbus.core import Deliver, Effect, Send
from flowbus.filters import Filter, parse
from flowbus.routing.cbr import ContentRouter


def random_tree(n: int, rng: random.Random) -> dict[int, set[int]]:
    adj: dict[int, set[int]] = {i: set() for i in range(n)}
    for i in range(1, n):
        p = rng.randrange(i)
        adj[i].add(p)
        adj[p].add(i)
    return adj


class Net:
    """Routers passing messages directly (FIFO); deliveries and messages counted."""

    def __init__(self, adj: dict[int, set[int]], advertising: bool) -> None:
        self.routers = {b: ContentRouter(b, adj[b], advertising=advertising) for b in sorted(adj)}
        self.pending: list[tuple[int, int, Any]] = []
        self.sent: Counter[str] = Counter()
        self.delivered: Counter[tuple[int, Hashable, int]] = Counter()

    def apply(self, b: int, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, Send):
                self.pending.append((b, e.dst, e.msg))
                self.sent[type(e.msg).__name__] += 1
            elif isinstance(e, Deliver):
                self.delivered[(b, e.sub, e.event["id"])] += 1

    def run(self) -> None:
        i = 0
        while i < len(self.pending):
            src, dst, msg = self.pending[i]
            i += 1
            self.apply(dst, self.routers[dst].on_message(src, msg, 0.0))
        self.pending.clear()

    def tables(self) -> dict[int, Any]:
        return {b: r.routing_state() for b, r in self.routers.items()}


def run_mode(
    mode: str,
    adj: dict[int, set[int]],
    adverts: dict[int, Filter],
    subs: list[tuple[int, Filter]],
    events: list[dict[str, Any]],
    publisher: dict[str, int],
) -> tuple[dict[str, Any], Net]:
    net = Net(adj, advertising=mode != "off")
    t = time.perf_counter()
    if mode == "on":
        for b, f in adverts.items():
            net.apply(b, net.routers[b].advertise("pub", f))
        net.run()
    for k, (b, f) in enumerate(subs):
        net.apply(b, net.routers[b].subscribe(k, f))
    net.run()
    if mode == "on_late":
        for b, f in adverts.items():
            net.apply(b, net.routers[b].advertise("pub", f))
        net.run()
    setup = time.perf_counter() - t
    entries = sum(sum(r.table_size().values()) for r in net.routers.values())
    out: dict[str, Any] = {
        "table_entries": entries,
        "remote_entries": entries - len(subs),
        "forwarded": sum(sum(r.forwarded_size().values()) for r in net.routers.values()),
        "subscription_messages": net.sent["Subscribe"] + net.sent["Unsubscribe"],
        "subscribe_messages": net.sent["Subscribe"],
        "unsubscribe_messages": net.sent["Unsubscribe"],
        "advertise_messages": net.sent["Advertise"],
        "setup_s": round(setup, 3),
    }
    t = time.perf_counter()
    for ev in events:
        b = publisher[ev["symbol"]]
        net.apply(b, net.routers[b].publish(ev))
        net.run()
    out["publish_s"] = round(time.perf_counter() - t, 3)
    out["publish_messages"] = net.sent["Publish"]
    out["deliveries"] = sum(net.delivered.values())
    return out, net


def run(
    *, brokers: int = 31, publishers: int = 5, subscriptions: int = 3000, events: int = 2000, seed: int = 1
) -> dict[str, Any]:
    """The three modes on one tree, subscriptions and events (see the module note)."""
    rng = random.Random(seed)
    adj = random_tree(brokers, rng)
    pubs = rng.sample(sorted(adj), publishers)
    symbols = list(SYMBOLS)
    rng.shuffle(symbols)
    groups = [symbols[i::publishers] for i in range(publishers)]
    adverts = {
        b: parse("symbol in {" + ", ".join(f'"{s}"' for s in sorted(g)) + "}")
        for b, g in zip(pubs, groups, strict=True)
    }
    publisher = {s: b for b, g in zip(pubs, groups, strict=True) for s in g}
    filters: list[Filter] = make_filters(subscriptions, seed)
    subs = [(rng.randrange(brokers), f) for f in filters]
    evs: list[dict[str, Any]] = make_events(events, seed + 1)
    for k, ev in enumerate(evs):
        ev["id"] = k

    doc: dict[str, Any] = {
        "brokers": brokers,
        "publishers": pubs,
        "subscriptions": subscriptions,
        "events": events,
        "seed": seed,
    }
    nets = {}
    for mode in ("off", "on", "on_late"):
        doc[mode], nets[mode] = run_mode(mode, adj, adverts, subs, evs, publisher)
    expected = Counter((b, k, ev["id"]) for ev in evs for k, (b, f) in enumerate(subs) if f.matches(ev))
    doc["delivery_equal"] = all(n.delivered == expected for n in nets.values())
    doc["late_state_equal"] = nets["on"].tables() == nets["on_late"].tables()
    doc["table_entries_ratio_on_off"] = round(doc["on"]["table_entries"] / doc["off"]["table_entries"], 3)
    doc["subscription_messages_ratio_on_off"] = round(
        doc["on"]["subscription_messages"] / doc["off"]["subscription_messages"], 3
    )
    return doc
