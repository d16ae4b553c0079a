"""Stand-ins for the tests of a broker's parts without sockets: a routing core that records
the local calls made on it, client sessions that keep what they were given, a writer that
keeps the bytes written."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

from flowbus.broker.sessions import Session
from flowbus.core import Effect
from flowbus.filters import Filter


class FakeCore:
    """A routing core that serves every call at once and records it in ``calls``."""

    def __init__(self) -> None:
        self.subs: set[Hashable] = set()
        self.calls: list[tuple[Any, ...]] = []
        self.metas: dict[Hashable, Any] = {}
        self.version = 0  # the backup version a mark_backlog gives
        self.confirmed = 0  # the backup version every holder has
        self.awaits: dict[Hashable, int] = {}  # sub -> the broker whose backlog it awaits
        self.consumption: dict[Hashable, dict[str, int]] = {}  # sub -> how far its client consumed

    def meta_of(self, sub_id: Hashable) -> Any:
        return self.metas.get(sub_id)

    def subscribe(self, sub_id: Hashable, filt: Filter, *, meta: Any = None) -> list[Effect]:
        self.subs.add(sub_id)
        self.metas[sub_id] = meta
        self.calls.append(("subscribe", sub_id, filt.to_text()))
        return []

    def unsubscribe(self, sub_id: Hashable) -> list[Effect]:
        self.subs.discard(sub_id)
        self.calls.append(("unsubscribe", sub_id))
        return []

    def advertise(self, adv_id: Hashable, filt: Filter) -> list[Effect]:
        self.calls.append(("advertise", adv_id, filt.to_text()))
        return []

    def unadvertise(self, adv_id: Hashable) -> list[Effect]:
        self.calls.append(("unadvertise", adv_id))
        return []

    def publish_batch(self, items: Sequence[tuple[Hashable, Mapping[str, Any]]]) -> list[Effect]:
        self.calls.append(("publish", [(eid, dict(fields)) for eid, fields in items]))
        return []

    def settle_many(self, counts: Iterable[tuple[Hashable, int]]) -> list[Effect]:
        self.calls.append(("settle", list(counts)))
        return []

    def refuse_local(self, items: Iterable[tuple[Hashable, str]]) -> list[Effect]:
        self.calls.append(("refuse", list(items)))
        return []

    def mark_backlog(self, sub_id: Hashable, on: bool) -> tuple[int, list[Effect]]:
        self.calls.append(("backlog", sub_id, on))
        return self.version, []

    def backups_confirmed(self) -> int:
        return self.confirmed

    def awaited(self, sub_id: Hashable) -> int | None:
        return self.awaits.get(sub_id)

    def consume(
        self, sub_id: Hashable, upto: Mapping[str, int], *, now: bool = True
    ) -> tuple[int, list[Effect]]:
        self.calls.append(("consume", sub_id, dict(upto)))
        self.consumption.setdefault(sub_id, {}).update(upto)
        return self.version, []

    def consumed(self, sub_id: Hashable) -> dict[str, int]:
        return dict(self.consumption.get(sub_id, {}))

    def backlog_done(self, sub_id: Hashable, home: int) -> list[Effect]:
        self.calls.append(("backlog_done", sub_id, home))
        self.awaits.pop(sub_id, None)
        return []

    def called(self, name: str) -> list[tuple[Any, ...]]:
        """The arguments of every call of ``name``, in order."""
        return [c[1:] for c in self.calls if c[0] == name]


def apply(effects: Sequence[Effect]) -> None:
    """The runtime's ``apply``: the fake core returns no effects."""
    assert not effects


class Connection(Session):
    """A client session whose deliveries are read from it, not written (no event loop)."""

    def __init__(self, client: str = "c") -> None:
        super().__init__(client, Writer())  # type: ignore[arg-type]

    def _due(self) -> None:
        pass

    @property
    def rows(self) -> list[tuple[list[str], int, Any, dict[str, Any]]]:
        """(sub ids, delivery number, event id, event) of each row given, in order."""
        return [(list(subs), cseq, (who, n), event) for subs, cseq, who, n, event in self._events]


class Recorder:
    """A client session that records what the broker gave it."""

    def __init__(self, client: str = "c") -> None:
        self.client = client
        self.identity: str | None = None
        self.closed = False
        self.sent: list[Any] = []
        self.acks: list[int] = []

    def send(self, msg: Any) -> None:
        self.sent.append(msg)

    def pub_ack(self, pseq: int) -> None:
        self.acks.append(pseq)


class Writer:
    """An ``asyncio.StreamWriter`` that keeps what is written."""

    def __init__(self, extra: dict[str, Any] | None = None) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.extra = extra or {}  # what get_extra_info gives (a TLS peer's "peercert")

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.extra.get(name, default)

    def close(self) -> None:
        self.closed = True
