# mypy: disable-error-code="no-any-return,arg-type,return-value"
"""The compiled loops of the matcher: predicate matching, then subscription matching.

Stage 1 (``_satisfied``) lists, for one event, the predicates it satisfies: an
attribute's value code (its constant, looked up in a hash table in Python) leads
to the equality / ``in`` predicates it satisfies; ``!=`` / ``not in`` predicates
of the attribute hold unless the code excludes them; ``exists`` holds for any
present value; predicates evaluated outside (strings by order, prefixes...)
arrive as a ready list. Numeric ranges are not predicates here: the interval
indexes have already cleared, per event, the conjunctions they fail (``alive``).

Stage 2 is one of the two algorithms of the 001 document:

* **counting** -- each satisfied predicate adds one to every conjunction that
  contains it (a negated one poisons it); a conjunction matches when its count
  reaches its number of positive predicates and no interval cleared it;
* **clustering** -- each conjunction hangs under one *access predicate*; for a
  satisfied access predicate only its cluster is visited, and each member's
  other predicates are read from the event's predicate bit vector.

Conjunctions without positive predicates (only ranges, negations, expressions)
match, in both, when their ``alive`` bit survives and nothing poisons them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

MISSING = -2
"""Value code of an attribute the event lacks."""
UNKNOWN = -1
"""Value code of a present value that no equality-like predicate names."""


@njit(cache=True, nogil=True, inline="always")
def _bit(bits: np.ndarray, c: int) -> bool:
    return (bits[c >> 6] >> np.uint64(c & 63)) & np.uint64(1) != 0


@njit(cache=True, nogil=True, inline="always")
def _ctz(x: np.uint64) -> int:
    """Index of the lowest set bit of a non-zero word."""
    n = 0
    if x & np.uint64(0xFFFFFFFF) == 0:
        n += 32
        x >>= np.uint64(32)
    if x & np.uint64(0xFFFF) == 0:
        n += 16
        x >>= np.uint64(16)
    if x & np.uint64(0xFF) == 0:
        n += 8
        x >>= np.uint64(8)
    if x & np.uint64(0xF) == 0:
        n += 4
        x >>= np.uint64(4)
    if x & np.uint64(0x3) == 0:
        n += 2
        x >>= np.uint64(2)
    if x & np.uint64(0x1) == 0:
        n += 1
    return n


@njit(cache=True, nogil=True)
def _grow(buf: np.ndarray) -> np.ndarray:
    grown = np.empty(2 * buf.size, buf.dtype)
    grown[: buf.size] = buf
    return grown


@njit(cache=True, nogil=True)
def _satisfied(
    e: int,
    epoch: int,
    codes: np.ndarray,
    extra_ptr: np.ndarray,
    extra_ids: np.ndarray,
    exists_pred: np.ndarray,
    code_start: np.ndarray,
    code_len: np.ndarray,
    code_data: np.ndarray,
    excl_start: np.ndarray,
    excl_len: np.ndarray,
    excl_data: np.ndarray,
    ne_start: np.ndarray,
    ne_len: np.ndarray,
    ne_data: np.ndarray,
    xmark: np.ndarray,
    sat: np.ndarray,
) -> int:
    """Stage 1: the predicates event ``e`` satisfies, into ``sat`` (sized for every predicate).

    Returns how many there are.
    """
    n = 0
    for j in range(codes.shape[1]):
        code = codes[e, j]
        if code == MISSING:
            continue
        p = exists_pred[j]
        if p >= 0:
            sat[n] = p
            n += 1
        if code >= 0:
            s = code_start[code]
            for k in range(code_len[code]):
                sat[n] = code_data[s + k]
                n += 1
            s = excl_start[code]
            for k in range(excl_len[code]):
                xmark[excl_data[s + k]] = epoch
        s = ne_start[j]
        for k in range(ne_len[j]):
            p = ne_data[s + k]
            if code < 0 or xmark[p] != epoch:
                sat[n] = p
                n += 1
    for k in range(extra_ptr[e], extra_ptr[e + 1]):
        sat[n] = extra_ids[k]
        n += 1
    return n


@njit(cache=True, nogil=True, inline="always")
def _poisoned(counts: np.ndarray, c: int, tag: int) -> bool:
    w = np.int64(counts[c])
    return (w >> EPOCH_SHIFT) == tag and (w & 0xFF) == POISONED


@njit(cache=True, nogil=True)
def _zero_group(
    e: int,
    tag: int,
    has_alive: bool,
    alive: np.ndarray,
    zero_bits: np.ndarray,
    zero_list: np.ndarray,
    zero_n: int,
    counts: np.ndarray,
    done: np.ndarray,
    n_done: int,
) -> int:
    """Add to ``done`` the conjunctions with no positive predicate that survived intervals and negations."""
    if has_alive:
        row = alive[e]
        for w in range(zero_bits.size):
            word = row[w] & zero_bits[w]
            while word:
                low = word & (~word + np.uint64(1))
                c = w * 64 + _ctz(low)
                if not _poisoned(counts, c, tag):
                    done[n_done] = c
                    n_done += 1
                word ^= low
    else:
        for i in range(zero_n):
            c = zero_list[i]
            if not _poisoned(counts, c, tag):
                done[n_done] = c
                n_done += 1
    return n_done


@njit(cache=True, nogil=True)
def _emit(out: np.ndarray, n_out: int, done: np.ndarray, n_done: int) -> tuple[np.ndarray, int]:
    while n_out + n_done > out.size:
        out = _grow(out)
    out[n_out : n_out + n_done] = done[:n_done]
    return out, n_out + n_done


EPOCH_SHIFT = 16
EPOCH_PERIOD = 0xFFFF
"""Events after which a 16-bit epoch tag repeats (the caller wipes the tags before that)."""
REQ_MASK = 0xFF00
POISONED = 0xFF
MAX_REQUIRED = 254
"""A conjunction may hold at most this many positive predicates (the count lives in 8 bits)."""


@njit(cache=True, nogil=True)
def count_match(
    epoch0: int,
    codes: np.ndarray,
    extra_ptr: np.ndarray,
    extra_ids: np.ndarray,
    exists_pred: np.ndarray,
    code_pool: tuple[np.ndarray, np.ndarray, np.ndarray],
    excl_pool: tuple[np.ndarray, np.ndarray, np.ndarray],
    ne_pool: tuple[np.ndarray, np.ndarray, np.ndarray],
    pos_pool: tuple[np.ndarray, np.ndarray, np.ndarray],
    neg_pool: tuple[np.ndarray, np.ndarray, np.ndarray],
    has_alive: bool,
    alive: np.ndarray,
    zero_bits: np.ndarray,
    zero_list: np.ndarray,
    zero_n: int,
    counts: np.ndarray,
    xmark: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The counting algorithm over a batch; returns matched conjunction slots as CSR (ptr, slots).

    ``counts[c]`` packs, in one 32-bit word per conjunction (one cache access per
    posting): the event's 16-bit epoch, the number of positive predicates the
    conjunction requires, and the count so far (``POISONED`` once a negated
    predicate of it holds). Negations are applied first, so a conjunction is
    emitted the moment its count reaches its requirement.
    """
    n_events = codes.shape[0]
    ptr = np.zeros(n_events + 1, np.int64)
    out = np.empty(64, np.int32)
    sat = np.empty(xmark.size + 1, np.int32)
    done = np.empty(counts.size, np.int32)
    n_out = 0
    pos_start, pos_len, pos_data = pos_pool
    neg_start, neg_len, neg_data = neg_pool
    for e in range(n_events):
        epoch = epoch0 + e
        tag = np.int64(epoch % EPOCH_PERIOD + 1)
        fresh = tag << EPOCH_SHIFT
        n_sat = _satisfied(
            e, epoch, codes, extra_ptr, extra_ids, exists_pred,
            code_pool[0], code_pool[1], code_pool[2], excl_pool[0], excl_pool[1], excl_pool[2],
            ne_pool[0], ne_pool[1], ne_pool[2], xmark, sat,
        )  # fmt: skip
        for i in range(n_sat):
            p = sat[i]
            s = neg_start[p]
            for k in range(neg_len[p]):
                c = neg_data[s + k]
                counts[c] = np.uint32(fresh | (np.int64(counts[c]) & REQ_MASK) | POISONED)
        n_done = 0
        for i in range(n_sat):
            p = sat[i]
            s = pos_start[p]
            for k in range(pos_len[p]):
                c = pos_data[s + k]
                w = np.int64(counts[c])
                if (w >> EPOCH_SHIFT) != tag:
                    w = fresh | (w & REQ_MASK)
                n = w & 0xFF
                if n == POISONED:
                    continue
                n += 1
                counts[c] = np.uint32((w & ~np.int64(0xFF)) | n)
                if n == (w & REQ_MASK) >> 8:
                    done[n_done] = c
                    n_done += 1
        if has_alive:
            kept = 0
            for i in range(n_done):
                if _bit(alive[e], done[i]):
                    done[kept] = done[i]
                    kept += 1
            n_done = kept
        if zero_n:
            n_done = _zero_group(e, tag, has_alive, alive, zero_bits, zero_list, zero_n, counts, done, n_done)
        # appended here, not in the loops above: growing ``out`` there costs reference counting per step
        out, n_out = _emit(out, n_out, done, n_done)
        ptr[e + 1] = n_out
    return ptr, out[:n_out]


@njit(cache=True, nogil=True)
def cluster_match(
    epoch0: int,
    codes: np.ndarray,
    extra_ptr: np.ndarray,
    extra_ids: np.ndarray,
    exists_pred: np.ndarray,
    code_pool: tuple[np.ndarray, np.ndarray, np.ndarray],
    excl_pool: tuple[np.ndarray, np.ndarray, np.ndarray],
    ne_pool: tuple[np.ndarray, np.ndarray, np.ndarray],
    cluster_pool: tuple[np.ndarray, np.ndarray, np.ndarray],
    neg_pool: tuple[np.ndarray, np.ndarray, np.ndarray],
    has_alive: bool,
    alive: np.ndarray,
    zero_bits: np.ndarray,
    zero_list: np.ndarray,
    zero_n: int,
    counts: np.ndarray,
    pmark: np.ndarray,
    xmark: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The clustering algorithm over a batch; returns matched conjunction slots as CSR (ptr, slots).

    The cluster of access predicate ``p`` is a run of records ``[slot, k,
    item_1 .. item_k]`` with the member's other predicates inline (``q + 1``
    positive, ``-(q + 1)`` negated), read sequentially against the event's
    predicate bit vector ``pmark``.
    """
    n_events = codes.shape[0]
    ptr = np.zeros(n_events + 1, np.int64)
    out = np.empty(64, np.int32)
    sat = np.empty(xmark.size + 1, np.int32)
    done = np.empty(counts.size, np.int32)
    n_out = 0
    cl_start, cl_len, cl_data = cluster_pool
    neg_start, neg_len, neg_data = neg_pool
    for e in range(n_events):
        epoch = epoch0 + e
        tag = np.int64(epoch % EPOCH_PERIOD + 1)
        n_sat = _satisfied(
            e, epoch, codes, extra_ptr, extra_ids, exists_pred,
            code_pool[0], code_pool[1], code_pool[2], excl_pool[0], excl_pool[1], excl_pool[2],
            ne_pool[0], ne_pool[1], ne_pool[2], xmark, sat,
        )  # fmt: skip
        for i in range(n_sat):
            pmark[sat[i]] = epoch
        n_done = 0
        for i in range(n_sat):
            p = sat[i]
            pos = cl_start[p]
            end = pos + cl_len[p]
            while pos < end:
                c = cl_data[pos]
                k = cl_data[pos + 1]
                ok = not has_alive or _bit(alive[e], c)
                q = pos + 2
                while ok and q < pos + 2 + k:
                    item = cl_data[q]
                    ok = pmark[item - 1] == epoch if item > 0 else pmark[-item - 1] != epoch
                    q += 1
                if ok:
                    done[n_done] = c
                    n_done += 1
                pos += 2 + k
        if zero_n:
            for i in range(n_sat):
                p = sat[i]
                s = neg_start[p]
                for k in range(neg_len[p]):
                    c = neg_data[s + k]
                    counts[c] = np.uint32((tag << EPOCH_SHIFT) | POISONED)
            n_done = _zero_group(e, tag, has_alive, alive, zero_bits, zero_list, zero_n, counts, done, n_done)
        out, n_out = _emit(out, n_out, done, n_done)
        ptr[e + 1] = n_out
    return ptr, out[:n_out]
