"""Flows deployed on brokers over TCP (in one process): deploy, list, undeploy and what they
refuse; the stock flow and a random flow end to end on a 3-broker ring, as the interpreter
runs them; a durable subscriber of a derived space catches up; a restart
keeps the flows, a joining broker gets them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.broker.test_server import eventually, ring, run
from tests.flows.specgen import random_deployment
from tests.flows.world import canon, per_key, reference
from tests.spark.flowgen import random_events

import flowbus
from flowbus.broker.server import Broker
from flowbus.client import ClientError, PublishError, SubscribeError, Subscription
from flowbus.flow.deploy import Deployment

pytestmark = pytest.mark.broker

STOCKS = Path(__file__).parents[2] / "examples" / "stocks" / "flow.yaml"


async def _take_until_quiet(
    sub: Subscription, quiet: float = 3.0, first: float | None = None
) -> list[dict[str, Any]]:
    """What ``sub`` receives until ``quiet`` seconds pass without an event (``first`` before
    the first one, for a subscription sure to get some: a loaded machine may take long to
    route the first derived event)."""
    got = []
    while True:
        try:
            got.append(await sub.get(quiet if got or first is None else first))
        except TimeoutError:
            return got


def test_deploy_list_undeploy_and_what_is_refused() -> None:
    d = Deployment.from_file(STOCKS)

    async def main() -> None:
        async with ring(2) as brokers, flowbus.connect(brokers[0].address) as c:
            info = await c.deploy(STOCKS)
            assert (info["name"], info["version"], info["owners"]) == ("stocks", d.version, 2)
            publishable = {s["name"] for s in info["spaces"] if s["publishable"]}
            assert publishable == {"NYSE", "NASDAQ", "combined"}
            assert (await c.deploy(d.text))["version"] == d.version  # the same again: nothing changes
            other = d.text.replace("cap >= 1000000", "cap >= 2000000")
            with pytest.raises(ClientError, match=r"flow 'stocks' is deployed already with version"):
                await c.deploy(other)
            with pytest.raises(ClientError, match=r"to unknown space 'capitol'"):
                await c.deploy(
                    d.text.replace("name: stocks", "name: bad", 1).replace("to: capital", "to: capitol", 1)
                )
            with pytest.raises(ClientError, match=r"a flow document is YAML"):
                await c.deploy("spaces: [")
            clash = d.text.replace("name: stocks", "name: other", 1)
            with pytest.raises(ClientError, match=r"space 'NYSE' is taken by flow 'stocks'"):
                await c.deploy(clash)
            await eventually(lambda: all("stocks" in b.core.flows.records for b in brokers))  # type: ignore[attr-defined]
            async with flowbus.connect(brokers[1].address) as c2:
                assert [f["name"] for f in await c2.flows()] == ["stocks"]
                with pytest.raises(SubscribeError, match=r"unknown field 'price' in space 'big_trades'"):
                    await c2.subscribe("big_trades", "price > 3")
                with pytest.raises(SubscribeError, match=r"space 'max_cur' of flow 'stocks' is a state"):
                    await c2.subscribe("max_cur")
                with pytest.raises(SubscribeError, match=r"unknown space 'nowhere'"):
                    await c2.subscribe("nowhere")
                await c2.publish("compressed", {"name": "IBM", "price": 3.0})
                with pytest.raises(
                    PublishError, match=r"space 'compressed' of flow 'stocks' is not publishable"
                ):
                    await c2.flush(10)
            with pytest.raises(ClientError, match=r"no flow 'other' is deployed \(deployed: stocks\)"):
                await c.undeploy("other")
            assert (await c.undeploy("stocks"))["version"] == d.version
            await eventually(lambda: not any(b.core.flows.records for b in brokers))  # type: ignore[attr-defined]
            assert await c.flows() == []

    run(main())


def test_the_stock_flow_on_a_ring_of_three_delivers_what_the_interpreter_does() -> None:
    d = Deployment.from_file(STOCKS)
    events = list(d.generate(events=3000))
    spaces = ["combined", "big_trades", "compressed", "alarms"]
    ref = reference(d, events, spaces)

    async def main() -> None:
        async with ring(3) as brokers, flowbus.connect(brokers[0].address) as admin:
            await admin.deploy(STOCKS)
            await eventually(lambda: all(b.core.flows.records for b in brokers))  # type: ignore[attr-defined]
            clients = [flowbus.connect(b.address, name=f"s{i}") for i, b in enumerate(brokers)]
            for c in clients:
                await c.open()
            subs = {(s, i): await c.subscribe(s) for i, c in enumerate(clients) for s in spaces}
            big = await clients[2].subscribe("big_trades", "cap >= 5000000")
            await asyncio.sleep(0.5)
            takers = {
                k: asyncio.ensure_future(_take_until_quiet(s, first=20.0))
                for k, s in [*subs.items(), ("big", big)]
            }
            async with flowbus.connect(brokers[1].address, name="publisher") as pub:
                for space, event in events:
                    await pub.publish(space, event)
                await pub.flush(30)
            got = {k: await t for k, t in takers.items()}
            big_got = got.pop("big")
            for c in clients:
                await c.close()
        for i in range(3):
            for s in ("combined", "big_trades"):
                assert canon(got[(s, i)]) == canon(ref[s]), (s, i)
            for s in ("compressed", "alarms"):
                assert per_key(got[(s, i)], "name") == per_key(ref[s], "name"), (s, i)
        assert canon(big_got) == canon([e for e in ref["big_trades"] if e["cap"] >= 5000000])

    run(main())


def test_a_restarted_broker_keeps_its_flows_and_a_joining_broker_gets_them(tmp_path: Path) -> None:
    async def main() -> None:
        async with ring(1, data=tmp_path) as (b,), flowbus.connect(b.address) as c:
            await c.deploy(STOCKS)
        again = await Broker.start(data=tmp_path / "b0")
        try:
            await again.joined()
            assert [f["name"] for f in again.flows.list()] == ["stocks"]
            late = await Broker.start(join=[again.address])
            try:
                await late.joined()
                await eventually(lambda: [f["name"] for f in late.flows.list()] == ["stocks"])
                assert not late.core.flows.parts  # type: ignore[attr-defined]  # (it owns nothing)
            finally:
                await late.close()
        finally:
            await again.close()

    run(main())


def test_a_durable_subscriber_of_a_derived_space_catches_up_with_the_shortest_sequence() -> None:
    d = Deployment.from_file(STOCKS)
    events = list(d.generate(events=1500))

    async def main() -> None:
        async with ring(1) as (b,), flowbus.connect(b.address, name="publisher") as pub:
            await pub.deploy(STOCKS)
            async with flowbus.connect(b.address, name="viewer") as c:
                sub = await c.subscribe("compressed", durable="board")
                for space, event in events[:500]:
                    await pub.publish(space, event)
                await pub.flush(10)
                seen = await _take_until_quiet(sub, 1.0)
            for space, event in events[500:]:
                await pub.publish(space, event)
            await pub.flush(10)  # the absent subscriber's events wait at its broker, and so does
            await eventually(lambda: not b.core.flow_side.derived)  # type: ignore[attr-defined]  # (what folds derived)
            async with flowbus.connect(b.address, name="viewer") as c:
                sub = await c.subscribe("compressed", durable="board")
                got = await _take_until_quiet(sub, 1.0)
            interp = b.spaces.interpretation("stocks:E4", "compressed")
            missed = reference(d, events, ["compressed"])["compressed"][len(seen) :]
            start = interp.fold(None, seen)
            assert interp.fold(start, got) == interp.fold(start, missed)
            assert len(got) <= 2 * len(interp.fold(None, missed)) < len(missed)  # per company: max, current

    run(main())


def test_a_random_flow_on_a_ring_of_three_delivers_what_the_interpreter_does() -> None:
    d = random_deployment(11)
    events = random_events(d.graph, 11, 800)
    sinks = [s.name for s in d.spaces.values() if s.kind == "sink"]
    ref = reference(d, events, sinks)
    derived = {s.name for s in d.spaces.values() if s.derived}

    async def main() -> None:
        async with ring(3) as brokers, flowbus.connect(brokers[0].address) as admin:
            await admin.deploy(d.text)
            await eventually(lambda: all(b.core.flows.records for b in brokers))  # type: ignore[attr-defined]
            async with flowbus.connect(brokers[2].address, name="reader") as c:
                subs = {s: await c.subscribe(s, 'k = "a"' if i % 2 else None) for i, s in enumerate(sinks)}
                takers = {s: asyncio.ensure_future(_take_until_quiet(sub)) for s, sub in subs.items()}
                async with flowbus.connect(brokers[1].address, name="publisher") as pub:
                    for space, event in events:
                        await pub.publish(space, event)
                    await pub.flush(30)
                got = {s: await t for s, t in takers.items()}
        for i, s in enumerate(sinks):
            want = [e for e in ref[s] if e["k"] == "a"] if i % 2 else ref[s]
            if d.subscription(s).sources & derived:
                assert per_key(got[s], "k") == per_key(want, "k"), s
            else:
                assert canon(got[s]) == canon(want), s

    run(main())
