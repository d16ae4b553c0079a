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
most :data:`MAX_DEPTH` deep (the decoder refuses deeper ones; the encoder leaves that check
to the receiver and stops only at a cycle or msgpack's own limit of about 1,000). Example:
the ring's ``Peer(5, 3)`` (tag ``ring.peer``) is the array ``[ext(2, b"ring.peer"), 5, 3]``.
A tag no module of this process declared is a :class:`FrameError` naming it.

Speed
-----
Both directions run in msgpack's C code but for the forms it has no native type for:
:func:`encode` packs with a ``default`` hook that returns a message's, tuple's or set's
tagged array (an event map of plain values is packed without one Python call), and
:func:`decode` unpacks with hooks that msgpack calls as it completes each array and map,
children first, so tagged arrays are values before the maps that use them as keys.

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
import itertools
import reprlib
import struct
import threading
import types
import typing
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
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


def _ext(tag: str) -> msgpack.ExtType:
    return msgpack.ExtType(_EXT_TAG, tag.encode())


_TUPLE_EXT: Final = _ext(_TUPLE)
_SET_EXT: Final = _ext(_SET)
_FROZENSET_EXT: Final = _ext(_FROZENSET)
_FILTER_EXT: Final = _ext(_FILTER)


# ------------------------------------------------------------------------------------- registry

_Check = Callable[[object], bool]


@dataclasses.dataclass(frozen=True, slots=True)
class _Kind:
    cls: type
    tag: str
    fields: tuple[str, ...]  # dataclass init fields; () for an enum
    is_enum: bool
    ext: msgpack.ExtType  # the tag as msgpack writes it


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
        kind = _Kind(cls, tag, (), True, _ext(tag))
    else:
        if issubclass(cls, Filter):
            raise ProtocolError("Filter is encoded by its text form; it cannot have a wire tag")
        names = tuple(f.name for f in dataclasses.fields(typing.cast(Any, cls)) if f.init)
        kind = _Kind(cls, tag, names, False, _ext(tag))
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

    msgpack writes the native forms itself; :func:`_tagged` gives it the tagged array of
    anything else. Raises :class:`FrameError` for a value the format cannot carry (an
    untagged dataclass, an unknown type, a cycle or nesting deeper than msgpack's own
    limit, a bad field)."""
    try:
        body: bytes = msgpack.packb(msg, default=_tagged, use_bin_type=True, strict_types=True)
    except FrameError:
        raise
    except ValueError as e:  # msgpack's recursion limit: a cycle, or values nested too deeply
        raise FrameError(f"cannot encode: values nest deeper than msgpack allows ({e})") from None
    except (TypeError, OverflowError) as e:  # (a value :func:`_tagged` turned into another odd one)
        raise FrameError(f"cannot encode: {type(e).__name__}: {e}") from None
    return body


def _tagged(x: object) -> object:
    """What msgpack writes for ``x``, which it has no native form for: the tagged array of a
    message, enum, tuple, set or filter, an integer's ext 1, a subclass's plain value."""
    kind = _kinds.get(type(x))
    if kind is not None:
        return _tagged_kind(kind, x)
    t = type(x)
    if t is tuple:
        return [_TUPLE_EXT, *typing.cast(tuple[object, ...], x)]
    if t is int:  # (only one past msgpack's range comes here)
        return msgpack.ExtType(_EXT_BIGINT, _int_bytes(typing.cast(int, x)))
    if t is frozenset or t is set:
        return [_FROZENSET_EXT if t is frozenset else _SET_EXT, *typing.cast(Iterable[object], x)]
    return _tagged_other(x)


def _tagged_kind(kind: _Kind, x: object) -> list[object]:
    if kind.is_enum:
        return [kind.ext, typing.cast(enum.Enum, x).value]
    values = [getattr(x, name) for name in kind.fields]
    _check_fields(kind, values)
    return [kind.ext, *values]


def _tagged_other(x: object) -> object:
    """:func:`_tagged` for subclasses, filters and a type's first message."""
    if isinstance(x, enum.Enum | Filter) or (dataclasses.is_dataclass(x) and not isinstance(x, type)):
        if isinstance(x, Filter):
            return [_FILTER_EXT, x.to_text()]
        kind = _kind_for_type(type(x))
        if kind is None or kind.is_enum is not isinstance(x, enum.Enum):
            what = "an enum" if isinstance(x, enum.Enum) else "a dataclass"
            raise FrameError(f"cannot encode {_name(x)}: {what} with no wire tag")
        return _tagged_kind(kind, x)
    if isinstance(x, int):  # (bool cannot be subclassed)
        n = int(x)
        return n if _MIN_INT <= n <= _MAX_INT else msgpack.ExtType(_EXT_BIGINT, _int_bytes(n))
    if isinstance(x, float):
        return float(x)
    if isinstance(x, str):
        return str(x)
    if isinstance(x, list):
        return list(x)
    if isinstance(x, bytes | bytearray | memoryview):
        return bytes(x)
    if isinstance(x, tuple):
        return [_TUPLE_EXT, *x]
    if isinstance(x, Mapping):
        return dict(x.items())
    if isinstance(x, set | frozenset):
        return [_FROZENSET_EXT if isinstance(x, frozenset) else _SET_EXT, *x]
    raise FrameError(f"cannot encode a {_name(x)}: {_short(x)}")


def _name(x: object) -> str:
    return f"{type(x).__module__}.{type(x).__qualname__}"


def _int_bytes(n: int) -> bytes:
    size = (n.bit_length() if n >= 0 else (-n - 1).bit_length()) // 8 + 1
    return n.to_bytes(size, "big", signed=True)


# ----------------------------------------------------------------------------------------- decode


class _Tag:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


_STRAY: Final = frozenset({_Tag, msgpack.Timestamp})
"""What msgpack may hand up that is no value: a tag away from an array's head, ext -1."""


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
    of fields, a field of the wrong type, a value its constructor rejects, nesting deeper
    than :data:`MAX_DEPTH`."""
    reader = _Reader()
    try:
        value = msgpack.unpackb(
            body,
            raw=False,
            use_list=True,
            strict_map_key=False,
            list_hook=reader.array,
            object_pairs_hook=reader.map,
            ext_hook=_ext_hook,
            timestamp=0,
        )
    except FrameError:
        raise
    except Exception as e:  # msgpack's own errors, UnicodeDecodeError, ValueError, ...
        raise FrameError(f"malformed msgpack body: {type(e).__name__}: {e}") from None
    if type(value) in _STRAY:
        _stray([value])
    return value


class _Reader:
    """One body's values, built as msgpack completes them: children before their container
    (its hooks). Each container's depth is one more than its deepest child's, looked up by
    ``id``: the containers built are kept until the body is done, so no id is reused."""

    __slots__ = ("depth", "keep")

    def __init__(self) -> None:
        self.depth: dict[int, int] = {}
        self.keep: list[object] = []

    def _level(self, items: Sequence[object]) -> int:
        """The depth of a container of ``items``; :class:`FrameError` for a stray item."""
        if _PLAIN.issuperset(map(type, items)):  # (most containers: one pass in C)
            return 1
        deepest = 1
        depth = self.depth
        for v in items:
            if type(v) not in _PLAIN:
                if type(v) in _STRAY:
                    _stray([v])
                d = depth.get(id(v), 1)  # (a container not noted holds plain values only)
                if d > deepest:
                    deepest = d
        if deepest >= MAX_DEPTH:
            raise FrameError(f"values nest deeper than {MAX_DEPTH}")
        return deepest + 1

    def _built(self, value: object, level: int) -> object:
        if level > 1:  # (kept alive: no later container can take its id)
            self.depth[id(value)] = level
            self.keep.append(value)
        return value

    def array(self, items: list[object]) -> object:
        if not items or type(items[0]) is not _Tag:
            return self._built(items, self._level(items))
        rest = items[1:]
        level = self._level(rest)
        return self._built(_from_tagged(items[0].name, rest), level)

    def map(self, pairs: list[tuple[object, object]]) -> dict[object, object]:
        level = self._level(list(itertools.chain.from_iterable(pairs)))
        try:
            result = dict(pairs)
        except TypeError:
            result = {}
        if len(result) != len(pairs):
            _bad_keys(pairs)
        self._built(result, level)
        return result


_PLAIN: Final = frozenset({str, int, float, bool, type(None), bytes})
"""The types of values that are no container (nor a stray)."""


def _stray(values: list[object]) -> None:
    x = next(v for v in values if type(v) in _STRAY)
    if isinstance(x, _Tag):
        raise FrameError(f"type tag {x.name!r} outside the head of an array")
    raise FrameError(f"unexpected msgpack value {_short(x)}")


def _bad_keys(pairs: list[tuple[object, object]]) -> None:
    """Why ``pairs`` is no map: an unhashable or a duplicate key."""
    seen: set[object] = set()
    for key, _ in pairs:
        if not _hashable(key):
            raise FrameError(f"unhashable map key {_short(key)}")
        if key in seen:
            raise FrameError(f"duplicate map key {_short(key)}")
        seen.add(key)
    raise FrameError("a map that is no map")  # (keys equal as dict keys but not as a set's)


def _from_tagged(tag: str, items: list[object]) -> object:
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
