"""Spark and the bus as one pipeline: ``format("flowbus")`` as a streaming source and sink, and
``flowbus run`` reading NYSE and NASDAQ from a ring of three brokers and publishing the stock
flow's subscription points back, its driver killed (SIGKILL) mid-run and restarted on the same
checkpoint: the subscribers get exactly what the local interpreter delivers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.broker.conftest import _ready, stop
from tests.spark.cluster import stop_process

import flowbus
from flowbus.broker.process import start_process
from flowbus.client.pull import PulledSubscription
from flowbus.client.sync import SyncClient
from flowbus.flow.generators import generate
from flowbus.flow.local import LocalRun
from flowbus.flow.rewrite import rewrite
from flowbus.flow.spec import load_spec
from flowbus.spark.bus import register

STOCKS = Path(__file__).resolve().parents[2] / "examples" / "stocks" / "flow.yaml"
CONFIG = """spaces:
  NYSE: {issue: str, price: float, vol: int}
  NASDAQ: {issue: str, price: float, vol: int}
  trades: {issue: str, price: float, vol: int}
"""
POINTS = ("big_trades", "compressed", "alarms")


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Three brokers on 127.0.0.1, each a process of its own, stopped at the end."""
    d = tmp_path_factory.mktemp("ring")
    (d / "config.yaml").write_text(CONFIG)
    procs: list[subprocess.Popen[str]] = []
    addresses: list[str] = []
    try:
        for i in range(3):
            proc = start_process(
                "127.0.0.1:0",
                join=addresses[:1],
                data=d / f"b{i}",
                config=d / "config.yaml",
                log=d / f"b{i}.log",
            )
            procs.append(proc)
            addresses.append(_ready(proc, 60))
        yield addresses
    finally:
        for proc in procs:
            stop(proc)


def _drain(
    client: SyncClient, subs: dict[str, Any], expect: dict[str, int], quiet: float = 0.5
) -> dict[str, list[dict[str, Any]]]:
    """What each subscription receives: the ``expect`` ed number of events (waiting up to 60 s for
    each), then whatever else comes within ``quiet`` seconds (an event too many, a duplicate)."""
    got: dict[str, list[dict[str, Any]]] = {}
    for name, sub in subs.items():
        got[name] = []
        with contextlib.suppress(queue.Empty):
            while len(got[name]) < expect[name]:
                got[name].append(sub.get(timeout=60))
            while True:
                got[name].append(sub.get(timeout=quiet))
    return got


def test_the_bus_as_a_streaming_source_and_sink(spark: Any, ring: list[str], tmp_path: Path) -> None:
    register(spark)
    source = {"brokers": ",".join(ring[:2]), "space": "trades", "subscription": "t-src", "filter": "vol >= 5"}
    rows: list[Any] = []
    batches: list[int] = []  # rows per micro-batch

    def take(df: Any, _batch: int) -> None:
        got = df.collect()
        rows.extend(got)
        batches.append(len(got))

    def start() -> Any:
        df = spark.readStream.format("flowbus").options(**source).load()
        writer = df.writeStream.foreachBatch(take)
        return writer.option("checkpointLocation", str(tmp_path / "ck")).start()

    held = spark.read.format("flowbus").options(**source)

    def publish(vols: range) -> None:
        with SyncClient(ring[1]) as pub:
            for i in vols:
                pub.publish("trades", {"issue": f"I{i}", "price": 1.5 * i, "vol": i})
            pub.flush(30)

    q = start()
    try:
        q.processAllAvailable()  # (the pulled subscription exists from here on)
        publish(range(20))
        q.processAllAvailable()
    finally:
        q.stop()
    assert [(r["issue"], r["price"], r["vol"]) for r in sorted(rows, key=lambda r: r["_seq"])] == [
        (f"I{i}", 1.5 * i, i) for i in range(5, 20)
    ]
    assert held.load().count() == batches[-1]  # (Spark tells a source of a commit when it plans the next)
    rows.clear()
    q = start()  # restarted on its checkpoint: nothing is read again; the next batch acknowledges
    try:
        q.processAllAvailable()
        assert rows == []
        publish(range(20, 25))
        q.processAllAvailable()
    finally:
        q.stop()
    assert [r["vol"] for r in rows] == list(range(20, 25))
    assert sorted(r["vol"] for r in held.load().collect()) == list(range(25 - batches[-1], 25))

    # the sink: a space it declares; a replayed write publishes nothing twice
    out = spark.createDataFrame(
        [(f"C{i}", 10.0 * i, i) for i in range(6)], "com string, cap double, _order long"
    )
    sink = {"brokers": ring[0], "space": "spark_test_caps"}
    out.write.format("flowbus").options(**sink, id="w1").mode("append").save()
    with SyncClient(ring[2], name="sink-reader") as c:  # (durable, away: its events wait on disk)
        c.subscribe("spark_test_caps", "", durable="caps")
    out.write.format("flowbus").options(**sink, id="w1").mode("append").save()  # (a replay)
    out.where("cap > 30").write.format("flowbus").options(**sink, id="w2").mode("append").save()
    with SyncClient(ring[2], name="sink-reader") as c:
        sub = c.subscribe("spark_test_caps", "", durable="caps")
        got = _drain(c, {"caps": sub}, {"caps": 2})["caps"]
    assert sorted((e["com"], e["cap"]) for e in got) == [("C4", 40.0), ("C5", 50.0)]

    # errors name the broker, the space, the field
    with pytest.raises(Exception, match=r"no broker answered at 127\.0\.0\.1:1"):
        spark.read.format("flowbus").options(brokers="127.0.0.1:1", space="trades", timeout="1").load()
    with pytest.raises(Exception, match=r"unknown space 'nope'"):
        spark.read.format("flowbus").options(brokers=ring[0], space="nope").load()
    bad = spark.createDataFrame([("C1", "high")], "com string, cap string")
    with pytest.raises(
        Exception, match=r"space 'spark_test_caps': field 'cap' is float there, str in the rows"
    ):
        bad.write.format("flowbus").options(**sink, id="w3").mode("append").save()


def _run(out: Path, ring: list[str], *more: str) -> list[str]:
    return [
        sys.executable, "-m", "flowbus", "run", str(STOCKS), "--out", str(out), "--json",
        "--source", f"NYSE=flowbus://{ring[0]}", "--source", f"NASDAQ=flowbus://{ring[0]}",
        "--sink", f"flowbus://{ring[1]}", *more,
    ]  # fmt: skip


async def _open_run_queues(broker: str, run: str) -> None:
    """The run's pulled subscriptions, opened now rather than at its ingest query's first look
    (the same names and filter: the query finds them)."""
    async with flowbus.connect(broker) as c:
        for space in ("NYSE", "NASDAQ"):
            await PulledSubscription.open(c, f"flowbus-run-{run.strip()}:{space}", space)


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"flowbus run ended early ({proc.returncode})"
        assert time.monotonic() < deadline, f"no {path} in {timeout} s"
        time.sleep(0.2)


def test_flowbus_run_on_the_bus_survives_a_killed_driver(ring: list[str], tmp_path: Path) -> None:
    g = load_spec(STOCKS)
    events = [(s, e) for s, e in generate(g, events=2000, seed=3) if s in ("NYSE", "NASDAQ")]
    out = tmp_path / "out"
    checkpoints = out / "_flowbus" / "checkpoints"
    log = (tmp_path / "run-1.log").open("wb")
    driver = subprocess.Popen(_run(out, ring, "--follow"), stdout=log, stderr=log, start_new_session=True)
    try:
        _wait_for(out / "_flowbus" / "run-id", driver)  # (its spaces are declared by then)
        asyncio.run(_open_run_queues(ring[0], (out / "_flowbus" / "run-id").read_text()))
        with SyncClient(ring[2], name="subscriber") as c:  # durable, away: their events wait on disk
            for p in POINTS:
                c.subscribe(p, "", durable=f"run-{p}")
        with SyncClient(ring[1]) as pub:
            half = len(events) // 2
            for s, e in events[:half]:
                pub.publish(s, e)
            pub.flush(30)
            _wait_for(checkpoints / "deliver-input" / "commits" / "0", driver)
            planned = len(list((checkpoints / "deliver-input" / "offsets").glob("[0-9]*")))
            for s, e in events[half:]:
                pub.publish(s, e)
            pub.flush(30)
        _wait_for(checkpoints / "deliver-input" / "offsets" / str(planned), driver)
        os.kill(driver.pid, signal.SIGKILL)  # the driver, mid-run
    finally:
        stop_process(driver)  # (and its JVM)
        log.close()
    done = subprocess.run(_run(out, ring), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["outputs"]["big_trades"]["path"] == f"flowbus://{ring[1]}/big_trades"

    local = LocalRun(rewrite(g))
    for s, e in events:
        local.publish(s, e)
    with SyncClient(ring[2], name="subscriber") as c:
        subs = {p: c.subscribe(p, "", durable=f"run-{p}") for p in POINTS}
        got = _drain(c, subs, {p: len(local.outputs[p]) for p in POINTS})
    for p in POINTS:
        assert got[p] == [dict(e) for e in local.outputs[p]], p
    assert all(got[p] for p in POINTS)


def test_flowbus_run_names_an_unknown_space_and_a_schema_clash(ring: list[str], tmp_path: Path) -> None:
    base = [sys.executable, "-m", "flowbus", "run", str(STOCKS), "--out", str(tmp_path / "o")]
    unknown = subprocess.run(
        [*base, "--source", f"NYSE=flowbus://{ring[0]}/nope"], capture_output=True, text=True
    )
    assert unknown.returncode == 2 and "unknown space 'nope'" in unknown.stderr
    clash = subprocess.run(
        [*base, "--sink", f"big_trades=flowbus://{ring[0]}/trades"], capture_output=True, text=True
    )
    assert clash.returncode == 2
    assert "space 'trades' has no field 'com'" in " ".join(clash.stderr.split())


def test_a_streaming_read_keeps_exactly_once_when_its_subscriptions_broker_is_killed(
    spark: Any, tmp_path: Path
) -> None:
    """A query reads ``trades`` from a ring of three brokers; its subscription's broker is
    killed (``kill -9``) between two micro-batches while the publisher goes on, and started
    again on its data (it hands its queue to the subscription's taker, which numbers the
    events its own way). The query, restarted on its checkpoint as after a driver's crash,
    goes on at the taker: every event once, in each publisher's order."""
    register(spark)
    (tmp_path / "config.yaml").write_text(CONFIG)
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    listen = f"127.0.0.1:{port.getsockname()[1]}"
    port.close()
    procs: list[subprocess.Popen[str]] = []

    def start(where: str, join: list[str], data: str) -> str:
        log = tmp_path / f"{data}-{len(procs)}.log"
        proc = start_process(where, join=join, data=tmp_path / data, config=tmp_path / "config.yaml", log=log)
        procs.append(proc)
        return _ready(proc, 60)

    rows: list[Any] = []
    try:
        ring = [start(listen, [], "b0")]
        ring += [start("127.0.0.1:0", ring[:1], f"b{i}") for i in (1, 2)]
        time.sleep(1.0)  # (the ring settles)
        source = {"brokers": ",".join(ring), "space": "trades", "subscription": "kill-src", "timeout": "60"}

        def query() -> Any:
            df = spark.readStream.format("flowbus").options(**source).load()
            writer = df.writeStream.foreachBatch(lambda d, _: rows.extend(d.collect()))
            return writer.option("checkpointLocation", str(tmp_path / "ck")).start()

        def publish(name: str, vols: range) -> None:
            with SyncClient(ring[2], name=name) as pub:
                for i in vols:
                    pub.publish("trades", {"issue": f"I{i}", "price": 1.0, "vol": i})
                pub.flush(60)

        q = query()
        try:
            q.processAllAvailable()
            publish("p1", range(100))
            q.processAllAvailable()
        finally:
            q.stop()
        os.kill(procs[0].pid, signal.SIGKILL)
        procs[0].wait(10)
        publish("p2", range(100, 200))
        start(listen, ring[1:2], "b0")  # (on its data: its queue goes to the taker)
        q = query()
        try:
            deadline = time.monotonic() + 120
            while len(rows) < 200 and time.monotonic() < deadline:
                q.processAllAvailable()
                time.sleep(0.5)
            publish("p3", range(200, 250))
            q.processAllAvailable()
        finally:
            q.stop()
    finally:
        for proc in procs:
            stop(proc)
    assert [r["vol"] for r in rows] == list(range(250))
