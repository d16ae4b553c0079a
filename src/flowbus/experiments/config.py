"""What every experiment config shares: the YAML reader, seeds and list parsing, checks.

How it works: an experiment's config is a frozen dataclass of its module (``IrbrSweep``,
``CbdloSweep``, ``RingJoin``, ...) that checks itself in ``__post_init__`` with the helpers
here; each raises an :class:`~flowbus.errors.ExperimentError` whose message names the key
and the value it got, before anything runs. :class:`ExperimentConfig` is what the runners
and the writer (:mod:`flowbus.experiments.output`) read of any config: its name, its seeds
and its fields as a JSON-able mapping.

Configs with a YAML file (``experiments/<name>.yaml``) read it with :func:`read_config`:
a mapping of settings, an optional ``experiment:`` key that must name the experiment, no
unknown key. :func:`config_path` finds the file a command reads: the one given, else
``experiments/<name>.yaml`` under the current directory if there is one, else none (the
built-in defaults, which have the same values). Command line text becomes values with
:func:`parse_seeds` (``N``, ``A-B`` or a list) and :func:`parse_list`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from flowbus.errors import ExperimentError

__all__ = [
    "ExperimentConfig",
    "OneSeed",
    "config_dict",
    "config_path",
    "fraction",
    "integer",
    "number",
    "one_of",
    "parse_list",
    "parse_seeds",
    "read_config",
    "seeds_value",
    "unique",
]

T = TypeVar("T")


class ExperimentConfig(Protocol):
    """What the runners and the writer read of any experiment's config."""

    @property
    def experiment(self) -> str:
        """The experiment's name: the ``flowbus sim`` command that runs it."""
        ...

    @property
    def seeds(self) -> tuple[int, ...]:
        """The master seeds of its runs (every random draw derives from one of them)."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-able (tuples as lists)."""
        ...


class OneSeed:
    """What :class:`ExperimentConfig` asks, for a config dataclass with one ``seed`` field
    and its experiment's name in the class variable ``NAME``."""

    __slots__ = ()
    NAME: ClassVar[str]
    seed: int

    @property
    def experiment(self) -> str:
        return self.NAME

    @property
    def seeds(self) -> tuple[int, ...]:
        return (self.seed,)

    def to_dict(self) -> dict[str, Any]:
        return config_dict(self)


def config_dict(config: Any) -> dict[str, Any]:
    """A config dataclass's fields by name, tuples as lists (what ``to_dict`` returns)."""
    assert is_dataclass(config)
    return {f.name: _plain(getattr(config, f.name)) for f in fields(config)}


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# ------------------------------------------------------------------------------- checks


def integer(key: str, value: Any, low: int) -> int:
    """``value`` if it is an int >= ``low`` (a bool is not)."""
    if type(value) is not int or value < low:
        raise ExperimentError(f"{key} must be an int >= {low}, got {value!r}")
    return value


def number(key: str, value: Any, *, low: float | None = None, strict: bool = False) -> float:
    """``value`` as a float if it is a number (not a bool), >= ``low`` (> if ``strict``)."""
    bound = "" if low is None else f" {'>' if strict else '>='} {low:g}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ExperimentError(f"{key} must be a number{bound}, got {value!r}")
    if low is not None and (value <= low if strict else value < low):
        raise ExperimentError(f"{key} must be a number{bound}, got {value!r}")
    return float(value)


def fraction(key: str, value: Any, *, open_low: bool = False, open_high: bool = False) -> float:
    """``value`` as a float if it is a number in [0, 1] (ends excluded as asked)."""
    lo, hi = "(" if open_low else "[", ")" if open_high else "]"
    number = not isinstance(value, bool) and isinstance(value, int | float)
    above = number and (value > 0 if open_low else value >= 0)
    below = number and (value < 1 if open_high else value <= 1)
    if not (above and below):
        raise ExperimentError(f"{key} must be a fraction in {lo}0, 1{hi}, got {value!r}")
    return float(value)


def unique(key: str, values: Any) -> tuple[Any, ...]:
    """``values`` as a tuple if it is a non-empty list (or tuple) without repeats."""
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise ExperimentError(f"{key} must be a list, got {values!r}")
    if not values:
        raise ExperimentError(f"{key} must not be empty")
    seen: list[Any] = []
    for v in values:
        if v in seen:
            raise ExperimentError(f"{key}: {v!r} is listed twice")
        seen.append(v)
    return tuple(values)


def one_of(key: str, value: Any, known: Collection[str]) -> str:
    """``value`` if it is one of ``known``."""
    if value not in known:
        raise ExperimentError(f"unknown {key} {value!r} (expected one of {', '.join(known)})")
    return str(value)


# ----------------------------------------------------------------------- command line text


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


def seeds_value(value: Any) -> tuple[int, ...]:
    """A config file's ``seeds``: N (seeds 1..N), a list, or command line text."""
    if type(value) is int:
        if value < 1:
            raise ExperimentError(f"seeds N must be >= 1 (seeds 1..N), got {value}")
        return tuple(range(1, value + 1))
    if isinstance(value, list | tuple):
        return tuple(value)
    if isinstance(value, str):
        return parse_seeds(value)
    raise ExperimentError(f"seeds must be N (seeds 1..N) or a list, got {value!r}")


def parse_list(key: str, text: str, kind: Callable[[str], T], example: str) -> tuple[T, ...]:
    """Comma-separated command line text as a tuple of ``kind`` (``example`` shows the form)."""
    try:
        return tuple(kind(s.strip()) for s in text.split(",") if s.strip())
    except ValueError:
        raise ExperimentError(f"{key} must be {example}; got {text!r}") from None


# ------------------------------------------------------------------------------- files


def config_path(experiment: str, given: Path | None) -> Path | None:
    """The config file a command reads (see the module note); a missing ``given`` file is an error."""
    if given is None:
        default = Path("experiments") / f"{experiment}.yaml"
        return default if default.is_file() else None
    if not given.is_file():
        raise ExperimentError(f"sweep config not found: {given}")
    return given


def read_config(path: Path, experiment: str, known: Collection[str]) -> dict[str, Any]:
    """The settings of the YAML file ``path`` for ``experiment`` (without its ``experiment``
    key); every key must be in ``known``."""
    data = read_yaml_mapping(path)
    if data.get("experiment", experiment) != experiment:
        raise ExperimentError(f"{path} is a config for {data['experiment']!r}, not {experiment!r}")
    data.pop("experiment", None)
    for key in data:
        if key not in known:
            raise ExperimentError(f"{path}: unknown key {key!r} (known keys: {', '.join(sorted(known))})")
    return data


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """The mapping in the YAML file ``path`` (an empty file: an empty mapping)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ExperimentError(f"cannot read the sweep config {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ExperimentError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ExperimentError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return data
