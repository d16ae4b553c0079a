# mypy: disable-error-code="no-any-return,arg-type,return-value"
"""The numeric ranges on one attribute, as one closed interval per conjunction.

A conjunction's ordering predicates on a numeric attribute (``price > 5 &
price <= 20``) intersect to one closed interval of exact numbers, held as
:mod:`flowbus.matching.numbers` says: ``[lo, hi]`` of doubles (an open end
``> c`` becomes ``>= nextafter(c, +inf)``, exact for doubles) and two residuals
for the ints past 2**53 beside its ends. An event value is a double ``v`` and a
residual ``r`` (0 for a double: then the test is ``lo <= v <= hi``). For each
value the index *clears*, in a per-event bitset of live conjunctions (``alive``),
every conjunction whose interval on this attribute misses it.

Two layouts, chosen by how many intervals the attribute holds against the total
number of conjunctions:

* **scan** -- the intervals in parallel arrays (``b[i] = (lo, hi)``, ``r[i] =
  (lo_r, hi_r)``, ``conj[i]``), tested one by one (few intervals: a linear pass
  is cheaper than any structure);
* **dense** -- the value axis cut into buckets at interval end points (at every
  distinct end point when there are at most 256: a table per value for small
  integer domains, as in the 001 document; otherwise at quantiles). Per bucket
  a bitset of the conjunctions whose interval misses the whole bucket, and a
  list of those whose interval ends inside it (tested exactly). One event costs
  one bitset AND plus a short list of exact tests, whatever the number of
  intervals that hold -- this is what keeps range-heavy workloads (each range
  true for 40% of values) fast at a million subscriptions. A bucket is a range
  of numbers, the ints in the gaps between its doubles included: an interval
  holds it whole only when it holds those too.

Both layouts give the same answer; the tests check them against each other.
While every residual of an index is 0 (float constants, ints below 2**53) it
keeps no residual arrays at all (``r`` and the lists' residuals are empty), so
the common case costs what it did before residuals existed.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from flowbus.matching._types import F64, I16, I32, U64
from flowbus.matching.numbers import gap_top, inside

SCAN, DENSE = 0, 1
EXACT_BUCKETS = 256
QUANTILE_BUCKETS = 128
DENSE_MIN = 64
"""Below this many intervals an attribute is always scanned."""
DENSE_BYTES_PER_INTERVAL = 512
"""Memory the dense layout's bitsets may spend per interval."""


@njit(cache=True, nogil=True, inline="always")
def _clear(bits: np.ndarray, c: int) -> None:
    bits[c >> 6] &= ~(np.uint64(1) << np.uint64(c & 63))


@njit(cache=True, nogil=True, inline="always")
def _set(bits: np.ndarray, c: int) -> None:
    bits[c >> 6] |= np.uint64(1) << np.uint64(c & 63)


@njit(cache=True, nogil=True, inline="always")
def _empty(lo: float, lo_r: int, hi: float, hi_r: int) -> bool:
    """Does the interval hold no number? (Its smallest pair is above its largest.)"""
    lk = lo if lo_r == 0 else np.nextafter(lo, -np.inf)
    return lk > hi or (lk == hi and lo_r > hi_r)


Parts = tuple[np.ndarray, np.ndarray, np.ndarray]
"""The per-bucket lists of partially overlapping intervals: slot, ``(lo, hi)``, ``(lo_r, hi_r)`` (the
last empty while the index has no residuals)."""


@njit(cache=True, nogil=True, inline="always")
def _residuals(r: np.ndarray, i: int) -> tuple[int, int]:
    """``r[i]``, or ``(0, 0)`` when ``r`` is empty (no residuals at all)."""
    if r.shape[0] == 0:
        return 0, 0
    return r[i, 0], r[i, 1]


@njit(cache=True, nogil=True)
def scan_apply(
    b: np.ndarray,
    r: np.ndarray,
    conj: np.ndarray,
    m: int,
    vals: np.ndarray,
    res: np.ndarray,
    alive: np.ndarray,
) -> None:
    """Clear ``alive[e]`` bits of conjunctions whose interval ``(b[i], r[i])`` misses value ``(vals[e],
    res[e])`` (NaN misses all; ``res`` empty: every residual is 0)."""
    exact = res.size > 0
    for e in range(vals.size):
        v = vals[e]
        row = alive[e]
        ve = res[e] if exact else 0
        if ve == 0:
            for i in range(m):
                if not (b[i, 0] <= v and v <= b[i, 1]):
                    _clear(row, conj[i])
        else:
            nv = np.nextafter(v, np.inf)
            for i in range(m):
                lo_r, hi_r = _residuals(r, i)
                if not inside(v, ve, nv, b[i, 0], lo_r, b[i, 1], hi_r):
                    _clear(row, conj[i])


@njit(cache=True, nogil=True)
def dense_apply(
    bnd: np.ndarray,
    fail: np.ndarray,
    parts: Parts,
    part_n: np.ndarray,
    has: np.ndarray,
    vals: np.ndarray,
    res: np.ndarray,
    alive: np.ndarray,
) -> None:
    part, part_b, part_r = parts
    words = has.size
    exact = res.size > 0
    for e in range(vals.size):
        v = vals[e]
        row = alive[e]
        if v != v:
            for w in range(words):
                row[w] &= ~has[w]
            continue
        j = np.searchsorted(bnd, v, side="right") - 1
        fj = fail[j]
        for w in range(words):
            row[w] &= ~fj[w]
        pj, bj = part[j], part_b[j]
        ve = res[e] if exact else 0
        if ve == 0:
            for k in range(part_n[j]):
                if not (bj[k, 0] <= v and v <= bj[k, 1]):
                    _clear(row, pj[k])
        else:
            nv = np.nextafter(v, np.inf)
            rj = part_r[j] if part_r.shape[0] > 0 else part_r[0:0, 0]
            for k in range(part_n[j]):
                lo_r, hi_r = _residuals(rj, k)
                if not inside(v, ve, nv, bj[k, 0], lo_r, bj[k, 1], hi_r):
                    _clear(row, pj[k])


@njit(cache=True, nogil=True)
def _bucket_span(bnd: np.ndarray, lo: float, lo_r: int, hi: float, hi_r: int) -> tuple[int, int, bool, bool]:
    """First and last bucket the interval touches, and whether those end buckets lie wholly inside it
    (a bucket's numbers include the ints in the gap below its upper boundary)."""
    nb = bnd.size
    lk = lo if lo_r == 0 else np.nextafter(lo, -np.inf)
    jl = np.searchsorted(bnd, lk, side="right") - 1
    jh = np.searchsorted(bnd, hi, side="right") - 1
    lo_full = lo_r == 0 and lk <= bnd[jl]
    if jh + 1 < nb:
        top = np.nextafter(bnd[jh + 1], -np.inf)
        hi_full = hi >= top and hi_r >= gap_top(top)
    else:
        hi_full = hi == np.inf
    return jl, jh, lo_full and (jl < jh or hi_full), hi_full and (jh > jl or lo_full)


@njit(cache=True, nogil=True)
def _mark(
    bnd: np.ndarray,
    fail: np.ndarray,
    parts: Parts,
    part_n: np.ndarray,
    has: np.ndarray,
    c: int,
    b: np.ndarray,
    r: tuple[int, int],
    insert: bool,
) -> Parts:
    """Add (or remove) conjunction ``c``'s interval (``b = (lo, hi)``, ``r = (lo_r, hi_r)``) to the
    dense layout; returns the per-bucket lists, maybe grown."""
    nb = bnd.size
    if insert:
        _set(has, c)
    else:
        _clear(has, c)
    if _empty(b[0], r[0], b[1], r[1]):
        for j in range(nb):
            if insert:
                _set(fail[j], c)
            else:
                _clear(fail[j], c)
        return parts
    jl, jh, full_l, full_h = _bucket_span(bnd, b[0], r[0], b[1], r[1])
    for j in range(nb):
        if j < jl or j > jh:
            if insert:
                _set(fail[j], c)
            else:
                _clear(fail[j], c)
        elif (j == jl and not full_l) or (j == jh and not full_h):
            if insert:
                if part_n[j] == parts[0].shape[1]:
                    parts = _widen(parts)
                _put(parts, part_n, j, c, b, r)
            else:
                _drop(parts, part_n, j, c)
    return parts


@njit(cache=True, nogil=True, inline="always")
def _put(parts: Parts, part_n: np.ndarray, j: int, c: int, b: np.ndarray, r: tuple[int, int]) -> None:
    part, part_b, part_r = parts
    k = part_n[j]
    part[j, k] = c
    part_b[j, k] = b
    if part_r.shape[0] > 0:
        part_r[j, k, 0], part_r[j, k, 1] = r
    part_n[j] = k + 1


@njit(cache=True, nogil=True, inline="always")
def _drop(parts: Parts, part_n: np.ndarray, j: int, c: int) -> None:
    part, part_b, part_r = parts
    n = part_n[j]
    for k in range(n):
        if part[j, k] == c:
            part[j, k] = part[j, n - 1]
            part_b[j, k] = part_b[j, n - 1]
            if part_r.shape[0] > 0:
                part_r[j, k] = part_r[j, n - 1]
            part_n[j] = n - 1
            break


@njit(cache=True, nogil=True)
def _widen(parts: Parts) -> Parts:
    part, part_b, part_r = parts
    nb, cap = part.shape
    new_cap = max(4, 2 * cap)
    p = np.empty((nb, new_cap), part.dtype)
    pb = np.empty((nb, new_cap, 2), part_b.dtype)
    pr = np.empty((nb if part_r.shape[0] > 0 else 0, new_cap, 2), part_r.dtype)
    p[:, :cap] = part
    pb[:, :cap] = part_b
    if part_r.shape[0] > 0:
        pr[:, :cap] = part_r
    return p, pb, pr


@njit(cache=True, nogil=True)
def _mark_range(
    bnd: np.ndarray,
    fail: np.ndarray,
    parts: Parts,
    part_n: np.ndarray,
    has: np.ndarray,
    b: np.ndarray,
    r: np.ndarray,
    conj: np.ndarray,
    start: int,
    stop: int,
    insert: bool,
) -> Parts:
    """:func:`_mark` the index's intervals ``start .. stop - 1`` (``b``, ``r``, ``conj``: its arrays)."""
    for i in range(start, stop):
        parts = _mark(bnd, fail, parts, part_n, has, conj[i], b[i], _residuals(r, i), insert)
    return parts


@njit(cache=True, nogil=True)
def _build(
    bnd: np.ndarray, b: np.ndarray, r: np.ndarray, conj: np.ndarray, m: int, words: int
) -> tuple[np.ndarray, Parts, np.ndarray, np.ndarray]:
    """The dense layout from scratch, bucket by bucket (each bitset row written in one sweep)."""
    nb = bnd.size
    fail = np.zeros((nb, words), np.uint64)
    has = np.zeros(words, np.uint64)
    span = np.empty((m, 4), np.int64)
    part_n = np.zeros(nb, np.int32)
    for i in range(m):
        _set(has, conj[i])
        lo_r, hi_r = _residuals(r, i)
        if not _empty(b[i, 0], lo_r, b[i, 1], hi_r):
            jl, jh, full_l, full_h = _bucket_span(bnd, b[i, 0], lo_r, b[i, 1], hi_r)
            span[i, 0], span[i, 1], span[i, 2], span[i, 3] = jl, jh, full_l, full_h
            if not full_l:
                part_n[jl] += 1
            if not full_h and jh != jl:
                part_n[jh] += 1
        else:
            span[i, 0], span[i, 1] = nb, -1
    cap = max(4, int(part_n.max()) + 4) if nb else 4
    nr = nb if r.shape[0] > 0 else 0  # no residuals in the index: none in the lists
    parts = (
        np.empty((nb, cap), np.int32),
        np.empty((nb, cap, 2), np.float64),
        np.empty((nr, cap, 2), np.int16),
    )
    part_n[:] = 0
    for j in range(nb):
        row = fail[j]
        for i in range(m):
            if j < span[i, 0] or j > span[i, 1]:
                _set(row, conj[i])
    for i in range(m):
        jl, jh = span[i, 0], span[i, 1]
        if jl > jh:
            continue
        if not span[i, 2]:
            _put(parts, part_n, jl, conj[i], b[i], _residuals(r, i))
        if not span[i, 3] and jh != jl:
            _put(parts, part_n, jh, conj[i], b[i], _residuals(r, i))
    return fail, parts, part_n, has


def choose_boundaries(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Bucket lower bounds (``-inf`` first): every distinct end point when few, else quantiles."""
    starts = np.concatenate([lo, np.nextafter(hi, np.inf)])
    starts = starts[np.isfinite(starts)]
    points = np.unique(starts)
    if points.size >= EXACT_BUCKETS:
        qs = np.linspace(0.0, 1.0, QUANTILE_BUCKETS + 1)[1:-1]
        points = np.unique(np.quantile(starts, qs, method="inverted_cdf"))
    return np.concatenate([np.array([-np.inf]), points]).astype(F64)


_NO_PARTS: Parts = (np.empty((0, 0), I32), np.empty((0, 0, 2), F64), np.empty((0, 0, 2), I16))
_NO_RESIDUALS = np.empty(0, I16)
_ZERO_RESIDUALS = np.empty((0, 2), I16)
"""The residuals ``r`` of an index all of whose residuals are 0."""


class IntervalIndex:
    """One attribute's intervals, keyed by conjunction slot, in the scan or the dense layout."""

    __slots__ = ("b", "bnd", "built_m", "conj", "fail", "has", "m", "mode", "part_n", "parts", "pos", "r")

    def __init__(self, slots: int) -> None:
        self.b = np.empty((16, 2), F64)  # (lo, hi) per interval
        self.r = _ZERO_RESIDUALS  # (lo_r, hi_r) per interval, once one is not 0
        self.conj = np.empty(16, I32)
        self.m = 0
        self.pos = np.full(slots, -1, I32)
        self.mode = SCAN
        self.built_m = 0
        self.bnd = np.empty(0, F64)
        self.fail = np.empty((0, 0), U64)
        self.parts = _NO_PARTS
        self.part_n = np.empty(0, I32)
        self.has = np.empty(0, U64)

    # ------------------------------------------------------------------ changes

    def resize(self, slots: int) -> None:
        """The matcher grew its conjunction slots: widen the per-slot arrays and bitsets."""
        if slots > self.pos.size:
            grown = np.full(slots, -1, I32)
            grown[: self.pos.size] = self.pos
            self.pos = grown
            if self.mode == DENSE:
                words = (slots + 63) // 64
                fail = np.zeros((self.fail.shape[0], words), U64)
                fail[:, : self.fail.shape[1]] = self.fail
                has = np.zeros(words, U64)
                has[: self.has.size] = self.has
                self.fail, self.has = fail, has

    def add(self, slots: np.ndarray, b: np.ndarray, r: np.ndarray | None) -> None:
        """Add one interval per conjunction slot (slots not yet in this index): ``b[i] = (lo, hi)``,
        ``r[i] = (lo_r, hi_r)`` (``r`` None: all 0)."""
        k = slots.size
        m, need = self.m, self.m + k
        if need > self.conj.size:
            size = max(need, 2 * self.conj.size)
            for name in ("b", "r", "conj"):
                arr = getattr(self, name)
                if arr.shape[0]:
                    grown = np.empty((size, *arr.shape[1:]), arr.dtype)
                    grown[:m] = arr[:m]
                    setattr(self, name, grown)
        first_residual = self.r.shape[0] == 0 and r is not None
        if first_residual:
            self.r = np.zeros((self.conj.size, 2), I16)
        self.b[m:need] = b
        if self.r.shape[0]:
            self.r[m:need] = 0 if r is None else r
        self.conj[m:need] = slots
        self.pos[slots] = np.arange(m, need, dtype=I32)
        self.m = need
        if self.mode == DENSE and k < need // 8 and not first_residual:
            self._mark(m, need, insert=True)
        elif self.mode == DENSE:
            self.rebuild(self.pos.size)

    def remove(self, c: int) -> None:
        i = int(self.pos[c])
        if self.mode == DENSE:
            self._mark(i, i + 1, insert=False)
        last = self.m - 1
        if i != last:
            self.b[i] = self.b[last]
            if self.r.shape[0]:
                self.r[i] = self.r[last]
            moved = self.conj[last]
            self.conj[i] = moved
            self.pos[moved] = i
        self.pos[c] = -1
        self.m = last

    def _mark(self, start: int, stop: int, *, insert: bool) -> None:
        """Enter (or take out) intervals ``start .. stop - 1`` in the dense layout."""
        self.parts = _mark_range(
            self.bnd,
            self.fail,
            self.parts,
            self.part_n,
            self.has,
            self.b,
            self.r,
            self.conj,
            start,
            stop,
            insert,
        )

    def tune(self) -> None:
        """Re-decide the layout whenever the number of intervals has doubled or halved since last time.

        Dense pays off as soon as a scan costs more than a bitset AND, but its bitsets
        cost ``buckets * slots / 8`` bytes: it is chosen while that stays within
        ``DENSE_BYTES_PER_INTERVAL`` per interval (a quarter of a scan's per-interval cost
        in time, for any realistic slot count).
        """
        if self.built_m // 2 <= self.m <= 2 * self.built_m and (self.m or self.built_m):
            return
        m = self.m
        bnd = choose_boundaries(self.b[:m, 0], self.b[:m, 1])
        words = (self.pos.size + 63) // 64
        if m >= DENSE_MIN and bnd.size * words * 8 <= DENSE_BYTES_PER_INTERVAL * m:
            self.rebuild(self.pos.size, bnd)
        else:
            self.mode = SCAN
            self.built_m = m
            self.bnd = np.empty(0, F64)
            self.fail = np.empty((0, 0), U64)
            self.parts = _NO_PARTS
            self.part_n = np.empty(0, I32)
            self.has = np.empty(0, U64)

    def rebuild(self, slots: int, bnd: np.ndarray | None = None) -> None:
        """(Re)build the dense layout from the intervals."""
        words = (slots + 63) // 64
        m = self.m
        self.bnd = choose_boundaries(self.b[:m, 0], self.b[:m, 1]) if bnd is None else bnd
        self.fail, self.parts, self.part_n, self.has = _build(self.bnd, self.b, self.r, self.conj, m, words)
        self.mode = DENSE
        self.built_m = m

    # ------------------------------------------------------------------ queries

    def apply(self, vals: np.ndarray, res: np.ndarray | None, alive: np.ndarray) -> None:
        """Clear ``alive[e]``'s bit for each conjunction whose interval misses the value ``(vals[e],
        res[e])`` (``res`` None: every residual is 0)."""
        if self.m == 0:
            return
        residuals = _NO_RESIDUALS if res is None else res
        if self.mode == DENSE:
            dense_apply(self.bnd, self.fail, self.parts, self.part_n, self.has, vals, residuals, alive)
        else:
            scan_apply(self.b, self.r, self.conj, self.m, vals, residuals, alive)

    def nbytes(self) -> int:
        arrays = (
            self.b,
            self.r,
            self.conj,
            self.pos,
            self.bnd,
            self.fail,
            *self.parts,
            self.part_n,
            self.has,
        )
        return sum(int(a.nbytes) for a in arrays)
