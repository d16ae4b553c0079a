"""flowbus: content-based event distribution middleware."""

from flowbus.client import Client, SyncClient, connect
from flowbus.errors import FilterError, FilterSyntaxError, FlowbusError, ProtocolError, SchemaError
from flowbus.model import Event, Schema

__all__ = [
    "Client",
    "Event",
    "FilterError",
    "FilterSyntaxError",
    "FlowbusError",
    "ProtocolError",
    "Schema",
    "SchemaError",
    "SyncClient",
    "connect",
]

__version__ = "0.1.0"
