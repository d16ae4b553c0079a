"""flowbus: content-based event distribution middleware."""

from flowbus.errors import FilterError, FilterSyntaxError, FlowbusError, ProtocolError, SchemaError
from flowbus.model import Event, Schema

__all__ = [
    "Event",
    "FilterError",
    "FilterSyntaxError",
    "FlowbusError",
    "ProtocolError",
    "Schema",
    "SchemaError",
]

__version__ = "0.1.0"
