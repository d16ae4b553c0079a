"""STOMP over WebSocket (RFC 6455): the console's ``ws://CONSOLE/stomp`` as a byte stream for
the STOMP door.

How it works: the console (:mod:`flowbus.broker.console`) reads the upgrade request with h11;
:func:`upgrade` checks it and accepts it with wsproto (a sans-IO WebSocket library, h11's
sibling: it takes over from h11 once the request is read). The connection is then a
:class:`WebSocketStream`, the reader and the writer the STOMP door serves
(:meth:`StompDoor.serve <flowbus.broker.stomp.StompDoor.serve>`) exactly as it serves a TCP
connection: the same CONNECT, session, rights, heart-beats and ERROR-then-close.

* **The handshake.** The client offers the subprotocols it speaks (``Sec-WebSocket-Protocol``);
  the first of them that is one of :data:`SUBPROTOCOLS` (``v12.stomp``, ``v11.stomp``) is
  accepted; none of them, or a request that is no WebSocket handshake (no key, a version
  other than 13), is refused (:class:`Refused`: the console answers it with an HTTP error).
  The STOMP version itself is agreed at CONNECT, as on TCP. No extension is taken (no
  ``permessage-deflate``: nothing is inflated for a peer).
* **Reading.** :meth:`WebSocketStream.read` returns the payload of the client's text and
  binary messages as one stream of bytes: message boundaries mean nothing to STOMP (a
  message may hold several frames, part of one, or a heart-beat's EOL alone), so the
  door's frame reader takes them as it takes TCP bytes. Pings are answered on the way. The
  end of the stream (``b""``) is the client's Close (answered), the TCP connection's end,
  or a WebSocket error: a malformed WebSocket frame closes with 1002 (text that is not
  UTF-8: 1007), a message longer than ``max_message`` (:data:`MAX_MESSAGE`: the door's
  largest body and room for its headers) with 1009.
* **Writing.** Each write is one text message (STOMP frames here are UTF-8: headers and JSON
  bodies); bytes that are not UTF-8 would go as one binary message.
* **Closing.** :meth:`WebSocketStream.close` (the session's end: DISCONNECT, an ERROR frame
  written before it that says why, the broker's end) sends Close 1000. After a Close of the
  broker's (1000, or 1002, 1007, 1009 above) what the client still sends is dropped until it
  answers; the TCP connection ends then, or :data:`CLOSE_WAIT` seconds later if it does not
  (closed at once with input unread, it would be reset, and the client could lose the Close).
  The client's own Close is answered and ends the connection at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import h11
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from flowbus.broker.sessions import READ_BYTES
from flowbus.net.admission import PRE_AUTH_FRAME
from flowbus.net.stomp import MAX_BODY

__all__ = [
    "CLOSE_WAIT",
    "MAX_MESSAGE",
    "SUBPROTOCOLS",
    "Refused",
    "WebSocketStream",
    "upgrade",
    "wants_upgrade",
]

SUBPROTOCOLS = ("v12.stomp", "v11.stomp")
"""The WebSocket subprotocols of STOMP the console accepts."""

MAX_MESSAGE = MAX_BODY + PRE_AUTH_FRAME
"""The longest WebSocket message taken, in bytes: the door's largest frame body and 64 KiB for
its command and headers."""

CLOSE_WAIT = 2.0
"""Seconds the broker waits for the client's answer to its Close before it ends the TCP
connection."""

_OPEN = (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING)  # (states in which we may still send)


class Refused(Exception):
    """An upgrade request the console answers with HTTP ``status`` (the message says why)."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def wants_upgrade(request: h11.Request) -> bool:
    """Whether ``request`` asks for a WebSocket (``Upgrade: websocket``)."""
    return any(
        name == b"upgrade" and b"websocket" in (token.strip().lower() for token in value.split(b","))
        for name, value in request.headers
    )


def upgrade(request: h11.Request) -> tuple[WSConnection, bytes]:
    """The WebSocket of a STOMP upgrade request (read by the console's h11), and the ``101``
    answer to write; :class:`Refused` if it is not a WebSocket handshake or offers none of
    :data:`SUBPROTOCOLS`."""
    ws = WSConnection(ConnectionType.SERVER)
    try:
        ws.initiate_upgrade_connection(list(request.headers), request.target)
    except RemoteProtocolError as e:
        hint = e.event_hint
        raise Refused(hint.status_code if isinstance(hint, RejectConnection) else 400, str(e)) from None
    asked = next(e for e in ws.events() if isinstance(e, Request))
    chosen = next((s for s in asked.subprotocols if s in SUBPROTOCOLS), None)
    if chosen is None:
        offered = ", ".join(asked.subprotocols) or "none"
        raise Refused(
            400,
            f"STOMP over WebSocket needs the subprotocol {' or '.join(SUBPROTOCOLS)} "
            f"(Sec-WebSocket-Protocol); the client offered {offered}",
        )
    return ws, ws.send(AcceptConnection(subprotocol=chosen))


class WebSocketStream:
    """An accepted WebSocket as the STOMP door's reader and writer (see the module note): the
    parts of :class:`asyncio.StreamReader` and :class:`asyncio.StreamWriter` the door and the
    sessions use (``read``; ``write``, ``close``, ``is_closing``, ``get_extra_info``,
    ``drain``). ``early``: what came after the upgrade request in the same read."""

    def __init__(
        self,
        ws: WSConnection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        early: bytes = b"",
        max_message: int = MAX_MESSAGE,
    ) -> None:
        self._ws = ws
        self._reader = reader
        self._writer = writer
        self.max_message = max_message
        self._data = bytearray()  # payload received and not read yet
        self._message = 0  # bytes of the message coming in, so far
        self._ended = False  # the stream's end: nothing more is read
        self._closing = False  # a Close is sent (or the TCP connection ended): nothing more is written
        self._broken = False  # a malformed frame: wsproto reads no more of the connection
        self._abort: asyncio.TimerHandle | None = None
        if early:
            self._receive(early)

    # -- the reader

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes of the client's messages (-1: what is there), waiting for some;
        ``b""`` at the end."""
        while not self._data and not self._ended:
            self._receive(await self._reader.read(READ_BYTES))
        n = len(self._data) if n < 0 else n
        out = bytes(self._data[:n])
        del self._data[:n]
        return out

    def _receive(self, data: bytes) -> None:
        """What ``data`` (TCP bytes; ``b""``: the end) brings: payload kept for :meth:`read`
        (until the end), pings answered, Closes sent and answered."""
        if self._broken and data:
            return  # (dropped: the Close is sent, the connection ends)
        try:
            self._ws.receive_data(data or None)
        except LocalProtocolError:  # (bytes after the closing handshake)
            self.abort()
            return
        for event in self._ws.events():
            if isinstance(event, TextMessage | BytesMessage):
                self._message_part(event.data.encode() if isinstance(event.data, str) else event.data)
                if event.message_finished:
                    self._message = 0
            elif isinstance(event, Ping):
                self._send(event.response())
            elif isinstance(event, CloseConnection):
                self._closed(event)

    def _message_part(self, payload: bytes | bytearray) -> None:
        self._message += len(payload)
        if self._message > self.max_message:
            self._close(CloseReason.MESSAGE_TOO_BIG, f"a message over {self.max_message} bytes")
        elif not self._ended:
            self._data += payload

    def _closed(self, event: CloseConnection) -> None:
        """A Close: the client's (answered: the handshake is done, the TCP connection ends),
        its answer to ours or the TCP connection's end (1006), or a malformed frame (the
        Close is ours: 1002, or 1007 for text that is not UTF-8)."""
        state = self._ws.state
        if state is ConnectionState.REMOTE_CLOSING:
            self._close(event.code, event.reason)
            self.abort()
        elif state is ConnectionState.CLOSED:
            self.abort()
        else:
            self._broken = True
            self._close(event.code, event.reason)

    # -- the writer

    def write(self, data: bytes) -> None:
        if self._closing or not data:
            return
        try:
            message: Event = TextMessage(data=data.decode())
        except UnicodeDecodeError:
            message = BytesMessage(data=data)
        self._send(message)

    def close(self, code: int = CloseReason.NORMAL_CLOSURE) -> None:
        """The STOMP connection ends: Close ``code`` (see :meth:`_close`)."""
        self._close(code, None)

    def is_closing(self) -> bool:
        return self._closing or self._writer.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._writer.get_extra_info(name, default)  # (the TCP connection's: peername, ...)

    async def drain(self) -> None:
        await self._writer.drain()

    # -- the end

    def _close(self, code: int, reason: str | None) -> None:
        """Send Close ``code`` unless a Close was sent: nothing more is read or written; the
        TCP connection ends when the client answers, or :data:`CLOSE_WAIT` seconds later."""
        self._ended = True
        if self._closing:
            return
        self._send(CloseConnection(code=code, reason=reason))
        self._closing = True
        self._abort = asyncio.get_running_loop().call_later(CLOSE_WAIT, self.abort)

    def abort(self) -> None:
        """End the TCP connection now."""
        self._ended = self._closing = True
        if self._abort is not None:
            self._abort.cancel()
            self._abort = None
        self._writer.close()

    async def finish(self) -> None:
        """After the STOMP connection: Close 1000 if no Close was sent, then what the client
        still sends dropped until it answers (or the TCP connection ends, or
        :data:`CLOSE_WAIT` passes): a connection closed with input unread would be reset, and
        the client could lose the Close and what came before it."""
        self.close()
        with contextlib.suppress(OSError):
            while not self._writer.is_closing():
                self._receive(await self._reader.read(READ_BYTES))
        self.abort()

    def _send(self, event: Event) -> None:
        if self._ws.state in _OPEN and not self._writer.is_closing():
            self._writer.write(self._ws.send(event))
