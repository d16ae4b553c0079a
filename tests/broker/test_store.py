"""A broker's SQLite store: WAL mode, durable subscriptions across a reopen, queues in
order with acknowledgement and de-duplication, publisher sequence numbers, refused
changes that leave the store unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowbus.broker.store import SCHEMA_VERSION, Store, StoreError


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
    import sqlite3

    path = tmp_path / "b.db"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="schema version"):
        Store(path)


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
