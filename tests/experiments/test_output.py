"""``flowbus.experiments.output``: one Result shape, one writer of CSV / JSON / PNG for every experiment."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from typer.testing import CliRunner

from flowbus.errors import InternalError
from flowbus.experiments.config import OneSeed
from flowbus.experiments.output import Csv, OutputFiles, Result, document, write_csv, write_outputs

runner = CliRunner()


@dataclass(frozen=True, slots=True)
class Toy(OneSeed):
    """A config of the smallest experiment: the writer needs nothing more."""

    NAME: ClassVar[str] = "toy"

    size: int = 3
    seed: int = 7


def _plot(result: Result, png: Path) -> None:
    png.write_bytes(b"not really a PNG: " + result.experiment.encode())


FILES = OutputFiles(
    (
        Csv("rows", "rows.csv"),
        Csv("summary", "{experiment}-summary.csv", "summary", ("x", "mean")),
        Csv("extra", "extra.csv", "extra", lambda rows: sorted({k for r in rows for k in r})),
    ),
    _plot,
    json=("manifest", "manifest.json"),
)


def _result() -> Result:
    rows = [{"x": 1, "y": 0.1, "ok": True, "run_s": 0.5}, {"x": 2, "y": None, "ok": False, "run_s": 0.25}]
    return Result(
        Toy(),
        FILES,
        rows,
        summary=[{"x": 1.5, "mean": 0.1, "ignored": 3}],
        findings={"fit": {"slope": 2.0}, "consistent": True},
        tables={"extra": [{"b": 1, "a": 2}, {"c": 3}]},
        timing={"wall_s": 0.75},
    )


def test_the_writer_writes_each_declared_file(tmp_path: Path) -> None:
    outputs = write_outputs(_result(), tmp_path / "out", config_file="toy.yaml")
    assert list(outputs) == ["rows", "summary", "extra", "plot", "manifest"]
    assert Path(outputs["summary"]).name == "toy-summary.csv" and Path(outputs["plot"]).name == "toy.png"
    assert Path(outputs["rows"]).read_bytes() == b"x,y,ok,run_s\n1,0.1,true,0.5\n2,,false,0.25\n"
    assert Path(outputs["summary"]).read_text() == "x,mean\n1.5,0.1\n"  # only the declared columns
    assert Path(outputs["extra"]).read_text() == "a,b,c\n2,1,\n,,3\n"  # columns from the rows
    assert Path(outputs["plot"]).read_bytes() == b"not really a PNG: toy"
    doc = json.loads(Path(outputs["manifest"]).read_text())
    assert doc["experiment"] == "toy" and doc["config"] == {"file": "toy.yaml", "size": 3, "seed": 7}
    assert doc["seeds"] == [7] and doc["rows"][1]["y"] is None and doc["summary"][0]["ignored"] == 3
    assert doc["fit"] == {"slope": 2.0} and doc["consistent"] is True  # findings at the top level
    assert doc["runner"] == {"name": "serial", "master": None} and doc["timing"] == {"wall_s": 0.75}
    assert doc["outputs"] == outputs and doc["python"] and doc["flowbus_version"]


def test_the_document_without_files() -> None:
    doc = document(_result())
    assert "outputs" not in doc and doc["config"]["file"] is None
    json.dumps(doc)


def test_write_csv_cells(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_csv(path, ["a", "b", "c"], [{"a": 1 / 3, "b": "x,y", "c": None}, {"a": 1e-20}])
    assert path.read_bytes() == b'a,b,c\n0.3333333333333333,"x,y",\n1e-20,,\n'


def test_a_result_is_checked() -> None:
    with pytest.raises(InternalError, match="rows"):
        Result(Toy(), FILES, [], findings={"rows": 1}, tables={"extra": []})
    with pytest.raises(InternalError, match="extra"):
        Result(Toy(), FILES, [])  # a CSV of a table the result does not have
    with pytest.raises(InternalError, match="same key"):
        OutputFiles((Csv("plot", "p.csv"),), _plot)


def test_every_experiment_result_is_written_the_same_way(tmp_path: Path) -> None:
    """A small run of each family, through the command, writes its declared files."""
    from flowbus.cli import app

    cases = {
        "pastry-hops": ["--nodes", "40", "--lookups", "20"],
        "ring-classes": ["--nodes", "8", "--events", "10"],
    }
    for name, args in cases.items():
        out = tmp_path / name
        result = runner.invoke(app, ["sim", name, *args, "--out", str(out), "--json"])
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        written = sorted(p.name for p in out.iterdir())
        assert written == sorted(Path(p).name for p in doc["outputs"].values())
        assert all(Path(p).stat().st_size > 0 for p in doc["outputs"].values())
