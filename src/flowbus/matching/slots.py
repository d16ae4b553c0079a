"""The conjunction slots: which are taken, and the per-conjunction arrays stage 2 reads and writes.

How it works: every conjunction of every subscription gets a *slot*, a dense integer that
indexes the arrays below; a removed conjunction's slot goes to a free list and is taken
again first, so the arrays stay as large as the most conjunctions ever held at once (they
double when full). Per slot:

* ``conj_sub`` -- the subscription it belongs to (-1 when free);
* ``req`` and ``counts`` -- how many positive predicates it requires, and the counting
  algorithm's packed word (epoch, requirement, count: see ``kernels.count_match``);
* ``active`` -- a bitset of the taken slots, the start of each event's bitset of live
  conjunctions before the interval indexes clear some;
* the *zero set* -- the conjunctions with no positive predicate (only ranges, negations or
  expressions), which no posting list reaches: a list and a bitset, kept in step;
* ``has_expr`` -- whether expression predicates are left to evaluate when it matches.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flowbus.matching import kernels
from flowbus.matching._types import I32, I64, U64


def _grown(arr: np.ndarray, size: int, fill: Any) -> np.ndarray:
    out = np.full(size, fill, arr.dtype)
    out[: arr.size] = arr
    return out


def _set_bit(bits: np.ndarray, slot: int, on: bool) -> None:
    mask = np.uint64(1) << np.uint64(slot & 63)
    if on:
        bits[slot >> 6] |= mask
    else:
        bits[slot >> 6] &= ~mask


_INITIAL = 64


class ConjunctionSlots:
    """Slot allocation and the per-slot arrays (see the module's note); ``size`` slots addressable."""

    def __init__(self) -> None:
        self.size = 0
        self._high = 0  # slots below this have been taken at least once
        self._free: list[int] = []
        self.conj_sub = np.empty(0, I32)
        self.req = np.empty(0, I32)
        self.counts = np.empty(0, np.uint32)
        self.has_expr = np.empty(0, np.bool_)
        self.active = np.empty(0, U64)
        self.zero_bits = np.empty(0, U64)
        self.zero_list = np.empty(0, I32)
        self._zero_pos = np.empty(0, I32)
        self.zero_n = 0
        self._grow(_INITIAL)

    def take_one(self) -> int:
        """A slot: the last freed one, else a new one."""
        if self._free:
            return self._free.pop()
        if self._high == self.size:
            self._grow(2 * self.size)
        self._high += 1
        return self._high - 1

    def take(self, n: int) -> np.ndarray:
        """``n`` slots, in the order ``n`` calls of :meth:`take_one` would give them."""
        reused = [self._free.pop() for _ in range(min(n, len(self._free)))]
        high = self._high + n - len(reused)
        if high > self.size:
            size = self.size
            while size < high:
                size *= 2
            self._grow(size)
        fresh = np.arange(self._high, high, dtype=I64)
        self._high = high
        return np.concatenate([np.asarray(reused, I64), fresh])

    def activate(self, slots: np.ndarray, subs: np.ndarray, required: np.ndarray) -> None:
        """Mark taken slots live: conjunction ``slots[i]`` of subscription ``subs[i]`` requires
        ``required[i]`` positive predicates."""
        self.req[slots] = required
        self.counts[slots] = (required << 8).astype(np.uint32)
        self.conj_sub[slots] = subs
        bits = np.left_shift(np.uint64(1), (slots & 63).astype(np.uint64))
        np.bitwise_or.at(self.active, slots >> 6, bits)
        zero = slots[required == 0]
        n = self.zero_n
        self.zero_list[n : n + zero.size] = zero
        self._zero_pos[zero] = np.arange(n, n + zero.size, dtype=I32)
        self.zero_n = n + zero.size
        np.bitwise_or.at(self.zero_bits, zero >> 6, bits[required == 0])

    def release(self, slot: int) -> None:
        """Free a live slot (its arrays back to a free slot's values)."""
        if self.req[slot] == 0:
            self._zero_remove(slot)
        self.counts[slot] = 0
        self.has_expr[slot] = False
        _set_bit(self.active, slot, False)
        self.conj_sub[slot] = -1
        self._free.append(slot)

    def _zero_remove(self, slot: int) -> None:
        i = int(self._zero_pos[slot])
        last = self.zero_n - 1
        moved = int(self.zero_list[last])
        self.zero_list[i] = moved
        self._zero_pos[moved] = i
        self._zero_pos[slot] = -1
        self.zero_n = last
        _set_bit(self.zero_bits, slot, False)

    def clear_counts(self) -> None:
        """Wipe the counting words' epoch tags and counts (their requirements stay)."""
        self.counts &= np.uint32(kernels.REQ_MASK)

    def _grow(self, n: int) -> None:
        words = (n + 63) // 64
        self.conj_sub = _grown(self.conj_sub, n, -1)
        self.req = _grown(self.req, n, 0)
        self.has_expr = _grown(self.has_expr, n, False)
        self.zero_list = _grown(self.zero_list, n, -1)
        self._zero_pos = _grown(self._zero_pos, n, -1)
        self.counts = _grown(self.counts, n, 0)
        self.active = _grown(self.active, words, 0)
        self.zero_bits = _grown(self.zero_bits, words, 0)
        self.size = n

    def nbytes(self) -> int:
        arrays = (
            self.conj_sub, self.req, self.counts, self.has_expr, self.active,
            self.zero_bits, self.zero_list, self._zero_pos,
        )  # fmt: skip
        return sum(int(a.nbytes) for a in arrays)
