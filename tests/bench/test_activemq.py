"""The ActiveMQ baseline of ``flowbus bench broker --baseline activemq``: flowbus filters as JMS
selectors, events as headers or a JSON body (unit), and ActiveMQ of our own started, fed the
bench's workload through STOMP and stopped, beside flowbus's brokers driven through their STOMP
doors by the same client program (``--protocol stomp``) (integration: installs Debian's
``activemq`` when missing, as ``make test`` does)."""

from __future__ import annotations

import json
import re
import socket
from types import SimpleNamespace

import numpy as np
import pytest

from flowbus.bench import activemq, broker
from flowbus.bench.activemq import ActiveMQ, jms_selector
from flowbus.bench.broker import offline_counts
from flowbus.bench.stomp_clients import HEADERS, JSON_BODY, event_headers
from flowbus.bench.workloads import stock_events, stock_filters
from flowbus.errors import FilterError


@pytest.mark.parametrize(
    ("text", "selector"),
    [
        (
            'symbol = "S15" & exchange in {"LSE", "NASDAQ"} & level between 0 and 6 '
            "& price >= 65.2 & price < 101.1",
            "symbol = 'S15' AND exchange IN ('LSE', 'NASDAQ') AND level <= 6.0 AND level >= 0.0 "
            "AND price < 101.1 AND price >= 65.2",  # equalities first: ActiveMQ stops at a false one
        ),
        ('symbol prefix "S1"', "symbol LIKE 'S1%' ESCAPE '!'"),
        ('symbol contains "2_%!"', "symbol LIKE '%2!_!%!!%' ESCAPE '!'"),
        ('exchange not in {"NYSE", "LSE"}', "exchange NOT IN ('LSE', 'NYSE')"),
        ("level in {1, 3}", "(level = 1.0 OR level = 3.0)"),  # JMS's IN takes strings only
        ("level not in {0, 9}", "(level <> 0.0 AND level <> 9.0)"),
        ("!(price < 50)", "(price IS NULL OR NOT (price < 50.0))"),  # holds where price is missing
        ('!(exchange = "TSE") & level = 3', "level = 3.0 AND (exchange IS NULL OR NOT (exchange = 'TSE'))"),
        ("!exists level", "level IS NULL"),
        ("price <= 20 | quantity >= 100", "(price <= 20.0) OR (quantity >= 100.0)"),
        ('symbol = "O\'Neil" & flag = true', "flag = TRUE AND symbol = 'O''Neil'"),
        ("price > 1e-5 & quantity < 1e20", "price > 1.0E-05 AND quantity < 1.0E+20"),
    ],
)
def test_filters_become_jms_selectors(text: str, selector: str) -> None:
    assert jms_selector(text) == selector


def test_every_filter_of_the_workload_translates_with_double_literals() -> None:
    """ActiveMQ converts a STOMP (string) property to the literal's type: ``Long.valueOf("24.42")``
    fails, so every number must be a double literal."""
    for text in stock_filters(2_000, 7):
        selector = jms_selector(text)
        numbers = re.findall(r"(?<![\w.'])\d[\d.E+-]*", selector)
        assert numbers and all("." in n for n in numbers), selector
        assert "symbol = 'S" in selector and "&" not in selector and '"' not in selector


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("price * quantity > 1000", "every property is text"),
        ('symbol < "S5"', "order numbers only"),
        ("quantity = 9007199254740993", "beyond 2**53"),
        ('JMSType = "x"', "'JMSType'"),
        ('selector = "x"', "'selector'"),  # a STOMP header of its own
        ("t > 1", "'t'"),  # the publisher's clock rides in t
    ],
)
def test_what_jms_cannot_say_is_a_filter_error(text: str, says: str) -> None:
    with pytest.raises(FilterError, match=re.escape(says)):
        jms_selector(text)


def test_event_values_go_as_header_text() -> None:
    event = {"symbol": "S1", "price": 24.42, "tiny": 1e-05, "quantity": 7, "ok": True, "gone": None}
    assert event_headers(event) == {
        "symbol": "S1", "price": "24.42", "tiny": "1e-05", "quantity": "7", "ok": "true",
    }  # fmt: skip


def test_the_carriers_differ_only_in_where_the_event_rides() -> None:
    """ActiveMQ's: headers and an empty body; flowbus's: the JSON object of the body. Both give
    the event back from a MESSAGE (its values as they rode)."""
    event = {"symbol": "S1", "price": 24.42, "level": 3, "t": 1700000000.25}
    headers, body = HEADERS.encode(event)
    assert (headers, body) == ({**event_headers(event), "persistent": "false"}, "")
    headers, body = JSON_BODY.encode(event)
    assert headers == {"content-type": "application/json"} and json.loads(body) == event
    assert HEADERS.read(SimpleNamespace(headers=event_headers(event)))["t"] == "1700000000.25"
    assert JSON_BODY.read(SimpleNamespace(headers={}, body=body)) == event


# ----------------------------------------------------------------------------- integration

OPERATORS = [
    'symbol prefix "S1"', 'symbol suffix "7"', 'symbol contains "2"', 'exchange not in {"NYSE", "LSE"}',
    "level in {1, 3, 5}", "level not in {0, 9}", "!(price < 50)", "quantity != 500", "level = 3",
    'exists level & price > 100.5', '!(exchange = "TSE")', "price <= 20 | price >= 100",
    "price > 1e-5 & level < 2.5",
]  # fmt: skip


@pytest.mark.peer
def test_the_workload_through_activemq_matches_the_offline_evaluation() -> None:
    """K = 10 of the bench's filters and one of each operator, 200 events: every subscription gets
    exactly what the offline evaluation counts; the columns go beside a flowbus row."""
    filters = stock_filters(10, 11) + OPERATORS
    events = stock_events(200, 1)
    expected, _ = offline_counts(filters, events)
    assert expected[:10].sum() > 0 and (expected[10:] > 0).all()
    rows = [{"events_per_s_in": 1234.0}]
    activemq.add_to_rows(rows, filters, events, expected, clients=4)
    got = rows[0]["activemq"]
    assert "error" not in got, got.get("error")
    assert got["deliveries_match_offline"] and got["deliveries"] == expected.sum()
    assert rows[0]["activemq_events_per_s_in"] == got["events_per_s_in"] > 0
    assert rows[0]["ratio_to_activemq"] == pytest.approx(1234.0 / got["events_per_s_in"])


@pytest.mark.peer
@pytest.mark.broker
def test_flowbus_over_stomp_beside_activemq_both_match_the_offline_evaluation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--protocol stomp --baseline activemq`` on K = 10 of the bench's filters and one of each
    operator (their JMS selectors: numbers as doubles, negations with IS NULL, LIKE with ESCAPE):
    flowbus's broker through its STOMP door and ActiveMQ, one client program, both deliver
    exactly what the offline evaluation counts."""
    monkeypatch.setattr(broker, "make_filters", lambda k, seed: stock_filters(k, seed) + OPERATORS)
    doc = broker.run(
        brokers=[1], subscriptions=[10], events=200, clients=2, protocol="stomp", baseline="activemq"
    )
    (row,) = doc["rows"]
    theirs = row["activemq"]
    assert "error" not in row and "error" not in theirs, row.get("error") or theirs.get("error")
    assert row["protocol"] == "stomp" and row["subscriptions"] == 10 + len(OPERATORS)
    assert row["deliveries_match_offline"] and theirs["deliveries_match_offline"]
    assert row["deliveries"] == theirs["deliveries"] == row["deliveries_expected"] > 0
    assert row["ratio_to_activemq"] == pytest.approx(row["events_per_s_in"] / theirs["events_per_s_in"])
    assert row["broker_cpu_s"] >= 0 and theirs["activemq_cpu_s"] >= 0


@pytest.mark.peer
def test_activemq_serves_stomp_on_loopback_and_is_stopped_on_error() -> None:
    with pytest.raises(RuntimeError), ActiveMQ() as amq:
        proc, directory = amq.proc, amq.dir
        with socket.create_connection(("127.0.0.1", amq.port), timeout=5) as s:
            s.sendall(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\0")
            assert s.recv(4096).startswith(b"CONNECTED\n")
        raise RuntimeError("the run failed")
    assert proc is not None and proc.poll() is not None  # its process group was stopped
    assert directory is not None and not directory.exists()


def test_a_baseline_run_that_fails_says_why_in_its_columns() -> None:
    """A filter JMS cannot say ends the baseline before any JVM starts; the flowbus row stays."""
    rows = [{"events_per_s_in": 10.0}]
    activemq.add_to_rows(rows, ['symbol < "S5"'], stock_events(5, 1), np.zeros(1, np.int64), clients=1)
    assert rows[0]["activemq_events_per_s_in"] is None and rows[0]["ratio_to_activemq"] is None
    assert "order numbers only" in rows[0]["activemq"]["error"]
    assert rows[0]["events_per_s_in"] == 10.0
