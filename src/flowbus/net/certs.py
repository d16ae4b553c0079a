"""A development certificate authority and the certificates of a ring (``flowbus certs init``).

How it works (with the ``cryptography`` library; keys are ECDSA P-256):

* **The directory.** ``ca.pem`` (the authority every broker and client trusts),
  ``ca-key.pem`` (its key: keep it off brokers in production), and for each broker or
  client ``NAME.pem`` and ``NAME-key.pem`` (keys readable by their owner only).
* **Brokers** are ``broker-1``, ``broker-2``...: subject ``CN=broker-N, OU=brokers``, usable
  as server and client (a broker dials its ring peers with it: mutual TLS). Their subject
  alternative names carry the broker's address: the IP ``host`` (127.0.0.1 by default), the
  name ``localhost``, and the URI ``flowbus://HOST:PORT`` with ``PORT = port + N - 1``, the
  ports ``flowbus cluster up --port`` gives its brokers.
* **Clients** are the names given: ``CN=NAME, OU=clients``, usable as client only. The
  broker reads a client's identity from the CN (:func:`flowbus.net.tls.identity`); the OU
  keeps a client's certificate from passing for a broker's.
* Running ``init`` again on a directory keeps its authority and adds (or renews) the
  certificates named, so ``--clients carol`` later gives carol a certificate the ring trusts.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from flowbus.errors import ConfigError
from flowbus.net.tls import BROKERS_OU, CLIENTS_OU, broker_name

__all__ = ["BROKERS_OU", "CLIENTS_OU", "broker_name", "init"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")

Key = ec.EllipticCurvePrivateKey


def init(
    directory: Path | str,
    *,
    brokers: int = 1,
    clients: tuple[str, ...] | list[str] = (),
    host: str = "127.0.0.1",
    port: int = 7001,
    days: int = 365,
) -> list[Path]:
    """Make (or reuse) the authority in ``directory`` and certificates for ``brokers``
    brokers and the ``clients`` named; the files written (a :class:`ConfigError` for a bad
    name, host or count, before anything is written)."""
    if not 0 <= brokers <= 256:
        raise ConfigError(f"certs init --brokers: 0..256, got {brokers}")
    for name in clients:
        if not _NAME.fullmatch(name) or name.startswith("broker-") or name == "ca":
            raise ConfigError(
                f"certs init --clients: {name!r} is not a client name (letters, digits, _.@-; "
                "not ca, not broker-N)"
            )
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"certs init --host: {host!r} is not an IP address") from None
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert, written = _authority(root, days)
    for n in range(1, brokers + 1):
        sans: list[x509.GeneralName] = [
            x509.IPAddress(ip),
            x509.DNSName("localhost"),
            x509.UniformResourceIdentifier(f"flowbus://{host}:{port + n - 1}"),
        ]
        written += _leaf(root, broker_name(n), BROKERS_OU, sans, ca_key, ca_cert, days, server=True)
    for name in clients:
        written += _leaf(root, name, CLIENTS_OU, [], ca_key, ca_cert, days, server=False)
    return written


def _authority(root: Path, days: int) -> tuple[Key, x509.Certificate, list[Path]]:
    cert_path, key_path = root / "ca.pem", root / "ca-key.pem"
    if cert_path.exists() and key_path.exists():
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ConfigError(f"{key_path}: not the EC key certs init makes")
        return key, x509.load_pem_x509_certificate(cert_path.read_bytes()), []
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [_attr(NameOID.ORGANIZATION_NAME, "flowbus"), _attr(NameOID.COMMON_NAME, "flowbus dev CA")]
    )
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert, _write(root, "ca", key, cert)


def _leaf(
    root: Path,
    name: str,
    unit: str,
    sans: list[x509.GeneralName],
    ca_key: Key,
    ca_cert: x509.Certificate,
    days: int,
    *,
    server: bool,
) -> list[Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name(
        [
            _attr(NameOID.ORGANIZATION_NAME, "flowbus"),
            _attr(NameOID.ORGANIZATIONAL_UNIT_NAME, unit),
            _attr(NameOID.COMMON_NAME, name),
        ]
    )
    uses = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(uses), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return _write(root, name, key, builder.sign(ca_key, hashes.SHA256()))


def _attr(oid: x509.ObjectIdentifier, value: str) -> x509.NameAttribute[str]:
    return x509.NameAttribute(oid, value)


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not cert_sign,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _write(root: Path, name: str, key: Key, cert: x509.Certificate) -> list[Path]:
    cert_path, key_path = root / f"{name}.pem", root / f"{name}-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    return [cert_path, key_path]
