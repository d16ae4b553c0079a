"""A sans-IO STOMP 1.2 frame codec: bytes in, frames out, and frames back to bytes.

Like h11 or wsproto, this module does no I/O: a driver (a broker's TCP listener, a
WebSocket endpoint, a client) reads bytes from its transport and hands them to
:meth:`FrameReader.feed`, which returns the events they complete, and writes what
:func:`encode` returns. It knows frames, not sessions: which frame may come when (CONNECT
first, a subscription id that exists, ...) is the driver's business.

Frames
======
A frame is a command line, header lines, an empty line, a body and a NUL octet; a line
ends with LF or CR LF::

    SEND
    destination:/queue/a
    content-length:5

    hello^@

* **Commands.** A :class:`FrameReader` for a ``"server"`` accepts the client commands
  (:data:`CLIENT_COMMANDS`: CONNECT, STOMP, SEND, SUBSCRIBE, UNSUBSCRIBE, ACK, NACK, BEGIN,
  COMMIT, ABORT, DISCONNECT), one for a ``"client"`` the server commands
  (:data:`SERVER_COMMANDS`: CONNECTED, MESSAGE, RECEIPT, ERROR); anything else is an error.
  Only SEND, MESSAGE and ERROR frames may have a body (:data:`BODY_COMMANDS`).
* **Headers** are UTF-8 ``name:value`` lines, split at the first colon (a colon in a value
  is accepted, as most brokers do), kept in order. A header may repeat: the first
  occurrence is the one that counts (:meth:`Frame.header`).
* **Escapes.** In header names and values ``\\r``, ``\\n``, ``\\c`` and ``\\\\`` stand for
  CR, LF, ``:`` and ``\\``; the reader decodes them, :func:`encode` writes them, and any
  other backslash sequence is an error. CONNECT and CONNECTED frames have no escapes (the
  spec keeps them readable by STOMP 1.0 peers): their headers are taken as they are.
* **Body.** With a ``content-length`` header the body is exactly that many octets (NULs
  included) and a NUL must follow them; without one the body runs to the first NUL.
* **Heart-beats.** An empty line between frames (LF or CR LF) is a heart-beat:
  :meth:`FrameReader.feed` reports it as a :class:`Heartbeat` so the driver can push its
  read deadline back. The EOLs the spec allows after a frame's NUL are reported the same
  way. :func:`negotiate_heartbeat` works out the periods from the CONNECT and CONNECTED
  ``heart-beat`` headers; :func:`negotiate_version` picks the version (1.1 or 1.2).

Limits
======
A :class:`FrameReader` refuses, as soon as it can tell and before buffering more than the
limit (plus one read's worth of input), a command line longer than ``max_command`` bytes
(default :data:`MAX_COMMAND`, 32), more than ``max_headers`` headers
(:data:`MAX_HEADERS`, 128), a header line longer than ``max_header_line`` bytes
(:data:`MAX_HEADER_LINE`, 16 KiB; EOLs not counted), and a body longer than ``max_body``
bytes (:data:`MAX_BODY`, 1 MiB), whether a ``content-length`` promises it (refused when
the header is read) or the NUL is not found within it.

Errors
======
Every error is a :class:`StompError` (a :class:`~flowbus.errors.FrameError`: a
:class:`~flowbus.errors.ProtocolError`) whose message says what was wrong. Nothing else
escapes :meth:`FrameReader.feed`, whatever the bytes. A reader error is fatal for the
connection, as the spec says: the driver sends an ERROR frame (:func:`error_frame`, with
the error's message) and closes. The events the failing ``feed`` completed before the bad
bytes are in the error's ``events``; afterwards the reader is broken and every ``feed``
raises :class:`StompError` again.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Final, Literal, TypeAlias

from flowbus.errors import FrameError

__all__ = [
    "BODY_COMMANDS",
    "CLIENT_COMMANDS",
    "MAX_BODY",
    "MAX_COMMAND",
    "MAX_HEADERS",
    "MAX_HEADER_LINE",
    "SERVER_COMMANDS",
    "VERSIONS",
    "Event",
    "Frame",
    "FrameReader",
    "Heartbeat",
    "StompError",
    "encode",
    "error_frame",
    "escaped",
    "negotiate_heartbeat",
    "negotiate_version",
    "parse_heartbeat",
    "receipt_frame",
]

CLIENT_COMMANDS: Final = frozenset(
    {"CONNECT", "STOMP", "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT", "ABORT"}
    | {"DISCONNECT"}
)
"""The frames a client sends."""

SERVER_COMMANDS: Final = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})
"""The frames a server sends."""

BODY_COMMANDS: Final = frozenset({"SEND", "MESSAGE", "ERROR"})
"""The frames that may have a body (all others must not)."""

VERSIONS: Final = ("1.1", "1.2")
"""The protocol versions this codec speaks, oldest first (1.0 has no header escapes)."""

MAX_COMMAND: Final = 32
"""The default limit on a command line, in bytes."""

MAX_HEADERS: Final = 128
"""The default limit on the number of headers of a frame."""

MAX_HEADER_LINE: Final = 16 * 1024
"""The default limit on a header line, in bytes (its EOL not counted)."""

MAX_BODY: Final = 1024 * 1024
"""The default limit on a frame body, in bytes."""

_UNESCAPED: Final = frozenset({"CONNECT", "CONNECTED"})
_ESCAPE_TABLE: Final = str.maketrans({"\\": "\\\\", "\r": "\\r", "\n": "\\n", ":": "\\c"})
_UNESCAPE: Final = {"\\": "\\", "r": "\r", "n": "\n", "c": ":"}
_ESCAPE_RE: Final = re.compile(r"\\(.?)", re.DOTALL)
_DIGITS: Final = re.compile(r"[0-9]+")
_HEARTBEAT_RE: Final = re.compile(r"([0-9]{1,10}),([0-9]{1,10})")


class StompError(FrameError):
    """A STOMP frame that cannot be read or written, or a malformed negotiation header. The
    message says what was wrong; on a connection, send an ERROR frame and close.

    ``events`` holds what :meth:`FrameReader.feed` completed before the bad bytes in the
    call that failed (empty elsewhere)."""

    def __init__(self, message: str, *, events: list[Event] | None = None) -> None:
        super().__init__(message)
        self.events: list[Event] = events if events is not None else []


@dataclasses.dataclass(slots=True)
class Frame:
    """One STOMP frame: a command, its headers in order (repeats allowed), its body."""

    command: str
    headers: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        """The value of the first header called ``name`` (the one that counts), or None."""
        return _first(self.headers, name)


@dataclasses.dataclass(frozen=True, slots=True)
class Heartbeat:
    """An empty line between frames: the peer is alive."""


Event: TypeAlias = Frame | Heartbeat
"""What :meth:`FrameReader.feed` returns."""


def _first(headers: list[tuple[str, str]], name: str) -> str | None:
    return next((v for n, v in headers if n == name), None)


def _short(data: bytes | str) -> str:
    text = repr(data)
    return text if len(text) <= 60 else text[:57] + "..."


class FrameReader:
    """Cut a STOMP byte stream into :class:`Frame` and :class:`Heartbeat` events, whatever
    the pieces it arrives in.

    ``side`` is the side this reader serves: a ``"server"`` reads client frames, a
    ``"client"`` server frames. ``feed`` returns the events completed so far and keeps any
    partial frame; a malformed or oversized frame raises :class:`StompError` (see the
    module docstring), after which every ``feed`` raises again."""

    __slots__ = (
        "_body_limit",
        "_buf",
        "_command",
        "_commands",
        "_error",
        "_headers",
        "_length",
        "_pos",
        "_scan",
        "_state",
        "max_body",
        "max_command",
        "max_header_line",
        "max_headers",
        "side",
    )

    def __init__(
        self,
        side: Literal["server", "client"] = "server",
        *,
        max_command: int = MAX_COMMAND,
        max_headers: int = MAX_HEADERS,
        max_header_line: int = MAX_HEADER_LINE,
        max_body: int = MAX_BODY,
    ) -> None:
        if side not in ("server", "client"):
            raise ValueError(f"side must be 'server' or 'client', got {side!r}")
        limits = {
            "max_command": max_command,
            "max_headers": max_headers,
            "max_header_line": max_header_line,
            "max_body": max_body,
        }
        for name, value in limits.items():
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        self.side = side
        self.max_command = max_command
        self.max_headers = max_headers
        self.max_header_line = max_header_line
        self.max_body = max_body
        self._commands = CLIENT_COMMANDS if side == "server" else SERVER_COMMANDS
        self._buf = bytearray()
        self._pos = 0  # where the next unread byte is in _buf
        self._scan = 0  # how far _buf was searched for the current line's LF or the body's NUL
        self._state: Literal["command", "headers", "body"] = "command"
        self._command = ""
        self._headers: list[tuple[str, str]] = []
        self._length: int | None = None  # the body's content-length
        self._body_limit = 0  # the longest body the current frame may have
        self._error: str | None = None

    def feed(self, data: bytes) -> list[Event]:
        """The events ``data`` completes, in order (partial input is kept for the next call)."""
        if self._error is not None:
            raise StompError(f"reader is broken by an earlier error: {self._error}")
        self._buf += data
        events: list[Event] = []
        try:
            while (event := self._next()) is not None:
                events.append(event)
        except StompError as e:
            self._error = str(e)
            self._buf.clear()
            e.events = events
            raise
        del self._buf[: self._pos]
        self._scan -= self._pos
        self._pos = 0
        return events

    # --------------------------------------------------------------------------------- parsing

    def _next(self) -> Event | None:
        """The next complete event in the buffer, or None if more input is needed."""
        if self._state == "command":
            line = self._line(self.max_command, "command line")
            if line is None:
                return None
            if not line:
                return Heartbeat()
            self._start(line)
        if self._state == "headers" and not self._read_headers():
            return None
        return self._read_body()

    def _line(self, limit: int, what: str) -> bytes | None:
        """The next line without its EOL, or None if it is not complete yet."""
        buf, pos = self._buf, self._pos
        lf = buf.find(b"\n", max(self._scan, pos), pos + limit + 2)  # (a CR may precede the LF)
        if lf < 0:
            if len(buf) - pos > limit + 1:
                raise StompError(f"{what} longer than {limit} bytes")
            self._scan = len(buf)
            return None
        line = bytes(buf[pos:lf])
        self._pos = self._scan = lf + 1
        if line.endswith(b"\r"):
            line = line[:-1]
        if len(line) > limit:
            raise StompError(f"{what} longer than {limit} bytes")
        return line

    def _start(self, line: bytes) -> None:
        command = line.decode("ascii", "replace")
        if command not in self._commands:
            if command in CLIENT_COMMANDS | SERVER_COMMANDS:
                raise StompError(f"a {self.side} does not accept {command} frames")
            raise StompError(f"unknown command {_short(line)}")
        self._command = command
        self._headers = []
        self._state = "headers"

    def _read_headers(self) -> bool:
        """Read header lines up to the empty one; False if more input is needed."""
        while (line := self._line(self.max_header_line, "header line")) is not None:
            if not line:
                self._end_headers()
                return True
            if len(self._headers) >= self.max_headers:
                raise StompError(f"{self._command} frame with more than {self.max_headers} headers")
            self._headers.append(self._header(line))
        return False

    def _header(self, line: bytes) -> tuple[str, str]:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            raise StompError(f"header line is not UTF-8: {_short(line)}") from None
        name, colon, value = text.partition(":")
        if not colon:
            raise StompError(f"header line without a colon: {_short(line)}")
        if "\r" in text:
            raise StompError(f"header line with a CR inside: {_short(line)}")
        if self._command not in _UNESCAPED:
            name, value = _unescape(name), _unescape(value)
        if not name:
            raise StompError(f"header line without a name: {_short(line)}")
        return name, value

    def _end_headers(self) -> None:
        limit = self._body_limit = self.max_body if self._command in BODY_COMMANDS else 0
        length = _first(self._headers, "content-length")
        self._length = None
        if length is not None:
            if not _DIGITS.fullmatch(length):
                raise StompError(f"bad content-length {_short(length)}")
            digits = length.lstrip("0")  # (int() refuses strings of over 4300 digits)
            if len(digits) > len(str(limit)) or int(digits or "0") > limit:
                if limit == 0:
                    raise StompError(f"a {self._command} frame has no body (content-length {length})")
                raise StompError(f"content-length {_short(length)} is over the limit of {limit} bytes")
            self._length = int(digits or "0")
        self._state = "body"

    def _read_body(self) -> Frame | None:
        buf, pos = self._buf, self._pos
        if self._length is not None:
            end = pos + self._length
            if len(buf) <= end:
                return None
            if buf[end] != 0:
                raise StompError(f"no NUL after the {self._length}-byte body (content-length)")
        else:
            limit = self._body_limit
            end = buf.find(b"\0", max(self._scan, pos), pos + limit + 1)
            if end < 0:
                if len(buf) - pos > limit:
                    if limit == 0:
                        raise StompError(f"a {self._command} frame has no body")
                    raise StompError(f"body without a NUL within the limit of {limit} bytes")
                self._scan = len(buf)
                return None
        frame = Frame(self._command, self._headers, bytes(buf[pos:end]))
        self._pos = self._scan = end + 1
        self._state = "command"
        return frame


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    return _ESCAPE_RE.sub(_unescape_one, text)


def _unescape_one(match: re.Match[str]) -> str:
    char = _UNESCAPE.get(match.group(1))
    if char is None:
        if not match.group(1):
            raise StompError("a header ends in a lone backslash")
        raise StompError(f"undefined escape {_short(match.group(0))} in a header")
    return char


# -------------------------------------------------------------------------------------- encoding


def escaped(value: str) -> bytes:
    """A header value as a frame carries it (STOMP's escapes, UTF-8): for a frame built from
    parts (a broker's MESSAGEs, whose headers but one stay the same) rather than by :func:`encode`."""
    return value.translate(_ESCAPE_TABLE).encode()


def encode(frame: Frame, *, escape: bool = True) -> bytes:
    """The bytes of ``frame``.

    Header names and values are escaped (but in CONNECT and CONNECTED frames, or with
    ``escape=False`` for a STOMP 1.0 peer: then a CR or LF, or a colon in a name, cannot be
    written). A non-empty body gets a ``content-length`` header (after the others) unless
    the frame has one, as the spec recommends: a body may then hold NULs. Raises
    :class:`StompError` for a frame that cannot be written: an unknown command, a body on a
    frame that has none, an empty or unwritable header name or value, a ``content-length``
    that is not the body's."""
    command = frame.command
    if command not in CLIENT_COMMANDS | SERVER_COMMANDS:
        raise StompError(f"cannot encode: unknown command {_short(command)}")
    if frame.body and command not in BODY_COMMANDS:
        raise StompError(f"cannot encode: a {command} frame has no body")
    headers = list(frame.headers)
    length = frame.header("content-length")
    if length is None:
        if frame.body:
            headers.append(("content-length", str(len(frame.body))))
    elif length != str(len(frame.body)):
        raise StompError(f"cannot encode: content-length {length!r} for a {len(frame.body)}-byte body")
    escaping = escape and command not in _UNESCAPED
    lines = [command]
    for name, value in headers:
        if not name:
            raise StompError(f"cannot encode: a header with an empty name in a {command} frame")
        if escaping:
            lines.append(f"{name.translate(_ESCAPE_TABLE)}:{value.translate(_ESCAPE_TABLE)}")
        elif ":" in name or any(c in s for s in (name, value) for c in "\r\n"):
            raise StompError(f"cannot encode {_short(name)}: {_short(value)} without escapes")
        else:
            lines.append(f"{name}:{value}")
    lines += ["", ""]
    try:
        head = "\n".join(lines).encode()
    except UnicodeEncodeError as e:
        raise StompError(f"cannot encode: {e}") from None
    return head + frame.body + b"\0"


def error_frame(message: str, *, receipt_id: str | None = None, detail: str = "") -> Frame:
    """An ERROR frame: ``message`` in its header, ``detail`` as a text/plain body, and the
    ``receipt-id`` of the frame that caused it, if that one asked for a receipt."""
    headers = [("message", message)]
    if receipt_id is not None:
        headers.append(("receipt-id", receipt_id))
    headers.append(("content-type", "text/plain"))
    return Frame("ERROR", headers, detail.encode())


def receipt_frame(receipt_id: str) -> Frame:
    """The RECEIPT frame for a frame whose ``receipt`` header was ``receipt_id``."""
    return Frame("RECEIPT", [("receipt-id", receipt_id)])


# ----------------------------------------------------------------------------------- negotiation


def parse_heartbeat(value: str) -> tuple[int, int]:
    """The two numbers of a ``heart-beat`` header (``"10000,5000"``): the shortest period,
    in ms, at which its sender can send heart-beats and the one it wants to receive them at
    (0: none). :class:`StompError` if it is not two non-negative integers and a comma."""
    match = _HEARTBEAT_RE.fullmatch(value)
    if match is None:
        raise StompError(f"bad heart-beat header {_short(value)}")
    return int(match.group(1)), int(match.group(2))


def negotiate_heartbeat(client: str | None, server: tuple[int, int]) -> tuple[int, int]:
    """The heart-beat periods of a connection, from the server's side: (every how many ms the
    server sends one, every how many ms it expects one), 0 meaning never.

    ``client`` is the CONNECT frame's ``heart-beat`` header (None if it has none: ``0,0``),
    ``server`` the server's own ``(sx, sy)``, as in its CONNECTED frame. Per the spec, the
    server sends every ``max(sx, cy)`` ms unless ``sx`` or ``cy`` is 0, and expects every
    ``max(cx, sy)`` ms unless ``cx`` or ``sy`` is 0 (a driver allows some slack on top).
    :class:`StompError` for a malformed ``client``; ``ValueError`` for a negative ``server``."""
    sx, sy = server
    if sx < 0 or sy < 0:
        raise ValueError(f"heart-beat periods must be >= 0, got {server}")
    cx, cy = parse_heartbeat(client) if client is not None else (0, 0)
    sends = max(sx, cy) if sx and cy else 0
    expects = max(cx, sy) if cx and sy else 0
    return sends, expects


def negotiate_version(accept_version: str | None) -> str | None:
    """The highest of :data:`VERSIONS` in a CONNECT frame's ``accept-version`` header
    (``"1.0,1.1,1.2"``; None, no header, means 1.0 only), or None if there is none: then the
    server sends an ERROR frame (with a ``version`` header listing its versions) and closes.
    Versions it does not know, well formed or not, are ignored."""
    offered = {v.strip() for v in accept_version.split(",")} if accept_version is not None else {"1.0"}
    return next((v for v in reversed(VERSIONS) if v in offered), None)
