"""Sweeps of the IRBR fault experiment: many :mod:`~flowbus.experiments.irbr_run` runs, aggregated, plotted.

How it works:

* A :class:`Sweep` is protocols x failure rates x seeds, with the other
  :class:`~flowbus.experiments.irbr_run.RunConfig` fields fixed. :func:`load_sweep` builds one
  from a YAML file (``experiments/irbr-faults.yaml``) or the built-in defaults of the
  experiment (:data:`DEFAULTS`, the same values), with command line overrides; every
  input is checked there, before any run starts (a :class:`ExperimentError` says what is
  wrong). :meth:`Sweep.configs` lists the runs sorted by protocol, failure and seed.
* :func:`run_serial` runs them one after the other in this process;
  :func:`flowbus.spark.sweep.run_spark` runs them as Spark tasks. Both return a
  :class:`SweepResult`: one row per run (:data:`RUN_COLUMNS` plus ``run_s``), one row
  per published event (:data:`EVENT_COLUMNS`), and the aggregate rows
  (:data:`SUMMARY_COLUMNS`, one per protocol and failure rate: mean, sample standard
  deviation and 95 % Student t interval of the loss rates, computed by
  :func:`aggregate` here and by Spark there).
* :func:`write_outputs` writes ``runs.csv``, ``summary.csv``, ``events.csv``,
  ``manifest.json`` and a PNG (figure 4a for ``irbr-faults``, 4b for
  ``irbr-forwards``). The CSV files have a fixed column order, sorted rows and no
  timing column: the same sweep gives the same bytes on every run, serial or Spark.

The t interval is ``mean +- t(0.975, n-1) * sd / sqrt(n)`` (not clipped at 0); with
one run the standard deviation and the interval are undefined (empty in the CSV,
``null`` in JSON). :func:`t975` reads the quantile from a table (degrees of freedom
1..30, 40, 60, 120, infinity), interpolated linearly in 1/df between its entries.
"""

from __future__ import annotations

import csv
import json
import math
import platform
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from flowbus.errors import ExperimentError, FlowbusError
from flowbus.experiments.irbr_run import PROTOCOLS, RunConfig, run_group

__all__ = [
    "DEFAULTS",
    "EVENT_COLUMNS",
    "EXPERIMENTS",
    "FORWARD_BINS",
    "FORWARD_COLUMNS",
    "PAPER_LOSS",
    "RUN_COLUMNS",
    "SUMMARY_COLUMNS",
    "T975_INF",
    "T975_SEGMENTS",
    "T975_TABLE",
    "ExperimentError",
    "Sweep",
    "SweepResult",
    "aggregate",
    "event_rows",
    "forwards_by_interest",
    "interval",
    "irbr_below_scribe",
    "load_sweep",
    "manifest",
    "parse_failures",
    "parse_protocols",
    "parse_seeds",
    "plot_faults",
    "plot_forwards",
    "run_key",
    "run_serial",
    "t975",
    "write_csv",
    "write_outputs",
]

ProgressFn = Callable[[str, int, int], object]


EXPERIMENTS: Final = ("irbr-faults", "irbr-forwards")

# ----------------------------------------------------------------------------- columns

RUN_COLUMNS: Final[tuple[tuple[str, str], ...]] = (
    ("protocol", "str"), ("nodes", "int"), ("failure", "float"), ("seed", "int"), ("events", "int"),
    ("subscribers", "float"), ("symbols", "int"), ("zipf", "float"), ("covering", "bool"),
    ("latency", "float"), ("notice", "float"),
    ("failed", "int"), ("subscriptions", "int"), ("subscribe_messages", "int"),
    ("interested", "int"), ("reachable", "int"), ("delivered", "int"), ("lost", "int"),
    ("lost_reachable", "int"), ("duplicates", "int"), ("wrong", "int"), ("forwards", "int"),
    ("loss_rate", "float"), ("reachable_loss_rate", "float"), ("forwards_per_event", "float"),
    ("messages", "int"),
)  # fmt: skip
"""The columns of ``runs.csv`` (name, type), in order: a run's row without its timing fields."""

EVENT_COLUMNS: Final[tuple[tuple[str, str], ...]] = (
    ("protocol", "str"), ("failure", "float"), ("seed", "int"),
    ("event", "int"), ("publisher", "int"), ("interested", "int"), ("reachable", "int"),
    ("delivered", "int"), ("lost", "int"), ("lost_reachable", "int"), ("duplicates", "int"),
    ("wrong", "int"), ("forwards", "int"),
)  # fmt: skip
"""The columns of ``events.csv``: the run's key, then one published event's counts."""

_RATES: Final = ("loss_rate", "reachable_loss_rate")
_SUMS: Final = ("lost", "lost_reachable", "interested", "reachable")
_MAXES: Final = ("duplicates", "wrong")

SUMMARY_COLUMNS: Final[tuple[str, ...]] = (
    "protocol", "failure", "runs",
    *(f"{r}_{s}" for r in _RATES for s in ("mean", "sd", "ci95", "lo", "hi")),
    "forwards_per_event_mean",
    *_SUMS,
    *(f"{m}_max" for m in _MAXES),
)  # fmt: skip
"""The columns of ``summary.csv``: one row per (protocol, failure); ``ci95`` is the interval's half width."""

FORWARD_BINS: Final[tuple[tuple[int, int | None], ...]] = (
    (0, 0), (1, 5), (6, 10), (11, 20), (21, 40), (41, 80), (81, 160), (161, None),
)  # fmt: skip
"""Bins of "interested nodes" for figure 4b (inclusive bounds; None: no upper bound)."""

FORWARD_COLUMNS: Final = ("protocol", "bin", "lo", "hi", "events", "interested_mean", "forwards_mean")
"""The columns of ``forwards.csv``: per protocol and bin, the mean forwards of its events."""

PAPER_LOSS: Final = {"scribe": ((0.5, 1.35), (10.0, 20.27)), "irbr": ((0.5, 0.11), (10.0, 0.28))}
"""The paper's figure 4a endpoints: (% of nodes failed, % of events lost) per protocol."""

# ---------------------------------------------------------------------------- t table

T975_TABLE: Final[Mapping[int, float]] = {
    1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 7: 2.3646, 8: 2.3060,
    9: 2.2622, 10: 2.2281, 11: 2.2010, 12: 2.1788, 13: 2.1604, 14: 2.1448, 15: 2.1314, 16: 2.1199,
    17: 2.1098, 18: 2.1009, 19: 2.0930, 20: 2.0860, 21: 2.0796, 22: 2.0739, 23: 2.0687, 24: 2.0639,
    25: 2.0595, 26: 2.0555, 27: 2.0518, 28: 2.0484, 29: 2.0452, 30: 2.0423, 40: 2.0211, 60: 2.0003,
    120: 1.9799,
}  # fmt: skip
T975_INF: Final = 1.9600

T975_SEGMENTS: Final[tuple[tuple[int, float, int | None, float], ...]] = (
    (30, T975_TABLE[30], 40, T975_TABLE[40]),
    (40, T975_TABLE[40], 60, T975_TABLE[60]),
    (60, T975_TABLE[60], 120, T975_TABLE[120]),
    (120, T975_TABLE[120], None, T975_INF),
)
"""Between table entries (df_a, t_a) and (df_b, t_b): linear in 1/df (df_b None: infinity)."""


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (``df >= 1``)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df in T975_TABLE:
        return T975_TABLE[df]
    for a, ta, b, tb in T975_SEGMENTS:
        if b is None or df < b:
            inv_b = 0.0 if b is None else 1.0 / b
            return ta + (tb - ta) * (1.0 / a - 1.0 / df) / (1.0 / a - inv_b)
    raise AssertionError("unreachable")  # pragma: no cover


# ------------------------------------------------------------------------------ sweep

_FIXED: Final = ("nodes", "events", "subscribers", "symbols", "zipf", "covering", "latency", "notice")


@dataclass(frozen=True, slots=True)
class Sweep:
    """Protocols x failure rates x seeds; every other run parameter fixed.

    The tuples are stored sorted (protocols in :data:`PROTOCOLS` order); a duplicate is
    an error. Constructing one checks everything a run would (:class:`ExperimentError`).
    """

    experiment: str = "irbr-faults"
    protocols: tuple[str, ...] = PROTOCOLS
    failures: tuple[float, ...] = (0.005, 0.01, 0.02, 0.05, 0.10)
    seeds: tuple[int, ...] = tuple(range(1, 11))
    nodes: int = 1000
    events: int = 200
    subscribers: float = 0.5
    symbols: int = 20
    zipf: float = 1.0
    covering: bool = True
    latency: float = 1.0
    notice: float = 3.0

    def __post_init__(self) -> None:
        if self.experiment not in EXPERIMENTS:
            raise ExperimentError(
                f"unknown experiment {self.experiment!r} (expected {' or '.join(EXPERIMENTS)})"
            )
        protocols = _unique("protocols", self.protocols)
        for p in protocols:
            if p not in PROTOCOLS:
                raise ExperimentError(f"unknown protocol {p!r} (expected {', '.join(PROTOCOLS)})")
        failures = _unique("failures", self.failures)
        for f in failures:
            if isinstance(f, bool) or not isinstance(f, int | float) or not 0.0 <= f < 1.0:
                hint = (
                    f" (a fraction: did you mean {f / 100:g}?)"
                    if isinstance(f, int | float) and f >= 1
                    else ""
                )
                raise ExperimentError(f"a failure rate must be a fraction in [0, 1), got {f!r}{hint}")
        if self.experiment == "irbr-forwards" and tuple(failures) != (0.0,):
            raise ExperimentError(
                f"irbr-forwards runs without failures (failures: [0]), got {list(failures)}"
            )
        seeds = _unique("seeds", self.seeds)
        for s in seeds:
            if type(s) is not int or s < 0:
                raise ExperimentError(f"a seed must be an int >= 0, got {s!r}")
        for name in ("nodes", "events", "symbols"):
            value = getattr(self, name)
            low = 2 if name == "nodes" else 1
            if type(value) is not int or value < low:
                raise ExperimentError(f"{name} must be an int >= {low}, got {value!r}")
        if type(self.covering) is not bool:
            raise ExperimentError(f"covering must be true or false, got {self.covering!r}")
        for name in ("subscribers", "zipf", "latency", "notice"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ExperimentError(f"{name} must be a number, got {value!r}")
            object.__setattr__(self, name, float(value))
        object.__setattr__(self, "protocols", tuple(p for p in PROTOCOLS if p in protocols))
        object.__setattr__(self, "failures", tuple(sorted(float(f) for f in failures)))
        object.__setattr__(self, "seeds", tuple(sorted(seeds)))
        try:  # the remaining checks are RunConfig's own
            for p in self.protocols:
                self._config(p, self.failures[-1], self.seeds[0])
        except FlowbusError as exc:
            raise ExperimentError(str(exc)) from None

    def _config(self, protocol: str, failure: float, seed: int) -> RunConfig:
        return RunConfig(
            protocol=protocol, failure=failure, seed=seed, **{k: getattr(self, k) for k in _FIXED}
        )

    def configs(self) -> list[RunConfig]:
        """Every run, sorted by protocol, failure rate and seed."""
        return [
            self._config(p, f, s) for p in sorted(self.protocols) for f in self.failures for s in self.seeds
        ]

    def groups(self) -> list[list[RunConfig]]:
        """The runs by (protocol, seed): the failure rates of one group share one subscription
        phase (:func:`~flowbus.experiments.irbr_run.run_group`)."""
        protocols = sorted(self.protocols)
        return [[self._config(p, f, s) for f in self.failures] for p in protocols for s in self.seeds]

    def to_dict(self) -> dict[str, Any]:
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}


def _unique(name: str, values: Sequence[Any]) -> list[Any]:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise ExperimentError(f"{name} must be a list, got {values!r}")
    if not values:
        raise ExperimentError(f"{name} must not be empty")
    seen: set[Any] = set()
    for v in values:
        if v in seen:
            raise ExperimentError(f"{name}: {v!r} is listed twice")
        seen.add(v)
    return list(values)


DEFAULTS: Final[Mapping[str, Sweep]] = {
    "irbr-faults": Sweep(),
    "irbr-forwards": Sweep(experiment="irbr-forwards", failures=(0.0,), seeds=(1, 2, 3), events=300),
}
"""The built-in sweeps: the same values as ``experiments/<experiment>.yaml``."""

# ---------------------------------------------------------------------- config parsing


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"N"``: seeds 1..N; ``"A-B"``: seeds A..B; ``"3,5,8"`` (or ``"5,"``): exactly those."""
    text = text.strip()
    try:
        if "," in text:
            return tuple(int(s) for s in text.split(",") if s.strip())
        if "-" in text[1:]:
            a, b = text.split("-", 1)
            lo, hi = int(a), int(b)
            if hi < lo:
                raise ExperimentError(f"seeds {text!r}: an empty range")
            return tuple(range(lo, hi + 1))
        n = int(text)
    except ValueError:
        raise ExperimentError(
            f"seeds must be N (seeds 1..N), A-B or a list like 1,2,3; got {text!r}"
        ) from None
    if n < 1:
        raise ExperimentError(f"seeds N must be >= 1 (seeds 1..N), got {n}")
    return tuple(range(1, n + 1))


def parse_failures(text: str) -> tuple[float, ...]:
    """``"0.005,0.01,0.1"``: failure rates as fractions of the nodes."""
    try:
        return tuple(float(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise ExperimentError(f"failures must be fractions like 0.005,0.01,0.1; got {text!r}") from None


def parse_protocols(text: str) -> tuple[str, ...]:
    """``"irbr,scribe"``."""
    return tuple(s.strip() for s in text.split(",") if s.strip())


def _seeds_value(value: Any) -> tuple[int, ...]:
    """A YAML ``seeds``: N (seeds 1..N) or a list."""
    if type(value) is int:
        if value < 1:
            raise ExperimentError(f"seeds N must be >= 1 (seeds 1..N), got {value}")
        return tuple(range(1, value + 1))
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, str):
        return parse_seeds(value)
    raise ExperimentError(f"seeds must be N (seeds 1..N) or a list, got {value!r}")


def load_sweep(
    experiment: str,
    path: Path | None = None,
    *,
    nodes: int | None = None,
    seeds: str | Sequence[int] | None = None,
    failures: str | Sequence[float] | None = None,
    events: int | None = None,
    protocols: str | Sequence[str] | None = None,
) -> Sweep:
    """The sweep of ``path`` (YAML; None: the built-in :data:`DEFAULTS`) with overrides.

    The YAML keys are the :class:`Sweep` fields (``experiment``, if given, must match);
    ``seeds`` may be N (seeds 1..N) or a list; ``failure: F`` may stand for
    ``failures: [F]``. String overrides are command line text (``"1,2,3"``).
    """
    if experiment not in DEFAULTS:
        raise ExperimentError(f"unknown experiment {experiment!r} (expected {' or '.join(EXPERIMENTS)})")
    values = DEFAULTS[experiment].to_dict()
    if path is not None:
        values.update(_read_yaml(Path(path), experiment))
    if nodes is not None:
        values["nodes"] = nodes
    if events is not None:
        values["events"] = events
    if seeds is not None:
        values["seeds"] = parse_seeds(seeds) if isinstance(seeds, str) else tuple(seeds)
    if failures is not None:
        values["failures"] = parse_failures(failures) if isinstance(failures, str) else tuple(failures)
    if protocols is not None:
        values["protocols"] = parse_protocols(protocols) if isinstance(protocols, str) else tuple(protocols)
    values["experiment"] = experiment
    for key in ("protocols", "failures", "seeds"):
        if isinstance(values[key], list):
            values[key] = tuple(values[key])
    return Sweep(**values)


def read_yaml_mapping(path: Path, error: type[FlowbusError], what: str = "config") -> dict[str, Any]:
    """The mapping in the YAML file ``path`` (empty file: empty mapping), or ``error`` saying
    why not (``what`` names the file in the message)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise error(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return data


def _read_yaml(path: Path, experiment: str) -> dict[str, Any]:
    data = read_yaml_mapping(path, ExperimentError, "sweep config")
    known = {f.name for f in fields(Sweep)}
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key == "failure":
            if "failures" in data:
                raise ExperimentError(f"{path}: give either failure or failures, not both")
            out["failures"] = (value,)
        elif key == "seeds":
            out["seeds"] = _seeds_value(value)
        elif key == "experiment":
            if value != experiment:
                raise ExperimentError(f"{path} is a config for {value!r}, not {experiment!r}")
        elif key in known:
            out[key] = value
        else:
            allowed = ", ".join(sorted(known | {"failure"}))
            raise ExperimentError(f"{path}: unknown key {key!r} (known keys: {allowed})")
    return out


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class SweepResult:
    """A sweep's runs (rows sorted by protocol, failure, seed), events and aggregates."""

    sweep: Sweep
    runs: list[dict[str, Any]]
    events: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    runner: dict[str, Any]
    run_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    def timing(self) -> dict[str, Any]:
        """Wall time of the sweep and the summed time of its runs (seconds)."""
        return {
            "wall_s": self.run_s,
            "runs_s": math.fsum(r.get("run_s", 0.0) for r in self.runs),
            **self.extra,
        }


def run_key(row: Mapping[str, Any]) -> tuple[str, float, int]:
    """The sort key of a run's (or event's) row: protocol, failure, seed."""
    return (row["protocol"], float(row["failure"]), int(row["seed"]))


def event_rows(config: RunConfig, events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A run's per-event rows with the run's key (the :data:`EVENT_COLUMNS`)."""
    key = {"protocol": config.protocol, "failure": config.failure, "seed": config.seed}
    return [{**key, **{c: e[c] for c, _ in EVENT_COLUMNS[3:]}} for e in events]


def run_serial(sweep: Sweep, *, progress: ProgressFn | None = None) -> SweepResult:
    """Every run of ``sweep``, one after the other in this process, then :func:`aggregate`."""
    t0 = time.perf_counter()
    configs = sweep.configs()
    runs: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    if progress is not None:
        progress("runs", 0, len(configs))
    done = 0
    for group in sweep.groups():
        for config, result in zip(group, run_group(group), strict=True):
            runs.append(result.row)
            events.extend(event_rows(config, result.events))
        done += len(group)
        if progress is not None:
            progress("runs", done, len(configs))
    runs.sort(key=run_key)
    events.sort(key=lambda e: (*run_key(e), e["event"]))
    return SweepResult(
        sweep, runs, events, aggregate(runs), {"name": "serial", "master": None}, time.perf_counter() - t0
    )


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def interval(mean: float, sd: float | None, n: int) -> tuple[float | None, float | None, float | None]:
    """(half width, low, high) of the 95 % t interval; Nones for ``sd`` None (one run)."""
    if sd is None or n < 2:
        return None, None, None
    half = t975(n - 1) * sd / math.sqrt(n)
    return half, mean - half, mean + half


def aggregate(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One :data:`SUMMARY_COLUMNS` row per (protocol, failure), sorted."""
    groups: dict[tuple[str, float], list[Mapping[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["protocol"], r["failure"]), []).append(r)
    out: list[dict[str, Any]] = []
    for (protocol, failure), rows in sorted(groups.items(), key=lambda kv: run_key(kv[1][0])):
        n = len(rows)
        row: dict[str, Any] = {"protocol": protocol, "failure": failure, "runs": n}
        for rate in _RATES:
            xs = [float(r[rate]) for r in rows]
            mean = _mean(xs)
            sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else None
            half, lo, hi = interval(mean, sd, n)
            row.update({f"{rate}_mean": mean, f"{rate}_sd": sd, f"{rate}_ci95": half,
                        f"{rate}_lo": lo, f"{rate}_hi": hi})  # fmt: skip
        row["forwards_per_event_mean"] = _mean([float(r["forwards_per_event"]) for r in rows])
        for s in _SUMS:
            row[s] = sum(int(r[s]) for r in rows)
        for m in _MAXES:
            row[f"{m}_max"] = max(int(r[m]) for r in rows)
        out.append({c: row[c] for c in SUMMARY_COLUMNS})
    return out


# -------------------------------------------------------------------------- forwards


def _bin_label(lo: int, hi: int | None) -> str:
    return f"{lo}+" if hi is None else (str(lo) if lo == hi else f"{lo}-{hi}")


def forwards_by_interest(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per protocol and :data:`FORWARD_BINS` bin (non-empty ones): the events' mean forwards."""
    out: list[dict[str, Any]] = []
    for protocol in sorted({e["protocol"] for e in events}):
        mine = [e for e in events if e["protocol"] == protocol]
        for lo, hi in FORWARD_BINS:
            inside = [e for e in mine if e["interested"] >= lo and (hi is None or e["interested"] <= hi)]
            if inside:
                out.append({
                    "protocol": protocol, "bin": _bin_label(lo, hi), "lo": lo, "hi": hi,
                    "events": len(inside),
                    "interested_mean": _mean([float(e["interested"]) for e in inside]),
                    "forwards_mean": _mean([float(e["forwards"]) for e in inside]),
                })  # fmt: skip
    return out


def irbr_below_scribe(binned: Sequence[Mapping[str, Any]]) -> bool | None:
    """IRBR's mean forwards below Scribe's in every bin both have events in (None: no such bin)."""
    by = {(r["protocol"], r["bin"]): r["forwards_mean"] for r in binned}
    common = [b for (p, b) in by if p == "irbr" and ("scribe", b) in by]
    if not common:
        return None
    return all(by[("irbr", b)] < by[("scribe", b)] for b in common)


# ---------------------------------------------------------------------------- outputs


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


def manifest(result: SweepResult, *, config_file: str | None, outputs: Mapping[str, str]) -> dict[str, Any]:
    """What ``manifest.json`` records: the sweep, where it ran, with what, how long it took."""
    return {
        "experiment": result.sweep.experiment,
        "config_file": config_file,
        "sweep": result.sweep.to_dict(),
        "seeds": list(result.sweep.seeds),
        "runs": len(result.runs),
        "runner": result.runner,
        "flowbus_version": _version(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "timing": result.timing(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "outputs": dict(outputs),
    }


def write_outputs(result: SweepResult, out: Path, *, config_file: str | None = None) -> dict[str, str]:
    """Write the CSV files, the PNG and ``manifest.json`` into ``out``; their paths by name."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"runs": out / "runs.csv", "summary": out / "summary.csv", "events": out / "events.csv"}
    write_csv(paths["runs"], [c for c, _ in RUN_COLUMNS], result.runs)
    write_csv(paths["summary"], SUMMARY_COLUMNS, result.summary)
    write_csv(paths["events"], [c for c, _ in EVENT_COLUMNS], result.events)
    if result.sweep.experiment == "irbr-forwards":
        paths["forwards"] = out / "forwards.csv"
        binned = forwards_by_interest(result.events)
        write_csv(paths["forwards"], FORWARD_COLUMNS, binned)
        paths["plot"] = out / "irbr-forwards.png"
        plot_forwards(binned, result.events, paths["plot"], result.sweep)
    else:
        paths["plot"] = out / "irbr-faults.png"
        plot_faults(result.summary, paths["plot"], result.sweep)
    paths["manifest"] = out / "manifest.json"
    names = {k: str(v) for k, v in paths.items()}
    doc = manifest(result, config_file=config_file, outputs=names)
    paths["manifest"].write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
    return names


# ------------------------------------------------------------------------------- plots

_COLORS: Final = {"irbr": "tab:blue", "scribe": "tab:orange"}
_NAMES: Final = {"irbr": "IRBR", "scribe": "Scribe-based"}


def plot_faults(summary: Sequence[Mapping[str, Any]], png: Path, sweep: Sweep) -> None:
    """Figure 4a: % of nodes failed against % of events lost (95 % intervals), paper points for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, scale in zip(axes, ("linear", "symlog"), strict=True):
        for protocol in sweep.protocols:
            rows = [r for r in summary if r["protocol"] == protocol]
            if not rows:
                continue
            xs = [100 * r["failure"] for r in rows]
            series = [("loss_rate", "total loss", "-", "o")]
            if protocol == "irbr":
                series.append(("reachable_loss_rate", "reachable loss", "--", "s"))
            for rate, what, style, marker in series:
                ys = [100 * r[f"{rate}_mean"] for r in rows]
                err = [100 * (r[f"{rate}_ci95"] or 0.0) for r in rows]
                ax.errorbar(xs, ys, yerr=err, color=_COLORS[protocol], linestyle=style, marker=marker,
                            capsize=3, label=f"{_NAMES[protocol]}: {what}")  # fmt: skip
            px, py = zip(*PAPER_LOSS[protocol], strict=True)
            ax.scatter(px, py, color=_COLORS[protocol], marker="*", s=120, edgecolors="black",
                       zorder=5, label=f"{_NAMES[protocol]}: paper")  # fmt: skip
        ax.set_xlabel("% of nodes failed at once")
        ax.set_ylabel("mean event loss (%)")
        if scale == "symlog":
            ax.set_yscale("symlog", linthresh=0.1)
            ax.set_title("same, symlog y")
        else:
            ax.set_title(
                f"event loss, {sweep.nodes:,} nodes, {len(sweep.seeds)} seeds x {sweep.events} events"
            )
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def plot_forwards(
    binned: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]], png: Path, sweep: Sweep
) -> None:
    """Figure 4b: interested nodes against forwards per event (each event a dot, bin means a line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for protocol in sweep.protocols:
        mine = [e for e in events if e["protocol"] == protocol]
        ax.scatter([e["interested"] for e in mine], [e["forwards"] for e in mine], s=6, alpha=0.15,
                   color=_COLORS[protocol])  # fmt: skip
        rows = [r for r in binned if r["protocol"] == protocol]
        ax.plot([r["interested_mean"] for r in rows], [r["forwards_mean"] for r in rows], marker="o",
                color=_COLORS[protocol], label=f"{_NAMES[protocol]} (bin means)")  # fmt: skip
    ax.set_xlabel("nodes interested in the event")
    ax.set_ylabel("forwards to deliver the event")
    ax.set_title(
        f"forwards per event, {sweep.nodes:,} nodes, {len(sweep.seeds)} seeds x {sweep.events} events"
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
