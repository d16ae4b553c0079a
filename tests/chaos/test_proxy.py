"""The chaos proxy: its rules, each frame's fate (without sockets, seeded), one proxy on
127.0.0.1 between a client and a fake broker, and the nemesis writing the proxies' rules."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import struct
from pathlib import Path
from typing import Any, cast

import pytest

from flowbus.chaos.brokers import Brokers
from flowbus.chaos.hosts import Hosts
from flowbus.chaos.nemesis import LINKS, MIXES, NETWORK, Fault, Nemesis, proxied, schedule
from flowbus.chaos.proxy import (
    MAX_RETRIES,
    RTO,
    LinkRules,
    Proxies,
    Proxy,
    Rules,
    Shaper,
    frame_tag,
    split_frames,
)
from flowbus.client import protocol as p
from flowbus.errors import ExperimentError
from flowbus.net.codec import encode, frame

# ------------------------------------------------------------------------------------- the rules


def test_rules_are_read_and_checked(tmp_path: Path) -> None:
    doc = {
        "links": {
            "10.250.7.2": {"delay_ms": 40, "jitter_ms": 30, "loss": 0.05, "dup": 0.02, "reorder": 0.05}
        },
        "ack_cut": {"peer": "10.250.7.9", "when": "before"},
    }
    rules = Rules.parse(doc)
    assert rules.links["10.250.7.2"] == LinkRules(40, 30, 0.05, 0.02, 0.05, 50)
    assert rules.ack_cut is not None and (rules.ack_cut.peer, rules.ack_cut.when) == ("10.250.7.9", "before")
    assert Rules.load(tmp_path / "none.json") == Rules()
    for bad, what in [
        ({"links": {"10.0.0.1": {"loss": 1.5}}}, "probability"),
        ({"links": {"10.0.0.1": {"delay": 5}}}, "unknown fields"),
        ({"links": {"here": {}}}, "not an IPv4"),
        ({"links": {"10.0.0.1": {"delay_ms": -1}}}, "milliseconds"),
        ({"ack_cut": {"peer": "10.0.0.1", "when": "during"}}, "before"),
        ({"nemesis": 1}, "unknown keys"),
    ]:
        with pytest.raises(ValueError, match=what):
            Rules.parse(bad)


# ------------------------------------------------------------------------------ a frame's fate


def fates(rules: LinkRules | None, n: int, *, seed: int = 1, every: float = 0.001) -> list[Any]:
    shaper = Shaper(random.Random(seed))
    return [shaper.decide(rules, 100.0 + i * every) for i in range(n)]


def test_no_rules_forward_at_once_in_order() -> None:
    out = fates(None, 10)
    assert [f.release for f in out] == [100.0 + i * 0.001 for i in range(10)]
    assert not any(f.lost or f.duplicated or f.reordered for f in out)


def test_delay_and_jitter_keep_the_order_and_never_go_negative() -> None:
    out = fates(LinkRules(delay_ms=40, jitter_ms=30), 2000)
    waits = [f.release - (100.0 + i * 0.001) for i, f in enumerate(out)]
    assert not any(f.lost or f.reordered for f in out)
    assert all(a.release <= b.release for a, b in itertools.pairwise(out))  # (in order)
    assert min(waits) >= 0.010 - 1e-9 and max(waits) <= 0.070 + 1e-9  # (40 ± 30, or behind the one ahead)
    apart = fates(LinkRules(delay_ms=40, jitter_ms=30), 2000, every=0.1)  # (none behind another)
    waits = [f.release - (100.0 + i * 0.1) for i, f in enumerate(apart)]
    assert 0.037 < sum(waits) / len(waits) < 0.043 and min(waits) < 0.012 and max(waits) > 0.068
    big_jitter = fates(LinkRules(delay_ms=5, jitter_ms=50), 500, every=1.0)  # (far apart: none waits)
    assert all(f.release >= 100.0 + i * 1.0 for i, f in enumerate(big_jitter))  # (never before it came)
    assert any(f.release == 100.0 + i * 1.0 for i, f in enumerate(big_jitter))  # (some wait 0)


def test_loss_dup_and_reorder_at_their_rates_seeded_and_in_order() -> None:
    """What TCP makes of a lossy, doubling, reordering network: every frame arrives once,
    in order, the faulty ones late and those behind them with them."""
    rules = LinkRules(loss=0.1, dup=0.2, reorder=0.05, reorder_ms=60)
    out = fates(rules, 20_000)
    assert out == fates(rules, 20_000)  # (the same seed: the same fates)
    assert out != fates(rules, 20_000, seed=2)
    assert all(a.release <= b.release for a, b in itertools.pairwise(out))
    assert 0.09 < sum(f.lost for f in out) / len(out) < 0.13  # (0.1 + 0.01 + ...: a loss again)
    assert 0.17 < sum(f.duplicated for f in out) / len(out) < 0.23
    assert 0.04 < sum(f.reordered for f in out) / len(out) < 0.06


def test_a_lost_segment_waits_for_its_retransmissions_and_holds_those_behind() -> None:
    shaper = Shaper(random.Random(1))
    lost = shaper.decide(LinkRules(delay_ms=10, loss=0.999999), 100.0)
    assert lost.lost == MAX_RETRIES
    assert lost.release == pytest.approx(100.01 + RTO * (2**MAX_RETRIES - 1))
    behind = shaper.decide(LinkRules(delay_ms=10), 100.001)
    assert behind.release == lost.release and behind.lost == 0 and behind.delayed


def test_a_reordered_segment_holds_the_ones_that_came_before_it() -> None:
    shaper = Shaper(random.Random(1))
    held = shaper.decide(LinkRules(delay_ms=10, reorder=1.0, reorder_ms=60), 100.0)
    assert held.reordered and held.release == pytest.approx(100.07)
    later = shaper.decide(LinkRules(delay_ms=10), 100.001)
    assert not later.reordered and later.release == held.release  # (TCP holds it for the first)
    assert shaper.decide(None, 100.08).release == pytest.approx(100.08)


def test_frames_are_cut_whole_and_tagged() -> None:
    ack = frame(encode(p.PubAck(p.pack_pubacks([1, 2]))))
    hello = frame(encode(p.Hello("me")))
    buf = bytearray(ack + hello[:7])
    assert split_frames(buf) == [ack] and bytes(buf) == hello[:7]
    buf += hello[7:]
    assert split_frames(buf) == [hello] and not buf
    assert frame_tag(ack) == "client.pub_ack"
    assert frame_tag(hello) == "client.hello"
    assert frame_tag(frame(encode((5, "x")))) == "tuple"


# ------------------------------------------------------------------------------- on sockets


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


async def _frames(reader: asyncio.StreamReader, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        (size,) = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), 5))
        out.append(await asyncio.wait_for(reader.readexactly(size), 5))
    return out


@pytest.mark.broker
def test_a_proxy_on_loopback(tmp_path: Path) -> None:
    """Frames both ways, duplicated by a rule, a pub_ack cut before it reaches the client,
    and a reset when the broker is gone."""
    rules = tmp_path / "rules.json"

    async def main() -> None:
        upstream: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()

        async def accept(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await upstream.put((r, w))

        broker = await asyncio.start_server(accept, "127.0.0.1", 0)
        target = broker.sockets[0].getsockname()[:2]
        proxy = Proxy(("127.0.0.1", 0), target, rules, seed=3)
        await proxy.start()
        host, port = proxy.address.split(":")
        try:
            # (no rules: frames pass both ways, whole, in order)
            cr, cw = await asyncio.open_connection(host, int(port))
            br, bw = await asyncio.wait_for(upstream.get(), 5)
            cw.write(b"".join(_frame(b"up%d" % i) for i in range(3)))
            assert await _frames(br, 3) == [b"up0", b"up1", b"up2"]
            bw.write(_frame(b"down"))
            assert await _frames(cr, 1) == [b"down"]

            # (every segment from 127.0.0.1 doubled and lost once, both ways: TCP delivers
            # each frame once, in order, a retransmission timeout late; then an ack cut before)
            rules.write_text(json.dumps({"links": {"127.0.0.1": {"dup": 1.0, "delay_ms": 5, "loss": 0.3}}}))
            await asyncio.sleep(0.3)
            cw.write(b"".join(_frame(b"once%d" % i) for i in range(4)))
            assert await _frames(br, 4) == [b"once%d" % i for i in range(4)]
            rules.write_text(json.dumps({"ack_cut": {"peer": "127.0.0.1", "when": "before"}}))
            await asyncio.sleep(0.3)
            bw.write(_frame(b"event") + frame(encode(p.PubAck(p.pack_pubacks([7])))))
            assert await _frames(cr, 1) == [b"event"]
            assert await asyncio.wait_for(cr.read(), 5) == b""  # (closed: the ack never came)
            assert await asyncio.wait_for(br.read(), 5) == b""
            cw.close()

            # (disarmed once it fired: a new connection's acks pass)
            cr, cw = await asyncio.open_connection(host, int(port))
            br, bw = await asyncio.wait_for(upstream.get(), 5)
            ack = frame(encode(p.PubAck(p.pack_pubacks([8]))))
            bw.write(ack)
            assert await asyncio.wait_for(cr.readexactly(len(ack)), 5) == ack
            cw.close()
            bw.close()

            # (the broker gone: a connection is reset, not closed in order)
            broker.close()
            await broker.wait_closed()
            cr, cw = await asyncio.open_connection(host, int(port))
            with pytest.raises(ConnectionResetError):
                await asyncio.wait_for(cr.read(), 5)
            cw.close()
        finally:
            broker.close()
            await proxy.close()
        stats = json.loads(Path(f"{rules}.stats.json").read_text())
        assert stats["duplicated"] == 4 and stats["retransmitted"] >= 1
        assert stats["cuts"] == 1 and stats["resets"] == 1
        assert stats["connections"] == 3 and stats["dropped"] == 1
        assert stats["by_source"]["127.0.0.1"]["cuts"] == 1

    asyncio.run(asyncio.wait_for(main(), 30))


# ------------------------------------------------------------------------------- the nemesis


class FakeHosts:
    def ip(self, host: str) -> str:
        return f"10.250.7.{int(host[1:]) + 1}" if host != "c" else "10.250.7.9"

    def address(self, host: str) -> str:
        return f"{self.ip(host)}:7000"


class FakeBrokers:
    def address(self, name: str) -> str:
        return FakeHosts().address(name)


def test_the_new_mixes_are_seeded_and_need_namespaces() -> None:
    links = schedule(MIXES["links"], 1, brokers=5, detect=5.0)
    assert sorted(f.kind for f in links) == sorted(LINKS)  # (each kind once)
    assert links == schedule(MIXES["links"], 1, brokers=5, detect=5.0)
    for f in links:
        assert 1 <= len(f.targets) == len(f.others) <= 3
        assert all(b == (a + 1) % 5 for a, b in zip(f.targets, f.others, strict=True))  # (ring neighbours)
        assert f.rules and set(f.rules) <= set(LinkRules.FIELDS)
    acks = schedule(MIXES["acks"], 2, brokers=5, detect=5.0)
    assert {f.kind for f in acks} == {"ack-cut"} and all(f.rules["when"] in ("before", "after") for f in acks)
    assert proxied(MIXES["links"]) and proxied(MIXES["acks"]) and not proxied(MIXES["mixed"])
    assert {"delay", "loss", "dup", "reorder", "ack-cut"} <= NETWORK


def test_the_nemesis_writes_both_proxies_rules(tmp_path: Path) -> None:
    hosts = cast(Hosts, FakeHosts())
    proxies = Proxies(hosts, root=tmp_path)
    nemesis = Nemesis(
        hosts,
        cast(Brokers, FakeBrokers()),
        order=["b2", "b0", "b1"],
        clients="c",
        log=tmp_path / "faults.jsonl",
        proxies=proxies,
        publishers={"pub0": "b1", "pub1": "b2"},
        where=tmp_path / "where.json",
    )

    def rules(name: str) -> Any:
        return json.loads(proxies.rules_path(name).read_text())

    delay = Fault("delay", 1.0, 5.0, (0,), (1,), (("delay_ms", 40), ("jitter_ms", 10)))
    nemesis.inject(delay)  # (positions 0 and 1: b2 and b0)
    assert rules("b2")["links"] == {"10.250.7.1": {"delay_ms": 40, "jitter_ms": 10}}
    assert rules("b0")["links"] == {"10.250.7.3": {"delay_ms": 40, "jitter_ms": 10}}
    nemesis.heal(delay)
    assert rules("b2")["links"] == {} and rules("b0")["links"] == {}
    cut = Fault("ack-cut", 9.0, 2.0, (4,), (), (("when", "after"),))  # (pub0: 4 % 2)
    nemesis.inject(cut)  # (no where.json yet: the broker pub0 is given first)
    assert rules("b1")["ack_cut"] == {"peer": "10.250.7.9", "when": "after"}
    (tmp_path / "where.json").write_text(json.dumps({"pub0": "10.250.7.1:7000"}))  # (pub0 moved to b0)
    nemesis.heal(cut)  # (the rule it set is removed, wherever pub0 is now)
    assert "ack_cut" not in rules("b1")
    again = Fault("ack-cut", 19.0, 2.0, (0,), (), (("when", "before"),))
    nemesis.inject(again)
    assert rules("b0")["ack_cut"] == {"peer": "10.250.7.9", "when": "before"}
    noted = [json.loads(line) for line in (tmp_path / "faults.jsonl").read_text().splitlines()]
    assert noted[0]["links"] == [["b2", "b0"]] and noted[0]["params"] == {"delay_ms": 40, "jitter_ms": 10}
    assert [(n["hosts"], n["publisher"]) for n in noted[2:]] == [(["b1"], "pub0")] * 2 + [(["b0"], "pub0")]


class FakeCutHosts(FakeHosts):
    def __init__(self) -> None:
        self.cuts: set[frozenset[str]] = set()

    def cut(self, a: str, b: str, both: bool = True) -> None:
        self.cuts.add(frozenset((a, b)))

    def mend(self, a: str, b: str, both: bool = True) -> None:
        self.cuts.discard(frozenset((a, b)))


def test_a_partition_cuts_the_ring_in_its_order_when_made_and_the_heal_mends_those_links(
    tmp_path: Path,
) -> None:
    """Brokers restarted by earlier faults joined elsewhere in the ring: by the order of the
    run's start, "the ring split 2 + 3" cut it into interleaved sides (a broker whose both
    ring neighbours were across the cut: each side found the other's lone brokers dead and
    took them over, 16 s served twice in a traced run)."""
    hosts = FakeCutHosts()
    orders = [["b0", "b1", "b2", "b3", "b4"], ["b0", "b3", "b1", "b4", "b2"]]
    nemesis = Nemesis(
        cast(Hosts, hosts),
        cast(Brokers, FakeBrokers()),
        order=orders[0],
        clients="c",
        log=tmp_path / "faults.jsonl",
        ring_order=lambda: orders[-1],
    )
    split = Fault("split", 1.0, 5.0, (1, 2), (3, 4, 0))  # (positions: two arcs of the ring)
    nemesis.inject(split)
    assert hosts.cuts == {frozenset((a, b)) for a in ("b3", "b1") for b in ("b4", "b2", "b0")}
    orders.append(orders[0])  # (the order changes again before the heal)
    nemesis.heal(split)
    assert hosts.cuts == set()
    noted = [json.loads(line) for line in (tmp_path / "faults.jsonl").read_text().splitlines()]
    assert [n["hosts"] for n in noted] == [["b3", "b1"], ["b3", "b1"]]
    orders.append(["b0", "b1"])  # (brokers that did not answer: the order known last, the split's)
    nemesis.inject(Fault("one-way", 9.0, 2.0, (0,), (1,)))
    assert hosts.cuts == {frozenset(("b0", "b3"))}


class FakeFlows:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.refuse_undeploy = False

    def deploy(self, broker: str, text: str) -> str | None:
        self.calls.append(("deploy", broker, text.split("\n", 1)[0]))
        return None

    def undeploy(self, broker: str, name: str) -> str | None:
        self.calls.append(("undeploy", broker, name))
        return "ClientError: no lease" if self.refuse_undeploy else None


def test_a_redeploy_deploys_a_flow_across_a_partition_and_undeploys_it_at_the_heal(tmp_path: Path) -> None:
    hosts, flows = FakeCutHosts(), FakeFlows()
    nemesis = Nemesis(
        cast(Hosts, hosts),
        cast(Brokers, FakeBrokers()),
        order=["b0", "b1", "b2", "b3"],
        clients="c",
        log=tmp_path / "faults.jsonl",
        flows=flows,
    )
    fault = Fault("redeploy", 1.0, 5.0, (1,), (3,))
    nemesis.inject(fault)
    assert hosts.cuts == {frozenset(("b1", o)) for o in ("b0", "b2", "b3")}  # (cut off from brokers)
    assert flows.calls == [("deploy", "b3", "name: extra")]  # (through the other side)
    flows.refuse_undeploy = True
    nemesis.heal(fault)
    assert hosts.cuts == set() and flows.calls[1:] == [("undeploy", "b1", "extra")]
    noted = [json.loads(line) for line in (tmp_path / "faults.jsonl").read_text().splitlines()]
    assert [(n["what"], n.get("error")) for n in noted] == [
        ("inject", None),
        ("deploy", None),
        ("undeploy", "ClientError: no lease"),
        ("heal", None),
    ]
    redeploys = schedule(MIXES["flows"], 3, brokers=5, detect=5.0)
    assert {f.kind for f in redeploys} <= {"redeploy", "kill", "isolate"} and "flows" in MIXES
    assert all(f.others[0] != f.targets[0] for f in redeploys if f.kind == "redeploy")
    assert "redeploy" in NETWORK
    without = Nemesis(cast(Hosts, FakeCutHosts()), cast(Brokers, FakeBrokers()), order=["b0"], clients="c",
                      log=tmp_path / "other.jsonl")  # fmt: skip
    with pytest.raises(ExperimentError, match="needs a way to deploy flows"):
        without.inject(fault)
