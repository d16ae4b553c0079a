"""Filter tests shared by the routing cores, memoised: in a network the same filters meet
again at every node, so covering is decided and a filter compiled once per process."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from flowbus.filters import Filter
from flowbus.filters.compile import Compiler

__all__ = ["compiled", "covers"]

_COMPILER = Compiler({})


@lru_cache(maxsize=1 << 18)
def covers(f: Filter, g: Filter) -> bool:
    """``f`` covers ``g`` (equal filters cover each other)."""
    return f == g or f.covers(g)


@lru_cache(maxsize=1 << 12)
def compiled(f: Filter) -> Callable[[Mapping[str, Any]], bool]:
    """``f`` compiled to a closure ``event -> bool`` (the last few thousand kept: a closure
    costs about 4.7 KB, and routing tries closures only on the few filters its matchers
    have not taken yet; kept for 65,536 filters, a broker's subscriptions cost 300 MB more)."""
    fn, memo = _COMPILER.filter(f), _COMPILER.new_memo()
    return lambda event: fn(event, memo)
