"""Rule sets folded by numba kernels over Arrow columns against the interpreter's event-by-event fold."""

from __future__ import annotations

import math
import pickle
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from flowbus.flow import FlowBuilder, Graph, load_spec, rewrite
from flowbus.flow.eventlog import order_key
from flowbus.flow.plan import plan
from flowbus.flow.validate import bind_rules
from flowbus.spark.columnfold import ColumnFold
from flowbus.spark.groups import log_schema
from flowbus.spark.kernel import RuleKernel
from flowbus.spark.state import ArrowFold, GroupFolder

STOCKS = Path(__file__).resolve().parents[2] / "examples" / "stocks" / "flow.yaml"


class _Pair:
    """One group folded two ways: over columns with kernels (``fast``), and by the interpreter's code."""

    def __init__(self, g: Graph) -> None:
        g = rewrite(g)
        p = plan(g)
        (self.group,) = p.groups
        log = p.log(self.group.log_out)
        fields = [
            *log_schema(g, log).fields,
            StructField("_k0", StringType()),
            StructField("_state", BinaryType()),
        ]
        schema = to_arrow_schema(StructType(fields))
        self.fast = ArrowFold(g, self.group, log, schema, ["_k0"])
        self.slow = ArrowFold(g, self.group, log, schema, ["_k0"])
        self.slow._folder = GroupFolder(g, self.group)  # built without its column fold
        self.fast._folder = GroupFolder(g, self.group)
        columns = ColumnFold.of(g, self.group, log, self.fast._folder.folds, schema)
        assert columns is not None
        self.fast._columns = columns
        self.columnar = 0  # batches the fast side folded over columns
        fold = columns.fold

        def counted(stored: Any, events: pa.Table) -> Any:
            got = fold(stored, events)
            self.columnar += got is not None
            return got

        columns.fold = counted  # type: ignore[method-assign]
        self.blobs: dict[str, bytes | None] = {"fast": None, "slow": None}

    def batch(self, key: str, orders: list[bytes], events: list[dict[str, Any]]) -> int:
        """Fold one batch both ways; assert the same derived events and state; the number derived."""
        columns: dict[str, Any] = {"_order": pa.array(orders, pa.binary())}
        for n, kind in self.group_fields.items():
            columns[n] = pa.array([e.get(n) for e in events], kind)
        table = pa.table(columns)
        got = {}
        for side, fold in (("fast", self.fast), ("slow", self.slow)):
            blob = self.blobs[side]
            stored = pa.table({"_state": pa.array([blob] if blob is not None else [], pa.binary())})
            out = fold((pa.scalar(key),), table, stored)
            self.blobs[side] = out.column("_state")[-1].as_py()
            got[side] = out
        fast, slow = (got[s].slice(0, got[s].num_rows - 1).to_pylist() for s in ("fast", "slow"))
        assert repr(fast) == repr(sorted(slow, key=lambda r: r["_order"]))  # repr: NaN equals NaN
        fast_state, slow_state = (pickle.loads(self.blobs[s] or pickle.dumps(None)) for s in ("fast", "slow"))
        assert repr(fast_state) == repr(slow_state)
        return len(fast)

    @property
    def group_fields(self) -> dict[str, pa.DataType]:
        kinds = {str: pa.string(), int: pa.int64(), float: pa.float64()}
        space = self.fast.graph.event_space(self.group.space).schema
        return {n: kinds[k] for n, k in space.fields.items()}


def _shuffled(rng: random.Random, start: int, events: list[dict[str, Any]]) -> tuple[list[bytes], list[Any]]:
    rows = [(order_key(start + i, 0), e) for i, e in enumerate(events)]
    rng.shuffle(rows)  # the fold sorts by _order
    return [o for o, _ in rows], [e for _, e in rows]


def test_the_stock_groups_rule_sets_compile_and_fold_over_columns_as_the_interpreter_does() -> None:
    g = rewrite(load_spec(STOCKS))
    (group,) = plan(g).groups
    for arc in group.collapses:  # max_cur and trend
        assert RuleKernel.of(bind_rules(g, arc), g.state_space(arc.target).schema) is not None
    pair = _Pair(load_spec(STOCKS))
    rng = random.Random(4)
    derived = 0
    for b in range(4):
        # a coarse price grid: ties (no change), runs of drops (the drop_events expand), new maxima
        events = [{"name": "IBM", "price": round(rng.uniform(50, 52), 1)} for _ in range(300)]
        derived += pair.batch("IBM", *_shuffled(rng, b * 300, events))
    assert pair.columnar == 4
    assert derived > 600


def test_a_nan_an_int_past_2_53_or_a_missing_field_falls_back_to_the_interpreters_fold() -> None:
    b = FlowBuilder("counted").source("ticks", {"name": "str", "price": "float", "vol": "int"})
    b.state("st", {"name": "str", "n": "int", "lo": "float"}, key="name", initial={"n": 0, "lo": 100})
    b.rules("st", key={"name": "name"}, rules=[
        {"when": "price < lo", "set": {"lo": "price", "n": "n + vol"}}, {"set": {"n": "n + vol"}},
    ])  # fmt: skip
    b.sink("out", {"name": "str", "price": "float", "vol": "int"})
    pair = _Pair(b.collapse("C", "ticks", "st", "st").expand("E", "st", "out", "st").build())
    rng = random.Random(2)

    def ticks(odd: dict[str, Any] | None) -> list[dict[str, Any]]:
        out = [{"name": "A", "price": round(rng.uniform(90, 110), 0), "vol": 1} for _ in range(50)]
        if odd is not None:
            out[20] = {"name": "A", **odd}
        return out

    odd = [None, {"price": math.nan, "vol": 1}, {"price": 95.0}, {"price": 95.0, "vol": 2**60}, None]
    for i, o in enumerate(odd):
        pair.batch("A", *_shuffled(rng, i * 50, ticks(o)))
    assert pair.columnar == 1  # an n past 2**53 stays there: the last batch falls back too


def _random_rules(rng: random.Random) -> list[dict[str, Any]]:
    """Rules over components a, b (float), c (int) and fields x (float), y (int): comparisons,
    arithmetic with division (by zero: undefined), negations and disjunctions."""
    atoms = ["a", "b", "c", "x", "y", "0", "1", "2.5", "-1"]

    def expr(depth: int) -> str:
        if depth == 0 or rng.random() < 0.4:
            return rng.choice(atoms)
        return f"({expr(depth - 1)} {rng.choice('+-*/')} {expr(depth - 1)})"

    def guard() -> str:
        lits = [f"{expr(1)} {rng.choice(['=', '!=', '<', '<=', '>', '>='])} {expr(1)}" for _ in range(2)]
        lits = [f"!({x})" if rng.random() < 0.3 else x for x in lits]
        return f" {rng.choice(['&', '|'])} ".join(lits)

    rules = []
    for _ in range(rng.randrange(1, 4)):
        sets = {c: expr(2) for c in rng.sample(["a", "b"], rng.randrange(1, 3))}
        if rng.random() < 0.5:
            sets["c"] = rng.choice(["c + 1", "c + y", "c * y", "y"])
        rules.append({"when": guard(), "set": sets})
    rules.append({"set": {"a": "x", "c": "c + y"}})  # every field is read (what an expand needs)
    return rules


def test_random_numeric_rule_sets_fold_over_columns_as_the_interpreter_does() -> None:
    rng = random.Random(11)
    compiled = 0
    for case in range(6):
        b = FlowBuilder(f"r{case}").source("ev", {"name": "str", "x": "float", "y": "int"})
        b.state("st", {"name": "str", "a": "float", "b": "float", "c": "int"}, key="name",
                initial={"a": 0, "b": 1.5, "c": 0})  # fmt: skip
        b.rules("st", key={"name": "name"}, rules=_random_rules(rng))
        b.sink("out", {"name": "str", "x": "float", "y": "int"})
        pair = _Pair(b.collapse("C", "ev", "st", "st").expand("E", "st", "out", "st").build())
        for i in range(3):
            events = [
                {"name": "K", "x": rng.choice([0.0, 1.0, -2.5, 3.0, 0.5]), "y": rng.choice([0, 1, 2, -1])}
                for _ in range(40)
            ]
            pair.batch("K", *_shuffled(rng, i * 40, events))
        compiled += pair.columnar > 0
    assert compiled >= 4  # the others met an int past 2**53 (c * y) or a NaN


def test_a_partition_of_keys_is_folded_key_by_key_and_written_as_two_files(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from flowbus.flow.eventlog import arrow_schema
    from flowbus.spark.state import PartitionFold

    pair = _Pair(load_spec(STOCKS))
    g, log = pair.fast.graph, pair.fast.log
    rng = random.Random(5)
    names = ["IBM", "HP", "IBM", "SUN", "HP", "IBM"] * 40
    orders, events = _shuffled(rng, 0, [{"name": n, "price": round(rng.uniform(50, 52), 1)} for n in names])
    schema = pair.fast.out
    rows: dict[str, list[Any]] = {f.name: [None] * len(events) for f in schema}
    rows["_order"], rows["_k0"] = orders, [e["name"] for e in events]
    old = {"OLD": pickle.dumps(({}, {}))}  # a key with a state and no events: kept as it is
    for f in schema:
        rows[f.name] += ["OLD" if f.name == "_k0" else old["OLD"] if f.name == "_state" else None]
    for n in pair.group_fields:
        rows[n] = [e[n] for e in events] + [None]
    fields = [*schema, *(pa.field(n, t) for n, t in pair.group_fields.items())]
    table = pa.table({f.name: pa.array(rows[f.name], f.type) for f in fields})
    fold = PartitionFold(pair.slow, str(tmp_path / "log"), str(tmp_path / "state"), arrow_schema(g, log), 100)
    summary = fold.run(table.to_batches(max_chunksize=97), partition=3, attempt=7).to_pylist()
    derived = pq.read_table(tmp_path / "log" / "part-00003.parquet")
    state = pq.read_table(tmp_path / "state" / "part-00003.parquet").to_pylist()
    assert summary == [{"partition": 3, "derived": derived.num_rows, "keys": 4}]
    groups = pq.read_metadata(tmp_path / "log" / "part-00003.parquet").num_row_groups
    assert groups == -(-derived.num_rows // 100)
    by_key = {r["_k0"]: r["_state"] for r in state}
    assert by_key.pop("OLD") == old["OLD"] and not list((tmp_path / "log").glob(".*"))
    for key in ("IBM", "HP", "SUN"):  # each key as ArrowFold folds it alone
        mine = [i for i, e in enumerate(events) if e["name"] == key]
        alone = table.take(pa.array(mine))
        out = pair.fast((pa.scalar(key),), alone, pa.table({"_state": pa.array([], pa.binary())}))
        assert out.column("_state")[-1].as_py() == by_key[key]
        want = out.slice(0, out.num_rows - 1).select(derived.column_names).cast(derived.schema)
        got = [r for r in derived.to_pylist() if r["_order"] in set(want.column("_order").to_pylist())]
        assert got == want.to_pylist() and got
    assert derived.num_rows > 0 and derived.schema == arrow_schema(g, log)
