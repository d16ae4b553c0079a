"""The ring adapting on real brokers (127.0.0.1, one process): a broker over its load limit
shares its clients' subscriptions' routing with a neighbour, and every subscriber still gets
each event once."""

from __future__ import annotations

import asyncio

from tests.broker.test_server import eventually, ring, run

import flowbus
from flowbus.broker.config import DEFAULT
from flowbus.routing.ring_broker import RingBroker


def test_a_loaded_broker_moves_subscriptions_and_nothing_is_lost_or_duplicated() -> None:
    """Four subscriptions at a broker whose limit is two: two move to a neighbour, which
    matches their events and hands the deliveries back; events published at each broker
    reach each matching subscription once; an unsubscribed one leaves the holder too."""

    async def main() -> None:
        async with ring(3, config=DEFAULT.with_(load_limit=2, heartbeat=0.3)) as brokers:
            cores: list[RingBroker] = [b.core for b in brokers]  # type: ignore[misc]
            home = brokers[0]
            async with flowbus.connect(home.address) as c:
                subs = [await c.subscribe("events", f"x >= {i}") for i in range(4)]
                await eventually(lambda: len(cores[0].shared.out) == 2)
                holder = next(core for core in cores[1:] if core.shared.hosted)
                assert set(holder.shared.hosted) == set(cores[0].shared.out)
                assert cores[0].ring.load(0.0) <= 1.0
                pubs = [flowbus.connect(b.address) for b in brokers]
                for p in pubs:
                    await p.open()
                try:
                    for n in range(8):
                        await pubs[n % 3].publish("events", {"x": n % 4, "n": n})
                    for i, sub in enumerate(subs):
                        want = sorted(n for n in range(8) if n % 4 >= i)
                        got = sorted([(await sub.get(5))["n"] for _ in want])
                        assert got == want
                    for p in pubs:
                        await p.flush(10)  # (settled: the deliveries handed home confirmed too)
                    await asyncio.sleep(0.3)  # (a second copy would have come by now)
                    assert [s.received for s in subs] == [8, 6, 4, 2] and not any(s.duplicates for s in subs)
                    assert holder.shared.delegated == cores[0].shared.received > 0
                    moved = next(s for s in subs if s.id in cores[0].shared.out)
                    await moved.unsubscribe()
                    await eventually(lambda: len(holder.shared.hosted) == 1)
                finally:
                    for p in pubs:
                        await p.close()

    run(main())
