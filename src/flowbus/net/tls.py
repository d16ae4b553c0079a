"""TLS contexts from a certificate directory (:mod:`flowbus.net.certs`), and who a peer is.

How it works (the standard library's :mod:`ssl`; TLS 1.2 at least):

* :func:`broker_tls` gives a broker its two contexts, in a :class:`BrokerTls`:

  - ``server``: its certificate, and the authority ``ca.pem`` to check what the other end
    presents. Clients may come without a certificate (they may bring a token instead), so a
    certificate is *optional* at the handshake, but one that is presented must be signed by
    the authority, else the handshake fails. Who may do what is decided after it, from
    :func:`identity`: a peer that sends ring messages must be a broker.
  - ``peer``: the client side of a broker dialing a ring peer, presenting its own
    certificate (mutual TLS) and accepting only a broker's certificate signed by the
    authority. The peer's host name is not checked against its certificate (the ring's
    addresses come from ring messages); its role is (OU ``brokers``).

* :func:`client_context` gives a client its context: the authority, the broker's host
  checked against the certificate's addresses, and the certificate of ``user`` if given.
* :func:`identity` reads a verified peer certificate (``getpeercert()``): its role (the OU,
  ``brokers`` or ``clients``) and name (the CN).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowbus.errors import ConfigError

__all__ = [
    "BROKERS_OU",
    "CLIENTS_OU",
    "BrokerTls",
    "broker_name",
    "broker_tls",
    "client_context",
    "identity",
    "is_broker",
]

BROKERS_OU = "brokers"
CLIENTS_OU = "clients"
"""The OU of a broker's certificate, and of a client's (:mod:`flowbus.net.certs` writes them)."""


def broker_name(n: int) -> str:
    """The certificate name of the ``n``-th broker (from 1)."""
    return f"broker-{n}"


@dataclass(frozen=True)
class BrokerTls:
    """A broker's TLS: the context it serves with and the one it dials its peers with;
    ``name`` is its certificate's."""

    name: str
    server: ssl.SSLContext
    peer: ssl.SSLContext


def _files(directory: Path, name: str) -> tuple[Path, Path, Path]:
    ca, cert, key = directory / "ca.pem", directory / f"{name}.pem", directory / f"{name}-key.pem"
    for path in (ca, cert, key):
        if not path.is_file():
            raise ConfigError(
                f"--tls {directory}: no {path.name} (make it with: flowbus certs init {directory})"
            )
    return ca, cert, key


def _load(ctx: ssl.SSLContext, ca: Path, cert: Path | None, key: Path | None) -> ssl.SSLContext:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_verify_locations(cafile=str(ca))
        if cert is not None:
            ctx.load_cert_chain(str(cert), str(key) if key is not None else None)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"TLS files {cert or ca}: {e}") from None
    return ctx


def broker_tls(directory: Path | str, name: str | None = None) -> BrokerTls:
    """The contexts of the broker whose certificate in ``directory`` is ``name``
    (``broker-1`` by default)."""
    name = name or broker_name(1)
    ca, cert, key = _files(Path(directory), name)
    server = _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), ca, cert, key)
    server.verify_mode = ssl.CERT_OPTIONAL
    peer = _load(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), ca, cert, key)
    peer.check_hostname = False  # (the role is checked instead: identity())
    peer.verify_mode = ssl.CERT_REQUIRED
    return BrokerTls(name, server, peer)


def client_context(directory: Path | str, user: str | None = None) -> ssl.SSLContext:
    """A client's context: the authority of ``directory``, and ``user``'s certificate if
    given (its identity at the brokers)."""
    root = Path(directory)
    if user is None:
        ca = root / "ca.pem"
        if not ca.is_file():
            raise ConfigError(f"--tls {root}: no ca.pem (make it with: flowbus certs init {root})")
        return _load(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), ca, None, None)
    ca, cert, key = _files(root, user)
    return _load(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), ca, cert, key)


def identity(peercert: dict[str, Any] | None) -> tuple[str, str] | None:
    """``(role, name)`` of a verified peer certificate (``brokers`` or ``clients``, its CN);
    None if there is none."""
    if not peercert:
        return None
    fields = {k: v for rdn in peercert.get("subject", ()) for k, v in rdn}
    name, role = fields.get("commonName"), fields.get("organizationalUnitName")
    if not isinstance(name, str) or not isinstance(role, str):
        return None
    return role, name


def is_broker(peercert: dict[str, Any] | None) -> bool:
    """Whether a verified peer certificate is a broker's."""
    who = identity(peercert)
    return who is not None and who[0] == BROKERS_OU
