"""Who gets in: a listening socket's connections admitted one by one, with TLS if asked.

How it works (the runtime's listener, :class:`Gate`; its settings, :class:`Admission`):

* **Accepting.** One task accepts connections on the bound socket. A source address that
  has ``per_address`` connections open already is closed at once (counted in ``refused``):
  a cap, so one host cannot use up the broker's descriptors and memory.
* **TLS or not.** With a TLS context, the gate peeks at the first byte without taking it.
  A TLS handshake starts with ``0x16``: the connection is wrapped in TLS (the handshake
  within ``handshake_timeout``). Anything else is plain text: taken as plain if
  ``plain_peers`` allows, else closed with a line in the log (no traceback). A handshake
  that fails (a certificate not signed by the authority, garbage after ``0x16``) is one log
  line too.
* **The deadline.** A connection that sends nothing is closed after ``handshake_timeout``;
  the runtime applies the same deadline to the first frame, and ``pre_auth_frame`` (64 KiB)
  to its length: nothing big is buffered for a peer before it said who it is.
* The handler gets the streams and whether they are TLS; the peer's verified certificate is
  ``writer.get_extra_info("peercert")``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["PRE_AUTH_FRAME", "Admission", "Gate"]

log = logging.getLogger("flowbus.net")

PRE_AUTH_FRAME = 64 * 1024
"""The largest frame a connection may send before it is authenticated."""

_TLS_HANDSHAKE = 0x16

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bool], Awaitable[None]]


@dataclass(frozen=True)
class Admission:
    """How a runtime's listener admits connections (see the module note). ``tls``: the
    server context (None: plain TCP); ``peer_tls``: the context it dials peers with."""

    tls: ssl.SSLContext | None = None
    peer_tls: ssl.SSLContext | None = None
    plain_peers: bool = False
    handshake_timeout: float = 10.0
    pre_auth_frame: int = PRE_AUTH_FRAME
    per_address: int | None = None


class Gate:
    """Accepts connections on a bound socket and hands each admitted one to ``handler``."""

    def __init__(self, admission: Admission, handler: Handler) -> None:
        self.admission = admission
        self.handler = handler
        self.refused = 0  # connections closed at the door (cap, plain text, failed handshake)
        self._open: Counter[str] = Counter()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sock: socket.socket | None = None

    def start(self, sock: socket.socket) -> None:
        sock.listen(128)
        sock.setblocking(False)
        self._sock = sock
        self._spawn(self._accept(sock))

    async def close(self) -> None:
        """Stop accepting and end every admitted connection; the socket closes last (the
        pending accept leaves the event loop with its cancellation, so a new socket that
        reuses the descriptor's number is not mistaken for it)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._sock is not None:
            self._sock.close()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await _accept_one(loop, sock)
            except OSError:
                if sock.fileno() < 0:
                    return  # closed
                await asyncio.sleep(0.1)  # out of descriptors, say: try again
                continue
            host = str(peer[0])
            cap = self.admission.per_address
            if cap is not None and self._open[host] >= cap:
                self.refused += 1
                log.warning("connection from %s refused: %d open from that address already", host, cap)
                conn.close()
                continue
            self._open[host] += 1
            self._spawn(self._admit(conn, host))

    async def _admit(self, conn: socket.socket, host: str) -> None:
        writer: asyncio.StreamWriter | None = None
        try:
            use_tls = await asyncio.wait_for(self._tls_or_plain(conn), self.admission.handshake_timeout)
            if use_tls is None:
                self.refused += 1
                log.info("plain text from %s on a TLS port: closed", host)
                return
            reader, writer = await _streams(conn, self.admission, use_tls)
            await self.handler(reader, writer, use_tls)
        except TimeoutError:
            self.refused += 1
            log.info(
                "connection from %s closed: no handshake in %.1f s", host, self.admission.handshake_timeout
            )
        except (OSError, ssl.SSLError, ConnectionError) as e:  # (an SSLError is an OSError)
            self.refused += 1
            log.info("connection from %s closed at the handshake: %s", host, e)
        finally:
            self._open[host] -= 1
            if self._open[host] <= 0:
                del self._open[host]
            if writer is not None:
                writer.close()
            else:
                conn.close()

    async def _tls_or_plain(self, conn: socket.socket) -> bool | None:
        """False: plain TCP; True: TLS; None: plain text where only TLS is taken."""
        if self.admission.tls is None:
            return False
        first = await _peek(conn)
        if not first:
            raise ConnectionError("closed before the first byte")
        if first[0] == _TLS_HANDSHAKE:
            return True
        return False if self.admission.plain_peers else None


async def _peek(conn: socket.socket) -> bytes:
    """The first byte ``conn`` receives, left in the socket."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    fd = conn.fileno()

    def readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await ready
    finally:
        loop.remove_reader(fd)
    return conn.recv(1, socket.MSG_PEEK)


async def _accept_one(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> tuple[socket.socket, Any]:
    """The next connection on the listening ``sock`` (non-blocking). Not ``loop.sock_accept``:
    on Python 3.11 a connection that arrives as its waiter is cancelled (a broker found dead
    starts again, and closes its gate) is accepted into the cancelled future, an
    ``InvalidStateError`` logged with its traceback, and the connection leaked."""
    while True:
        try:
            conn, peer = sock.accept()
        except (BlockingIOError, InterruptedError):
            pass
        else:
            conn.setblocking(False)
            return conn, peer
        fd = sock.fileno()
        if fd < 0:
            raise OSError("the listening socket is closed")
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _wake, ready)
        try:
            await ready
        finally:
            loop.remove_reader(fd)


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():  # (cancelled meanwhile: nothing to tell)
        ready.set_result(None)


async def _streams(
    conn: socket.socket, admission: Admission, use_tls: bool
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    protocol = asyncio.StreamReaderProtocol(reader)
    transport, _ = await loop.connect_accepted_socket(
        lambda: protocol,
        conn,
        ssl=admission.tls if use_tls else None,
        ssl_handshake_timeout=admission.handshake_timeout if use_tls else None,
    )
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)
