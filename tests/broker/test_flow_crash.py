"""``kill -9`` of a broker owning state of a deployed flow, in a ring of three broker
processes, while 50,000 source events of the stock flow flow: subscribers of stateless spaces
lose and duplicate nothing; a subscriber of ``compressed`` ends with the offline run's final
state per company, and every state its events take it through is one of the offline history's,
in order; ``alarms`` loses and duplicates nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tests.broker.test_crash import _free_ports, _wait_listening
from tests.flows.world import canon, reference, states, subsequence

import flowbus
from flowbus.client import Subscription
from flowbus.flow.deploy import Deployment

pytestmark = pytest.mark.broker

STOCKS = Path(__file__).parents[2] / "examples" / "stocks" / "flow.yaml"
N_EVENTS = 50_000
KILL_AT = 20_000
VICTIM = 1  # the middle of the routing tree, owner of a third of the flow's state
SPACES = ("combined", "big_trades", "compressed", "alarms")
StartBroker = Callable[..., Any]


def _first_stray(part: list[Any], whole: list[Any]) -> str:
    """Where ``part`` stops being a subsequence of ``whole`` (for the failure message)."""
    j = 0
    for i, x in enumerate(part):
        while j < len(whole) and whole[j] != x:
            j += 1
        if j == len(whole):
            at = whole.index(x) if x in whole else -1
            before = part[max(0, i - 3) : i]
            return f"state {i} of {len(part)} {x} is at {at} of {len(whole)}; got before it {before}"
        j += 1
    return ""


async def _drain(sub: Subscription, got: list[dict[str, Any]]) -> None:
    async for event in sub:
        got.append(event)


def test_kill_9_of_a_state_owner_keeps_every_space_right(tmp_path: Path, start_broker: StartBroker) -> None:
    d = Deployment.from_file(STOCKS)
    events = list(d.generate(events=N_EVENTS))
    ref = reference(d, events, list(SPACES))
    procs = [start_broker(data=tmp_path / "broker-0")]
    with ThreadPoolExecutor(2) as pool:
        joining = []
        for i, port in enumerate(_free_ports(2), 1):
            listen = f"127.0.0.1:{port}"
            joining.append(
                pool.submit(start_broker, listen, join=[procs[0][1]], data=tmp_path / f"broker-{i}")
            )
            _wait_listening(port)
        procs += [j.result() for j in joining]
    addresses = [a for _, a in procs]
    time.sleep(1.0)  # the ring settles

    async def main() -> dict[tuple[str, int], list[dict[str, Any]]]:
        def others(i: int) -> list[str]:
            return [addresses[i]] + [a for j, a in enumerate(addresses) if j != i]

        async with flowbus.connect(*others(0), name="admin") as admin:
            info = await admin.deploy(STOCKS)
            assert info["owners"] == 3
        subscribers = [flowbus.connect(*others(i), name=f"subscriber-{i}") for i in (0, 2)]
        publisher = flowbus.connect(*others(0), name="publisher", window=2_000)
        got: dict[tuple[str, int], list[dict[str, Any]]] = {}
        tasks = []
        try:
            for c in (*subscribers, publisher):
                await c.open()
                for _ in range(100):  # (the deploy is flooded to every broker)
                    if await c.flows():
                        break
                    await asyncio.sleep(0.05)
            for n, c in enumerate(subscribers):
                for space in SPACES:
                    sub = await c.subscribe(space, durable=f"{space}-{n}")
                    got[(space, n)] = []
                    tasks.append(asyncio.ensure_future(_drain(sub, got[(space, n)])))
            await asyncio.sleep(0.5)
            for i, (space, event) in enumerate(events, 1):
                await publisher.publish(space, event)
                if i == KILL_AT:
                    os.kill(procs[VICTIM][0].pid, signal.SIGKILL)
                if i % 512 == 0:
                    await asyncio.sleep(0)
            await publisher.flush(120)
            want = {k: len(ref[k[0]]) for k in got}
            for _ in range(600):  # until every subscriber has its events (and a moment more)
                if all(len(got[k]) >= want[k] for k in got):
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)
        finally:
            for t in tasks:
                t.cancel()
            for c in (*subscribers, publisher):
                await c.close()
        return got

    got = asyncio.run(asyncio.wait_for(main(), 400))
    final = {k: v[-1] for k, v in states(d, ref["compressed"]).items()}
    history = states(d, ref["compressed"])
    for n in (0, 1):
        for space in ("combined", "big_trades", "alarms"):
            assert canon(got[(space, n)]) == canon(ref[space]), (
                space,
                n,
                len(got[(space, n)]),
                len(ref[space]),
            )
        seen = states(d, got[("compressed", n)])
        assert {k: v[-1] for k, v in seen.items()} == final
        strays = {k: _first_stray(seen[k], history[k]) for k in seen if not subsequence(seen[k], history[k])}
        sizes = (len(got[("compressed", n)]), len(ref["compressed"]))
        assert not strays, f"subscriber {n} ({sizes}): states not in the offline history, in order: {strays}"
