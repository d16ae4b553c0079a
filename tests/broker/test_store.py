"""A broker's SQLite store: WAL mode, durable subscriptions across a reopen, queues in
order with acknowledgement and de-duplication, publisher sequence numbers, refused
changes that leave the store unchanged; a full disk (faked, and a real tmpfs as root) is a
StoreFull naming the store and the write, and leaves the store unchanged too."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from tests.broker.full_disk import FULL, FullDisk, fill, tiny_disk

from flowbus.broker.store import SCHEMA_VERSION, Store, StoreError, StoreFull


def test_durable_state_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    s = Store(path)
    assert s.journal_mode == "wal"
    s.add_subscription("s1", client="c1", space="trades", filter="price > 1", durable=True)
    s.add_subscription("s2", client="c1", space="trades", filter="price > 2", durable=False)
    assert s.enqueue("s1", "p:1", b"one") and s.enqueue("s1", "p:2", b"two")
    assert s.accept("p", 1) and s.accept("p", 2)
    s.close()  # (a kill -9 loses no committed transaction in WAL mode)
    s = Store(path)
    assert [r.sub_id for r in s.subscriptions()] == ["s1", "s2"]
    assert [e.event_id for e in s.pending("s1")] == ["p:1", "p:2"]
    assert s.last_seq("p") == 2
    assert s.drop_client("c1") == ["s2"]  # the session ends: only the durable one stays
    assert [r.sub_id for r in s.subscriptions()] == ["s1"]
    s.close()


def test_queue_order_ack_and_duplicates() -> None:
    s = Store(":memory:")
    s.add_subscription("s", client="c", space="x", filter="a = 1", durable=True)
    for i in range(5):
        assert s.enqueue("s", f"p:{i}", bytes([i]))
    assert not s.enqueue("s", "p:3", b"again")  # a retransmission is stored once
    got = s.pending("s", limit=3)
    assert [e.payload for e in got] == [b"\x00", b"\x01", b"\x02"]
    assert s.ack("s", got[-1].seq) == 3
    assert [e.event_id for e in s.pending("s")] == ["p:3", "p:4"] and s.depth("s") == 2
    s.remove_subscription("s")
    assert s.depth("s") == 0  # the queue goes with it


def test_a_backlog_taken_in_parts_goes_before_what_was_held_in_the_order_it_was_sent(tmp_path: Path) -> None:
    """A former broker's backlog comes in parts, oldest first: each part goes after the
    parts before it and before what was queued here meanwhile, a duplicate of a held event
    at its place in the backlog; a store reopened halfway goes on where it was; an event
    queued meanwhile for another subscription keeps its place."""
    path = tmp_path / "b.db"
    s = Store(path)
    for sub in ("s", "t"):
        s.add_subscription(sub, client="c", space="x", filter="a = 1", durable=True)
    for i in (7, 8, 4):  # (queued here meanwhile; 4 is in the backlog too)
        s.enqueue("s", f"p:{i}", bytes([i]))
    s.enqueue("t", "p:1", b"t")
    assert s.prepend("s", [("p:1", b"\x01"), ("p:2", b"\x02")], last=False) == 2
    s.enqueue("t", "p:2", b"t")
    s.close()  # (restarted halfway through the hand-over)
    s = Store(path)
    assert s.prepend("s", [("p:3", b"\x03"), ("p:4", b"\x04")], last=False) == 1
    assert s.prepend("s", [("p:5", b"\x05"), ("p:6", b"\x06")], last=True) == 2
    s.enqueue("s", "p:9", b"\x09")
    assert [e.event_id for e in s.pending("s")] == [f"p:{i}" for i in range(1, 10)]
    assert s.depth("s") == 9
    assert [e.event_id for e in s.pending("t")] == ["p:1", "p:2"]
    positions = [e.seq for e in s.pending("s")]
    assert positions == sorted(positions) and len(set(positions)) == 9
    s.close()


def test_a_large_write_gives_its_log_space_back_to_the_disk(tmp_path: Path) -> None:
    """A queue taken over in one transaction grows the write-ahead log past the disk it
    needs; once checkpointed, the log keeps at most WAL_KEPT bytes."""
    from flowbus.broker.store import WAL_KEPT

    s = Store(tmp_path / "b.db", sync="normal")
    s.add_subscription("s", client="c", space="x", filter="a = 1", durable=True)
    s.enqueue_many([("s", f"p:{i}", bytes(1000)) for i in range(20_000)])
    wal = tmp_path / "b.db-wal"
    assert wal.stat().st_size > 2 * WAL_KEPT
    s.ack("s", s.top("s"))
    for i in range(3):  # (a checkpoint, then writes from the log's start again)
        s.enqueue("s", f"q:{i}", b"x")
    assert wal.stat().st_size <= WAL_KEPT
    s.close()


def test_publisher_sequences_refuse_replays() -> None:
    s = Store(":memory:")
    assert s.accept("p", 5)
    assert not s.accept("p", 5) and not s.accept("p", 3)
    assert s.accept("p", 6) and s.last_seq("p") == 6
    assert s.last_seq("q") is None


def test_refused_changes_leave_the_store_unchanged(tmp_path: Path) -> None:
    s = Store(tmp_path / "b.db")
    s.add_subscription("s", client="c", space="x", filter="a = 1", durable=True)
    before = (s.subscriptions(), s.pending("s"))
    with pytest.raises(StoreError, match="exists already"):
        s.add_subscription("s", client="d", space="y", filter="b = 2", durable=False)
    with pytest.raises(StoreError, match="no subscription 'zz'"):
        s.remove_subscription("zz")
    with pytest.raises(StoreError, match="no subscription 'zz' to queue"):
        s.enqueue("zz", "p:1", b"x")
    with pytest.raises(StoreError, match="non-empty string"):
        s.add_subscription("", client="c", space="x", filter="a = 1", durable=True)
    with pytest.raises(StoreError, match="sequence number"):
        s.accept("p", -1)
    assert (s.subscriptions(), s.pending("s")) == before
    s.close()


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "b.db"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="schema version"):
        Store(path)


@pytest.mark.broker
def test_a_killed_broker_loses_no_committed_change(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "b.db"
    script = (
        "import os, sys\n"
        "from flowbus.broker.store import Store\n"
        "s = Store(sys.argv[1])\n"
        "s.add_subscription('s', client='c', space='x', filter='a = 1', durable=True)\n"
        "for i in range(100):\n"
        "    s.enqueue('s', f'p:{i}', b'x')\n"
        "os.kill(os.getpid(), 9)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    s = Store(path)
    assert [r.sub_id for r in s.subscriptions()] == ["s"] and s.depth("s") == 100
    s.close()


def _snapshot(s: Store) -> tuple[object, ...]:
    return (s.subscriptions(), s.pending("s"), s.pending("t"), s.last_seq("p"), s.flows())


@pytest.mark.parametrize(
    ("at_commit", "error"),
    [(False, FULL), (True, FULL), (False, "disk I/O error")],
    ids=["statement", "commit", "ioerr"],
)
def test_a_full_disk_raises_store_full_and_leaves_the_database_as_it_was(
    tmp_path: Path, at_commit: bool, error: str
) -> None:
    path = tmp_path / "b.db"
    s = Store(path)
    s.add_subscription("s", client="c", space="x", filter="a = 1", durable=True)
    s.add_subscription("t", client="c", space="x", filter="a = 2", durable=False)
    s.enqueue_many([("s", "p:1", b"one"), ("s", "p:2", b"two")])
    s.accept("p", 3)
    s.save_flows({"f": b"flow"})
    before = _snapshot(s)
    disk = FullDisk.under(s, at_commit=at_commit, error=error)
    writes = {
        "add subscription 'u'": lambda: s.add_subscription(
            "u", client="c", space="x", filter="a = 3", durable=True
        ),
        "remove subscription 's'": lambda: s.remove_subscription("s"),
        "drop the subscriptions of client 'c'": lambda: s.drop_client("c"),
        "queue an event for subscription 's'": lambda: s.enqueue("s", "p:3", b"three"),
        "queue 2 events": lambda: s.enqueue_many([("s", "p:3", b"three"), ("t", "p:3", b"three")]),
        "acknowledge the queue of subscription 's' up to 99": lambda: s.ack("s", 99),
        "record publisher 'p' at 9": lambda: s.accept("p", 9),
        "save the deployed flows": lambda: s.save_flows({}),
    }
    for operation, write in writes.items():
        with pytest.raises(StoreFull) as caught:
            write()
        assert str(caught.value) == f"the store {path} is full: cannot {operation} ({error})"
        assert (caught.value.path, caught.value.operation, caught.value.reason) == (
            str(path),
            operation,
            error,
        )
        assert s.full is caught.value
        assert _snapshot(s) == before  # rolled back, the commit's failure too
    assert disk.failed == len(writes)
    disk.full = False  # space is back: the same writes go through, and the store says so
    assert s.enqueue("s", "p:3", b"three") and s.full is None
    assert [e.event_id for e in s.pending("s")] == ["p:1", "p:2", "p:3"]
    s.close()
    again = Store(path)  # (and what is on disk is what the store said)
    assert [e.event_id for e in again.pending("s")] == ["p:1", "p:2", "p:3"] and again.last_seq("p") == 3
    again.close()


def test_other_sqlite_errors_are_not_store_full() -> None:
    s = Store(":memory:")
    s.add_subscription("s", client="c", space="x", filter="a = 1", durable=True)
    FullDisk.under(s, error="database is locked")
    with pytest.raises(sqlite3.OperationalError, match="database is locked") as caught:
        s.enqueue("s", "p:1", b"one")
    assert not isinstance(caught.value, StoreFull) and s.full is None
    assert s.depth("s") == 0


@pytest.mark.broker
def test_a_real_full_disk_raises_store_full_and_space_back_makes_the_store_write_again(
    tmp_path: Path,
) -> None:
    """Root only: a 2 MiB tmpfs, filled to ENOSPC."""
    with tiny_disk(tmp_path / "disk") as disk:
        s = Store(disk / "b.db")
        try:
            s.add_subscription("s", client="c", space="x", filter="a = 1", durable=True)
            s.enqueue_many([("s", f"p:{i}", b"x" * 1000) for i in range(10)])
            filler = fill(disk)
            with pytest.raises(
                StoreFull, match=r"is full: cannot queue 500 events \(database or disk is full\)"
            ):
                s.enqueue_many([("s", f"q:{i}", b"y" * 1000) for i in range(500)])
            assert s.depth("s") == 10 and s.full is not None  # (unchanged, and readable)
            with pytest.raises(StoreFull):  # (still full)
                s.enqueue_many([("s", f"q:{i}", b"y" * 1000) for i in range(500)])
            filler.unlink()
            assert s.enqueue_many([("s", f"q:{i}", b"y" * 1000) for i in range(500)]) == 500
            assert s.full is None and s.depth("s") == 510
        finally:
            s.close()
