"""A broker back as a new ring member hands its queues on disk to the brokers that took its
subscriptions over (broker/handover.py), on real broker processes on 127.0.0.1: after a
``kill -9`` and a restart on its data, and after a pause the ring took for a death (it steps
down and starts again in its process). The subscription's events come once, in order: those
that waited on the old broker's disk first, then those its taker queued meanwhile."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import flowbus
from flowbus.chaos.brokers import Brokers
from flowbus.chaos.hosts import Loopback
from flowbus.errors import SubscribeError

pytestmark = pytest.mark.broker

NAMES = ["b0", "b1", "b2", "b3"]
KEEP = 'symbol = "KEEP"'


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[Brokers]:
    """Four broker processes in one ring (heartbeat 0.5 s), stopped by process id at the end."""
    config = tmp_path / "broker.yaml"
    config.write_text("heartbeat: 0.5\n")
    b = Brokers(Loopback(NAMES, root=tmp_path), NAMES, root=tmp_path, config=config, overlay="chordal-ring")
    try:
        b.start_all()
        _until(lambda: len(b.ring_order()) == 4, 30, "a ring of four")
        yield b
    finally:
        b.close()
        for name in NAMES:
            print(f"--- {name}:\n" + "\n".join(b.log(name).read_text(errors="replace").splitlines()[-40:]))


def _until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < end, f"timed out ({timeout} s) waiting for {what}"
        time.sleep(0.1)
    return got


def _serving(b: Brokers, sub_id: str) -> list[str]:
    """The brokers that list ``sub_id`` among their durable subscriptions."""
    out = []
    for name in b.up:
        state = b.poll(name, timeout=2.0)
        if state is not None and any(
            s["id"] == sub_id for sp in state["spaces"] for s in sp["subscriptions"] if s["durable"]
        ):
            out.append(name)
    return out


def _stock(i: int) -> dict[str, Any]:
    return {
        "symbol": "KEEP" if i % 2 else "DROP",
        "price": 1.0 + i,
        "quantity": i,
        "exchange": "LSE",
        "level": 1,
    }


async def _publish(address: str, numbers: range) -> None:
    async with flowbus.connect(address, name=f"publisher-{numbers.start}") as p:
        for i in numbers:
            await p.publish("stocks", _stock(i))
        await p.flush(30)  # (acknowledged: on a disk, or taken)


async def _away(address: str) -> None:
    """A durable subscription made at ``address``, its client gone: its events queue on disk."""
    async with flowbus.connect(address, name="subscriber") as c:
        await c.subscribe("stocks", KEEP, durable="keep")


async def _take(address: str, n: int) -> list[int]:
    """The subscription's events at ``address``: the first ``n``, and what else comes in 1 s."""
    async with flowbus.connect(address, name="subscriber") as c:
        sub = await c.subscribe("stocks", KEEP, durable="keep")
        got = [(await sub.get(30))["quantity"] for _ in range(n)]
        while True:
            try:
                got.append((await sub.get(1.0))["quantity"])
            except TimeoutError:
                return got


@pytest.mark.parametrize("how", ["kill", "pause"])
def test_a_broker_back_as_a_new_member_hands_its_queue_on_disk_to_the_taker(
    brokers: Brokers, how: str
) -> None:
    b = brokers
    victim, other = b.ring_order()[1], b.ring_order()[0]
    asyncio.run(_away(b.address(victim)))
    asyncio.run(_publish(b.address(other), range(0, 40)))  # 20 for "keep", on the victim's disk
    if how == "kill":  # (restarted on its address and data below)
        b.kill(victim)
    else:  # (paused past the guard: found dead, it steps down when it runs again)
        b.signal(victim, signal.SIGSTOP)
    asyncio.run(_publish(b.address(other), range(40, 60)))  # 10 more: acknowledged once taken over
    (taker,) = [n for n in _serving(b, "keep") if n != victim]  # (its disk has them: it awaits the rest)
    if how == "kill":
        b.start(victim)
    else:
        b.signal(victim, signal.SIGCONT)
    _until(lambda: "handed over" in b.log(victim).read_text(), 30, "the hand-over")
    assert _serving(b, "keep") == [taker]  # (served once: not again where it was)
    got = asyncio.run(_take(b.address(taker), 30))
    assert got == list(range(1, 60, 2))  # every one, once, the older ones first
    assert victim in b.ring_order()  # (back in the ring, as a new member)


def test_a_broker_back_finds_the_taker_of_its_taker(brokers: Brokers) -> None:
    """The broker that took the subscription over died too (before anything came for it):
    the one that took that one over has it now, and gets the queue; nobody else serves it."""
    b = brokers
    order = b.ring_order()
    victim, taker, other = order[1], order[2], order[0]  # (a broker's first backup: its Right)
    asyncio.run(_away(b.address(victim)))
    asyncio.run(_publish(b.address(other), range(0, 40)))
    b.kill(victim)
    time.sleep(3.0)  # (taken over: a refused connection is a proof)
    b.kill(taker)
    time.sleep(3.0)
    b.start(victim)
    _until(lambda: "handed over" in b.log(victim).read_text(), 60, "the hand-over")
    assert _serving(b, "keep") == [order[3]]
    asyncio.run(_publish(b.address(other), range(40, 60)))
    assert asyncio.run(_take(b.address(order[3]), 30)) == list(range(1, 60, 2))


def test_a_durable_subscription_served_elsewhere_is_not_made_afresh(brokers: Brokers) -> None:
    """A client asking another broker for a durable subscription the ring serves (not
    resumed: made afresh, as a client does once its subscription was found nowhere for its
    ``resume_timeout``) is told "not here", naming the broker that serves it: a second copy
    there would take the new events while the first kept the queued ones (the fault
    campaign's overload mix). A new durable subscription is made at once, and the one that
    is served keeps every event, in order."""
    b = brokers
    home, other = b.ring_order()[1], b.ring_order()[3]
    asyncio.run(_away(b.address(home)))
    asyncio.run(_publish(b.address(other), range(0, 20)))

    async def afresh(sub_id: str) -> str:
        async with flowbus.connect(b.address(other), name="subscriber") as c:
            try:
                await c.subscribe("stocks", KEEP, durable=sub_id)
            except SubscribeError as e:
                return str(e)
            return "made"

    refused = asyncio.run(afresh("keep"))
    assert f"not here: broker {b.address(home)} serves it" in refused, refused
    assert asyncio.run(afresh("new")) == "made"  # (nobody serves it: the question went round)
    assert _serving(b, "keep") == [home] and _serving(b, "new") == [other]
    asyncio.run(_publish(b.address(other), range(20, 40)))
    assert asyncio.run(_take(b.address(home), 20)) == list(range(1, 40, 2))


def test_a_client_whose_broker_is_paused_follows_the_broker_named_as_serving_it(brokers: Brokers) -> None:
    """The broker of a durable subscription is paused (found dead, taken over): its client,
    asking for the subscription afresh at once (``resume_timeout=0``), is told "not here"
    by every broker but the taker (the ring serves it there; one that knows names it), and
    moves on until it is there (it stayed at the first broker, asking for ever); nothing
    makes a second copy. The paused broker comes back, hands its queue on disk to the taker,
    and the client takes every event, once, in order."""
    b = brokers
    order = b.ring_order()
    home, other = order[1], order[3]
    asyncio.run(_away(b.address(home)))
    asyncio.run(_publish(b.address(other), range(0, 20)))  # (on home's disk)

    async def run() -> list[int]:
        async with flowbus.connect(
            b.address(home), b.address(other), name="subscriber", idle_timeout=3.0, resume_timeout=0.0
        ) as c:
            sub = await c.subscribe("stocks", KEEP, durable="keep")
            got = [(await sub.get(30))["quantity"] for _ in range(10)]
            b.signal(home, signal.SIGSTOP)  # (found dead after the guard: taken over)
            await asyncio.to_thread(lambda: asyncio.run(_publish(b.address(other), range(20, 40))))
            taker = await asyncio.to_thread(_until, lambda: _serving(b, "keep"), 30, "the takeover")
            b.signal(home, signal.SIGCONT)  # (it steps down, and hands its queue on disk over)
            while len(set(got)) < 20:
                got.append((await sub.get(60))["quantity"])
            assert c.broker == b.address(taker[0])
            return got

    try:
        assert asyncio.run(run()) == list(range(1, 40, 2))  # (every one, once, in order)
        assert len(_serving(b, "keep")) == 1  # (one copy: the taker's, where the client is)
    finally:
        b.signal(home, signal.SIGCONT)


def test_the_finder_asks_the_ring_once_for_the_subscriptions_asked_about_together() -> None:
    """A client back at a broker asks for its subscriptions at once: one question goes
    round the ring for all of them; each is answered by who serves it, or by the question
    coming back (nobody)."""
    from types import SimpleNamespace

    from flowbus.broker.handover import Finder
    from flowbus.routing.ring_handover import HeldHere, WhereIs

    asked: list[list[str]] = []
    core: Any = SimpleNamespace(
        addr=1, ring=SimpleNamespace(right=2), ask_where=lambda subs: asked.append(list(subs)) or []
    )
    finder = Finder(core=core, apply=lambda effects: None, pending=set)

    async def main() -> None:
        got = asyncio.gather(*(finder.holder(s) for s in ("s2", "s1", "s3")))
        await asyncio.sleep(0.05)
        assert asked == [["s1", "s2", "s3"]]
        finder.held(7, HeldHere(("s1", "s3")))
        finder.walked(WhereIs(1, ("s2",), 4))
        assert await got == [None, 7, 7]

    asyncio.run(main())
