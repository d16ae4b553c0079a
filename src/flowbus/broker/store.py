"""A broker's durable state in SQLite: subscriptions, per-subscriber queues, publisher sequences.

How it works: one SQLite database per broker, in WAL mode (readers never block the writer;
``synchronous=NORMAL`` is durable across a process crash, which is what a broker's
``kill -9`` is). Three tables:

* ``subscriptions(sub_id, client, space, filter, durable, collapse)``: what a restarted broker
  serves again. A non-durable subscription is dropped with its client's session
  (:meth:`Store.drop_client`).
* ``queue(seq, sub_id, event_id, payload)``: the events accepted for a subscriber and not
  yet acknowledged, in arrival order (``seq`` is the table's own increasing key). A
  subscriber acknowledges a prefix (:meth:`Store.ack`); ``(sub_id, event_id)`` is unique,
  so an event queued twice (a retransmission) is stored once. A backlog handed over by a
  subscription's former broker goes *before* what was queued here meanwhile, into a block
  of free positions made once (:meth:`Store.prepend`).
* ``publishers(publisher, last_seq)``: the highest sequence number accepted from each
  publisher. :meth:`Store.accept` refuses a sequence number at or below it: a publisher
  that re-sends after a reconnect does not publish twice.
* ``flows(name, record)``: the flows deployed on the network as this broker last knew them
  (:class:`~flowbus.routing.flows.DeployRecord`, msgpack), so that a restarted broker knows
  them before its tree neighbours sync it.
* ``meta(key, value)``: the ring member this broker is (its id and its ring neighbours'
  addresses, :meth:`Store.membership`): a broker restarted on its data comes back as a new
  member and tells them the old one is gone (:mod:`flowbus.broker.handover`); and the
  store's own name (:attr:`Store.identity`), under which its queue positions are one sequence.

**Syncing** (``sync``): ``"normal"`` (SQLite's ``synchronous=NORMAL`` in WAL mode) is
durable across a process crash, which is what a broker's ``kill -9`` is, but a power loss
(or a kernel's crash) may take the last transactions back; ``"full"`` syncs each
transaction's commit to the disk (``synchronous=FULL``), so nothing committed is lost then.

Every change is one transaction. A refused change (a duplicate subscription id, an unknown
one, a bad value) raises :class:`StoreError` and leaves the database as it was.

A write the disk cannot take (SQLite's "database or disk is full", or a "disk I/O error")
raises :class:`~flowbus.errors.StoreFull`, naming the store and the write; its transaction
is rolled back, so the database is as it was. :attr:`Store.full` is that failure until a
write commits again. Reads go on as usual.
"""

from __future__ import annotations

import ast
import sqlite3
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from flowbus.errors import StoreError, StoreFull

__all__ = ["QueuedEvent", "Store", "StoreError", "StoreFull", "SubscriptionRow"]

SCHEMA_VERSION = 4

WAL_KEPT = 8 << 20
"""Bytes of write-ahead log kept on disk once a checkpoint has emptied it: a large write
(a subscription's queue taken over) does not keep its log's size taken from a small disk."""

BACKLOG_GAP = 1 << 32
"""Queue positions kept free before what a subscription held, for a backlog taken in parts
(:meth:`Store.prepend`)."""

SYNC = ("full", "normal")
"""The store's syncing settings (see the module note)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS subscriptions (
    sub_id TEXT PRIMARY KEY,
    client TEXT NOT NULL,
    space TEXT NOT NULL,
    filter TEXT NOT NULL,
    durable INTEGER NOT NULL,
    collapse TEXT
);
CREATE TABLE IF NOT EXISTS queue (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    sub_id TEXT NOT NULL REFERENCES subscriptions(sub_id) ON DELETE CASCADE,
    event_id TEXT NOT NULL,
    payload BLOB NOT NULL,
    UNIQUE (sub_id, event_id)
);
CREATE TABLE IF NOT EXISTS publishers (
    publisher TEXT PRIMARY KEY,
    last_seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS flows (
    name TEXT PRIMARY KEY,
    record BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

_FULL = (13, 10)  # SQLITE_FULL, SQLITE_IOERR (the primary codes: an extended one's low byte)
_FULL_TEXT = ("database or disk is full", "disk i/o error")


def _is_full(e: sqlite3.OperationalError) -> bool:
    """Whether ``e`` says the disk could not take a write (not a busy lock, a bad statement...)."""
    code = getattr(e, "sqlite_errorcode", None)
    if isinstance(code, int) and (code & 0xFF) in _FULL:
        return True
    text = str(e).lower()
    return any(t in text for t in _FULL_TEXT)


@dataclass(frozen=True, slots=True)
class SubscriptionRow:
    sub_id: str
    client: str
    space: str
    filter: str
    durable: bool
    collapse: str | None = None


@dataclass(frozen=True, slots=True)
class QueuedEvent:
    seq: int
    event_id: str
    payload: bytes


class Store:
    """The durable state of one broker (see the module note)."""

    def __init__(self, path: Path | str, *, sync: str = "full") -> None:
        if sync not in SYNC:
            raise StoreError(f"sync: one of {', '.join(SYNC)}, got {sync!r}")
        self.path = str(path)
        self.full: StoreFull | None = None  # the last write's failure, until a write commits again
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA foreign_keys = ON")
        if self.path != ":memory:":
            mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                raise StoreError(f"{self.path}: cannot use write-ahead logging (journal mode {mode})")
            self._db.execute(f"PRAGMA synchronous = {sync.upper()}")
            self._db.execute(f"PRAGMA journal_size_limit = {WAL_KEPT}")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, 1, 2, 3, SCHEMA_VERSION):
            raise StoreError(f"{self.path}: schema version {version}, this flowbus reads {SCHEMA_VERSION}")
        if version == 0:  # a new database (executescript runs in a transaction of its own)
            self._db.executescript(f"BEGIN; {_SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")
        else:  # version 2 added the collapse rule set of a subscription, 3 the flows, 4 meta
            alter = "ALTER TABLE subscriptions ADD COLUMN collapse TEXT;" if version == 1 else ""
            self._db.executescript(
                f"BEGIN; {alter} {_SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            )

    def close(self) -> None:
        self._db.close()

    @property
    def journal_mode(self) -> str:
        return str(self._db.execute("PRAGMA journal_mode").fetchone()[0])

    @contextmanager
    def _tx(self, operation: str) -> Iterator[sqlite3.Connection]:
        """One transaction, rolled back if anything fails in it (its commit too); a write the
        disk cannot take is a :class:`StoreFull` naming ``operation``."""
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                self._rollback()
                raise
            db.execute("COMMIT")
        except sqlite3.OperationalError as e:
            self._rollback()
            if _is_full(e):
                full = self.full = StoreFull(self.path, operation, str(e))
                raise full from e
            raise
        self.full = None

    def _rollback(self) -> None:
        """End the transaction under way, if SQLite has not ended it already (it rolls back by
        itself after some errors, a full disk among them)."""
        if self._db.in_transaction:
            with suppress(sqlite3.Error):  # (nothing more can be done here; the next BEGIN tries again)
                self._db.execute("ROLLBACK")

    # -- the ring member this broker is

    def membership(self) -> tuple[int, tuple[str, ...]] | None:
        """The ring id this broker had and its ring neighbours' addresses (``host:port``),
        if it was a member when it stopped."""
        rows = dict(self._db.execute("SELECT key, value FROM meta WHERE key IN ('ring_id', 'window')"))
        if "ring_id" not in rows:
            return None
        window = tuple(a for a in rows.get("window", "").split(",") if a)
        return int(rows["ring_id"]), window

    def save_membership(self, ring_id: int, window: tuple[str, ...]) -> None:
        with self._tx("save the ring membership") as db:
            db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                [("ring_id", str(ring_id)), ("window", ",".join(window))],
            )

    @cached_property
    def identity(self) -> str:
        """This store's own name, made once and kept on its disk: the queue positions it gives
        are one sequence under it (a reader of positions knows them from another store's)."""
        row = self._db.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()
        if row is not None:
            return str(row[0])
        made = uuid.uuid4().hex
        with self._tx("name the store") as db:
            db.execute("INSERT OR IGNORE INTO meta VALUES ('store_id', ?)", (made,))
            return str(db.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()[0])

    def forget_membership(self) -> None:
        with self._tx("forget the ring membership") as db:
            db.execute("DELETE FROM meta WHERE key IN ('ring_id', 'window')")

    # -- subscriptions

    def add_subscription(
        self, sub_id: str, *, client: str, space: str, filter: str, durable: bool, collapse: str | None = None
    ) -> None:
        self.add_subscriptions([(sub_id, client, space, filter, durable, collapse)])

    def add_subscriptions(self, rows: Sequence[tuple[str, str, str, str, bool, str | None]]) -> None:
        """:meth:`add_subscription` for each of ``rows`` ``(sub_id, client, space, filter,
        durable, collapse)``, in one transaction: all or none."""
        for row in rows:
            for name, value in zip(("sub_id", "client", "space", "filter"), row, strict=False):
                if not isinstance(value, str) or not value:
                    raise StoreError(f"add_subscription: {name} must be a non-empty string, got {value!r}")
        what = f"subscription {rows[0][0]!r}" if len(rows) == 1 else f"{len(rows)} subscriptions"
        try:
            with self._tx(f"add {what}") as db:
                db.executemany(
                    "INSERT INTO subscriptions VALUES (?, ?, ?, ?, ?, ?)",
                    [(i, c, sp, f, int(d), co) for i, c, sp, f, d, co in rows],
                )
        except sqlite3.IntegrityError:
            taken = "exists already" if len(rows) == 1 else "one of them exists already"
            raise StoreError(f"{what} {taken}") from None

    def remove_subscription(self, sub_id: str) -> None:
        """Forget a subscription and its queue."""
        with self._tx(f"remove subscription {sub_id!r}") as db:
            if db.execute("DELETE FROM subscriptions WHERE sub_id = ?", (sub_id,)).rowcount == 0:
                raise StoreError(f"no subscription {sub_id!r}")
            db.execute("DELETE FROM meta WHERE key = ?", (f"backlog:{sub_id}",))

    def drop_client(self, client: str) -> list[str]:
        """A client's session ended: drop its non-durable subscriptions; their ids."""
        with self._tx(f"drop the subscriptions of client {client!r}") as db:
            rows = db.execute(
                "SELECT sub_id FROM subscriptions WHERE client = ? AND durable = 0 ORDER BY sub_id", (client,)
            ).fetchall()
            db.execute("DELETE FROM subscriptions WHERE client = ? AND durable = 0", (client,))
        return [r[0] for r in rows]

    def subscriptions(self) -> list[SubscriptionRow]:
        rows = self._db.execute(
            "SELECT sub_id, client, space, filter, durable, collapse FROM subscriptions ORDER BY sub_id"
        )
        return [SubscriptionRow(a, b, c, d, bool(e), f) for a, b, c, d, e, f in rows]

    # -- queues

    def enqueue(self, sub_id: str, event_id: str, payload: bytes) -> bool:
        """Queue an event for a subscriber; False if it was queued already."""
        try:
            with self._tx(f"queue an event for subscription {sub_id!r}") as db:
                cur = db.execute(
                    "INSERT OR IGNORE INTO queue (sub_id, event_id, payload) VALUES (?, ?, ?)",
                    (sub_id, event_id, bytes(payload)),
                )
                return cur.rowcount == 1
        except sqlite3.IntegrityError:
            raise StoreError(f"no subscription {sub_id!r} to queue for") from None

    def enqueue_many(self, items: list[tuple[str, str, bytes]]) -> int:
        """Queue many ``(sub_id, event_id, payload)`` in one transaction; how many were new."""
        try:
            with self._tx(f"queue {len(items)} event{'' if len(items) == 1 else 's'}") as db:
                before = db.total_changes
                db.executemany(
                    "INSERT OR IGNORE INTO queue (sub_id, event_id, payload) VALUES (?, ?, ?)", items
                )
                return int(db.total_changes - before)
        except sqlite3.IntegrityError:
            raise StoreError("a queued event names no known subscription") from None

    def prepend(self, sub_id: str, rows: list[tuple[str, bytes]], *, last: bool) -> int:
        """Queue ``(event_id, payload)`` rows of ``sub_id`` *before* what its queue held when
        the first of them came: an older part of it, handed over by its former broker part by
        part, oldest first (``last``: the last part), nothing of it read yet.

        The first part moves what the queue held past a block of :data:`BACKLOG_GAP` free
        positions, once; each part then goes into the block, after the parts before it (a
        part costs its own rows, whatever the queue holds). Where the next part goes is
        kept in ``meta`` in the same transaction, so a store reopened halfway goes on where
        it was; the last part forgets it. A held event that the backlog has too takes its
        place in the backlog. How many rows the queue gained."""
        key = f"backlog:{sub_id}"
        with self._tx(f"take over {len(rows)} queued events of {sub_id!r}") as db:
            mark = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
            if mark is None:
                at, end = self._make_gap(db, sub_id)
            else:
                at, end = (int(x) for x in str(mark[0]).split())
            if at + len(rows) > end:
                raise StoreError(f"a backlog of {sub_id!r} over {BACKLOG_GAP} events cannot be taken")
            before = db.total_changes
            db.executemany(
                "DELETE FROM queue WHERE sub_id = ? AND event_id = ? AND seq >= ?",
                [(sub_id, e, end) for e, _ in rows],
            )
            dropped = db.total_changes - before
            db.executemany(
                "INSERT OR IGNORE INTO queue (seq, sub_id, event_id, payload) VALUES (?, ?, ?, ?)",
                [(at + i, sub_id, e, bytes(b)) for i, (e, b) in enumerate(rows)],
            )
            gained = db.total_changes - before - 2 * dropped
            if last:
                db.execute("DELETE FROM meta WHERE key = ?", (key,))
            else:
                db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, f"{at + len(rows)} {end}"))
            return int(gained)

    @staticmethod
    def _make_gap(db: sqlite3.Connection, sub_id: str) -> tuple[int, int]:
        """Free positions for ``sub_id``'s backlog: what its queue holds moved past a block
        of :data:`BACKLOG_GAP` positions above every position given so far (new rows come
        after it). The block's first position and its end."""
        row = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'queue'").fetchone()
        at = (int(row[0]) if row else 0) + 1
        end = at + BACKLOG_GAP
        held = db.execute(
            "SELECT event_id, payload FROM queue WHERE sub_id = ? ORDER BY seq", (sub_id,)
        ).fetchall()
        db.execute("DELETE FROM queue WHERE sub_id = ?", (sub_id,))
        db.executemany(
            "INSERT INTO queue (seq, sub_id, event_id, payload) VALUES (?, ?, ?, ?)",
            [(end + i, sub_id, e, p) for i, (e, p) in enumerate(held)],
        )
        top = end + max(len(held), 1) - 1  # (the next new row comes after the block and them)
        if row is None:
            db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('queue', ?)", (top,))
        else:
            db.execute("UPDATE sqlite_sequence SET seq = MAX(seq, ?) WHERE name = 'queue'", (top,))
        return at, end

    def pending(self, sub_id: str, *, limit: int = 1000, after: int = 0) -> list[QueuedEvent]:
        """The oldest ``limit`` unacknowledged events of a subscriber after queue position
        ``after``, in order."""
        rows = self._db.execute(
            "SELECT seq, event_id, payload FROM queue WHERE sub_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (sub_id, after, limit),
        )
        return [QueuedEvent(s, e, bytes(p)) for s, e, p in rows]

    def ack(self, sub_id: str, upto: int) -> int:
        """Acknowledge every queued event of ``sub_id`` with ``seq <= upto``; how many."""
        with self._tx(f"acknowledge the queue of subscription {sub_id!r} up to {upto}") as db:
            return int(db.execute("DELETE FROM queue WHERE sub_id = ? AND seq <= ?", (sub_id, upto)).rowcount)

    def depth(self, sub_id: str) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM queue WHERE sub_id = ?", (sub_id,)).fetchone()[0])

    def between(self, sub_id: str, after: int, upto: int, limit: int) -> list[QueuedEvent]:
        """The first ``limit`` queued events of ``sub_id`` at positions in ``(after, upto]``."""
        rows = self._db.execute(
            "SELECT seq, event_id, payload FROM queue WHERE sub_id = ? AND seq > ? AND seq <= ? "
            "ORDER BY seq LIMIT ?",
            (sub_id, after, upto, limit),
        )
        return [QueuedEvent(s, e, bytes(p)) for s, e, p in rows]

    def marks(self, sub_id: str, after: int, upto: int) -> dict[str, int]:
        """Per publisher, the highest sequence number of ``sub_id``'s queued events at
        positions in ``(after, upto]`` (their ids only are read)."""
        out: dict[str, int] = {}
        rows = self._db.execute(
            "SELECT event_id FROM queue WHERE sub_id = ? AND seq > ? AND seq <= ?", (sub_id, after, upto)
        )
        for (text,) in rows:
            eid = ast.literal_eval(text)  # (the repr of an event id, (publisher, pseq) as a rule)
            if isinstance(eid, tuple) and len(eid) == 2 and isinstance(eid[1], int):
                publisher = str(eid[0])
                if eid[1] > out.get(publisher, -1):
                    out[publisher] = eid[1]
        return out

    def top(self, sub_id: str) -> int:
        """The highest position queued for ``sub_id`` (0: none)."""
        row = self._db.execute("SELECT MAX(seq) FROM queue WHERE sub_id = ?", (sub_id,)).fetchone()
        return int(row[0] or 0)

    # -- publishers

    def accept(self, publisher: str, seq: int) -> bool:
        """Record a publish; False (and nothing recorded) if ``seq`` was accepted before."""
        if type(seq) is not int or seq < 0:
            raise StoreError(f"a publisher sequence number is an int >= 0, got {seq!r}")
        with self._tx(f"record publisher {publisher!r} at {seq}") as db:
            row = db.execute("SELECT last_seq FROM publishers WHERE publisher = ?", (publisher,)).fetchone()
            if row is not None and seq <= row[0]:
                return False
            db.execute("INSERT OR REPLACE INTO publishers VALUES (?, ?)", (publisher, seq))
            return True

    def last_seq(self, publisher: str) -> int | None:
        row = self._db.execute("SELECT last_seq FROM publishers WHERE publisher = ?", (publisher,)).fetchone()
        return None if row is None else int(row[0])

    # -- flows

    def save_flows(self, records: dict[str, bytes]) -> None:
        """The deployed flows are these (name -> encoded record): the table replaced."""
        with self._tx("save the deployed flows") as db:
            db.execute("DELETE FROM flows")
            db.executemany("INSERT INTO flows (name, record) VALUES (?, ?)", sorted(records.items()))

    def flows(self) -> list[bytes]:
        return [row[0] for row in self._db.execute("SELECT record FROM flows ORDER BY name")]
