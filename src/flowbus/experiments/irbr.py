"""The IRBR fault experiments (the IRBR paper's section 4, figure 4): sweeps of runs.

How it works:

* An :class:`IrbrSweep` is protocols x failure rates x seeds, with the other
  :class:`~flowbus.experiments.irbr_run.IrbrRun` fields fixed. :func:`load` builds one
  from a YAML file (``experiments/irbr-faults.yaml``) or the built-in defaults of the
  experiment (:data:`DEFAULTS`, the same values), with command line overrides; every
  input is checked there, before any run starts (an :class:`~flowbus.errors.ExperimentError`
  names the key). :meth:`IrbrSweep.groups` lists the runs by (protocol, seed): the failure
  rates of one group share one subscription phase
  (:func:`~flowbus.experiments.irbr_run.run_group`).
* :func:`run` runs the groups one after the other in this process;
  :func:`flowbus.spark.sweep.run_spark` runs them as Spark tasks. Both end in
  :func:`assemble`, which gives the same :class:`~flowbus.experiments.output.Result`: one
  row per run (:data:`RUN_COLUMNS` plus ``run_s``), a table of the published events
  (:data:`EVENT_COLUMNS`), and the summary (:data:`SUMMARY_COLUMNS`, one row per protocol
  and failure rate: mean, sample standard deviation and 95 % Student t interval of the
  loss rates, the means of :data:`MEANS` -- forwards and acknowledgements per event, the
  delivery delay -- and the worst delay, computed by :func:`aggregate` here and by Spark
  there). ``irbr-forwards`` adds its events binned by interested nodes
  (:func:`forwards_by_interest`, figure 4b).
* :data:`FILES`: ``runs.csv``, ``summary.csv``, ``events.csv`` (and ``forwards.csv``),
  ``manifest.json`` and a PNG (figure 4a for ``irbr-faults``, 4b for ``irbr-forwards``).
  The CSV files have a fixed column order, sorted rows and no timing column: the same
  sweep gives the same bytes on every run, serial or Spark.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final

from flowbus.errors import ExperimentError
from flowbus.experiments.config import (
    config_dict,
    integer,
    number,
    one_of,
    parse_list,
    parse_seeds,
    read_config,
    seeds_value,
    unique,
)
from flowbus.experiments.irbr_run import PROTOCOLS, IrbrRun, run_group
from flowbus.experiments.output import SERIAL, Csv, OutputFiles, ProgressFn, Result, pyplot, save
from flowbus.experiments.stats import interval, mean, sample_sd

__all__ = [
    "DEFAULTS",
    "EVENT_COLUMNS",
    "EXPERIMENTS",
    "FILES",
    "FORWARD_BINS",
    "FORWARD_COLUMNS",
    "PAPER_LOSS",
    "RUN_COLUMNS",
    "SUMMARY_COLUMNS",
    "IrbrSweep",
    "aggregate",
    "assemble",
    "event_rows",
    "forwards_by_interest",
    "irbr_below_scribe",
    "load",
    "run",
    "run_key",
]

EXPERIMENTS: Final = ("irbr-faults", "irbr-forwards")

# ----------------------------------------------------------------------------- columns

RUN_COLUMNS: Final[tuple[tuple[str, str], ...]] = (
    ("protocol", "str"), ("nodes", "int"), ("failure", "float"), ("seed", "int"), ("events", "int"),
    ("subscribers", "float"), ("symbols", "int"), ("zipf", "float"), ("covering", "bool"),
    ("latency", "float"), ("acks", "bool"), ("ack_timeout", "float"), ("notice", "float"),
    ("heartbeat", "float"), ("gap", "float"),
    ("failed", "int"), ("subscriptions", "int"), ("subscribe_messages", "int"),
    ("interested", "int"), ("reachable", "int"), ("delivered", "int"), ("lost", "int"),
    ("lost_reachable", "int"), ("duplicates", "int"), ("wrong", "int"), ("forwards", "int"),
    ("ack_messages", "int"), ("loss_rate", "float"), ("reachable_loss_rate", "float"),
    ("forwards_per_event", "float"), ("acks_per_event", "float"), ("delay", "float"),
    ("delay_max", "float"), ("timeouts", "int"),
    ("messages", "int"),
)  # fmt: skip
"""The columns of ``runs.csv`` (name, type), in order: a run's row without its timing fields."""

EVENT_COLUMNS: Final[tuple[tuple[str, str], ...]] = (
    ("protocol", "str"), ("failure", "float"), ("seed", "int"),
    ("event", "int"), ("publisher", "int"), ("interested", "int"), ("reachable", "int"),
    ("delivered", "int"), ("lost", "int"), ("lost_reachable", "int"), ("duplicates", "int"),
    ("wrong", "int"), ("forwards", "int"), ("ack_messages", "int"), ("delay", "float"),
    ("delay_max", "float"),
)  # fmt: skip
"""The columns of ``events.csv``: the run's key, then one published event's counts."""

RATES: Final = ("loss_rate", "reachable_loss_rate")
SUMS: Final = ("lost", "lost_reachable", "interested", "reachable")
MAXES: Final = ("duplicates", "wrong")
MEANS: Final = ("forwards_per_event", "acks_per_event", "delay")
"""Run figures the summary averages over the seeds (``<name>_mean``)."""
PEAKS: Final = ("delay_max",)
"""Run figures the summary takes the largest of (under their own name)."""

SUMMARY_COLUMNS: Final[tuple[str, ...]] = (
    "protocol", "failure", "runs",
    *(f"{r}_{s}" for r in RATES for s in ("mean", "sd", "ci95", "lo", "hi")),
    *(f"{m}_mean" for m in MEANS),
    *PEAKS,
    *SUMS,
    *(f"{m}_max" for m in MAXES),
)  # fmt: skip
"""The columns of ``summary.csv``: one row per (protocol, failure); ``ci95`` is the interval's half width."""

FORWARD_BINS: Final[tuple[tuple[int, int | None], ...]] = (
    (0, 0), (1, 5), (6, 10), (11, 20), (21, 40), (41, 80), (81, 160), (161, None),
)  # fmt: skip
"""Bins of "interested nodes" for figure 4b (inclusive bounds; None: no upper bound)."""

FORWARD_COLUMNS: Final = ("protocol", "bin", "lo", "hi", "events", "interested_mean", "forwards_mean")
"""The columns of ``forwards.csv``: per protocol and bin, the mean forwards of its events."""

PAPER_LOSS: Final = {"scribe": ((0.5, 1.35), (10.0, 20.27)), "irbr": ((0.5, 0.11), (10.0, 0.28))}
# (the paper does not say whether its Scribe-based protocol repaired its tree: one point set for both)
"""The paper's figure 4a endpoints: (% of nodes failed, % of events lost) per protocol."""

# ------------------------------------------------------------------------------ config

_FIXED: Final = (
    "nodes", "events", "subscribers", "symbols", "zipf", "covering", "latency",
    "acks", "ack_timeout", "notice", "heartbeat", "gap",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class IrbrSweep:
    """Protocols x failure rates x seeds; every other run setting fixed.

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
    acks: bool = True
    ack_timeout: float = 3.0
    notice: float | None = None
    heartbeat: float = 5.0
    gap: float = 10.0

    def __post_init__(self) -> None:
        one_of("experiment", self.experiment, EXPERIMENTS)
        protocols = unique("protocols", self.protocols)
        for p in protocols:
            one_of("protocol", p, PROTOCOLS)
        failures = unique("failures", self.failures)
        for f in failures:
            _check_failure(f)
        if self.experiment == "irbr-forwards" and tuple(failures) != (0.0,):
            raise ExperimentError(
                f"irbr-forwards runs without failures (failures: [0]), got {list(failures)}"
            )
        for s in unique("seeds", self.seeds):
            integer("seeds: a seed", s, 0)
        for name in ("subscribers", "zipf", "latency", "ack_timeout", "heartbeat", "gap"):
            object.__setattr__(self, name, number(name, getattr(self, name)))
        if self.notice is not None:
            object.__setattr__(self, "notice", number("notice", self.notice))
        object.__setattr__(self, "protocols", tuple(p for p in PROTOCOLS if p in protocols))
        object.__setattr__(self, "failures", tuple(sorted(float(f) for f in failures)))
        object.__setattr__(self, "seeds", tuple(sorted(self.seeds)))
        for p in self.protocols:  # the remaining checks are IrbrRun's own
            self._config(p, self.failures[-1], self.seeds[0])

    def _config(self, protocol: str, failure: float, seed: int) -> IrbrRun:
        return IrbrRun(protocol=protocol, failure=failure, seed=seed, **{k: getattr(self, k) for k in _FIXED})

    def configs(self) -> list[IrbrRun]:
        """Every run, sorted by protocol, failure rate and seed."""
        protocols = sorted(self.protocols)
        return [self._config(p, f, s) for p in protocols for f in self.failures for s in self.seeds]

    def groups(self) -> list[list[IrbrRun]]:
        """The runs by (protocol, seed): the failure rates of one group share one subscription
        phase (:func:`~flowbus.experiments.irbr_run.run_group`)."""
        protocols = sorted(self.protocols)
        return [[self._config(p, f, s) for f in self.failures] for p in protocols for s in self.seeds]

    def to_dict(self) -> dict[str, Any]:
        return config_dict(self)


def _check_failure(f: Any) -> None:
    if isinstance(f, bool) or not isinstance(f, int | float) or not 0.0 <= f < 1.0:
        hint = f" (a fraction: did you mean {f / 100:g}?)" if isinstance(f, int | float) and f >= 1 else ""
        raise ExperimentError(f"failures: a failure rate must be a fraction in [0, 1), got {f!r}{hint}")


DEFAULTS: Final[Mapping[str, IrbrSweep]] = {
    "irbr-faults": IrbrSweep(),
    "irbr-forwards": IrbrSweep(
        experiment="irbr-forwards", protocols=("irbr", "scribe"), failures=(0.0,), seeds=(1, 2, 3), events=300
    ),
}
"""The built-in sweeps: the same values as ``experiments/<experiment>.yaml``."""

_KEYS: Final = frozenset(f.name for f in fields(IrbrSweep)) - {"experiment"} | {"failure"}


def load(
    experiment: str,
    path: Path | None = None,
    *,
    nodes: int | None = None,
    seeds: str | Sequence[int] | None = None,
    failures: str | Sequence[float] | None = None,
    events: int | None = None,
    protocols: str | Sequence[str] | None = None,
    acks: bool | None = None,
    notice: float | None = None,
) -> IrbrSweep:
    """The sweep of ``path`` (YAML; None: the built-in :data:`DEFAULTS`) with overrides.

    The YAML keys are the :class:`IrbrSweep` fields (``experiment``, if given, must match);
    ``seeds`` may be N (seeds 1..N) or a list; ``failure: F`` may stand for
    ``failures: [F]``. String overrides are command line text (``"1,2,3"``); ``acks`` and
    ``notice`` (the simulator's failure notice, off unless given) override theirs.
    """
    one_of("experiment", experiment, EXPERIMENTS)
    values = DEFAULTS[experiment].to_dict()
    if path is not None:
        values.update(_from_file(Path(path), experiment))
    if nodes is not None:
        values["nodes"] = nodes
    if events is not None:
        values["events"] = events
    if acks is not None:
        values["acks"] = acks
    if notice is not None:
        values["notice"] = notice
    if seeds is not None:
        values["seeds"] = parse_seeds(seeds) if isinstance(seeds, str) else tuple(seeds)
    if failures is not None:
        values["failures"] = (
            parse_list("failures", failures, float, "fractions like 0.005,0.01,0.1")
            if isinstance(failures, str)
            else failures
        )
    if protocols is not None:
        values["protocols"] = (
            parse_list("protocols", protocols, str, "names like irbr,scribe")
            if isinstance(protocols, str)
            else protocols
        )
    for key in ("protocols", "failures", "seeds"):
        values[key] = tuple(values[key]) if isinstance(values[key], list | tuple) else values[key]
    return IrbrSweep(**values)


def _from_file(path: Path, experiment: str) -> dict[str, Any]:
    data = read_config(path, experiment, _KEYS)
    if "failure" in data:
        if "failures" in data:
            raise ExperimentError(f"{path}: give either failure or failures, not both")
        data["failures"] = (data.pop("failure"),)
    if "seeds" in data:
        data["seeds"] = seeds_value(data["seeds"])
    return data


# --------------------------------------------------------------------------------- run


def run_key(row: Mapping[str, Any]) -> tuple[str, float, int]:
    """The sort key of a run's (or event's) row: protocol, failure, seed."""
    return (row["protocol"], float(row["failure"]), int(row["seed"]))


def event_rows(config: IrbrRun, events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A run's per-event rows with the run's key (the :data:`EVENT_COLUMNS`)."""
    key = {"protocol": config.protocol, "failure": config.failure, "seed": config.seed}
    return [{**key, **{c: e[c] for c, _ in EVENT_COLUMNS[3:]}} for e in events]


def run(sweep: IrbrSweep, *, progress: ProgressFn | None = None) -> Result:
    """Every run of ``sweep``, one group after the other in this process, then :func:`assemble`."""
    t0 = time.perf_counter()
    total = len(sweep.configs())
    runs: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    if progress is not None:
        progress("runs", 0, total)
    for group in sweep.groups():
        for config, result in zip(group, run_group(group), strict=True):
            runs.append(result.row)
            events.extend(event_rows(config, result.events))
        if progress is not None:
            progress("runs", len(runs), total)
    return assemble(sweep, runs, events, runner=SERIAL, started=t0)


def assemble(
    sweep: IrbrSweep,
    runs: list[dict[str, Any]],
    events: list[dict[str, Any]],
    *,
    runner: Mapping[str, Any],
    started: float,
    summary: list[dict[str, Any]] | None = None,
) -> Result:
    """The result of a sweep's runs and events (in any order): both sorted, the summary
    (:func:`aggregate` unless given), the figure 4b bins for ``irbr-forwards``; ``started``
    is the ``time.perf_counter()`` the sweep started at."""
    runs.sort(key=run_key)
    events.sort(key=lambda e: (*run_key(e), e["event"]))
    summary = aggregate(runs) if summary is None else summary
    findings: dict[str, Any] = {"runs": len(runs)}
    tables = {"events": events}
    if sweep.experiment == "irbr-forwards":
        tables["forwards"] = binned = forwards_by_interest(events)
        findings["forwards_per_event"] = {r["protocol"]: r["forwards_per_event_mean"] for r in summary}
        findings["irbr_below_scribe"] = irbr_below_scribe(binned)
    timing = {
        "wall_s": time.perf_counter() - started,
        "runs_s": math.fsum(r.get("run_s", 0.0) for r in runs),
    }
    return Result(sweep, FILES[sweep.experiment], runs, summary, findings, tables, runner, timing)


def aggregate(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One :data:`SUMMARY_COLUMNS` row per (protocol, failure), sorted."""
    groups: dict[tuple[str, float], list[Mapping[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["protocol"], r["failure"]), []).append(r)
    out: list[dict[str, Any]] = []
    for (protocol, failure), rows in sorted(groups.items(), key=lambda kv: run_key(kv[1][0])):
        n = len(rows)
        row: dict[str, Any] = {"protocol": protocol, "failure": failure, "runs": n}
        for rate in RATES:
            xs = [float(r[rate]) for r in rows]
            centre = mean(xs)
            sd = sample_sd(xs, centre)
            half, lo, hi = interval(centre, sd, n)
            row.update({f"{rate}_mean": centre, f"{rate}_sd": sd, f"{rate}_ci95": half,
                        f"{rate}_lo": lo, f"{rate}_hi": hi})  # fmt: skip
        for m in MEANS:
            row[f"{m}_mean"] = mean([float(r[m]) for r in rows])
        for p in PEAKS:
            row[p] = max(float(r[p]) for r in rows)
        for s in SUMS:
            row[s] = sum(int(r[s]) for r in rows)
        for m in MAXES:
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
                    "interested_mean": mean([float(e["interested"]) for e in inside]),
                    "forwards_mean": mean([float(e["forwards"]) for e in inside]),
                })  # fmt: skip
    return out


def irbr_below_scribe(binned: Sequence[Mapping[str, Any]]) -> bool | None:
    """IRBR's mean forwards below Scribe's in every bin both have events in (None: no such bin)."""
    by = {(r["protocol"], r["bin"]): r["forwards_mean"] for r in binned}
    common = [b for (p, b) in by if p == "irbr" and ("scribe", b) in by]
    if not common:
        return None
    return all(by[("irbr", b)] < by[("scribe", b)] for b in common)


# ------------------------------------------------------------------------------- plots

_COLORS: Final = {"irbr": "tab:blue", "scribe": "tab:orange", "scribe-repair": "tab:green"}
_NAMES: Final = {"irbr": "IRBR", "scribe": "Scribe-based", "scribe-repair": "Scribe-based, heartbeat repair"}


def _title(what: str, sweep: IrbrSweep) -> str:
    return f"{what}, {sweep.nodes:,} nodes, {len(sweep.seeds)} seeds x {sweep.events} events"


def plot_faults(result: Result, png: Path) -> None:
    """Figure 4a: % of nodes failed against % of events lost (95 % intervals), paper points for reference."""
    sweep, summary = result.config, result.summary
    assert isinstance(sweep, IrbrSweep)
    fig, axes = pyplot().subplots(1, 2, figsize=(12, 4.5))
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
            if protocol in PAPER_LOSS:
                px, py = zip(*PAPER_LOSS[protocol], strict=True)
                ax.scatter(px, py, color=_COLORS[protocol], marker="*", s=120, edgecolors="black",
                           zorder=5, label=f"{_NAMES[protocol]}: paper")  # fmt: skip
        ax.set_xlabel("% of nodes failed at once")
        ax.set_ylabel("mean event loss (%)")
        if scale == "symlog":
            ax.set_yscale("symlog", linthresh=0.1)
            ax.set_title("same, symlog y")
        else:
            ax.set_title(_title("event loss", sweep))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    save(fig, png)


def plot_forwards(result: Result, png: Path) -> None:
    """Figure 4b: interested nodes against forwards per event (each event a dot, bin means a line)."""
    sweep, events, binned = result.config, result.tables["events"], result.tables["forwards"]
    assert isinstance(sweep, IrbrSweep)
    fig, ax = pyplot().subplots(figsize=(7, 4.5))
    for protocol in sweep.protocols:
        mine = [e for e in events if e["protocol"] == protocol]
        ax.scatter([e["interested"] for e in mine], [e["forwards"] for e in mine], s=6, alpha=0.15,
                   color=_COLORS[protocol])  # fmt: skip
        rows = [r for r in binned if r["protocol"] == protocol]
        ax.plot([r["interested_mean"] for r in rows], [r["forwards_mean"] for r in rows], marker="o",
                color=_COLORS[protocol], label=f"{_NAMES[protocol]} (bin means)")  # fmt: skip
    ax.set_xlabel("nodes interested in the event")
    ax.set_ylabel("forwards to deliver the event")
    ax.set_title(_title("forwards per event", sweep))
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, png)


# ------------------------------------------------------------------------------- files

_CSV: Final = (
    Csv("runs", "runs.csv", "rows", tuple(c for c, _ in RUN_COLUMNS)),
    Csv("summary", "summary.csv", "summary", SUMMARY_COLUMNS),
    Csv("events", "events.csv", "events", tuple(c for c, _ in EVENT_COLUMNS)),
)

FILES: Final[Mapping[str, OutputFiles]] = {
    "irbr-faults": OutputFiles(_CSV, plot_faults, json=("manifest", "manifest.json")),
    "irbr-forwards": OutputFiles(
        (*_CSV, Csv("forwards", "forwards.csv", "forwards", FORWARD_COLUMNS)),
        plot_forwards,
        json=("manifest", "manifest.json"),
    ),
}
"""What each experiment writes (see the module note)."""
