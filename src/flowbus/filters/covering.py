"""Covering: does every event one filter matches also match another?

``covers(f, g)`` is *sound*: when it says True, no event matches ``g`` without
matching ``f``. It is *complete* (says True whenever coverage holds) when ``f`` is
one conjunction and every literal of both is a simple predicate other than
``suffix``/``contains`` -- negated or not.

How it works: a conjunction of simple predicates constrains each attribute on its
own, so it denotes a product, over attributes, of sets of values. Each such set is
exact algebra over the whole value domain of an attribute:

* ``missing`` -- the attribute may be absent;
* ``nan`` -- it may hold NaN (unequal to everything, ordered with nothing);
* ``bools`` -- the booleans it may hold;
* ``nums`` -- a union of disjoint intervals of the extended reals, open or closed
  at each end (``inf`` is a value an event may hold; constants are finite);
* ``strs`` -- a union of disjoint intervals ``[lo, hi)`` of strings in code-point
  order. Strings are discrete, so an open end is closed by taking the successor
  (``s + "\\0"``), which makes emptiness and adjacency exact; a prefix ``p`` is
  ``[p, inc(p))`` where ``inc`` increments the last code point (``None`` = no end).

Predicates map to sets (``x != 5`` is "present, minus the number 5"; a negated
literal is the complement, missing attribute included), a conjunction intersects
them, and ``g`` is covered by ``f`` exactly when some attribute set of ``g`` is
empty, or each of ``f``'s sets contains ``g``'s set for that attribute (a product
of non-empty sets is inside another product iff it is factor by factor).

``suffix``/``contains`` have no interval form: they ride along as string *tests*.
When an attribute's strings form a small finite set, the tests are applied to the
points (exact). Otherwise ``g``'s tests are ignored (over-approximation) and an
``f`` test must follow from a ``g`` test or prefix (``prefix "ab"`` implies
``contains "b"``), else covering is refused. ``g``'s expression predicates are
ignored; each of ``f``'s must appear, identical, in ``g``. For several disjuncts,
``f`` covers ``g`` when each conjunction of ``g`` is covered by one of ``f``'s --
sound, but incomplete when only a union of ``f``'s conjunctions covers it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import lru_cache

from flowbus.filters.ast import ORDERING_OPS, Conjunction, Filter, Op, Predicate, value_class
from flowbus.model import Value

__all__ = ["covers", "overlaps"]

_INF = math.inf
NumInterval = tuple[float, bool, float, bool]
"""``(lo, lo_closed, hi, hi_closed)``; ``-inf``/``inf`` are values events may hold."""
StrInterval = tuple[str, str | None]
"""``[lo, hi)`` in code-point order; ``hi`` None means unbounded."""
Test = tuple[Op, str, bool]
"""A string test ``(suffix|contains, operand, negated)`` every string of a set must pass."""

_ALL_NUMS: tuple[NumInterval, ...] = ((-_INF, True, _INF, True),)
_ALL_STRS: tuple[StrInterval, ...] = (("", None),)
_BOOLS = frozenset({False, True})
_MAX_POINTS = 64
_MAX_CODE_POINT = chr(0x10FFFF)


# ------------------------------------------------------------------ numbers


def _num_empty(iv: NumInterval) -> bool:
    lo, lc, hi, hc = iv
    return lo > hi or (lo == hi and not (lc and hc))


def _num_norm(ivs: Iterable[NumInterval]) -> tuple[NumInterval, ...]:
    """Sorted, disjoint, non-touching intervals."""
    out: list[NumInterval] = []
    for iv in sorted((iv for iv in ivs if not _num_empty(iv)), key=lambda iv: (iv[0], not iv[1])):
        if out:
            lo, lc, hi, hc = out[-1]
            if iv[0] < hi or (iv[0] == hi and (hc or iv[1])):
                if iv[2] > hi or (iv[2] == hi and iv[3]):
                    out[-1] = (lo, lc, iv[2], iv[3])
                continue
        out.append(iv)
    return tuple(out)


def _num_and(a: tuple[NumInterval, ...], b: tuple[NumInterval, ...]) -> tuple[NumInterval, ...]:
    out = []
    for lo1, lc1, hi1, hc1 in a:
        for lo2, lc2, hi2, hc2 in b:
            lo, lc = (lo1, lc1) if lo1 > lo2 or (lo1 == lo2 and not lc1) else (lo2, lc2)
            hi, hc = (hi1, hc1) if hi1 < hi2 or (hi1 == hi2 and not hc1) else (hi2, hc2)
            out.append((lo, lc, hi, hc))
    return _num_norm(out)


def _num_not(a: tuple[NumInterval, ...]) -> tuple[NumInterval, ...]:
    """The complement within ``[-inf, inf]`` of normalised intervals."""
    out: list[NumInterval] = []
    lo, lc = -_INF, True
    for ilo, ilc, ihi, ihc in a:
        out.append((lo, lc, ilo, not ilc))
        lo, lc = ihi, not ihc
    out.append((lo, lc, _INF, True))
    return _num_norm(out)


def _num_range(op: Op, c: float) -> NumInterval:
    return {
        Op.LT: (-_INF, True, c, False),
        Op.LE: (-_INF, True, c, True),
        Op.GT: (c, False, _INF, True),
        Op.GE: (c, True, _INF, True),
    }[op]


# ------------------------------------------------------------------ strings


def _str_empty(iv: StrInterval) -> bool:
    return iv[1] is not None and iv[0] >= iv[1]


def _str_norm(ivs: Iterable[StrInterval]) -> tuple[StrInterval, ...]:
    out: list[StrInterval] = []
    for lo, hi in sorted((iv for iv in ivs if not _str_empty(iv)), key=lambda iv: iv[0]):
        if out and (out[-1][1] is None or lo <= out[-1][1]):
            prev_lo, prev_hi = out[-1]
            if prev_hi is not None and (hi is None or hi > prev_hi):
                out[-1] = (prev_lo, hi)
            continue
        out.append((lo, hi))
    return tuple(out)


def _str_and(a: tuple[StrInterval, ...], b: tuple[StrInterval, ...]) -> tuple[StrInterval, ...]:
    out = []
    for lo1, hi1 in a:
        for lo2, hi2 in b:
            hi = hi2 if hi1 is None else hi1 if hi2 is None else min(hi1, hi2)
            out.append((max(lo1, lo2), hi))
    return _str_norm(out)


def _str_not(a: tuple[StrInterval, ...]) -> tuple[StrInterval, ...]:
    out: list[StrInterval] = []
    lo: str | None = ""
    for ilo, ihi in a:
        out.append((lo, ilo))  # type: ignore[arg-type]  # lo is a str until an unbounded interval
        lo = ihi
        if lo is None:
            return _str_norm(out)
    out.append((lo, None))  # type: ignore[arg-type]
    return _str_norm(out)


def _increment(p: str) -> str | None:
    """The least string above every string that starts with ``p`` (None: there is none)."""
    p = p.rstrip(_MAX_CODE_POINT)
    return p[:-1] + chr(ord(p[-1]) + 1) if p else None


def _str_range(op: Op, c: str) -> StrInterval:
    if op is Op.PREFIX:
        return (c, _increment(c))
    return {Op.LT: ("", c), Op.LE: ("", c + "\0"), Op.GT: (c + "\0", None), Op.GE: (c, None)}[op]


def _str_points(ivs: tuple[StrInterval, ...]) -> list[str] | None:
    """The strings of ``ivs`` when there are few of them (``[s, s + "\\0"*k)`` holds k), else None."""
    points: list[str] = []
    for lo, hi in ivs:
        if hi is None or not hi.startswith(lo) or hi[len(lo) :].strip("\0"):
            return None
        if len(points) + len(hi) - len(lo) > _MAX_POINTS:
            return None
        points.extend(lo + "\0" * i for i in range(len(hi) - len(lo)))
    return points


# ------------------------------------------------------------- value sets


@dataclass(frozen=True, slots=True)
class _Values:
    """The values one attribute may take (see the module docstring); the default is everything."""

    missing: bool = True
    nan: bool = True
    bools: frozenset[bool] = _BOOLS
    nums: tuple[NumInterval, ...] = _ALL_NUMS
    strs: tuple[StrInterval, ...] = _ALL_STRS
    tests: tuple[Test, ...] = ()

    def __and__(self, o: _Values) -> _Values:
        return _Values(
            self.missing and o.missing,
            self.nan and o.nan,
            self.bools & o.bools,
            _num_and(self.nums, o.nums),
            _str_and(self.strs, o.strs),
            self.tests + o.tests,
        )

    def complement(self) -> _Values:
        """Everything else (only for sets without string tests)."""
        return _Values(
            not self.missing, not self.nan, _BOOLS - self.bools, _num_not(self.nums), _str_not(self.strs)
        )

    def is_empty(self) -> bool:
        """No value at all (string tests ignored: an over-approximation)."""
        return not (self.missing or self.nan or self.bools or self.nums or self.strs)

    def within(self, o: _Values) -> bool:
        """Is this set inside ``o``, string tests ignored?"""
        return (
            (o.missing or not self.missing)
            and (o.nan or not self.nan)
            and self.bools <= o.bools
            and not _num_and(self.nums, _num_not(o.nums))
            and not _str_and(self.strs, _str_not(o.strs))
        )


_NOTHING = _Values(False, False, frozenset(), (), ())
_PRESENT = _Values(missing=False)


def _points(values: Iterable[Value]) -> _Values:
    bools, nums, strs = set(), [], []
    for v in values:
        c = value_class(v)
        if c == 0:
            bools.add(bool(v))
        elif c == 1:
            nums.append((v, True, v, True))
        else:
            strs.append((v, v + "\0"))  # type: ignore[operator]
    return _Values(False, False, frozenset(bools), _num_norm(nums), _str_norm(strs))  # type: ignore[arg-type]


def _positive(p: Predicate) -> _Values:
    """The values for which ``p`` (not negated) holds."""
    op, v = p.op, p.value
    if op is Op.EXISTS:
        return _PRESENT
    if op in (Op.EQ, Op.IN):
        return _points(v if isinstance(v, tuple) else (v,))  # type: ignore[arg-type]
    if op in (Op.NE, Op.NOT_IN):
        return _PRESENT & _points(v if isinstance(v, tuple) else (v,)).complement()  # type: ignore[arg-type]
    if op in ORDERING_OPS and value_class(v) == 1:
        return replace(_NOTHING, nums=(_num_range(op, v),))  # type: ignore[arg-type]
    if op in ORDERING_OPS or op is Op.PREFIX:
        return replace(_NOTHING, strs=_str_norm((_str_range(op, v),)))  # type: ignore[arg-type]
    return replace(_NOTHING, strs=_ALL_STRS, tests=((op, v, False),))  # type: ignore[arg-type]


def _literal_values(p: Predicate) -> _Values:
    positive = _positive(p)
    if not p.negated:
        return positive
    if positive.tests:
        return _Values(tests=((p.op, p.value, True),))  # type: ignore[arg-type]
    return positive.complement()


def _passes(test: Test, s: str) -> bool:
    op, v, negated = test
    return (s.endswith(v) if op is Op.SUFFIX else v in s) != negated


def _tighten(vals: _Values) -> _Values:
    """Apply the string tests to a finite set of strings, making the set exact."""
    points = _str_points(vals.strs) if vals.tests else None
    if points is None:
        return vals
    kept = [s for s in points if all(_passes(t, s) for t in vals.tests)]
    return replace(vals, strs=_str_norm((s, s + "\0") for s in kept), tests=())


def _implied(test: Test, tests: tuple[Test, ...], prefixes: Iterable[str]) -> bool:
    """Does ``test`` hold for every string passing ``tests`` and starting with each of ``prefixes``?"""
    op, v, negated = test
    if not negated:
        if v == "":
            return True
        if op is Op.CONTAINS:
            return any(v in p for p in prefixes) or any(not n and v in w for _, w, n in tests)
        return any(not n and o is Op.SUFFIX and w.endswith(v) for o, w, n in tests)
    if op is Op.CONTAINS:
        return any(n and o is Op.CONTAINS and w in v for o, w, n in tests)
    return any(n and (w in v if o is Op.CONTAINS else v.endswith(w)) for o, w, n in tests)


def _tests_hold(tests: tuple[Test, ...], g: _Values, prefixes: Iterable[str]) -> bool:
    if not tests or not g.strs:
        return True
    points = _str_points(g.strs)
    if points is not None:
        return all(_passes(t, s) for t in tests for s in points)
    return all(_implied(t, g.tests, prefixes) for t in tests)


# -------------------------------------------------------------- covering


@lru_cache(maxsize=1 << 16)
def _attribute_sets(conj: Conjunction) -> tuple[dict[str, _Values], dict[str, list[str]]]:
    """Per attribute: the values ``conj``'s simple predicates allow, and its positive prefixes
    (memoised: routing tables test the same conjunctions again and again; read-only)."""
    sets: dict[str, _Values] = {}
    prefixes: dict[str, list[str]] = {}
    for lit in conj.simple:
        sets[lit.attr] = sets.get(lit.attr, _Values()) & _literal_values(lit)
        if lit.op is Op.PREFIX and not lit.negated:
            prefixes.setdefault(lit.attr, []).append(lit.value)  # type: ignore[arg-type]
    return {attr: _tighten(v) for attr, v in sets.items()}, prefixes


def _unsatisfiable(g: Conjunction) -> bool:
    g_sets, _ = _attribute_sets(g)
    return any(v.is_empty() for v in g_sets.values())


def _conjunction_covers(f: Conjunction, g: Conjunction) -> bool:
    g_sets, g_prefixes = _attribute_sets(g)
    if any(v.is_empty() for v in g_sets.values()):
        return True
    g_literals = set(g.literals)
    if any(lit not in g_literals for lit in f.expressions):
        return False
    f_sets, _ = _attribute_sets(f)
    everything = _Values()
    for attr, fv in f_sets.items():
        gv = g_sets.get(attr, everything)
        if not gv.within(fv) or not _tests_hold(fv.tests, gv, g_prefixes.get(attr, ())):
            return False
    return True


def covers(f: Filter, g: Filter) -> bool:
    """True only if every event ``g`` matches, ``f`` matches too.

    Sound always. Complete when ``f`` has one conjunction and both filters use only
    simple predicates (negated or not) other than ``suffix``/``contains``; with more
    conjunctions in ``f``, each conjunction of ``g`` must be covered by a single one
    of ``f``'s. ``g`` false is covered by anything; ``f`` true covers everything.
    """
    return all(
        _unsatisfiable(gc) or any(_conjunction_covers(fc, gc) for fc in f.disjuncts) for gc in g.disjuncts
    )


def overlaps(f: Filter, g: Filter) -> bool:
    """False only if no event matches both ``f`` and ``g``.

    Conservative: True unless, for every pair of a conjunction of ``f`` and one of ``g``, the
    conjunction of their literals is proven unsatisfiable (some attribute left with no value).
    Exact when both filters use only simple predicates other than ``suffix``/``contains``;
    expression predicates are ignored, string tests only count on finitely many strings.
    """
    for fc in f.disjuncts:
        for gc in g.disjuncts:
            both = Conjunction(fc.literals + gc.literals)
            if not both.is_contradiction() and not _unsatisfiable(both):
                return True
    return False
