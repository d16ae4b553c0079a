"""The event model: schemas and immutable events.

An event is a set of attribute-value pairs (the 001 document's publication); its
values are ``str``, ``int``, ``float`` or ``bool``. A :class:`Schema` names the
attributes an information space's events carry and their types; an event made
with a schema is checked against it and refused, with the offending field named,
when it does not fit.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from flowbus.errors import SchemaError

Value = str | int | float | bool
"""A value an event attribute may hold."""

TYPES: Mapping[str, type] = MappingProxyType({"str": str, "int": int, "float": float, "bool": bool})
"""The attribute types a schema may name, by their spelling in specs."""


def type_name(value: object) -> str:
    """The schema spelling of ``value``'s type (``bool`` before ``int``: bool is an int in Python)."""
    for name in ("bool", "int", "float", "str"):
        if type(value) is TYPES[name]:
            return name
    return type(value).__name__


def _fits(value: object, kind: type) -> bool:
    if kind is float:
        return type(value) in (float, int)
    return type(value) is kind


@dataclass(frozen=True, slots=True)
class Schema:
    """Attribute name -> type (``str``, ``int``, ``float``, ``bool``).

    ``Schema.of({"issue": "str", "price": "float"})`` accepts type names as in a spec.
    A ``float`` attribute accepts ``int`` values (stored as ``float``).
    """

    fields: Mapping[str, type]
    _names: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        checked: dict[str, type] = {}
        for name, kind in self.fields.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise SchemaError(f"schema field name {name!r} is not an identifier", field=str(name))
            if isinstance(kind, str):
                if kind not in TYPES:
                    raise SchemaError(
                        f"schema field {name!r} has unknown type {kind!r} "
                        f"(expected one of {', '.join(TYPES)})",
                        field=name,
                    )
                kind = TYPES[kind]
            if kind not in TYPES.values():
                raise SchemaError(f"schema field {name!r} has unsupported type {kind!r}", field=name)
            checked[name] = kind
        object.__setattr__(self, "fields", MappingProxyType(checked))
        object.__setattr__(self, "_names", frozenset(checked))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Schema, (dict(self.fields),))

    @classmethod
    def of(cls, fields: Mapping[str, type | str]) -> Schema:
        return cls(fields)  # type: ignore[arg-type]

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def type_of(self, name: str) -> type:
        try:
            return self.fields[name]
        except KeyError:
            raise SchemaError(
                f"unknown field {name!r} (schema has {', '.join(self.fields)})", field=name
            ) from None

    def validate(self, data: Mapping[str, Any]) -> dict[str, Value]:
        """Return ``data`` checked and normalised against the schema, or raise :class:`SchemaError`."""
        for name in data:
            if name not in self._names:
                raise SchemaError(f"field {name!r} is not in the schema", field=str(name))
        out: dict[str, Value] = {}
        for name, kind in self.fields.items():
            if name not in data:
                raise SchemaError(f"field {name!r} is missing", field=name)
            value = data[name]
            if not _fits(value, kind):
                raise SchemaError(
                    f"field {name!r} must be {kind.__name__}, got {type_name(value)} {value!r}",
                    field=name,
                )
            out[name] = float(value) if kind is float else value
        return out

    def to_dict(self) -> dict[str, str]:
        return {name: kind.__name__ for name, kind in self.fields.items()}


class Event(Mapping[str, Value]):
    """An immutable attribute -> value mapping.

    ``Event({"issue": "IBM", "price": 120.0}, schema=s)`` validates against ``s`` and
    raises :class:`SchemaError` naming the field when the data does not fit.
    """

    __slots__ = ("_data", "_hash")

    def __init__(
        self, data: Mapping[str, Any] | None = None, /, *, schema: Schema | None = None, **kw: Any
    ) -> None:
        merged: dict[str, Any] = dict(data or {}, **kw)
        if schema is not None:
            merged = schema.validate(merged)
        else:
            for name, value in merged.items():
                if not isinstance(name, str):
                    raise SchemaError(f"attribute name {name!r} is not a string", field=str(name))
                if type(value) not in (str, int, float, bool):
                    raise SchemaError(
                        f"attribute {name!r} has unsupported value {value!r} ({type(value).__name__})",
                        field=name,
                    )
        self._data: Mapping[str, Value] = MappingProxyType(merged)
        self._hash: int | None = None

    def __getitem__(self, key: str) -> Value:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(frozenset(self._data.items())))
        return self._hash  # type: ignore[return-value]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self._data) == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"Event({dict(self._data)!r})"

    def __setattr__(self, name: str, value: object) -> None:
        if name in Event.__slots__ and not hasattr(self, name):
            object.__setattr__(self, name, value)
            return
        raise AttributeError("Event is immutable")

    def replace(self, **changes: Value) -> Event:
        """A new event with some attributes changed."""
        return Event({**self._data, **changes})

    def to_dict(self) -> dict[str, Value]:
        return dict(self._data)
