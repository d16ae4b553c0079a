"""Advertisements in the covering-based content router (``flowbus.routing.cbr``): what they save.

31 brokers in a random tree (covering on), wired by direct message passing (FIFO). 5 publisher
brokers advertise disjoint sets of symbols (``symbol in {...}``, 10 of the 50 each); 3,000
subscriptions of the broker workload (``benchmarks/bench_cbr.py``: ``symbol = ...`` and 2-4
conditions on price, quantity, level, exchange) at random brokers. Printed as one JSON document,
per mode -- ``off`` (no advertisements), ``on`` (advertisements first, then subscriptions) and
``on_late`` (subscriptions first, then advertisements):

* ``table_entries`` -- subscriptions held over all brokers, local ones included
  (``remote_entries``: without them); ``forwarded`` -- roots forwarded over all links;
* ``subscription_messages`` -- ``Subscribe`` + ``Unsubscribe`` sent (and each type apart),
  ``advertise_messages``; ``setup_s`` -- the time to settle;
* ``publish_messages`` -- ``Publish`` hops for the events, ``deliveries``.

2,000 events of the workload are published each at the broker advertising its symbol; the
deliveries of every mode are compared with each other and with brute force (``delivery_equal``),
and ``on_late``'s tables with ``on``'s (``late_state_equal``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Hashable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from flowbus.core import Deliver, Effect, Send
from flowbus.filters import Filter, parse
from flowbus.routing.cbr import ContentRouter


def _workload() -> ModuleType:
    """``benchmarks/bench_cbr.py``, for the broker workload's generators."""
    spec = importlib.util.spec_from_file_location("bench_cbr", Path(__file__).with_name("bench_cbr.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--brokers", type=int, default=31)
    ap.add_argument("--publishers", type=int, default=5)
    ap.add_argument("--subs", type=int, default=3000)
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)

    wl = _workload()
    rng = random.Random(args.seed)
    adj = random_tree(args.brokers, rng)
    pubs = rng.sample(sorted(adj), args.publishers)
    symbols = list(wl.SYMBOLS)
    rng.shuffle(symbols)
    groups = [symbols[i :: args.publishers] for i in range(args.publishers)]
    adverts = {
        b: parse("symbol in {" + ", ".join(f'"{s}"' for s in sorted(g)) + "}")
        for b, g in zip(pubs, groups, strict=True)
    }
    publisher = {s: b for b, g in zip(pubs, groups, strict=True) for s in g}
    filters: list[Filter] = wl.make_filters(args.subs, args.seed)
    subs = [(rng.randrange(args.brokers), f) for f in filters]
    events: list[dict[str, Any]] = wl.make_events(args.events, args.seed + 1)
    for k, ev in enumerate(events):
        ev["id"] = k

    doc: dict[str, Any] = {
        "brokers": args.brokers,
        "publishers": pubs,
        "subscriptions": args.subs,
        "events": args.events,
        "seed": args.seed,
    }
    nets = {}
    for mode in ("off", "on", "on_late"):
        doc[mode], nets[mode] = run_mode(mode, adj, adverts, subs, events, publisher)
    expected = Counter((b, k, ev["id"]) for ev in events for k, (b, f) in enumerate(subs) if f.matches(ev))
    doc["delivery_equal"] = all(n.delivered == expected for n in nets.values())
    doc["late_state_equal"] = nets["on"].tables() == nets["on_late"].tables()
    doc["table_entries_ratio_on_off"] = round(doc["on"]["table_entries"] / doc["off"]["table_entries"], 3)
    doc["subscription_messages_ratio_on_off"] = round(
        doc["on"]["subscription_messages"] / doc["off"]["subscription_messages"], 3
    )
    print(json.dumps(doc, indent=2))
    if not (doc["delivery_equal"] and doc["late_state_equal"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
