"""What every experiment gives and how it is written: :class:`Result`, one writer.

How it works: an experiment's run takes its config and returns a :class:`Result` -- the
config, the ``rows`` (one per run or point), the ``summary`` (rows aggregated over seeds),
``findings`` (fits, checks, the document's reference values), further ``tables`` where one
table is not enough (the IRBR events), the ``runner`` and the ``timing`` -- and the
:class:`OutputFiles` its experiment writes. :func:`write_outputs` is the one writer: each
:class:`Csv` of those files (fixed column order, rows as given, floats in full precision,
no timing column: the same config gives the same bytes on every run), the PNG (drawn by
the experiment's plot function with :func:`pyplot`), and one JSON document
(:func:`document`: everything, timings and where it ran included). It returns the paths
it wrote by name; the names and file names are each experiment's own (``runs.csv`` and
``manifest.json`` for IRBR, ``rows.csv`` and ``result.json`` for the ring, ...), so the
files docs/results/ links to keep their names.
"""

from __future__ import annotations

import csv
import json
import platform
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from flowbus.errors import InternalError
from flowbus.experiments.config import ExperimentConfig

__all__ = [
    "SERIAL",
    "Csv",
    "OutputFiles",
    "ProgressFn",
    "Result",
    "document",
    "pyplot",
    "save",
    "write_csv",
    "write_outputs",
]

ProgressFn = Callable[[str, int, int], object]
"""``progress(what, done, total)``: called while an experiment runs."""

SERIAL: Final[Mapping[str, Any]] = {"name": "serial", "master": None}
"""The runner of an experiment run in this process."""

_DOCUMENT_KEYS: Final = frozenset(
    {"experiment", "config", "seeds", "rows", "summary", "runner", "timing", "outputs",
     "flowbus_version", "python", "platform", "finished_at"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Csv:
    """One CSV file: ``outputs[key]`` is ``out / file``, with ``columns`` of ``table``.

    ``table`` is ``"rows"``, ``"summary"`` or a key of :attr:`Result.tables`; ``columns``
    is the column names, or a function of the rows giving them (None: the first row's keys).
    ``file`` may hold ``{experiment}``.
    """

    key: str
    file: str
    table: str = "rows"
    columns: Sequence[str] | Callable[[Sequence[Mapping[str, Any]]], Sequence[str]] | None = None

    def header(self, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        if self.columns is None:
            return list(rows[0]) if rows else []
        return list(self.columns(rows) if callable(self.columns) else self.columns)


@dataclass(frozen=True, slots=True)
class OutputFiles:
    """What one experiment writes: CSV files, a PNG drawn by ``plot``, a JSON document."""

    csv: tuple[Csv, ...]
    plot: Callable[[Result, Path], None]
    json: tuple[str, str] = ("json", "result.json")  # (key, file)
    png: str = "{experiment}.png"

    def __post_init__(self) -> None:
        keys = [c.key for c in self.csv] + ["plot", self.json[0]]
        if len(set(keys)) != len(keys):
            raise InternalError(f"output files with the same key: {keys}")


@dataclass(frozen=True, slots=True)
class Result:
    """What an experiment's run gives (see the module note)."""

    config: ExperimentConfig
    files: OutputFiles
    rows: list[dict[str, Any]]
    summary: list[dict[str, Any]] = field(default_factory=list)
    findings: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    runner: Mapping[str, Any] = field(default_factory=lambda: dict(SERIAL))
    timing: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        clash = _DOCUMENT_KEYS & set(self.findings)
        if clash:
            raise InternalError(f"findings may not be named {sorted(clash)}: the document has those keys")
        missing = {c.table for c in self.files.csv} - {"rows", "summary", *self.tables}
        if missing:
            raise InternalError(f"{self.config.experiment}: no table {sorted(missing)} to write")

    @property
    def experiment(self) -> str:
        return self.config.experiment

    def table(self, name: str) -> list[dict[str, Any]]:
        """The rows of ``"rows"``, ``"summary"`` or one of :attr:`tables`."""
        if name == "rows":
            return self.rows
        if name == "summary":
            return self.summary
        return self.tables[name]


# ------------------------------------------------------------------------------- writing


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def write_csv(path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    """``rows`` as CSV with exactly ``columns`` (floats in full precision, None or missing
    empty, LF line ends)."""
    with path.open("w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(columns)
        for r in rows:
            w.writerow([_cell(r.get(c)) for c in columns])


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("flowbus")
    except Exception:  # not installed: the source tree's version
        from flowbus import __version__

        return __version__


def document(
    result: Result, *, config_file: str | None = None, outputs: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The JSON document of ``result``: what ran (config, seeds), its rows, summary and
    findings, where and how long it ran, with what, and the files written (if any)."""
    doc: dict[str, Any] = {
        "experiment": result.experiment,
        "config": {"file": config_file, **result.config.to_dict()},
        "seeds": list(result.config.seeds),
        "rows": result.rows,
        "summary": result.summary,
        **result.findings,
        "runner": dict(result.runner),
        "timing": result.timing,
        "flowbus_version": _version(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if outputs is not None:
        doc["outputs"] = dict(outputs)
    return doc


def write_outputs(result: Result, out: Path, *, config_file: str | None = None) -> dict[str, str]:
    """Write ``result``'s CSV files, PNG and JSON document into ``out``; their paths by name."""
    files = result.files
    name = result.experiment
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for c in files.csv:
        rows = result.table(c.table)
        paths[c.key] = out / c.file.format(experiment=name)
        write_csv(paths[c.key], c.header(rows), rows)
    paths["plot"] = out / files.png.format(experiment=name)
    files.plot(result, paths["plot"])
    json_key, json_file = files.json
    paths[json_key] = out / json_file.format(experiment=name)
    names = {k: str(v) for k, v in paths.items()}
    doc = document(result, config_file=config_file, outputs=names)
    paths[json_key].write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    return names


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, png: Path) -> None:
    """Lay out, save (110 dpi) and close a figure."""
    plt = pyplot()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
