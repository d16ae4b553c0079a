"""Certificates (``certs init``), TLS contexts, and the runtime's door: mutual TLS between
peers, refusals (no certificate, another authority, plain text on a TLS port, silence, a big
first frame, too many connections from one address), plain peers and link classes."""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from tests.net.test_runtime import Echo

from flowbus.core import Effect, Send
from flowbus.errors import ConfigError
from flowbus.net import certs
from flowbus.net.admission import Admission
from flowbus.net.codec import encode, frame, head_tag
from flowbus.net.runtime import Directory, Runtime
from flowbus.net.tls import broker_tls, client_context, identity


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    certs.init(root, brokers=2, clients=["alice"])
    return root


@pytest.fixture(scope="module")
def rogue(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rogue")
    certs.init(root, brokers=1)
    return root


async def _until(check: Any, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():
        if loop.time() > end:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(0.02)


def _admission(root: Path | None, name: str = "broker-1", **kw: Any) -> Admission:
    if root is None:
        return Admission(**kw)
    tls = broker_tls(root, name)
    return Admission(tls=tls.server, peer_tls=tls.peer, **kw)


def test_certs_init_makes_a_ca_brokers_with_their_address_and_named_clients(pki: Path) -> None:
    broker = x509.load_pem_x509_certificate((pki / "broker-2.pem").read_bytes())
    sans = broker.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == ["flowbus://127.0.0.1:7002"]
    alice = x509.load_pem_x509_certificate((pki / "alice.pem").read_bytes())
    assert alice.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"
    assert (pki / "alice-key.pem").stat().st_mode & 0o077 == 0
    ca = (pki / "ca.pem").read_bytes()
    certs.init(pki, brokers=0, clients=["carol"])  # the authority is kept, carol added
    assert (pki / "ca.pem").read_bytes() == ca and (pki / "carol.pem").is_file()
    with pytest.raises(ConfigError, match="broker-9"):
        certs.init(pki, clients=["broker-9"])
    with pytest.raises(ConfigError, match=r"no broker-7\.pem"):
        broker_tls(pki, "broker-7")


@pytest.mark.broker
def test_peers_talk_mutual_tls_and_the_link_is_secure(pki: Path) -> None:
    async def main() -> None:
        directory, echo = Directory(), Echo()
        a = Runtime(0, echo, directory, admission=_admission(pki, "broker-1"))
        b = Runtime(1, Echo(), directory, admission=_admission(pki, "broker-2"))
        await a.start()
        await b.start()
        try:
            await b.call(lambda c: [Send(0, ("hello", 1))])
            await _until(lambda: echo.seen == [(1, ("hello", 1))])
            assert b.secure(0) and a.refused == 0
        finally:
            await a.close()
            await b.close()

    asyncio.run(main())


@pytest.mark.parametrize("who", ["plain", "no certificate", "another authority", "a client"])
@pytest.mark.broker
def test_a_peer_without_a_broker_certificate_of_the_authority_is_refused(
    pki: Path, rogue: Path, who: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        directory, echo = Directory(), Echo()
        a = Runtime(0, echo, directory, admission=_admission(pki))
        await a.start()
        failed: list[Any] = []

        class Dialer(Echo):
            def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
                failed.append(msg)
                return []

        if who == "plain":
            admission = Admission()
        elif who == "another authority":
            admission = _admission(rogue)
        else:
            ctx = client_context(pki, "alice" if who == "a client" else None)
            ctx.check_hostname = False
            admission = Admission(peer_tls=ctx)
        b = Runtime(1, Dialer(), directory, admission=admission)
        try:
            await b.call(lambda c: [Send(0, ("join", 1))])
            await asyncio.sleep(0.3)
            await _until(lambda: a.refused >= 1 or bool(failed))
            assert echo.seen == []
        finally:
            await a.close()
            await b.close()

    with caplog.at_level(logging.DEBUG):
        asyncio.run(main())
    assert not [r for r in caplog.records if r.exc_info], "a refusal logged a traceback"


@pytest.mark.broker
def test_plain_text_silence_and_a_big_first_frame_are_closed_quietly(
    pki: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        rt = Runtime(0, Echo(), Directory(), admission=_admission(pki, handshake_timeout=0.3))
        await rt.start()
        plain = Runtime(1, Echo(), Directory(), admission=Admission(handshake_timeout=0.3))
        await plain.start()
        try:
            _, w = await asyncio.open_connection("127.0.0.1", rt.port)
            w.write(b"GET / HTTP/1.1\r\n\r\n")
            r, silent = await asyncio.open_connection("127.0.0.1", plain.port)
            r2, big = await asyncio.open_connection("127.0.0.1", plain.port)
            big.write((10**6).to_bytes(4, "big") + b"x" * 1000)
            await _until(lambda: rt.refused == 1)
            assert await asyncio.wait_for(r.read(), 2.0) == b""  # closed by the deadline
            assert await asyncio.wait_for(r2.read(), 2.0) == b""
            assert plain.bad_frames == 1  # the 1 MB first frame
            for writer in (w, silent, big):
                writer.close()
        finally:
            await rt.close()
            await plain.close()

    with caplog.at_level(logging.DEBUG):
        asyncio.run(main())
    assert any("plain text from 127.0.0.1 on a TLS port" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.exc_info]


@pytest.mark.broker
def test_connections_per_source_address_are_capped() -> None:
    async def main() -> None:
        rt = Runtime(0, Echo(), Directory(), admission=Admission(per_address=2))
        await rt.start()
        try:
            conns = [await asyncio.open_connection("127.0.0.1", rt.port) for _ in range(3)]
            await _until(lambda: rt.refused == 1)
            assert await asyncio.wait_for(conns[2][0].read(), 2.0) == b""
            for _, w in conns:
                w.close()
        finally:
            await rt.close()

    asyncio.run(main())


@pytest.mark.broker
def test_plain_peers_make_plain_links_and_the_link_filter_sees_the_class(pki: Path) -> None:
    async def main() -> None:
        directory = Directory()
        echo_a, echo_c = Echo(), Echo()
        a = Runtime(0, echo_a, directory, admission=_admission(pki, plain_peers=True))
        b = Runtime(1, Echo(), directory, admission=_admission(pki, "broker-2", plain_peers=True))
        c = Runtime(2, echo_c, directory)  # no TLS at all
        seen: list[tuple[int, bool, bool]] = []

        def only_secure(peer: int, msgs: list[Any], secure: bool, outgoing: bool) -> list[Any]:
            seen.append((peer, secure, outgoing))
            return [m for m in msgs if secure or m != "secret"]

        for rt in (a, b, c):
            await rt.start()
        a.link_filter = only_secure
        try:
            await b.call(lambda _: [Send(0, "secret")])  # b -> a: mutual TLS
            await a.call(lambda _: [Send(2, "secret"), Send(2, "public")])  # a -> c: plain
            await c.call(lambda _: [Send(0, "secret")])  # c -> a: plain, dropped on arrival
            await _until(lambda: echo_c.seen == [(0, "public")] and (1, "secret") in echo_a.seen)
            await asyncio.sleep(0.2)
            assert echo_a.seen == [(1, "secret")]
            assert not a.secure(2) and b.secure(0)
            assert {(2, False, True), (2, False, False), (1, True, False)} <= set(seen)
        finally:
            for rt in (a, b, c):
                await rt.close()

    asyncio.run(main())


def test_a_client_context_checks_the_broker_and_carries_the_user(pki: Path) -> None:
    ctx = client_context(pki, "alice")
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    der = x509.load_pem_x509_certificate((pki / "alice.pem").read_bytes())
    assert der.subject.rfc4514_string().startswith("CN=alice")
    assert identity({"subject": ((("organizationalUnitName", "clients"),), (("commonName", "alice"),))}) == (
        "clients",
        "alice",
    )


@pytest.mark.broker
def test_a_ring_peer_may_open_with_a_big_message_a_stranger_may_not(pki: Path) -> None:
    """A peer this runtime takes may open with a big state transfer; a first frame of the
    same size that is not a ring message (or a ring message without a broker certificate
    on a TLS port) is closed before it is buffered."""

    async def main() -> None:
        directory, echo, echo_tls = Directory(), Echo(), Echo()
        a = Runtime(0, echo, directory)
        t = Runtime(2, echo_tls, directory, admission=_admission(pki))
        b = Runtime(1, Echo(), directory)
        for rt in (a, t, b):
            await rt.start()
        big = "x" * 200_000
        try:
            await b.call(lambda _: [Send(0, big)])
            await _until(lambda: echo.seen == [(1, big)])
            ctx = client_context(pki, "alice")
            ctx.check_hostname = False
            _, w = await asyncio.open_connection("127.0.0.1", t.port, ssl=ctx)
            w.write(frame(encode((1, big))))
            await _until(lambda: t.bad_frames + t.refused_peers == 1)
            assert echo_tls.seen == [] and head_tag(encode((1, big))[:64]) == "tuple"
            w.close()
        finally:
            for rt in (a, t, b):
                await rt.close()

    asyncio.run(main())
