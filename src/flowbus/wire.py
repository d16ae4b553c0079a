"""Wire tags: the short, stable name under which each message type crosses the network.

How it works: a message class declares its tag where it is defined,

    @wire.message("ring.heartbeat")
    @dataclass(frozen=True, slots=True)
    class Heartbeat: ...

(above ``@dataclass``: a slotted dataclass is a new class, and the tag belongs to it). The
codec (:mod:`flowbus.net.codec`) writes the tag in front of the message's fields and looks it
up again when decoding. The tag never depends on the module or the class name, so moving or
renaming a class changes no byte on the wire; a tag is ``family.name`` in lower case, and two
classes may not share one. ``tests/net/test_wire.py`` pins the whole table (tag -> class and
field names), so a change of the wire shows as a diff of that test.

A process knows the tags of the modules it imported: a broker imports every protocol it
speaks; a tag nobody here registered decodes as a :class:`~flowbus.errors.ProtocolError`
naming it.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import threading
import types
from collections.abc import Callable, Mapping
from typing import Final, TypeVar

from flowbus.errors import InternalError

__all__ = ["TAG_FORMAT", "message", "table", "tag_of", "type_of"]

TAG_FORMAT: Final = re.compile(r"[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*")
"""What a tag looks like: ``family.name``, lower case, e.g. ``ring.heartbeat``."""

T = TypeVar("T", bound=type)

_lock = threading.Lock()
_by_tag: dict[str, type] = {}
_by_type: dict[type, str] = {}


def message(tag: str) -> Callable[[T], T]:
    """Declare ``tag`` as the wire name of the decorated dataclass or ``Enum``."""
    if not TAG_FORMAT.fullmatch(tag):
        raise InternalError(f"wire tag {tag!r} is not of the form family.name (lower case)")

    def register(cls: T) -> T:
        if not (issubclass(cls, enum.Enum) or dataclasses.is_dataclass(cls)):
            raise InternalError(f"wire tag {tag!r}: {cls!r} is neither a dataclass nor an Enum")
        with _lock:
            old = _by_tag.get(tag)
            if old is not None and old is not cls:
                raise InternalError(f"wire tag {tag!r} is taken by {old.__module__}.{old.__qualname__}")
            if _by_type.get(cls, tag) != tag:
                raise InternalError(f"{cls.__qualname__} has the wire tag {_by_type[cls]!r} already")
            _by_tag[tag] = cls
            _by_type[cls] = tag
        return cls

    return register


def tag_of(cls: type) -> str | None:
    """The tag of a message class, or None if it has none."""
    return _by_type.get(cls)


def type_of(tag: str) -> type | None:
    """The message class of ``tag`` among the modules imported so far, or None."""
    return _by_tag.get(tag)


def table() -> Mapping[str, type]:
    """Every tag known to this process, with its class (read only)."""
    with _lock:
        return types.MappingProxyType(dict(_by_tag))
