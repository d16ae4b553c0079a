"""The publish ledger without sockets: a batch published once, refused events named,
re-sends acknowledged and not published twice, the SQLite mark kept below the lowest
publish not settled (so a restart publishes again what might have been lost); a mark a full
store cannot take waits in memory and is written later."""

from __future__ import annotations

from typing import Any

from tests.broker.fakes import FakeCore, Recorder, apply
from tests.broker.full_disk import FullDisk

from flowbus.broker.adverts import Adverts
from flowbus.broker.config import DEFAULT, BrokerConfig
from flowbus.broker.ledger import Ledger
from flowbus.broker.spaces import Spaces
from flowbus.broker.store import Store
from flowbus.client import protocol as p
from flowbus.errors import StoreFull
from flowbus.meta import SPACE


def ledger(store: Store, config: BrokerConfig = DEFAULT) -> tuple[Ledger, FakeCore]:
    core = FakeCore()
    spaces = Spaces(config)
    adverts = Adverts(core=core, apply=apply, spaces=spaces, enabled=config.advertising)
    return Ledger(core=core, apply=apply, store=store, spaces=spaces, adverts=adverts), core


def publish(items: list[tuple[int, Any]], space: str = "events") -> p.Publish:
    return p.Publish(space, p.pack_publish(items))


def test_a_batch_is_published_once_and_acknowledged_when_settled() -> None:
    led, core = ledger(Store(":memory:"))
    c = Recorder("c")
    led.publish(c, [publish([(1, {"x": 1}), (2, {"x": 2}), (3, {"x": 3})])])
    (batch,) = core.called("publish")
    assert batch[0] == [(("c", n), {"x": n, SPACE: "events"}) for n in (1, 2, 3)]
    assert c.acks == [] and led.published == 3
    led.settled([("c", 1), ("c", 2)], {"c": c})
    assert c.acks == [1, 2]
    led.publish(c, [publish([(1, {"x": 1}), (3, {"x": 3})])])
    assert c.acks == [1, 2, 1]  # settled: acknowledged again; in flight: when it settles
    assert len(core.called("publish")) == 1  # neither published twice
    led.settled([("c", 3)], {})  # (its client is away: nothing to tell)
    assert c.acks == [1, 2, 1]


def test_the_batches_of_one_read_go_to_the_core_in_one_step_as_if_taken_one_by_one() -> None:
    led, core = ledger(Store(":memory:"))
    c = Recorder("c")
    led.publish(c, [publish([(1, {"x": 1}), (2, {"x": 2})]), publish([(2, {"x": 2}), (3, {"x": 3})])])
    (batch,) = core.called("publish")  # one step of the core for both batches
    assert [eid for eid, _ in batch[0]] == [("c", 1), ("c", 2), ("c", 3)]  # the re-sent 2 once
    assert c.acks == []  # (the re-send waits for its first copy to settle)
    led.settled([("c", 2)], {"c": c})
    assert c.acks == [2] and led.published == 3


def test_refused_events_are_named_and_the_others_published() -> None:
    led, core = ledger(Store(":memory:"))
    c = Recorder("c")
    good = {"symbol": "IBM", "price": 1.0, "quantity": 1, "exchange": "X", "level": 1}
    items = [(0, good), (1, {**good, "price": "high"}), (2, {"__x": 1}), (3, good)]
    led.publish(c, [publish(items, "stocks")])
    nacks = [(m.pseq, m.error) for m in c.sent]
    assert nacks[0] == (0, "bad publish sequence number 0")
    assert nacks[1][0] == 1 and "space 'stocks': field 'price' must be float" in nacks[1][1]
    assert nacks[2] == (2, "field names starting with '__' are reserved")
    assert [eid for eid, _ in core.called("publish")[0][0]] == [("c", 3)]
    led.publish(c, [publish([(4, {"x": 1})], "nope")])
    assert c.sent[-1] == p.Nack(4, "unknown space 'nope' (known: events, stocks)")


def test_with_advertising_a_publish_needs_a_matching_advertisement() -> None:
    led, core = ledger(Store(":memory:"), DEFAULT.with_(advertising=True))
    c = Recorder("c")
    led.publish(c, [publish([(1, {"x": 1})])])
    assert c.sent == [p.Nack(1, "no advertisement of this client matches the event in 'events'")]
    assert led.adverts.advertise(c, p.Advertise(1, "a", "events", "x > 0")) == (True, None)
    led.publish(c, [publish([(2, {"x": 1}), (3, {"x": 0})])])
    assert [eid for eid, _ in core.called("publish")[0][0]] == [("c", 2)]
    assert c.sent[-1] == p.Nack(3, "no advertisement of this client matches the event in 'events'")


def test_the_mark_in_sqlite_stays_below_the_lowest_publish_not_settled() -> None:
    store = Store(":memory:")
    led, _ = ledger(store)
    c = Recorder("c")
    led.publish(c, [publish([(n, {"x": n}) for n in range(1, 6)])])
    assert store.last_seq("c") == 0  # none settled yet
    led.settled([("c", 1), ("c", 2), ("c", 4)], {"c": c})
    led.publish(c, [publish([(6, {"x": 6})])])
    assert store.last_seq("c") == 2  # 3 is not settled: the mark stays below it
    again, core = ledger(store)  # the broker restarts on its store
    c = Recorder("c")
    again.publish(c, [publish([(2, {"x": 2}), (3, {"x": 3})])])
    assert c.acks == [2]  # at or below the mark: acknowledged
    assert [eid for eid, _ in core.called("publish")[0][0]] == [("c", 3)]  # above: again


def test_a_mark_the_full_store_cannot_take_waits_in_memory_and_is_written_later() -> None:
    store = Store(":memory:")
    led, core = ledger(store)
    c = Recorder("c")
    led.publish(c, [publish([(1, {"x": 1})])])
    led.settled([("c", 1)], {"c": c})
    disk = FullDisk.under(store)
    led.publish(c, [publish([(2, {"x": 2}), (3, {"x": 3})])])  # (the mark 1 cannot be written)
    assert len(core.called("publish")) == 2 and disk.failed == 1  # published all the same
    assert store.last_seq("c") == 0 and isinstance(led.full, StoreFull)
    led.settled([("c", 2), ("c", 3)], {"c": c})
    assert c.acks == [1, 2, 3]  # (acknowledged: the disk has their events, or their subscribers)
    led.retry()  # still full: it waits
    assert store.last_seq("c") == 0 and disk.failed == 2
    disk.full = False
    led.retry()
    assert store.last_seq("c") == 1 and led.full is None  # (lagging behind 3: safe)
    led.publish(c, [publish([(4, {"x": 4})])])
    assert store.last_seq("c") == 3
