"""Subscriptions in bulk (``Client.subscribe_many``, the protocol's ``SubscribeMany``, ``flowbus
sub --filters``): made all or none, each one served as if it had been made alone, across a
ring and on both overlays; refused with the first bad one named and nothing changed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.broker.test_server import eventually, ring, run, take, trade

import flowbus
from flowbus.client import SubscribeError
from flowbus.filters import parse

pytestmark = pytest.mark.broker

FILTERS = [
    'symbol = "IBM" & price > 100',
    "quantity between 3 and 5",
    "level in {1, 2}",
    "",  # (every event)
    'symbol = "HP" | quantity = 7',  # (not the fast path's shape: read by the parser)
]


def _events() -> list[dict[str, object]]:
    return [trade(i, "IBM" if i % 2 else "HP", 90.0 + 5 * i) for i in range(10)]


async def _took(sub: flowbus.client.Subscription) -> bool:
    try:
        await sub.get(0.2)
    except TimeoutError:
        return False
    return True


async def _take(sub: flowbus.client.Subscription, n: int) -> list[dict[str, object]]:
    """The next ``n`` events of ``sub`` other than the probes (quantity 99)."""
    got: list[dict[str, object]] = []
    while len(got) < n:
        e = await sub.get(10)
        if e["quantity"] != 99:
            got.append(e)
    return got


@pytest.mark.parametrize("overlay", ["chordal-ring", "pastry-irbr"])
def test_each_subscription_of_a_bulk_gets_what_its_filter_matches(overlay: str) -> None:
    async def main() -> None:
        async with ring(2, overlay=overlay) as (b0, b1), flowbus.connect(b1.address) as sc:
            subs = await sc.subscribe_many("stocks", FILTERS, batch=2)  # (three requests)
            assert [s.filter for s in subs] == [f or "true" for f in FILTERS]
            assert len({s.id for s in subs}) == len(FILTERS)
            async with flowbus.connect(b0.address) as pc:
                probe = await sc.subscribe("stocks", "quantity = 99")
                await pc.publish("stocks", trade(99))
                while not await _took(probe):  # (until b0 routes b1's subscriptions)
                    await pc.publish("stocks", trade(99))
                for e in _events():
                    await pc.publish("stocks", e)
                for s, text in zip(subs, FILTERS, strict=True):
                    want = [e for e in _events() if parse(text or "true").matches(e)]
                    got = [e["quantity"] for e in await _take(s, len(want))]
                    assert got == [e["quantity"] for e in want], text
                await pc.flush(10)

    run(main())


def test_a_bulk_with_one_bad_filter_is_refused_whole_and_changes_nothing() -> None:
    async def main() -> None:
        async with ring() as (b,), flowbus.connect(b.address) as c:
            before = await c.subscribe("stocks", "price > 1")
            for filters, why in [
                (["price > 1", "price >", "level = 2"], "unexpected end of filter"),
                (["price > 1", "colour = 2"], "unknown field 'colour'"),
            ]:
                with pytest.raises(SubscribeError, match=why) as err:
                    await c.subscribe_many("stocks", filters, batch=1)
                assert "none of" in str(err.value)
                await eventually(lambda: set(b.queues.subs) == {before.id})
                assert set(c.state.subs) == {before.id}
            with pytest.raises(SubscribeError, match="unknown space"):
                await c.subscribe_many("nowhere", ["x = 1"])
            with pytest.raises(SubscribeError, match="2 durable names for 1 filters"):
                await c.subscribe_many("stocks", ["x = 1"], durable=["a", "b"])
            assert set(b.queues.subs) == {before.id}

    run(main())


def test_durable_bulk_subscriptions_wait_for_their_client(tmp_path: Path) -> None:
    async def main() -> None:
        async with ring(data=tmp_path) as (b,):
            async with flowbus.connect(b.address, name="keeper") as c:
                made = await c.subscribe_many(
                    "stocks", ["quantity < 3", "quantity >= 8"], durable=["low", "high"]
                )
                assert [s.id for s in made] == ["low", "high"]
                with pytest.raises(SubscribeError, match="'low'"):  # (a name taken)
                    await c.subscribe_many("stocks", ["quantity = 1"], durable=["low"])
            assert {r.sub_id for r in b.queues.store.subscriptions()} >= {"low", "high"}
            async with flowbus.connect(b.address) as pc:  # (acknowledged once in their queues)
                for e in _events():
                    await pc.publish("stocks", e)
                await pc.flush(10)
            async with flowbus.connect(b.address, name="keeper") as c:
                low = await c.subscribe("stocks", "quantity < 3", durable="low")
                high = await c.subscribe("stocks", "quantity >= 8", durable="high")
                assert [e["quantity"] for e in await take(low, 3)] == [0, 1, 2]
                assert [e["quantity"] for e in await take(high, 2)] == [8, 9]

    run(main())


def test_flowbus_sub_reads_its_filters_from_a_file(tmp_path: Path) -> None:
    async def main() -> None:
        async with ring() as (b,):
            lines = ["# quantities", "quantity = 1", "", "quantity >= 1 & quantity <= 2"]
            (tmp_path / "filters.txt").write_text("\n".join(lines) + "\n")
            cmd = [
                sys.executable,
                "-m",
                "flowbus",
                "sub",
                "stocks",
                "--filters",
                str(tmp_path / "filters.txt"),
            ]
            proc = await asyncio.create_subprocess_exec(
                *cmd, "--broker", b.address, "--count", "3", stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            try:
                async with flowbus.connect(b.address) as pc:
                    await eventually(lambda: len(b.queues.subs) == 2, 30)
                    for i in range(4):
                        await pc.publish("stocks", trade(i))
                    await pc.flush(10)
                out, err = await asyncio.wait_for(proc.communicate(), 30)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            assert proc.returncode == 0, err.decode()
            got = sorted(
                (r["line"], r["event"]["quantity"]) for r in map(json.loads, out.decode().splitlines())
            )
            assert got == [(2, 1), (4, 1), (4, 2)]
            assert "2 subscriptions made" in err.decode()

    run(main())


def test_flowbus_sub_refuses_an_empty_filter_file_by_name(tmp_path: Path) -> None:
    (tmp_path / "none.txt").write_text("# nothing\n\n")
    cmd = [sys.executable, "-m", "flowbus", "sub", "stocks", "--filters", str(tmp_path / "none.txt")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "no filter in it" in done.stderr


def test_a_broker_past_its_memory_limit_refuses_new_subscriptions_by_name() -> None:
    from flowbus.broker.config import DEFAULT
    from flowbus.broker.queues import resident_mb

    async def main() -> None:
        async with ring(config=DEFAULT.with_(memory_limit=100_000)) as (b,), flowbus.connect(b.address) as c:
            assert b.queues.memory_limit == 100_000
            now = resident_mb()
            assert now is not None
            b.queues.memory_limit = int(now) + 3  # (room for a few hundred)
            one = await c.subscribe("stocks", "price > 1")
            with pytest.raises(SubscribeError, match="out of memory for subscriptions: 5,000 subscriptions"):
                await c.subscribe_many("stocks", ["price > 2"] * 5_000)
            b.queues.memory_limit = 1
            with pytest.raises(SubscribeError, match="memory_limit of 1 MB"):
                await c.subscribe("stocks", "price > 3")
            assert set(b.queues.subs) == {one.id}
            b.queues.memory_limit = None
            await c.subscribe("stocks", "price > 3")

    run(main())


@pytest.mark.parametrize("bad", [0, -5, 1.5, "lots"])
def test_a_bad_memory_limit_is_refused_by_name(bad: object) -> None:
    from flowbus.broker.config import DEFAULT
    from flowbus.errors import ConfigError

    with pytest.raises(ConfigError, match="memory_limit: an int >= 1"):
        DEFAULT.with_(memory_limit=bad)
