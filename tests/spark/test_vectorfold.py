"""The numpy fold of plain aggregates against the event-by-event fold: same derived events, same state."""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path
from typing import Any

from flowbus.flow import FlowBuilder, Graph, load_spec, rewrite
from flowbus.flow.eventlog import order_key
from flowbus.flow.plan import plan
from flowbus.spark.state import GroupFolder

STOCKS = Path(__file__).resolve().parents[2] / "examples" / "stocks" / "flow.yaml"


def _folders(g: Graph) -> tuple[GroupFolder, GroupFolder]:
    (group,) = plan(rewrite(g)).groups
    vector = GroupFolder(rewrite(g), group)
    one_by_one = GroupFolder(rewrite(g), group)
    one_by_one.vectors = [None] * len(one_by_one.vectors)
    return vector, one_by_one


def _batches(rng: random.Random, n: int, size: int, make: Any) -> list[list[tuple[bytes, dict[str, Any]]]]:
    out = []
    for b in range(n):
        batch = [(order_key(b * size + i), make(rng)) for i in range(size)]
        rng.shuffle(batch)  # the fold sorts by _order
        out.append(batch)
    return out


def _same_over_batches(g: Graph, batches: list[list[tuple[bytes, dict[str, Any]]]]) -> int:
    vector, one_by_one = _folders(g)
    sv = so = None
    total = 0
    for batch in batches:
        sv, ov = vector.fold(sv, copy.deepcopy(batch))
        so, oo = one_by_one.fold(so, copy.deepcopy(batch))
        assert ov == oo
        assert sv == so
        total += len(ov)
    return total


def test_the_stock_groups_max_cur_is_folded_with_numpy_and_trend_event_by_event() -> None:
    vector, _ = _folders(load_spec(STOCKS))
    # max_cur is max and last; trend is no aggregate
    assert [v is not None for v in vector.vectors] == [True, False]
    rng = random.Random(5)
    # prices on a coarse grid: ties (no change of maxP, curP unchanged) happen often
    batches = _batches(rng, 4, 400, lambda r: {"name": "IBM", "price": round(r.uniform(50, 52), 1)})
    assert _same_over_batches(load_spec(STOCKS), batches) > 400


def _counted() -> Graph:
    b = FlowBuilder("counted").source("ticks", {"name": "str", "price": "float"})
    b.state("st", {"name": "str", "n": "int", "lo": "float"}, key="name",
            initial={"n": 0, "lo": 100})  # fmt: skip
    b.rules("st", key={"name": "name"}, rules=[
        {"when": "price < lo", "set": {"lo": "price", "n": "n + 1"}}, {"set": {"n": "n + 1"}},
    ])  # fmt: skip
    b.sink("out", {"name": "str", "price": "float"})
    return b.collapse("C", "ticks", "st", "st").expand("E", "st", "out", "st").build()


def test_count_and_min_agree_and_a_nan_or_a_missing_field_falls_back_to_the_event_fold() -> None:
    g = _counted()
    vector, _ = _folders(g)
    assert vector.vectors[0] is not None
    rng = random.Random(9)

    def tick(r: random.Random) -> dict[str, Any]:
        roll = r.random()
        if roll < 0.01:
            return {"name": "A", "price": math.nan}
        if roll < 0.02:
            return {"name": "A"}  # no price: the rules' guard is undefined
        return {"name": "A", "price": round(r.uniform(90, 110), 0)}

    def keyless(r: random.Random) -> dict[str, Any]:
        return {"price": 95.0} if r.random() < 0.02 else {"name": "A", "price": round(r.uniform(90, 110), 0)}

    clean = _batches(rng, 3, 300, lambda r: {"name": "A", "price": round(r.uniform(90, 110), 0)})
    # batches folded event by event (a NaN, a missing price, an event without its key: skipped),
    # then with numpy from the state they left
    batches = _batches(rng, 2, 300, tick) + _batches(rng, 1, 300, keyless) + clean
    assert _same_over_batches(g, batches) > 0
