"""Rights read again while a TLS broker runs (``Broker.reload_acl``, a client's
``reload_acl`` with the ``admin`` right): sessions already connected lose what the new
rights take away (a subscription ends with the refusal, the next publish is refused), revoked
certificates (by name or serial) and tokens close their sessions and open no new one, and an
invalid file changes nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from tests.broker.test_server import eventually, run, take, trade

import flowbus
from flowbus.broker.acl import new_token
from flowbus.broker.config import DEFAULT, BrokerConfig
from flowbus.broker.server import Broker
from flowbus.client import Client, ClientError, PublishError, SubscribeError
from flowbus.errors import ConfigError
from flowbus.net import certs
from flowbus.net.tls import broker_tls, client_context

pytestmark = pytest.mark.broker

BOB_TOKEN, BOB_HASH = new_token()
ROOT_TOKEN, ROOT_HASH = new_token()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    certs.init(root, brokers=1, clients=["alice", "mallory", "carol"])
    return root


def _settings(**changes: Any) -> dict[str, Any]:
    stocks = DEFAULT.spaces["stocks"]
    assert stocks is not None
    acl = {
        "alice": {"publish": ["stocks", "vault"], "subscribe": ["*"]},
        "bob": {"publish": ["stocks"], "subscribe": ["stocks"]},
        "mallory": {"subscribe": ["stocks"]},
        "carol": {"subscribe": ["stocks"]},
        "root": {"admin": ["acl"]},
    }
    return {
        "spaces": {"stocks": stocks.to_dict(), "vault": None},
        "heartbeat": 0.5,
        "acl": acl,
        "tokens": {"bob": BOB_HASH, "root": ROOT_HASH},
        **changes,
    }


@asynccontextmanager
async def _broker(pki: Path, file: Path) -> AsyncIterator[Broker]:
    file.write_text(json.dumps(_settings()))  # (JSON is YAML)
    b = await Broker.start(config=BrokerConfig.load(file), config_file=file, tls=broker_tls(pki, "broker-1"))
    try:
        await b.joined()
        yield b
    finally:
        await b.close()


def _as(b: Broker, pki: Path, user: str | None = None, token: str | None = None) -> Client:
    return flowbus.connect(b.address, tls=client_context(pki, user), token=token, connect_timeout=2.0)


def test_lost_rights_end_subscriptions_and_refuse_publishes_an_invalid_file_changes_nothing(
    pki: Path, tmp_path: Path
) -> None:
    async def main() -> None:
        file = tmp_path / "broker.yaml"
        async with (
            _broker(pki, file) as b,
            _as(b, pki, "alice") as alice,
            _as(b, pki, token=BOB_TOKEN) as bob,
        ):
            vault = await alice.subscribe("vault", "n > 0")
            stocks = await alice.subscribe("stocks", "price > 0")
            await asyncio.sleep(0.2)
            await alice.publish("vault", {"n": 1})
            assert (await vault.get(5))["n"] == 1
            with pytest.raises(ClientError, match="identity 'bob' has no admin right on 'acl'"):
                await bob.reload_acl()
            acl = _settings()["acl"]
            acl["alice"]["subscribe"] = ["stocks"]
            acl["bob"]["publish"] = []
            file.write_text(json.dumps(_settings(acl=acl)))
            async with _as(b, pki, token=ROOT_TOKEN) as root:
                done = await root.reload_acl()
                assert [e["subscription"] for e in done["ended"]] == [vault.id] and done["closed"] == []
                with pytest.raises(
                    SubscribeError, match="identity 'alice' has no subscribe right on 'vault'"
                ):
                    await vault.get(5)
                await bob.publish("stocks", trade(1))
                with pytest.raises(PublishError, match="identity 'bob' has no publish right on 'stocks'"):
                    await bob.flush()
                await alice.publish("stocks", trade(2))
                assert [e["quantity"] for e in await take(stocks, 1)] == [2]  # (still allowed)
                file.write_text(json.dumps(_settings(acl={"alice": {"publish": 3}})))
                before = b.config.acl
                with pytest.raises(ClientError, match=r"acl.alice: a mapping|acl.alice.publish"):
                    await root.reload_acl()
                assert b.config.acl is before and b.sessions.acl is before  # (nothing changed)
                file.write_text("acl: [")
                with pytest.raises(ConfigError, match=r"broker\.yaml"):
                    b.reload_acl()
                await alice.publish("stocks", trade(3))  # (the old rights hold)
                assert [e["quantity"] for e in await take(stocks, 1)] == [3]
                await alice.flush()

    run(main())


def test_revoked_certificates_and_tokens_close_their_sessions_and_open_no_new_one(
    pki: Path, tmp_path: Path
) -> None:
    async def main() -> None:
        file = tmp_path / "broker.yaml"
        serial = x509.load_pem_x509_certificate((pki / "carol.pem").read_bytes()).serial_number
        async with _broker(pki, file) as b:
            async with (
                _as(b, pki, "mallory") as mallory,
                _as(b, pki, "carol") as carol,
                _as(b, pki, token=BOB_TOKEN) as bob,
                _as(b, pki, "alice") as alice,
            ):
                subs = {c: await c.subscribe("stocks", "price > 0") for c in (mallory, carol, bob, alice)}
                colons = ":".join(f"{serial:x}"[i : i + 2] for i in range(0, len(f"{serial:x}"), 2))
                settings = _settings(revoked=["mallory", colons], tokens={"root": ROOT_HASH})
                file.write_text(json.dumps(settings))
                done = b.reload_acl()
                assert sorted(c["identity"] for c in done["closed"]) == ["bob", "carol", "mallory"]
                with pytest.raises(
                    SubscribeError, match=r"the certificate of 'mallory' \(serial .*\) is revoked"
                ):
                    await subs[mallory].get(5)
                with pytest.raises(SubscribeError, match="the certificate of 'carol'"):
                    await subs[carol].get(5)
                with pytest.raises(SubscribeError, match="the token of identity 'bob' was revoked"):
                    await subs[bob].get(5)
                await alice.publish("stocks", trade(1))  # (alice keeps her session and rights)
                assert [e["quantity"] for e in await take(subs[alice], 1)] == [1]
                await eventually(
                    lambda: {s.identity for s in b.sessions.by_client.values()} <= {"alice", None}
                )
                assert not any(s.space == "stocks" and s.client != alice.name for s in b.queues.subs.values())
            with pytest.raises(ClientError, match="refused the connection: the certificate of 'mallory'"):
                async with _as(b, pki, "mallory"):
                    pass
            async with _as(b, pki, token=BOB_TOKEN) as bob:  # (the token stands for nobody now)
                with pytest.raises(SubscribeError, match="an unauthenticated client has no subscribe right"):
                    await bob.subscribe("stocks", "price > 0")

    run(main())
