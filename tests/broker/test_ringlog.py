"""The ring log: one line per change of the broker's view of the ring, none when a step
changed nothing, nothing before the broker joined or when the log does not show info."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from flowbus.broker.ringlog import RingLog
from flowbus.overlay.ring_load import LoadShare, Overloaded
from flowbus.overlay.ring_messages import Peer as RingPeer


@dataclass
class Peer:
    id: int
    addr: int


@dataclass
class Ring:
    """What the ring log reads of a :class:`~flowbus.overlay.chordal_ring.RingNode`."""

    id: int | None = 7
    version: int = 1
    succ: list[Peer] = field(default_factory=lambda: [Peer(9, (0x7F000001 << 16) | 7002)])
    pred: list[Peer] = field(default_factory=list)
    dead: set[int] = field(default_factory=set)
    taken_over: list[int] = field(default_factory=list)
    watched: int = 0
    suspects: list[int] = field(default_factory=list)
    loads: LoadShare = field(default_factory=LoadShare)

    @property
    def joined(self) -> bool:
        return self.id is not None

    @property
    def window(self) -> list[Peer]:
        return [*self.succ, *self.pred]


def test_one_line_per_change(caplog: pytest.LogCaptureFixture) -> None:
    ring = Ring(id=None)
    log = logging.getLogger("flowbus.broker.test")
    ringlog = RingLog(ring, "127.0.0.1:7001", log)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger=log.name):
        ringlog.update()  # not joined yet
        ring.id = 7
        ringlog.update()
        ringlog.update()  # nothing changed
        ring.version += 1  # a change the log does not show: no line
        ringlog.update()
        ring.dead.add(9)
        ring.suspects.append(9)
        ringlog.update()
    assert [r.getMessage() for r in caplog.records] == [
        "ring 127.0.0.1:7001 (id 7): window ['127.0.0.1:7002'], suspects [], dead [], taken over []",
        "ring 127.0.0.1:7001 (id 7): window ['127.0.0.1:7002'], suspects [9], dead [9], taken over []",
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=log.name):
        ring.taken_over.append(9)
        ringlog.update()
    assert caplog.records == []


def test_a_request_for_a_broker_is_logged_and_handed_on_once(caplog: pytest.LogCaptureFixture) -> None:
    ring = Ring()
    log = logging.getLogger("flowbus.broker.test")
    ringlog = RingLog(ring, "127.0.0.1:7001", log)  # type: ignore[arg-type]
    asked: list[Overloaded] = []
    ringlog.on_overloaded = asked.append
    with caplog.at_level(logging.WARNING, logger=log.name):
        ringlog.update()
        ring.loads.requests, ring.loads.last_request = 1, Overloaded(RingPeer(7, 1), 1.5, 0.0, 3)
        ringlog.update()
        ringlog.update()  # the same request: not again
    assert asked == [ring.loads.last_request]
    assert [r.getMessage() for r in caplog.records] == [
        "ring 127.0.0.1:7001 over its limit (load 1.50): asks for another broker"
    ]
