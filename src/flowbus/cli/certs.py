"""``flowbus certs init DIR``: a development certificate authority and the certificates of a
ring's brokers and clients (:mod:`flowbus.net.certs`); ``flowbus certs token NAME``: a
client token and the hash a broker's config stores for it (:mod:`flowbus.broker.acl`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flowbus.cli.common import fail, out
from flowbus.errors import FlowbusError

__all__ = ["certs_app"]

certs_app = typer.Typer(help="Certificates and tokens for TLS and identities.", no_args_is_help=True)


@certs_app.command("init")
def certs_init(
    directory: Annotated[
        Path, typer.Argument(help="Where to write ca.pem, broker-N.pem, NAME.pem and keys.")
    ],
    brokers: Annotated[int, typer.Option(help="Broker certificates: broker-1 ... broker-N.")] = 3,
    clients: Annotated[
        list[str] | None, typer.Option(help="A client certificate for NAME (repeatable).")
    ] = None,
    host: Annotated[str, typer.Option(help="The brokers' IP address (in their certificates).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of broker-1; broker-N gets PORT + N - 1.")] = 7001,
    days: Annotated[int, typer.Option(min=1, help="Validity in days.")] = 365,
) -> None:
    """Make a development CA (or reuse the one in DIR) and certificates signed by it."""
    from flowbus.net.certs import init

    try:
        written = init(directory, brokers=brokers, clients=clients or [], host=host, port=port, days=days)
    except FlowbusError as e:
        fail(str(e))
    names = sorted({p.name.removesuffix("-key.pem").removesuffix(".pem") for p in written})
    out.print(f"{len(written)} file(s) in {directory}: {', '.join(names) or 'nothing new'}")


@certs_app.command("token")
def certs_token(name: Annotated[str, typer.Argument(help="The identity the token stands for.")]) -> None:
    """Print a new random token for NAME and the line for the brokers' config (only the
    hash is stored there; give the token to the client: flowbus pub --token ...)."""
    from flowbus.broker.acl import new_token

    token, digest = new_token()
    out.print(f"token for {name}: {token}", soft_wrap=True)
    out.print(f"broker config:   tokens: {{{name}: {digest}}}", soft_wrap=True)
