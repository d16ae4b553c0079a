"""The small value grid the brute-force filter tests enumerate (covering, overlaps)."""

from __future__ import annotations

ATTRS = ("a", "b")
NUMS = (0, 1, 2, 3)
STRS = ("", "a", "ab", "b")
MISSING = object()


def increment(s: str) -> str | None:
    """The least string after every string with prefix ``s`` (None: there is none)."""
    s = s.rstrip(chr(0x10FFFF))
    return s[:-1] + chr(ord(s[-1]) + 1) if s else None
