"""The campaign's report: its Markdown table sums each mix's seeds, and the totals."""

from __future__ import annotations

import pytest

from flowbus.chaos.campaign import TOTALS
from flowbus.chaos.report import markdown


def _row(mix: str, seed: int, lost: int, p99: float) -> dict[str, object]:
    return {
        **dict.fromkeys(TOTALS, 0),
        "mix": mix,
        "seed": seed,
        "faults_injected": 5,
        "acknowledged": 1000,
        "expected_deliveries": 3000,
        "delivered": 3000 - lost,
        "lost": lost,
        "lost_prefix": 0,
        "lost_middle": lost,
        "lost_postfix": 0,
        "stranded": seed,
        "duplicated": 0,
        "misrouted": 0,
        "wrong_values": seed,
        "out_of_order": 1,
        "hung_publishes": 0,
        "refused": 2,
        "tracebacks": 0,
        "double_served_s": 0.5,
        "recovery_p99_s": p99,
        "recovery_max_s": p99,
    }


def test_each_mix_sums_its_seeds_and_the_last_line_sums_all() -> None:
    doc = {"rows": [_row("crash", 1, 0, 0.5), _row("crash", 2, 7, 2.0), _row("pause", 1, 0, 9.0)]}
    lines = markdown(doc).splitlines()
    assert len(lines) == 5 and lines[0].startswith("| mix | runs | faults |")
    crash, pause, total = (line.split(" | ") for line in lines[2:])
    assert crash[:8] == ["| crash", "2", "10", "2,000", "6,000", "5,993", "7 (0/7/0)", "3"]
    assert crash[10] == "3" and crash[11] == "2" and crash[13] == "4"
    assert crash[14] == "1.0" and crash[15] == "2.00"
    assert pause[0] == "| pause" and pause[6] == "0 (0/0/0)" and pause[7] == "1" and pause[10] == "1"
    assert total[0] == "| **all**" and total[1] == "3" and total[6] == "7 (0/7/0)" and total[15] == "9.00"


def test_a_run_that_could_not_be_made_is_a_row_of_its_own_and_counted(tmp_path: object) -> None:
    from pathlib import Path

    from flowbus.chaos.campaign import Campaign, failed_row, summarize

    c = Campaign(out=Path("out"), mixes=("crash",), seeds=2)
    good = {**failed_row(c, "crash", 1, "x"), "lost": 3, "recovery_p99_s": 1.5}
    del good["error"]
    doc = summarize(
        [good, failed_row(c, "crash", 2, "broker b0: no ready line in 60 s")], overlay="x", isolated=True
    )
    assert doc["runs"] == 2 and doc["failed_runs"] == 1 and doc["lost"] == 3 and doc["recovery_p99_s"] == 1.5
    assert doc["rows"][1]["error"] == "broker b0: no ready line in 60 s"


def test_a_fault_band_ends_at_its_heal_not_at_a_redeploys_deploy() -> None:
    from typing import Any

    from flowbus.chaos.report import _bands

    class Axes:
        def __init__(self) -> None:
            self.spans: list[tuple[float, float]] = []

        def axvspan(self, a: float, b: float, **kw: Any) -> None:
            self.spans.append((a, b))

        def text(self, *a: Any, **kw: Any) -> None:
            pass

        def get_xaxis_transform(self) -> None:
            return None

    ax = Axes()
    fault = {"kind": "redeploy", "start": 4.0, "hosts": ["b1"]}
    rows = [
        {**fault, "t": 104.0, "what": "inject"},
        {**fault, "t": 104.5, "what": "deploy"},
        {**fault, "t": 113.0, "what": "undeploy"},
        {**fault, "t": 113.2, "what": "heal"},
    ]
    _bands(ax, rows, 100.0)
    assert ax.spans == [(4.0, pytest.approx(13.2))]
