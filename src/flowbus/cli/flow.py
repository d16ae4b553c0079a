"""The information flow commands: ``flowbus flow explain|expand|generate|deploy|undeploy|ls``.

``flowbus flow explain FILE --html OUT.html`` writes the flow drawn before and after the
rewrite as one self-contained page (:mod:`flowbus.flow.html`); ``--dot`` prints both graphs
in Graphviz DOT (:mod:`flowbus.flow.draw`).

``flow_app`` is a typer sub-app (mounted as ``flowbus flow`` by :mod:`flowbus.cli`;
``flowbus run`` is :mod:`flowbus.cli.run`). As everywhere in the command line, ``--json``
prints exactly one JSON document on standard output, and a bad input (a spec that does
not load, an unknown state, a row that is not JSON) prints a red message on standard
error and exits with status 2, without a traceback.

``flowbus flow generate`` prints a flow's generated input (its ``input:`` section,
:func:`flowbus.flow.generators.generate`) as JSON lines ``{"space": ..., "event": ...}``, in
the order ``flowbus run --engine local`` publishes them into the graph's publication points
(000 document, section 4.1: the publishers of the rewritten graph), so that ``flowbus pub -``
can publish the same input into brokers. The lines are written as they are made; a reader
that stops early (``| head``) ends the command quietly.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flowbus.cli.broker import BrokersOption, TlsOption, TokenOption, UserOption, ask
from flowbus.cli.common import JsonOption, SpecArgument, fail
from flowbus.errors import FlowbusError, InputError

if TYPE_CHECKING:
    from flowbus.flow.collapse import BoundRules
    from flowbus.flow.graph import Graph

__all__ = ["flow_app"]

flow_app = typer.Typer(
    help="Information flow graphs: the rewrite to \\[select; transform], and expand by A*.",
    no_args_is_help=True,
)


def _load(spec: Path) -> Graph:
    from flowbus.flow.spec import load_spec

    return load_spec(spec)


@flow_app.command("explain")
def explain(
    spec: SpecArgument,
    as_json: JsonOption = False,
    html: Annotated[
        Path | None,
        typer.Option(help="Write one self-contained HTML page: the graph drawn before and after."),
    ] = None,
    dot: Annotated[bool, typer.Option("--dot", help="Print both graphs in Graphviz DOT.")] = False,
) -> None:
    """Print the graph before and after rewriting, path by path (000 document, section 4.1)."""
    from flowbus.flow.explain import explain_json, explain_text

    try:
        g = _load(spec)
        if html is not None:
            _write_html(g, html)
        elif dot:
            from flowbus.flow.draw import drawings, to_dot

            sys.stdout.write("".join(to_dot(d) for d in drawings(g)))
        elif as_json:
            sys.stdout.write(json.dumps(explain_json(g), indent=2) + "\n")
        else:
            sys.stdout.write(explain_text(g))
    except FlowbusError as exc:
        fail(str(exc))


def _write_html(g: Graph, path: Path) -> None:
    from flowbus.flow.html import flow_page

    try:
        path.write_text(flow_page(g), encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--html {path}: {exc.strerror}") from None
    sys.stderr.write(f"wrote {path}\n")


def _rules_for(g: Graph, state: str, arc: str | None) -> tuple[str, BoundRules]:
    """The arc whose rule set ``flow expand`` uses: ``arc``, the state's one expand arc, or its collapse."""
    from flowbus.errors import FlowError
    from flowbus.flow.graph import Collapse, Expand
    from flowbus.flow.validate import bind_rules

    g.state_space(state)
    if arc is not None:
        chosen = g.arc(arc)
        if not (isinstance(chosen, Expand) and chosen.source == state) and not (
            isinstance(chosen, Collapse) and chosen.target == state
        ):
            raise FlowError(f"arc {arc!r} is neither a collapse into nor an expand out of state {state!r}")
        return chosen.name, bind_rules(g, chosen)
    expands = [a for a in g.out_arcs(state) if isinstance(a, Expand)]
    if len(expands) > 1:
        names = ", ".join(a.name for a in expands)
        raise FlowError(f"state {state!r} has several expand arcs ({names}): choose one with --arc")
    chosen_arc = expands[0] if expands else g.in_arcs(state)[0]
    return chosen_arc.name, bind_rules(g, chosen_arc)


def _rows(text: str, option: str, bound: BoundRules, g: Graph, state: str) -> dict[Any, Any]:
    from flowbus.flow.expand import rows_from_json

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{option} is not JSON: {exc.msg} at column {exc.colno}") from None
    fields = dict(g.state_space(state).schema.fields)
    return rows_from_json(bound, fields, data, option)


@flow_app.command("expand")
def expand(
    spec: SpecArgument,
    state: Annotated[str, typer.Option("--state", help="The state space, e.g. max_cur.")],
    start: Annotated[
        str, typer.Option("--from", help='Start row(s) as JSON: {"name": "IBM", "maxP": 160, ...}')
    ],
    goal: Annotated[str, typer.Option("--to", help="Goal row(s) as JSON, same form.")],
    arc: Annotated[str | None, typer.Option(help="Use this collapse or expand arc's rule set.")] = None,
    max_cost: Annotated[int | None, typer.Option(min=0, help="Refuse sequences longer than this.")] = None,
    max_states: Annotated[
        int, typer.Option(min=1, help="Give up after expanding this many states.")
    ] = 200_000,
    as_json: JsonOption = False,
) -> None:
    """Print the shortest event sequence taking a state from one row to another (section 4.2, A*)."""
    from flowbus.flow.expand import expand as run_expand

    try:
        g = _load(spec)
        arc_name, bound = _rules_for(g, state, arc)
        s0 = _rows(start, "--from", bound, g, state)
        s1 = _rows(goal, "--to", bound, g, state)
        result = run_expand(bound, s0, s1, max_cost=max_cost, max_states=max_states)
    except FlowbusError as exc:
        fail(str(exc))
    doc = {
        "state": state,
        "arc": arc_name,
        "events": [dict(ev) for ev in result.events],
        "length": len(result.events),
        "states_expanded": result.states_expanded,
        "states_generated": result.states_generated,
        "form": result.form.kind,
        "keys": [
            {"key": list(k.key), "length": len(k.events), "states_expanded": k.states_expanded}
            for k in result.keys
        ],
        "seconds": result.seconds,
    }
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    for ev in result.events:
        sys.stdout.write(json.dumps(ev) + "\n")
    sys.stdout.write(
        f"{len(result.events)} events; A* expanded {result.states_expanded} states "
        f"({result.form.kind} rule set, arc {arc_name})\n"
    )


@flow_app.command("generate")
def generate(
    spec: SpecArgument,
    events: Annotated[
        int | None, typer.Option(min=0, help="Events to generate (default: the spec's).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the generator (default: the spec's).")] = None,
) -> None:
    """Print the flow's generated input as JSON lines {"space": ..., "event": ...}, in the
    order the local interpreter takes them (feed them to `flowbus pub -`)."""
    from flowbus.flow.generators import generate as run_generator

    try:
        g = _load(spec)  # (its errors name the spec)
    except FlowbusError as exc:
        fail(str(exc))
    write = sys.stdout.write
    try:
        for space, event in run_generator(g, events=events, seed=seed):
            write(json.dumps({"space": space, "event": event}) + "\n")
        sys.stdout.flush()
    except FlowbusError as exc:
        fail(f"{spec}: {exc}")
    except BrokenPipeError:  # the reader stopped early: nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (for Python's flush at exit)


def _print_flow(info: dict[str, Any]) -> None:
    from rich.table import Table

    from flowbus.cli.common import out

    table = Table(title=f"flow {info['name']} (version {info['version']}, {info['owners']} state owner(s))")
    for column in ("space", "kind", "publish", "subscribe", "schema"):
        table.add_column(column)
    for s in info["spaces"]:
        publish = "yes" if s["publishable"] else "derived" if s["derived"] else "no"
        schema = ", ".join(f"{k}: {v}" for k, v in s["schema"].items())
        table.add_row(s["name"], s["kind"], publish, "yes" if s["subscribable"] else "no", schema)
    out.print(table)


@flow_app.command("deploy")
def deploy(
    spec: SpecArgument,
    broker: BrokersOption = None,
    as_json: JsonOption = False,
    tls: TlsOption = None,
    user: UserOption = None,
    token: TokenOption = None,
) -> None:
    """Deploy a flow on a running network: its spaces can be published into and subscribed to."""
    from flowbus.flow.deploy import Deployment

    try:
        text = Deployment.from_file(spec).text  # (a bad spec is refused here, naming the file)
    except FlowbusError as exc:
        fail(str(exc))
    info = ask(broker, lambda client: client.deploy(text), (tls, user, token))
    if as_json:
        sys.stdout.write(json.dumps(info, indent=2) + "\n")
    else:
        _print_flow(info)


@flow_app.command("undeploy")
def undeploy(
    name: Annotated[str, typer.Argument(help="The flow's name.")],
    broker: BrokersOption = None,
    as_json: JsonOption = False,
    tls: TlsOption = None,
    user: UserOption = None,
    token: TokenOption = None,
) -> None:
    """Withdraw a flow from the network: its state goes, its subscriptions end."""
    info = ask(broker, lambda client: client.undeploy(name), (tls, user, token))
    if as_json:
        sys.stdout.write(json.dumps(info) + "\n")
    else:
        sys.stdout.write(f"flow {info['name']} (version {info['version']}) undeployed\n")


@flow_app.command("ls")
def ls(
    broker: BrokersOption = None,
    as_json: JsonOption = False,
    tls: TlsOption = None,
    user: UserOption = None,
    token: TokenOption = None,
) -> None:
    """The flows deployed on the network, their spaces, which can be published into."""
    flows = ask(broker, lambda client: client.flows(), (tls, user, token))
    if as_json:
        sys.stdout.write(json.dumps(flows, indent=2) + "\n")
    elif not flows:
        sys.stdout.write("no flow is deployed\n")
    for info in [] if as_json else flows:
        _print_flow(info)
