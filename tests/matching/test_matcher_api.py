"""The matcher's API: ids, errors that change nothing, functions, parsing, the benchmark harness."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flowbus.errors import FilterError, FilterSyntaxError, FlowbusError
from flowbus.matching import Matcher, SubscriptionError


def test_text_and_triple_filters() -> None:
    m = Matcher()
    m.add(1, 'issue = "IBM" & price > 100')
    m.add(2, [["class", "=", "trigger"], ["price", ">", 50]])
    m.add(3, "price*vol >= 1000000")
    assert m.match({"issue": "IBM", "price": 120.0, "vol": 10_000}) == [1, 3]
    assert m.match({"class": "trigger", "price": 60}) == [2]
    assert m.match({}) == []


def test_bad_input_changes_nothing() -> None:
    m = Matcher()
    m.add("a", "x = 1")
    with pytest.raises(SubscriptionError, match="exists already"):
        m.add("a", "x = 2")
    with pytest.raises(FilterSyntaxError):
        m.add("b", "x = = 2")
    with pytest.raises(FilterError, match="unknown function"):
        m.add("c", "NYS(issue) = 1")
    with pytest.raises(SubscriptionError, match="exists already"):
        m.add_many([("d", "x = 1"), ("d", "x = 3")])
    with pytest.raises(SubscriptionError):
        m.add(1.5, "x = 1")  # type: ignore[arg-type]
    with pytest.raises(SubscriptionError, match="no subscription"):
        m.remove("zzz")
    assert len(m) == 1 and "d" not in m and m.match({"x": 1}) == ["a"] and m.match({"x": 3}) == []


def test_functions_and_lookup_tables() -> None:
    m = Matcher(functions={"NYS": {"IBM.N": "IBM"}, "double": lambda v: 2 * v})
    m.add(1, 'NYS(issue) = "IBM"')
    m.add(2, "double(price) > 10")
    assert m.match({"issue": "IBM.N", "price": 6}) == [1, 2]
    assert m.match({"issue": "XX", "price": 4}) == []


def test_bad_options() -> None:
    with pytest.raises(FlowbusError):
        Matcher(strategy="magic")  # type: ignore[arg-type]
    with pytest.raises(FlowbusError):
        Matcher(workers=0)


def test_nbytes_grows_with_subscriptions() -> None:
    m = Matcher()
    before = m.nbytes()
    m.add_many((i, f'a = "v{i % 50}" & b < {i}') for i in range(5000))
    assert m.nbytes() > before


@pytest.mark.parametrize(
    ("workload", "strategy"), [("w1", "counting"), ("w1-mixed", "clustering"), ("w-rein", "counting")]
)
@pytest.mark.broker
def test_bench_match_prints_one_json_document(workload: str, strategy: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "flowbus", "bench", "match", "--workload", workload, "--subscriptions", "2000",
         "--events", "500", "--strategy", strategy, "--json"],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    doc = json.loads(proc.stdout)
    assert doc["agrees_with_brute_force"] is True
    assert doc["event_parsing_timed"] is False
    for key in ("events_per_s", "ms_per_event", "mean_matches_per_event", "build_s", "add_per_s",
                "bytes_per_subscription", "brute_force_events_per_s"):  # fmt: skip
        assert doc[key] > 0, key


@pytest.mark.broker
def test_bench_rejects_unknown_workload() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "flowbus", "bench", "match", "--workload", "w9", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "unknown workload" in proc.stderr and proc.stdout == ""


def test_pickled_matcher_answers_the_same() -> None:
    import pickle

    m = Matcher(workers=2)
    m.add_many(
        [(1, "x = true & y = 1"), (2, "x = 1"), (3, 'name prefix "ab" & n between 1 and 5'), (4, "!(n < 3)")]
    )
    copy = pickle.loads(pickle.dumps(m))
    events = [{"x": True, "y": 1}, {"x": 1}, {"name": "abc", "n": 3}, {"n": 2}, {}]
    assert (
        [copy.match(e) for e in events] == [m.match(e) for e in events] == [[1, 4], [2, 4], [3, 4], [], [4]]
    )
