"""`flowbus cluster up --max-brokers`: brokers over their load limit ask for another broker;
the cluster starts one, which joins the ring next to the asker and carries events."""

from __future__ import annotations

import asyncio
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from tests.ports import consecutive_free_ports

import flowbus

pytestmark = pytest.mark.broker

FLOWBUS = [sys.executable, "-m", "flowbus"]


class Lines:
    """A process's output lines, read by a thread (a line may wait in a buffer that
    ``select`` does not see)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.put(line)

    def next(self, timeout: float) -> str | None:
        """The next line, or None after ``timeout`` seconds without one."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None


async def _grow(out: Lines, port: int) -> tuple[str | None, str | None, dict[str, object]]:
    """Three subscriptions at each of the two brokers (both over their limit of 2 state
    entries: neither has room), held open; the line saying a broker joined, the next line
    within 6 s (None: nobody asked again), and an event published at the newcomer for a
    subscription at the first broker."""
    first, second, third = (f"127.0.0.1:{port + i}" for i in range(3))
    async with flowbus.connect(first) as a, flowbus.connect(second) as b:
        for client in (a, b):
            for i in range(3):
                await client.subscribe("stocks", f"price > {i}")
        joined = await asyncio.to_thread(out.next, 60)
        again = await asyncio.to_thread(out.next, 6.0)
        sub = await a.subscribe("stocks", 'symbol = "NEW"')
        async with flowbus.connect(third) as c:
            for _ in range(80):  # (published again until the subscription has reached the newcomer)
                await c.publish(
                    "stocks", {"symbol": "NEW", "price": 1.0, "quantity": 1, "exchange": "X", "level": 1}
                )
                try:
                    return joined, again, dict(await sub.get(0.25))
                except TimeoutError:
                    continue
    raise AssertionError("no event")


def test_a_loaded_ring_grows_by_one_broker_and_takes_it_in(tmp_path: Path) -> None:
    cfg = tmp_path / "broker.yaml"
    cfg.write_text("heartbeat: 0.5\nload_limit: 2\n")
    port = consecutive_free_ports(3)
    cmd = [
        *FLOWBUS,
        "cluster",
        "up",
        "--brokers",
        "2",
        "--max-brokers",
        "4",
        "--port",
        str(port),
        "--http",
        "off",
    ]
    proc = subprocess.Popen([*cmd, "--config", str(cfg)], stdout=subprocess.PIPE, text=True)
    try:
        out = Lines(proc)
        lines = [out.next(60) for _ in range(3)]
        assert lines[2] is not None and "2 broker(s) up" in lines[2]
        joined, again, event = asyncio.run(_grow(out, port))
        assert joined is not None and joined.startswith(f"broker 127.0.0.1:{port + 2} ")
        assert "was over its limit" in joined
        assert again is None  # the newcomer has room: nobody asks again
        assert event["symbol"] == "NEW"  # the ring took it in: it carries events
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()
    done = subprocess.run([*cmd[:-2], "--port", str(port), "--brokers", "3", "--max-brokers", "2"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "--max-brokers: 2 is below --brokers 3" in done.stderr


def test_the_load_limits_of_a_broker_config() -> None:
    from flowbus.broker.config import BrokerConfig
    from flowbus.errors import ConfigError

    cfg = BrokerConfig.from_mapping({"load_limit": 5, "rate_limit": 2000})
    assert (cfg.load_limit, cfg.rate_limit) == (5, 2000)
    assert BrokerConfig().load_limit is None and BrokerConfig().rate_limit is None
    with pytest.raises(ConfigError, match="load_limit"):
        BrokerConfig.from_mapping({"load_limit": 0})
    with pytest.raises(ConfigError, match="rate_limit"):
        BrokerConfig.from_mapping({"rate_limit": True})
