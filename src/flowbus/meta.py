"""Event metadata: the hidden fields an event carries on the bus, in one place.

A hidden field's name starts with ``__``. A publisher cannot set one (the broker refuses the
event, :mod:`flowbus.broker.spaces`), the brokers set and read them, and :func:`strip` takes
them all away before an event reaches a subscriber.

* :data:`EVENT_ID` -- the event's id between brokers: (publishing broker, sequence number).
* :data:`SPACE` -- the event's space; a subscription's routed filter is
  ``__space = "<space>" & (<filter>)``.
* :data:`DERIVED` -- the prefix of a source event's derived attributes, stamped by the broker
  that takes the publish (``__x.<flow>.<space>.<n>``: ``price * vol``, ``NYS(issue)``), so that
  the routed filters compare them as plain attributes.
* :data:`HASH_FIELD` -- the prefix of a key's hash (``__h.<flow>.<group>.<feed>``), which routes
  an event to the owner of the key's range.
* :data:`UNROUTED` -- set on an event that reaches a subscription without the network having
  matched it against the subscription's routed filter (a snapshot): the edge checks it all.
* :data:`PARTITION`, :data:`KEY`, :data:`ROW_VERSION`, :data:`STATE` -- on a derived event: its
  partition's owner id, its key (text), the row's version, and the state it comes from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "DERIVED",
    "EVENT_ID",
    "HASH_FIELD",
    "HIDDEN",
    "KEY",
    "PARTITION",
    "ROW_VERSION",
    "SPACE",
    "STATE",
    "UNROUTED",
    "is_hidden",
    "strip",
]

HIDDEN = "__"
"""The prefix of every hidden field."""

EVENT_ID = "__flowbus_event_id"
SPACE = "__space"
DERIVED = "__x"
HASH_FIELD = "__h"
UNROUTED = "__unrouted"
PARTITION = "__fp"
KEY = "__fk"
ROW_VERSION = "__fv"
STATE = "__fs"


def is_hidden(name: str) -> bool:
    """Is ``name`` a hidden field (metadata, not the publisher's)?"""
    return name.startswith(HIDDEN)


def strip(event: Mapping[str, Any]) -> dict[str, Any]:
    """``event``'s fields without the hidden ones: what a subscriber receives."""
    return {k: v for k, v in event.items() if not k.startswith(HIDDEN)}
