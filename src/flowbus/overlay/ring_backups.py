"""The chordal ring's backups: a broker's state, its copies on the holders, and the copies
it holds of others' (sans-IO, driven by :class:`~flowbus.overlay.chordal_ring.RingNode`).

How it works (Madhu Kumar, Bellur, Govindan, "Chordal Reliability Rings", section 3.5):

* A broker's state is an opaque mapping the layers above own (subscriptions, routing
  entries, undelivered events). The ring node picks its holders, the first ``backup`` of
  Right, Left, Rightright, Leftleft; :meth:`Backups.send` copies the state to them.
* Each copy has a version. While the holders stay the same, only the changes go
  (``BackupDelta``: the keys set and deleted since the last copy, on the version before);
  after a new holder, a takeover or a share, the whole state goes (``BackupCopy``). A
  holder no longer one is told so (a copy of no state). Whole copies of a large state on
  every change kept busy brokers from answering heartbeats in time.
* A holder keeps each owner's copy (:class:`Held`) with its place among the holders. A
  delta on a version it does not have makes it ask for the whole state (``BackupResync``);
  an older one, overtaken by a copy, is dropped.
* A holder acknowledges each copy and delta it applies (``BackupAck``): :meth:`Backups.confirmed`
  is the version every current holder has, what a layer above may rely on surviving this
  broker's death (a flow's folds are confirmed upstream only then).
* When an owner dies, the first of its holders still alive takes the copy over
  (:meth:`Backups.take_over`): the entries join this broker's own state. A broker over
  its load limit passes part of it on (:meth:`Backups.hand_over`, :meth:`Backups.absorb`).
  The ring node does the rest of the repair.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flowbus.core import CancelTimer, Effect, Send, SetTimer
from flowbus.overlay.ring_messages import BackupAck, BackupCopy, BackupDelta, BackupResync, Peer

__all__ = ["Backups", "Held"]

_GONE: Any = object()  # (a key deleted since the last copy)


@dataclass(slots=True)
class Held:
    """The copy of an owner's state that this broker holds: ``links`` are the owner's
    neighbours (told where to go when it dies), ``holders`` all its holders in takeover
    order, ``rank`` our place among them (the first live one takes over). The state is
    changed in place by deltas, and the version with it."""

    version: int
    state: dict[Hashable, Any]
    links: tuple[Peer, ...]
    holders: tuple[Peer, ...]
    rank: int


class Backups:
    """One broker's state and the copies of the backup protocol (see the module note)."""

    def __init__(self, keyed: Callable[[Hashable], Hashable] | None = None) -> None:
        self._keyed = keyed  # (what a key from another broker is here: the layer above's records)
        self.state: dict[Hashable, Any] = {}
        self.by_tag: dict[tuple[Any, Any], Hashable | set[Hashable]] = {}  # (tag, its first
        # field) -> the key, or the keys if more than one (a set of one costs 216 bytes, and
        # most subscriptions have one key of a tag)
        self.held: dict[int, Held] = {}  # copies we hold, by owner id
        self.orphans: dict[int, Peer] = {}  # dead owners whose copy waits on an earlier holder
        self.orphan_rounds: dict[int, int] = {}  # heartbeat rounds each has waited (see orphans_waited)
        self.version = 0  # of our last copy
        self.foreign = 0  # changes of the state not made by set / delete (takeovers, shares)
        self.holders: tuple[Peer, ...] = ()  # those our last copy went to
        self._due = False  # a copy to the holders is on its way (its timer is set)
        self._changed: dict[Hashable, Any] = {}  # key -> value (or _GONE) since the last copy
        self._whole = True  # the next copy is of the whole state (not the changes)
        self._acked: dict[int, int] = {}  # holder id -> the last version it acknowledged

    # -- our state

    def keys_of(self, tag: Any, first: Any) -> set[Hashable]:
        """The keys of the state that are tuples ``(tag, first, ...)`` (a copy): what a scan
        of the whole state would find, from the index."""
        return _keys(self.by_tag.get((tag, first)))

    def keys_where(self, tag: Any, test: Callable[[Any], bool]) -> set[Hashable]:
        """The keys ``(tag, first, ...)`` whose ``first`` passes ``test`` (one call a first)."""
        found = self.by_tag.items()
        return {k for (t, first), keys in found if t == tag and test(first) for k in _keys(keys)}

    def _index(self, key: Hashable) -> None:
        if isinstance(key, tuple) and len(key) >= 2:  # (a key's parts are hashable: it is)
            slot, by_tag = (key[0], key[1]), self.by_tag
            have = by_tag.get(slot)
            if have is None:
                by_tag[slot] = key
            elif isinstance(have, set):
                have.add(key)
            elif have != key:
                by_tag[slot] = {have, key}

    def _unindex(self, key: Hashable) -> None:
        if isinstance(key, tuple) and len(key) >= 2:
            slot, by_tag = (key[0], key[1]), self.by_tag
            have = by_tag.get(slot)
            if isinstance(have, set):
                have.discard(key)
                if len(have) <= 1:
                    if have:
                        by_tag[slot] = next(iter(have))
                    else:
                        del by_tag[slot]
            elif have is not None and have == key:
                del by_tag[slot]

    def set(self, key: Hashable, value: Any) -> None:
        if key not in self.state:
            self._index(key)
        self.state[key] = value
        if self.holders:  # (with none, the next copy to any is of the whole state)
            self._changed[key] = value

    def delete(self, key: Hashable) -> None:
        if self.state.pop(key, _GONE) is not _GONE:
            self._unindex(key)
        if self.holders:
            self._changed[key] = _GONE

    def soon(self) -> list[Effect]:
        """A copy is wanted: on a timer of delay 0, so the changes of one step of the
        driver (a burst of subscriptions, say) cost one copy, not one each."""
        if self._due:
            return []
        self._due = True
        return [SetTimer(0.0, ("ring", "backup"))]

    def timer_went_off(self) -> None:
        self._due = False

    def flushed(self) -> list[Effect]:
        """A copy has just gone with every change: the timer :meth:`soon` set is not needed."""
        if not self._due:
            return []
        self._due = False
        return [CancelTimer(("ring", "backup"))]

    def send(self, me: Peer, holders: tuple[Peer, ...], links: tuple[Peer, ...]) -> list[Effect]:
        """A new copy to ``holders``: the changes if they got the last one, else the whole
        state; the holders that are no longer hear so."""
        self.version += 1
        if not holders and not self.holders:  # (alone: a copy to no one)
            self._changed = {}
            self._whole = False
            return []
        copy: BackupCopy | BackupDelta
        if holders == self.holders and not self._whole:
            changed = self._changed
            entries = {k: v for k, v in changed.items() if v is not _GONE}
            deleted = tuple(k for k, v in changed.items() if v is _GONE)
            copy = BackupDelta(me, self.version, self.version - 1, entries, deleted, links, holders)
        else:
            copy = BackupCopy(me, self.version, dict(self.state), links, holders)
        self._changed = {}
        self._whole = False
        out: list[Effect] = [Send(h.addr, copy) for h in holders]
        gone = [h for h in self.holders if h not in holders]
        out += [Send(h.addr, BackupCopy(me, self.version, None, ())) for h in gone]
        self.holders = holders
        return out

    def on_ack(self, msg: BackupAck) -> None:
        self._acked[msg.holder.id] = max(msg.version, self._acked.get(msg.holder.id, 0))

    def confirmed(self) -> int:
        """The latest version every current holder has acknowledged (ours if there is none)."""
        if not self.holders:
            return self.version
        return min(self._acked.get(h.id, 0) for h in self.holders)

    def resend(self, me: Peer, holder: Peer, links: tuple[Peer, ...]) -> list[Effect]:
        """``holder`` missed a delta: the whole state again (if it still is a holder)."""
        if holder not in self.holders:
            return []
        return [Send(holder.addr, BackupCopy(me, self.version, dict(self.state), links, self.holders))]

    # -- the copies we hold

    def on_copy(self, msg: BackupCopy, *, addr: int) -> bool:
        """A whole copy of ``msg.owner``'s state (none: we hold it no more); ``addr`` is ours.
        Whether we hold it now (to be acknowledged)."""
        held = self.held.get(msg.owner.id)
        if held is not None and held.version > msg.version:
            return False
        if msg.state is None:
            self.held.pop(msg.owner.id, None)
            return False
        rank = next((i for i, h in enumerate(msg.holders) if h.addr == addr), 0)
        state = dict(msg.state)  # (ours: deltas change it in place)
        self.held[msg.owner.id] = Held(msg.version, state, msg.links, msg.holders, rank)
        return True

    def on_delta(self, src: int, msg: BackupDelta, *, me: Peer) -> list[Effect]:
        """The changes of ``msg.owner``'s state since the copy we have (a resync if we lack it)."""
        held = self.held.get(msg.owner.id)
        if held is None or held.version != msg.base:
            if held is None or held.version < msg.version:  # a delta missed (or a copy
                return [Send(src, BackupResync(me))]  # not come yet): ask for all
            return []  # an old delta, overtaken
        state = held.state
        state.update(msg.entries)
        for key in msg.deleted:
            state.pop(key, None)
        rank = next((i for i, h in enumerate(msg.holders) if h.addr == me.addr), 0)
        self.held[msg.owner.id] = Held(msg.version, state, msg.links, msg.holders, rank)
        return [Send(src, BackupAck(me, msg.version))]

    def load_of(self, owner: int) -> int | None:
        """How many entries ``owner``'s state has, as its copy with us says (None: no copy)."""
        held = self.held.get(owner)
        return None if held is None else len(held.state)

    # -- takeover and sharing

    def take_over(self, owner: Peer, *, dead: Collection[int], force: bool = False) -> Held | None:
        """``owner`` died: take its copy into our state if no holder before us is alive (as
        far as ``dead`` says). The copy taken over, if it was. If one is, the copy is kept
        (an *orphan*) until that holder is found dead too (the two died together, and we
        heard of the owner first: :meth:`orphans_due`) or tells us it took over
        (:meth:`drop`); dropped at once, the state would be lost with both."""
        held = self.held.get(owner.id)
        if held is None:
            return None
        if not force and any(h.id not in dead for h in held.holders[: held.rank]):
            self.orphans[owner.id] = owner
            return None
        del self.held[owner.id]
        self.orphans.pop(owner.id, None)
        self.orphan_rounds.pop(owner.id, None)
        self.absorb(held.state)
        return held

    def orphans_due(self, dead: Collection[int]) -> list[Peer]:
        """The orphans whose earlier holders are all dead now: ours to take over."""
        return [
            owner
            for owner in self.orphans.values()
            if owner.id in self.held
            and all(h.id in dead for h in self.held[owner.id].holders[: self.held[owner.id].rank])
        ]

    def orphans_waited(self, limit: int) -> list[Peer]:
        """A heartbeat round: the orphans no earlier holder has said it took over (its
        ``Redirect`` drops them, :meth:`drop`) for ``limit`` rounds, ours to take over. An
        earlier holder that never had the copy takes nothing over: a new member that joined
        next to the owner moments before, named first in the copy we have, while the owner's
        whole copy to it was on its way when both died (a campaign run: the owner's
        subscriptions served by nobody for 29 s, until that holder died too)."""
        due = []
        for oid, owner in list(self.orphans.items()):
            self.orphan_rounds[oid] = self.orphan_rounds.get(oid, 0) + 1
            if self.orphan_rounds[oid] >= limit and oid in self.held:
                due.append(owner)
        return due

    def drop(self, owner: int) -> None:
        """Another broker took ``owner``'s state over: our copy goes."""
        self.held.pop(owner, None)
        self.orphans.pop(owner, None)
        self.orphan_rounds.pop(owner, None)

    def absorb(self, entries: Mapping[Hashable, Any]) -> None:
        """Entries of another broker's state become ours (a takeover, a share)."""
        if self._keyed is not None:
            entries = {self._keyed(key): value for key, value in entries.items()}
        for key in entries:
            if key not in self.state:
                self._index(key)
        self.state.update(entries)
        self._whole = True
        self.foreign += 1

    def hand_over(self, keys: Iterable[Hashable]) -> dict[Hashable, Any]:
        """Take ``keys`` out of our state (those we have), to pass them on."""
        moved = {k: self.state.pop(k) for k in keys if k in self.state}
        for key in moved:
            self._unindex(key)
        self._whole = True
        self.foreign += 1
        return moved


def _keys(found: Hashable | set[Hashable] | None) -> set[Hashable]:
    """The keys an entry of :attr:`Backups.by_tag` holds (a copy)."""
    if found is None:
        return set()
    return set(found) if isinstance(found, set) else {found}
