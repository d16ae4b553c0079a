"""Flows deployed on the broker network: the registry, the edge transforms and the state
partitions of a :class:`~flowbus.routing.ring_broker.RingBroker` (sans-IO).

How it works (what a flow *is* on the bus, its spaces, paths and groups:
:mod:`flowbus.flow.deploy`):

* **The registry** is replicated by flooding on the broker tree, the way subscriptions
  travel: a broker asked to deploy a flow makes a :class:`DeployRecord` (the document, its
  version, the *owners* -- the ring ids of the live brokers it knows, itself included -- and a
  deploy id), installs it and floods it in a :class:`FlowSync`; a broker that learns something
  new from a ``FlowSync`` forwards it to its other tree neighbours. A new tree neighbour is sent
  the whole registry (and the deploy ids withdrawn), so a joining or restarted broker gets every
  flow. Two deploys of one name with different versions or ids: the smaller
  ``(version, deploy id)`` wins at every broker, whatever the order they arrive in.
* **Ownership.** The owners split the 32-bit hash space of each stateful group's keys into
  equal slices, in the order of their ring ids (:func:`ranges_of`).
  An owner subscribes to its range (:meth:`Flows.partitions_to_make`) when it first installs
  a *fresh* record (the deploy's own flood, not a later sync), as a normal subscription filed
  in the ring state: backed up on its ring neighbours and taken over with the rest of its
  state when it dies. A broker that joins later owns nothing of the flows already deployed.
* **Rows** live in the ring state too, under ``("frow", flow, deploy id, partition, state,
  key) -> (version, row)``, so a takeover carries them; so does the partition's *fold log*:
  the id of each event it folded, with what that fold published, one entry per step
  (``("fseen", partition, n)``, one flat tuple: :func:`log_entry`; the last entries holding
  :data:`SEEN` ids or more): the broker that takes a partition over folds no event twice and
  publishes again what the dead owner may not have sent (its id de-duplicates it). A step's
  entry is one container on the wire, whatever its folds: a holder decodes a backup of a
  busy step's few hundred folds with a few hundred Python calls, not thousands.
* **Derived events** (what the expand arcs of a changed row give) are published by the
  partition's holder into the expand's target space with deterministic ids
  (:func:`output_id`), carrying the partition, the key and the row's version in hidden
  fields, so that a late subscriber can start from a snapshot. Only those some path or feed
  selects are published (:meth:`~flowbus.flow.deploy.Deployment.wanted`), and of those paths
  and feeds (the space's *readers*) only the ones the network's subscriptions need now
  (:class:`DerivedGate`): each conjunction of a filter in the routing tables that may match the space
  is covered by an exact reader, the most specific picked (none: every reader counts). With
  only ``alarms`` subscribed, ``drops`` carries the drops over 20, not every fall. When no
  neighbour has a subscription (a broker alone), the holder routes them at once, through its
  own index of its local subscriptions (:class:`~flowbus.routing.flows_index.OwnIndex`: no
  matcher pass); else with its next publish, or after ``DERIVED_WAIT`` (5 ms) without one: a
  step of a few events then costs one pass of the matcher, not two
  (:meth:`~flowbus.routing.ring_flows.FlowSide.effects`); a big step's (``DERIVED_NOW``, 128
  or more) go at once, in a pass of their own.
* **Snapshots.** A subscription whose paths start at derived spaces asks, by a flood on the
  tree (:class:`SnapshotAsk`), every partition of the groups behind them for its rows; each
  holder answers directly (:class:`SnapshotRows`). Until a partition's rows are in, the
  subscription holds that partition's live events; then it delivers, per key, the shortest
  sequence from the initial row to the snapshot's (A*), and of the held events those of a
  later version.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flowbus import wire
from flowbus.errors import UserError
from flowbus.filters import Filter
from flowbus.filters.ast import Conjunction, Op, Predicate
from flowbus.filters.covering import covers, overlaps
from flowbus.flow.collapse import Key, Row
from flowbus.flow.deploy import HASH_SPACE, Deployment, FlowSubscription, Group, Reader, count_arcs
from flowbus.meta import EVENT_ID, KEY, PARTITION, ROW_VERSION, SPACE, STATE, UNROUTED
from flowbus.routing.ring_keys import ROW, RowKey, log_key, record, row_key

__all__ = [
    "SEEN",
    "DeployRecord",
    "FlowSync",
    "Flows",
    "SnapshotAsk",
    "SnapshotRows",
    "log_entry",
    "log_folds",
    "output_id",
    "ranges_of",
]

ROWS_KEPT = 100_000
"""How many keys a partition keeps the ring state keys (and repr) of, for its folds."""
SEEN = 20_000
"""How many folded event ids (and what their folds published) a partition keeps at least."""

PART = "part"
"""The first element of a partition subscription's id: ``("part", flow, deploy id, group, owner)``."""


@wire.message("flows.record")
@dataclass(frozen=True, slots=True)
class DeployRecord:
    """A deployed flow: its document, version, owners (ring ids) and deploy id."""

    name: str
    version: str
    text: str
    owners: tuple[int, ...]
    deploy_id: tuple[int, int]  # (the deploying broker's ring id, a number it chose)

    @property
    def rank(self) -> tuple[str, tuple[int, int]]:
        return (self.version, self.deploy_id)


@wire.message("flows.sync")
@dataclass(frozen=True, slots=True)
class FlowSync:
    """Deployed flows and withdrawn deploy ids, flooded on the broker tree; ``fresh``: a new
    deploy (its owners make their partitions), not a sync of a new tree link."""

    deployed: tuple[DeployRecord, ...]
    withdrawn: tuple[tuple[int, int], ...]
    fresh: bool


@wire.message("flows.snapshot_ask")
@dataclass(frozen=True, slots=True)
class SnapshotAsk:
    """Subscription ``sub`` at broker ``reply_to`` asks for the rows of ``groups`` of a flow."""

    sub: Any
    reply_to: int
    flow: str
    deploy_id: tuple[int, int]
    groups: tuple[str, ...]


@wire.message("flows.snapshot_rows")
@dataclass(frozen=True, slots=True)
class SnapshotRows:
    """The rows of one partition of ``group``: ``(state, key, version, row)`` each."""

    sub: Any
    group: str
    owner: int
    rows: tuple[tuple[str, Any, int, Any], ...]


def ranges_of(owners: Sequence[int], owner: int) -> tuple[tuple[int, int], ...]:
    """The hash range ``lo < h <= hi`` of ``owner`` among ``owners`` (sorted ring ids): the
    ``i``-th owner holds the ``i``-th of ``len(owners)`` equal slices of the hash space (ring
    ids are not spread evenly in a small ring; the slices are)."""
    i, n = owners.index(owner), len(owners)
    return ((i * HASH_SPACE // n - 1, (i + 1) * HASH_SPACE // n - 1),)


def output_id(flow: str, space: str, key: Key, version: int, i: int) -> tuple[str, int]:
    """The id of the ``i``-th event a row's change to ``version`` publishes into ``space``."""
    return (f"{flow}/{space}/{key!r}", version * 1024 + i)


_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})
_ID = -1  # (before an id written as it is: one that is no tuple of scalars)


def log_entry(folds: Sequence[tuple[Any, tuple[Any, ...]]]) -> tuple[Any, ...]:
    """A fold log entry: ``folds`` (``(event id, what the fold published)``, see
    :meth:`Flows.fold`) as one flat tuple, one container on the wire: per fold its event id
    (a tuple of scalars as its length and its items, any other id as -1 and itself) and how
    many events it published, then per event its space, state, key, version, output number,
    the count of its fields and those, name after value."""
    flat: list[Any] = []
    for eid, kept in folds:
        if type(eid) is tuple and _SCALARS.issuperset(map(type, eid)):
            flat.append(len(eid))
            flat += eid
        else:
            flat += (_ID, eid)
        flat.append(len(kept))
        for space, state, rkey, version, j, fields in kept:
            flat += (space, state, rkey, version, j, len(fields))
            for pair in fields:
                flat += pair
    return tuple(flat)


def log_folds(entry: tuple[Any, ...]) -> list[tuple[Any, tuple[Any, ...]]]:
    """The folds of a log entry (:func:`log_entry` read back)."""
    folds: list[tuple[Any, tuple[Any, ...]]] = []
    i = 0
    while i < len(entry):
        size = entry[i]
        if size == _ID:
            eid, i = entry[i + 1], i + 2
        else:
            eid, i = entry[i + 1 : i + 1 + size], i + 1 + size
        n = entry[i]
        i += 1
        kept = []
        for _ in range(n):
            space, state, rkey, version, j, m = entry[i : i + 6]
            fields = entry[i + 6 : i + 6 + 2 * m]
            kept.append((space, state, rkey, version, j, tuple(zip(fields[::2], fields[1::2], strict=True))))
            i += 6 + 2 * m
        folds.append((eid, tuple(kept)))
    return folds


def _output(
    flow: str, owner: int, space: str, state: str, key: str, version: int, i: int, fields: tuple[Any, ...]
) -> tuple[tuple[str, int], dict[str, Any]]:
    """The id and bus event of a fold's ``i``-th output, from what the ring state keeps of it
    (``key`` as its repr: the hidden fields and the id need no more)."""
    event = dict(fields)
    event.update({SPACE: space, PARTITION: owner, KEY: key, ROW_VERSION: version, STATE: state})
    return (f"{flow}/{space}/{key}", version * 1024 + i), event


@dataclass
class FlowPartition:
    """A partition served here (own, or taken over)."""

    sub_id: tuple[Any, ...]
    deployment: Deployment
    group: Group
    owner: int
    ranges: tuple[tuple[int, int], ...]
    seen: dict[Any, int] = field(default_factory=dict)  # event id folded -> its log entry's number
    logs: deque[tuple[int, list[Any]]] = field(default_factory=deque)  # entries in the state: (n, ids)
    log: list[tuple[Any, tuple[Any, ...]]] = field(default_factory=list)  # this step's folds, not logged
    next_log: int = 0
    buffer: list[tuple[Mapping[str, Any], Any]] | None = None  # taken over: (event, custody key) gathered
    _by_space: dict[Any, tuple[Any, ...]] = field(default_factory=dict)  # space -> its feeds
    _rows: dict[Any, tuple[list[Any], str]] = field(default_factory=dict)  # key -> row keys, repr

    def folded(self, eid: Any, kept: tuple[Any, ...]) -> None:
        """Event ``eid`` was folded here, publishing what ``kept`` records (see :meth:`Flows.fold`):
        in the log's next entry."""
        self.seen[eid] = self.next_log
        self.log.append((eid, kept))

    def close_log(self) -> tuple[tuple[Any, ...], tuple[Any, ...], list[tuple[Any, ...]]]:
        """This step's folds as the log's next entry: its ring state key and value, and the keys
        of the oldest entries no longer needed (the others hold :data:`SEEN` ids or more)."""
        n, folds = self.next_log, self.log
        self.next_log, self.log = n + 1, []
        self.logs.append((n, [eid for eid, _ in folds]))
        return log_key(self.sub_id, n), log_entry(folds), self._trim()

    def adopt_log(self, n: int, entry: tuple[Any, ...]) -> list[tuple[Any, tuple[Any, ...]]]:
        """A log entry of the partition's dead holder (taken over): its folds, now known here."""
        folds = log_folds(entry)
        self.logs.append((n, [eid for eid, _ in folds]))
        for eid, _ in folds:
            self.seen[eid] = n
        self.next_log = max(self.next_log, n + 1)
        return folds

    def _trim(self) -> list[tuple[Any, ...]]:
        logs, seen = self.logs, self.seen
        gone: list[tuple[Any, ...]] = []
        while len(logs) > 1 and len(seen) - len(logs[0][1]) >= SEEN:
            m, ids = logs.popleft()
            for eid in ids:
                if seen.get(eid) == m:
                    del seen[eid]
            gone.append(log_key(self.sub_id, m))
        return gone

    def rows_of(self, key: Key) -> tuple[list[Any], str]:
        """The ring state keys of ``key``'s rows (one per fold of the group) and its repr."""
        got = self._rows.get(key)
        if got is None:
            if len(self._rows) >= ROWS_KEPT:
                self._rows.clear()
            _, name, did, _, _ = self.sub_id
            rows = [row_key(name, did, self.owner, f.state, key) for f in self.group.folds]
            got = self._rows[key] = (rows, repr(key))
        return got

    def feeds_of(self, event: Mapping[str, Any]) -> list[Any]:
        """The feeds of the group that bring ``event`` to this partition (its key's hash in range)."""
        space = event.get(SPACE)
        feeds = self._by_space.get(space)
        if feeds is None:
            feeds = self._by_space[space] = tuple(f for f in self.group.feeds if f.space == space)
        out = []
        for feed in feeds:
            h = event.get(feed.field)
            if h is not None:
                for lo, hi in self.ranges:
                    if lo < h <= hi:
                        out.append(feed)
                        break
        return out


class DerivedGate:
    """Which readers of each derived space the network's subscriptions need now (see
    "Derived events" in the module note): an owner publishes a derived event only if one of
    them selects it."""

    def __init__(self) -> None:
        self.version: Any = None  # the routing tables' version the choices below are for
        self._filters: Callable[[], Iterable[Filter]] = tuple
        self._now: dict[tuple[str, str], Sequence[Reader]] = {}  # (flow version, space) -> readers
        self._picks: dict[tuple[str, str], dict[Filter, frozenset[int] | None]] = {}

    def update(self, version: Any, filters: Callable[[], Iterable[Filter]]) -> None:
        """The routing tables are at ``version``; ``filters`` gives every filter in them."""
        if version != self.version:
            self.version = version
            self._filters = filters
            self._now.clear()

    def readers(self, d: Deployment, space: str) -> Sequence[Reader]:
        """The readers of ``space`` some filter of the tables needs (all of them when a
        filter is covered by none that is exact: the gate then lets the readers decide)."""
        got = self._now.get((d.version, space))
        if got is None:
            got = self._now[(d.version, space)] = self._choose(d, space)
        return got

    def _choose(self, d: Deployment, space: str) -> Sequence[Reader]:
        readers = d.readers.get(space, ())
        before = self._picks.get((d.version, space), {})
        picks: dict[Filter, frozenset[int] | None] = {}
        for f in self._filters():
            if f not in picks:
                picks[f] = before[f] if f in before else _picks(space, f, readers)
        self._picks[(d.version, space)] = picks  # (only the filters there are now)
        chosen: set[int] = set()
        for p in picks.values():
            if p is None:
                return readers
            chosen |= p
        return tuple(r for i, r in enumerate(readers) if i in chosen)


def _picks(space: str, f: Filter, readers: Sequence[Reader]) -> frozenset[int] | None:
    """For each conjunction of ``f`` that may match an event of ``space``, the exact reader
    covering it that takes the fewest events (the one with the most literals); None if one has
    no such reader. Every event ``f`` matches then passes a picked reader's test."""
    in_space = Filter((Conjunction((Predicate(SPACE, Op.EQ, space),)),))
    out: set[int] = set()
    for c in f.disjuncts:
        one = Filter((c,))
        if not overlaps(in_space, one):
            continue
        found = [i for i, r in enumerate(readers) if r.exact and covers(r.routed, one)]
        if not found:
            return None
        out.add(max(found, key=lambda i: sum(len(x.literals) for x in readers[i].routed.disjuncts)))
    return frozenset(out)


class Waiting:
    """A subscription waiting for the snapshots of the partitions behind its derived spaces."""

    def __init__(self, missing: set[tuple[str, int]]) -> None:
        self.missing = missing  # (group, owner) not answered yet
        self.versions: dict[tuple[str, str, str], int] = {}  # (owner, state, key text) -> version
        self.held: list[Mapping[str, Any]] = []  # live events of partitions not answered yet


class Flows:
    """The flows a broker knows, its partitions and its flow subscriptions (see the module note)."""

    def __init__(self) -> None:
        self.records: dict[str, DeployRecord] = {}
        self.deployments: dict[str, Deployment] = {}
        self.withdrawn: set[tuple[int, int]] = set()
        self.parts: dict[Hashable, FlowPartition] = {}
        self.subs: dict[Hashable, FlowSubscription] = {}  # flow subscriptions served here
        self.waiting: dict[Hashable, Waiting] = {}
        self.ended: list[Hashable] = []  # flow subscriptions ended by an undeploy (for the driver)
        self._by_space: dict[str, str] = {}  # bus space -> flow
        self.gate = DerivedGate()  # the readers of derived spaces some subscription needs now

    # -- the registry

    def flow_of_space(self, space: str) -> Deployment | None:
        name = self._by_space.get(space)
        return None if name is None else self.deployments[name]

    def check_new(self, d: Deployment, taken: Iterable[str] = ()) -> DeployRecord | None:
        """Why ``d`` cannot be deployed here (a :class:`UserError`); the record it would
        replace nothing of, or the record already deployed with its version (idempotent)."""
        old = self.records.get(d.name)
        if old is not None:
            if old.version == d.version:
                return old
            raise UserError(
                f"flow {d.name!r} is deployed already with version {old.version} "
                f"(this one is {d.version}): undeploy it first"
            )
        other_spaces = set(taken)
        for space in d.spaces:
            owner = self._by_space.get(space)
            if owner is not None or space in other_spaces:
                by = f"flow {owner!r}" if owner is not None else "the broker's configuration"
                raise UserError(f"flow {d.name!r}: space {space!r} is taken by {by}")
        fns = {n for dep in self.deployments.values() for n in dep.graph.functions}
        clash = sorted(set(d.graph.functions) & fns)
        if clash:
            raise UserError(f"flow {d.name!r}: function or lookup {clash[0]!r} is taken by another flow")
        return None

    def install(self, rec: DeployRecord, built: Deployment | None = None) -> tuple[bool, DeployRecord | None]:
        """Take ``rec`` in: (whether it is installed now, the record it replaced). ``built``:
        its flow built already from its text (else it is built here, once)."""
        if rec.deploy_id in self.withdrawn:
            return False, None
        old = self.records.get(rec.name)
        if old is not None and (old == rec or old.rank <= rec.rank):
            return False, None
        d = built if built is not None else Deployment.from_text(rec.text)
        if d.version != rec.version or d.name != rec.name:
            return False, None
        if old is not None:
            self.remove(old)
        self.records[rec.name] = rec
        self.deployments[rec.name] = d
        for space in d.spaces:
            self._by_space[space] = rec.name
        return True, old

    def remove(self, rec: DeployRecord) -> None:
        if self.records.get(rec.name) == rec:
            del self.records[rec.name]
            d = self.deployments.pop(rec.name)
            for space in d.spaces:
                self._by_space.pop(space, None)

    def partitions_to_make(self, rec: DeployRecord, me: int) -> list[tuple[tuple[Any, ...], Group, Any]]:
        """The partition subscriptions ``me`` makes for a fresh ``rec``: (id, group, filter)."""
        if me not in rec.owners:
            return []
        d = self.deployments[rec.name]
        ranges = ranges_of(rec.owners, me)
        return [
            ((PART, rec.name, rec.deploy_id, g.name, me), g, d.partition_filter(g, ranges)) for g in d.groups
        ]

    def serve_partition(self, sub_id: Hashable) -> FlowPartition | None:
        """Serve the partition subscription ``sub_id`` here (made here, or taken over)."""
        if not (isinstance(sub_id, tuple) and len(sub_id) == 5 and sub_id[0] == PART):
            return None
        _, name, deploy_id, group, owner = sub_id
        rec = self.records.get(name)
        if rec is None or rec.deploy_id != deploy_id:
            return None
        d = self.deployments[name]
        g = next(x for x in d.groups if x.name == group)
        part = FlowPartition(sub_id, d, g, owner, ranges_of(rec.owners, owner))
        self.parts[sub_id] = part
        return part

    # -- a partition's folds

    def prepare(self, version: Any, filters: Callable[[], Iterable[Filter]]) -> None:
        """The gate's choice for every space the partitions here publish into, made now for
        the tables at ``version`` (``filters``: theirs) rather than by the next fold."""
        self.gate.update(version, filters)
        for part in self.parts.values():
            for fold in part.group.folds:
                for output in fold.outputs:
                    self.gate.readers(part.deployment, output.space)

    def fold(
        self,
        part: FlowPartition,
        event: Mapping[str, Any],
        state: Mapping[Hashable, Any],
        results: dict[Any, Any] | None = None,
    ) -> tuple[dict[Hashable, Any], list[tuple[Any, dict[str, Any]]], tuple[Any, ...]]:
        """Fold ``event`` into ``part``: the ring state entries to set, the events to publish
        ``(id, bus event)`` and those in the fewest bytes, for the log (:meth:`outputs_of`;
        ``results``: what this step noted of the event, for
        :func:`~flowbus.flow.deploy.count_arcs`)."""
        name, owner = part.sub_id[1], part.owner
        d, gate, group = part.deployment, self.gate, part.group
        counts = group.counts
        changed: dict[Hashable, Any] = {}
        published: list[tuple[Any, dict[str, Any]]] = []
        kept: list[tuple[Any, ...]] = []  # what ``published`` is, in the fewest bytes (see outputs_of)
        for feed in part.feeds_of(event):
            src = feed.input(event)
            if src is None:
                continue
            if feed.arcs:
                count_arcs(d.counts, feed.arcs, results)
            key = group.key_of(src)
            if key is None:
                continue
            ks, rkey = part.rows_of(key)
            for f, k in zip(group.folds, ks, strict=True):  # each collapse: its row, maybe changed
                counts[f.arc] = counts.get(f.arc, 0) + 1
                prev = changed.get(k) or state.get(k)  # (version, row); never empty
                old = f.bound.initial if prev is None else prev[1]
                new = f.step(key, old, src)
                if new is None or new == old:
                    continue
                version = (prev[0] if prev is not None else 0) + 1
                changed[k] = (version, new)
                j = 0  # (the change's i-th output over its expand arcs: its id)
                for out in f.outputs:  # what each expand arc out of the state publishes
                    evs = out.events(key, old, new, src)
                    if not evs:
                        continue
                    counts[out.arc] = counts.get(out.arc, 0) + len(evs)
                    space = out.space
                    readers = gate.readers(d, space)
                    for ev in evs:
                        if d.wanted(space, ev, readers):
                            record = (space, f.state, rkey, version, j, tuple(ev.items()))
                            kept.append(record)
                            published.append(_output(name, owner, *record))
                        j += 1
        return changed, published, tuple(kept)

    @staticmethod
    def outputs_of(part: FlowPartition, kept: Sequence[tuple[Any, ...]]) -> list[tuple[Any, dict[str, Any]]]:
        """What a fold of ``part`` kept for its log: the ``(id, bus
        event)`` it published (their derived attributes not stamped)."""
        return [_output(part.sub_id[1], part.owner, *record) for record in kept]

    def snapshot_rows(
        self, ask: SnapshotAsk, state: Mapping[Hashable, Any], keys: Iterable[Hashable]
    ) -> list[SnapshotRows]:
        """The rows of the partitions served here that ``ask`` wants (``keys``: the ring
        state's row keys of its flow, ``("frow", flow, ...)``)."""
        keys = sorted(keys, key=repr)  # (an order that does not depend on hashes)
        out = []
        for part in self.parts.values():
            sid = part.sub_id
            if sid[1] != ask.flow or sid[2] != ask.deploy_id or sid[3] not in ask.groups:
                continue
            mine = (ROW, sid[1], sid[2], part.owner)
            rows = tuple(
                (k.state, k.key, state[k][0], state[k][1])
                for k in map(record, keys)
                if isinstance(k, RowKey) and k[:4] == mine
            )
            out.append(SnapshotRows(ask.sub, sid[3], part.owner, rows))
        return out

    # -- subscriptions

    def plan(self, space: str, filter_text: str) -> FlowSubscription:
        d = self.flow_of_space(space)
        if d is None:
            raise UserError(f"no deployed flow has a space {space!r}")
        return d.subscription(space, filter_text)

    def snapshot_ask(self, sub_id: Hashable, sub: FlowSubscription, me: int) -> SnapshotAsk | None:
        """The snapshot ``sub`` needs (None: none, it reads no derived space); starts waiting."""
        d = self.deployments[sub.flow]
        rec = self.records[sub.flow]
        groups = tuple(
            g.name for g in d.groups if any(o.space in sub.sources for f in g.folds for o in f.outputs)
        )
        if not groups:
            return None
        self.waiting[sub_id] = Waiting({(g, o) for g in groups for o in rec.owners})
        return SnapshotAsk(sub_id, me, sub.flow, rec.deploy_id, groups)

    def snapshot_in(self, msg: SnapshotRows) -> list[Mapping[str, Any]]:
        """A partition's rows for a waiting subscription: the events to deliver now (bus
        events, in order: the snapshot's, then the held ones it does not cover)."""
        w = self.waiting.get(msg.sub)
        sub = self.subs.get(msg.sub)
        if w is None or sub is None or (msg.group, msg.owner) not in w.missing:
            return []
        w.missing.discard((msg.group, msg.owner))
        d = self.deployments[sub.flow]
        group = next(g for g in d.groups if g.name == msg.group)
        by_key: dict[Any, dict[str, Row]] = {}
        versions: dict[Any, dict[str, int]] = {}
        for st, key, version, row in msg.rows:
            by_key.setdefault(key, {})[st] = row
            versions.setdefault(key, {})[st] = version
            w.versions[(str(msg.owner), st, repr(key))] = version
        out: list[Mapping[str, Any]] = []
        for key in sorted(by_key, key=repr):
            for i, (space, snap) in enumerate(group.snapshot(key, by_key[key])):
                eid = (f"{sub.flow}/snapshot/{space}/{key!r}", i)
                out.append({**snap, SPACE: space, UNROUTED: True, EVENT_ID: eid})
        still: list[Mapping[str, Any]] = []
        for ev in w.held:
            if ev.get(PARTITION) == msg.owner and _group_of(d, ev) == msg.group:
                if ev.get(ROW_VERSION, 0) > w.versions.get(
                    (str(msg.owner), ev.get(STATE, ""), ev.get(KEY, "")), 0
                ):
                    out.append(ev)
            else:
                still.append(ev)
        w.held = still
        return out

    def admit(self, sub_id: Hashable, event: Mapping[str, Any]) -> bool:
        """Whether a derived ``event`` goes to subscription ``sub_id`` now: not if its
        partition's snapshot is not in yet (it is held) or covers it already (dropped)."""
        return bool(self.admitted([sub_id], event))

    def admitted(self, sub_ids: Sequence[Hashable], event: Mapping[str, Any]) -> list[Hashable]:
        """Of ``sub_ids`` (subscriptions to one flow), those ``event`` goes to now (see
        :meth:`admit`; what it asks of the event is read once)."""
        if PARTITION not in event:
            return list(sub_ids)
        waiting = self.waiting
        owner = event[PARTITION]
        where = (str(owner), event.get(STATE, ""), event.get(KEY, ""))
        version = event.get(ROW_VERSION, 0)
        group: Any = waiting  # (not known yet)
        out = []
        for sub_id in sub_ids:
            w = waiting.get(sub_id)
            if w is not None:
                if w.missing:
                    if group is waiting:
                        group = _group_of(self.deployments[self.subs[sub_id].flow], event)
                    if (group, owner) in w.missing:
                        w.held.append(event)
                        continue
                if version <= w.versions.get(where, 0):
                    continue
            out.append(sub_id)
        return out


def _group_of(d: Deployment, event: Mapping[str, Any]) -> str | None:
    return d.group_of_state.get(event.get(STATE, ""))
