"""The ring state's keys are typed records: equal to the plain tuples they cross the wire
as, made records again where another broker's entries come in (a takeover), and found by
the state's index."""

from __future__ import annotations

from flowbus.net.codec import decode, encode
from flowbus.overlay.ring_backups import Backups
from flowbus.overlay.ring_messages import BackupCopy, Peer
from flowbus.routing.ring_keys import (
    DISK,
    LOG,
    SUB,
    DiskKey,
    FlowSubKey,
    LogKey,
    RowKey,
    SubKey,
    disk_key,
    flow_sub_key,
    log_key,
    record,
    row_key,
    sub_key,
)

KEYS = [
    sub_key("s1", 7),
    disk_key("s1", 3),
    flow_sub_key(("flow", "alarms", 1)),
    row_key("stocks", 2, 5, "last", "IBM"),
    log_key(("part", "stocks", 2, 0), 4),
]


def test_each_key_is_its_record_and_equal_to_its_plain_tuple() -> None:
    kinds = [SubKey, DiskKey, FlowSubKey, RowKey, LogKey]
    for key, kind in zip(KEYS, kinds, strict=True):
        plain = tuple(key)
        assert type(key) is kind and key == plain and hash(key) == hash(plain)
        assert type(record(plain)) is kind and record(plain) == key
    assert sub_key("s1", 7).home == 7 and log_key("p", 4).n == 4


def test_record_leaves_other_keys_alone() -> None:
    for other in ("plain", ("sub", "s1"), ("sub", "s1", 7, 8), ("nope", 1, 2), (1, 2, 3), ()):
        assert record(other) is other


def test_a_takeover_off_the_wire_gives_records_the_index_finds() -> None:
    owner, me = Peer(100, 1), Peer(200, 2)
    state = {key: i for i, key in enumerate(KEYS)} | {"plain": 9}
    copy = decode(encode(BackupCopy(owner, 1, state, (me,), (me,))))
    assert isinstance(copy, BackupCopy) and copy.state is not None
    assert {type(k) for k in copy.state} == {tuple, str}  # (the wire knows no records)
    b = Backups(record)
    assert b.on_copy(copy, addr=me.addr)
    assert b.take_over(owner, dead={owner.id}) is not None
    assert b.state == state
    assert {type(k) for k in b.state} == {SubKey, DiskKey, FlowSubKey, RowKey, LogKey, str}
    (sub,) = b.keys_of(SUB, "s1")
    assert isinstance(sub, SubKey) and sub.home == 7
    (disk,) = b.keys_of(DISK, "s1")
    assert isinstance(disk, DiskKey) and disk.home == 3
    (log,) = b.keys_where(LOG, lambda part: isinstance(part, tuple) and part[1] == "stocks")
    assert isinstance(log, LogKey) and log.n == 4


def test_without_a_keyed_function_the_backups_keep_keys_as_they_came() -> None:
    b = Backups()
    b.absorb({("sub", "s1", 7): 1})
    (key,) = b.keys_of(SUB, "s1")
    assert type(key) is tuple
