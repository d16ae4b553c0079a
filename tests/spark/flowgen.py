"""Seeded random information flow graphs of selects, transforms and collapses, for engine equivalence.

One graph holds several disjoint components (so one Spark run checks them all).
Each component has sources, internal spaces (some of them publication and
subscription points), sinks fed by random selects and transforms, and a state
region: a space fed by transforms, a collapse with a rule set drawn from a
small library (sums, max-and-last, guarded updates), and two expand arcs -- one
with the collapse's own rules, one tracking a single component -- the second
followed by a select into an alarm sink.
"""

from __future__ import annotations

import random
from typing import Any

from flowbus.flow import FlowBuilder, Graph

TEXTS = ("a", "b", "IBM", "")
NUMBERS = (-2, -1, 0, 1, 2, 3, 0.5, 1.5, 1e16)
CODE = {"a": 1, "b": 2, "IBM": 3, "": 0}
TRADE = {"k": "str", "a": "float", "b": "float"}
TICK = {"k": "str", "v": "float"}

RULES: dict[str, list[dict[str, Any]]] = {
    "sum": [{"set": {"total": "total + v", "n": "n + 1"}}],
    "maxlast": [{"when": "v > top", "set": {"top": "v", "total": "v"}}, {"set": {"total": "v"}}],
    "guarded": [
        {"when": "v > 1", "set": {"n": "n + 1", "top": "v"}},
        {"when": "v < 0", "set": {"total": "total - v"}},
    ],
}


def _num(rng: random.Random, depth: int = 2) -> str:
    kind = rng.randrange(5 if depth > 0 else 2)
    if kind == 0:
        return rng.choice(["a", "b"])
    if kind == 1:
        return repr(rng.choice(NUMBERS))
    if kind == 2:
        return "code(k)"
    return f"({_num(rng, depth - 1)} {rng.choice('+-*/')} {_num(rng, depth - 1)})"


def _filter(rng: random.Random) -> str:
    literals = [
        f"a > {rng.choice(NUMBERS)!r}",
        f"b <= {rng.choice(NUMBERS)!r}",
        f'k = "{rng.choice(TEXTS)}"',
        f'k != "{rng.choice(TEXTS)}"',
        f"a * b >= {rng.choice(NUMBERS)!r}",
        'k prefix "I"',
        f"code(k) > {rng.choice([0, 1, 2])}",
    ]
    conj = lambda: " & ".join(rng.sample(literals, rng.randint(1, 2)))  # noqa: E731
    return " | ".join(f"({conj()})" for _ in range(rng.randint(1, 2)))


def _stateless(rng: random.Random, b: FlowBuilder, src: str, dst: str, arc: str) -> None:
    if rng.random() < 0.5:
        b.select(arc, src, dst, _filter(rng))
    else:
        b.transform(arc, src, dst, {"k": "k" if rng.random() < 0.8 else f'"{rng.choice(TEXTS)}"',
                                    "a": _num(rng), "b": _num(rng)})  # fmt: skip


def component(rng: random.Random, b: FlowBuilder, p: str) -> None:
    """One component, its names prefixed by ``p``."""
    spaces = []
    for i in range(rng.randint(1, 2)):
        b.source(f"{p}src{i}", TRADE)
        spaces.append(f"{p}src{i}")
    arc = 0
    for i in range(rng.randint(0, 2)):
        name = f"{p}mid{i}"
        b.events(name, TRADE, publish=rng.random() < 0.5, subscribe=rng.random() < 0.5)
        for parent in rng.sample(spaces, rng.randint(1, len(spaces))):
            arc += 1
            _stateless(rng, b, parent, name, f"{p}t{arc}")
        spaces.append(name)
    for i in range(rng.randint(1, 2)):
        name = f"{p}sink{i}"
        b.sink(name, TRADE)
        for parent in rng.sample(spaces, rng.randint(1, min(2, len(spaces)))):
            arc += 1
            _stateless(rng, b, parent, name, f"{p}t{arc}")
    # the state region
    b.events(f"{p}ticks", TICK)
    for parent in rng.sample(spaces, rng.randint(1, min(2, len(spaces)))):
        arc += 1
        b.transform(f"{p}t{arc}", parent, f"{p}ticks", {"k": "k", "v": _num(rng)})
    b.state(f"{p}st", {"k": "str", "total": "float", "top": "float", "n": "int"}, key="k",
            initial={"total": 0, "top": 0, "n": 0})  # fmt: skip
    b.rules(f"{p}fold", key={"k": "k"}, rules=RULES[rng.choice(sorted(RULES))])
    b.collapse(f"{p}C", f"{p}ticks", f"{p}st", f"{p}fold")
    b.sink(f"{p}changes", TICK)
    b.expand(f"{p}E1", f"{p}st", f"{p}changes", f"{p}fold")
    b.events(f"{p}tops", {"k": "str", "top": "float"})
    b.expand(f"{p}E2", f"{p}st", f"{p}tops", {"key": {"k": "k"}, "rules": [{"set": {"top": "event.top"}}]})
    b.sink(f"{p}alarms", {"k": "str", "top": "float"})
    b.select(f"{p}S", f"{p}tops", f"{p}alarms", "top > 1")


def random_flow(seed: int, components: int = 4) -> Graph:
    rng = random.Random(seed)
    b = FlowBuilder(f"random{seed}").lookup("code", CODE)
    for c in range(components):
        component(rng, b, f"c{c}_")
    return b.build()


def random_events(g: Graph, seed: int, n: int) -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(seed)
    points = [s.name for s in g.spaces if getattr(s, "is_publication", False)]
    out = []
    for _ in range(n):
        point = rng.choice(points)
        out.append((point, {"k": rng.choice(TEXTS), "a": rng.choice(NUMBERS), "b": rng.choice(NUMBERS)}))
    return out
