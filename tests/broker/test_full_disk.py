"""A broker whose disk is full, in one process on loopback: back-pressure, not a crash. A
durable subscription's client is away and the store cannot write (faked, or a real tmpfs
filled to ENOSPC as root): its events wait in memory, in custody, up to the limit; the next
ones are refused, and their publisher gets the reason; once space is back, what waited is
written and acknowledged (``flush`` returns), and the client, back, gets every
acknowledged event in order. The log has one warning as the store fails and one as it
recovers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path

import pytest
from tests.broker.full_disk import FULL, FullDisk, fill, tiny_disk

import flowbus
from flowbus.broker.config import DEFAULT, BrokerConfig
from flowbus.broker.queues import HOLD_LIMIT
from flowbus.broker.server import Broker
from flowbus.client import PublishError

pytestmark = pytest.mark.broker


@asynccontextmanager
async def broker(data: Path, config: BrokerConfig) -> AsyncIterator[Broker]:
    b = await Broker.start(data=data, config=config)
    try:
        await b.joined()
        yield b
    finally:
        await b.close()


async def eventually(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    assert cond()


def trade(i: int) -> dict[str, object]:
    return {"symbol": "IBM", "price": 100.0, "quantity": i, "exchange": "NYSE", "level": i % 10}


@pytest.mark.parametrize("disk", ["faked", "tmpfs"])
def test_a_full_disk_holds_publishers_back_refuses_past_the_limit_and_loses_nothing_acknowledged(
    tmp_path: Path, disk: str, caplog: pytest.LogCaptureFixture
) -> None:
    memory = 5
    limit = HOLD_LIMIT * memory  # (what an away subscription holds in memory while the store fails)
    config = DEFAULT.with_(window=10, memory=memory)

    async def main(data: Path) -> None:
        async with broker(data, config) as b:
            async with flowbus.connect(b.address, name="reader") as reader:
                await reader.subscribe("stocks", "quantity >= 0", durable="audit")
            await eventually(lambda: b.queues.subs["audit"].session is None)  # its client is away
            if disk == "faked":
                faked = FullDisk.under(b.store)
            else:
                filler = fill(data)
            async with flowbus.connect(b.address) as pub:
                await pub.publish("stocks", trade(0))  # the store fails at this one's spill
                await eventually(lambda: b.stats()["store_full"])
                refused: list[PublishError] = []
                for i in range(1, 100):
                    while True:
                        try:
                            await pub.publish("stocks", trade(i))
                            break
                        except PublishError as e:  # (an earlier one's refusal)
                            refused.append(e)
                await eventually(lambda: pub.unacknowledged == limit)  # held, not acknowledged
                stats = b.stats()
                assert stats["store_refused"] == 100 - limit and stats["queued_in_memory"] == limit
                assert b.store.depth("audit") == 0 and stats["store_full"]
                await asyncio.sleep(0.6)  # (tried again meanwhile: still full, still held)
                assert pub.unacknowledged == limit and b.stats()["store_refused"] == 100 - limit
                if disk == "faked":
                    faked.full = False  # space is back
                else:
                    filler.unlink()
                while True:  # flush returns (raising each refusal it has)
                    try:
                        await pub.flush(20)
                        break
                    except PublishError as e:
                        refused.append(e)
            reason = (
                f"broker {b.address} cannot queue the event for subscription 'audit': "
                f"its store is full ({FULL})"
            )
            assert sorted(e.pseq for e in refused) == list(range(limit + 1, 101))  # (pseq = i + 1)
            assert {e.reason for e in refused} == {reason}
            stats = b.stats()
            assert not stats["store_full"] and stats["in_custody"] == 0 and stats["queued_in_memory"] == 0
            assert b.store.depth("audit") == limit
            async with flowbus.connect(b.address, name="reader") as reader:
                sub = await reader.subscribe("stocks", "quantity >= 0", durable="audit")
                got = [await sub.get(10) for _ in range(limit)]
                assert [e["quantity"] for e in got] == list(range(limit))  # every acknowledged one, in order
                await eventually(lambda: b.store.depth("audit") == 0)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        failing = [w for w in warnings if "is full: cannot" in w]
        recovered = [w for w in warnings if "takes writes again" in w]
        assert len(failing) == 1 and len(recovered) == 1, warnings
        assert f"{100 - limit} deliveries refused" in recovered[0]

    with ExitStack() as stack, caplog.at_level(logging.WARNING, logger="flowbus.broker"):
        data = stack.enter_context(tiny_disk(tmp_path / "disk")) if disk == "tmpfs" else tmp_path / "data"
        asyncio.run(asyncio.wait_for(main(data), 90))
