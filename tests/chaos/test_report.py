"""The campaign's report: its Markdown table sums each mix's seeds, and the totals."""

from __future__ import annotations

import pytest

from flowbus.chaos.report import TOTALS, markdown


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

    from flowbus.chaos.campaign import Campaign, failed_row
    from flowbus.chaos.report import summarize

    c = Campaign(out=Path("out"), mixes=("crash",), seeds=(1, 2))
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


def _doc(rows: list[dict[str, object]], *, commit: str = "a" * 40, overlay: str = "chordal-ring") -> dict:
    from flowbus.chaos.report import summarize

    return summarize(rows, overlay=overlay, isolated=True, commit=commit)


def test_a_campaign_run_in_parts_merges_into_the_sum_of_its_runs() -> None:
    from flowbus.chaos.report import merge_campaigns

    first = _doc([_row("crash", 1, 0, 0.5), _row("pause", 1, 0, 9.0)])
    second = _doc([_row("crash", 2, 7, 2.0)])
    doc = merge_campaigns([first, second])
    assert doc["runs"] == 3 and doc["lost"] == 7 and doc["acknowledged"] == 3000
    assert doc["recovery_p99_s"] == 9.0 and doc["seeds"] == [1, 2] and doc["commit"] == "a" * 40
    assert [(r["mix"], r["seed"]) for r in doc["rows"]] == [("crash", 1), ("pause", 1), ("crash", 2)]


@pytest.mark.parametrize(
    ("second", "why"),
    [
        (_doc([_row("crash", 2, 0, 1.0)], commit="b" * 40), "the parts differ in commit"),
        (_doc([_row("crash", 2, 0, 1.0)], overlay="pastry-irbr"), "the parts differ in overlay"),
        (_doc([_row("crash", 1, 0, 1.0)]), "runs in more than one part: crash-1"),
    ],
)
def test_parts_of_other_code_or_with_a_run_twice_are_refused(second: dict, why: str) -> None:
    from flowbus.chaos.report import merge_campaigns
    from flowbus.errors import ExperimentError

    with pytest.raises(ExperimentError, match=why):
        merge_campaigns([_doc([_row("crash", 1, 0, 0.5)]), second])


def test_parts_of_uncommitted_code_are_not_merged() -> None:
    from flowbus.chaos.report import merge_campaigns
    from flowbus.errors import ExperimentError

    dirty = "a" * 40 + "+dirty"
    with pytest.raises(ExperimentError, match="not known to be one commit"):
        merge_campaigns([_doc([_row("crash", s, 0, 0.5)], commit=dirty) for s in (1, 2)])


@pytest.mark.broker
def test_the_campaign_names_the_commit_that_ran() -> None:
    import re

    from flowbus.chaos.campaign import source_commit

    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?|unknown", source_commit())


def test_chaos_merge_writes_the_merged_campaign_and_refuses_a_bad_part(tmp_path: object) -> None:
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from flowbus.cli import app

    root = Path(str(tmp_path))
    a, b = root / "a.json", root / "b.json"
    a.write_text(json.dumps(_doc([_row("crash", 1, 0, 0.5)])))
    b.write_text(json.dumps(_doc([_row("crash", 2, 7, 2.0)])))
    runner = CliRunner()
    result = runner.invoke(app, ["chaos", "merge", str(a), str(b), "--out", str(root / "m"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["lost"] == 7
    table = (root / "m" / "chordal-ring" / "campaign.md").read_text()
    assert "| crash | 2 | 10 | 2,000 |" in table
    assert json.loads((root / "m" / "chordal-ring" / "campaign.json").read_text())["runs"] == 2
    b.write_text("{not json")
    bad = runner.invoke(app, ["chaos", "merge", str(a), str(b), "--out", str(root / "n")])
    assert bad.exit_code != 0 and "b.json: not a campaign's JSON document" in bad.stderr
    assert not (root / "n").exists()
