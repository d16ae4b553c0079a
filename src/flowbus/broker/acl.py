"""Who a client is and what it may do: tokens, rights on space patterns (the ``acl:`` and
``tokens:`` of a broker's config).

How it works:

* **Identity.** A client is the CN of the certificate it presented at the TLS handshake
  (``certs init --clients NAME``), or the identity whose token it sent in its ``Hello``, or
  nobody (``None``). A certificate wins over a token.
* **Tokens.** The config stores only the SHA-256 of each token, ``tokens: {NAME:
  sha256:HEX}`` (``flowbus certs token NAME`` prints a token and its line). A plain
  SHA-256 is enough because a token is 32 random bytes, not a password: nobody can search
  2^256 candidates, so the slow hashes made for guessable passwords (scrypt, argon2) would
  only cost each connection time. The hash of a presented token is compared with every
  stored one in constant time (:func:`hmac.compare_digest`).
* **Rights.** ``acl: {NAME: {publish: [PATTERN...], subscribe: [...], deploy: [...]}}``;
  a pattern is a space name with ``*`` and ``?`` wildcards (:func:`fnmatch.fnmatchcase`).
  ``publish`` covers publishing and advertising into a space, ``subscribe`` subscribing to
  it (a flow's derived space is a space like any other: subscribing to it needs ``subscribe``
  on its name), ``deploy`` deploying and undeploying the flows whose *names* match (their
  source spaces still need ``publish`` from whoever publishes into them). With no ``acl``
  every client may do everything (the broker as it was); with one, an identity not listed
  (or no identity) has no rights.
  ``admin`` (patterns of what may be administered; ``acl`` is the one there is) lets an
  identity have the broker read its rights again (``flowbus acl reload``,
  :mod:`flowbus.broker.reload`).
* **Revoked certificates.** ``revoked: [NAME or SERIAL, ...]``: a client certificate whose
  CN or serial number (hex, colons and case ignored) is listed opens no session
  (:meth:`Acl.revocation`, at the client's ``Hello``), and the sessions open under it are
  closed when the list is read again. A token is revoked by removing (or replacing) its
  line in ``tokens``.
* A refusal is an :class:`~flowbus.errors.AccessError` naming the identity, the right and
  the space, raised before anything changes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flowbus.errors import AccessError, ConfigError
from flowbus.net.certs import CLIENTS_OU
from flowbus.net.tls import identity

__all__ = ["RIGHTS", "Acl", "new_token", "token_hash"]

RIGHTS = ("publish", "subscribe", "deploy", "admin")
_PREFIX = "sha256:"


def token_hash(token: str) -> str:
    """What a broker's config stores for ``token``."""
    return _PREFIX + hashlib.sha256(token.encode()).hexdigest()


def new_token() -> tuple[str, str]:
    """A new random token and its hash."""
    token = secrets.token_urlsafe(32)
    return token, token_hash(token)


@dataclass(frozen=True)
class Acl:
    """Rights per identity (None: no ``acl``, everyone may do everything) and token hashes."""

    rights: Mapping[str, Mapping[str, tuple[str, ...]]] | None = None
    tokens: Mapping[str, str] = field(default_factory=dict)
    revoked: frozenset[str] = frozenset()  # client certificates' names and (normalized) serials

    @classmethod
    def from_config(cls, acl: Any, tokens: Any, revoked: Any = None) -> Acl:
        """From the config's ``acl``, ``tokens`` and ``revoked`` values (a :class:`ConfigError`
        naming the key)."""
        made = cls._from_config(acl, tokens)
        if revoked is None:
            return made
        if not isinstance(revoked, list) or not all(isinstance(r, str | int) and str(r) for r in revoked):
            raise ConfigError("revoked: a list of client certificate names or serial numbers (hex)")
        names = {str(r) for r in revoked} | {_serial(str(r)) for r in revoked}
        return cls(made.rights, made.tokens, frozenset(names))

    @classmethod
    def _from_config(cls, acl: Any, tokens: Any) -> Acl:
        if tokens is None:
            tokens = {}
        if not isinstance(tokens, Mapping):
            raise ConfigError("tokens: a mapping of identity -> sha256:HEX (flowbus certs token NAME)")
        for name, digest in tokens.items():
            if not (
                isinstance(digest, str) and digest.startswith(_PREFIX) and len(digest) == len(_PREFIX) + 64
            ):
                raise ConfigError(f"tokens.{name}: sha256:HEX of 64 hex digits expected, got {digest!r}")
        if acl is None:
            return cls(None, dict(tokens))
        if not isinstance(acl, Mapping):
            raise ConfigError(
                "acl: a mapping of identity -> {publish: [...], subscribe: [...], deploy: [...]}"
            )
        rights: dict[str, dict[str, tuple[str, ...]]] = {}
        for name, grants in acl.items():
            if grants is None:
                grants = {}
            if not isinstance(grants, Mapping) or set(grants) - set(RIGHTS):
                raise ConfigError(f"acl.{name}: a mapping with keys among {', '.join(RIGHTS)}")
            rights[str(name)] = {r: _patterns(f"acl.{name}.{r}", grants.get(r)) for r in RIGHTS}
        return cls(rights, dict(tokens))

    @property
    def enforced(self) -> bool:
        return self.rights is not None

    def check(self, identity: str | None, right: str, space: str) -> None:
        """Nothing if ``identity`` may ``right`` on ``space``, else an :class:`AccessError`."""
        if self.rights is None:
            return
        grants = self.rights.get(identity) if identity is not None else None
        if grants is None or not any(fnmatch.fnmatchcase(space, p) for p in grants[right]):
            raise AccessError(identity, right, space)

    def revocation(self, peercert: Mapping[str, Any] | None) -> str | None:
        """Why a client certificate is refused (its name or serial is revoked); None: it is not."""
        who = identity(dict(peercert) if peercert else None)
        if not self.revoked or who is None or who[0] != CLIENTS_OU or peercert is None:
            return None
        serial = _serial(str(peercert.get("serialNumber", "")))
        if who[1] in self.revoked or serial in self.revoked:
            return f"the certificate of {who[1]!r} (serial {serial}) is revoked"
        return None

    def identity_of(self, token: str | None) -> str | None:
        """The identity ``token`` stands for (None if none does)."""
        if not token:
            return None
        digest = token_hash(token)
        found = None
        for name, stored in self.tokens.items():
            if hmac.compare_digest(digest, stored):
                found = name
        return found


def _serial(text: str) -> str:
    """A certificate serial number as compared: hex digits, upper case, no colons or leading 0."""
    return text.replace(":", "").upper().lstrip("0")


def _patterns(key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{key}: a list of space patterns (with * wildcards)")
    return tuple(value)
