"""Broker trees for the content-routing tests: adjacency as ``{broker: neighbours}``."""

from __future__ import annotations

import random

Adj = dict[int, set[int]]


def random_tree(n: int, rng: random.Random) -> Adj:
    """A random tree on brokers 0..n-1 (each joins a random earlier one)."""
    adj: Adj = {i: set() for i in range(n)}
    for i in range(1, n):
        p = rng.randrange(i)
        adj[i].add(p)
        adj[p].add(i)
    return adj


def path(n: int) -> Adj:
    """Brokers 0..n-1 in a line."""
    return {i: {j for j in (i - 1, i + 1) if 0 <= j < n} for i in range(n)}


def split_and_rejoin(adj: Adj, rng: random.Random) -> tuple[tuple[int, int], tuple[int, int]]:
    """A tree edge to cut and a new edge joining the two halves again."""
    u = rng.choice([b for b in adj if adj[b]])
    v = rng.choice(sorted(adj[u]))
    side, todo = {u}, [u]
    while todo:
        b = todo.pop()
        for c in adj[b]:
            if c not in side and (b, c) != (u, v):
                side.add(c)
                todo.append(c)
    while True:
        a, c = rng.choice(sorted(side)), rng.choice(sorted(set(adj) - side))
        if (a, c) != (u, v):
            return (u, v), (a, c)
