"""The keys of a ring broker's state, in one place: what each kind of entry is filed under.

The state (:class:`~flowbus.overlay.ring_backups.Backups`: backed up on ring neighbours,
taken over with the broker) maps tagged tuples to values; the tag is the first field and
the index finds the entries of one tag and second field (``keys_of``) without a scan. The
keys cross the wire in backups as plain tuples, so they are made here, and only here:

* ``(SUB, subscription, home)`` -> ``(filter text, meta)``: a subscription served here
  (:mod:`flowbus.routing.ring_broker`), ``home`` the broker it was made at;
* ``(DISK, subscription, broker)`` -> True: its queue has events on ``broker``'s disk
  (:mod:`flowbus.routing.ring_handover`);
* ``(FLOW_SUB, subscription)`` -> ``(space, filter text)``: a subscription to a deployed
  flow's space (:mod:`flowbus.routing.ring_flows`);
* ``(ROW, flow, deploy id, owner, state, key)`` -> ``(version, row)``: a row of a flow's
  state held by its partition's owner, and ``(LOG, partition, n)``: an entry of a
  partition's fold log (:mod:`flowbus.routing.flows`).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

__all__ = [
    "DISK",
    "FLOW_SUB",
    "LOG",
    "ROW",
    "SUB",
    "disk_key",
    "flow_sub_key",
    "log_key",
    "row_key",
    "sub_key",
]

SUB = "sub"
DISK = "disk"
FLOW_SUB = "fsub"
ROW = "frow"
LOG = "fseen"


def sub_key(sub_id: Hashable, home: int) -> tuple[str, Hashable, int]:
    return (SUB, sub_id, home)


def disk_key(sub: Hashable, home: int) -> tuple[str, Hashable, int]:
    """The entry saying ``sub``'s queue has events on the disk of broker ``home``."""
    return (DISK, sub, home)


def flow_sub_key(sub_id: Hashable) -> tuple[str, Hashable]:
    return (FLOW_SUB, sub_id)


def row_key(flow: str, deploy_id: Any, owner: int, state: str, key: Any) -> tuple[Any, ...]:
    return (ROW, flow, deploy_id, owner, state, key)


def log_key(partition: Hashable, n: int) -> tuple[str, Hashable, int]:
    return (LOG, partition, n)
