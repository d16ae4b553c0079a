"""The keys of a ring broker's state, in one place: what each kind of entry is filed under.

The state (:class:`~flowbus.overlay.ring_backups.Backups`: backed up on ring neighbours,
taken over with the broker) maps keys to values. Each kind of key is a typed record (a
named tuple) whose first field is its tag; the index finds the entries of one tag and
second field (``keys_of``) without a scan. On the wire a key is a plain tuple, equal to its
record (the same fields, the same hash), and :func:`record` makes the record again where
entries come in from other brokers (a takeover, a share):

* :class:`SubKey` ``(SUB, sub, home)`` -> ``(filter text, meta)``: a subscription served
  here (:mod:`flowbus.routing.ring_broker`), ``home`` the broker it was made at;
* :class:`DiskKey` ``(DISK, sub, home)`` -> True: its queue has events on ``home``'s disk
  (:mod:`flowbus.routing.ring_handover`);
* :class:`ConsumedKey` ``(CONSUMED, sub, publisher)`` -> a sequence number: its client has
  consumed each of ``publisher``'s events up to it (a taker drops them when it delivers
  again: :meth:`RingBroker.consume <flowbus.routing.ring_broker.RingBroker.consume>`);
* :class:`FlowSubKey` ``(FLOW_SUB, sub)`` -> ``(space, filter text)``: a subscription to a
  deployed flow's space (:mod:`flowbus.routing.ring_flows`);
* :class:`RowKey` ``(ROW, flow, deploy, owner, state, key)`` -> ``(version, row)``: a row of
  a flow's state held by its partition's owner, and :class:`LogKey` ``(LOG, partition, n)``:
  an entry of a partition's fold log (:mod:`flowbus.routing.flows`).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, NamedTuple

__all__ = [
    "CONSUMED",
    "DISK",
    "FLOW_SUB",
    "LOG",
    "ROW",
    "SUB",
    "ConsumedKey",
    "DiskKey",
    "FlowSubKey",
    "LogKey",
    "RowKey",
    "SubKey",
    "consumed_key",
    "disk_key",
    "flow_sub_key",
    "log_key",
    "record",
    "row_key",
    "sub_key",
]

SUB = "sub"
DISK = "disk"
CONSUMED = "consumed"
FLOW_SUB = "fsub"
ROW = "frow"
LOG = "fseen"


class SubKey(NamedTuple):
    tag: str
    sub: Hashable
    home: int


class DiskKey(NamedTuple):
    tag: str
    sub: Hashable
    home: int


class ConsumedKey(NamedTuple):
    tag: str
    sub: Hashable
    publisher: str


class FlowSubKey(NamedTuple):
    tag: str
    sub: Hashable


class RowKey(NamedTuple):
    tag: str
    flow: str
    deploy: Any
    owner: int
    state: str
    key: Any


class LogKey(NamedTuple):
    tag: str
    partition: Hashable
    n: int


_RECORDS: dict[str, type[tuple[Any, ...]]] = {
    SUB: SubKey,
    DISK: DiskKey,
    CONSUMED: ConsumedKey,
    FLOW_SUB: FlowSubKey,
    ROW: RowKey,
    LOG: LogKey,
}


def sub_key(sub_id: Hashable, home: int) -> SubKey:
    return SubKey(SUB, sub_id, home)


def disk_key(sub: Hashable, home: int) -> DiskKey:
    """The entry saying ``sub``'s queue has events on the disk of broker ``home``."""
    return DiskKey(DISK, sub, home)


def consumed_key(sub: Hashable, publisher: str) -> ConsumedKey:
    """The entry saying how far ``sub``'s client has consumed ``publisher``'s events."""
    return ConsumedKey(CONSUMED, sub, publisher)


def flow_sub_key(sub_id: Hashable) -> FlowSubKey:
    return FlowSubKey(FLOW_SUB, sub_id)


def row_key(flow: str, deploy_id: Any, owner: int, state: str, key: Any) -> RowKey:
    return RowKey(ROW, flow, deploy_id, owner, state, key)


def log_key(partition: Hashable, n: int) -> LogKey:
    return LogKey(LOG, partition, n)


def record(key: Hashable) -> Hashable:
    """``key`` as its record (a plain tuple off the wire with a known tag and its record's
    length); any other key as it is."""
    if type(key) is tuple and key and isinstance(key[0], str):
        kind = _RECORDS.get(key[0])
        if kind is not None and len(key) == len(kind._fields):  # type: ignore[attr-defined]
            return kind._make(key)  # type: ignore[attr-defined,no-any-return]
    return key
