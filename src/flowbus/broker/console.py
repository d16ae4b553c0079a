"""The broker's web console: an HTTP/1.1 server in the broker's own event loop.

How it works (``flowbus broker start --http HOST:PORT``, ``flowbus cluster up --http``):

* **Pages** (:mod:`flowbus.broker.pages`, from the plain data of
  :mod:`flowbus.broker.status`): ``/`` the overview, ``/flows/NAME`` a deployed flow drawn
  before and after the rewrite with live counts per space, ``/ring`` this broker's view of
  the ring, ``/spaces`` the spaces and the subscriptions served here; ``/metrics`` the
  Prometheus text format (:mod:`flowbus.broker.metrics`); ``/api/state`` the JSON the pages
  poll; ``/live`` events of a space as they come, through a filter or a JMS selector (the
  page speaks STOMP over ``/stomp`` with stomp.js, served at ``/static/stomp.umd.min.js``:
  nothing is fetched from anywhere but the broker). Only ``GET`` and ``HEAD``; anything else
  is answered ``405``, an unknown path ``404``.
* **STOMP over WebSocket** (``ws://CONSOLE/stomp``, subprotocols ``v12.stomp`` and
  ``v11.stomp``). An upgrade request for ``/stomp`` is accepted with wsproto
  (:mod:`flowbus.broker.websocket`) and the connection handed to the broker's STOMP door
  (:meth:`StompDoor.serve <flowbus.broker.stomp.StompDoor.serve>`): a STOMP connection like
  one of the door's TCP port, same CONNECT, rights, heart-beats and errors. It works whenever
  the console runs: a broker without a STOMP listener (``--stomp``) gives the console a door
  of its own, with no port. An upgrade for another path is answered ``404``, one offering no
  STOMP subprotocol ``400``, a plain ``GET /stomp`` ``426``. Once upgraded, a connection is
  out of the HTTP rules below (its deadline, the cap of 64): the door's deadline for CONNECT
  and the heart-beats agreed then apply, and at most 256 WebSockets are open at once (more
  are answered ``503``). The console is plain HTTP: a token (``passcode``) crosses in clear,
  so the console listens where only trusted hosts reach it, or behind a TLS proxy.
* **Never in the way of routing.** The server is ``asyncio.start_server`` on the broker's
  loop; a handler reads the broker's state and formats it, with no wait and no long
  computation (a flow's drawing is made once per flow version and kept). The HTTP framing
  is h11's (a sans-IO HTTP/1.1 parser): a request line and headers over 16 KiB are refused
  (``431``), garbage is answered ``400``; a connection that sends nothing for 10 s, or takes
  more than 15 s over one request, is closed; at most 64 connections are served at once
  (more are closed at once). A request with a body is answered, then its connection closed.
* **A console bug never takes the broker down.** A page that fails is answered ``500``
  and logged; whatever happens on a connection ends with that connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, cast
from urllib.parse import unquote, urlsplit

import h11
from wsproto.frame_protocol import CloseReason

from flowbus.broker import pages, status
from flowbus.broker.metrics import BrokerMetrics
from flowbus.broker.websocket import Refused, WebSocketStream, upgrade, wants_upgrade
from flowbus.errors import ConfigError

if TYPE_CHECKING:
    from flowbus.broker.stomp import StompDoor
    from flowbus.broker.view import BrokerView as Broker

__all__ = ["Console"]

log = logging.getLogger("flowbus.console")

HEADER_LIMIT = 16 * 1024
IDLE = 10.0  # seconds a connection may stay silent
REQUEST_TIME = 15.0  # seconds a request may take to arrive, from its first byte
MAX_CONNECTIONS = 64
MAX_WEBSOCKETS = 256  # STOMP connections over WebSocket open at once (apart from the HTTP ones)
HTML = "text/html; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
STOMP_PATH = "/stomp"
STOMP_JS = "/static/stomp.umd.min.js"

Answer = tuple[int, str, bytes]  # status, content type, body


@cache
def _stomp_js() -> bytes:
    """stomp.js (@stomp/stompjs's UMD build, Apache-2.0: its notice heads the file), shipped
    with flowbus (broker/static)."""
    return resources.files("flowbus.broker").joinpath("static", "stomp.umd.min.js").read_bytes()


class Console:
    """The console of ``broker`` (see the module note), its WebSockets served by ``stomp``;
    made by :meth:`start`."""

    def __init__(self, broker: Broker, stomp: StompDoor) -> None:
        self.broker = broker
        self.stomp = stomp
        self.metrics = BrokerMetrics(broker)
        self.server: asyncio.Server | None = None
        self.host = ""
        self.port = 0
        self._drawn: dict[tuple[str, str], str] = {}  # (flow, version) -> its drawing
        self._connections: set[asyncio.StreamWriter] = set()  # (HTTP: the cap's)
        self._websockets: set[WebSocketStream] = set()

    @classmethod
    async def start(cls, broker: Broker, host: str, port: int, *, stomp: StompDoor) -> Console:
        """Serve the console of ``broker`` on ``host:port`` (0: any free port), its
        WebSockets by the STOMP door ``stomp``."""
        console = cls(broker, stomp)
        _stomp_js()  # (read once, now: a wheel without it fails here, not on a page)
        try:
            console.server = await asyncio.start_server(console._serve, host, port, limit=HEADER_LIMIT)
        except OSError as e:
            raise ConfigError(f"--http {host}:{port}: {e.strerror}") from None
        console.host, console.port = console.server.sockets[0].getsockname()[:2]
        console.metrics.attach()
        return console

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            for writer in list(self._connections):
                writer.close()
            for stream in list(self._websockets):
                stream.close(CloseReason.GOING_AWAY)
                stream.abort()
            await self.server.wait_closed()

    # -- what is served

    def answer(self, method: str, target: str) -> Answer:
        """The answer to ``method target`` (pure of I/O: the broker's state read, formatted)."""
        if method not in ("GET", "HEAD"):
            return 405, "text/plain; charset=utf-8", b"only GET and HEAD\n"
        path = unquote(urlsplit(target).path)
        b = self.broker
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", self.metrics.exposition()
        if path == "/api/state":
            return 200, "application/json", json.dumps(status.state(b, self.metrics)).encode()
        if path.startswith("/flows/"):
            return self._flow(path.removeprefix("/flows/"))
        if path == STOMP_JS:
            return 200, "text/javascript; charset=utf-8", _stomp_js()
        if path == STOMP_PATH:  # (without an upgrade: see _websocket)
            what = f"STOMP over WebSocket: ws://HOST:PORT{STOMP_PATH}, subprotocol v12.stomp or v11.stomp\n"
            return 426, TEXT, what.encode()
        page = {
            "/": pages.overview_page,
            "/ring": pages.ring_page,
            "/spaces": pages.spaces_page,
            "/live": pages.live_page,
        }.get(path)
        if page is None:
            return 404, HTML, pages.not_found(b.address, f"No page at {path}.").encode()
        return 200, HTML, page(status.state(b, self.metrics)).encode()

    def _flow(self, name: str) -> Answer:
        core_flows = self.broker.spaces.flows
        d = core_flows.deployments.get(name) if core_flows is not None else None
        if d is None:
            known = ", ".join(sorted(core_flows.deployments)) if core_flows is not None else ""
            what = f"No flow {name!r} is deployed (deployed: {known or 'none'})."
            return 404, HTML, pages.not_found(self.broker.address, what).encode()
        drawn = self._drawn.get((d.name, d.version))
        if drawn is None:
            drawn = self._drawn[(d.name, d.version)] = pages.flow_drawing(d)
        return 200, HTML, pages.flow_page(self.broker.address, d, drawn).encode()

    # -- HTTP

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= MAX_CONNECTIONS:
            writer.close()
            return
        self._connections.add(writer)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=HEADER_LIMIT)
        try:
            await self._requests(conn, reader, writer)
        except h11.RemoteProtocolError as e:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                code = e.error_status_hint
                answer = (code, "text/plain; charset=utf-8", f"{code}: {e}\n".encode())
                self._send(conn, writer, "GET", answer, close=True)
        except (TimeoutError, ConnectionError, h11.LocalProtocolError):
            pass
        except asyncio.CancelledError:  # (the broker's end, a WebSocket open: Python 3.11's
            pass  # asyncio.start_server logs a handler that ends cancelled as an error)
        except Exception:  # a bug of the console: this connection ends, the broker goes on
            log.exception("console: a connection failed")
        finally:
            self._connections.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _requests(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            event = await self._next(conn, reader)
            if not isinstance(event, h11.Request):
                return  # (the client closed the connection)
            bodyless = isinstance(conn.next_event(), h11.EndOfMessage)  # (a body is not read)
            method = event.method.decode("ascii", "replace")
            target = event.target.decode("ascii", "replace")
            if bodyless and method == "GET" and wants_upgrade(event):
                await self._websocket(conn, event, reader, writer)
                return
            try:
                answer = self.answer(method, target)
            except Exception:
                log.exception("console: %s %s failed", method, target)
                answer = 500, "text/plain; charset=utf-8", b"the console failed here (see the broker's log)\n"
            self._send(conn, writer, method, answer, close=not bodyless)
            await asyncio.wait_for(writer.drain(), IDLE)
            if not bodyless or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    async def _websocket(
        self,
        conn: h11.Connection,
        request: h11.Request,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """A WebSocket upgrade request: for ``/stomp``, a STOMP connection of the door until
        it ends (see the module note); else refused, with an HTTP error saying why."""
        path = unquote(urlsplit(request.target.decode("ascii", "replace")).path)
        try:
            if path != STOMP_PATH:
                raise Refused(404, f"no WebSocket at {path}: STOMP over WebSocket is at {STOMP_PATH}")
            if len(self._websockets) >= MAX_WEBSOCKETS:
                raise Refused(503, f"{MAX_WEBSOCKETS} WebSockets are open already")
            ws, accepted = upgrade(request)
        except Refused as e:
            self._send(conn, writer, "GET", (e.status, TEXT, f"{e.status}: {e}\n".encode()), close=True)
            return
        writer.write(accepted)
        stream = WebSocketStream(ws, reader, writer, early=conn.trailing_data[0])
        self._connections.discard(writer)  # (out of the HTTP cap and deadlines: the door's rules now)
        self._websockets.add(stream)
        try:  # (the stream has what the door and the sessions use of a reader and a writer)
            await self.stomp.serve(cast(asyncio.StreamReader, stream), cast(asyncio.StreamWriter, stream))
            await stream.finish()
        finally:
            self._websockets.discard(stream)
            stream.abort()

    async def _next(self, conn: h11.Connection, reader: asyncio.StreamReader) -> object:
        """The next request (or the end of the connection), within the time allowed."""
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            wait = IDLE if deadline is None else min(IDLE, deadline - loop.time())
            if wait <= 0:
                raise TimeoutError
            data = await asyncio.wait_for(reader.read(HEADER_LIMIT), wait)
            if deadline is None:
                deadline = loop.time() + REQUEST_TIME
            conn.receive_data(data)

    @staticmethod
    def _send(
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        method: str,
        answer: Answer,
        *,
        close: bool = False,
    ) -> None:
        code, ctype, body = answer
        headers = [
            ("content-type", ctype),
            ("content-length", str(len(body))),
            ("cache-control", "no-store"),
        ]
        if code == 426:  # (Upgrade Required: to what)
            headers.append(("upgrade", "websocket"))
        if close or (code >= 400 and code not in (404, 405)):
            headers.append(("connection", "close"))
        data = conn.send(h11.Response(status_code=code, headers=headers))
        data += conn.send(h11.Data(data=body)) if method != "HEAD" and body else b""
        data += conn.send(h11.EndOfMessage())
        writer.write(data)
