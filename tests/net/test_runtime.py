"""The asyncio driver runs the very cores the simulator runs, over TCP on 127.0.0.1: a
chordal ring joins, routes and repairs itself after a broker stops; a malformed frame
closes only its own connection."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Hashable, Sequence
from typing import Any

import pytest

from flowbus.core import Core, Deliver, Effect, Send
from flowbus.experiments.ring_sim import ring_errors
from flowbus.net.codec import frame
from flowbus.net.runtime import PREPARE_EVERY, Directory, Runtime
from flowbus.overlay.chordal_ring import RingNode, RingRoute

pytestmark = pytest.mark.broker

HB = 0.1  # heartbeat period (s): failures are found within a few tenths of a second


async def _until(check: Any, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():
        if loop.time() > end:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(0.02)


async def _ring(n: int) -> tuple[list[Runtime], list[RingNode], list[tuple[int, Hashable, Any]]]:
    directory = Directory()
    got: list[tuple[int, Hashable, Any]] = []
    nodes = [RingNode(a, backup=2, heartbeat=HB, probe_timeout=0.5, ping_timeout=0.5) for a in range(n)]
    runtimes = [Runtime(a, nd, directory, on_deliver=lambda *d: got.append(d)) for a, nd in enumerate(nodes)]
    for rt in runtimes:
        await rt.start()
    await runtimes[0].call(lambda c: c.start())
    rng = random.Random(7)
    for a in range(1, n):
        picks = rng.sample(range(a), min(3, a))
        await runtimes[a].call(lambda c, p=picks: c.join(p))
        await _until(lambda a=a: nodes[a].joined)
        await asyncio.sleep(0.05)
    return runtimes, nodes, got


def test_a_ring_over_tcp_joins_routes_and_repairs() -> None:
    async def main() -> None:
        runtimes, nodes, got = await _ring(6)
        try:
            await _until(lambda: not ring_errors(nodes))
            order = sorted(nodes, key=lambda nd: nd.me.id)
            a, b = order[0], order[3]
            await runtimes[a.addr].call(lambda c: c.route(b.me.id, "over tcp"))
            await _until(lambda: any(isinstance(e, RingRoute) and e.payload == "over tcp" for _, _, e in got))
            assert [node for node, _, e in got if isinstance(e, RingRoute)] == [b.addr]
            for nd in nodes:  # some state to back up and take over
                await runtimes[nd.addr].call(lambda c, k=nd.addr: c.set_state(("sub", k), k))
            await asyncio.sleep(0.2)
            victim = order[2]
            await runtimes[victim.addr].close()
            live = [nd for nd in nodes if nd is not victim]
            await _until(lambda: not ring_errors(live), timeout=15.0)
            await _until(lambda: any(("sub", victim.addr) in nd.state for nd in live))
            owners = [nd.addr for nd in live if ("sub", victim.addr) in nd.state]
            assert len(owners) == 1  # taken over exactly once
            assert sum(rt.bad_frames for rt in runtimes) == 0
        finally:
            for rt in runtimes:
                await rt.close()

    asyncio.run(main())


class Echo(Core):
    """A core that keeps what it is sent (tests/net/test_tls.py uses it too)."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
        self.seen.append((src, msg))
        return []

    def on_timer(self, key: Hashable, now: float) -> list[Effect]:
        return []


class Notified(Echo):
    """An :class:`Echo` that keeps the failure notices it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.failed: list[tuple[int, Any]] = []

    def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]:
        self.failed.append((dst, msg))
        return []


def test_a_malformed_frame_closes_only_its_connection() -> None:
    async def main() -> None:
        directory = Directory()
        echo = Echo()
        rt = Runtime(0, echo, directory)
        await rt.start()
        peer = Runtime(1, Echo(), directory)
        await peer.start()
        try:
            where = directory.get(0)
            assert where is not None
            _, bad = await asyncio.open_connection(*where)
            bad.write(frame(b"\xc1garbage"))  # 0xc1 is never valid msgpack
            await bad.drain()
            await _until(lambda: rt.bad_frames == 1)
            await peer.call(lambda c: [Send(0, ("ok", 1))])
            await _until(lambda: echo.seen == [(1, ("ok", 1))])
            bad.close()
        finally:
            await peer.close()
            await rt.close()

    asyncio.run(main())


def test_a_send_to_a_stopped_node_is_a_failure_notice() -> None:
    async def main() -> None:
        directory = Directory()

        notified = Notified()
        a, b = Runtime(0, notified, directory), Runtime(1, Echo(), directory)
        await a.start()
        await b.start()
        await b.close()
        try:
            await a.call(lambda c: [Send(1, "hello"), Send(7, "nobody")])
            await _until(lambda: sorted(notified.failed, key=repr) == [(1, "hello"), (7, "nobody")])
        finally:
            await a.close()

    asyncio.run(main())


def test_a_link_that_does_not_answer_is_given_up_within_its_timeout() -> None:
    """A peer whose host takes no new connection (its accept queue is full: the SYN is
    dropped, as in a partition) is a failure notice within ``link_timeout``, not after the
    kernel's two minutes of retries; an open link gives up unacknowledged writes after it."""

    async def main() -> None:
        directory = Directory()

        full = socket.socket()
        full.bind(("127.0.0.1", 0))
        full.listen(0)  # (never accepted: one connection fills the queue)
        filler = socket.create_connection(full.getsockname())
        notified = Notified()
        a = Runtime(0, notified, directory, link_timeout=0.5)
        b = Runtime(1, Echo(), directory)
        try:
            await a.start()
            await b.start()
            directory.set(2, *full.getsockname())
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await a.call(lambda c: [Send(2, "into the void"), Send(1, "hello")])
            await _until(lambda: notified.failed == [(2, "into the void")], timeout=5.0)
            assert loop.time() - t0 < 3.0
            await _until(lambda: b.core.seen == [(0, "hello")])  # type: ignore[attr-defined]
            sock = a._out[1].get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 500
        finally:
            await a.close()
            await b.close()
            filler.close()
            full.close()

    asyncio.run(main())


def test_the_messages_of_one_read_are_one_step_of_on_messages() -> None:
    async def main() -> None:
        directory = Directory()
        steps: list[tuple[str, list[Any]]] = []

        class Batched(Echo):
            def on_messages(self, src: int, msgs: Sequence[Any], now: float) -> list[Effect]:
                steps.append(("run", list(msgs)))
                return [Deliver("s", m) for m in msgs]

            def on_message(self, src: int, msg: Any, now: float) -> list[Effect]:
                steps.append(("one", [msg]))
                return [Deliver("s", msg)]

        got: list[Any] = []
        after: list[int] = []
        rt = Runtime(
            0,
            Batched(),
            directory,
            on_deliver=lambda *d: got.append(d[2]),
            after_step=lambda: after.append(1),
        )
        peer = Runtime(1, Echo(), directory)
        await rt.start()
        await peer.start()
        try:
            await peer.call(lambda c: [Send(0, ("m", i)) for i in range(5)])  # one write
            await _until(lambda: len(got) == 5)
            assert got == [("m", i) for i in range(5)]
            assert [m for _, msgs in steps for m in msgs] == got
            assert all((kind == "run") == (len(msgs) > 1) for kind, msgs in steps)
            assert len(after) == len(steps)  # one step each
        finally:
            await peer.close()
            await rt.close()

    asyncio.run(main())


def test_the_core_is_asked_to_prepare_now_and_then_until_the_runtime_closes() -> None:
    async def main() -> None:
        class Preparing(Echo):
            def __init__(self) -> None:
                super().__init__()
                self.prepared = 0

            def prepare(self) -> None:
                self.prepared += 1

        core = Preparing()
        rt = Runtime(0, core, Directory())
        await rt.start()
        try:
            await _until(lambda: core.prepared >= 3, timeout=5.0)
        finally:
            await rt.close()
        calls = core.prepared
        await asyncio.sleep(3 * PREPARE_EVERY)
        assert core.prepared == calls  # (none after close)

    asyncio.run(main())
