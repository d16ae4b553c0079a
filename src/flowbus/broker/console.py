"""The broker's web console: an HTTP/1.1 server in the broker's own event loop.

How it works (``flowbus broker start --http HOST:PORT``, ``flowbus cluster up --http``):

* **Pages** (:mod:`flowbus.broker.pages`, from the plain data of
  :mod:`flowbus.broker.status`): ``/`` the overview, ``/flows/NAME`` a deployed flow drawn
  before and after the rewrite with live counts per space, ``/ring`` this broker's view of
  the ring, ``/spaces`` the spaces and the subscriptions served here; ``/metrics`` the
  Prometheus text format (:mod:`flowbus.broker.metrics`); ``/api/state`` the JSON the pages
  poll. Only ``GET`` and ``HEAD``; anything else is answered ``405``, an unknown path ``404``.
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
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

import h11

from flowbus.broker import pages, status
from flowbus.broker.metrics import BrokerMetrics
from flowbus.errors import ConfigError

if TYPE_CHECKING:
    from flowbus.broker.view import BrokerView as Broker

__all__ = ["Console"]

log = logging.getLogger("flowbus.console")

HEADER_LIMIT = 16 * 1024
IDLE = 10.0  # seconds a connection may stay silent
REQUEST_TIME = 15.0  # seconds a request may take to arrive, from its first byte
MAX_CONNECTIONS = 64
HTML = "text/html; charset=utf-8"

Answer = tuple[int, str, bytes]  # status, content type, body


class Console:
    """The console of ``broker`` (see the module note); made by :meth:`start`."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.metrics = BrokerMetrics(broker)
        self.server: asyncio.Server | None = None
        self.host = ""
        self.port = 0
        self._drawn: dict[tuple[str, str], str] = {}  # (flow, version) -> its drawing
        self._connections: set[asyncio.StreamWriter] = set()

    @classmethod
    async def start(cls, broker: Broker, host: str, port: int) -> Console:
        """Serve the console of ``broker`` on ``host:port`` (0: any free port)."""
        console = cls(broker)
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
        page = {"/": pages.overview_page, "/ring": pages.ring_page, "/spaces": pages.spaces_page}.get(path)
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
        if close or (code >= 400 and code not in (404, 405)):
            headers.append(("connection", "close"))
        data = conn.send(h11.Response(status_code=code, headers=headers))
        data += conn.send(h11.Data(data=body)) if method != "HEAD" and body else b""
        data += conn.send(h11.EndOfMessage())
        writer.write(data)
