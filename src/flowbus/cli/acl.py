"""``flowbus acl reload``: a running broker reads the rights of its config file again (``acl``,
``tokens``, ``revoked``) and applies them to the sessions already connected
(:mod:`flowbus.broker.reload`). The caller needs the ``admin`` right on ``acl`` when the broker
has an ``acl``; ``kill -HUP`` on the broker's process does the same locally."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from flowbus.cli.broker import BrokersOption, TlsOption, TokenOption, UserOption, ask
from flowbus.cli.common import JsonOption, out

__all__ = ["acl_app"]

acl_app = typer.Typer(help="Rights of a running broker.", no_args_is_help=True)


@acl_app.command("reload")
def reload(
    broker: BrokersOption = None,
    as_json: JsonOption = False,
    tls: TlsOption = None,
    user: UserOption = None,
    token: TokenOption = None,
) -> None:
    """Have the broker read the rights of its config file again: sessions of a revoked
    identity are closed, subscriptions no longer allowed end."""
    tls_options: tuple[Path | None, str | None, str | None] = (tls, user, token)
    done = ask(broker, lambda client: client.reload_acl(), tls_options)
    if as_json:
        sys.stdout.write(json.dumps(done, indent=2) + "\n")
        return
    out.print(f"rights reloaded: identities {', '.join(done['identities']) or '(no acl)'}")
    for c in done["closed"]:
        out.print(f"closed: client {c['client']} ({c['identity']}): {c['why']}", soft_wrap=True)
    for e in done["ended"]:
        out.print(f"ended: subscription {e['subscription']}: {e['why']}", soft_wrap=True)
