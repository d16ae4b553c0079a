"""The broker commands: ``flowbus broker start``, ``flowbus cluster up``, ``flowbus pub``, ``flowbus sub``
(each may name flows to deploy: ``--flow FILE``).

``broker_app`` and ``cluster_app`` are typer sub-apps (mounted as ``flowbus broker`` and
``flowbus cluster`` by :mod:`flowbus.cli`); :func:`pub` and :func:`sub` are command functions
mounted as ``flowbus pub`` and ``flowbus sub``. A bad input (an address, an event that is
not a JSON object, a filter the brokers refuse) prints a red message on standard error and
exits with status 2. ``flowbus bench broker`` is in :mod:`flowbus.cli.bench`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import sys
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flowbus.broker.process import OVERLOADED, READY
from flowbus.cli.common import err, fail, out
from flowbus.errors import FlowbusError

if TYPE_CHECKING:
    from flowbus.client import Client

__all__ = [
    "BrokersOption",
    "TlsOption",
    "TokenOption",
    "UserOption",
    "ask",
    "broker_app",
    "client_options",
    "cluster_app",
    "pub",
    "sub",
]

TlsOption = Annotated[
    Path | None, typer.Option(help="A flowbus certs init directory: TLS (mutual between brokers).")
]
UserOption = Annotated[
    str | None, typer.Option(help="With --tls: the client certificate NAME.pem of the directory (identity).")
]
TokenOption = Annotated[
    str | None, typer.Option(help="An identity's token (flowbus certs token), sent to the broker.")
]


BrokersOption = Annotated[list[str] | None, typer.Option(help="HOST:PORT of a broker (repeatable).")]


def ask(broker: list[str] | None, request: Any, tls: tuple[Path | None, str | None, str | None]) -> Any:
    """Run ``request(client)`` against the brokers (``tls``: ``--tls``, ``--user``, ``--token``);
    its result, or a red message and status 2."""
    import asyncio

    from flowbus.client import connect

    options = client_options(*tls)

    async def run() -> Any:
        async with connect(*(broker or ["127.0.0.1:7001"]), **options) as client:
            return await request(client)

    try:
        return asyncio.run(run())
    except FlowbusError as exc:
        fail(str(exc))


def client_options(tls: Path | None, user: str | None, token: str | None) -> dict[str, Any]:
    """``connect``'s options for ``--tls DIR --user NAME --token TOKEN``."""
    from flowbus.net.tls import client_context

    if user is not None and tls is None:
        fail("--user NAME needs --tls DIR (the directory holding NAME.pem)")
    try:
        return {"tls": client_context(tls, user) if tls is not None else None, "token": token}
    except FlowbusError as e:
        fail(str(e))


def _say(text: str, *, stderr: bool = False) -> None:
    (err if stderr else out).print(text)


broker_app = typer.Typer(help="Run a broker of a flowbus ring.", no_args_is_help=True)
cluster_app = typer.Typer(help="A local ring of brokers for trying things out.", no_args_is_help=True)


@broker_app.command("start")
def broker_start(
    listen: Annotated[
        str, typer.Option(help="HOST:PORT to listen on (port 0: any free port).")
    ] = "127.0.0.1:7001",
    advertise: Annotated[
        str | None,
        typer.Option(
            help="HOST:PORT the ring and clients know (and dial) this broker by, if not --listen "
            "(a proxy or forwarder there leads to --listen)."
        ),
    ] = None,
    join: Annotated[list[str] | None, typer.Option(help="HOST:PORT of a broker of the ring to join.")] = None,
    data: Annotated[Path | None, typer.Option(help="Directory of the broker's SQLite store.")] = None,
    overlay: Annotated[
        str, typer.Option(help="chordal-ring (pastry-irbr: see docs/broker.md).")
    ] = "chordal-ring",
    config: Annotated[Path | None, typer.Option(help="YAML file: spaces, rule sets, limits.")] = None,
    log_level: Annotated[
        str, typer.Option(help="Standard error log level: debug, info (ring changes), warning.")
    ] = "info",
    flow: Annotated[
        list[Path] | None, typer.Option(help="A flow spec to deploy once joined (repeatable).")
    ] = None,
    tls: TlsOption = None,
    tls_name: Annotated[
        str | None, typer.Option(help="This broker's certificate in the --tls directory (broker-1).")
    ] = None,
    http: Annotated[
        str | None, typer.Option(help="HOST:PORT of the web console and /metrics (port 0: any free port).")
    ] = None,
    stomp: Annotated[
        str | None,
        typer.Option(
            help="HOST:PORT of a STOMP 1.2 listener (port 0: any free port; else the config's stomp key)."
        ),
    ] = None,
) -> None:
    """Run a broker until Ctrl-C (or SIGTERM); SIGHUP reads the rights of --config again."""
    import logging

    from flowbus.broker.config import DEFAULT, BrokerConfig
    from flowbus.broker.server import parse_address, parse_advertised
    from flowbus.net.tls import broker_tls

    level = logging.getLevelNamesMapping().get(log_level.upper())
    if level is None:
        fail(f"--log-level: {log_level!r} is not one of debug, info, warning, error")
    logging.basicConfig(
        level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr
    )
    try:
        host, port = parse_address(listen)
        if stomp is not None:
            parse_address(stomp)
        if advertise is not None:
            parse_advertised(advertise)
        cfg = BrokerConfig.load(config) if config is not None else DEFAULT
        contexts = broker_tls(tls, tls_name) if tls is not None else None
    except FlowbusError as e:
        fail(str(e))
    # A broker holds many long-lived objects (filters, index tables, events in custody) and
    # makes many short-lived ones per event: the default thresholds run a collection every
    # 700 allocations, and full ones that walk the whole heap often (a third of the time)
    gc.set_threshold(50_000, 20, 100)
    asyncio.run(
        _serve(
            host=host,
            port=port,
            join=join or [],
            data=data,
            config=cfg,
            overlay=overlay,
            flows=flow or [],
            tls=contexts,
            http=http,
            config_file=config,
            advertise=advertise,
            stomp=stomp,
        )
    )


def _reload_acl(broker: Any) -> None:
    """SIGHUP: the rights of the config file again (a bad file is logged; the old rights stay)."""
    with contextlib.suppress(FlowbusError):
        broker.reload_acl()


def _overloaded(address: str, request: Any) -> None:
    print(f"{OVERLOADED} {address} load {request.load:.2f}", flush=True)


async def _serve(**options: Any) -> None:
    """Run a broker until SIGINT or SIGTERM. A broker the ring found dead while it was alive
    (paused, cut off) steps down and starts again in this process, on its data, as a new
    member (broker/handover.py): the ready line is printed once."""
    from flowbus.broker.server import Broker

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ready = False
    while not stop.is_set():
        try:
            broker = await Broker.start(**options)
        except FlowbusError as e:
            fail(str(e))
        loop.add_signal_handler(signal.SIGHUP, partial(_reload_acl, broker))
        try:
            await broker.joined(timeout=60.0)
        except FlowbusError as e:
            await broker.close()
            fail(str(e))
        for name in sorted(broker.flows.list(), key=lambda f: f["name"]):
            log_flow = f"flow {name['name']} {name['version']} deployed"
            print(log_flow, file=sys.stderr, flush=True)
        if broker.ring_log is not None:  # (over its limit: a line for cluster up --max-brokers)
            broker.ring_log.on_overloaded = partial(_overloaded, broker.address)
        if broker.console is not None:  # (a start again keeps the console's port)
            options["http"] = broker.console.url.removeprefix("http://").rstrip("/")
        if broker.stomp is not None:  # (and the STOMP listener's)
            options["stomp"] = broker.stomp.address
        if not ready:
            console = f" console {broker.console.url}" if broker.console is not None else ""
            door = f" stomp {broker.stomp.address}" if broker.stomp is not None else ""
            print(f"{READY} {broker.address} pid {os.getpid()}{console}{door}", flush=True)
            ready = True
        stopped = asyncio.ensure_future(stop.wait())
        down = asyncio.ensure_future(broker.stepped_down.wait())
        await asyncio.wait({stopped, down}, return_when=asyncio.FIRST_COMPLETED)
        for f in (stopped, down):
            f.cancel()
        await broker.close()
        if not stop.is_set():
            print(f"flowbus broker {broker.address}: found dead by the ring; starting again as a new member",
                  file=sys.stderr, flush=True)  # fmt: skip


def _events(event: str | None, space: str) -> list[tuple[str, dict[str, Any]]]:
    """The events to publish: ``(space, event)``; with space ``-``, each line is
    ``{"space": ..., "event": ...}`` (what ``flowbus flow generate`` prints)."""
    lines = [event] if event is not None else [line for line in sys.stdin if line.strip()]
    out_: list[tuple[str, dict[str, Any]]] = []
    for n, line in enumerate(lines, 1):
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            fail(f"event {n}: not JSON ({e.msg} at column {e.colno})")
        if not isinstance(value, dict):
            fail(f"event {n}: a JSON object is expected, got {type(value).__name__}")
        if space != "-":
            out_.append((space, value))
            continue
        if not (isinstance(value.get("space"), str) and isinstance(value.get("event"), dict)):
            fail(f'event {n}: with space "-", each line is {{"space": NAME, "event": {{...}}}}')
        out_.append((value["space"], value["event"]))
    return out_


def pub(
    space: Annotated[
        str,
        typer.Argument(help='The information space ("-": each line names its own, as flow generate prints).'),
    ],
    event: Annotated[str | None, typer.Option(help="One event as JSON (else JSON lines from stdin).")] = None,
    broker: Annotated[list[str] | None, typer.Option(help="HOST:PORT of a broker (repeatable).")] = None,
    tls: TlsOption = None,
    user: UserOption = None,
    token: TokenOption = None,
) -> None:
    """Publish events (JSON objects) and wait until the brokers acknowledge them."""
    from flowbus.client import connect

    events = _events(event, space)
    options = client_options(tls, user, token)

    async def run() -> None:
        async with connect(*(broker or ["127.0.0.1:7001"]), **options) as client:
            for s, e in events:
                await client.publish(s, e)
            await client.flush()

    try:
        asyncio.run(run())
    except FlowbusError as e:
        fail(str(e))
    spaces = sorted({s for s, _ in events})
    _say(f"published {len(events)} event(s) to {', '.join(spaces) or space}", stderr=True)


def sub(
    space: Annotated[str, typer.Argument(help="The information space.")],
    filter: Annotated[
        str | None, typer.Argument(help="A filter, e.g. 'price > 100 & symbol = \"IBM\"' (none: all events).")
    ] = None,
    broker: Annotated[list[str] | None, typer.Option(help="HOST:PORT of a broker (repeatable).")] = None,
    durable: Annotated[
        str | None,
        typer.Option(help="Name of a durable subscription (with --filters: NAME-LINE for each line's)."),
    ] = None,
    collapse: Annotated[str | None, typer.Option(help="A collapse rule set of the brokers.")] = None,
    count: Annotated[int, typer.Option(help="Stop after this many events (0: never).")] = 0,
    filters: Annotated[
        Path | None,
        typer.Option(
            help="A file of filters, one a line ('-': standard input; blank lines and # comments "
            'skipped), subscribed in bulk; each event is printed as {"line": N, "event": ...} '
            "for each line whose filter it matches.",
        ),
    ] = None,
    tls: TlsOption = None,
    user: UserOption = None,
    token: TokenOption = None,
) -> None:
    """Print the matching events as JSON lines until Ctrl-C (or --count events)."""
    from flowbus.client import connect

    options = client_options(tls, user, token)
    if filters is not None and filter is not None:
        fail("give a FILTER or --filters, not both")
    lines = _filter_lines(filters) if filters is not None else []

    async def run() -> None:
        async with connect(*(broker or ["127.0.0.1:7001"]), **options) as client:
            if filters is not None:
                return await _sub_many(client, space, lines, durable, collapse, count)
            s = await client.subscribe(space, filter, durable=durable, collapse=collapse)
            n = 0
            async for e in s:
                sys.stdout.write(json.dumps(e) + "\n")
                sys.stdout.flush()
                n += 1
                if count and n >= count:
                    return

    try:
        asyncio.run(run())
    except FlowbusError as e:
        fail(str(e))
    except KeyboardInterrupt:
        pass


def _filter_lines(path: Path) -> list[tuple[int, str]]:
    """The filters of a ``--filters`` file (``-``: standard input), with their line numbers."""
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        fail(f"--filters {path}: {e}")
    found = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)]
    found = [(n, f) for n, f in found if f and not f.startswith("#")]
    if not found:
        fail(f"--filters {path}: no filter in it")
    return found


async def _sub_many(
    client: Client,
    space: str,
    lines: list[tuple[int, str]],
    durable: str | None,
    collapse: str | None,
    count: int,
) -> None:
    """Subscribe to ``space`` with each of ``lines``' filters in bulk; print what they take."""
    t0 = time.perf_counter()
    names = [f"{durable}-{n}" for n, _ in lines] if durable is not None else None
    subs = await client.subscribe_many(
        space, [f for _, f in lines], durable=names, collapse=collapse, merged=True
    )
    _say(f"{len(subs):,} subscriptions made in {time.perf_counter() - t0:.2f} s", stderr=True)
    line_of = {s.id: n for s, (n, _) in zip(subs, lines, strict=True)}
    taken = 0
    async for batch in client.merged():
        for s, e in batch:
            sys.stdout.write(json.dumps({"line": line_of[s.id], "event": e}) + "\n")
            taken += 1
            if count and taken >= count:
                sys.stdout.flush()
                return
        sys.stdout.flush()


@cluster_app.command("up")
def cluster_up(
    brokers: Annotated[int, typer.Option(min=1, max=32, help="How many brokers.")] = 3,
    port: Annotated[int, typer.Option(help="Port of the first broker; the others follow.")] = 7001,
    data: Annotated[Path | None, typer.Option(help="Parent directory of the brokers' stores.")] = None,
    config: Annotated[Path | None, typer.Option(help="YAML file: spaces, rule sets, limits.")] = None,
    flow: Annotated[
        list[Path] | None, typer.Option(help="A flow spec to deploy once the ring is up (repeatable).")
    ] = None,
    max_brokers: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=64,
            help="Start brokers up to this many when one is over its limit (load_limit, rate_limit).",
        ),
    ] = None,
    tls: TlsOption = None,
    user: UserOption = None,
    http: Annotated[
        str,
        typer.Option(help="HOST:PORT of the first broker's web console and /metrics, or off."),
    ] = "127.0.0.1:8080",
    stomp: Annotated[
        int | None,
        typer.Option(min=1, max=65535, help="STOMP port of the first broker; broker i's is PORT + i - 1."),
    ] = None,
) -> None:
    """Start a ring of brokers on 127.0.0.1, one process each; Ctrl-C stops them all."""
    from flowbus.broker.cluster import Cluster

    if max_brokers is not None and max_brokers < brokers:
        fail(f"--max-brokers: {max_brokers} is below --brokers {brokers}")
    if stomp is not None:
        stomps, ports = (
            range(stomp, stomp + (max_brokers or brokers)),
            range(port, port + (max_brokers or brokers)),
        )
        if stomps[-1] > 65535:
            fail(f"--stomp: broker {len(stomps)} would get port {stomps[-1]}, past 65535")
        if set(stomps) & set(ports):
            fail(f"--stomp: ports {stomps[0]}-{stomps[-1]} overlap the brokers' {ports[0]}-{ports[-1]}")
    options = client_options(tls, user, None)  # (for deploying --flow)
    cluster = Cluster(
        port=port,
        max_brokers=max_brokers or brokers,
        data=data,
        config=config,
        say=_say,
        tls=tls,
        http=None if http == "off" else http,
        stomp=stomp,
    )
    for sig in (signal.SIGINT, signal.SIGTERM):  # (SIGINT too: a script's background job
        signal.signal(sig, _interrupt)  # starts with it ignored, and Ctrl-C or kill -INT did nothing)
    try:
        for proc, address in zip(cluster.procs, cluster.start(brokers), strict=True):
            _say(f"broker {address} (pid {proc.pid})")
        hint = f" --tls {tls} --user NAME" if tls is not None else ""
        _say(f"{brokers} broker(s) up; try: flowbus sub stocks 'price > 100' --broker 127.0.0.1:{port}{hint}")
        if cluster.console_url:
            _say(f"console: {cluster.console_url}")
        if cluster.stomps:
            _say(f"STOMP: {', '.join(cluster.stomps)}")
        if flow:
            asyncio.run(_deploy_all(flow, f"127.0.0.1:{port}", options))
        cluster.serve()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM, at any point: stop the brokers
        pass
    except FlowbusError as e:
        fail(str(e))
    finally:
        cluster.stop()


async def _deploy_all(files: list[Path], broker: str, options: dict[str, Any]) -> None:
    """Deploy the flow specs at the first broker, once the ring has settled (the brokers it
    links to then each own a part of the flows' state)."""
    from flowbus.client import connect

    await asyncio.sleep(1.0)
    async with connect(broker, **options) as client:
        for f in files:
            info = await client.deploy(f)
            spaces = ", ".join(s["name"] for s in info["spaces"] if s["publishable"])
            _say(f"flow {info['name']} {info['version']} deployed; publish into {spaces}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
