"""The ring adapting on real brokers (127.0.0.1, one process): a broker over its load limit
shares its clients' subscriptions' routing with a neighbour, and every subscriber still gets
each event once."""

from __future__ import annotations

import asyncio

import pytest
from tests.broker.test_server import eventually, ring, run

import flowbus
from flowbus.broker.config import DEFAULT
from flowbus.overlay.multigraph import LinkClass
from flowbus.routing.ring_broker import RingBroker

pytestmark = pytest.mark.broker


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
                shown = home.stats()["adapt"]["shares"]  # (what the console's state shows)
                assert shown["acknowledged"] == 1 and len(shown["held_by_neighbours"]) == 2
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


def test_an_express_event_goes_round_a_slow_link_and_back_once_it_recovers() -> None:
    """Three brokers, their tree a - b - c by ring id; ``events`` is express within 30 ms.
    An event from a to a subscriber at b takes the link a - b; made slow (150 ms each way
    at a), the link is measured over the bound and the next event goes a -> c -> b; the
    delay removed, the link is measured fast again and events take it again."""

    async def main() -> None:
        config = DEFAULT.with_(heartbeat=0.25, classes={"events": "express"}, express_bound=0.03)
        async with ring(3, config=config) as brokers:
            a, b, c = sorted(brokers, key=lambda x: x.core.node_id)
            core: RingBroker = a.core  # type: ignore[assignment]
            routes, judge = core.express.routes, core.express.judge
            assert judge is not None
            async with flowbus.connect(b.address) as sc, flowbus.connect(a.address) as pub:
                sub = await sc.subscribe("events", "x >= 0")
                await eventually(lambda: bool(core.router.received_from(b.addr)))

                async def send(x: int) -> None:
                    await pub.publish("events", {"x": x})
                    assert (await sub.get(5))["x"] == x
                    await pub.flush(5)

                await send(1)
                assert routes == {(a.addr, b.addr): 1}
                a.runtime.delay[b.addr] = 0.15  # (what b sends a waits: the link is slow both ways)

                def detour() -> bool:  # (the slow link judged, and c's links known here: a way round)
                    view = core.express.view()
                    if judge.express.get(b.addr) is not False or b.addr not in view:
                        return False
                    path = view.path(a.addr, b.addr, cls=LinkClass.EXPRESS)
                    return path is not None and len(path.brokers) > 2

                await eventually(detour)
                await send(2)
                assert routes[(a.addr, c.addr, b.addr)] == 1 and core.express.detours == 1
                shown = a.stats()["adapt"]["express"]["links"][b.address]  # (the console's state)
                assert shown["express"] is False and shown["latency_ms"] > 30
                assert c.core.express.relayed == 1  # type: ignore[attr-defined]
                del a.runtime.delay[b.addr]
                await eventually(lambda: judge.express.get(b.addr) is True)
                await send(3)
                assert routes[(a.addr, b.addr)] == 2 and core.express.detours == 1
                assert core.express.fallbacks == 0 and judge.latency[c.addr] < 0.03

    run(main())


def test_express_spaces_and_their_bound_in_the_config() -> None:
    from flowbus.broker.config import BrokerConfig
    from flowbus.broker.overlays import new_core
    from flowbus.errors import ConfigError

    cfg = BrokerConfig.from_mapping(
        {"classes": {"alert*": "express", "alert-v*": "secure"}, "express_bound": 0.02}
    )
    assert cfg.express("alerts") and not cfg.express("stocks") and cfg.express_bound == 0.02
    _, core = new_core("chordal-ring", 7, cfg)
    assert core is not None and core.express.judge is not None and core.express.judge.bound == 0.02
    assert core.express.express_space("alerts") and not core.express.express_space(
        "alert-vault"
    )  # (secure wins)
    plain, ring = new_core("chordal-ring", 7, BrokerConfig())
    assert ring is plain and ring.express.judge is None
    assert new_core("pastry-irbr", 7, BrokerConfig())[1] is None  # (IRBR is no ring: no flows, no takeovers)
    for bad in (0, -1.0, True, "fast"):
        with pytest.raises(ConfigError, match="express_bound"):
            BrokerConfig.from_mapping({"express_bound": bad})
