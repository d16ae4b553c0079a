"""The subscription table's parts: slot allocation and the zero set, predicate numbering and
reference counts, subscription ids and the answers read from them."""

from __future__ import annotations

import numpy as np
import pytest

from flowbus.errors import SubscriptionError
from flowbus.filters.ast import Op, Predicate
from flowbus.matching.indexes import PredicateIndexes
from flowbus.matching.plans import Plan
from flowbus.matching.slots import ConjunctionSlots
from flowbus.matching.table import PredicateIds, SubscriptionIds, SubscriptionTable


def _bits(words: np.ndarray) -> list[int]:
    return [w * 64 + b for w in range(words.size) for b in range(64) if int(words[w]) >> b & 1]


def test_slots_reuse_the_last_freed_first_and_grow_by_doubling() -> None:
    slots = ConjunctionSlots()
    first = slots.take(70)
    assert first.tolist() == list(range(70)) and slots.size == 128
    slots.activate(first, np.zeros(70, np.int64), np.ones(70, np.int64))
    for s in (5, 9, 2):
        slots.release(s)
    assert slots.take_one() == 2
    assert slots.take(3).tolist() == [9, 5, 70]
    assert slots.conj_sub[2] == -1 and 2 not in _bits(slots.active)


def test_zero_set_follows_conjunctions_without_positive_predicates() -> None:
    slots = ConjunctionSlots()
    taken = slots.take(6)
    slots.activate(taken, np.arange(6), np.array([0, 1, 0, 2, 0, 0]))
    assert sorted(slots.zero_list[: slots.zero_n].tolist()) == [0, 2, 4, 5] == _bits(slots.zero_bits)
    slots.release(2)
    slots.release(1)
    assert sorted(slots.zero_list[: slots.zero_n].tolist()) == [0, 4, 5] == _bits(slots.zero_bits)
    assert slots.counts[3] >> 8 == 2 and _bits(slots.active) == [0, 3, 4, 5]


class _Recorder(PredicateIndexes):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, int]] = []

    def add(self, pid: int, p: Predicate) -> None:
        self.log.append(("add", pid))
        super().add(pid, p)

    def remove(self, pid: int, p: Predicate) -> None:
        self.log.append(("remove", pid))
        super().remove(pid, p)


def test_predicates_are_indexed_while_referenced_and_their_ids_reused() -> None:
    indexes = _Recorder()
    preds = PredicateIds(indexes)
    a, b = Predicate("x", Op.EQ, 1), Predicate("y", Op.EXISTS)
    assert preds.intern(a) == 0 and preds.intern(b, refs=2) == 1 and preds.intern(a) == 0
    preds.release(0)
    assert len(preds) == 2 and preds[0] == a
    preds.release(0)
    preds.release(1)
    assert len(preds) == 1 and indexes.log == [("add", 0), ("add", 1), ("remove", 0)]
    assert preds.intern(Predicate("z", Op.EQ, "q")) == 0 and preds.capacity >= 2


def test_ids_answer_sorted_once_per_subscription() -> None:
    ids = SubscriptionIds()
    ids.assign_one(ids.take_one(), "b", (0, 1))
    ids.assign_one(ids.take_one(), 7, (2,))
    ids.assign_one(ids.take_one(), "a", (3,))
    subs = np.array([0, 2, 0, 1, 1, 2])  # subscription indexes of matched conjunctions
    event_of = np.array([0, 0, 0, 1, 2, 2])
    got = ids.answers(subs, event_of, 4)
    assert [x.tolist() for x in got] == [["a", "b"], [7], [7, "a"], []]
    assert ids.pop("b") == (0, 1) and "b" not in ids and len(ids) == 2
    with pytest.raises(SubscriptionError, match="no subscription 'b'"):
        ids.pop("b")
    assert ids.take_one() == 0  # the freed index


def test_removing_everything_leaves_an_empty_table() -> None:
    indexes = PredicateIndexes()
    table = SubscriptionTable(indexes, clustering=True)
    plan = Plan.of([Predicate("x", Op.EQ, 1), Predicate("n", Op.GT, 2), Predicate("y", Op.NE, "a", True)])
    table.add([(1, (plan,)), (2, (plan, Plan.of([Predicate("n", Op.LT, 0)])))])
    assert len(table) == 2 and indexes.has_intervals()
    table.remove(2)
    table.remove(1)
    assert len(table) == 0 and not indexes.has_intervals() and not table.has_expressions()
    assert table.slots.zero_n == 0 and _bits(table.slots.active) == []
