"""CBDLO's attribute trees kept by messages: inserts, deletes, rotations, moves and repair.

How it works (the 004 document, sections 2 and 5.2, which describe the distributed balanced
binary trees of virtual nodes but not how they are kept; the protocol is ours):

* **Who decides.** Each attribute topology has a *coordinator*: the node whose subscription
  created it. It holds the topology's :class:`~flowbus.overlay.cbdlo_tree.AttributeTree` (the
  skeleton and the predicates) and applies the operations one at a time, so two splits never
  race. A subscriber sends its predicate on the attribute as a :class:`TreeOp` (``add`` /
  ``remove``); a node that finds another gone sends ``down`` (below). The directory
  (:class:`~flowbus.overlay.cbdlo_tree.Topologies`) names each attribute's coordinator and
  backup, as a name service would.
* **What the hosts hold.** A host holds the records (:class:`~flowbus.overlay.cbdlo_tree.VRec`)
  of the virtual nodes it hosts, in its :class:`Replica`, and routes from them alone. After
  an operation the coordinator sends one :class:`TreeUpdate` to every host whose records
  changed: the split (the new virtual node goes to the subscriber that brought the bound)
  or the merge, every node on the path up whose height or span moved, the nodes an AVL
  rotation re-linked, a virtual node moved to another host (the old host drops it).
* **Backup.** The coordinator sends every operation it applies to a backup (:class:`TreeSync`),
  a member that replays it on its own copy; a new backup gets the whole copy once
  (:class:`TreeCopy`). A node whose operation could not reach the coordinator (a failure
  notice) sends :class:`TakeOver` and then the operation to the backup, which becomes the
  coordinator, takes its tree's records as what the hosts hold (they got every update the
  old coordinator sent before the operations the backup replayed), repairs the old one's
  share and names a new backup. With ``probe`` > 0 (off by default) the coordinator also
  probes its backup every ``probe`` time units (:class:`TreePing`; a failed probe names
  another backup) and a backup that hears no probe for ``WATCH`` periods takes over: a
  topology is then lost only if both fail within about one period; without probing, if
  both fail before either loss is noticed (a rare topology sees few operations).
* **Repair.** A failed send to a host (a tree step, a match, an update) is reported as
  ``down``: the coordinator removes the node's predicates (merging the bounds no one else
  uses) and moves its virtual nodes to a member of their node list, else to another member
  (:meth:`~flowbus.overlay.cbdlo_tree.AttributeTree.drop_node`). If the member chosen is dead
  too, its update fails and is reported in turn.

Every message here is counted by the simulator like the routing messages; the experiments
sum them as ``maintenance_messages`` (:data:`MESSAGES`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Final, Protocol

from flowbus.core import Effect, Send, SetTimer
from flowbus.errors import ProtocolError
from flowbus.overlay.cbdlo_tree import AttributeTree, Number, Topologies, VRec

__all__ = [
    "KINDS",
    "MESSAGES",
    "MaintHost",
    "Replica",
    "TakeOver",
    "TreeCopy",
    "TreeOp",
    "TreePing",
    "TreeSync",
    "TreeUpdate",
    "on_copy",
    "on_failed",
    "on_op",
    "on_ping",
    "on_sync",
    "on_takeover",
    "on_timer",
    "on_update",
    "report_down",
    "start_probes",
    "submit",
]

KINDS: Final = ("add", "remove", "down", "retire")
TIMER: Final = "tree"
"""The first element of the protocol's timer keys: ``("tree", "ping" | "watch", attr)``."""
WATCH: Final = 2.5
"""Probe periods without a probe after which a backup takes over."""


@dataclass(frozen=True, slots=True)
class TreeOp:
    """To ``attr``'s coordinator: ``add`` / ``remove`` node ``node``'s predicate ``[lo, hi)``,
    or ``down``: node ``node`` is gone. (``retire``: coordinator to backup only, in a
    :class:`TreeSync`: the topology's last predicate went.)"""

    attr: str
    kind: str
    node: int
    lo: Number = 0
    hi: Number = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ProtocolError(f"tree operation on {self.attr!r}: unknown kind {self.kind!r}")


@dataclass(frozen=True, slots=True)
class TreeUpdate:
    """Coordinator to host: (re)write these records of ``attr``, drop these virtual nodes."""

    attr: str
    records: tuple[VRec, ...]
    drops: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TreeSync:
    """Coordinator to backup: replay ``op``."""

    op: TreeOp


@dataclass(frozen=True, slots=True)
class TreeCopy:
    """Coordinator to a new backup: the topology's whole state."""

    tree: AttributeTree


@dataclass(frozen=True, slots=True)
class TreePing:
    """Coordinator to backup, every ``probe`` time units (when probing is on): I live."""

    attr: str


@dataclass(frozen=True, slots=True)
class TakeOver:
    """To ``attr``'s backup: the coordinator ``dead`` is gone, take its place."""

    attr: str
    dead: int


MESSAGES: Final = ("TreeOp", "TreeUpdate", "TreeSync", "TreeCopy", "TakeOver", "TreePing")
"""The maintenance messages by type name (the simulator counts sends by type)."""


class Replica:
    """The records of the virtual nodes one node hosts, per attribute."""

    __slots__ = ("recs",)

    def __init__(self) -> None:
        self.recs: dict[str, dict[int, VRec]] = {}

    def apply(
        self, attr: str, records: tuple[VRec, ...] | list[VRec], drops: tuple[int, ...] | list[int]
    ) -> None:
        mine = self.recs.setdefault(attr, {})
        for vid in drops:
            mine.pop(vid, None)
        for r in records:
            mine[r.vid] = r
        if not mine:
            del self.recs[attr]

    def get(self, attr: str, vid: int) -> VRec | None:
        mine = self.recs.get(attr)
        return None if mine is None else mine.get(vid)

    def vnodes_of(self, attr: str) -> list[VRec]:
        """The node's virtual node list for ``attr``, by id (empty: it hosts none)."""
        mine = self.recs.get(attr)
        return [mine[v] for v in sorted(mine)] if mine else []

    def hosts(self, attr: str) -> bool:
        return attr in self.recs

    def attrs(self) -> tuple[str, ...]:
        return tuple(sorted(self.recs))


class MaintHost(Protocol):
    """What the protocol needs of the node it runs on."""

    addr: int
    probe: float

    @property
    def topologies(self) -> Topologies: ...

    @property
    def replica(self) -> Replica: ...

    @property
    def coordinating(self) -> dict[str, AttributeTree]: ...

    @property
    def backups(self) -> dict[str, AttributeTree]: ...


def submit(host: MaintHost, op: TreeOp) -> list[Effect]:
    """Send ``op`` to its coordinator (apply it here if this node is the coordinator; an
    ``add`` to an attribute without a topology creates it here)."""
    tree = host.topologies.trees.get(op.attr)
    if tree is None:
        if op.kind != "add":
            return []
        topo = host.topologies
        tree = AttributeTree(op.attr, topo.lo, topo.hi, first_host=host.addr)
        topo.trees[op.attr] = tree
        host.coordinating[op.attr] = tree
    if tree.coordinator == host.addr:
        return on_op(host, op)
    return [Send(tree.coordinator, op)]


def on_op(host: MaintHost, op: TreeOp) -> list[Effect]:
    """At the coordinator: apply ``op``, update the hosts, keep the backup in step."""
    tree = host.coordinating.get(op.attr)
    if op.kind == "retire":
        raise ProtocolError(f"node {host.addr}: a retire of {op.attr!r} goes to a backup in a TreeSync")
    if tree is None:  # not (or no longer) the coordinator: pass it on
        current = host.topologies.trees.get(op.attr)
        if current is None or current.coordinator == host.addr:
            return []
        return [Send(current.coordinator, op)]
    if op.kind == "down" and op.node not in tree.member_subs and op.node not in tree.hosted:
        if tree.backup is None or op.node == tree.backup:  # name a (new) backup
            tree.backup = None
            return _backup(host, tree, op)
        return []  # reported twice: nothing left to repair
    _apply(tree, op)
    if op.kind == "down" and op.node == tree.backup:
        tree.backup = None
    if tree.subscriptions == 0:
        return _retire(host, tree)
    effects = _send_changes(host, tree)
    return effects + _backup(host, tree, op)


def _apply(tree: AttributeTree, op: TreeOp) -> None:
    if op.kind == "add":
        tree.add(op.node, op.lo, op.hi)
    elif op.kind == "remove":
        tree.remove(op.node, op.lo, op.hi)
        tree.release(op.node)
    else:
        tree.drop_node(op.node)


def _send_changes(host: MaintHost, tree: AttributeTree) -> list[Effect]:
    ch = tree.changes()
    effects: list[Effect] = []
    for h in ch.hosts():
        recs, drops = ch.updates.get(h, []), ch.drops.get(h, [])
        if h == host.addr:
            host.replica.apply(tree.attr, recs, drops)
        else:
            effects.append(Send(h, TreeUpdate(tree.attr, tuple(recs), tuple(drops))))
    return effects


def _backup(host: MaintHost, tree: AttributeTree, op: TreeOp) -> list[Effect]:
    """Replay ``op`` at the backup; name one (and send it the copy) if there is none."""
    if tree.backup is not None:
        return [Send(tree.backup, TreeSync(op))]
    gone = op.node if op.kind == "down" else None
    others = [n for n in tree.member_subs if n != host.addr and n != gone]
    if not others:
        return []
    tree.backup = min(others)
    effects: list[Effect] = [Send(tree.backup, TreeCopy(copy.deepcopy(tree)))]
    if host.probe > 0:
        effects.append(SetTimer(host.probe, (TIMER, "ping", tree.attr)))
    return effects


def _retire(host: MaintHost, tree: AttributeTree) -> list[Effect]:
    """The last predicate went: every host drops its records, the topology is no more."""
    effects: list[Effect] = []
    by_host: dict[int, list[int]] = {}
    for vid, rec in tree.shipped.items():
        by_host.setdefault(rec.host, []).append(vid)
    for h, vids in sorted(by_host.items()):
        if h == host.addr:
            host.replica.apply(tree.attr, [], vids)
        else:
            effects.append(Send(h, TreeUpdate(tree.attr, (), tuple(vids))))
    del host.coordinating[tree.attr]
    if host.topologies.trees.get(tree.attr) is tree:
        del host.topologies.trees[tree.attr]
    if tree.backup is not None:
        effects.append(Send(tree.backup, TreeSync(TreeOp(tree.attr, "retire", host.addr))))
    return effects


def on_update(host: MaintHost, msg: TreeUpdate) -> list[Effect]:
    host.replica.apply(msg.attr, msg.records, msg.drops)
    return []


def on_sync(host: MaintHost, msg: TreeSync) -> list[Effect]:
    """At the backup: replay the operation on the copy (``retire``: drop the copy)."""
    tree = host.backups.get(msg.op.attr)
    if tree is None:
        return []
    if msg.op.kind == "retire":
        del host.backups[msg.op.attr]
        return []
    _apply(tree, msg.op)
    if msg.op.kind == "down" and msg.op.node == tree.backup:
        tree.backup = None
    tree.settle()  # the coordinator sent the changes
    return []


def on_copy(host: MaintHost, msg: TreeCopy) -> list[Effect]:
    host.backups[msg.tree.attr] = msg.tree
    return _watch(host, msg.tree.attr)


def on_ping(host: MaintHost, msg: TreePing) -> list[Effect]:
    """At the backup: the coordinator lives; watch again."""
    return _watch(host, msg.attr) if msg.attr in host.backups else []


def start_probes(host: MaintHost) -> list[Effect]:
    """The probe timers of the topologies this node coordinates or backs up (probing on)."""
    if host.probe <= 0:
        return []
    effects: list[Effect] = [SetTimer(host.probe, (TIMER, "ping", a)) for a in sorted(host.coordinating)]
    for attr in sorted(host.backups):
        effects += _watch(host, attr)
    return effects


def _watch(host: MaintHost, attr: str) -> list[Effect]:
    return [SetTimer(WATCH * host.probe, (TIMER, "watch", attr))] if host.probe > 0 else []


def on_timer(host: MaintHost, key: tuple[str, str, str]) -> list[Effect]:
    """``ping``: the coordinator probes its backup (a failed probe names another);
    ``watch``: the backup heard no probe for ``WATCH`` periods and takes over."""
    _, what, attr = key
    if what == "ping":
        tree = host.coordinating.get(attr)
        if tree is None or tree.backup is None:
            return []
        return [Send(tree.backup, TreePing(attr)), SetTimer(host.probe, key)]
    copy_ = host.backups.get(attr)
    if copy_ is None:
        return []
    return on_takeover(host, TakeOver(attr, copy_.coordinator))


def on_takeover(host: MaintHost, msg: TakeOver) -> list[Effect]:
    """At the backup: become the coordinator, repair the old one's share."""
    tree = host.backups.pop(msg.attr, None)
    if tree is None or tree.coordinator != msg.dead:
        return []
    tree.coordinator = host.addr
    tree.backup = None
    tree.resync()
    host.coordinating[msg.attr] = tree
    host.topologies.trees[msg.attr] = tree
    return on_op(host, TreeOp(msg.attr, "down", msg.dead))


def on_failed(host: MaintHost, dst: int, msg: Any) -> list[Effect]:
    """A maintenance message could not reach ``dst`` (a failure notice)."""
    match msg:
        case TreeOp():
            return _coordinator_gone(host, dst, msg)
        case (
            TreeUpdate(attr=attr)
            | TreeSync(op=TreeOp(attr=attr))
            | TreeCopy(tree=AttributeTree(attr=attr))
            | TreePing(attr=attr)
        ):
            if attr in host.coordinating:
                return on_op(host, TreeOp(attr, "down", dst))
            return []
        case _:
            return []  # a TakeOver to a dead backup: both are gone, the topology with them


def report_down(host: MaintHost, attr: str, node: int) -> list[Effect]:
    """``node`` (a host or member of ``attr``'s topology) did not answer: tell the coordinator."""
    tree = host.topologies.trees.get(attr)
    if tree is None:
        return []
    return submit(host, TreeOp(attr, "down", node))


def _coordinator_gone(host: MaintHost, dead: int, op: TreeOp) -> list[Effect]:
    tree = host.topologies.trees.get(op.attr)
    if tree is None or tree.coordinator != dead or tree.backup is None:
        return []
    if tree.backup == host.addr:
        return on_takeover(host, TakeOver(op.attr, dead)) + on_op(host, op)
    return [Send(tree.backup, TakeOver(op.attr, dead)), Send(tree.backup, op)]
