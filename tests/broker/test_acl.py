"""Identities and rights without sockets: a token's hash in the config names its identity, a
client certificate's CN names its own; the ``acl`` grants publish, subscribe and deploy on
space patterns; every refusal names identity, right and space and changes nothing (a refused
publish never reaches the routing core)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.broker.fakes import FakeCore, Writer, apply

from flowbus.broker.acl import Acl, new_token, token_hash
from flowbus.broker.adverts import Adverts
from flowbus.broker.config import DEFAULT, BrokerConfig
from flowbus.broker.flows import BrokerFlows
from flowbus.broker.ledger import Ledger
from flowbus.broker.queues import Queues
from flowbus.broker.sessions import Sessions
from flowbus.broker.spaces import Spaces
from flowbus.broker.store import Store
from flowbus.client import protocol as p
from flowbus.errors import AccessError, ConfigError
from flowbus.flow.deploy import Deployment
from flowbus.net.admission import PRE_AUTH_FRAME
from flowbus.net.codec import MAX_FRAME, FrameDecoder, decode, encode

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "stocks" / "flow.yaml"
ALICE, _ = new_token()
BOB, _ = new_token()
ACL = {
    "alice": {"publish": ["stocks", "events"], "subscribe": ["*"], "deploy": ["stock-*"]},
    "bob": {"subscribe": ["stocks"]},
    "carol": {"subscribe": ["flow-*"]},
}
STOCK = {"symbol": "IBM", "price": 1.0, "quantity": 1, "exchange": "N", "level": 1}


def _sessions() -> tuple[Sessions, FakeCore, Acl]:
    acl = Acl.from_config(ACL, {"alice": token_hash(ALICE), "bob": token_hash(BOB)})
    core, store, spaces = FakeCore(), Store(":memory:"), Spaces(DEFAULT)
    adverts = Adverts(core=core, apply=apply, spaces=spaces, enabled=False)

    def admit(session: Any, space: str, fields: dict[str, Any]) -> str | None:
        try:
            acl.check(session.identity, "publish", space)
        except AccessError as e:
            return str(e)
        return None

    ledger = Ledger(core=core, apply=apply, store=store, spaces=spaces, adverts=adverts, admit=admit)
    queues = Queues(core=core, apply=apply, store=store, spaces=spaces, config=DEFAULT)
    flows = BrokerFlows(core=None, overlay="test", apply=apply, store=store, own_spaces=())
    welcome = p.Welcome("127.0.0.1:1", (), {})
    server = Sessions(
        welcome=lambda: welcome, ledger=ledger, queues=queues, adverts=adverts, flows=flows, acl=acl
    )
    return server, core, acl


async def _serve(
    server: Sessions,
    hello: p.Hello,
    msgs: list[Any],
    peercert: Any = None,
    frames: FrameDecoder | None = None,
) -> list[Any]:
    reader, writer = asyncio.StreamReader(), Writer({"peercert": peercert} if peercert else None)
    reader.feed_eof()
    await server.serve(hello, reader, writer, [encode(m) for m in msgs], frames or FrameDecoder())
    return [decode(b) for b in FrameDecoder().feed(b"".join(writer.writes))][1:]  # (after Welcome)


def _cert(role: str, name: str) -> dict[str, Any]:
    return {"subject": ((("organizationalUnitName", role),), (("commonName", name),))}


def test_the_config_parses_rights_tokens_and_refuses_bad_keys() -> None:
    cfg = BrokerConfig.from_mapping({"acl": ACL, "tokens": {"alice": token_hash(ALICE)}})
    assert cfg.acl.enforced and cfg.acl.identity_of(ALICE) == "alice" and cfg.acl.identity_of(BOB) is None
    assert not BrokerConfig.from_mapping({}).acl.enforced
    with pytest.raises(ConfigError, match=r"acl\.bob"):
        BrokerConfig.from_mapping({"acl": {"bob": {"read": ["x"]}}})
    with pytest.raises(ConfigError, match=r"tokens\.bob"):
        BrokerConfig.from_mapping({"tokens": {"bob": "plaintext"}})
    with pytest.raises(ConfigError, match="classes"):
        BrokerConfig.from_mapping({"classes": {"vault": "top-secret"}})


def test_rights_follow_patterns_and_an_identity_not_listed_has_none() -> None:
    _, _, acl = _sessions()
    acl.check("alice", "subscribe", "anything")
    acl.check("alice", "deploy", "stock-alerts")
    acl.check("carol", "subscribe", "flow-derived")  # a flow's derived space, by its name
    for who, right, space in [
        ("bob", "publish", "stocks"),
        ("dave", "subscribe", "stocks"),
        (None, "subscribe", "x"),
    ]:
        with pytest.raises(AccessError) as e:
            acl.check(who, right, space)
        assert (e.value.identity, e.value.right, e.value.space) == (who, right, space)
        assert repr(space) in str(e.value) and right in str(e.value)


def test_a_token_names_the_identity_and_refusals_change_nothing() -> None:
    async def main() -> None:
        server, core, _ = _sessions()
        batch = p.pack_publish([(1, STOCK), (2, {"x": 1})], ["stocks", "events"])
        got = await _serve(
            server,
            p.Hello("c1", token=ALICE),
            [p.Publish("stocks", batch), p.Subscribe(1, "s", "events", "x > 0")],
        )
        assert got[0] == p.Reply(1, True)
        assert [eid for eid, _ in core.called("publish")[0][0]] == [("c1", 1), ("c1", 2)]
        calls = len(core.calls)
        got = await _serve(
            server,
            p.Hello("c2", token=BOB),
            [
                p.Publish("stocks", p.pack_publish([(1, STOCK)])),
                p.Subscribe(1, "t", "events", "x"),
                p.Advertise(2, "a", "stocks", "price > 0"),
                p.Bye(),
            ],
        )
        assert got[0] == p.Nack(1, "identity 'bob' has no publish right on 'stocks'")
        assert got[1] == p.Reply(1, False, "identity 'bob' has no subscribe right on 'events'")
        assert got[2] == p.Reply(2, False, "identity 'bob' has no publish right on 'stocks'")  # (advertise)
        assert len(core.calls) == calls  # nothing routed, nothing subscribed
        got = await _serve(
            server, p.Hello("c3", token="forged"), [p.Subscribe(1, "u", "stocks", "price > 0"), p.Bye()]
        )
        assert got == [p.Reply(1, False, "an unauthenticated client has no subscribe right on 'stocks'")]
        assert len(core.calls) == calls and set(server.queues.subs) == {"s"}
        for token, limit in ((None, PRE_AUTH_FRAME), (ALICE, MAX_FRAME)):  # (the door gives 64 KiB)
            frames = FrameDecoder(limit=PRE_AUTH_FRAME)
            await _serve(server, p.Hello("c4", token=token), [p.Bye()], frames=frames)
            assert frames.limit == limit
        server.queues.close()

    asyncio.run(main())


def test_a_client_certificate_names_the_identity_a_broker_certificate_does_not() -> None:
    async def main() -> None:
        server, _, _ = _sessions()
        sub = [p.Subscribe(1, "s", "stocks", "price > 0"), p.Bye()]
        got = await _serve(server, p.Hello("c1"), sub, _cert("clients", "bob"))
        assert got == [p.Reply(1, True)]
        got = await _serve(server, p.Hello("c2"), sub, _cert("brokers", "bob"))
        assert got == [p.Reply(1, False, "an unauthenticated client has no subscribe right on 'stocks'")]
        server.queues.close()

    asyncio.run(main())


def test_deploying_needs_the_deploy_right_on_the_flows_name() -> None:
    async def main() -> None:
        server, _, _ = _sessions()
        text = Deployment.from_file(EXAMPLE).text  # (with its lookups inlined)
        name = Deployment.from_text(text).name
        msgs = [p.Deploy(1, text), p.Undeploy(2, name), p.Bye()]
        got = await _serve(server, p.Hello("c1", token=BOB), msgs)
        assert got == [
            p.Reply(1, False, f"identity 'bob' has no deploy right on {name!r}"),
            p.Reply(2, False, f"identity 'bob' has no deploy right on {name!r}"),
        ]
        server.queues.close()

    asyncio.run(main())


def test_a_pulled_subscription_needs_the_subscribe_right_on_its_space() -> None:
    async def main() -> None:
        server, _, _ = _sessions()
        got = await _serve(
            server, p.Hello("c1", token=ALICE), [p.QueueOpen(1, "pull", "events", "x > 0"), p.Bye()]
        )
        assert got[0].ok
        got = await _serve(
            server,
            p.Hello("c2", token=BOB),
            [
                p.QueueOpen(1, "mine", "events", ""),
                p.QueueRead(2, "pull", 0, 10, 10),
                p.QueueAck(3, "pull", 10),
                p.Bye(),
            ],
        )
        refused = "identity 'bob' has no subscribe right on 'events'"
        assert got == [p.Reply(1, False, refused), p.Reply(2, False, refused), p.Reply(3, False, refused)]
        assert set(server.queues.subs) == {"pull"}
        got = await _serve(server, p.Hello("c1", token=ALICE), [p.QueueRead(1, "pull", 0, 10, 10), p.Bye()])
        assert got[0].ok and got[0].data["rows"] == []
        server.queues.close()

    asyncio.run(main())
