"""The simulator commands: ``flowbus sim pastry-hops``.

``sim_app`` is a typer sub-app (mounted as ``flowbus sim`` by :mod:`flowbus.cli`). As
everywhere in the command line, ``--json`` prints exactly one JSON document on standard
output (progress, if any, goes to standard error), otherwise a two-column table; a bad
input prints a red message on standard error and exits with status 2, without a traceback.
"""

from __future__ import annotations

from typing import Annotated, Any, NoReturn

import typer

from flowbus.errors import FlowbusError

__all__ = ["pastry_hops", "sim_app"]

sim_app = typer.Typer(help="Discrete-event simulations of the overlay cores.", no_args_is_help=True)

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]


def _cli() -> Any:
    """The main command line module, for its helpers (imported late: it imports this module)."""
    from flowbus import cli

    return cli


def _fail(message: str) -> NoReturn:
    _cli().fail(message)
    raise typer.Exit(2)  # not reached: fail() exits


@sim_app.command("pastry-hops")
def pastry_hops(
    nodes: Annotated[int, typer.Option(help="Pastry nodes (static, correct tables).")] = 10_000,
    lookups: Annotated[int, typer.Option(help="Lookups of random keys from random nodes.")] = 10_000,
    seed: Annotated[int, typer.Option(help="Master seed of the run.")] = 1,
    as_json: JsonOption = False,
) -> None:
    """Routing hops of Pastry lookups against ceil(log16 N) + 1 and the paper's figure 4."""
    from flowbus.sim.pastry_hops import run

    cli = _cli()
    try:
        with cli.progress_bar(True) as progress:
            result = run(nodes=nodes, lookups=lookups, seed=seed, progress=progress)
    except FlowbusError as exc:
        _fail(str(exc))
    if as_json:
        cli.emit(result, as_json=True, title="")
        return
    flat = {k: ("-" if v is None else v) for k, v in result.items() if k != "hops"}
    flat.update({f"hops = {h}": n for h, n in result["hops"].items()})
    cli.emit(flat, as_json=False, title=f"Pastry hops: {nodes:,} nodes, {lookups:,} lookups")
