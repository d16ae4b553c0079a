"""Shared fixtures of the flow tests: the stock example and the paper's Figure 2 graph."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowbus.flow import FlowBuilder, Graph, load_spec

STOCKS = Path(__file__).resolve().parents[2] / "examples" / "stocks" / "flow.yaml"

NYS = {"IBM": "IBM", "AAPL.N": "Apple", "HON": "Honeywell"}
NAS = {"IBMQ": "IBM", "AAPL": "Apple", "INTC": "Intel"}


def figure2() -> Graph:
    """The 000 document's Figure 2a: two exchanges, lookups, capital = price*vol, S (big trades)."""
    trade = {"issue": "str", "price": "float", "vol": "int"}
    b = FlowBuilder("figure2").lookup("NYS", NYS).lookup("NAS", NAS)
    b.source("NYSE", trade).source("NASDAQ", trade)
    b.events("combined", {"com": "str", "price": "float", "vol": "int"}, publish=True, subscribe=True)
    b.events("capital", {"com": "str", "cap": "float"})
    b.sink("big_trades", {"com": "str", "cap": "float"})
    b.transform("T1", "NYSE", "combined", {"com": "NYS(issue)", "price": "price", "vol": "vol"})
    b.transform("T2", "NASDAQ", "combined", {"com": "NAS(issue)", "price": "price", "vol": "vol"})
    b.transform("T3", "combined", "capital", {"com": "com", "cap": "price*vol"})
    b.select("S", "capital", "big_trades", "cap >= 1000000")
    return b.build()


@pytest.fixture(scope="session")
def stocks() -> Graph:
    return load_spec(STOCKS)


@pytest.fixture(scope="session")
def fig2() -> Graph:
    return figure2()
