"""The flow side of a ring broker: deployed flows' records, partitions and edges
(sans-IO, a part of :class:`~flowbus.routing.ring_broker.RingBroker`; the registry, plans and
folds are :mod:`flowbus.routing.flows`').

How it works:

* **Records.** A deployment's record (or its withdrawal) is installed here and flooded on the
  ring's tree (:meth:`FlowSide.take_records`, :class:`~flowbus.routing.flows.FlowSync`); a
  fresh one makes the partitions this broker owns, each a subscription of its own; a new
  tree neighbour is sent every record (:meth:`FlowSide.welcome`).
* **The broker's step goes through here** (:meth:`FlowSide.effects`, called first in the
  broker's ``_out`` while flows are served). A delivery to a partition is folded: its state
  rows go into the ring state (backed up, flushed before anything of this step is relied
  on: the events folded are held in custody until every backup holder has that version,
  :meth:`FlowSide.backups_confirmed`; a broker with no holders, alone, holds nothing), and
  what the fold derives is routed at once through :class:`OwnIndex` when no neighbour has a
  subscription (as are the few events of a paced step published here: :meth:`FlowSide.route_few`;
  no matcher pass), else with the next publish here, or after ``DERIVED_WAIT``, or at once
  from a big step (``DERIVED_NOW``). A
  delivery to a flow subscription goes through its edge transforms, the results shared per
  event and space (one ``DeliverAll`` for the subscriptions that share one); a 2nd, 3rd...
  result of one event travels under an alias id the driver settles
  (:attr:`FlowSide.aliases`).
* **Takeover.** A partition taken over (:meth:`FlowSide.adopted`) publishes again what its
  folds published (ids de-duplicate it) and gathers what comes for a grace period
  (``FLOW_GRACE``), then folds it in each publisher's order (:meth:`FlowSide.fold_buffered`).
* **Snapshots.** A new flow subscription asks the partitions for their rows
  (:class:`~flowbus.routing.flows.SnapshotAsk`, forwarded on the tree); the answer comes
  as bus events through its edge.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from flowbus.core import Deliver, DeliverAll, Effect, Send, SetTimer
from flowbus.errors import UserError
from flowbus.filters import Filter
from flowbus.flow.deploy import Deployment, FlowSubscription
from flowbus.meta import EVENT_ID, PARTITION, SPACE, UNROUTED
from flowbus.routing import cbr
from flowbus.routing.flows import DeployRecord, FlowPartition, Flows, FlowSync, SnapshotAsk, SnapshotRows
from flowbus.routing.flows_index import OwnIndex
from flowbus.routing.ring_custody import Key, publish_order
from flowbus.routing.ring_keys import LOG, ROW, LogKey, flow_sub_key, record

if TYPE_CHECKING:
    from flowbus.overlay.chordal_ring import RingNode
    from flowbus.routing.ring_custody import Custodian
    from flowbus.routing.ring_repair import Repair

FLOW_GRACE = "flows.grace"
"""The timer key (with a partition's id) that ends a taken-over partition's grace period."""
DERIVED_TIMER = ("flows.derived",)
"""The timer that routes the events the folds derived, unless a publish here took them
along first (see :meth:`FlowSide.effects`)."""
DERIVED_WAIT = 0.005
"""How long derived events wait at most for a publish to share its matcher pass (seconds):
longer than a paced publisher's gap between frames (a few ms at 5,000 events/s), so a step
costs one pass, not two; the timer is set once for all the events that wait."""
DERIVED_NOW = 128
"""As many derived events as this are routed in the step that made them (a busy broker's big
steps: a second matcher pass costs little there, and they do not wait a step behind)."""

FEW = 32
"""Up to this many events published here at once go through :class:`OwnIndex` when no
neighbour has a subscription: a matcher pass's fixed cost (~55 us with the stock flow's 400
subscriptions, then ~4-5 us an event) is more than the index's for a few events (in-process,
steps of 5 stock events: 78 -> 53 us per source event; of 50: about even; of 200: the
matcher ~10 % cheaper)."""


class FlowHost(Protocol):
    """What :class:`FlowSide` needs of the broker it is part of
    (:class:`~flowbus.routing.ring_broker.RingBroker`): its place, its local subscriptions, its
    tree, and the routing of events published here."""

    @property
    def addr(self) -> int: ...
    @property
    def node_id(self) -> int: ...
    @property
    def ring(self) -> RingNode: ...
    @property
    def router(self) -> cbr.ContentRouter: ...
    @property
    def custodian(self) -> Custodian: ...
    @property
    def repair(self) -> Repair: ...
    @property
    def custody(self) -> bool: ...
    @property
    def subs(self) -> set[Hashable]: ...
    @property
    def syncing(self) -> set[int]: ...
    def subscribe(self, sub_id: Hashable, filt: Filter, *, meta: Any = None) -> list[Effect]: ...
    def unsubscribe(self, sub_id: Hashable) -> list[Effect]: ...
    def tree_neighbours(self) -> set[int]: ...
    def route_own(self, events: list[dict[str, Any]]) -> list[Effect]: ...


class FlowSide:
    """The deployed flows one broker serves: its partitions' folds, its flow subscriptions'
    edges, and the derived events waiting to be routed."""

    def __init__(self, broker: FlowHost, flow_grace: float) -> None:
        self.broker = broker  # (its subscribe, unsubscribe, tree and routing of own events)
        self.ring = broker.ring
        self.custodian = broker.custodian
        self.flows = Flows()  # the deployed flows (routing/flows.py)
        self.flow_grace = flow_grace  # how long a taken-over partition gathers events
        self.aliases: dict[Any, Any] = {}  # the id of a 2nd, 3rd... delivery of one event -> the event's
        self._backed_up: list[tuple[int, Key]] = []  # (backup version, custody record) of folds
        self._logging: list[FlowPartition] = []  # the partitions that folded in this step (their logs)
        self.derived: list[dict[str, Any]] = []  # derived events waiting to be routed (DERIVED_TIMER)
        self._derived_due = False  # (the timer is set)
        self.own = OwnIndex()  # the local subscriptions, for derived events when none can leave

    def take_derived(self, stamped: list[dict[str, Any]]) -> None:
        """Events published here are stamped; what earlier folds derived goes first, in the
        same matcher pass (the timer is set again for what this step's folds derive)."""
        for event in stamped:
            self.stamp(event)
        if self.derived:
            stamped[:0], self.derived = self.derived, []
            self._derived_due = False

    def on_derived_timer(self) -> list[dict[str, Any]]:
        """The timer ``DERIVED_TIMER``: the derived events that wait, to be routed now."""
        self._derived_due = False
        derived, self.derived = self.derived, []
        return derived

    def welcome(self, added: Sequence[int]) -> list[Effect]:
        """New tree neighbours are sent every record and withdrawal known here."""
        flows = self.flows
        if not (flows.records or flows.withdrawn):
            return []
        sync = FlowSync(tuple(flows.records.values()), tuple(sorted(flows.withdrawn)), False)
        return [Send(a, sync) for a in added]

    def unsubscribed(self, sub_id: Hashable) -> list[Effect]:
        """``sub_id`` is no longer served here: its flow subscription or partition ends."""
        out: list[Effect] = []
        if self.flows.subs.pop(sub_id, None) is not None:
            self.flows.waiting.pop(sub_id, None)
            out = self.ring.del_state(flow_sub_key(sub_id))
        self.flows.parts.pop(sub_id, None)
        return out

    def ask_snapshot(self, sub_id: Hashable, sub: FlowSubscription) -> list[Effect]:
        ask = self.flows.snapshot_ask(sub_id, sub, self.broker.addr)
        if ask is None:
            return []
        return self.on_snapshot_ask(None, ask)

    def stamp(self, event: dict[str, Any]) -> None:
        d = self.flows.flow_of_space(event.get(SPACE, ""))
        if d is not None:
            d.stamp(event)

    def take_records(
        self,
        deployed: Sequence[DeployRecord],
        withdrawn: Sequence[tuple[int, int]],
        *,
        fresh: bool,
        src: int | None,
        built: Deployment | None = None,
    ) -> list[Effect]:
        """Records and withdrawals (local, or a FlowSync from ``src``): what is new here is
        installed or torn down, and flooded on to the other tree neighbours. ``built``: the
        flow of a record deployed here, built already (not built again from its text)."""
        flows = self.flows
        out: list[Effect] = []
        news: list[DeployRecord] = []
        gone: list[tuple[int, int]] = []
        for did in withdrawn:
            if did in flows.withdrawn:
                continue
            flows.withdrawn.add(did)
            gone.append(did)
            for rec in [r for r in flows.records.values() if r.deploy_id == did]:
                out += self._tear_down(rec)
        for rec in deployed:
            installed, old = flows.install(
                rec, built if built is not None and built.text == rec.text else None
            )
            if not installed:
                continue
            news.append(rec)
            if old is not None:
                out += self._tear_down(old, removed=True)
            if fresh and self.ring.joined:
                for sub_id, _, filt in flows.partitions_to_make(rec, self.broker.node_id):
                    if sub_id not in self.broker.subs:
                        out += self.broker.subscribe(sub_id, filt)
                        flows.serve_partition(sub_id)
        if news or gone:
            msg = FlowSync(tuple(news), tuple(gone), fresh)
            out += [Send(n, msg) for n in sorted(self.broker.tree_neighbours()) if n != src]
        return out

    def _tear_down(self, rec: DeployRecord, *, removed: bool = False) -> list[Effect]:
        """Forget ``rec``: its partitions and subscriptions here end, its rows go."""
        out: list[Effect] = []
        if not removed:
            self.flows.remove(rec)
        for sub_id, part in list(self.flows.parts.items()):
            if part.sub_id[1] == rec.name and part.sub_id[2] == rec.deploy_id and sub_id in self.broker.subs:
                out += self.broker.unsubscribe(sub_id)
        for sub_id, sub in list(self.flows.subs.items()):
            if sub.flow == rec.name and sub_id in self.broker.subs:
                out += self.broker.unsubscribe(sub_id)
                self.flows.ended.append(sub_id)
        rows, flow = (ROW, rec.name, rec.deploy_id), (rec.name, rec.deploy_id)
        doomed = {k for k in map(record, self.ring.keys_of(ROW, rec.name)) if k[:3] == rows}  # type: ignore[index]
        doomed |= self.ring.keys_where(LOG, lambda part: isinstance(part, tuple) and part[1:3] == flow)
        for key in sorted(doomed, key=repr):  # (an order that does not depend on hashes)
            out += self.ring.del_state(key)
        return out

    def on_flow_sync(self, src: int, msg: FlowSync) -> list[Effect]:
        return self.take_records(msg.deployed, msg.withdrawn, fresh=msg.fresh, src=src)

    def on_snapshot_ask(self, src: int | None, msg: SnapshotAsk) -> list[Effect]:
        """Forwarded on the tree; answered for the partitions served here."""
        out: list[Effect] = [Send(n, msg) for n in sorted(self.broker.tree_neighbours()) if n != src]
        for rows in self.flows.snapshot_rows(msg, self.ring.state, self.ring.keys_of(ROW, msg.flow)):
            if msg.reply_to == self.broker.addr:
                out += self.on_snapshot_rows(rows)
            else:
                out.append(Send(msg.reply_to, rows))
        return out

    def on_snapshot_rows(self, msg: SnapshotRows) -> list[Effect]:
        """A partition's rows for a subscription here: what it is to get now, as bus events
        (the edge transforms them in :meth:`effects`)."""
        return [Deliver(msg.sub, event) for event in self.flows.snapshot_in(msg)]

    def adopted(self, sub_id: Hashable) -> list[Effect]:
        """A subscription taken over: a partition is served here, and what its folds
        published is published again (ids de-duplicate it); a flow subscription gets its edge."""
        state = self.ring.state
        part = self.flows.serve_partition(sub_id)
        if part is not None:
            again: list[dict[str, Any]] = []
            logs = sorted(
                (key.n, state[key])
                for key in map(record, self.ring.keys_of(LOG, sub_id))
                if isinstance(key, LogKey) and type(key.n) is int
            )
            for n, entry in logs:
                for _, kept in part.adopt_log(n, entry):
                    again.extend({**ev, EVENT_ID: eid} for eid, ev in self.flows.outputs_of(part, kept))
            for event in again:
                self.stamp(event)
            part.buffer = []
            grace = SetTimer(self.flow_grace, (FLOW_GRACE, sub_id))
            return [grace, *self.broker.route_own(again)] if again else [grace]
        spec = state.get(flow_sub_key(sub_id))
        if spec is not None and sub_id not in self.flows.subs:
            try:
                self.flows.subs[sub_id] = self.flows.plan(*spec)
            except UserError:  # (its flow is gone)
                return []
        return []

    def effects(self, effects: list[Effect]) -> list[Effect]:
        """Deliveries to partitions folded (what they publish routed, the fold backed up
        before anything else of this step is relied on), to flow subscriptions transformed."""
        parts, subs = self.flows.parts, self.flows.subs
        out: list[Effect] = []
        router = self.broker.router
        grouped = router.grouped
        if parts:  # (what the folds publish: what some subscription of the network needs)
            self.flows.gate.update(router.changes, self._table_filters)
        results: dict[int, dict[Any, Any]] = {}  # id(event) -> its paths' results (see _edge)
        publish: list[dict[str, Any]] = []
        folded: list[Key] = []  # the custody records of the events folded
        for e in effects:
            if type(e) is DeliverAll:
                if parts.keys().isdisjoint(e.subs) and subs.keys().isdisjoint(e.subs):
                    out.append(e)
                else:
                    self._deliver_all(e, out, publish, folded, results)
                continue
            if type(e) is Deliver:
                part = parts.get(e.sub)
                if part is not None:
                    self._fold_into(part, e.sub, e.event, out, publish, folded, results)
                    continue
                sub = subs.get(e.sub)
                if sub is not None:
                    edge = self._edge(e.sub, sub, e.event, results.setdefault(id(e.event), {}))
                    if grouped and len(edge) == 1 and out and _same_event(out[-1], edge[0]):
                        out[-1] = _joined(out[-1], edge[0])  # (one result shared: one effect)
                    else:
                        out.extend(edge)
                    continue
            out.append(e)
        if self._logging:
            out.extend(self._close_logs())
        if folded:  # the folds' backup goes before what they publish; the events they
            out.extend(self.ring.flush_backups())  # folded are confirmed upstream once
            version = self.ring.backups.version  # the holders have that backup (if there
            for key in folded if self.ring.backups.holders else ():  # are none, at once)
                self.custodian.hold(key, ("backup", version))
                self._backed_up.append((version, key))
        if publish:  # (routed with the next publish here, or after DERIVED_WAIT: one
            self.derived.extend(publish)  # matcher pass instead of two for a step of few events)
            alone = self._route_alone(self.derived)  # (none can leave: no matcher pass, at once)
            if alone is not None:
                self.derived = []
                out.extend(self.effects(alone))
            elif len(self.derived) >= DERIVED_NOW:  # (a big step: a pass of their own costs
                derived, self.derived = self.derived, []  # little, and they leave with it)
                out.extend(self.effects(self.broker.route_own(derived)))
            elif not self._derived_due:
                self._derived_due = True
                out.append(SetTimer(DERIVED_WAIT, DERIVED_TIMER))
        return out

    def _close_logs(self) -> list[Effect]:
        """This step's folds into each partition's log (one ring state entry a partition)."""
        out: list[Effect] = []
        ring = self.ring
        for part in self._logging:
            if part.log:
                key, entry, gone = part.close_log()
                out += ring.set_state(key, entry)
                for old in gone:
                    out += ring.del_state(old)
        self._logging.clear()
        return out

    def prepare(self) -> None:
        """What the next step would choose or build first for the tables as they are now: the
        gate's readers of the spaces the partitions here publish into, the lone broker's own
        index (see :meth:`RingBroker.prepare <flowbus.routing.ring_broker.RingBroker.prepare>`)."""
        if not self.flows.parts:
            return
        self.flows.prepare(self.broker.router.changes, self._table_filters)
        self._route_alone([])

    def route_few(self, events: list[dict[str, Any]]) -> list[Effect] | None:
        """What routing events published here gives, when they are few (a paced step's) and
        no neighbour has a subscription (see :meth:`_route_alone`); None: the router routes them."""
        return self._route_alone(events) if len(events) <= FEW else None

    def _route_alone(self, events: list[dict[str, Any]]) -> list[Effect] | None:
        """What routing derived ``events`` gives when no neighbour has a subscription: every
        effect a local delivery, found by :class:`OwnIndex` (no matcher pass, so they need
        not wait for a publish to share one); None: the router routes them."""
        b = self.broker
        router = b.router
        if b.repair.orphans or b.syncing or router.advertising or not router.grouped:
            return None
        me = b.addr
        self.own.update(router.changes, me, router.table_size, lambda: router.received_from(me))
        return self.own.route(events)

    def custody_of(self, effects: list[Effect]) -> None:
        """The derived events these effects send to other brokers go in custody (their
        records open now; a partition here folding one opens its own, :meth:`_fold_into`).
        One delivered only to flow subscriptions here needs no record: if this broker dies, the
        partition's new holder publishes again what its folds published (:meth:`adopted`)."""
        custodian = self.custodian
        step = custodian.step
        for e in effects:
            if type(e) is Send and type(e.msg) is cbr.Publish:
                event = e.msg.event
                if PARTITION in event and event[EVENT_ID] not in step:
                    custodian.open(None, event)

    def _table_filters(self) -> list[Filter]:
        """Every filter of the routing tables (local and from each neighbour)."""
        tables, _ = self.broker.router.routing_state()
        return [f for table in tables.values() for f in table.values()]

    def _deliver_all(
        self,
        e: DeliverAll,
        out: list[Effect],
        publish: list[dict[str, Any]],
        folded: list[Key],
        results: dict[int, dict[Any, Any]],
    ) -> None:
        """An event's local deliveries, some to a flow's partitions or subscriptions: the
        others as they are; the subscriptions that share the space's one result (see
        :meth:`~flowbus.flow.deploy.FlowSubscription.shares`) in one ``DeliverAll`` of it, the
        transforms run once; the rest one by one (:meth:`_edge`)."""
        parts, subs, flows = self.flows.parts, self.flows.subs, self.flows
        event = e.event
        got = results.setdefault(id(event), {})
        waits = bool(flows.waiting) and PARTITION in event  # (see Flows.admit: a derived event)
        space = event.get(SPACE, "") if UNROUTED not in event else None  # (sub.shares, inlined)
        rest: list[Hashable] = []
        shared: dict[str, list[Hashable]] = {}
        edges: list[Effect] = []
        for sub_id in e.subs:
            sub = subs.get(sub_id)
            if sub is None:
                part = parts.get(sub_id)
                if part is None:
                    rest.append(sub_id)
                else:
                    self._fold_into(part, sub_id, event, edges, publish, folded, results)
            elif space not in sub.routed:
                edges.extend(self._edge(sub_id, sub, event, got))
            else:
                same = shared.get(sub.space)
                if same is None:
                    shared[sub.space] = [sub_id]
                else:
                    same.append(sub_id)
        if rest:
            out.append(DeliverAll(tuple(rest), event) if len(rest) < len(e.subs) else e)
        for ids in shared.values():
            if waits:
                ids = flows.admitted(ids, event)
                if not ids:
                    continue
            result = self._shared_result(subs[ids[0]], event, got)
            if result is not None:
                out.append(DeliverAll(tuple(ids), result))
        out.extend(edges)

    def _fold_into(
        self,
        part: FlowPartition,
        sub_id: Hashable,
        event: Mapping[str, Any],
        out: list[Effect],
        publish: list[dict[str, Any]],
        folded: list[Key],
        results: dict[int, dict[Any, Any]],
    ) -> None:
        """A delivery to partition ``part``: folded (or buffered, if taken over a moment ago)."""
        key = self.custodian.step.get(event.get(EVENT_ID))
        if key is None and PARTITION in event and self.broker.custody:  # (see custody_of)
            self.custodian.open(None, event)
            key = self.custodian.step.get(event.get(EVENT_ID))
        if part.buffer is not None:  # (taken over a moment ago: see adopted)
            part.buffer.append((event, key))
            self.custodian.hold(key, (FLOW_GRACE, sub_id))
            return
        done, events = self._fold(part, event, results.setdefault(id(event), {}))
        out.extend(done)
        publish.extend(events)
        if key is not None:
            folded.append(key)

    def backups_confirmed(self) -> None:
        """The events whose folds every backup holder now has are done with here."""
        waits = self._backed_up
        if not waits:
            return
        confirmed = self.ring.backups.confirmed()
        i = 0
        while i < len(waits) and waits[i][0] <= confirmed:
            version, key = waits[i]
            self.custodian.release(("backup", version), key[1], only=key)
            i += 1
        del waits[:i]

    def fold_buffered(self, sub_id: Hashable) -> list[Effect] | None:
        """A taken-over partition's grace period is over: what came meanwhile is folded in
        each publisher's order (the events the dead owner had not folded come round again
        from its upstream, maybe after newer ones), then it folds as events come."""
        part = self.flows.parts.get(sub_id)
        if part is None or part.buffer is None:
            return None
        buffered, part.buffer = part.buffer, None
        buffered.sort(key=lambda item: publish_order(item[0].get(EVENT_ID)))
        for event, key in buffered:
            if key is not None:
                self.custodian.step[event[EVENT_ID]] = key
                self.custodian.release((FLOW_GRACE, sub_id), key[1], only=key)
        return [Deliver(sub_id, event) for event, _ in buffered]

    def _fold(
        self, part: FlowPartition, event: Mapping[str, Any], results: dict[Any, Any] | None = None
    ) -> tuple[list[Effect], list[dict[str, Any]]]:
        eid = event.get(EVENT_ID)
        if eid in part.seen:
            return [], []
        changed, published, kept = self.flows.fold(part, event, self.ring.state, results)
        out = self.ring.set_states(changed)
        if not part.log:
            self._logging.append(part)
        part.folded(eid, kept)
        events = []
        for eid2, ev in published:
            ev[EVENT_ID] = eid2
            self.stamp(ev)
            events.append(ev)
        return out, events

    def _edge(
        self, sub_id: Hashable, sub: FlowSubscription, event: Mapping[str, Any], results: dict[Any, Any]
    ) -> list[Effect]:
        """``event`` for flow subscription ``sub_id``: the subscription's transforms applied
        (``results``: what the paths gave for this event, and per space what every routed
        subscription to it gets: shared by the event's subscriptions)."""
        if self.flows.waiting and not self.flows.admit(sub_id, event):
            return []
        eid = event.get(EVENT_ID)
        if sub.shares(event):  # (what every routed subscription to the space gets: made once)
            got = self._shared_result(sub, event, results)
            return [] if got is None else [Deliver(sub_id, got)]
        out: list[Effect] = []
        for i, result in enumerate(sub.deliver(event, results)):
            if i:  # (a copy: the first result is shared by every subscription it goes to)
                alias = (f"{eid[0]}#{i}", eid[1]) if isinstance(eid, tuple) and len(eid) == 2 else (eid, i)
                self.aliases[alias] = eid
                result = {**result, EVENT_ID: alias}
            else:
                result[EVENT_ID] = eid
            out.append(Deliver(sub_id, result))
        return out

    @staticmethod
    def _shared_result(sub: FlowSubscription, event: Mapping[str, Any], results: dict[Any, Any]) -> Any:
        """What every subscription to ``sub``'s space that shares it gets of ``event``
        (None: nothing), made once per event and space (kept in ``results``)."""
        got = results.get(sub.space, results)
        if got is results:
            found = sub.deliver(event, results)
            got = results[sub.space] = found[0] if found else None
            if got is not None:
                got[EVENT_ID] = event.get(EVENT_ID)
        return got


def _same_event(a: Effect, b: Effect) -> bool:
    """Whether ``a`` and ``b`` deliver the same event object (``b`` a ``Deliver``)."""
    return type(b) is Deliver and type(a) in (Deliver, DeliverAll) and a.event is b.event  # type: ignore[union-attr]


def _joined(a: Effect, b: Effect) -> DeliverAll:
    """``a`` (a ``Deliver`` or ``DeliverAll``) and the ``Deliver`` ``b`` of the same event, as one."""
    assert isinstance(a, Deliver | DeliverAll) and isinstance(b, Deliver)  # (see _same_event)
    subs = a.subs if isinstance(a, DeliverAll) else (a.sub,)
    return DeliverAll((*subs, b.sub), b.event)
