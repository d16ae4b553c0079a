"""A full disk for the tests of a broker's store: faked (a store's SQLite connection whose
writes fail with SQLite's own error while ``full``) or real (a tiny tmpfs, root only, filled
with a file until the kernel says ENOSPC)."""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from flowbus.broker.store import Store

FULL = "database or disk is full"
"""What SQLite says when the disk cannot take a write (SQLITE_FULL)."""

_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")
_CODES = {FULL: 13, "disk I/O error": 10, "database is locked": 5}  # (SQLITE_FULL, _IOERR, _BUSY)


class FullDisk:
    """Stands in for a store's connection: while ``full``, each writing statement (or, with
    ``at_commit``, the ``COMMIT`` after it) raises ``sqlite3.OperationalError(error)``, as
    SQLite does when the disk is full; everything else goes to the real connection."""

    def __init__(self, db: sqlite3.Connection, *, at_commit: bool = False, error: str = FULL) -> None:
        self.db = db
        self.full = False
        self.at_commit = at_commit
        self.error = error
        self.failed = 0  # writes refused so far

    @classmethod
    def under(cls, store: Store, **kw: Any) -> FullDisk:
        """Put one under ``store`` (full at once)."""
        disk = cls(store._db, **kw)
        disk.full = True
        store._db = disk  # type: ignore[assignment]
        return disk

    def _check(self, sql: str) -> None:
        if not self.full:
            return
        head = sql.lstrip().split(None, 1)[0].upper()
        if (head == "COMMIT") if self.at_commit else (head in _WRITES):
            self.failed += 1
            error = sqlite3.OperationalError(self.error)
            error.sqlite_errorcode = _CODES.get(self.error, 1)  # type: ignore[attr-defined]
            raise error

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        self._check(sql)
        return self.db.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Any]) -> sqlite3.Cursor:
        self._check(sql)
        return self.db.executemany(sql, rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


@contextmanager
def tiny_disk(where: Path, size: str = "2m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``where`` (made), unmounted at the end; the test is
    skipped, saying why, if this process cannot mount one (it needs root)."""
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs root to mount a tmpfs (the faked full disk is tested without)")
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs on {where}: {done.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)  # (busy: detached)


def fill(where: Path) -> Path:
    """A file in ``where`` that takes every free byte of its file system (the kernel said
    ENOSPC); delete it to give the space back."""
    filler = where / "filler"
    chunk = b"\0" * (1 << 16)
    with filler.open("wb", buffering=0) as f:
        for size in (1 << 16, 1 << 12, 1 << 9):
            try:
                while True:
                    f.write(chunk[:size])
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
    return filler
