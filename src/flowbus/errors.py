"""Every exception flowbus raises on purpose, in one tree rooted at :class:`FlowbusError`.

Three branches say whose fault it is:

* :class:`UserError`: the caller's input is wrong (a filter with a syntax error, an event
  that does not fit its schema, a flow with a cycle, a config with a bad key...). The
  message names what was wrong and where; fields carry the same for code
  (``SchemaError.field``, ``FilterSyntaxError.line``...). The call that raised it changed
  no state.
* :class:`ProtocolError`: a peer sent something this side cannot handle (a malformed
  frame, an unknown wire tag, a message a core does not take). Close that connection.
* :class:`InternalError`: flowbus broke one of its own rules (two classes claiming one
  wire tag, say): a bug to report.

:class:`StoreFull` is nobody's fault in that sense: the machine ran out of disk under a
broker's store. The write that raised it changed nothing, and the same write succeeds once
space returns; a broker keeps what it could not write in memory and writes it again.
:class:`ExternalError` is the machine's or another program's part too: something flowbus
needs outside its code is missing (Java, pyspark) or did not come up or answer in time (a
broker process it started, a baseline server, a Spark Connect server).

:class:`Undefined` is not a failure of a call: an expression has no value for one event (a
missing field, a division by zero), and the predicate that reads it is false. It is raised
and caught inside the filter and flow code.

:class:`ClientError` is what a client call could not do: the broker refused it
(:class:`PublishError`, :class:`SubscribeError`, with the broker's reason) or no broker
could be reached.

::

    FlowbusError
    ├── UserError
    │   ├── FilterError ── FilterSyntaxError, ColumnUnsupported
    │   ├── SchemaError
    │   ├── FlowError ── ExpandError
    │   ├── SubscriptionError (also a KeyError)
    │   ├── ConfigError
    │   ├── StoreError
    │   ├── AccessError
    │   ├── OverlayError ── TopologyError
    │   ├── SimError ── TransportError
    │   ├── ExperimentError
    │   └── InputError
    ├── ProtocolError ── FrameError
    ├── ClientError ── PublishError, SubscribeError
    ├── StoreFull
    ├── ExternalError
    ├── Undefined
    └── InternalError
"""

from __future__ import annotations

__all__ = [
    "AccessError",
    "ClientError",
    "ColumnUnsupported",
    "ConfigError",
    "ExpandError",
    "ExperimentError",
    "ExternalError",
    "FilterError",
    "FilterSyntaxError",
    "FlowError",
    "FlowbusError",
    "FrameError",
    "InputError",
    "InternalError",
    "OverlayError",
    "ProtocolError",
    "PublishError",
    "SchemaError",
    "SimError",
    "StoreError",
    "StoreFull",
    "SubscribeError",
    "SubscriptionError",
    "TopologyError",
    "TransportError",
    "Undefined",
    "UserError",
]


class FlowbusError(Exception):
    """Root of every error flowbus raises on purpose."""


# ------------------------------------------------------------------------------------ user input


class UserError(FlowbusError):
    """The caller's input cannot be used; the message names what and where, and nothing changed."""


class FilterError(UserError):
    """A filter is well formed text but cannot be used (unknown function, too complex...)."""


class FilterSyntaxError(FilterError):
    """A filter's text does not follow the grammar.

    ``line`` and ``column`` are 1-based; ``expected`` lists what the parser would
    have accepted at that point.
    """

    def __init__(
        self,
        message: str,
        *,
        text: str = "",
        line: int = 0,
        column: int = 0,
        expected: tuple[str, ...] = (),
    ) -> None:
        self.text = text
        self.line = line
        self.column = column
        self.expected = expected
        where = f" at line {line}, column {column}" if line else ""
        want = f" (expected one of: {', '.join(expected)})" if expected else ""
        super().__init__(f"{message}{where}{want}")


class ColumnUnsupported(FilterError):
    """A filter or expression uses something a Spark Column cannot express (a Python
    callable, named in ``function``): the Spark engine evaluates it in Python instead."""

    def __init__(self, message: str, *, function: str) -> None:
        self.function = function
        super().__init__(message)


class SchemaError(UserError):
    """An event or filter does not fit a schema; ``field`` names the culprit."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


class FlowError(UserError):
    """An information flow graph, its spec or its input is not usable; the message says
    where (the spec file, the arc or space) and what was wrong."""


class ExpandError(FlowError):
    """No event sequence takes the start state to the goal (within the bound, if one was given)."""


class SubscriptionError(UserError, KeyError):
    """An unknown subscription id was removed, or a known one added again."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ConfigError(UserError):
    """A broker configuration that cannot be used; the message names the key."""


class StoreError(UserError):
    """A refused change to a broker's store (the store is unchanged)."""


class AccessError(UserError):
    """An identity lacks a right on a space (or flow): ``identity`` (None: not
    authenticated), ``right`` (``publish``, ``subscribe``, ``deploy``), ``space``."""

    def __init__(self, identity: str | None, right: str, space: str) -> None:
        self.identity = identity
        self.right = right
        self.space = space
        who = "an unauthenticated client" if identity is None else f"identity {identity!r}"
        super().__init__(f"{who} has no {right} right on {space!r}")


class OverlayError(UserError):
    """A change or query of a broker overlay that cannot be done (the overlay is unchanged)."""


class TopologyError(OverlayError):
    """A change of CBDLO's attribute topologies that cannot be done (a bad subscription or range)."""


class SimError(UserError):
    """The simulator was asked something impossible (a duplicate node, a time in the past...)."""


class TransportError(SimError):
    """A simulated transport layer was configured with impossible values."""


class ExperimentError(UserError):
    """An experiment's config is invalid (nothing has run); the message names the key."""


class InputError(UserError):
    """Data given as input (a file, a table, an option's JSON) cannot be read or does not fit
    what is asked of it; the message names the file, the row or the option."""


# -------------------------------------------------------------------------------------- protocol


class ProtocolError(FlowbusError):
    """A protocol core or a codec received something it cannot handle."""


class FrameError(ProtocolError):
    """A frame or body that cannot be read or written: malformed, oversized, an unknown
    type tag, a bad field... The message names what was wrong; close the connection."""


# ---------------------------------------------------------------------------------------- client


class ClientError(FlowbusError):
    """The client cannot do what was asked (not connected, closed, no broker answers...)."""


class PublishError(ClientError):
    """A broker refused a published event, or the client gave it up (unacknowledged after its
    ``publish_timeout``): ``pseq`` numbers it, ``reason`` is the broker's, or the client's."""

    def __init__(self, pseq: int, reason: str) -> None:
        self.pseq = pseq
        self.reason = reason
        super().__init__(f"publish #{pseq} refused: {reason}")


class SubscribeError(ClientError):
    """A broker refused a subscription or an unsubscription; the message says why."""


# ----------------------------------------------------------------------------------- environment


class StoreFull(FlowbusError):
    """A broker's store could not write: its disk or database is full (SQLite's "database or
    disk is full", or a "disk I/O error"). ``path`` names the store, ``operation`` the write
    (``"queue 3 events"``), ``reason`` SQLite's words. The write was rolled back: the store is
    as it was, and the same write may succeed once space returns.

    Not a :class:`StoreError`: that one is a :class:`UserError`, a change refused because of
    what the caller asked (a duplicate id), and asking again is refused again. Here the
    request was fine and the machine was not; a caller keeps what it meant to write and
    tries again later (the broker's queues and ledger do, :mod:`flowbus.broker.queues`)."""

    def __init__(self, path: str, operation: str, reason: str) -> None:
        self.path = path
        self.operation = operation
        self.reason = reason
        super().__init__(f"the store {path} is full: cannot {operation} ({reason})")


class ExternalError(FlowbusError):
    """Something flowbus needs outside its own code is missing or failed it: a program or a
    package (Java, pyspark), a process it started or a server it uses that did not come up or
    answer in time. The message names it and what to do."""


# ----------------------------------------------------------------------------------- expressions


class Undefined(FlowbusError):
    """An expression has no value for this event (a missing field, a division by zero...):
    the predicate that reads it is false. Raised and caught inside the filter and flow code."""


# -------------------------------------------------------------------------------------- internal


class InternalError(FlowbusError):
    """flowbus broke one of its own rules: a bug, not a misuse."""
