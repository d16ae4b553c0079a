"""The wire codec for broker-to-broker messages: msgpack bodies in length-prefixed frames.

The sans-IO protocol cores exchange frozen dataclasses; :func:`encode` turns one into a
msgpack body, :func:`decode` rebuilds the exact instance, :func:`frame` prefixes a body
with its length and :class:`FrameDecoder` cuts a byte stream back into bodies. Decoding
never runs code other than the constructors of tagged dataclasses and enums (no
pickle), and garbage raises :class:`~flowbus.errors.FrameError` and nothing else.

How it works
============

Framing
-------
A frame is a 4-byte big-endian unsigned length ``n`` followed by ``n`` bytes of body.
``n`` is at most :data:`MAX_FRAME` (16 MiB) unless both ends agree on another limit; a
receiver that reads a larger ``n`` closes the connection without reading the body. An
empty body (``n == 0``) is a valid frame, but not a valid message.

Body
----
A body is exactly one msgpack object (no trailing bytes) built from these forms:

* ``nil``, ``true``/``false``, ``str`` (UTF-8), ``bin`` and ``float`` (32 or 64 bit;
  the encoder writes 64 bit) stand for ``None``, ``bool``, ``str``, ``bytes`` and
  ``float``.
* Integers in ``[-2**63, 2**64 - 1]`` are msgpack ints. Other integers are the ext
  type **1** whose data is the integer in two's complement, big-endian, signed, in the
  fewest bytes that hold it (``int.to_bytes(len, "big", signed=True)``); an ext 1 whose
  value fits a msgpack int, or that is not minimal, is rejected.
* A msgpack map is a ``dict`` (any ``Mapping`` is written as one): keys and values are
  any forms (a key may be a tuple, an int, ...); duplicate keys are rejected.
* A msgpack array whose first element is **not** a tag (below) is a ``list``.
* A *tagged array* ``[tag, x1, ..., xn]`` is a value of a richer type. The tag is the
  ext type **2** whose data is a UTF-8 type name; a tag appears nowhere else (not as a
  value, not later in an array). The names are:

  - ``"tuple"``: the tuple ``(x1, ..., xn)``;
  - ``"set"`` / ``"frozenset"``: a set / frozenset of ``x1 ... xn`` (any order, no
    duplicates);
  - ``"filter"``: one string ``x1``, a :class:`flowbus.filters.Filter` in its text form
    (``Filter.to_text()``, read back with :func:`flowbus.filters.parse`);
  - the wire tag of a message dataclass (:mod:`flowbus.wire`, e.g. ``"irbr.subscribe"``):
    ``x1 ... xn`` are the values of its ``init`` fields in declaration order
    (``dataclasses.fields``), passed to the constructor by name;
  - the wire tag of an ``Enum``: one element, the member's ``value``.

No other ext types are accepted (msgpack's timestamp, ext -1, included). Forms nest at
most :data:`MAX_DEPTH` deep. Example: the ring's ``Peer(5, 3)`` (tag ``ring.peer``) is the array
``[ext(2, b"ring.peer"), 5, 3]``. A tag no module of this process declared is a
:class:`FrameError` naming it.

Checks
------
Field values are checked against the field's annotation where it is simple (``int``,
``float`` (an int is accepted), ``str``, ``bool``, ``bytes``, ``None``, a class, unions,
``tuple[...]``, ``list``/``set``/``frozenset``/``Mapping`` containers, ``Hashable``),
both when encoding and when decoding, and the constructor's own validation
(``__post_init__``) runs on decoding: a violation is a :class:`FrameError`.
"""

from __future__ import annotations

import dataclasses
import enum
import reprlib
import struct
import threading
import types
import typing
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Final

import msgpack  # type: ignore[import-untyped]  # no stubs, no py.typed

from flowbus import wire
from flowbus.errors import FrameError, ProtocolError
from flowbus.filters import Filter, parse

__all__ = [
    "MAX_DEPTH",
    "MAX_FRAME",
    "FrameDecoder",
    "FrameError",
    "decode",
    "encode",
    "frame",
    "head_tag",
    "registered",
]

MAX_FRAME: Final = 16 * 1024 * 1024
"""The largest frame body, in bytes."""

MAX_DEPTH: Final = 100
"""How deeply values may nest (a dataclass, list, map, tuple or set is one level)."""

_LEN = struct.Struct(">I")
_EXT_BIGINT: Final = 1
_EXT_TAG: Final = 2
_MIN_INT: Final = -(1 << 63)
_MAX_INT: Final = (1 << 64) - 1

_TUPLE: Final = "tuple"
_SET: Final = "set"
_FROZENSET: Final = "frozenset"
_FILTER: Final = "filter"
_BUILTIN_TAGS: Final = frozenset({_TUPLE, _SET, _FROZENSET, _FILTER})


# ------------------------------------------------------------------------------------- registry

_Check = Callable[[object], bool]


@dataclasses.dataclass(frozen=True, slots=True)
class _Kind:
    cls: type
    tag: str
    fields: tuple[str, ...]  # dataclass init fields; () for an enum
    is_enum: bool


_lock = threading.Lock()
_kinds: dict[type, _Kind] = {}
_checks: dict[type, tuple[_Check | None, ...]] = {}


def _kind_for_type(cls: type) -> _Kind | None:
    kind = _kinds.get(cls)
    if kind is None:
        tag = wire.tag_of(cls)
        if tag is None:
            return None
        kind = _kind(cls, tag)
    return kind


def _kind_for_tag(tag: str) -> _Kind | None:
    cls = wire.type_of(tag)
    return None if cls is None else _kind_for_type(cls)


def _kind(cls: type, tag: str) -> _Kind:
    if tag in _BUILTIN_TAGS:
        raise ProtocolError(f"tag {tag!r} is reserved")
    if issubclass(cls, enum.Enum):
        kind = _Kind(cls, tag, (), True)
    else:
        if issubclass(cls, Filter):
            raise ProtocolError("Filter is encoded by its text form; it cannot have a wire tag")
        names = tuple(f.name for f in dataclasses.fields(typing.cast(Any, cls)) if f.init)
        kind = _Kind(cls, tag, names, False)
    with _lock:
        _kinds[cls] = kind
    return kind


def registered() -> Mapping[str, type]:
    """Every message type this process can encode and decode, by tag (:func:`flowbus.wire.table`)."""
    return wire.table()


# ---------------------------------------------------------------------------------- field checks


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _hashable(x: object) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def _all(check: _Check | None, xs: Iterable[object]) -> bool:
    return check is None or all(check(x) for x in xs)


def _checker(hint: object) -> _Check | None:
    """A predicate for values of ``hint``, or None when anything goes (or it is too subtle)."""
    if hint is Any or hint is object or isinstance(hint, typing.TypeVar):
        return None
    if hint is None or hint is type(None):
        return lambda x: x is None
    if hint is bool:
        return lambda x: isinstance(x, bool)
    if hint is int:
        return _is_int
    if hint is float:
        return lambda x: isinstance(x, float) or _is_int(x)
    if hint is Hashable:
        return _hashable
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        alts = [_checker(a) for a in args]
        if any(c is None for c in alts):
            return None
        checks = [c for c in alts if c is not None]
        return lambda x: any(c(x) for c in checks)
    if origin is typing.Literal:
        return lambda x: any(type(x) is type(a) and x == a for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            each = _checker(args[0])
            return lambda x: isinstance(x, tuple) and _all(each, x)
        if args == ((),):
            return lambda x: x == ()
        items = [_checker(a) for a in args]
        if not args:
            return lambda x: isinstance(x, tuple)
        return lambda x: (
            isinstance(x, tuple)
            and len(x) == len(items)
            and all(c is None or c(v) for c, v in zip(items, x, strict=True))
        )
    if origin in (list, set, frozenset):
        container = typing.cast(type, origin)
        each = _checker(args[0]) if args else None
        return lambda x: isinstance(x, container) and _all(each, typing.cast(Iterable[object], x))
    if origin is not None and isinstance(origin, type) and issubclass(origin, Mapping):
        return lambda x: isinstance(x, Mapping)
    if isinstance(hint, type):
        if hint is Mapping or (issubclass(hint, Mapping) and hint is not dict):
            return lambda x: isinstance(x, Mapping)
        cls = hint
        return lambda x: isinstance(x, cls)
    return None


def _field_checks(kind: _Kind) -> tuple[_Check | None, ...]:
    checks = _checks.get(kind.cls)
    if checks is None:
        try:
            hints = typing.get_type_hints(kind.cls)
        except Exception:  # an annotation that does not resolve: no checks
            hints = {}
        checks = tuple(_checker(hints[n]) if n in hints else None for n in kind.fields)
        _checks[kind.cls] = checks
    return checks


def _check_fields(kind: _Kind, values: list[object]) -> None:
    for name, check, value in zip(kind.fields, _field_checks(kind), values, strict=True):
        if check is not None and not check(value):
            raise FrameError(f"{kind.tag}: bad field {name!r}: {_short(value)}")


_repr = reprlib.Repr()
_repr.maxlevel = 3
_repr.maxstring = _repr.maxother = _repr.maxlong = 60


def _short(x: object) -> str:
    """A short repr for error messages, safe on anything a peer can send (huge ints, ...)."""
    try:
        text = _repr.repr(x)
    except Exception:
        return f"<a {type(x).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


# ----------------------------------------------------------------------------------------- encode


def encode(msg: object) -> bytes:
    """The msgpack body of ``msg`` (see the module docstring for the format).

    Raises :class:`FrameError` for a value the format cannot carry (an untagged
    dataclass, an unknown type, nesting deeper than :data:`MAX_DEPTH`, a bad field)."""
    out: list[bytes] = []
    packer = msgpack.Packer(use_bin_type=True, strict_types=True, autoreset=True)
    _encode(msg, out, packer, 0)
    return b"".join(out)


def _tag_bytes(packer: msgpack.Packer, tag: str, n: int) -> bytes:
    head: bytes = packer.pack_array_header(n + 1) + packer.pack(msgpack.ExtType(_EXT_TAG, tag.encode()))
    return head


def _encode(x: object, out: list[bytes], packer: msgpack.Packer, depth: int) -> None:
    if x is None or x is True or x is False:
        out.append(packer.pack(x))
        return
    if isinstance(x, enum.Enum):
        kind = _kind_for_type(type(x))
        if kind is None:
            raise FrameError(f"cannot encode {type(x).__qualname__}: an enum with no wire tag")
        out.append(_tag_bytes(packer, kind.tag, 1))
        _encode(x.value, out, packer, depth + 1)
        return
    if isinstance(x, int) and not isinstance(x, bool):
        n = int(x)
        if _MIN_INT <= n <= _MAX_INT:
            out.append(packer.pack(n))
        else:
            out.append(packer.pack(msgpack.ExtType(_EXT_BIGINT, _int_bytes(n))))
        return
    if isinstance(x, float):
        out.append(packer.pack(float(x)))
        return
    if isinstance(x, str):
        out.append(packer.pack(str(x)))
        return
    if isinstance(x, bytes | bytearray | memoryview):
        out.append(packer.pack(bytes(x)))
        return
    if depth >= MAX_DEPTH:
        raise FrameError(f"cannot encode: values nest deeper than {MAX_DEPTH}")
    if isinstance(x, Filter):
        out.append(_tag_bytes(packer, _FILTER, 1))
        out.append(packer.pack(x.to_text()))
        return
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        kind = _kind_for_type(type(x))
        if kind is None or kind.is_enum:
            name = f"{type(x).__module__}.{type(x).__qualname__}"
            raise FrameError(f"cannot encode {name}: a dataclass with no wire tag")
        values = [getattr(x, name) for name in kind.fields]
        _check_fields(kind, values)
        out.append(_tag_bytes(packer, kind.tag, len(values)))
        for v in values:
            _encode(v, out, packer, depth + 1)
        return
    if isinstance(x, list):
        out.append(packer.pack_array_header(len(x)))
        for v in x:
            _encode(v, out, packer, depth + 1)
        return
    if isinstance(x, tuple):
        out.append(_tag_bytes(packer, _TUPLE, len(x)))
        for v in x:
            _encode(v, out, packer, depth + 1)
        return
    if isinstance(x, Mapping):
        items = list(x.items())
        out.append(packer.pack_map_header(len(items)))
        for k, v in items:
            _encode(k, out, packer, depth + 1)
            _encode(v, out, packer, depth + 1)
        return
    if isinstance(x, set | frozenset):
        elems = list(x)
        out.append(_tag_bytes(packer, _FROZENSET if isinstance(x, frozenset) else _SET, len(elems)))
        for v in elems:
            _encode(v, out, packer, depth + 1)
        return
    raise FrameError(f"cannot encode a {type(x).__module__}.{type(x).__qualname__}: {_short(x)}")


def _int_bytes(n: int) -> bytes:
    size = (n.bit_length() if n >= 0 else (-n - 1).bit_length()) // 8 + 1
    return n.to_bytes(size, "big", signed=True)


# ----------------------------------------------------------------------------------------- decode


class _Tag:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class _Pairs:
    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[object, object]]) -> None:
        self.pairs = pairs


def _ext_hook(code: int, data: bytes) -> object:
    if code == _EXT_BIGINT:
        n = int.from_bytes(data, "big", signed=True)
        if not data or _MIN_INT <= n <= _MAX_INT or data != _int_bytes(n):
            raise FrameError(f"non-canonical big integer (ext 1 of {len(data)} bytes)")
        return n
    if code == _EXT_TAG:
        try:
            return _Tag(data.decode())
        except UnicodeDecodeError:
            raise FrameError("a type tag is not UTF-8") from None
    raise FrameError(f"unknown msgpack ext type {code}")


def decode(body: bytes) -> object:
    """Rebuild the value :func:`encode` wrote into ``body``.

    Raises :class:`FrameError`, and nothing else, when ``body`` is not exactly one valid
    value: msgpack garbage or trailing bytes, an unknown tag or ext type, a wrong number
    of fields, a field of the wrong type, a value its constructor rejects."""
    try:
        raw = msgpack.unpackb(
            body,
            raw=False,
            use_list=True,
            strict_map_key=False,
            object_pairs_hook=_Pairs,
            ext_hook=_ext_hook,
            timestamp=0,
        )
    except FrameError:
        raise
    except Exception as e:  # msgpack's own errors, UnicodeDecodeError, ValueError, ...
        raise FrameError(f"malformed msgpack body: {type(e).__name__}: {e}") from None
    try:
        return _decode(raw, 0)
    except FrameError:
        raise
    except RecursionError:
        raise FrameError("values nest too deeply") from None
    except Exception as e:  # a safety net: a peer's bytes must never raise anything else
        raise FrameError(f"cannot decode the body: {type(e).__name__}") from e


def _decode(x: object, depth: int) -> object:
    if x is None or isinstance(x, bool | int | float | str | bytes):
        return x
    if depth >= MAX_DEPTH:
        raise FrameError(f"values nest deeper than {MAX_DEPTH}")
    if isinstance(x, list):
        if x and isinstance(x[0], _Tag):
            return _decode_tagged(x[0].name, x, depth + 1)
        return [_decode(v, depth + 1) for v in x]
    if isinstance(x, _Pairs):
        result: dict[object, object] = {}
        for k, v in x.pairs:
            key = _decode(k, depth + 1)
            if not _hashable(key):
                raise FrameError(f"unhashable map key {_short(key)}")
            if key in result:
                raise FrameError(f"duplicate map key {_short(key)}")
            result[key] = _decode(v, depth + 1)
        return result
    if isinstance(x, _Tag):
        raise FrameError(f"type tag {x.name!r} outside the head of an array")
    raise FrameError(f"unexpected msgpack value {_short(x)}")


def _decode_tagged(tag: str, x: list[object], depth: int) -> object:
    items = [_decode(v, depth) for v in x[1:]]
    if tag == _TUPLE:
        return tuple(items)
    if tag in (_SET, _FROZENSET):
        bad = next((v for v in items if not _hashable(v)), None)
        if bad is not None:
            raise FrameError(f"unhashable {tag} element {_short(bad)}")
        elems = frozenset(items)
        if len(elems) != len(items):
            raise FrameError(f"duplicate {tag} elements")
        return elems if tag == _FROZENSET else set(elems)
    if tag == _FILTER:
        if len(items) != 1 or not isinstance(items[0], str):
            raise FrameError("a filter is one string (its text form)")
        try:
            return parse(items[0])
        except Exception as e:
            raise FrameError(f"bad filter {_short(items[0])}: {e}") from None
    kind = _kind_for_tag(tag)
    if kind is None:
        raise FrameError(f"unknown type tag {_short(tag)}")
    if kind.is_enum:
        if len(items) != 1:
            raise FrameError(f"{tag}: an enum member is one value, got {len(items)}")
        try:
            return kind.cls(items[0])
        except Exception:
            raise FrameError(f"{tag}: no member with value {_short(items[0])}") from None
    if len(items) != len(kind.fields):
        raise FrameError(f"{tag}: {len(kind.fields)} fields expected, got {len(items)}")
    _check_fields(kind, items)
    try:
        return kind.cls(**dict(zip(kind.fields, items, strict=True)))
    except Exception as e:
        raise FrameError(f"{tag}: rejected by its constructor: {type(e).__name__}: {e}") from None


# ---------------------------------------------------------------------------------------- framing


def head_tag(head: bytes) -> str | None:
    """The tag of the value a frame body holds, from the body's first bytes (64 are enough
    for any tag): ``"tuple"`` for a peer's ``(source, message)``, a message's wire tag
    (``"client.hello"``...); None if they do not start a tagged value."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(head) + 1)
    unpacker.feed(head)
    try:
        unpacker.read_array_header()
        ext = unpacker.unpack()
    except (ValueError, msgpack.OutOfData, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return None
    if not isinstance(ext, msgpack.ExtType) or ext.code != _EXT_TAG:
        return None
    try:
        return str(ext.data.decode())
    except UnicodeDecodeError:
        return None


def frame(body: bytes, *, limit: int = MAX_FRAME) -> bytes:
    """``body`` behind its 4-byte big-endian length; :class:`FrameError` if it is over ``limit``."""
    if len(body) > min(limit, 0xFFFFFFFF):
        raise FrameError(f"frame body of {len(body)} bytes is over the limit of {limit}")
    return _LEN.pack(len(body)) + bytes(body)


class FrameDecoder:
    """Cut a byte stream into frame bodies, whatever the pieces it arrives in.

    ``feed`` returns the bodies completed so far and keeps any partial frame. A length
    prefix over ``limit`` raises :class:`FrameError` at once (the body is not buffered);
    the decoder is then broken: every later ``feed`` raises again (close the connection)."""

    __slots__ = ("_buf", "_error", "limit")

    def __init__(self, *, limit: int = MAX_FRAME) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.limit = limit
        self._buf = bytearray()
        self._error: str | None = None

    @property
    def pending(self) -> int:
        """Bytes held of a frame not yet complete."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        if self._error is not None:
            raise FrameError(f"decoder is broken by an earlier error: {self._error}")
        buf = self._buf
        buf += data
        bodies: list[bytes] = []
        pos = 0
        try:
            while len(buf) - pos >= 4:
                (n,) = _LEN.unpack_from(buf, pos)
                if n > self.limit:
                    self._error = f"frame length {n} is over the limit of {self.limit}"
                    raise FrameError(self._error)
                if len(buf) - pos - 4 < n:
                    break
                bodies.append(bytes(buf[pos + 4 : pos + 4 + n]))
                pos += 4 + n
        finally:
            if self._error is not None:
                buf.clear()
            elif pos:
                del buf[:pos]
        return bodies
