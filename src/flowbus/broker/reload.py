"""Rights read again while the broker runs: the ``acl``, ``tokens`` and ``revoked`` of its
config file, applied to the client sessions already connected (``SIGHUP`` to the broker's
process, or ``flowbus acl reload``, which needs the ``admin`` right on ``acl``).

How it works:

* **Reading.** The config file the broker was started with is read again whole
  (:meth:`BrokerConfig.load <flowbus.broker.config.BrokerConfig.load>`); a file that cannot
  be read, or is not valid, changes nothing: a :class:`~flowbus.errors.ConfigError` naming
  the file and the key, the old rights stay. Only the rights are taken from it (``acl``,
  ``tokens``, ``revoked``); other settings need a restart.
* **Identities.** A session's identity came from its client certificate or from its token. A
  session whose certificate is now revoked (its name or serial listed), or whose identity's
  token line was removed or replaced, is ended: its subscriptions end (``SubEnded`` with the
  reason), its advertisements are withdrawn, and it is sent ``Error`` and closed. A revoked
  certificate then opens no new session either (:meth:`Acl.revocation
  <flowbus.broker.acl.Acl.revocation>`, at ``Hello``).
* **Rights.** In every other session, each subscription whose space its identity may no
  longer subscribe to is ended: unsubscribed here, and the client is told ``SubEnded`` with
  the refusal (identity, right, space); its iteration ends with that error. Publishes are
  checked against the new rights from the next one on (the ledger's ``admit`` reads them
  each time); what was published before stays published.

Subscriptions attached to no connection (lingering after a lost one, durable ones waiting
for their client, pulled ones) are checked when a client attaches again: ``Subscribe`` is
checked then.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flowbus.broker.acl import Acl
from flowbus.broker.adverts import Adverts
from flowbus.broker.config import BrokerConfig
from flowbus.broker.queues import Queues
from flowbus.broker.sessions import Connection, Sessions
from flowbus.client import protocol as p
from flowbus.errors import AccessError, ConfigError
from flowbus.net.certs import CLIENTS_OU
from flowbus.net.tls import identity

__all__ = ["AclReload"]

log = logging.getLogger("flowbus.broker")


class AclReload:
    """Reads a broker's rights again and applies them to its sessions (see the module note);
    ``install`` makes the new rights the broker's."""

    def __init__(
        self,
        *,
        path: Path | None,
        sessions: Sessions,
        queues: Queues,
        adverts: Adverts,
        install: Callable[[Acl], None],
    ) -> None:
        self.path = path
        self.sessions = sessions
        self.queues = queues
        self.adverts = adverts
        self.install = install

    def reload(self) -> dict[str, Any]:
        """Read the config file's rights again and apply them: what changed. A
        :class:`ConfigError` if there is no file or it is not valid (nothing changed)."""
        try:
            if self.path is None:
                raise ConfigError("acl reload: the broker was started without --config: no file to read")
            new = BrokerConfig.load(self.path).acl
        except ConfigError as e:
            log.warning("acl reload refused, the old rights stay: %s", e)
            raise
        return self.apply(new)

    def apply(self, new: Acl) -> dict[str, Any]:
        """Make ``new`` the broker's rights and end what the sessions may no longer do."""
        old = self.sessions.acl
        self.install(new)
        closed: list[dict[str, Any]] = []
        ended: list[dict[str, Any]] = []
        for session in list(self.sessions.by_client.values()):
            why = _revoked(session, old, new)
            if why is not None:
                self._close(session, why)
                closed.append({"client": session.client, "identity": session.identity, "why": why})
                continue
            for sub_id in sorted(self.queues.attached(session)):
                sub = self.queues.subs.get(sub_id)
                if sub is None:
                    continue
                try:
                    new.check(session.identity, "subscribe", sub.space)
                except AccessError as e:
                    self.queues.unsubscribe(session, sub_id)
                    session.send(p.SubEnded(sub_id, str(e)))
                    ended.append({"subscription": sub_id, "identity": session.identity, "why": str(e)})
        log.info(
            "acl reloaded: %d identities, %d tokens, %d revoked; %d sessions closed, %d subscriptions ended",
            len(new.rights or {}),
            len(new.tokens),
            len(new.revoked),
            len(closed),
            len(ended),
        )
        return {"identities": sorted(new.rights or {}), "closed": closed, "ended": ended}

    def _close(self, session: Connection, why: str) -> None:
        """End ``session``: its subscriptions (each told ``SubEnded``) and advertisements
        go, then ``Error`` and the connection is closed."""
        for sub_id in sorted(self.queues.attached(session)):
            self.queues.unsubscribe(session, sub_id)
            session.send(p.SubEnded(sub_id, why))
        self.adverts.withdraw_all(session)
        session.send(p.Error(why))
        session.close()


def _revoked(session: Connection, old: Acl, new: Acl) -> str | None:
    """Why ``session``'s identity is no longer valid under ``new`` (None: it is)."""
    peercert = session.writer.get_extra_info("peercert")
    why = new.revocation(peercert)
    if why is not None or session.identity is None:
        return why
    who = identity(peercert)
    if who is not None and who[0] == CLIENTS_OU:  # (by its certificate, not revoked)
        return None
    if new.tokens.get(session.identity) != old.tokens.get(session.identity):
        return f"the token of identity {session.identity!r} was revoked"
    return None
