"""The ``flowbus`` command: one Typer app mounting one module per command group.

* :mod:`flowbus.cli.run` -- ``flowbus run`` (a flow spec on Spark or the local interpreter);
* :mod:`flowbus.cli.flow` -- ``flowbus flow explain|expand``;
* :mod:`flowbus.cli.match` -- ``flowbus match`` (bulk matching on Spark);
* :mod:`flowbus.cli.broker` -- ``flowbus broker start``, ``cluster up``, ``pub``, ``sub``;
* :mod:`flowbus.cli.sim` -- ``flowbus sim ...`` (the simulator's experiments);
* :mod:`flowbus.cli.bench` -- ``flowbus bench ...`` (:mod:`flowbus.bench`);
* :mod:`flowbus.cli.demo` -- ``flowbus demo``;
* :mod:`flowbus.cli.certs` -- ``flowbus certs init|token`` (TLS certificates, tokens);
* :mod:`flowbus.cli.acl` -- ``flowbus acl reload`` (a running broker's rights read again);
* :mod:`flowbus.cli.chaos` -- ``flowbus chaos run|mixes`` (fault campaigns, :mod:`flowbus.chaos`);
* :mod:`flowbus.cli.common` -- what they share: consoles, ``fail``, ``emit``, the progress bar.

Every benchmark takes ``--json`` and then prints exactly one JSON document on standard
output (progress, if any, goes to standard error); without it a table. The group modules
import only Typer and Rich at the top: what a command needs (pyspark, the broker, numba) is
imported inside it, so ``flowbus --help`` stays fast.
"""

from __future__ import annotations

import typer
from rich.markup import escape

from flowbus import __version__
from flowbus.cli import acl, bench, broker, certs, chaos, demo, flow, match, run, sim
from flowbus.cli.common import err, out

__all__ = ["EXTRA_OF", "app", "main"]

app = typer.Typer(
    name="flowbus",
    help="Content-based event distribution middleware.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def version() -> None:
    """Print the flowbus version."""
    out.print(__version__)


app.command("demo")(demo.demo)
app.command("pub")(broker.pub)
app.command("sub")(broker.sub)
app.command("run")(run.run)
app.command("match")(match.match)
app.add_typer(bench.bench_app, name="bench")
app.add_typer(flow.flow_app, name="flow")
app.add_typer(sim.sim_app, name="sim")
app.add_typer(broker.broker_app, name="broker")
app.add_typer(broker.cluster_app, name="cluster")
app.add_typer(certs.certs_app, name="certs")
app.add_typer(acl.acl_app, name="acl")
app.add_typer(chaos.chaos_app, name="chaos")


_BROKER = ("numpy", "numba", "pyarrow", "yaml", "cryptography", "networkx", "prometheus_client", "h11")
EXTRA_OF = {
    **dict.fromkeys(_BROKER, "broker"),
    **dict.fromkeys(("pyspark", "pandas", "grpc", "py4j"), "spark"),
    "matplotlib": "experiments",
    "stomp": "bench",
}
"""The extra that brings each module a command may miss (``pip install flowbus`` has the
client, the filters and ``pub`` / ``sub`` only; see pyproject.toml)."""


def main() -> None:
    """``flowbus``: the app; a command that needs a module of an extra not installed ends with
    one line that names the extra."""
    try:
        app()
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        extra = EXTRA_OF.get(missing)
        if extra is None:
            raise
        why = f"this command needs flowbus's {extra!r} extra (no module {missing!r})"
        why += f": pip install 'flowbus[{extra}]'"
        err.print(f"[bold red]error:[/] {escape(why)}", soft_wrap=True)
        raise SystemExit(2) from None
