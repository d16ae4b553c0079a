"""The indexed content router against the scanning one it replaced: the same random sequences
of subscriptions, messages, topology changes and events give the same effects and states;
``route_batch`` is routing each event in turn; the covering index's candidates hold every
cover; the route index answers as the filters do, in insertion order."""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

import pytest

from flowbus.core import Deliver, Effect, Send
from flowbus.errors import ProtocolError
from flowbus.filters import Filter, parse
from flowbus.routing import cbr_index
from flowbus.routing.cbr import (
    ContentRouter,
    Origin,
    Publish,
    RoutingState,
    Subscribe,
    Unsubscribe,
    _check_origin,
)
from flowbus.routing.cbr_index import CoverIndex, RouteIndex, shape
from flowbus.routing.memo import compiled, covers

# ------------------------------------------------------------- the reference (old) router


def _okey(o: Origin) -> tuple[int, str]:
    return (o[0], repr(o[1]))


def _dominates(a: Origin, fa: Filter, b: Origin, fb: Filter) -> bool:
    """``a`` makes ``b`` unnecessary: it covers it, strictly or with a smaller origin."""
    return covers(fa, fb) and (not covers(fb, fa) or _okey(a) < _okey(b))


def _roots(entries: Iterable[tuple[Origin, Filter]]) -> dict[Origin, Filter]:
    """The entries no other entry dominates (the maximal ones: domination is a strict order)."""
    roots: dict[Origin, Filter] = {}
    for o, f in entries:
        if not any(_dominates(r, g, o, f) for r, g in roots.items()):
            for r in [r for r, g in roots.items() if _dominates(o, f, r, g)]:
                del roots[r]
            roots[o] = f
    return roots


class ReferenceRouter:
    """``flowbus.routing.cbr.ContentRouter`` before its indexes, unchanged but for its name
    (and the withdrawal riding on the last of a change's additions, as the router's now)."""

    __slots__ = (
        "_dirs",
        "_former",
        "_neighbours",
        "_seen",
        "_sent",
        "_seq",
        "_table",
        "broker",
        "covering",
        "dropped",
    )

    def __init__(self, broker: int, neighbours: Iterable[int], *, covering: bool = True) -> None:
        if type(broker) is not int:
            raise ProtocolError(f"ContentRouter: a broker id is an int, got {broker!r}")
        self.broker = broker
        self.covering = covering
        self.dropped = 0  # messages from former neighbours, ignored
        self._neighbours: set[int] = set()
        self._former: set[int] = set()
        # direction -> origin -> filter (received), and origin -> direction -> filter
        self._table: dict[int, dict[Origin, Filter]] = {broker: {}}
        self._dirs: dict[Origin, dict[int, Filter]] = {}
        self._sent: dict[int, dict[Origin, Filter]] = {}  # neighbour -> forwarded roots
        self._seen: dict[int, dict[Origin, int]] = {}  # neighbour -> origin -> last seq
        self._seq = 0
        self._add_neighbours(self._checked(neighbours))

    # -- local calls

    @property
    def neighbours(self) -> frozenset[int]:
        return frozenset(self._neighbours)

    @property
    def former(self) -> frozenset[int]:
        """Brokers that were neighbours once and are not any more."""
        return frozenset(self._former - self._neighbours)

    def subscribe(self, sub_id: Hashable, filt: Filter) -> list[Effect]:
        if not isinstance(filt, Filter):
            raise ProtocolError(f"broker {self.broker}: subscribe needs a Filter, got {filt!r}")
        if (self.broker, sub_id) in self._table[self.broker]:
            raise ProtocolError(f"broker {self.broker}: subscription {sub_id!r} exists already")
        return self._set(self.broker, (self.broker, sub_id), filt)

    def unsubscribe(self, sub_id: Hashable) -> list[Effect]:
        if (self.broker, sub_id) not in self._table[self.broker]:
            raise ProtocolError(f"broker {self.broker}: no subscription {sub_id!r}")
        return self._set(self.broker, (self.broker, sub_id), None)

    def publish(self, event: Mapping[str, Any]) -> list[Effect]:
        return self._route(event, self.broker)

    def set_neighbours(
        self, new: Iterable[int], *, handover: Mapping[int, int] | None = None
    ) -> list[Effect]:
        """Change the broker's links: drop what removed neighbours sent, send added ones
        every root of their candidates.

        ``handover`` maps a removed neighbour to the added one that replaces it (a dead
        broker's place in the tree, taken by the broker beyond it). What came from the
        removed one is kept as coming from its replacement, not withdrawn, so routing goes
        on while the replacement's own subscriptions arrive (make before break); what the
        replacement never sends (the dead broker's own subscriptions) stays in its direction
        until a routing message replaces or withdraws it (their taker's, once it adopted them)."""
        wanted = self._checked(new)
        out: list[Effect] = []
        for r, h in sorted((handover or {}).items()):
            if r in self._neighbours and r not in wanted and h in wanted and h not in self._neighbours:
                self._move(r, h)
        for r in sorted(self._neighbours - wanted):
            self._neighbours.discard(r)
            self._former.add(r)
            del self._sent[r], self._seen[r]
            for o in list(self._table[r]):
                out.extend(self._set(r, o, None))
            del self._table[r]
        out.extend(self._add_neighbours(wanted - self._neighbours))
        return out

    # -- the driver's entry point

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        cls = msg.__class__
        if cls is not Publish and cls is not Subscribe and cls is not Unsubscribe:
            raise ProtocolError(f"broker {self.broker}: unknown message {msg!r}")
        if src not in self._neighbours:
            if src in self._former:
                self.dropped += 1
                return []
            raise ProtocolError(f"broker {self.broker}: {cls.__name__} from {src}, not a neighbour")
        if cls is Publish:
            return self._route(msg.event, src)
        out = self._receive(src, msg.origin, msg.filter if cls is Subscribe else None, msg.seq)
        if cls is Subscribe:  # the covered ones go after their cover came: nothing re-exposed
            for w in msg.withdraw:
                out.extend(self._receive(src, w, None, msg.seq))
        return out

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        raise ProtocolError(f"broker {self.broker}: no timer {key!r} (the router sets none)")

    # -- inspection (tests, experiments)

    def table_size(self) -> dict[int, int]:
        """Subscriptions received per direction (the broker's own id: local ones)."""
        return {d: len(t) for d, t in self._table.items()}

    def forwarded_size(self) -> dict[int, int]:
        """Subscriptions forwarded to (and held by) each neighbour."""
        return {m: len(s) for m, s in self._sent.items()}

    def routing_state(self) -> RoutingState:
        tables = {d: dict(t) for d, t in self._table.items() if t}
        sent = {m: dict(s) for m, s in self._sent.items() if s}
        return tables, sent

    # -- transitions

    def _checked(self, neighbours: Iterable[int]) -> set[int]:
        out = set()
        for n in neighbours:
            if type(n) is not int or n == self.broker:
                raise ProtocolError(f"broker {self.broker}: bad neighbour {n!r}")
            out.add(n)
        return out

    def adopt(self, origin: Origin, filt: Filter) -> list[Effect]:
        """Serve another broker's subscription here, under its own origin (a dead broker's,
        taken over): the tables elsewhere stay valid, only its direction changes."""
        _check_origin(origin, "adopt")
        out = self._set(self.broker, origin, filt)
        for d in sorted(self._dirs.get(origin, {})):
            if d != self.broker:
                out.extend(self._set(d, origin, None))
        return out

    def received_from(self, neighbour: int) -> dict[Origin, Filter]:
        """The subscriptions that came from ``neighbour`` (a copy)."""
        return dict(self._table.get(neighbour, {}))

    def directions(self, origin: Origin) -> frozenset[int]:
        """The directions ``origin`` comes from here (the broker's own id: local)."""
        return frozenset(self._dirs.get(origin, {}))

    def drop(self, origin: Origin) -> list[Effect]:
        """Stop serving a local (own or adopted) subscription."""
        if origin not in self._table[self.broker]:
            raise ProtocolError(f"broker {self.broker}: no local subscription {origin!r}")
        return self._set(self.broker, origin, None)

    def _move(self, old: int, new: int) -> None:
        """Direction ``old`` becomes direction ``new`` (see :meth:`set_neighbours`)."""
        table = self._table.pop(old)
        for o in table:
            dirs = self._dirs[o]
            dirs[new] = dirs.pop(old)
        self._table[new] = table
        self._neighbours.discard(old)
        self._former.add(old)
        del self._sent[old], self._seen[old]

    def _add_neighbours(self, added: Iterable[int]) -> list[Effect]:
        out: list[Effect] = []
        for a in sorted(added):
            self._neighbours.add(a)
            self._former.discard(a)
            self._table.setdefault(a, {})
            self._seen[a] = {}
            cands = [(o, f) for o in self._dirs if (f := self._cand(a, o)) is not None]
            self._sent[a] = roots = _roots(cands) if self.covering else dict(cands)
            out.extend(Send(a, Subscribe(o, f, self._next())) for o, f in roots.items())
        return out

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _route(self, event: Mapping[str, Any], src: int) -> list[Effect]:
        local = self._table[self.broker]
        out: list[Effect] = [Deliver(o[1], event) for o, f in local.items() if compiled(f)(event)]
        msg: Publish | None = None
        for m in sorted(self._neighbours):
            if m != src and any(compiled(f)(event) for f in self._table[m].values()):
                msg = msg or Publish(event)
                out.append(Send(m, msg))
        return out

    def _receive(self, src: int, o: Origin, f: Filter | None, seq: int) -> list[Effect]:
        seen = self._seen[src]
        if seq <= seen.get(o, -1):
            return []  # overtaken by a newer message about the same origin
        seen[o] = seq
        return self._set(src, o, f)

    def _cand(self, m: int, o: Origin) -> Filter | None:
        """``o``'s filter as a candidate for neighbour ``m``: from its smallest direction
        other than ``m`` (on a settled tree an origin comes from one direction only)."""
        dirs = self._dirs.get(o)
        if not dirs:
            return None
        ds = [d for d in dirs if d != m]
        return dirs[min(ds)] if ds else None

    def _set(self, d: int, o: Origin, f: Filter | None) -> list[Effect]:
        """Direction ``d`` now sends ``o`` with filter ``f`` (None: no longer)."""
        others = sorted(m for m in self._neighbours if m != d)
        before = [self._cand(m, o) for m in others]
        dirs = self._dirs.setdefault(o, {})
        if f is None:
            self._table[d].pop(o, None)
            dirs.pop(d, None)
            if not dirs:
                del self._dirs[o]
        else:
            self._table[d][o] = f
            dirs[d] = f
        out: list[Effect] = []
        for m, old in zip(others, before, strict=True):
            new = self._cand(m, o)
            if old != new:
                out.extend(self._update(m, o, old, new))
        return out

    def _update(self, m: int, o: Origin, old: Filter | None, new: Filter | None) -> list[Effect]:
        """``o``'s candidate filter for ``m`` went from ``old`` to ``new``: keep the roots
        forwarded to ``m`` up to date and send the difference."""
        sent = self._sent[m]
        before = dict(sent)
        if not self.covering:
            if new is None:
                del sent[o]
            else:
                sent[o] = new
        else:
            if old is not None and sent.get(o) == old:
                del sent[o]
                sent.update(self._exposed(m, o, old))
            if new is not None and not any(_dominates(r, g, o, new) for r, g in sent.items()):
                for r in [r for r, g in sent.items() if _dominates(o, new, r, g)]:
                    del sent[r]
                sent[o] = new
        gone = tuple(r for r in before if r not in sent)
        added = [(r, g) for r, g in sent.items() if before.get(r) != g]
        if not added:
            return [Send(m, Unsubscribe(r, self._next())) for r in gone]
        *first, (r, g) = added  # (the withdrawal on the last addition, as the router's)
        out: list[Effect] = [Send(m, Subscribe(o, f, self._next())) for o, f in first]
        out.append(Send(m, Subscribe(r, g, self._next(), gone)))
        return out

    def _exposed(self, m: int, gone: Origin, f: Filter) -> dict[Origin, Filter]:
        """The candidates for ``m`` that the root (``gone``, ``f``) hid and that no remaining
        root dominates, reduced to their own roots (the new roots of ``m``)."""
        sent = self._sent[m]
        hidden: list[tuple[Origin, Filter]] = []
        for o in self._dirs:
            g = self._cand(m, o)
            if (
                g is not None
                and o != gone
                and o not in sent
                and _dominates(gone, f, o, g)
                and not any(_dominates(r, h, o, g) for r, h in sent.items())
            ):
                hidden.append((o, g))
        return _roots(hidden)


# ------------------------------------------------------------------ random filters, events

NUMS = ["0", "1", "2", "2.0", "3", "5", "5.5", "7"]
STRS = ['"a"', '"ab"', '"b"', '"c"']


def random_literal(rng: random.Random) -> str:
    a = rng.choice("xxyz")
    if a == "y":
        s, t = rng.choice(STRS), rng.choice(STRS)
        text = rng.choice(
            [f"y = {s}", f"y in {{{s}}}", f"y in {{{s}, {t}}}", f"y prefix {s}", f"y >= {s}", f"y < {s}"]
        )
        text = rng.choice([text, f"y != {s}", "exists y", f"y >= {s} & y <= {s}", f"y contains {s}"])
    elif a == "z":
        text = rng.choice(["z = true", "z = false", "z = 1", "z in {true}", "exists z", "z != true"])
    else:
        n, m = rng.choice(NUMS), rng.choice(NUMS)
        text = rng.choice(
            [f"x = {n}", f"x in {{{n}}}", f"x in {{{n}, {m}}}", f"x >= {n} & x <= {n}", f"x > {n}"]
        )
        text = rng.choice([text, f"x < {n}", f"x between {n} and {m}", f"x != {n}", f"x <= {m}"])
    return f"!({text})" if rng.random() < 0.08 else text


def random_filter(rng: random.Random) -> Filter:
    r = rng.random()
    if r < 0.02:
        return Filter.true()
    if r < 0.04:
        return Filter.false()
    if r < 0.06:
        return parse("x = 1 & x = 2")  # unsatisfiable
    conj = " & ".join(random_literal(rng) for _ in range(rng.randint(1, 3)))
    if rng.random() < 0.12:
        conj = f"({conj}) | ({' & '.join(random_literal(rng) for _ in range(rng.randint(1, 2)))})"
    return parse(conj)


def random_event(rng: random.Random) -> dict[str, Any]:
    e: dict[str, Any] = {"id": rng.randrange(1000)}
    if rng.random() < 0.85:
        e["x"] = rng.choice([0, 1, 2, 2.0, 3, 4, 5, 5.5, 6, 7, 8, True, "a"])
    if rng.random() < 0.8:
        e["y"] = rng.choice(["a", "ab", "abc", "b", "c", "d", 1, False])
    if rng.random() < 0.7:
        e["z"] = rng.choice([True, False, 1, 0, 2.0, "a"])
    return e


@pytest.fixture(params=["default", "tiny"])
def thresholds(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``tiny``: every table on a Matcher, flushed often, and the covering index always asked."""
    if request.param == "tiny":
        monkeypatch.setattr(cbr_index, "MATCHER_MIN", 2)
        monkeypatch.setattr(cbr_index, "FLUSH_MIN", 3)
        monkeypatch.setattr(CoverIndex, "SCAN_BELOW", 0)
    return str(request.param)


# --------------------------------------------------------------- the two routers in step


def reference_route_batch(r: ReferenceRouter, events: list[dict[str, Any]], src: int) -> list[Effect]:
    if src != r.broker and src not in r.neighbours:
        raise ProtocolError(f"broker {r.broker}: events from {src}, not a neighbour")
    return [e for event in events for e in r._route(event, src)]


def outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("ok", call())
    except ProtocolError as exc:
        return ("error", str(exc))


class Twin:
    """A new and a reference router given the same calls; every answer and state compared."""

    def __init__(self, broker: int, neighbours: Iterable[int], *, covering: bool = True) -> None:
        self.new = ContentRouter(broker, neighbours, covering=covering)
        self.ref = ReferenceRouter(broker, neighbours, covering=covering)

    def call(self, name: str, *args: Any, **kw: Any) -> Any:
        if name == "route_batch":
            got = outcome(lambda: self.new.route_batch(*args))
            want = outcome(lambda: reference_route_batch(self.ref, *args))
        else:
            got = outcome(lambda: getattr(self.new, name)(*args, **kw))
            want = outcome(lambda: getattr(self.ref, name)(*args, **kw))
        assert got == want, (name, args)
        self.check_state()
        return got

    def check_state(self) -> None:
        new, ref = self.new, self.ref
        assert new.routing_state() == ref.routing_state()
        # the same insertion orders, which later message orders depend on
        for m, sent in ref._sent.items():
            assert list(new._sent[m].map) == list(sent)
        assert list(new._dirs) == list(ref._dirs)
        for d, table in ref._table.items():
            assert list(new._table[d]) == list(table)
        assert (new.neighbours, new.former, new.dropped) == (ref.neighbours, ref.former, ref.dropped)


POOL = [1, 2, 3, 7, 9]
ME = 5


def random_origin(rng: random.Random) -> Origin:
    return (rng.randrange(10), rng.choice([rng.randrange(25), f"s{rng.randrange(5)}"]))


def play(twin: Twin, rng: random.Random, steps: int) -> None:
    """Random calls: local and remote subscriptions (stale, withdrawing, re-using origins),
    events one by one and in batches, link changes (with hand-overs), adoptions."""
    seq = dict.fromkeys(POOL, 0)
    for _ in range(steps):
        r = rng.random()
        nbrs = sorted(twin.ref.neighbours)
        local = list(twin.ref._table[ME])
        if r < 0.22:
            sub: Hashable = rng.choice([rng.randrange(40), f"t{rng.randrange(6)}"])
            twin.call("subscribe", sub, random_filter(rng))
        elif r < 0.30:
            twin.call("unsubscribe", rng.choice([rng.randrange(40), f"t{rng.randrange(6)}"]))
        elif r < 0.58 and nbrs:
            src = rng.choice(nbrs) if rng.random() < 0.95 else rng.choice(POOL)
            seq[src] += 1
            s = seq[src] if rng.random() < 0.9 else rng.randrange(seq[src])  # some overtaken
            o = random_origin(rng)
            if rng.random() < 0.7:
                withdraw = tuple({w for w in (random_origin(rng) for _ in range(rng.randrange(3))) if w != o})
                msg: Any = Subscribe(o, random_filter(rng), s, withdraw)
            else:
                known = list(twin.ref._table.get(src, {}))
                msg = Unsubscribe(rng.choice(known) if known and rng.random() < 0.8 else o, s)
            if src in twin.ref.neighbours or src in twin.ref.former:
                twin.call("on_message", src, msg, 0.0)
        elif r < 0.66:
            events = [random_event(rng) for _ in range(rng.randrange(1, 12))]
            src = rng.choice([ME, *nbrs])
            twin.call("route_batch", events, src)
        elif r < 0.70:
            twin.call("publish", random_event(rng))
        elif r < 0.74 and nbrs:
            twin.call("on_message", rng.choice(nbrs), Publish(random_event(rng)), 0.0)
        elif r < 0.77:
            new = set(rng.sample(POOL, rng.randrange(len(POOL) + 1)))
            gone = sorted(set(nbrs) - new)
            added = sorted(new - set(nbrs))
            handover = dict(zip(gone, added, strict=False)) if rng.random() < 0.5 else None
            twin.call("set_neighbours", new, handover=handover)
        elif r < 0.90:
            twin.call("adopt", random_origin(rng), random_filter(rng))
        elif local:
            twin.call("drop", rng.choice(local) if rng.random() < 0.9 else random_origin(rng))


# -------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("seed", range(6))
def test_same_effects_as_the_scanning_router(seed: int, thresholds: str) -> None:
    rng = random.Random(seed)
    twin = Twin(ME, rng.sample(POOL, 2))
    play(twin, rng, 500)
    events = [random_event(rng) for _ in range(200)]
    for src in [ME, *sorted(twin.ref.neighbours)]:
        twin.call("route_batch", events, src)


@pytest.mark.parametrize("seed", range(2))
def test_same_effects_without_covering(seed: int, thresholds: str) -> None:
    rng = random.Random(50 + seed)
    twin = Twin(ME, rng.sample(POOL, 3), covering=False)
    play(twin, rng, 300)


def test_same_effects_at_a_larger_table(thresholds: str) -> None:
    """Broker-like filters (an equality and ranges), many roots covering one another."""
    rng = random.Random(9)
    twin = Twin(ME, [1, 2])
    for i in range(300):
        parts = [f'sym = "S{rng.randrange(6)}"']
        for attr in rng.sample(["p", "q", "ex"], rng.randint(1, 3)):
            if attr == "ex":
                parts.append(rng.choice(['ex = "A"', 'ex = "B"', 'ex in {"A", "B"}']))
            else:
                lo = rng.randrange(0, 80)
                parts.append(f"{attr} >= {lo} & {attr} < {lo + rng.randrange(5, 60)}")
        f = parse(" & ".join(parts))
        if rng.random() < 0.6:
            twin.call("subscribe", i, f)
        else:
            twin.call("on_message", rng.choice([1, 2]), Subscribe((rng.choice([1, 2]), i), f, i + 1), 0.0)
        if rng.random() < 0.15:
            local = list(twin.ref._table[ME])
            if local:
                twin.call("drop", rng.choice(local))
    events = [
        {"sym": f"S{rng.randrange(6)}", "p": rng.randrange(100), "q": rng.randrange(100), "ex": ex}
        for ex in rng.choices("AB", k=300)
    ]
    for src in (ME, 1, 2):
        twin.call("route_batch", events, src)
    twin.call("set_neighbours", {1, 3})  # 3 gets every root; 2's subscriptions withdrawn


@pytest.mark.parametrize("seed", range(3))
def test_route_batch_is_routing_each_event_in_turn(seed: int, thresholds: str) -> None:
    rng = random.Random(100 + seed)
    twin = Twin(ME, rng.sample(POOL, 3))
    play(twin, rng, 250)
    r = twin.new
    events = [random_event(rng) for _ in range(300)]
    for src in [ME, *sorted(r.neighbours)]:
        batch = r.route_batch(events, src)
        one_by_one = [
            e
            for event in events
            for e in (r.publish(event) if src == ME else r.on_message(src, Publish(event), 0.0))
        ]
        assert batch == one_by_one
        # one Publish per event, shared by its sends, after its deliveries
        last: dict[int, Any] = {}
        for e in batch:
            if isinstance(e, Send):
                assert isinstance(e.msg, Publish) and e.dst != src
                last.setdefault(id(e.msg.event), e.msg)
                assert last[id(e.msg.event)] is e.msg
    assert r.route_batch([], ME) == []
    with pytest.raises(ProtocolError, match="not a neighbour"):
        r.route_batch(events[:1], 99)


def test_deliveries_follow_subscription_order(thresholds: str) -> None:
    r = ContentRouter(1, [])
    for i, sub in enumerate(["c", "a", 7, "b"] * 10):
        r.subscribe((sub, i), parse("x > 1"))
    r.unsubscribe(("a", 1))
    r.subscribe(("a", 1), parse("x > 0"))  # re-subscribed: now the last
    r.adopt((9, "z"), parse("x > 0"))
    out = r.route_batch([{"x": 5}, {"x": 0.5}], 1)
    subs = [e.sub for e in out if isinstance(e, Deliver)]
    first = [(s, i) for i, s in enumerate(["c", "a", 7, "b"] * 10) if i != 1]
    assert subs == [*first, ("a", 1), "z", ("a", 1), "z"]


# ------------------------------------------------------------------------ the covering index


def test_shape_points_are_semantic() -> None:
    p = shape(parse("x = 5")).points
    assert p == shape(parse("x = 5.0")).points == shape(parse("x in {5}")).points
    assert p == shape(parse("x >= 5 & x <= 5 & y > 1")).points - shape(parse("y > 1")).points
    assert shape(parse("x = true")).points != shape(parse("x = 1")).points
    assert not shape(parse("x in {1, 2}")).points and not shape(parse("x > 1")).points
    assert shape(parse("x = 1 & x = 2")).unsatisfiable and shape(Filter.false()).unsatisfiable
    assert not shape(parse("x = 1 | y = 2")).single
    assert shape(parse("x = 1 & y = 2 | x = 1 & y > 3")).points == {("x", (1, 1, ""))}


@pytest.mark.parametrize("seed", range(5))
def test_cover_index_candidates_hold_every_cover(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CoverIndex, "SCAN_BELOW", 0)
    rng = random.Random(300 + seed)
    index = CoverIndex()
    live: dict[Origin, Filter] = {}
    narrowed = 0
    for step in range(400):
        if live and rng.random() < 0.3:
            o = rng.choice(list(live))
            del live[o]
            index.remove(o)
        else:
            o = random_origin(rng)
            live[o] = random_filter(rng)
            index.add(o, live[o])
        assert len(index) == len(live) and dict(index.items()) == live
        if step % 7 == 0:
            for q in (random_filter(rng) for _ in range(6)):
                above = index.covered_by(q)
                below = index.covering(q)
                for got in (above, below):
                    assert len({o for o, _ in got}) == len(got) and all(live[o] == f for o, f in got)
                assert {(o, f) for o, f in live.items() if covers(f, q)} <= set(above)
                assert {(o, f) for o, f in live.items() if covers(q, f)} <= set(below)
                narrowed += len(above) < len(live)
    assert narrowed  # the index does narrow


def test_cover_index_narrows_by_points_and_hulls() -> None:
    index = CoverIndex()
    for i in range(200):
        index.add((0, i), parse(f'sym = "S{i % 10}" & p >= {i} & p <= {i + 20}'))
    got = index.covered_by(parse('sym = "S3" & p >= 105 & p <= 110'))
    assert sorted(o[1] for o, _ in got) == [93, 103]
    got = index.covering(parse('sym = "S3" & p >= 90 & p <= 130'))
    assert sorted(o[1] for o, _ in got) == [93, 103]
    assert index.covered_by(parse('sym = "S77"')) == []
    assert len(index.covering(parse("p > 0.5"))) == 199  # no point: every bucket looked at
    strings = CoverIndex()
    for i, text in enumerate(['ex in {"A", "B"}', 'ex = "A"', 'ex in {"B", "C"}', 'ex >= "B"'] * 5):
        strings.add((1, i), parse(f"{text} & p > {i}"))
    got = [f.to_text() for _, f in strings.covered_by(parse('ex = "D" & p > 50'))]
    assert len(got) == 5 and all(t.startswith('ex >= "B"') for t in got)  # (they do cover it)
    got = [f.to_text() for _, f in strings.covered_by(parse('ex = "B" & p > 50'))]
    assert len(got) == 15 and not any(t.startswith('ex = "A"') for t in got)
    assert len(strings.covering(parse('ex in {"A", "B", "Z"} & p > 15'))) == 2


# -------------------------------------------------------------------------- the route index


@pytest.mark.parametrize("seed", range(4))
def test_route_index_answers_as_the_filters_in_insertion_order(seed: int, thresholds: str) -> None:
    rng = random.Random(400 + seed)
    index = RouteIndex()
    mirror: dict[Origin, Filter] = {}
    for step in range(300):
        r = rng.random()
        if mirror and r < 0.25:
            o = rng.choice(list(mirror))
            del mirror[o]
            index.remove(o)
        elif mirror and r < 0.4:
            o = rng.choice(list(mirror))  # a new filter, same place
            mirror[o] = random_filter(rng)
            index.put(o, mirror[o])
        else:
            o = random_origin(rng)
            mirror[o] = random_filter(rng)
            index.put(o, mirror[o])
        if step % 5 == 0:
            events = [random_event(rng) for _ in range(rng.randrange(1, 20))]
            want = [[o for o, f in mirror.items() if compiled(f)(e)] for e in events]
            assert index.match(events) == want
            assert index.any_match(events) == [bool(w) for w in want]
    assert len(index) == len(mirror)
    if thresholds == "tiny":
        assert index.uses_matcher


def test_cover_index_with_more_strings_than_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the 63 strings per attribute that get a bit, sets are told apart less, never wrongly."""
    monkeypatch.setattr(CoverIndex, "SCAN_BELOW", 0)
    rng = random.Random(7)

    def strings() -> str:
        return ", ".join(f'"v{rng.randrange(120)}"' for _ in range(rng.randint(1, 4)))

    def some_filter() -> Filter:
        one, low = f'w = "v{rng.randrange(120)}"', f'w >= "v{rng.randrange(9)}"'
        w = rng.choice([f"w in {{{strings()}}}", one, low])
        return parse(f"{w} & x > {rng.randrange(3)}" if rng.random() < 0.5 else w)

    index = CoverIndex()
    live: dict[Origin, Filter] = {}
    for i in range(400):
        live[(0, i)] = some_filter()
        index.add((0, i), live[(0, i)])
        if i % 20 == 0:
            for q in (some_filter() for _ in range(10)):
                assert {(o, f) for o, f in live.items() if covers(f, q)} <= set(index.covered_by(q))
                assert {(o, f) for o, f in live.items() if covers(q, f)} <= set(index.covering(q))
