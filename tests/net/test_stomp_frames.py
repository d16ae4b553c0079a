"""The STOMP 1.2 frame codec: frames round-trip through any split of the stream, escapes,
content-length bodies, heart-beats, limits, negotiation, and garbage only ever raises
StompError."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flowbus.errors import FrameError, ProtocolError
from flowbus.net.stomp import (
    BODY_COMMANDS,
    CLIENT_COMMANDS,
    MAX_BODY,
    MAX_COMMAND,
    MAX_HEADER_LINE,
    MAX_HEADERS,
    SERVER_COMMANDS,
    Event,
    Frame,
    FrameReader,
    Heartbeat,
    StompError,
    encode,
    error_frame,
    negotiate_heartbeat,
    negotiate_version,
    parse_heartbeat,
    receipt_frame,
)

HB = Heartbeat()

# A stream of everything at once: heart-beats (LF and CR LF) before, between and after frames,
# CR LF lines, escapes, a content-length body holding NULs, a NUL-terminated body, repeats.
STREAM = (
    b"\n\r\n"
    b"CONNECT\r\naccept-version:1.2\r\nhost:a\\tb\r\n\r\n\0"
    b"\n"
    b"SEND\ndestination:/q/a\\cb\\n\\r\\\\\ncontent-length:4\n\n\0ab\0\0\r\n\n"
    b"SEND\ndestination:x\ndestination:y\n\nhello\0"
    b"SUBSCRIBE\r\nid:1\r\ndestination:/t\r\n\r\n\0"
    b"DISCONNECT\nreceipt:77\n\n\0\n"
)
STREAM_EVENTS: list[Event] = [
    HB,
    HB,
    Frame("CONNECT", [("accept-version", "1.2"), ("host", "a\\tb")]),
    HB,
    Frame("SEND", [("destination", "/q/a:b\n\r\\"), ("content-length", "4")], b"\0ab\0"),
    HB,
    HB,
    Frame("SEND", [("destination", "x"), ("destination", "y")], b"hello"),
    Frame("SUBSCRIBE", [("id", "1"), ("destination", "/t")]),
    Frame("DISCONNECT", [("receipt", "77")]),
    HB,
]


def _feed_pieces(reader: FrameReader, pieces: list[bytes]) -> list[Event]:
    out: list[Event] = []
    for piece in pieces:
        out += reader.feed(piece)
    return out


def _error(data: bytes, **kw: int) -> str:
    """The message of the StompError that ``data`` raises in a fresh server-side reader."""
    with pytest.raises(StompError) as info:
        FrameReader(**kw).feed(data)  # type: ignore[arg-type]
    return str(info.value)


# ------------------------------------------------------------------------------------- streams


def test_stream_in_one_piece() -> None:
    assert FrameReader().feed(STREAM) == STREAM_EVENTS


def test_stream_at_every_split_point() -> None:
    for i in range(len(STREAM) + 1):
        assert _feed_pieces(FrameReader(), [STREAM[:i], STREAM[i:]]) == STREAM_EVENTS, i


def test_stream_at_every_pair_of_split_points() -> None:
    for i, j in itertools.combinations(range(0, len(STREAM) + 1, 3), 2):
        pieces = [STREAM[:i], STREAM[i:j], STREAM[j:]]
        assert _feed_pieces(FrameReader(), pieces) == STREAM_EVENTS, (i, j)


def test_stream_byte_by_byte() -> None:
    reader = FrameReader()
    assert _feed_pieces(reader, [STREAM[i : i + 1] for i in range(len(STREAM))]) == STREAM_EVENTS


def test_partial_input_returns_nothing_yet() -> None:
    reader = FrameReader()
    assert reader.feed(b"SEND\ndestination:/q\n\nhel") == []
    assert reader.feed(b"lo") == []
    assert reader.feed(b"\0\r") == [Frame("SEND", [("destination", "/q")], b"hello")]
    assert reader.feed(b"\n") == [HB]


# ----------------------------------------------------------------------------------- round trip

_TRICKY = st.text(alphabet="\\:\r\n\0ab é", max_size=8)
_TEXT = st.one_of(st.text(max_size=8), _TRICKY)
_RAW = st.text(max_size=8).filter(lambda s: "\r" not in s and "\n" not in s)


@st.composite
def _frames(draw: st.DrawFn, commands: frozenset[str]) -> Frame:
    command = draw(st.sampled_from(sorted(commands)))
    if command in ("CONNECT", "CONNECTED"):  # (no escapes: no CR or LF, no colon in a name)
        names, values = _RAW.filter(lambda s: s != "" and ":" not in s), _RAW
    else:
        names, values = _TEXT.filter(bool), _TEXT
    names = names.filter(lambda s: s != "content-length")
    headers = draw(st.lists(st.tuples(names, values), max_size=5))
    body = draw(st.binary(max_size=40)) if command in BODY_COMMANDS else b""
    if body and draw(st.booleans()):
        headers.insert(draw(st.integers(0, len(headers))), ("content-length", str(len(body))))
    return Frame(command, headers, body)


def _as_read(frame: Frame) -> Frame:
    """``frame`` as a reader returns it: encode adds a content-length to a body that has none."""
    if frame.body and frame.header("content-length") is None:
        return Frame(frame.command, [*frame.headers, ("content-length", str(len(frame.body)))], frame.body)
    return frame


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["server", "client"]).flatmap(
        lambda side: st.tuples(
            st.just(side),
            st.lists(_frames(CLIENT_COMMANDS if side == "server" else SERVER_COMMANDS), max_size=4),
            st.lists(st.sampled_from([b"", b"\n", b"\r\n", b"\n\n"]), min_size=5, max_size=5),
        )
    ),
    st.lists(st.integers(0, 2000), max_size=6),
)
def test_round_trip_in_any_pieces(case: tuple[str, list[Frame], list[bytes]], cuts: list[int]) -> None:
    side, frames, eols = case
    stream = b"".join(eol + encode(f) for f, eol in zip(frames, eols, strict=False))
    expected = [_as_read(f) for f in frames]
    points = sorted({c % (len(stream) + 1) for c in cuts})
    pieces = [stream[a:b] for a, b in itertools.pairwise([0, *points, len(stream)])]
    for feed in ([stream], pieces, [stream[i : i + 1] for i in range(len(stream))]):
        got = _feed_pieces(FrameReader(side), feed)  # type: ignore[arg-type]
        assert [e for e in got if isinstance(e, Frame)] == expected
        assert len(got) - len(expected) == sum(e.count(b"\n") for e in eols[: len(frames)])


# -------------------------------------------------------------------------------------- escapes


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        (b"a\\cb", "a:b"),
        (b"\\n\\r", "\n\r"),
        (b"\\\\", "\\"),
        (b"\\\\n", "\\n"),
        (b"\\\\\\c", "\\:"),
        (b"a:b", "a:b"),  # (a raw colon in a value is taken as it is)
        (b"", ""),
    ],
)
def test_escapes_decode(raw: bytes, value: str) -> None:
    [frame] = FrameReader().feed(b"SEND\nh\\c" + b":" + raw + b"\n\n\0")
    assert isinstance(frame, Frame)
    assert frame.headers == [("h:", value)]


def test_escapes_encode() -> None:
    frame = Frame("SEND", [("a:b\\", "x\ny\rz:\\")])
    assert encode(frame) == b"SEND\na\\cb\\\\:x\\ny\\rz\\c\\\\\n\n\0"


def test_connect_and_connected_are_not_escaped() -> None:
    connect = b"CONNECT\nlogin:a\\cb\\\\\npasscode:p:q\\t\n\n\0"
    assert FrameReader().feed(connect) == [Frame("CONNECT", [("login", "a\\cb\\\\"), ("passcode", "p:q\\t")])]
    assert encode(Frame("CONNECT", [("login", "a\\cb\\\\"), ("passcode", "p:q\\t")])) == connect
    connected = b"CONNECTED\nserver:x\\y\n\n\0"
    assert FrameReader("client").feed(connected) == [Frame("CONNECTED", [("server", "x\\y")])]
    assert encode(Frame("CONNECTED", [("server", "x\\y")])) == connected


def test_stomp_frame_is_escaped() -> None:
    """STOMP is CONNECT's other name, but only CONNECT and CONNECTED are exempt from escapes."""
    assert FrameReader().feed(b"STOMP\nhost:a\\cb\n\n\0") == [Frame("STOMP", [("host", "a:b")])]


@pytest.mark.parametrize(
    "line",
    [b"h:a\\tb", b"h:\\x", b"h:a\\", b"h\\t:v", b"h:\\C", b"h:\\\\\\"],
)
def test_bad_escape_is_an_error(line: bytes) -> None:
    message = _error(b"SEND\n" + line + b"\n\n\0")
    assert "escape" in message or "lone backslash" in message


def test_encode_without_escapes() -> None:
    frame = Frame("SEND", [("a", "b:c\\d")])
    assert encode(frame, escape=False) == b"SEND\na:b:c\\d\n\n\0"
    with pytest.raises(StompError, match="without escapes"):
        encode(Frame("SEND", [("a", "b\nc")]), escape=False)
    with pytest.raises(StompError, match="without escapes"):
        encode(Frame("SEND", [("a:b", "c")]), escape=False)
    with pytest.raises(StompError, match="without escapes"):
        encode(Frame("CONNECT", [("host", "a\rb")]))


# ------------------------------------------------------------------------------- content-length


def test_content_length_body_holds_nuls() -> None:
    [frame] = FrameReader().feed(b"SEND\ncontent-length:5\n\n\0\0x\0\0\0")
    assert isinstance(frame, Frame)
    assert frame.body == b"\0\0x\0\0"


def test_content_length_zero() -> None:
    assert FrameReader().feed(b"SUBSCRIBE\nid:1\ncontent-length:0\n\n\0") == [
        Frame("SUBSCRIBE", [("id", "1"), ("content-length", "0")])
    ]


def test_missing_nul_after_content_length_body() -> None:
    assert "no NUL" in _error(b"SEND\ncontent-length:3\n\nabcd\0")
    reader = FrameReader()
    assert reader.feed(b"SEND\ncontent-length:3\n\nabc") == []  # (the NUL may still come)
    with pytest.raises(StompError, match="no NUL"):
        reader.feed(b"\n")


def test_repeated_content_length_first_wins() -> None:
    [frame] = FrameReader().feed(b"SEND\ncontent-length:3\ncontent-length:5\n\na\0b\0")
    assert isinstance(frame, Frame)
    assert frame.body == b"a\0b"
    assert frame.header("content-length") == "3"


@pytest.mark.parametrize(
    "value",
    ["-1", "abc", "", " 3", "3 ", "+3", "1e3", "0x10", "٣", "9" * 50, "0" * 5000 + "9" * 8],
)
def test_bad_content_length(value: str) -> None:
    message = _error(f"SEND\ncontent-length:{value}\n\nxyz\0".encode())
    assert "content-length" in message


def test_content_length_with_leading_zeros() -> None:
    [frame] = FrameReader().feed(b"SEND\ncontent-length:" + b"0" * 5000 + b"3\n\nabc\0")
    assert isinstance(frame, Frame)
    assert frame.body == b"abc"


def test_encode_adds_content_length_to_bodies() -> None:
    assert encode(Frame("SEND", [("destination", "d")], b"a\0b")) == (
        b"SEND\ndestination:d\ncontent-length:3\n\na\0b\0"
    )
    assert encode(Frame("SEND", [("destination", "d")])) == b"SEND\ndestination:d\n\n\0"
    given_length = Frame("MESSAGE", [("content-length", "2"), ("x", "y")], b"ab")
    assert encode(given_length) == b"MESSAGE\ncontent-length:2\nx:y\n\nab\0"


# --------------------------------------------------------------------------------------- limits


def test_defaults() -> None:
    reader = FrameReader()
    assert reader.side == "server"
    assert (reader.max_command, reader.max_headers, reader.max_header_line, reader.max_body) == (
        MAX_COMMAND,
        MAX_HEADERS,
        MAX_HEADER_LINE,
        MAX_BODY,
    )
    assert MAX_BODY >= 1024 * 1024


@pytest.mark.parametrize("with_length", [True, False])
def test_a_one_megabyte_body_is_accepted_by_default(with_length: bool) -> None:
    body = bytes(range(1, 256)) * (MAX_BODY // 255) + b"x" * (MAX_BODY % 255)
    assert len(body) == MAX_BODY
    frame = Frame("SEND", [("destination", "/q")], body)
    data = encode(frame) if with_length else b"SEND\ndestination:/q\n\n" + body + b"\0"
    reader = FrameReader()
    got: list[Event] = []
    for i in range(0, len(data), 65536):
        got += reader.feed(data[i : i + 65536])
    assert got == [_as_read(frame) if with_length else frame]


def test_a_promised_oversized_body_is_refused_at_the_header() -> None:
    reader = FrameReader()
    assert reader.feed(b"SEND\ndestination:/q\n") == []
    with pytest.raises(StompError, match="over the limit"):
        reader.feed(b"content-length:100000000\n\n")  # (not a byte of the body yet)
    assert "over the limit" in _error(f"SEND\ncontent-length:{MAX_BODY + 1}\n\n".encode())
    assert "over the limit" in _error(b"SEND\ncontent-length:11\n\n", max_body=10)
    assert FrameReader(max_body=10).feed(b"SEND\ncontent-length:10\n\n0123456789\0") != []


def test_a_body_without_nul_is_refused_past_the_limit() -> None:
    reader = FrameReader(max_body=10)
    assert reader.feed(b"SEND\n\n0123456789") == []  # (at the limit: the NUL may come)
    with pytest.raises(StompError, match="limit of 10"):
        reader.feed(b"x")
    reader = FrameReader()
    assert reader.feed(b"SEND\n\n" + b"x" * MAX_BODY) == []
    with pytest.raises(StompError, match="limit"):
        reader.feed(b"x")


def test_body_on_a_bodyless_frame() -> None:
    assert "no body" in _error(b"SUBSCRIBE\nid:1\n\nx\0")
    assert "no body" in _error(b"SUBSCRIBE\nid:1\ncontent-length:1\n\nx\0")
    assert "no body" in _error(b"SUBSCRIBE\nid:1\n\nx")  # (said before any NUL arrives)


def test_too_many_headers() -> None:
    assert FrameReader(max_headers=3).feed(b"SEND\na:1\nb:2\nc:3\n\n\0") != []
    assert "more than 3 headers" in _error(b"SEND\na:1\nb:2\nc:3\nd:4\n", max_headers=3)
    many = b"".join(b"h%d:v\n" % i for i in range(MAX_HEADERS + 1))
    assert "headers" in _error(b"SEND\n" + many)


def test_too_long_a_header_line() -> None:
    ok = b"h:" + b"v" * 8
    assert FrameReader(max_header_line=10).feed(b"SEND\n" + ok + b"\r\n\n\0") != []
    assert "header line longer than 10" in _error(b"SEND\n" + ok + b"v\n", max_header_line=10)
    # Refused before the line ends: no unbounded buffering.
    assert "header line longer" in _error(b"SEND\n" + b"h:" + b"v" * MAX_HEADER_LINE)


def test_too_long_a_command() -> None:
    assert "command line longer than" in _error(b"SEND" * 10)  # (no LF needed to tell)
    assert "command line longer than 3" in _error(b"SEND\n\n\0", max_command=3)
    assert FrameReader(max_command=4).feed(b"SEND\r\n\n\0") == [Frame("SEND")]


def test_bad_limits() -> None:
    with pytest.raises(ValueError, match="max_body"):
        FrameReader(max_body=-1)
    with pytest.raises(ValueError, match="side"):
        FrameReader("broker")  # type: ignore[arg-type]


# -------------------------------------------------------------------------------------- garbage


@pytest.mark.parametrize(
    ("data", "what"),
    [
        (b"SEND\nno colon\n\n\0", "without a colon"),
        (b"SEND\n:v\n\n\0", "without a name"),
        (b"SEND\nh:\xff\xfe\n\n\0", "not UTF-8"),
        (b"SEND\nh:a\rb\n\n\0", "CR inside"),
        (b"BOGUS\n\n\0", "unknown command"),
        (b"send\n\n\0", "unknown command"),
        (b"\0\n", "unknown command"),
        (b"\xff\xfe\n", "unknown command"),
        (b" SEND\n\n\0", "unknown command"),
        (b"MESSAGE\n\n\0", "does not accept MESSAGE"),
    ],
)
def test_malformed_frames(data: bytes, what: str) -> None:
    assert what in _error(data)


def test_after_an_error_the_reader_is_broken() -> None:
    reader = FrameReader()
    good = b"SEND\n\nok\0\n"
    with pytest.raises(StompError) as info:
        reader.feed(good + b"BOGUS\n")
    assert info.value.events == [Frame("SEND", [], b"ok"), HB]  # (what came before the error)
    for data in (b"", good):
        with pytest.raises(StompError, match="broken by an earlier error: unknown command"):
            reader.feed(data)


def test_error_class() -> None:
    assert issubclass(StompError, FrameError)
    assert issubclass(StompError, ProtocolError)


def _fuzz(data: bytes, pieces: list[bytes]) -> None:
    for feed in ([data], pieces):
        reader = FrameReader(max_body=64, max_header_line=64, max_headers=4)
        try:
            for piece in feed:
                assert all(isinstance(e, Frame | Heartbeat) for e in reader.feed(piece))
        except StompError:
            with pytest.raises(StompError):
                reader.feed(b"\n")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 300))
def test_fuzz_random_bytes(data: bytes, cut: int) -> None:
    _fuzz(data, [data[:cut], data[cut:]])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from([b"SEND", b"CONNECT", b"ACK", b"\n", b"\r", b"\0", b":", b"\\", b"\\c", b"\\t"])
        | st.sampled_from([b"content-length:", b"content-length:3", b"h:v"])
        | st.binary(max_size=4),
        max_size=40,
    ),
    st.integers(0, 300),
)
def test_fuzz_frame_like_bytes(chunks: list[bytes], cut: int) -> None:
    data = b"".join(chunks)
    _fuzz(data, [data[:cut], data[cut:]])


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=20), st.integers(0, len(STREAM)), st.integers(0, 5))
def test_fuzz_mutated_stream(junk: bytes, at: int, drop: int) -> None:
    data = STREAM[:at] + junk + STREAM[at + drop :]
    _fuzz(data, [data[i : i + 7] for i in range(0, len(data), 7)])


def test_binary_noise_is_refused_without_buffering_it() -> None:
    noise = bytes(range(11, 256)) * 4096  # (no LF, no NUL: one endless command line)
    reader = FrameReader()
    with pytest.raises(StompError, match="command line longer"):
        for i in range(len(noise)):
            reader.feed(noise[i : i + 1])
    assert i <= MAX_COMMAND + 1


# ---------------------------------------------------------------------------------- heart-beats


def test_heartbeats_between_frames() -> None:
    data = b"\nSEND\n\n\0\r\n\nSEND\n\n\0\r\n"
    assert FrameReader().feed(data) == [HB, Frame("SEND"), HB, HB, Frame("SEND"), HB]


def test_heartbeat_cr_waits_for_its_lf() -> None:
    reader = FrameReader()
    assert reader.feed(b"\r") == []
    assert reader.feed(b"\n\r") == [HB]
    assert reader.feed(b"\n") == [HB]


@pytest.mark.parametrize(
    ("client", "server", "expected"),
    [
        ("1000,2000", (500, 3000), (2000, 3000)),
        ("0,0", (500, 3000), (0, 0)),
        (None, (500, 3000), (0, 0)),
        ("1000,0", (500, 3000), (0, 3000)),
        ("0,1000", (500, 3000), (1000, 0)),
        ("10000,10000", (0, 0), (0, 0)),
        ("100,200", (5000, 1000), (5000, 1000)),
        ("007,08", (1, 1), (8, 7)),
    ],
)
def test_negotiate_heartbeat(client: str | None, server: tuple[int, int], expected: tuple[int, int]) -> None:
    assert negotiate_heartbeat(client, server) == expected


@pytest.mark.parametrize(
    "value", ["", "1", "1,2,3", "-1,0", "a,b", " 1,2", "1, 2", "1,2\n", "١,2", "12345678901,1", ","]
)
def test_malformed_heartbeat(value: str) -> None:
    with pytest.raises(StompError, match="heart-beat"):
        parse_heartbeat(value)
    with pytest.raises(StompError, match="heart-beat"):
        negotiate_heartbeat(value, (1000, 1000))


def test_heartbeat_server_values_are_checked() -> None:
    assert parse_heartbeat("0,4294967295") == (0, 4294967295)
    with pytest.raises(ValueError, match=">= 0"):
        negotiate_heartbeat("1,1", (-1, 0))


# ----------------------------------------------------------------------------------- versions


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("1.0,1.1,1.2", "1.2"),
        ("1.2,1.1", "1.2"),
        ("1.1", "1.1"),
        ("1.0, 1.1", "1.1"),
        ("1.1,2.0", "1.1"),
        ("1.0", None),
        (None, None),  # (no header: a 1.0 client)
        ("", None),
        ("x,y", None),
        ("1.3", None),
    ],
)
def test_negotiate_version(accept: str | None, expected: str | None) -> None:
    assert negotiate_version(accept) == expected


# -------------------------------------------------------------------------- frames and builders


def test_repeated_headers_first_wins() -> None:
    [frame] = FrameReader().feed(b"SEND\ndestination:a\nx:1\ndestination:b\n\n\0")
    assert isinstance(frame, Frame)
    assert frame.header("destination") == "a"
    assert frame.header("x") == "1"
    assert frame.header("nope") is None
    assert frame.headers == [("destination", "a"), ("x", "1"), ("destination", "b")]


def test_error_frame() -> None:
    frame = error_frame("bad: frame\nhere", receipt_id="r-7", detail="the details ü")
    assert frame.command == "ERROR"
    assert frame.header("message") == "bad: frame\nhere"
    assert frame.header("receipt-id") == "r-7"
    assert frame.header("content-type") == "text/plain"
    assert frame.body == "the details ü".encode()
    assert FrameReader("client").feed(encode(frame)) == [_as_read(frame)]
    bare = error_frame("no")
    assert bare.header("receipt-id") is None
    assert encode(bare) == b"ERROR\nmessage:no\ncontent-type:text/plain\n\n\0"


def test_receipt_frame() -> None:
    frame = receipt_frame("77")
    assert frame == Frame("RECEIPT", [("receipt-id", "77")])
    assert encode(frame) == b"RECEIPT\nreceipt-id:77\n\n\0"


@pytest.mark.parametrize(
    ("frame", "what"),
    [
        (Frame("BOGUS"), "unknown command"),
        (Frame("SUBSCRIBE", [("id", "1")], b"x"), "has no body"),
        (Frame("SEND", [("content-length", "2")], b"x"), "content-length"),
        (Frame("SEND", [("content-length", "1")]), "content-length"),
        (Frame("SEND", [("", "x")]), "empty name"),
        (Frame("SEND", [("h", "\ud800")]), "cannot encode"),
    ],
)
def test_encode_refuses(frame: Frame, what: str) -> None:
    with pytest.raises(StompError, match=what):
        encode(frame)


_CLIENT = "ABORT ACK BEGIN COMMIT CONNECT DISCONNECT NACK SEND STOMP SUBSCRIBE UNSUBSCRIBE"
_SERVER = "CONNECTED ERROR MESSAGE RECEIPT"


@pytest.mark.parametrize(
    ("side", "ours"),
    [("server", _CLIENT), ("client", _SERVER)],
)
def test_each_side_reads_the_other_sides_commands(side: str, ours: str) -> None:
    theirs = (_SERVER if side == "server" else _CLIENT).split()
    assert {*ours.split(), *theirs} == CLIENT_COMMANDS | SERVER_COMMANDS
    for command in ours.split():
        assert FrameReader(side).feed(f"{command}\n\n\0".encode()) == [Frame(command)]  # type: ignore[arg-type]
    for command in theirs:
        with pytest.raises(StompError, match=f"does not accept {command}"):
            FrameReader(side).feed(f"{command}\n\n\0".encode())  # type: ignore[arg-type]
