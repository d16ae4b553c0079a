"""A broker's subscription queues without sockets: one row per event and connection for all
its subscriptions there; the window, the memory bound and the spill to SQLite, in order;
acknowledgements of a connection's deliveries settle what was in custody for each
subscription; a lost connection puts the deliveries in flight back in front and lets a
non-durable subscription linger, then end. A full store (faked): spills wait in memory, in
order and in custody, until it takes them; past a limit a delivery is refused with the
reason; a subscription it cannot record is refused; an acknowledgement it cannot write waits."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from tests.broker.fakes import Connection, FakeCore, apply
from tests.broker.full_disk import FullDisk

from flowbus.broker.config import DEFAULT, BrokerConfig
from flowbus.broker.queues import Queues, SubQueue
from flowbus.broker.spaces import Spaces
from flowbus.broker.store import Store
from flowbus.client import protocol as p
from flowbus.errors import StoreFull
from flowbus.meta import EVENT_ID, SPACE


def queues(config: BrokerConfig = DEFAULT) -> tuple[Queues, FakeCore, Store]:
    core, store = FakeCore(), Store(":memory:")
    return Queues(core=core, apply=apply, store=store, spaces=Spaces(config), config=config), core, store


def event(n: int) -> dict[str, Any]:
    return {EVENT_ID: ("pub", n), SPACE: "events", "x": n}


async def turn() -> None:
    """Let the event loop run what the queues scheduled (pumps, settles)."""
    for _ in range(3):
        await asyncio.sleep(0)


def test_a_subscription_queue_keeps_its_order() -> None:
    sub = SubQueue("s", "c", "events", "x > 0", False, None)
    sub.queue().extend((("p", n), {"x": n}, None) for n in range(1, 6))
    sub.in_memory = 5
    batch = sub.take(3)
    assert [e[0] for e in batch] == [("p", 1), ("p", 2), ("p", 3)] and sub.unacked == 3
    sub.detach(batch[2:])  # (3 was in flight: back in front of 4 and 5)
    assert [e[0] for e in sub.pending] == [("p", 3), ("p", 4), ("p", 5)] and sub.unacked == 0
    assert sub.in_custody() == [(("p", n), 1) for n in (3, 4, 5)]
    assert SubQueue.from_meta("s", sub.meta()).meta() == sub.meta()  # (what a takeover needs)


def test_an_event_goes_to_a_connection_once_for_all_its_subscriptions_there() -> None:
    async def main() -> None:
        q, core, _ = queues()
        c, d = Connection("c"), Connection("d")
        for i, (who, sub_id) in enumerate([(c, "s1"), (c, "s2"), (d, "s3")], 1):
            assert q.subscribe(who, p.Subscribe(i, sub_id, "events", "x > 0")) == (True, None)
        for n in (1, 2):
            one = event(n)  # (the core hands one event object to each of its deliveries)
            for sub_id in ("s1", "s2", "s3"):
                q.on_deliver(0, sub_id, one)
        q.on_deliver(0, "s2", event(3))
        assert c.rows == [
            (["s1", "s2"], 1, ("pub", 1), {"x": 1}),  # (hidden fields stripped)
            (["s1", "s2"], 2, ("pub", 2), {"x": 2}),
            (["s2"], 3, ("pub", 3), {"x": 3}),
        ]
        assert [(subs, n) for subs, n, _, _ in d.rows] == [(["s3"], 1), (["s3"], 2)]
        q.ack(c, [(1, 1), (3, 3)])  # (the client took 1 and 3 for every subscription)
        await turn()
        assert core.called("settle") == [([(("pub", 1), 2), (("pub", 3), 1)],)]
        assert list(q.flight(c).inflight) == [2] and q.subs["s2"].unacked == 1 and q.in_memory() == 4
        q.ack(c, [(1, 10**9)])  # (numbers acknowledged twice or never sent: nothing more)
        await turn()
        assert core.called("settle")[1:] == [([(("pub", 2), 2)],)]
        assert not q.flight(c).inflight and q.in_memory() == 2  # (d's two, unacknowledged)

    asyncio.run(main())


def test_window_memory_and_spill_keep_the_order() -> None:
    async def main() -> None:
        q, core, store = queues(DEFAULT.with_(window=2, memory=3))
        c = Connection("c")
        assert q.subscribe(c, p.Subscribe(1, "s", "events", "x > 0")) == (True, None)
        assert core.called("subscribe") == [("s", '__space = "events" & x > 0')]
        for n in range(1, 7):
            q.on_deliver(0, "s", event(n))
        q.after_step()  # the core's step ends: past memory, on disk and settled
        assert store.depth("s") == 3 and q.spilled == 3 and q.delivered == 6
        await turn()
        assert core.called("settle") == [([(("pub", n), 1) for n in (4, 5, 6)],)]
        assert [(d, eid) for _, d, eid, _ in c.rows] == [(1, ("pub", 1)), (2, ("pub", 2))]  # the window
        for upto in (2, 4):
            q.ack(c, [(1, upto)])
            await turn()
        assert [eid for _, _, eid, _ in c.rows] == [("pub", n) for n in range(1, 7)]  # (4-6 from disk)
        assert [n for _, n, _, _ in c.rows] == [1, 2, 3, 4, 5, 6]
        assert core.called("settle")[1:] == [
            ([(("pub", 1), 1), (("pub", 2), 1)],),
            ([(("pub", 3), 1)],),
        ]
        assert store.depth("s") == 2  # (a spilled event leaves the disk once acknowledged)
        q.ack(c, [(5, 6)])
        assert store.depth("s") == 0 and q.in_memory() == 0

    asyncio.run(main())


def test_a_subscription_moved_to_another_connection_takes_its_deliveries_along() -> None:
    async def main() -> None:
        q, core, _ = queues()
        old = Connection("c")
        q.subscribe(old, p.Subscribe(1, "a", "events", "x > 0"))
        q.subscribe(old, p.Subscribe(2, "b", "events", "x > 0"))
        for n in (1, 2):
            one = event(n)
            q.on_deliver(0, "a", one)
            q.on_deliver(0, "b", one)
        new = Connection("c")  # (the client came back before its old connection was seen to go)
        assert q.subscribe(new, p.Subscribe(3, "a", "events", "x > 0", resume=True)) == (True, None)
        await turn()
        assert [(subs, n, eid) for subs, n, eid, _ in new.rows] == [
            (["a"], 1, ("pub", 1)),
            (["a"], 2, ("pub", 2)),
        ]
        assert [subs for _, _, subs, _ in q.flight(old).inflight.values()] == [[q.subs["b"]], [q.subs["b"]]]
        q.ack(old, [(1, 2)])
        await turn()
        assert core.called("settle") == [([(("pub", 1), 1), (("pub", 2), 1)],)]
        q.session_ended(new, bye=True)  # ("a" ends, what it had in flight settled)
        assert core.called("settle")[1:] == [([(("pub", 1), 1), (("pub", 2), 1)],)]

    asyncio.run(main())


def test_a_lost_connection_puts_deliveries_back_and_lingers() -> None:
    async def main() -> None:
        q, core, _ = queues(DEFAULT.with_(linger=0.05))
        c = Connection("c")
        q.subscribe(c, p.Subscribe(1, "s", "events", "x > 0"))
        q.subscribe(c, p.Subscribe(2, "d", "events", "x > 0", durable=True))
        q.on_deliver(0, "s", event(1))
        assert len(c.rows) == 1
        q.session_ended(c, bye=False)  # (the connection was lost)
        assert [e[0] for e in q.subs["s"].pending] == [("pub", 1)] and q.attached(c) == set()
        back = Connection("c")
        assert q.subscribe(back, p.Subscribe(3, "s", "events", "x > 0", resume=True)) == (True, None)
        await turn()
        assert [(d, eid) for _, d, eid, _ in back.rows] == [(1, ("pub", 1))]  # numbered anew
        q.session_ended(back, bye=False)
        await asyncio.sleep(0.1)  # the linger runs out: the subscription ends, its event settled
        assert set(q.subs) == {"d"}
        assert core.called("unsubscribe") == [("s",)]
        assert core.called("settle")[-1] == ([(("pub", 1), 1)],)

    asyncio.run(main())


def test_bye_ends_the_subscriptions_that_are_not_durable() -> None:
    async def main() -> None:
        q, _, store = queues()
        c = Connection("c")
        q.subscribe(c, p.Subscribe(1, "s", "events", "x > 0"))
        q.subscribe(c, p.Subscribe(2, "d", "events", "x > 0", durable=True))
        assert q.subscribe(Connection("other"), p.Subscribe(3, "d", "events", "x > 0")) == (
            False,
            "subscription 'd' is attached to another client",
        )
        q.session_ended(c, bye=True)
        assert set(q.subs) == {"d"} and q.subs["d"].session is None
        assert [r.sub_id for r in store.subscriptions()] == ["d"]
        q.on_deliver(0, "d", event(1))  # its client is away: on disk at once
        q.after_step()
        assert store.depth("d") == 1 and q.in_memory() == 0
        assert q.subscribe(c, p.Subscribe(4, "gone", "events", "x > 0", resume=True)) == (False, p.NOT_HERE)

    asyncio.run(main())


def test_what_waits_for_a_durable_subscription_whose_client_left_goes_to_disk_and_is_settled() -> None:
    """Its publishers are not kept waiting for a client that may be gone for long; it gets
    the events, in order, when it is back."""

    async def main() -> None:
        q, core, store = queues(DEFAULT.with_(window=2))
        c = Connection("c")
        q.subscribe(c, p.Subscribe(1, "d", "events", "x > 0", durable=True))
        for n in (1, 2, 3):  # 1 and 2 in flight, 3 waiting in memory
            q.on_deliver(0, "d", event(n))
        await turn()
        assert len(c.rows) == 2 and store.depth("d") == 0
        q.session_ended(c, bye=True)
        assert store.depth("d") == 3 and q.in_memory() == 0
        assert core.called("settle")[-1] == ([(("pub", n), 1) for n in (1, 2, 3)],)
        q.on_deliver(0, "d", event(4))  # (away: on disk, after them)
        q.after_step()
        back = Connection("c")
        assert q.subscribe(back, p.Subscribe(2, "d", "events", "x > 0", resume=True)) == (True, None)
        await turn()
        assert [eid for _, _, eid, _ in back.rows] == [("pub", 1), ("pub", 2)]  # the window
        q.close()

    asyncio.run(main())


def test_a_delivery_given_back_goes_to_the_front_of_its_queue_and_its_row_stays_for_the_others() -> None:
    """A STOMP NACK: the delivery is sent again to that subscription (a new row), before what
    waited; the row's other subscription still has it in flight, settled when acknowledged."""

    async def main() -> None:
        q, core, _ = queues(DEFAULT.with_(window=2))
        c = Connection("c")
        for i, sub_id in enumerate(("s1", "s2"), 1):
            q.subscribe(c, p.Subscribe(i, sub_id, "events", "x > 0"))
        one = event(1)
        q.on_deliver(0, "s1", one)
        q.on_deliver(0, "s2", one)
        for n in (2, 3):  # (s1: 2 in flight, 3 waits for room in its window)
            q.on_deliver(0, "s1", event(n))
        assert [(subs, cseq) for subs, cseq, _, _ in c.rows] == [(["s1", "s2"], 1), (["s1"], 2)]
        q.give_back(c, [(1, "s1"), (7, "s1"), (2, "s2")])  # (the unknown ones: nothing)
        await turn()
        assert [(subs, cseq, eid) for subs, cseq, eid, _ in c.rows[2:]] == [(["s1"], 3, ("pub", 1))]
        assert q.subs["s1"].unacked == 2 and [e[0] for e in q.subs["s1"].pending] == [("pub", 3)]
        q.ack(c, [(1, 1)])  # (s2 took it)
        await turn()
        assert core.called("settle") == [([(("pub", 1), 1)],)]
        q.ack(c, [(2, 3)])
        await turn()
        assert core.called("settle")[1:] == [([(("pub", 2), 1), (("pub", 1), 1)],)]
        assert [eid for _, _, eid, _ in c.rows[3:]] == [("pub", 3)]
        q.close()

    asyncio.run(main())


def test_disk_rows_acknowledged_out_of_order_go_only_once_every_row_before_them_did() -> None:
    """A STOMP client-individual client may acknowledge a durable subscription's events in
    any order, or give one back: its SQLite queue keeps every row from the first one not
    acknowledged on (a restart would send them again, none is lost)."""

    async def main() -> None:
        q, _, store = queues()
        c = Connection("c")
        q.subscribe(c, p.Subscribe(1, "d", "events", "x > 0", durable=True))
        q.session_ended(c, bye=False)  # (away: what comes goes to disk)
        for n in range(1, 6):
            q.on_deliver(0, "d", event(n))
        q.after_step()
        back = Connection("c")
        q.subscribe(back, p.Subscribe(2, "d", "events", "x > 0", resume=True))
        await turn()
        assert [(cseq, eid) for _, cseq, eid, _ in back.rows] == [(n, ("pub", n)) for n in range(1, 6)]
        q.ack(back, [(2, 2), (4, 4)])
        assert store.depth("d") == 5  # (1 is not acknowledged: nothing goes)
        q.give_back(back, [(1, "d")])  # (1 back: sent again as 6)
        await turn()
        assert back.rows[-1][1:3] == (6, ("pub", 1))
        q.ack(back, [(3, 3)])
        assert store.depth("d") == 5
        q.ack(back, [(6, 6)])  # (1 at last: 1 to 4 go, 5 waits for its acknowledgement)
        assert store.depth("d") == 1
        q.ack(back, [(5, 5)])
        assert store.depth("d") == 0
        q.close()

    asyncio.run(main())


def test_one_steps_spills_take_their_queue_positions_in_the_order_they_came() -> None:
    """Over all subscriptions (a reader of several queues merges them by position: Spark's
    pulled subscriptions, one per space, in the order the broker took the events)."""

    async def main() -> None:
        q, _, store = queues()
        c = Connection("c")
        for i, sub_id in enumerate(("a", "b"), 1):
            q.subscribe(c, p.Subscribe(i, sub_id, "events", "x > 0", durable=True))
        q.session_ended(c, bye=True)  # (both away: what comes goes to disk)
        for n, sub_id in enumerate(("a", "b", "b", "a", "b", "a"), 1):
            q.on_deliver(0, sub_id, event(n))
        q.after_step()
        seqs = {sub_id: [r.seq for r in store.pending(sub_id, limit=10, after=0)] for sub_id in ("a", "b")}
        ranked = sorted((seq, sub_id) for sub_id, ss in seqs.items() for seq in ss)
        assert [sub_id for _, sub_id in ranked] == ["a", "b", "b", "a", "b", "a"]
        q.close()

    asyncio.run(main())


REASON = (
    "broker 10.0.0.1:7000 cannot queue the event for subscription 'd': "
    "its store is full (database or disk is full)"
)


def full_queues(config: BrokerConfig = DEFAULT) -> tuple[Queues, FakeCore, Store, FullDisk]:
    """Queues on a store whose disk is full (``disk.full = False``: space is back)."""
    core, store = FakeCore(), Store(":memory:")
    q = Queues(
        core=core, apply=apply, store=store, spaces=Spaces(config), config=config, name="broker 10.0.0.1:7000"
    )
    return q, core, store, FullDisk(store._db)


def test_while_the_store_is_full_spills_wait_in_memory_in_order_unsettled_then_go_to_disk() -> None:
    async def main() -> None:
        q, core, store, disk = full_queues(DEFAULT.with_(window=2))
        store._db = disk  # type: ignore[assignment]
        c = Connection("c")
        q.subscribe(c, p.Subscribe(1, "d", "events", "x > 0", durable=True))
        for n in (1, 2, 3):  # 1 and 2 in flight, 3 waiting in memory
            q.on_deliver(0, "d", event(n))
        q.after_step()
        await turn()
        disk.full = True
        q.session_ended(c, bye=True)  # its client leaves: they are for the disk, which is full
        for n in (4, 5):  # (away: for the disk, behind them)
            q.on_deliver(0, "d", event(n))
        q.after_step()
        q.retry()  # (the broker's timer: still full)
        await turn()
        assert isinstance(q.full, StoreFull) and disk.failed >= 2
        assert core.called("settle") == [] and store.depth("d") == 0  # in custody, in memory
        assert [eid for eid, *_ in q.subs["d"].held] == [("pub", n) for n in range(1, 6)]
        assert q.in_memory() == 5 and q.spilled == 0
        disk.full = False  # space is back
        q.retry()
        await turn()
        assert q.full is None and store.depth("d") == 5 and q.spilled == 5 and q.in_memory() == 0
        assert core.called("settle") == [([(("pub", n), 1) for n in range(1, 6)],)]
        q.on_deliver(0, "d", event(6))  # (written at once again)
        q.after_step()
        back = Connection("c")
        assert q.subscribe(back, p.Subscribe(2, "d", "events", "x > 0", resume=True)) == (True, None)
        for upto in (2, 4, 6):
            await turn()
            q.ack(back, [(1, upto)])
        assert [eid for _, _, eid, _ in back.rows] == [("pub", n) for n in range(1, 7)]  # in order
        assert store.depth("d") == 0
        q.close()

    asyncio.run(main())


def test_past_its_limit_a_subscription_refuses_deliveries_with_the_reason_and_keeps_its_order() -> None:
    async def main() -> None:
        q, core, store, disk = full_queues(DEFAULT.with_(memory=2))  # (a limit of 4 x 2 held)
        c = Connection("c")
        q.subscribe(c, p.Subscribe(1, "d", "events", "x > 0", durable=True))
        q.session_ended(c, bye=True)  # (away: every delivery is for the disk)
        store._db = disk  # type: ignore[assignment]
        disk.full = True
        q.on_deliver(0, "d", event(1))
        q.after_step()  # the store fails here
        for n in range(2, 12):
            q.on_deliver(0, "d", event(n))
        q.after_step()
        await turn()
        assert [eid for eid, *_ in q.subs["d"].held] == [("pub", n) for n in range(1, 9)]
        assert core.called("refuse") == [([(("pub", n), REASON) for n in (9, 10, 11)],)]
        assert q.refused == 3 and core.called("settle") == []
        disk.full = False
        q.retry()
        q.on_deliver(0, "d", event(12))  # (room again: after the others)
        q.after_step()
        await turn()
        assert core.called("settle") == [
            ([(("pub", n), 1) for n in range(1, 9)],),
            ([(("pub", 12), 1)],),
        ]
        back = Connection("c")
        q.subscribe(back, p.Subscribe(2, "d", "events", "x > 0", resume=True))
        await turn()
        assert [eid for _, _, eid, _ in back.rows] == [("pub", n) for n in (*range(1, 9), 12)]
        q.close()

    asyncio.run(main())


def test_an_attached_client_gets_what_waits_for_a_full_store_from_memory_in_order() -> None:
    async def main() -> None:
        q, core, store, disk = full_queues(DEFAULT.with_(window=2, memory=2))
        c = Connection("c")
        q.subscribe(c, p.Subscribe(1, "d", "events", "x > 0"))
        store._db = disk  # type: ignore[assignment]
        disk.full = True
        for n in range(1, 7):  # 1, 2 in flight; 3-6 past memory: held, the store full
            q.on_deliver(0, "d", event(n))
        q.after_step()
        await turn()
        assert [eid for _, _, eid, _ in c.rows] == [("pub", 1), ("pub", 2)] and q.full is not None
        for upto in (2, 4, 6):  # the client takes them; nothing goes to disk, each settles when taken
            q.ack(c, [(1, upto)])
            await turn()
        assert [eid for _, _, eid, _ in c.rows] == [("pub", n) for n in range(1, 7)]
        assert [s for (s,) in core.called("settle")] == [
            [(("pub", 1), 1), (("pub", 2), 1)],
            [(("pub", 3), 1), (("pub", 4), 1)],
            [(("pub", 5), 1), (("pub", 6), 1)],
        ]
        assert store.depth("d") == 0 and q.spilled == 0 and q.in_memory() == 0
        q.retry()  # (nothing waits: the queues are no longer held back, though the store is full)
        assert q.full is None
        q.close()

    asyncio.run(main())


def test_a_subscription_the_full_store_cannot_record_is_refused_and_nothing_changes() -> None:
    async def main() -> None:
        q, core, store, disk = full_queues()
        store._db = disk  # type: ignore[assignment]
        disk.full = True
        c = Connection("c")
        assert q.subscribe(c, p.Subscribe(1, "s", "events", "x > 0", durable=True)) == (
            False,
            "the store :memory: is full: cannot add subscription 's' (database or disk is full)",
        )
        assert q.subs == {} and q.attached(c) == set() and core.calls == [] and store.subscriptions() == []
        disk.full = False
        assert q.subscribe(c, p.Subscribe(2, "s", "events", "x > 0", durable=True)) == (True, None)

    asyncio.run(main())


def test_an_acknowledgement_the_full_store_cannot_write_is_written_later_and_not_sent_again() -> None:
    async def main() -> None:
        q, _, store, disk = full_queues(DEFAULT.with_(window=2))
        c = Connection("c")
        q.subscribe(c, p.Subscribe(1, "d", "events", "x > 0", durable=True))
        q.session_ended(c, bye=True)
        for n in range(1, 5):  # on disk (the store takes them)
            q.on_deliver(0, "d", event(n))
        q.after_step()
        back = Connection("c")
        q.subscribe(back, p.Subscribe(2, "d", "events", "x > 0", resume=True))
        await turn()
        store._db = disk  # type: ignore[assignment]
        disk.full = True
        q.ack(back, [(1, 2)])  # the rows cannot be deleted: later
        await turn()
        q.ack(back, [(3, 4)])
        await turn()
        assert [eid for _, _, eid, _ in back.rows] == [("pub", n) for n in range(1, 5)]  # none again
        assert store.depth("d") == 4 and q.full is not None
        disk.full = False
        q.retry()
        assert store.depth("d") == 0 and q.full is None
        q.close()

    asyncio.run(main())


def test_a_queue_that_goes_to_disk_is_known_to_the_ring_before_its_spill_is_settled() -> None:
    """The first spill of a subscription marks its queue on disk in the ring state, and
    settles only once the backups have that (a taker then waits for the backlog); the mark
    goes when the queue on disk is empty again."""

    async def main() -> None:
        q, core, store = queues(DEFAULT.with_(window=1, memory=1))
        c = Connection("c")
        q.subscribe(c, p.Subscribe(1, "s", "events", "x > 0", durable=True))
        core.version = 7  # (the backup version of the mark; the holders have only 6)
        core.confirmed = 6
        for n in (1, 2, 3):
            q.on_deliver(0, "s", event(n))
        q.after_step()
        await turn()
        assert core.called("backlog") == [("s", True)] and store.depth("s") == 2
        assert core.called("settle") == []  # (not before the mark is backed up)
        core.confirmed = 7
        q.after_step()
        await turn()
        assert core.called("settle") == [([(("pub", 2), 1), (("pub", 3), 1)],)]
        for cseq in (1, 2, 3):  # (the client takes them all: the disk part is empty again)
            q.ack(c, [(cseq, cseq)])
            await turn()
        assert store.depth("s") == 0 and core.called("backlog") == [("s", True), ("s", False)]

    asyncio.run(main())


def taken_over_awaiting(home: int) -> tuple[Queues, FakeCore, Store, dict[str, Any]]:
    """Queues whose core took subscription "s" over, awaiting the backlog on ``home``'s
    disk; and the subscription's meta."""
    q, core, store = queues()
    meta = SubQueue("s", "c", "events", "x > 0", True, None).meta()
    core.subs.add("s")
    core.metas["s"] = meta
    core.awaits["s"] = home
    return q, core, store, meta


def test_a_subscription_taken_over_awaits_the_backlog_of_its_former_broker() -> None:
    """Taken over from a broker whose disk holds part of its queue: its events go to disk
    here and none is sent until the backlog comes; the backlog goes before them."""
    from flowbus.overlay.ring_messages import Peer
    from flowbus.routing.ring_handover import Backlog

    async def main() -> None:
        q, core, store, meta = taken_over_awaiting(99)
        c = Connection("c")
        for n in (3, 4):
            q.on_deliver(0, "s", event(n))  # (taken over, delivered to before its client is back)
        q.after_step()
        assert q.subscribe(c, p.Subscribe(1, "s", "events", "x > 0", durable=True, resume=True)) == (
            True,
            None,
        )
        await turn()
        assert c.rows == [] and store.depth("s") == 2  # (waiting for the older events)
        old = [(repr(("pub", n)), store_row(n)) for n in (1, 2)]  # (in two parts, oldest first)
        q.take_backlog(Backlog(Peer(5, 99), "s", meta, 0, tuple(old[:1]), False))
        await turn()
        assert c.rows == []  # (more is to come)
        q.take_backlog(Backlog(Peer(5, 99), "s", meta, 1, tuple(old[1:]), True))
        await turn()
        assert [eid for _, _, eid, _ in c.rows] == [("pub", n) for n in (1, 2, 3, 4)]
        assert core.called("backlog_done") == [("s", 99)] and q.subs["s"].awaiting is None
        unknown = dict(meta, client="d")  # (not served here: nothing taken, its sender asks again)
        assert (
            q.take_backlog(Backlog(Peer(5, 99), "t", unknown, 0, ((repr(("pub", 9)), store_row(9)),), True))
            is None
        )
        assert "t" not in q.subs and store.depth("t") == 0 and "t" not in core.subs

    asyncio.run(main())


def test_a_backlog_is_acknowledged_once_the_rings_backups_know_the_disk_holds_it() -> None:
    """A taker that answered a former broker's backlog at once, and died before its backups
    held the mark that its disk has the queue, left a taker after it that did not know: it
    served the subscription, and the backlog, handed over again, went behind newer events
    (an overload run: 4,322 out of order). The answer, and the end of the wait for the
    former broker, come once the backup that says so is confirmed."""
    from flowbus.overlay.ring_messages import Peer
    from flowbus.routing.ring_handover import Backlog

    async def main() -> None:
        q, core, store, meta = taken_over_awaiting(99)
        core.version, core.confirmed = 7, 6  # (the mark's backup not confirmed yet)
        answered: list[int] = []
        old = [(repr(("pub", n)), store_row(n)) for n in (1, 2)]
        q.take_backlog(Backlog(Peer(5, 99), "s", meta, 0, tuple(old), True), taken=lambda: answered.append(0))
        q.after_step()
        await turn()
        assert store.depth("s") == 2 and answered == [] and core.called("backlog_done") == []
        core.confirmed = 7
        q.after_step()
        await turn()
        assert answered == [0] and core.called("backlog_done") == [("s", 99)]

    asyncio.run(main())


def store_row(n: int) -> bytes:
    """A queued event's payload, as a store holds it."""
    import msgpack  # type: ignore[import-untyped]

    return bytes(msgpack.packb([["pub", n], {"x": n}]))


def test_a_collapse_subscription_taken_over_gets_its_backlog_as_it_is_not_caught_up() -> None:
    """A subscription with a collapse rule set catches its client up with the shortest
    sequence from what it took here. One taken over from a dead broker does not know what
    its client took there: caught up from nothing, it gave the client again the latest event
    of each key it had (the fault campaign: 29 repeats under new ids in one run). It
    delivers its backlog as it is; the client drops by id what it had."""
    rules = {"last": {"key": {"symbol": "symbol"}, "rules": [{"set": {"last": "quantity"}}]}}

    def keyed(n: int) -> dict[str, Any]:
        trade = {"symbol": f"S{n % 2}", "price": 1.0, "quantity": n, "exchange": "X", "level": 1}
        return {EVENT_ID: ("pub", n), SPACE: "stocks", **trade}

    async def main() -> None:
        for taken_over in (False, True):
            q, core, _ = queues(DEFAULT.with_(rulesets=rules))
            c = Connection("c")
            subscribe = p.Subscribe(1, "s", "stocks", "quantity > 0", durable=True, collapse="last")
            if taken_over:
                core.subs.add("s")
                core.metas["s"] = SubQueue("s", "c", "stocks", "quantity > 0", True, "last").meta()
            else:
                assert q.subscribe(c, subscribe) == (True, None)
                q.session_ended(c, bye=True)
            for n in range(1, 7):  # (while its client is away)
                q.on_deliver(0, "s", keyed(n))
            q.after_step()
            back = Connection("c")
            assert q.subscribe(back, dataclasses.replace(subscribe, resume=True)) == (True, None)
            await turn()
            got = [row[3]["quantity"] for row in back.rows]
            assert got == ([1, 2, 3, 4, 5, 6] if taken_over else [5, 6]), taken_over
            q.close()

    asyncio.run(main())


def test_a_taken_over_subscription_drops_what_its_client_had_consumed() -> None:
    """Taken over with the ring's word on how far its client consumed each publisher (a
    STOMP client's: it cannot drop by id what it had), the deliveries that word covers are
    settled and never queued; the others, and other publishers', are served."""

    async def main() -> None:
        q, core, store = queues()
        core.subs.add("s")
        core.metas["s"] = SubQueue("s", "c", "events", "x > 0", True, None).meta()
        core.consumption["s"] = {"pub": 2}
        for n in (1, 2, 3):
            q.on_deliver(0, "s", event(n))  # (delivered again by the taker: replayed)
        q.on_deliver_all(0, ("s",), {EVENT_ID: ("other", 1), SPACE: "events", "x": 9})
        q.after_step()
        await turn()
        settled = [eid for call in core.called("settle") for eid, _ in call[0]]
        assert sorted(settled, key=repr) == [("other", 1), ("pub", 1), ("pub", 2), ("pub", 3)]
        assert store.depth("s") == 2  # (settled: the two consumed dropped, the others on this disk)
        c = Connection("c")
        assert q.subscribe(c, p.Subscribe(1, "s", "events", "x > 0", durable=True)) == (True, None)
        await turn()
        assert [eid for _, _, eid, _ in c.rows] == [("pub", 3), ("other", 1)]

    asyncio.run(main())


def test_consumed_is_told_to_the_core_and_answered_once_backed_up() -> None:
    async def main() -> None:
        q, core, _ = queues()
        core.version, core.confirmed = 7, 6
        assert q.consume("s", {"pub": 4}) == 7 and q.consumed("s") == {"pub": 4}
        called: list[str] = []
        q.when_backed_up(7, lambda: called.append("late"))
        q.when_backed_up(6, lambda: called.append("now"))
        await turn()
        assert called == ["now"]
        core.confirmed = 7
        q.after_step()
        await turn()
        assert called == ["now", "late"]

    asyncio.run(main())
