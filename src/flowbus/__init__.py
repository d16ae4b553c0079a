"""flowbus: content-based event distribution middleware.

The names most programs need, from the modules that define them. The client
(``connect``, ``Client``, ``SyncClient``) is imported on first use, so that importing any
lower layer (``flowbus.filters``, ``flowbus.matching``, ...) does not load the network stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from flowbus.errors import FilterError, FilterSyntaxError, FlowbusError, ProtocolError, SchemaError, UserError
from flowbus.model import Event, Schema

if TYPE_CHECKING:
    from flowbus.client import Client, SyncClient, connect

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
    "UserError",
    "connect",
]

__version__ = "0.1.0"

_LAZY = {"Client": "flowbus.client", "SyncClient": "flowbus.client", "connect": "flowbus.client"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flowbus' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
