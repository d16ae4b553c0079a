"""A pool of growable integer lists in flat arrays, so that compiled loops can read them.

The matcher keeps many small lists that change one element at a time: for each
predicate the conjunctions that contain it, for each value code the predicates
it satisfies, for each conjunction its items. Python lists of lists cannot be
read from numba code, and a CSR array would be rebuilt on every change. A pool
stores list ``k`` at ``data[start[k]:start[k] + length[k]]`` inside a segment of
``cap[k]`` slots; a full list moves to a segment twice as large at the end of
``data`` (amortised O(1) append), removal swaps with the last element, and the
abandoned segments are compacted away once they are half of the pool.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowbus.matching._types import I32, I64

_MIN_CAP = 2

PoolView = tuple[np.ndarray, np.ndarray, np.ndarray]
"""A pool as the compiled loops read it: ``(start, length, data)``."""


@njit(cache=True, nogil=True)
def _grow(data: np.ndarray, need: int) -> np.ndarray:
    size = max(16, data.size)
    while size < need:
        size *= 2
    if size == data.size:
        return data
    out = np.empty(size, data.dtype)
    out[: data.size] = data
    return out


@njit(cache=True, nogil=True)
def _append_many(
    start: np.ndarray,
    length: np.ndarray,
    cap: np.ndarray,
    data: np.ndarray,
    used: int,
    keys: np.ndarray,
    values: np.ndarray,
) -> tuple[np.ndarray, int, int]:
    """Append ``values[i]`` to list ``keys[i]``; returns (data, used, garbage slots freed)."""
    garbage = 0
    for i in range(keys.size):
        k = keys[i]
        n = length[k]
        if n == cap[k]:
            new_cap = max(_MIN_CAP, 2 * cap[k])
            if used + new_cap > data.size:
                data = _grow(data, used + new_cap)
            s = start[k]
            for j in range(n):
                data[used + j] = data[s + j]
            garbage += cap[k]
            start[k] = used
            cap[k] = new_cap
            used += new_cap
        data[start[k] + n] = values[i]
        length[k] = n + 1
    return data, used, garbage


@njit(cache=True, nogil=True)
def _remove_many(
    start: np.ndarray, length: np.ndarray, data: np.ndarray, keys: np.ndarray, values: np.ndarray
) -> int:
    """Remove one occurrence of ``values[i]`` from list ``keys[i]`` (order not kept); returns misses."""
    misses = 0
    for i in range(keys.size):
        k = keys[i]
        s = start[k]
        n = length[k]
        found = -1
        for j in range(n):
            if data[s + j] == values[i]:
                found = j
                break
        if found < 0:
            misses += 1
            continue
        data[s + found] = data[s + n - 1]
        length[k] = n - 1
    return misses


@njit(cache=True, nogil=True)
def _remove_record(start: np.ndarray, length: np.ndarray, data: np.ndarray, key: int, head: int) -> bool:
    """Remove the record ``[head, k, x_1 .. x_k]`` from list ``key``, keeping the others in order."""
    s = start[key]
    n = length[key]
    pos = 0
    while pos < n:
        size = 2 + data[s + pos + 1]
        if data[s + pos] == head:
            for j in range(pos + size, n):
                data[s + j - size] = data[s + j]
            length[key] = n - size
            return True
        pos += size
    return False


@njit(cache=True, nogil=True)
def _compact(
    start: np.ndarray, length: np.ndarray, cap: np.ndarray, data: np.ndarray
) -> tuple[np.ndarray, int]:
    total = 0
    for k in range(start.size):
        total += cap[k]
    out = np.empty(max(16, total), data.dtype)
    used = 0
    for k in range(start.size):
        s = start[k]
        for j in range(length[k]):
            out[used + j] = data[s + j]
        start[k] = used
        used += cap[k]
    return out, used


class ListPool:
    """Many growable ``int32`` lists, addressed by a dense integer key."""

    __slots__ = ("cap", "data", "garbage", "length", "start", "used")

    def __init__(self, keys: int = 0) -> None:
        self.start = np.zeros(keys, I64)
        self.length = np.zeros(keys, I32)
        self.cap = np.zeros(keys, I32)
        self.data = np.empty(16, I32)
        self.used = 0
        self.garbage = 0

    @property
    def keys(self) -> int:
        return int(self.start.size)

    def ensure_keys(self, n: int) -> None:
        """Make keys ``0 .. n-1`` addressable (new lists are empty)."""
        old = self.start.size
        if n <= old:
            return
        size = max(n, 2 * old, 8)
        for name in ("start", "length", "cap"):
            arr = getattr(self, name)
            grown = np.zeros(size, arr.dtype)
            grown[:old] = arr
            setattr(self, name, grown)

    def extend(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Append ``values[i]`` to list ``keys[i]`` for every i."""
        if keys.size == 0:
            return
        self.ensure_keys(int(keys.max()) + 1)
        self.data, self.used, freed = _append_many(
            self.start, self.length, self.cap, self.data, self.used, keys.astype(I64), values.astype(I32)
        )
        self.garbage += freed
        if self.garbage > 1024 and 2 * self.garbage > self.used:
            self.data, self.used = _compact(self.start, self.length, self.cap, self.data)
            self.garbage = 0

    def append(self, key: int, value: int) -> None:
        self.extend(np.array([key], I64), np.array([value], I32))

    def remove(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Remove one occurrence of ``values[i]`` from list ``keys[i]``; every pair must be present."""
        if keys.size == 0:
            return
        misses = _remove_many(self.start, self.length, self.data, keys.astype(I64), values.astype(I32))
        if misses:
            raise AssertionError(f"ListPool.remove: {misses} pairs were not present")

    def remove_record(self, key: int, head: int) -> None:
        """Remove the record ``[head, k, x_1 .. x_k]`` (appended with one ``extend``) from list ``key``."""
        if not _remove_record(self.start, self.length, self.data, key, head):
            raise AssertionError(f"ListPool.remove_record: no record {head} in list {key}")

    def get(self, key: int) -> np.ndarray:
        """A copy of list ``key`` (empty for a key never used)."""
        if key >= self.start.size:
            return np.empty(0, I32)
        s = int(self.start[key])
        return self.data[s : s + int(self.length[key])].copy()

    def size(self, key: int) -> int:
        return int(self.length[key]) if key < self.start.size else 0

    def clear(self, key: int) -> None:
        if key < self.start.size:
            self.length[key] = 0

    def view(self) -> PoolView:
        return self.start, self.length, self.data

    def nbytes(self) -> int:
        return int(self.start.nbytes + self.length.nbytes + self.cap.nbytes + self.data.nbytes)
