"""The event model: schemas validate, events are immutable, errors name the field."""

from __future__ import annotations

import pytest

from flowbus import Event, Schema, SchemaError

STOCK = Schema.of({"issue": "str", "price": "float", "vol": "int", "halted": "bool"})


def test_valid_event_is_normalised() -> None:
    e = Event({"issue": "IBM", "price": 120, "vol": 300, "halted": False}, schema=STOCK)
    assert e["price"] == 120.0 and type(e["price"]) is float
    assert dict(e) == {"issue": "IBM", "price": 120.0, "vol": 300, "halted": False}
    assert e == {"issue": "IBM", "price": 120.0, "vol": 300, "halted": False}
    assert hash(e) == hash(Event(dict(e)))


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"issue": "IBM", "price": 1.0, "vol": 3}, "halted", "missing"),
        ({"issue": "IBM", "price": "1", "vol": 3, "halted": False}, "price", "must be float"),
        ({"issue": "IBM", "price": 1.0, "vol": True, "halted": False}, "vol", "must be int"),
        ({"issue": "IBM", "price": 1.0, "vol": 2.5, "halted": False}, "vol", "must be int"),
        ({"issue": 7, "price": 1.0, "vol": 3, "halted": False}, "issue", "must be str"),
        ({"issue": "IBM", "price": 1.0, "vol": 3, "halted": 0}, "halted", "must be bool"),
        ({"issue": "IBM", "price": 1.0, "vol": 3, "halted": False, "x": 1}, "x", "not in the schema"),
    ],
)
def test_schema_errors_name_the_field(data: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(SchemaError, match=words) as info:
        Event(data, schema=STOCK)
    assert info.value.field == field
    assert field in str(info.value)


def test_events_are_immutable() -> None:
    e = Event(issue="IBM", price=1.5)
    with pytest.raises(AttributeError):
        e._data = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        e["price"] = 2.0  # type: ignore[index]
    assert e.replace(price=2.0)["price"] == 2.0 and e["price"] == 1.5


def test_schemaless_event_rejects_unsupported_values() -> None:
    with pytest.raises(SchemaError) as info:
        Event({"when": object()})
    assert info.value.field == "when"


@pytest.mark.parametrize("spec", [{"price": "decimal"}, {"9lives": "int"}, {"x": list}])
def test_bad_schemas_are_refused(spec: dict[str, object]) -> None:
    with pytest.raises(SchemaError):
        Schema(spec)  # type: ignore[arg-type]


def test_schema_lookup() -> None:
    assert STOCK.type_of("vol") is int and "vol" in STOCK and len(STOCK) == 4
    assert STOCK.to_dict()["price"] == "float"
    with pytest.raises(SchemaError, match="unknown field 'volume'"):
        STOCK.type_of("volume")
