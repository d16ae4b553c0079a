"""Brokers in TLS on loopback, in one process: clients by certificate and by token, each
refusal named and changing nothing; a broker without a certificate of the ring's authority
cannot join; in a mixed ring (mutual-TLS and plain links) a secure space's events never
cross a plain link, and a publish with no secure route is refused by name."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.broker.test_server import eventually, run, take, trade

import flowbus
from flowbus.broker.acl import new_token
from flowbus.broker.config import DEFAULT, BrokerConfig
from flowbus.broker.server import Broker
from flowbus.broker.status import ring_view
from flowbus.client import ClientError, PublishError, SubscribeError
from flowbus.errors import FlowbusError
from flowbus.net import certs
from flowbus.net.tls import broker_tls, client_context

pytestmark = pytest.mark.broker

BOB_TOKEN, BOB_HASH = new_token()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    certs.init(root, brokers=4, clients=["alice", "mallory"])
    return root


@pytest.fixture(scope="module")
def rogue(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rogue")
    certs.init(root, brokers=1, clients=["alice"])
    return root


def _config(**extra: Any) -> BrokerConfig:
    stocks = DEFAULT.spaces["stocks"]
    assert stocks is not None
    spaces = {"stocks": stocks.to_dict(), "vault": None, "events": None}
    return BrokerConfig.from_mapping({"spaces": spaces, "heartbeat": 0.5, **extra})


@asynccontextmanager
async def _ring(
    pki: Path | None, config: BrokerConfig, plain: tuple[int, ...] = (), n: int = 2
) -> AsyncIterator[list[Broker]]:
    """``n`` brokers, in TLS (broker-N certificates) but for those numbered in ``plain``."""
    brokers: list[Broker] = []
    try:
        for i in range(n):
            tls = broker_tls(pki, f"broker-{i + 1}") if pki is not None and i not in plain else None
            b = await Broker.start(join=[brokers[0].address] if i else [], config=config, tls=tls)
            brokers.append(b)
            await b.joined()
        await eventually(lambda: all(len(b.peers()) == n - 1 for b in brokers))
        yield brokers
    finally:
        for b in brokers:
            await b.close()


ACL = {"alice": {"publish": ["stocks"], "subscribe": ["*"]}, "bob": {"subscribe": ["stocks"]}}


def test_clients_by_certificate_and_token_over_tls_each_refusal_named(pki: Path, rogue: Path) -> None:
    async def main() -> None:
        config = _config(acl=ACL, tokens={"bob": BOB_HASH})
        async with _ring(pki, config) as (b1, b2):
            alice = flowbus.connect(b1.address, tls=client_context(pki, "alice"))
            bob = flowbus.connect(b2.address, tls=client_context(pki), token=BOB_TOKEN)
            async with alice, bob:
                sub = await bob.subscribe("stocks", "price > 0")
                await asyncio.sleep(0.3)
                for i in range(3):
                    await alice.publish("stocks", trade(i))
                assert [e["quantity"] for e in await take(sub, 3)] == [0, 1, 2]
                await alice.flush()  # (settled once bob took them)
                with pytest.raises(SubscribeError, match="identity 'bob' has no subscribe right on 'vault'"):
                    await bob.subscribe("vault", "x > 0")
                published = b2.ledger.published
                await bob.publish("stocks", trade(9))
                with pytest.raises(PublishError, match="identity 'bob' has no publish right on 'stocks'"):
                    await bob.flush()
                assert b2.ledger.published == published and b1.ledger.published == 3  # nothing routed
            mallory = flowbus.connect(b1.address, tls=client_context(pki, "mallory"))
            async with mallory:
                with pytest.raises(SubscribeError, match="identity 'mallory' has no subscribe right"):
                    await mallory.subscribe("stocks", "price > 0")
            for ctx in (None, client_context(rogue, "alice")):  # plain text; another authority
                with pytest.raises(ClientError, match="no broker answered"):
                    async with flowbus.connect(b1.address, tls=ctx, connect_timeout=1.0):
                        pass
            assert b1.runtime.refused >= 2

    run(main())


@pytest.mark.parametrize("who", ["another authority", "no TLS"])
def test_a_broker_without_a_certificate_of_the_authority_cannot_join(
    pki: Path, rogue: Path, who: str
) -> None:
    async def main() -> None:
        async with _ring(pki, _config(), n=1) as (b1,):
            tls = broker_tls(rogue, "broker-1") if who == "another authority" else None
            intruder = await Broker.start(join=[b1.address], config=_config(), tls=tls)
            try:
                with pytest.raises(FlowbusError, match="could not join"):
                    await intruder.joined(timeout=2.0)
                assert b1.peers() == [] and b1.runtime.refused >= 1
            finally:
                await intruder.close()

    run(main())


def _tree_path(brokers: list[Broker], a: Broker, b: Broker) -> list[Broker]:
    """The content tree's path from ``a`` to ``b`` (the ring's line by id)."""
    by_addr = {x.addr: x for x in brokers}
    paths = {a.addr: [a]}
    todo = [a]
    while todo:
        x = todo.pop()
        for n in x.core.tree_neighbours():
            if n not in paths:
                paths[n] = [*paths[x.addr], by_addr[n]]
                todo.append(by_addr[n])
    return paths[b.addr]


def test_a_secure_space_never_crosses_a_plain_link_in_a_mixed_ring(pki: Path) -> None:
    """Brokers 0, 1, 2 in mutual TLS, broker 3 plain (its links are plain). The content
    tree is the ring's line by id: some TLS broker's path to the plain one starts with a
    secure link (the first hop is secure, a later one plain). A publish towards the plain
    broker is refused by name, at once from the ring's announcements, or on the way when a
    covering subscription hides the plain broker's from the publisher's; ``flush()``
    returns either way, and the plain broker never gets the event."""

    async def main() -> None:
        config = _config(classes={"vault": "secure"}, security={"plain_peers": True})
        async with _ring(pki, config, plain=(3,), n=4) as brokers:
            plain = brokers[3]
            tls = brokers[:3]
            await eventually(lambda: all(len(b.core.tree_neighbours()) >= 1 for b in brokers))
            path = max((_tree_path(brokers, b, plain) for b in tls), key=len)
            pub, near = path[0], path[1]
            assert len(path) >= 3 and near in tls  # (first hop secure, a later one plain)
            assert pub.runtime.secure(near.addr) and near.runtime.secure(pub.addr)
            assert all(not b.runtime.secure(plain.addr) and not plain.runtime.secure(b.addr) for b in tls)
            classes = {x["address"]: x["link"] for x in ring_view(pub)["brokers"][1:]}  # (the console's)
            assert classes[near.address] == "secure" and set(classes.values()) <= {"secure", "normal"}
            assert {x["link"] for x in ring_view(plain)["brokers"][1:]} == {"normal"}
            await eventually(lambda: len(pub.core.link_book.known) == 4)  # (every broker's links)
            async with flowbus.connect(near.address) as cn, flowbus.connect(plain.address) as cp:
                near_sub = await cn.subscribe("vault", "level = 2")
                plain_sub = await cp.subscribe("vault", "level = 1")
                clear_sub = await cp.subscribe("events", "level = 2")
                await asyncio.sleep(0.5)
                async with flowbus.connect(pub.address) as c:
                    await c.publish("vault", {"level": 2, "n": 1})
                    await c.publish("events", {"level": 2, "n": 2})  # (not secure: any link)
                    assert (await near_sub.get(5))["n"] == 1
                    assert (await clear_sub.get(5))["n"] == 2
                    await c.flush()
                    published = pub.ledger.published
                    await c.publish("vault", {"level": 1, "n": 3})  # towards the plain broker
                    with pytest.raises(
                        PublishError, match=f"broker {plain.address} on its route is unreachable"
                    ):
                        await asyncio.wait_for(c.flush(), 5.0)
                    assert pub.ledger.published == published  # (refused before routing)
                    cover = await cn.subscribe("vault", "level >= 1")  # hides the plain broker's
                    await asyncio.sleep(0.5)
                    await c.publish("vault", {"level": 1, "n": 4})
                    assert (await cover.get(5))["n"] == 4  # (delivered before the plain link)
                    with pytest.raises(
                        PublishError, match=r"'vault' is secure and the link from broker .* is plain"
                    ):
                        await asyncio.wait_for(c.flush(), 5.0)
                    assert pub.ledger.published == published + 1 and pub.core.in_custody() == 0
                with pytest.raises(asyncio.TimeoutError):
                    await plain_sub.get(0.5)
                assert plain.links is not None and plain.links.violations == 0  # none arrived
                assert sum(b.links.dropped for b in tls if b.links is not None) >= 1
                async with flowbus.connect(plain.address) as c:  # every link of it is plain
                    await c.publish("vault", {"level": 2, "n": 5})
                    with pytest.raises(PublishError, match="'vault' is secure"):
                        await c.flush()

    run(main())
