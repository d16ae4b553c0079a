"""The web console in a real browser: headless Chromium (Debian's ``chromium``, driven by
Playwright; no browser is downloaded) loads each page of a ring of three broker processes
(``flowbus cluster up --http``: the first broker serves the console), the stock flow
deployed and events flowing, and the tests
check what a person sees: every space of the flow drawn, one route per publisher-subscriber
pair in the rewritten view, the three brokers on the ring page, counts that rise. Bad HTTP
requests to the broker process while events flow leave every delivery and the broker alone.

Each page is saved as a PNG; ``FLOWBUS_CONSOLE_SHOTS=docs/console pytest
tests/broker/test_console_browser.py`` writes them where the README shows them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright
from tests.ports import consecutive_free_ports

import flowbus
from flowbus.flow import find_paths
from flowbus.flow.deploy import Deployment
from flowbus.flow.html import flow_page

pytestmark = pytest.mark.browser

STOCKS = Path(__file__).parents[2] / "examples" / "stocks" / "flow.yaml"
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


class Traffic(threading.Thread):
    """The stock flow's generated input published at the first broker, about 400 events a
    second, and subscribers of its derived spaces draining, until stopped."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.address = address
        self.halt = threading.Event()
        self.published = 0
        self.received = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # (reported by the fixture)
            self.error = e

    async def _drain(self, sub: Any) -> None:
        async for _ in sub:
            self.received += 1

    async def _main(self) -> None:
        events = list(Deployment.from_file(STOCKS).generate(events=4000))
        async with flowbus.connect(self.address, name="traffic") as c:
            subs = [await c.subscribe(s) for s in ("big_trades", "combined", "compressed", "alarms")]
            drains = [asyncio.ensure_future(self._drain(s)) for s in subs]
            while not self.halt.is_set():
                for space, event in events[self.published % 4000 :][:20]:
                    await c.publish(space, event)
                    self.published += 1
                await asyncio.sleep(0.05)
            for d in drains:
                d.cancel()


@dataclass
class Ring:
    console: str  # the first broker's console URL
    addresses: list[str]
    cluster: subprocess.Popen[str]
    traffic: Traffic


def _cluster_lines(proc: subprocess.Popen[str]) -> list[str]:
    """What ``cluster up`` prints, up to the line saying the flow is deployed."""
    assert proc.stdout is not None
    lines: list[str] = []
    while not any(" deployed; publish into " in line for line in lines):
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"cluster up ended: {lines}")
        lines.append(line.strip())
    return lines


@pytest.fixture(scope="module")
def ring3(tmp_path_factory: pytest.TempPathFactory, _matching_compiled: None) -> Iterator[Ring]:
    """``flowbus cluster up --brokers 3 --flow STOCKS --http 127.0.0.1:0``, and traffic."""
    log = tmp_path_factory.mktemp("console-ring") / "cluster-log.txt"
    port = consecutive_free_ports(3)
    cmd = [sys.executable, "-m", "flowbus", "cluster", "up", "--brokers", "3", "--port", str(port),
           "--flow", str(STOCKS), "--http", "127.0.0.1:0"]  # fmt: skip
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
            start_new_session=True,  # (its brokers in its process group: all stopped below)
        )
    try:
        with ThreadPoolExecutor(1) as pool:
            lines = pool.submit(_cluster_lines, proc).result(90)
        addresses = [m.group(1) for line in lines if (m := re.match(r"broker (\S+) \(pid \d+\)$", line))]
        assert addresses == [f"127.0.0.1:{port + i}" for i in range(3)], lines
        urls = [line.removeprefix("console: ") for line in lines if line.startswith("console: ")]
        assert len(urls) == 1 and re.fullmatch(r"http://127\.0\.0\.1:\d+/", urls[0]), lines
        traffic = Traffic(addresses[0])
        traffic.start()
        yield Ring(urls[0], addresses, proc, traffic)
        traffic.halt.set()
        traffic.join(10)
        assert traffic.error is None, traffic.error
    finally:
        proc.send_signal(signal.SIGINT)  # (cluster up stops its brokers)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        with contextlib.suppress(ProcessLookupError):  # (brokers left behind if it timed out)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        print(log.read_text(errors="replace")[-5000:])


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)  # (a fresh profile each launch)
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    yield context.new_page()
    context.close()


def _shot(page: Page, name: str, tmp_path: Path, *, full: bool = True) -> None:
    """The page (or what the window shows of it) as a PNG (and in $FLOWBUS_CONSOLE_SHOTS, if set)."""
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=full)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    where = os.environ.get("FLOWBUS_CONSOLE_SHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(where) / path.name)


def _number(page: Page, selector: str, pattern: str = r"(\d+)") -> int:
    text = page.locator(selector).first.text_content() or ""
    m = re.search(pattern, text)
    return int(m.group(1)) if m else -1


def _rises(page: Page, selector: str, pattern: str = r"(\d+)") -> tuple[int, int]:
    """Two readings of a number the page updates by itself, a few seconds apart."""
    page.wait_for_function(
        "([s, p]) => new RegExp(p).test(document.querySelector(s)?.textContent || '')",
        arg=[selector, pattern],
    )
    first = _number(page, selector, pattern)
    time.sleep(2.5)
    return first, _number(page, selector, pattern)


def test_the_flow_page_draws_every_space_and_one_route_per_pair_and_its_counts_rise(
    ring3: Ring, page: Page, tmp_path: Path
) -> None:
    d = Deployment.from_file(STOCKS)
    page.goto(ring3.console + "flows/stocks")
    before = page.locator("figure.before g.space")
    assert before.count() == len(d.graph.spaces)
    for i in range(before.count()):
        assert before.nth(i).is_visible()
    drawn = {before.nth(i).get_attribute("data-space") for i in range(before.count())}
    assert drawn == {s.name for s in d.graph.spaces}
    assert (
        page.locator("figure.before g.space", has_text="max_cur").locator("text").nth(1).text_content()
        == "state"
    )
    routes = page.locator("figure.after g.arc-route")
    pairs = [(routes.nth(i).get_attribute("data-source"), routes.nth(i).get_attribute("data-target"))
             for i in range(routes.count())]  # fmt: skip
    assert sorted(pairs) == sorted((p.source, p.sink) for p in find_paths(d.graph))
    assert len(set(pairs)) == len(pairs) == 10
    label = page.locator(
        'figure.after g.arc-route[data-source="NYSE"][data-target="big_trades"] g.label text'
    )
    assert [label.nth(i).text_content() for i in range(label.count())] == [
        "NYSE->big_trades: route",
        "S: price * vol >= 1000000",
        "T: [com=NYS(issue), cap=price * vol]",
        "shared: price * vol",
    ]
    assert label.nth(1).is_visible()
    first, later = _rises(page, 'figure.before [data-count="NYSE"]', r"pub (\d+)")
    assert later > first > 0
    deliveries = _rises(page, 'figure.after [data-count="combined.sub"]', r"del (\d+)")
    assert deliveries[1] > deliveries[0] > 0
    through = _rises(page, 'figure.before [data-arc-count="T1"]', r"(\d+) events")  # an arc
    assert through[1] > through[0] > 0
    routed = _rises(page, 'figure.after [data-arc-count="NYSE->combined.sub"]', r"(\d+) events")  # a route
    assert routed[1] > routed[0] > 0
    assert re.fullmatch(
        r"1 subs · \d+/s", page.locator('figure.after [data-rate="big_trades"]').text_content() or ""
    )
    _shot(page, "flow", tmp_path)


def test_the_offline_page_of_flow_explain_draws_both_graphs_with_no_network(
    browser: Browser, tmp_path: Path
) -> None:
    d = Deployment.from_file(STOCKS)
    out = tmp_path / "stocks.html"
    out.write_text(flow_page(d.graph))  # (what flowbus flow explain --html writes)
    context = browser.new_context(viewport={"width": 1600, "height": 1000}, offline=True)
    try:
        page = context.new_page()
        page.goto(out.as_uri())
        spaces = page.locator("figure.before g.space")
        assert spaces.count() == len(d.graph.spaces) and spaces.last.is_visible()
        assert page.locator("figure.after g.arc-route").count() == len(find_paths(d.graph))
        assert page.locator("table.paths tr").count() == len(find_paths(d.graph)) + 1
    finally:
        context.close()


def test_the_ring_page_names_the_three_brokers(ring3: Ring, page: Page, tmp_path: Path) -> None:
    page.goto(ring3.console + "ring")
    rows = page.locator("table.ring tr")
    assert rows.count() == 4  # (a header and three brokers)
    table = page.locator("table.ring").inner_text()
    for address in ring3.addresses:
        assert address in table
        assert page.locator(f'svg.ring-drawing g.broker[data-address="{address}"]').is_visible()
    assert "this broker" in rows.nth(1).inner_text() and ring3.addresses[0] in rows.nth(1).inner_text()
    assert table.count("normal") == 2 and "suspected" not in table
    _shot(page, "ring", tmp_path)


def test_the_spaces_page_counts_rise_and_lists_the_subscriptions(
    ring3: Ring, page: Page, tmp_path: Path
) -> None:
    page.goto(ring3.console + "spaces")
    first, later = _rises(page, '[data-space-stat="NYSE|in"]')
    assert later > first > 0
    delivered = _rises(page, '[data-space-stat="combined|deliveries"]')
    assert delivered[1] > delivered[0] > 0
    subs = page.locator("table.subscriptions").inner_text()
    for space in ("big_trades", "combined", "compressed", "alarms"):
        assert space in subs
    assert "stocks:E4" in subs  # (compressed catches up with its expand arc's rule set)
    _shot(page, "spaces", tmp_path)


def test_the_overview_links_to_the_flow_and_metrics_follow_the_traffic(
    ring3: Ring, page: Page, tmp_path: Path
) -> None:
    page.goto(ring3.console)
    assert page.locator('[data-stat="peers"], table.overview').first.is_visible()
    first, later = _rises(page, '[data-stat="published"]')
    assert later > first > 0
    _shot(page, "overview", tmp_path)
    page.get_by_role("link", name="stocks").click()
    page.wait_for_url("**/flows/stocks")
    assert page.locator("figure.after svg").is_visible()

    def published() -> float:
        page.goto(ring3.console + "metrics")
        text = page.locator("body").inner_text()
        m = re.search(r'^flowbus_events_in_total\{space="NYSE"\} (\S+)$', text, re.M)
        assert m is not None, text[:2000]
        return float(m.group(1))

    before = published()
    time.sleep(1.0)
    assert published() > before > 0
    assert re.search(
        r'^flowbus_publish_latency_seconds_bucket\{le="0.1",space="NYSE"\} \d', page.inner_text("body"), re.M
    )
    _shot(page, "metrics", tmp_path, full=False)


def _raw(port: int, data: bytes, *, slow: bool = False) -> bytes:
    """Send ``data`` to the console (a byte at a time, slowly, if ``slow``); what comes back."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        try:
            for i in range(0, len(data), 1 if slow else len(data) or 1):
                s.sendall(data[i : i + (1 if slow else len(data))])
                if slow:
                    time.sleep(0.5)
            out = b""
            while chunk := s.recv(65536):
                out += chunk
            return out
        except (ConnectionError, TimeoutError):
            return b""


def test_bad_requests_to_the_broker_process_while_events_flow_lose_no_delivery(ring3: Ring) -> None:
    port = int(ring3.console.rsplit(":", 1)[1].strip("/"))
    n = 2000
    marks = [{"com": "IBM", "price": 1.0, "vol": 10_000_000 + i} for i in range(n)]

    async def exact() -> list[int]:
        async with (
            flowbus.connect(ring3.addresses[2], name="exact-sub") as s,
            flowbus.connect(ring3.addresses[0], name="exact-pub") as p,
        ):
            sub = await s.subscribe("combined", "vol >= 10000000")
            await asyncio.sleep(0.5)

            async def publish() -> None:
                for e in marks:
                    await p.publish("combined", e)
                await p.flush(60)

            async def take() -> list[int]:
                return [(await sub.get(20))["vol"] - 10_000_000 for _ in range(n)]

            return (await asyncio.gather(publish(), take()))[1]

    results: dict[str, bytes] = {}
    bad = {
        "garbage": (b"\x00\xff garbage \r\n\r\n", False),
        "huge": (b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 100_000 + b"\r\n\r\n", False),
        "unknown": (b"GET /no/such/page HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", False),
        "post": (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", False),
        "slow": (b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 60, True),
    }
    threads = [
        threading.Thread(target=lambda k=k, v=v: results.__setitem__(k, _raw(port, v[0], slow=v[1])))
        for k, v in bad.items()
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    with ThreadPoolExecutor(1) as pool:  # (Playwright's loop runs in this thread)
        got = pool.submit(lambda: asyncio.run(exact())).result(120)
    for t in threads:
        t.join(60)
    assert got == list(range(n))  # every delivery, once, in order
    assert results["garbage"].startswith(b"HTTP/1.1 400")
    assert results["huge"].startswith(b"HTTP/1.1 431") or results["huge"] == b""  # (or reset mid-send)
    assert results["unknown"].startswith(b"HTTP/1.1 404")
    assert results["post"].startswith(b"HTTP/1.1 405")
    assert results["slow"] == b""  # (closed: the request took too long)
    assert ring3.cluster.poll() is None
    for address in ring3.addresses:  # (each broker still listens)
        host, port_text = address.rsplit(":", 1)
        socket.create_connection((host, int(port_text)), timeout=5).close()
    with urllib.request.urlopen(ring3.console + "metrics", timeout=10) as reply:
        assert reply.status == 200
    assert ring3.traffic.error is None and ring3.traffic.received > 0
