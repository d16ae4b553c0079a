"""The CBDLO experiments: the 004 document's figures 5 to 9 and its APT hit rate.

How it works: an experiment is a :class:`CbdloSweep` -- read from
``experiments/<name>.yaml`` or the built-in :data:`DEFAULTS` (the same values) by
:func:`load` -- of protocols x seeds x one or more sweeps (a
:class:`~flowbus.experiments.cbdlo_run.CbdloRun` field and its values); every other
``CbdloRun`` field is fixed by the config (``settings``), possibly per protocol
(``per_protocol``). Building one checks everything before anything runs (an
:class:`~flowbus.errors.ExperimentError` names the culprit). :func:`run` makes one
:func:`flowbus.experiments.cbdlo_run.run` per point, protocol and seed, and returns the
rows, their means over the seeds (``summary``) and what the experiment adds (the
document's reference values, the figure 7 extrapolation). :data:`FILES`: ``<name>.csv``
(one row per run, no timing column: the same config gives the same bytes),
``<name>.json`` (everything, timings included) and ``<name>.png``
(:mod:`~flowbus.experiments.cbdlo_plots`).

* ``cbdlo-cost`` (figure 5): effective distribution cost = messages / (delivered /
  expected) against the total number of subscriptions.
* ``cbdlo-hops`` (figure 6): the same against the maximum hops.
* ``cbdlo-scale`` (figure 7): messages per event of TERA and CBDLO against the number of
  nodes, simulated up to ``max(nodes)``; beyond, each protocol's model
  ``messages/event = a + b log2 N + c N`` (:func:`fit`: one term per kind of message,
  each fitted on the messages of its kind) is extrapolated to 10^9 nodes.
* ``cbdlo-matching`` (figures 8 and 9): matching cost against subscriptions and against the
  number of attributes; CBDLO's is the document's ``|APT| x H1 + 1 x H2`` summed over an
  event's attribute searches, Simple's the attribute comparisons of local matching
  (``m x s`` per node reached).
* ``cbdlo-apt``: the share of attribute searches that entered their topology within 10
  hops, against the APT size.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final

import numpy as np

from flowbus.errors import ExperimentError
from flowbus.experiments.cbdlo_plots import plot
from flowbus.experiments.cbdlo_run import PROTOCOLS, CbdloRun
from flowbus.experiments.cbdlo_run import run as run_one
from flowbus.experiments.config import integer, number, one_of, parse_seeds, read_config, seeds_value, unique
from flowbus.experiments.output import Csv, OutputFiles, ProgressFn, Result
from flowbus.experiments.stats import mean, r_squared

__all__ = [
    "DEFAULTS",
    "EXPERIMENTS",
    "FILES",
    "PAPER",
    "CbdloSweep",
    "extrapolate",
    "fit",
    "load",
    "run",
    "summarise",
]

EXPERIMENTS: Final = ("cbdlo-cost", "cbdlo-hops", "cbdlo-scale", "cbdlo-matching", "cbdlo-apt")
RUN_FIELDS: Final = tuple(f.name for f in fields(CbdloRun))
SETTINGS: Final = frozenset(RUN_FIELDS) - {"protocol", "seed"}
"""The run settings a config may fix or sweep (a run's protocol and seed come from the config's lists)."""
TIMING: Final = ("build_s", "run_s")

PAPER: Final[Mapping[str, Any]] = {
    "cbdlo-cost": {"simple_first_point": {"messages": 68605, "delivered": 68, "expected": 408,
                                          "effective_cost": 411630}},
    "cbdlo-apt": {"apt": 100, "hit_rate_10": 0.90, "tera_apt": 50},
}  # fmt: skip
"""What the document states in numbers (section 5.3)."""


# ------------------------------------------------------------------------------- configs


@dataclass(frozen=True, slots=True)
class CbdloSweep:
    """Protocols x seeds x the points of ``sweep``; every other run setting in ``settings``.

    ``sweep`` maps a run setting to its values, ``per_protocol`` a protocol to settings of
    its own. ``cbdlo-scale`` sweeps ``nodes`` with ``subscriptions_per_node`` and may give
    ``events`` one per size; ``cbdlo-apt`` crosses its sweep with ``attributes_list``.
    """

    experiment: str
    protocols: tuple[str, ...]
    seeds: tuple[int, ...]
    sweep: dict[str, tuple[Any, ...]]
    settings: dict[str, Any] = field(default_factory=dict)
    per_protocol: dict[str, dict[str, Any]] = field(default_factory=dict)
    subscriptions_per_node: float | None = None
    attributes_list: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        name = one_of("experiment", self.experiment, EXPERIMENTS)
        for p in unique(f"{name}: protocols", self.protocols):
            one_of("protocol", p, PROTOCOLS)
        for s in unique(f"{name}: seeds", self.seeds):
            integer(f"{name}: seeds: a seed", s, 0)
        object.__setattr__(self, "protocols", tuple(self.protocols))
        object.__setattr__(self, "seeds", tuple(self.seeds))
        object.__setattr__(self, "sweep", _sweep(name, self.sweep))
        object.__setattr__(self, "settings", dict(self.settings))
        for key in self.settings:
            if key not in SETTINGS:
                raise ExperimentError(f"{name}: {key!r} is not a run setting")
        _per_protocol(name, self.per_protocol)
        if name == "cbdlo-scale":
            number(f"{name}: subscriptions_per_node", self.subscriptions_per_node, low=0, strict=True)
            ev, sizes = self.settings.get("events"), self.sweep.get("nodes", ())
            if isinstance(ev, list | tuple) and len(ev) != len(sizes):
                raise ExperimentError(f"{name}: events lists {len(ev)} values for {len(sizes)} sizes")
        if name == "cbdlo-apt":
            object.__setattr__(
                self, "attributes_list", unique(f"{name}: attributes_list", self.attributes_list)
            )
        try:
            for point in self.points():
                for p in self.protocols:
                    self.run_config(point, p, self.seeds[0])
        except ExperimentError as exc:
            raise ExperimentError(f"{name}: {exc}") from None

    def points(self) -> list[dict[str, Any]]:
        """Every sweep point: ``{"sweep": key, key: value, ...}`` (the APT experiment crosses
        its sizes with ``attributes_list``)."""
        out: list[dict[str, Any]] = []
        for key, values in self.sweep.items():
            for i, v in enumerate(values):
                if self.experiment == "cbdlo-apt":
                    out += [{"sweep": key, key: v, "attributes": a} for a in self.attributes_list or ()]
                elif self.experiment == "cbdlo-scale":
                    ev = self.settings["events"]
                    n_subs = max(1, round((self.subscriptions_per_node or 0.0) * v))
                    out.append({"sweep": key, key: v, "subscriptions": n_subs,
                                "events": ev[i] if isinstance(ev, list | tuple) else ev})  # fmt: skip
                else:
                    out.append({"sweep": key, key: v})
        return out

    def run_config(self, point: Mapping[str, Any], protocol: str, seed: int) -> CbdloRun:
        """The run of ``point`` for ``protocol`` and ``seed``."""
        values = dict(self.settings)
        values.update(self.per_protocol.get(protocol, {}))
        values.update({k: v for k, v in point.items() if k != "sweep"})
        values.update(protocol=protocol, seed=seed)
        return CbdloRun(**values)

    def to_dict(self) -> dict[str, Any]:
        """The config as its YAML file has it (the fixed settings at the top level)."""
        out: dict[str, Any] = {
            "experiment": self.experiment,
            "protocols": list(self.protocols),
            "seeds": list(self.seeds),
            "sweep": {k: list(v) for k, v in self.sweep.items()},
            "per_protocol": {p: dict(over) for p, over in self.per_protocol.items()},
        }
        if self.subscriptions_per_node is not None:
            out["subscriptions_per_node"] = self.subscriptions_per_node
        if self.attributes_list is not None:
            out["attributes_list"] = list(self.attributes_list)
        return {**out, **self.settings}


def _sweep(name: str, sweep: Any) -> dict[str, tuple[Any, ...]]:
    if not isinstance(sweep, dict) or not sweep:
        raise ExperimentError(f"{name}: sweep must map a run setting to a list of values, got {sweep!r}")
    for key, values in sweep.items():
        if key not in SETTINGS:
            raise ExperimentError(f"{name}: cannot sweep {key!r} (not a run setting)")
        if not isinstance(values, list | tuple) or not values:
            raise ExperimentError(f"{name}: sweep {key} must be a non-empty list, got {values!r}")
    return {k: tuple(v) for k, v in sweep.items()}


def _per_protocol(name: str, per: Any) -> None:
    if not isinstance(per, dict) or any(not isinstance(v, dict) for v in per.values()):
        raise ExperimentError(f"{name}: per_protocol must map a protocol to settings, got {per!r}")
    for p, over in per.items():
        if p not in PROTOCOLS:
            raise ExperimentError(f"{name}: per_protocol names an unknown protocol {p!r}")
        for k in over:
            if k not in SETTINGS:
                raise ExperimentError(f"{name}: per_protocol {p}: unknown run setting {k!r}")


_BASE: Final[dict[str, Any]] = {
    "nodes": 3000, "view": 10, "local_max": 100, "max_hops": 10, "apt": 20, "attributes": 100,
    "subscriptions": 2000, "events": 68, "fanout": 2, "trace": 5, "alpha": 0.9, "mu": 0.5, "event_attrs": 8,
    "width_min": 0.05, "width_max": 0.25, "one_sided": 0.5,
}  # fmt: skip

_TERA_APT: Final = {"tera": {"apt": 50}}

DEFAULTS: Final[Mapping[str, CbdloSweep]] = {
    "cbdlo-cost": CbdloSweep(
        "cbdlo-cost", ("simple", "cbdlo", "tera"), (1, 2, 3),
        {"subscriptions": (500, 1000, 2000, 4000, 8000, 16000)}, _BASE, _TERA_APT,
    ),
    "cbdlo-hops": CbdloSweep(
        "cbdlo-hops", ("simple", "cbdlo", "tera"), (1, 2, 3),
        {"max_hops": (2, 4, 6, 8, 10, 15, 20, 30)}, _BASE, _TERA_APT,
    ),
    "cbdlo-scale": CbdloSweep(
        "cbdlo-scale", ("cbdlo", "tera"), (1,), {"nodes": (100, 300, 1000, 3000, 10000, 30000, 100000)},
        {**_BASE, "apt": 100, "events": [50, 50, 50, 30, 20, 20, 10], "topic_view": 4},
        {"tera": {"apt": 50}, "cbdlo": {"apt": 100}}, subscriptions_per_node=1.0,
    ),
    "cbdlo-matching": CbdloSweep(
        "cbdlo-matching", ("simple", "cbdlo"), (1, 2),
        {"subscriptions": (500, 1000, 2000, 4000, 8000, 16000), "attributes": (10, 20, 50, 100, 200, 500)},
        {**_BASE, "view": 20, "apt": 20, "max_hops": 30},
    ),
    "cbdlo-apt": CbdloSweep(
        "cbdlo-apt", ("cbdlo",), (1, 2), {"apt": (5, 10, 20, 50, 100, 200)}, {**_BASE, "events": 100},
        attributes_list=(100, 1000),
    ),
}  # fmt: skip
"""The built-in configs: the same values as ``experiments/<name>.yaml``."""

_SPECIAL: Final = ("protocols", "seeds", "sweep", "per_protocol", "subscriptions_per_node", "attributes_list")


def load(experiment: str, path: Path | None = None, *, seeds: str | None = None) -> CbdloSweep:
    """The config of ``experiment``: the built-in one updated by the YAML file ``path`` and
    ``seeds`` (``"1,2,3"`` or ``"N"``: 1..N); every run's config is checked here."""
    one_of("experiment", experiment, EXPERIMENTS)
    values: dict[str, Any] = json.loads(json.dumps(DEFAULTS[experiment].to_dict()))
    if path is not None:
        values.update(read_config(path, experiment, SETTINGS | set(_SPECIAL)))
    if "seeds" in values:
        values["seeds"] = seeds_value(values["seeds"])
    if seeds is not None:
        values["seeds"] = parse_seeds(seeds)
    values.pop("experiment")
    special = {k: values.pop(k) for k in _SPECIAL if k in values}
    return CbdloSweep(experiment=experiment, settings=values, **special)


# ----------------------------------------------------------------------------------- run


def run(config: CbdloSweep, *, progress: ProgressFn | None = None) -> Result:
    """Every run of ``config``; the rows, the means over seeds, and the experiment's extras."""
    t0 = time.perf_counter()
    jobs = [(pt, p, s) for pt in config.points() for p in config.protocols for s in config.seeds]
    rows: list[dict[str, Any]] = []
    for i, (pt, p, s) in enumerate(jobs):
        if progress is not None:
            progress("runs", i, len(jobs))
        row = run_one(config.run_config(pt, p, s))
        sent = row.pop("sent_by_type")
        row.update({f"sent_{k}": v for k, v in sent.items()})
        rows.append({"sweep": pt["sweep"], **row})
    if progress is not None:
        progress("runs", len(jobs), len(jobs))
    summary = summarise(rows)
    findings: dict[str, Any] = {"runs": len(rows), "paper": PAPER.get(config.experiment)}
    if config.experiment == "cbdlo-scale":
        findings["extrapolation"] = extrapolate(summary)
    if config.experiment == "cbdlo-cost":
        first = [r for r in summary if r["protocol"] == "simple"]
        findings["simple_first_point"] = first[0] if first else None
    largest = max(rows, key=lambda r: r["build_s"] + r["run_s"])
    timing = {
        "wall_s": time.perf_counter() - t0,
        "largest_run": {k: largest[k] for k in ("protocol", "nodes", "events", *TIMING)},
    }
    return Result(config, FILES, rows, summary, findings, timing=timing)


def summarise(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The mean of every numeric column over the seeds of each (sweep, point, protocol)."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in rows:
        x = r[r["sweep"]]
        extra = r["attributes"] if r["sweep"] == "apt" else None
        groups.setdefault((r["sweep"], x, extra, r["protocol"]), []).append(r)
    out = []
    for (sweep, x, _, protocol), rs in groups.items():
        row: dict[str, Any] = {"sweep": sweep, "x": x, "protocol": protocol, "runs": len(rs)}
        for k, v in rs[0].items():
            if k in ("sweep", "protocol") or isinstance(v, str | bool):
                continue
            if k in RUN_FIELDS and k != "events" and not (k == "attributes" and sweep == "apt"):
                continue
            vals = [r.get(k) for r in rs]
            if all(isinstance(u, int | float) for u in vals):
                centre = mean(vals)  # type: ignore[arg-type]
                row[k] = centre if math.isfinite(centre) else None
        out.append(row)
    return out


SEARCH: Final = ("Walk", "Enter", "TopicWalk", "TopicEnter")
TREE: Final = ("TreeStep",)
FANOUT: Final = ("Matched", "TopicFlood")


def fit(
    ns: Sequence[float], search: Sequence[float], tree: Sequence[float], fanout: Sequence[float]
) -> dict[str, float]:
    """The figure 7 model, one term per kind of message (per event, at ``N`` nodes):
    ``a`` = the lower-layer search (walks and entries: the mean, it does not grow with N),
    ``b log2 N`` = the steps down an attribute tree (least squares through 0), ``c N`` =
    the fan-out to interested nodes or topic members (least squares through 0). ``r2``:
    of ``a + b log2 N + c N`` against the totals."""
    x = np.array(ns, dtype=float)
    logs = np.log2(x)
    a = float(np.mean(search))
    b = float(np.dot(tree, logs) / np.dot(logs, logs))
    c = float(np.dot(fanout, x) / np.dot(x, x))
    total = np.array(search, dtype=float) + np.array(tree, dtype=float) + np.array(fanout, dtype=float)
    return {"a": a, "b_log2n": b, "c_n": c, "r2": r_squared(total, a + b * logs + c * x)}


EXTRAPOLATE_TO: Final = (10**6, 10**7, 10**8, 10**9)


def _per_event(row: Mapping[str, Any], kinds: Sequence[str]) -> float:
    return float(sum(row.get(f"sent_{k}") or 0.0 for k in kinds)) / float(row["events"])


def extrapolate(summary: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Figure 7 beyond the simulated sizes: each protocol's :func:`fit`, evaluated up to 10^9."""
    out: dict[str, Any] = {
        "model": "messages/event = a + b log2 N + c N: a = lower-layer search (mean), b log2 N = tree "
        "steps, c N = fan-out to interested nodes / topic members (each fitted on its own messages)"
    }
    for protocol in sorted({r["protocol"] for r in summary}):
        rows = sorted((r for r in summary if r["protocol"] == protocol), key=lambda r: r["x"])
        if len(rows) < 2:
            continue
        f = fit([r["x"] for r in rows], [_per_event(r, SEARCH) for r in rows],
                [_per_event(r, TREE) for r in rows], [_per_event(r, FANOUT) for r in rows])  # fmt: skip
        out[protocol] = {
            **f,
            "predicted": {
                str(n): f["a"] + f["b_log2n"] * math.log2(n) + f["c_n"] * n for n in EXTRAPOLATE_TO
            },
        }
    return out


# ------------------------------------------------------------------------------- outputs


def _csv_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The run settings first, in their order, then every other column but timings, sorted."""
    first = ["sweep", *RUN_FIELDS]
    return first + sorted({k for r in rows for k in r} - set(first) - set(TIMING))


FILES: Final = OutputFiles(
    (Csv("csv", "{experiment}.csv", columns=_csv_columns),), plot, json=("json", "{experiment}.json")
)
"""``<name>.csv``, ``<name>.json`` and ``<name>.png``."""
