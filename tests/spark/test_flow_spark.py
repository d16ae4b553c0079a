"""The Spark engine against the reference interpreter: same events, same order, at every point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.spark.flowgen import random_events, random_flow

from flowbus.errors import FlowbusError, FlowError
from flowbus.flow import FlowBuilder, Graph, LocalRun, load_spec, rewrite
from flowbus.flow.eventlog import order_key
from flowbus.flow.generators import generate
from flowbus.flow.plan import INPUT, plan
from flowbus.spark.flow import GroupFolder, SparkFlow, fingerprint, read_matched, read_outputs

STOCKS = Path(__file__).resolve().parents[2] / "examples" / "stocks" / "flow.yaml"


def _local(g: Graph, events: list[tuple[str, dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    return {k: [dict(e) for e in v] for k, v in LocalRun(rewrite(g)).run(events).outputs.items()}


def _run(spark: Any, g: Graph, events: list[tuple[str, dict[str, Any]]], out: Path, **kw: Any) -> SparkFlow:
    flow = SparkFlow(spark, g, out, **kw)
    flow.ingest_generator(events, fingerprint="test")
    with flow:
        flow.start()
        flow.process_available()
    return flow


def _same(spark: Any, out: Path, expected: dict[str, list[dict[str, Any]]], sink: str = "parquet") -> None:
    for point, events in expected.items():
        got = read_outputs(spark, out, point, sink)  # type: ignore[arg-type]
        assert got == events, f"{point}: {len(got)} events, expected {len(events)}"


@pytest.fixture(scope="module")
def stocks() -> Graph:
    return load_spec(STOCKS)


def test_the_stock_example_delivers_what_the_interpreter_delivers(
    spark: Any, stocks: Graph, tmp_path: Path
) -> None:
    events = list(generate(stocks, events=1200, seed=3))
    flow = _run(spark, stocks, events, tmp_path, batch_events=600)
    expected = _local(stocks, events)
    assert set(expected) == {"combined.sub", "big_trades", "compressed", "alarms"}
    assert all(expected[p] for p in ("combined.sub", "big_trades", "compressed"))
    _same(spark, tmp_path, expected)
    assert flow.stats.events_in == 1200
    # one micro-batch per input file: two for the input log's delivery query
    assert sum(1 for r in flow.stats.reports if r.query == f"deliver {INPUT}") == 2
    # run again on the same directory: it resumes from the checkpoints, nothing is delivered twice
    again = _run(spark, stocks, events, tmp_path, batch_events=600)
    assert again.stats.batches == 0
    _same(spark, tmp_path, expected)
    with pytest.raises(FlowError, match="outputs of another input"):
        SparkFlow(spark, stocks, tmp_path).ingest_generator(iter(events), fingerprint="another")


def test_random_graphs_of_selects_transforms_and_collapses(spark: Any, tmp_path: Path) -> None:
    g = random_flow(seed=7, components=3)
    events = random_events(g, seed=7, n=600)
    expected = _local(g, events)
    assert sum(len(v) for v in expected.values()) > 300
    _run(spark, g, events, tmp_path, batch_events=300, sink="jsonl")
    _same(spark, tmp_path, expected, sink="jsonl")


def test_plain_aggregates_fold_in_spark_and_expand_per_micro_batch(
    spark: Any, stocks: Graph, tmp_path: Path
) -> None:
    events = list(generate(stocks, events=600, seed=11))
    flow = _run(spark, stocks, events, tmp_path, batch_events=300, collapse="aggregate")
    assert set(flow.aggregates) == {"C4"}  # max_cur is max and last; trend is no aggregate
    assert [(g.name, g.aggregate) for g in flow.plan.groups] == [("g0", True), ("g1", False)]
    # the reference: the subscriber of E4 takes, after each micro-batch, the shortest sequence per key
    run = LocalRun(rewrite(stocks))
    run.disconnect("E4")
    for i in range(0, len(events), 300):
        run.run(events[i : i + 300])
        run.reconnect("E4")
        run.disconnect("E4")

    def per_key(evs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for e in evs:
            out.setdefault(e["name"], []).append(dict(e))
        return out

    compressed = read_outputs(spark, tmp_path, "compressed")
    assert per_key(compressed) == per_key(run.outputs["compressed"])
    assert len(compressed) < len(_local(stocks, events)["compressed"])  # compressed per micro-batch
    assert read_outputs(spark, tmp_path, "alarms") == [dict(e) for e in run.outputs["alarms"]]


def _totals() -> Graph:
    """A sum per key, expanded by the same rules: the events a subscriber needs are the
    differences of the totals, which no row holds."""
    b = FlowBuilder("totals").source("adds", {"k": "str", "v": "int"}).sink("out", {"k": "str", "v": "int"})
    b.state("sums", {"k": "str", "t": "int"}, key="k", initial={"t": 0})
    b.rules("sum", key={"k": "k"}, rules=[{"set": {"t": "t + v"}}])
    return b.collapse("C", "adds", "sums", "sum").expand("E", "sums", "out", "sum").build()


def test_a_summing_collapse_replayed_by_its_expand_keeps_its_events(spark: Any, tmp_path: Path) -> None:
    """In aggregate mode such a collapse runs in transformWithState: the per-micro-batch totals
    alone cannot be expanded (from t = 3 to t = 10 takes an event of 7)."""
    g = _totals()
    events = [("adds", {"k": f"k{i % 3}", "v": (i * 7) % 11 + 1}) for i in range(120)]
    flow = _run(spark, g, events, tmp_path, batch_events=40, collapse="aggregate")
    assert flow.aggregates == {} and not any(group.aggregate for group in flow.plan.groups)
    _same(spark, tmp_path, _local(g, events))


def _subscriptions(n: int) -> Graph:
    b = FlowBuilder("many").source("trades", {"sym": "str", "price": "float"})
    for i in range(n):
        b.sink(f"sub{i}", {"sym": "str", "price": "float"})
        b.select(f"s{i}", "trades", f"sub{i}", f'sym = "S{i % 7}" & price > {i % 50}')
    return b.build()


def test_many_subscriptions_go_through_the_broadcast_matcher(spark: Any, tmp_path: Path) -> None:
    g = _subscriptions(80)
    events = [("trades", {"sym": f"S{i % 9}", "price": float(i % 60)}) for i in range(300)]
    flow = SparkFlow(spark, g, tmp_path, batch_events=150, matcher_min=64)
    assert "trades" in flow._matched  # no Column OR: the matcher serves the 80 routes
    flow.ingest_generator(events, fingerprint="m")
    with flow:
        flow.start()
        flow.process_available()
        expected = _local(g, events)
        assert read_matched(spark, tmp_path, "trades") == {k: v for k, v in expected.items() if v}
        # subscriptions change while the query runs: the next micro-batch uses a new broadcast
        fewer = [r for r in rewrite(g).arcs if getattr(r, "source", None) == "trades"][:3]
        flow.replace_routes("trades", fewer)
        log = flow.input_log()
        log.seq = 300
        log.publish_all(events[:150])
        flow.process_available()
    later = spark.read.parquet(str(tmp_path / "trades.matched" / f"{INPUT}-000002"))
    assert {r["_target"] for r in later.select("_target").distinct().collect()} <= {r.target for r in fewer}
    assert later.count() == sum(
        len(v) for k, v in _local(g, events[:150]).items() if k in {r.target for r in fewer}
    )
    with pytest.raises(FlowError, match="not a point served through the matcher"):
        flow.replace_routes("sub1", [])


def test_a_callback_sink_sees_every_micro_batch(spark: Any, stocks: Graph, tmp_path: Path) -> None:
    seen: dict[str, int] = {}

    def callback(point: str, batch: int, df: Any) -> None:
        seen[point] = seen.get(point, 0) + df.count()

    events = list(generate(stocks, events=300, seed=9))
    _run(spark, stocks, events, tmp_path, batch_events=300, callback=callback)
    assert seen == {k: len(v) for k, v in _local(stocks, events).items() if v or k in seen}


def test_directory_sources_are_read_once_in_name_order(spark: Any, stocks: Graph, tmp_path: Path) -> None:
    events = list(generate(stocks, events=200, seed=4))
    src = {"NYSE": tmp_path / "nyse", "NASDAQ": tmp_path / "nasdaq", "combined": tmp_path / "direct"}
    for d in src.values():
        d.mkdir()
    chunks = (events[:120], events[120:])
    for i, chunk in enumerate(chunks):
        for space in src:
            lines = [json.dumps(e) for s, e in chunk if s == space]
            (src[space] / f"part{i}.jsonl").write_text("\n".join(lines) + "\n")
    # the order the engine ingests in: directory by directory, files in name order
    order = [(s, e) for space in src for chunk in chunks for s, e in chunk if s == space]
    out = tmp_path / "out"
    flow = SparkFlow(spark, stocks, out, batch_events=1000)
    assert flow.ingest_dirs(src) == 200
    assert flow.ingest_dirs(src) == 200  # nothing new
    with flow:
        flow.start()
        flow.process_available()
    _same(spark, out, _local(stocks, order))


# ------------------------------------------------------------ no Spark needed


def test_the_plan_of_the_stock_example(stocks: Graph) -> None:
    p = plan(rewrite(stocks))
    assert [log.name for log in p.logs] == [INPUT, "g0"]
    assert p.log(INPUT).points == ("NYSE", "NASDAQ", "combined.pub")
    (group,) = p.groups
    assert group.space == "ticks" and [c.name for c in group.collapses] == ["C4", "C5"]
    assert group.targets == ("compressed", "drops") and p.log("g0").points == ("compressed", "drops")
    assert [f.point for f in group.feeds] == ["NYSE", "NASDAQ", "combined.pub"]
    assert p.levels() == [[INPUT], ["g0"]]
    drops = dict(p.deliveries(p.log("g0")))
    assert [r.target for _, r in drops["drops"]] == ["alarms"] and drops["compressed"] == []


def test_the_group_folder_is_the_interpreter_per_key(stocks: Graph) -> None:
    g = rewrite(stocks)
    (group,) = plan(g).groups
    folder = GroupFolder(g, group)
    ticks = [{"name": "IBM", "price": p} for p in (100.0, 120.0, 90.0, 60.0, 130.0)]
    state, out = folder.fold(None, [(order_key(i), t) for i, t in enumerate(ticks[:3])])
    state, more = folder.fold(state, [(order_key(i + 3), t) for i, t in enumerate(ticks[3:])])  # later
    run = LocalRun(g)
    for t in ticks:
        run._arrive("ticks", t)
    assert [e for t, _, e in out + more if group.targets[t] == "compressed"] == run.outputs["compressed"]
    # the largest recent drop: 30 and 60 below the peak of 120, then none after the rise to 130
    assert [e["drop"] for t, _, e in out + more if group.targets[t] == "drops"] == [30.0, 60.0, 0.0]
    orders = [o for _, o, _ in out + more]
    assert orders == sorted(orders) and orders[0][:16] == order_key(0, 0)


def test_bad_input_is_refused_and_changes_nothing(stocks: Graph, tmp_path: Path) -> None:
    from flowbus.flow.eventlog import InputLog

    p = plan(rewrite(stocks))
    log = InputLog(rewrite(stocks), p.log(INPUT), tmp_path, batch_events=10)
    with pytest.raises(FlowError, match="not a publication point"):
        log.publish("alarms", {"name": "x", "drop": 1.0})
    with pytest.raises(FlowError, match="price"):
        log.publish("NYSE", {"issue": "IBM", "price": "high", "vol": 1})
    assert log.seq == 0 and log.flush() is None
    log.publish("combined", {"com": "IBM", "price": 1, "vol": 2})  # the original graph's name
    assert log.seq == 1 and log.flush() is not None


def test_fingerprints_tell_inputs_apart() -> None:
    assert fingerprint("a", "stocks", 10, 1) != fingerprint("a", "stocks", 10, 2)
    assert fingerprint("a", "stocks", 10, 1) != fingerprint("b", "stocks", 10, 1)


def test_no_query_is_left_running(spark: Any) -> None:
    assert not [q for q in spark.streams.active if (q.name or "").startswith("flowbus-")]


def _boom(x: float) -> float:
    return x


def test_a_function_with_no_column_is_refused_before_any_query(spark: Any, tmp_path: Path) -> None:
    b = FlowBuilder("bad").source("a", {"x": "float"}).sink("b", {"x": "float"})
    b.function("boom", _boom)  # a Python callable: no Column for it
    b.transform("t", "a", "b", {"x": "boom(x)"})
    with pytest.raises(FlowbusError, match="boom"):
        SparkFlow(spark, b.build(), tmp_path)
    assert not list(tmp_path.iterdir())


def test_the_run_command_follows_source_directories_until_its_timeout(
    spark: Any, stocks: Graph, tmp_path: Path
) -> None:
    import typer
    from typer.testing import CliRunner

    from flowbus.cli.run import run

    app = typer.Typer()
    app.command("run")(run)
    app.command("other")(lambda: None)
    events = list(generate(stocks, events=150, seed=8))
    nyse = tmp_path / "nyse"
    nyse.mkdir()
    trades = [e for s, e in events if s == "NYSE"]
    (nyse / "a.jsonl").write_text("".join(json.dumps(e) + "\n" for e in trades))
    out = tmp_path / "out"
    args = ["run", str(STOCKS), "--source", f"NYSE={nyse}", "--follow", "--timeout", "8"]
    result = CliRunner().invoke(app, [*args, "--out", str(out), "--format", "jsonl", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["stopped_by"] == "--timeout 8 s" and doc["published"] == len(trades)
    expected = _local(stocks, [("NYSE", e) for e in trades])
    assert {p: o["events"] for p, o in doc["outputs"].items()} == {p: len(v) for p, v in expected.items()}
    _same(spark, out, expected, sink="jsonl")


def test_the_bench_runs_the_stock_flow_on_spark_and_locally_with_the_same_deliveries(spark: Any) -> None:
    from flowbus.bench.spark_flow import batch_size, run

    doc = run(spark, events=3000, batch_events=1000, engine_only=True, warm_up=200)
    engine = doc["engine"]
    assert engine["out"] == engine["local_out"] and engine["micro_batches"] >= 3
    # the warm-up ran the flow on its own (its outputs are not the run's) while the input was ingested
    assert engine["warm_up_events"] == 200 and 0 < engine["warm_up_s"] <= engine["ingest_and_warm_up_s"]
    assert 0 < engine["end_to_end_events_per_s"] < doc["run_events_per_s"]
    assert doc["run_events_per_s"] == engine["events_per_s"] > 0 and doc["local_events_per_s"] > 0
    assert "fold-g0" in engine["profile"]  # the state query's time in the per-key fold
    assert engine["cpu_s"] > 0 and engine["events_per_cpu_s"] > 0 and engine["local_events_per_cpu_s"] > 0
    assert [batch_size(n) for n in (1000, 100_000, 2_000_000, 10**8)] == [5000, 50_000, 1_000_000, 1_000_000]


def test_a_delivery_reads_its_micro_batchs_files_from_the_checkpoints_source_log(
    spark: Any, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.types import LongType, StructField, StructType

    from flowbus.spark.groups import batch_frame

    schema = StructType([StructField("x", LongType())])
    files = []
    for b, n in ((8, 3), (9, 5), (9, 2)):
        f = tmp_path / f"part-{len(files)}.parquet"
        pq.write_table(pa.table({"x": list(range(n))}), f)
        files.append((b, f))
    log = tmp_path / "checkpoint" / "sources" / "0"
    log.mkdir(parents=True)
    entries = [json.dumps({"path": f.as_uri(), "timestamp": 1, "batchId": b}) for b, f in files]
    (log / "9.compact").write_text("v1\n" + "\n".join(entries) + "\n")  # (batches 0-9, compacted)
    (log / "10").write_text("v1\n")
    handed = spark.createDataFrame([(1,)], schema)
    df, rows = batch_frame(handed, schema, tmp_path / "checkpoint", 9)
    assert rows == 7 and sorted(r.x for r in df.collect()) == [0, 0, 1, 1, 2, 3, 4]
    df, rows = batch_frame(handed, schema, tmp_path / "elsewhere", 9)  # no source log: as handed
    assert df is handed and rows == 1
