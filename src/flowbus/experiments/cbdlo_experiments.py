"""The CBDLO experiments: the 004 document's figures 5 to 9 and its APT hit rate.

How it works: an experiment is a config -- ``experiments/<name>.yaml`` or the built-in
:data:`DEFAULTS` (the same values) -- of protocols x seeds x one or more sweeps (a
:class:`~flowbus.experiments.cbdlo_run.RunConfig` field and its values); every other
``RunConfig`` field is fixed by the config, possibly per protocol (``per_protocol``).
:func:`load` checks everything before anything runs (an :class:`ExperimentError` names the
culprit). :func:`run` makes one :func:`flowbus.experiments.cbdlo_run.run` per point, protocol and
seed, and returns the rows, their means over the seeds (``summary``) and what the
experiment adds (the document's reference values, the figure 7 extrapolation).
:func:`write_outputs` writes ``<name>.csv`` (one row per run, no timing column: the same
config gives the same bytes), ``<name>.json`` (everything, timings included) and
``<name>.png``.

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
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, Final

import numpy as np

from flowbus.errors import ExperimentError, FlowbusError
from flowbus.experiments.cbdlo_run import PROTOCOLS, RunConfig
from flowbus.experiments.cbdlo_run import run as run_one
from flowbus.experiments.sweep import read_yaml_mapping, write_csv

__all__ = ["DEFAULTS", "EXPERIMENTS", "ExperimentError", "fit", "load", "run", "write_outputs"]

ProgressFn = Callable[[str, int, int], object]
EXPERIMENTS: Final = ("cbdlo-cost", "cbdlo-hops", "cbdlo-scale", "cbdlo-matching", "cbdlo-apt")
RUN_FIELDS: Final = tuple(f.name for f in fields(RunConfig))
TIMING: Final = ("build_s", "run_s")

PAPER: Final[Mapping[str, Any]] = {
    "cbdlo-cost": {"simple_first_point": {"messages": 68605, "delivered": 68, "expected": 408,
                                          "effective_cost": 411630}},
    "cbdlo-apt": {"apt": 100, "hit_rate_10": 0.90, "tera_apt": 50},
}  # fmt: skip
"""What the document states in numbers (section 5.3)."""


_BASE: Final[dict[str, Any]] = {
    "nodes": 3000, "view": 10, "local_max": 100, "max_hops": 10, "apt": 20, "attributes": 100,
    "subscriptions": 2000, "events": 68, "fanout": 2, "trace": 5, "alpha": 0.9, "mu": 0.5, "event_attrs": 8,
    "width_min": 0.05, "width_max": 0.25, "one_sided": 0.5,
}  # fmt: skip

DEFAULTS: Final[Mapping[str, Mapping[str, Any]]] = {
    "cbdlo-cost": {
        **_BASE, "protocols": ["simple", "cbdlo", "tera"], "seeds": [1, 2, 3],
        "sweep": {"subscriptions": [500, 1000, 2000, 4000, 8000, 16000]},
        "per_protocol": {"tera": {"apt": 50}},
    },
    "cbdlo-hops": {
        **_BASE, "protocols": ["simple", "cbdlo", "tera"], "seeds": [1, 2, 3],
        "sweep": {"max_hops": [2, 4, 6, 8, 10, 15, 20, 30]}, "per_protocol": {"tera": {"apt": 50}},
    },
    "cbdlo-scale": {
        **_BASE, "apt": 100, "protocols": ["cbdlo", "tera"], "seeds": [1],
        "sweep": {"nodes": [100, 300, 1000, 3000, 10000, 30000, 100000]},
        "subscriptions_per_node": 1.0, "events": [50, 50, 50, 30, 20, 20, 10], "topic_view": 4,
        "per_protocol": {"tera": {"apt": 50}, "cbdlo": {"apt": 100}},
    },
    "cbdlo-matching": {
        **_BASE, "view": 20, "apt": 20, "max_hops": 30, "protocols": ["simple", "cbdlo"], "seeds": [1, 2],
        "sweep": {"subscriptions": [500, 1000, 2000, 4000, 8000, 16000],
                  "attributes": [10, 20, 50, 100, 200, 500]},
    },
    "cbdlo-apt": {
        **_BASE, "events": 100, "protocols": ["cbdlo"], "seeds": [1, 2],
        "sweep": {"apt": [5, 10, 20, 50, 100, 200]}, "attributes_list": [100, 1000],
    },
}  # fmt: skip
"""The built-in configs: the same values as ``experiments/<name>.yaml``."""

_SPECIAL: Final = ("experiment", "protocols", "seeds", "sweep", "per_protocol", "subscriptions_per_node",
                   "attributes_list")  # fmt: skip


# ------------------------------------------------------------------------------- configs


def load(experiment: str, path: Path | None = None, *, seeds: str | None = None) -> dict[str, Any]:
    """The config of ``experiment``: the built-in one updated by the YAML file ``path`` and
    ``seeds`` (``"1,2,3"`` or ``"N"``: 1..N); every run's config is checked here."""
    if experiment not in DEFAULTS:
        raise ExperimentError(f"unknown experiment {experiment!r} (expected one of {', '.join(EXPERIMENTS)})")
    cfg: dict[str, Any] = json.loads(json.dumps(DEFAULTS[experiment]))
    if path is not None:
        cfg.update(_read_yaml(path, experiment))
    if seeds is not None:
        cfg["seeds"] = _parse_seeds(seeds)
    cfg["experiment"] = experiment
    _check(cfg)
    return cfg


def _parse_seeds(text: str) -> list[int]:
    try:
        if "," in text:
            return [int(s) for s in text.split(",") if s.strip()]
        n = int(text)
    except ValueError:
        raise ExperimentError(f"seeds must be N (seeds 1..N) or a list like 1,2,3; got {text!r}") from None
    if n < 1:
        raise ExperimentError(f"seeds N must be >= 1, got {n}")
    return list(range(1, n + 1))


def _read_yaml(path: Path, experiment: str) -> dict[str, Any]:
    data = read_yaml_mapping(path, ExperimentError)
    if data.get("experiment", experiment) != experiment:
        raise ExperimentError(f"{path} is a config for {data['experiment']!r}, not {experiment!r}")
    for key in data:
        if key not in RUN_FIELDS and key not in _SPECIAL:
            known = ", ".join(sorted({*RUN_FIELDS, *_SPECIAL} - {"protocol", "seed"}))
            raise ExperimentError(f"{path}: unknown key {key!r} (known keys: {known})")
    return dict(data)


def _list(cfg: Mapping[str, Any], key: str) -> list[Any]:
    v = cfg.get(key)
    if not isinstance(v, list) or not v:
        raise ExperimentError(f"{cfg['experiment']}: {key} must be a non-empty list, got {v!r}")
    if len(set(map(repr, v))) != len(v):
        raise ExperimentError(f"{cfg['experiment']}: {key} lists a value twice: {v}")
    return v


def _check(cfg: dict[str, Any]) -> None:
    name = cfg["experiment"]
    for p in _list(cfg, "protocols"):
        if p not in PROTOCOLS:
            raise ExperimentError(f"{name}: unknown protocol {p!r} (expected {', '.join(PROTOCOLS)})")
    for s in _list(cfg, "seeds"):
        if type(s) is not int or s < 0:
            raise ExperimentError(f"{name}: a seed must be an int >= 0, got {s!r}")
    sweep = cfg.get("sweep")
    if not isinstance(sweep, dict) or not sweep:
        raise ExperimentError(f"{name}: sweep must map a run setting to a list of values, got {sweep!r}")
    for key in sweep:
        if key not in RUN_FIELDS or key in ("protocol", "seed"):
            raise ExperimentError(f"{name}: cannot sweep {key!r} (not a run setting)")
        if not isinstance(sweep[key], list) or not sweep[key]:
            raise ExperimentError(f"{name}: sweep {key} must be a non-empty list, got {sweep[key]!r}")
    per = cfg.get("per_protocol", {})
    if not isinstance(per, dict) or any(not isinstance(v, dict) for v in per.values()):
        raise ExperimentError(f"{name}: per_protocol must map a protocol to settings, got {per!r}")
    for p, over in per.items():
        if p not in PROTOCOLS:
            raise ExperimentError(f"{name}: per_protocol names an unknown protocol {p!r}")
        for k in over:
            if k not in RUN_FIELDS or k in ("protocol", "seed"):
                raise ExperimentError(f"{name}: per_protocol {p}: unknown run setting {k!r}")
    if name == "cbdlo-scale":
        spn = cfg.get("subscriptions_per_node")
        if isinstance(spn, bool) or not isinstance(spn, int | float) or spn <= 0:
            raise ExperimentError(f"{name}: subscriptions_per_node must be a number > 0, got {spn!r}")
        ev = cfg.get("events")
        if isinstance(ev, list) and len(ev) != len(sweep.get("nodes", [])):
            raise ExperimentError(
                f"{name}: events lists {len(ev)} values for {len(sweep.get('nodes', []))} sizes"
            )
    if name == "cbdlo-apt":
        _list(cfg, "attributes_list")
    try:
        for point in points(cfg):
            for p in cfg["protocols"]:
                _config(cfg, point, p, cfg["seeds"][0])
    except FlowbusError as exc:
        raise ExperimentError(f"{name}: {exc}") from None


def points(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every sweep point: ``{"sweep": key, key: value, ...}`` (the APT experiment crosses
    its sizes with ``attributes_list``)."""
    out: list[dict[str, Any]] = []
    for key, values in cfg["sweep"].items():
        for i, v in enumerate(values):
            if cfg["experiment"] == "cbdlo-apt":
                out += [{"sweep": key, key: v, "attributes": a} for a in cfg["attributes_list"]]
            elif cfg["experiment"] == "cbdlo-scale":
                ev = cfg["events"]
                n_subs = max(1, round(cfg["subscriptions_per_node"] * v))
                out.append({"sweep": key, key: v, "subscriptions": n_subs,
                            "events": ev[i] if isinstance(ev, list) else ev})  # fmt: skip
            else:
                out.append({"sweep": key, key: v})
    return out


def _config(cfg: Mapping[str, Any], point: Mapping[str, Any], protocol: str, seed: int) -> RunConfig:
    values = {k: cfg[k] for k in RUN_FIELDS if k in cfg}
    values.update(cfg.get("per_protocol", {}).get(protocol, {}))
    values.update({k: v for k, v in point.items() if k != "sweep"})
    values.update(protocol=protocol, seed=seed)
    try:
        return RunConfig(**values)
    except TypeError as exc:
        raise ExperimentError(str(exc)) from None


# ----------------------------------------------------------------------------------- run


def run(cfg: Mapping[str, Any], *, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Every run of ``cfg``; the rows, the means over seeds, and the experiment's extras."""
    t0 = time.perf_counter()
    jobs = [(pt, p, s) for pt in points(cfg) for p in cfg["protocols"] for s in cfg["seeds"]]
    rows: list[dict[str, Any]] = []
    for i, (pt, p, s) in enumerate(jobs):
        if progress is not None:
            progress("runs", i, len(jobs))
        row = run_one(_config(cfg, pt, p, s))
        sent = row.pop("sent_by_type")
        row.update({f"sent_{k}": v for k, v in sent.items()})
        rows.append({"sweep": pt["sweep"], **row})
    if progress is not None:
        progress("runs", len(jobs), len(jobs))
    summary = summarise(rows)
    result: dict[str, Any] = {
        "experiment": cfg["experiment"],
        "config": dict(cfg),
        "seeds": list(cfg["seeds"]),
        "rows": rows,
        "summary": summary,
        "paper": PAPER.get(cfg["experiment"]),
    }
    if cfg["experiment"] == "cbdlo-scale":
        result["extrapolation"] = extrapolate(summary)
    if cfg["experiment"] == "cbdlo-cost":
        first = [r for r in summary if r["protocol"] == "simple"]
        result["simple_first_point"] = first[0] if first else None
    largest = max(rows, key=lambda r: r["build_s"] + r["run_s"])
    result["timing"] = {
        "wall_s": time.perf_counter() - t0,
        "largest_run": {k: largest[k] for k in ("protocol", "nodes", "events", *TIMING)},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
    return result


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
                mean = sum(vals) / len(vals)  # type: ignore[arg-type]
                row[k] = mean if math.isfinite(mean) else None
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
    pred = a + b * logs + c * x
    ss = float(np.sum((total - total.mean()) ** 2))
    r2 = 1.0 - float(np.sum((total - pred) ** 2)) / ss if ss > 0 else 1.0
    return {"a": a, "b_log2n": b, "c_n": c, "r2": r2}


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


def write_outputs(result: dict[str, Any], out: Path) -> dict[str, str]:
    """``<name>.csv``, ``<name>.json`` and ``<name>.png`` in ``out``; their paths by name."""
    from flowbus.experiments.cbdlo_plots import plot

    name = result["experiment"]
    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out / f"{name}.csv", "json": out / f"{name}.json", "plot": out / f"{name}.png"}
    rows = result["rows"]
    first = ["sweep", *RUN_FIELDS]
    rest = sorted({k for r in rows for k in r} - set(first) - set(TIMING))
    write_csv(paths["csv"], first + rest, rows)
    plot(result, paths["plot"])
    names = {k: str(v) for k, v in paths.items()}
    result["outputs"] = names
    paths["json"].write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    return names
