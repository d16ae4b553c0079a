"""The console's live page (``/live``) in a real browser: headless Chromium, launched as
test_console_browser.py launches it (its fixtures). A person picks a space and a filter (a JMS
selector, then a flowbus filter), a native client publishes, and the page shows exactly the
matching events, newest on top, the last 200 of them, with a count of all of them; what events
hold is shown as text (HTML in them is no markup); a bad selector's ERROR is said on the page.

The broker has rights (the page sends a token) and no STOMP listener: the console's ``/stomp``
is served by a door of its own, and stomp.js by the console (nothing is fetched from
elsewhere: the page's requests are checked)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect
from tests.broker import test_console_browser
from tests.broker.test_console_browser import _shot
from tests.broker.test_stomp import ALICE, CONFIG, WAIT, Door, broker, native

from flowbus.broker.pages import LIVE_KEPT

pytestmark = [pytest.mark.browser, pytest.mark.broker]

browser, page = test_console_browser.browser, test_console_browser.page  # (its fixtures: Chromium)


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory, _matching_compiled: None) -> Iterator[Door]:
    """A broker process with a console and no STOMP listener, for the module."""
    with broker(tmp_path_factory.mktemp("live"), CONFIG, http="127.0.0.1:0") as started:
        assert started.port == 0 and started.console is not None
        yield started


def _subscribe(page: Page, space: str, kind: str, text: str) -> None:
    """Fill the live page's form and subscribe."""
    page.fill('input[name="space"]', space)
    page.check(f'input[name="kind"][value="{kind}"]')
    page.fill('input[name="text"]', text)
    page.fill('input[name="passcode"]', ALICE)
    page.click('button[type="submit"]')


def _publish(door: Door, sent: list[dict[str, Any]]) -> None:
    with native(door) as client:
        for e in sent:
            client.publish("events", e)
        client.flush(WAIT)


def _shown(page: Page, count: int) -> list[dict[str, Any]]:
    """The events the page shows, top first, once its count says ``count``."""
    expect(page.locator("#live-count")).to_have_text(str(count), timeout=WAIT * 1000)
    return [json.loads(text) for text in page.locator("#live-events li code").all_text_contents()]


def test_the_live_page_shows_exactly_the_matching_events_newest_on_top(
    door: Door,
    page: Page,
    tmp_path: Path,
) -> None:
    assert door.console is not None
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(door.console + "live")
    kinds = ["a", "skip", "<img src=x onerror=alert(1)>"]
    sent = [
        {"run": run, "n": n, "kind": kinds[n % 3], "note": "<b>bold</b> & 'quoted'"}
        for n in range(360)
        for run in ("live", "other")
    ]

    _subscribe(page, "events", "selector", "run = 'live' AND n >= 20 AND kind <> 'skip'")
    expect(page.locator("#live-status")).to_have_text("subscribed to events", timeout=WAIT * 1000)
    _publish(door, sent)
    wanted = [e for e in sent if e["run"] == "live" and e["n"] >= 20 and e["kind"] != "skip"]
    assert len(wanted) > LIVE_KEPT
    assert _shown(page, len(wanted)) == wanted[::-1][:LIVE_KEPT]
    assert page.locator("#live-events img, #live-events b").count() == 0  # (text, not markup)
    assert "<img src=x onerror=alert(1)>" in page.locator("#live-events").inner_text()
    _shot(page, "live", tmp_path, full=False)

    page.locator("#live-stop").click()  # (the status changes: "subscribed" again is the new one's)
    expect(page.locator("#live-status")).to_have_text("stopped", timeout=WAIT * 1000)
    _subscribe(page, "events", "filter", 'run = "live" & n < 7')  # (again: the list starts afresh)
    expect(page.locator("#live-status")).to_have_text("subscribed to events", timeout=WAIT * 1000)
    assert page.locator("#live-events li").count() == 0
    _publish(door, sent)
    assert _shown(page, 7) == [e for e in sent if e["run"] == "live" and e["n"] < 7][::-1]

    _subscribe(page, "events", "selector", "price > AND x = 1")  # (the ERROR, on the page)
    status = page.locator("#live-status.bad")
    expect(status).to_contain_text("line 1, column 9", timeout=WAIT * 1000)
    assert dialogs == []
    assert {url.split("/")[2] for url in requested} == {door.console.split("/")[2]}
