"""A collapse rule set compiled to a numeric kernel: a key's events folded in one numba loop.

How it works: :meth:`RuleKernel.of` accepts a rule set (a
:class:`~flowbus.flow.collapse.BoundRules`) whose guards and right-hand sides
only compare and compute numbers -- event fields and state components of type
``int`` or ``float``, numeric constants, ``+ - * /``, ``= != < <= > >=``, no
function or lookup -- and writes it as the source of one Python function over
arrays (the event fields the rules read, one row per event), which numba
compiles once per process. The loop is the interpreter's :meth:`BoundRules.step`
event after event: the first rule whose guard holds and whose right-hand sides
are all defined fires, reading the row before the event; a literal over an
undefined expression (division by zero) is false, true once negated; no rule,
or a new row equal to the old one, is no change. It returns the row after each
event and where it changed.

Numbers are IEEE doubles in the kernel, as they are in the interpreter for
``float``. Beside each value the kernel knows whether the interpreter would
hold a Python ``int`` there (an int field or constant, ``+ - *`` of two ints, a
component last set to one -- a float component starting from ``0`` holds an
int): such a value is exact as a double up to 2**53 in magnitude, and is never
``-0.0``. The kernel stops (:meth:`RuleKernel.run` returns None: fold this
key's events with the interpreter's code instead) on an int input or result
beyond 2**53, and on any NaN (an input, or a result such as ``inf - inf``: ``=``
and the row's equality treat NaN apart). So the rows it returns are the
interpreter's, value for value and int for int.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flowbus.filters.ast import (
    COMPARISON_OPS,
    BinOp,
    Const,
    Expr,
    ExprPredicate,
    Field,
    Filter,
    Op,
    Predicate,
)
from flowbus.filters.codegen import define
from flowbus.flow.collapse import BoundRules
from flowbus.flow.collapse import Row as StateRow
from flowbus.model import Schema

__all__ = ["EXACT_INT", "RuleKernel"]

EXACT_INT = 2.0**53
"""The largest magnitude at which every int is a double."""

_CMP = {Op.EQ: "==", Op.NE: "!=", Op.LT: "<", Op.LE: "<=", Op.GT: ">", Op.GE: ">="}


class _Unsupported(Exception):
    """The rule set reads or computes something the kernel does not (strings, calls, the key ...)."""


@dataclass(frozen=True, slots=True)
class _Value:
    var: str  # the variable holding it
    undefined: str  # a boolean expression: the value is undefined ("False" when it never is)
    is_int: str  # "True", "False", or the variable telling whether the interpreter holds an int


def _both(a: str, b: str) -> str | None:
    """``a and b`` of two is_int codes, when it is known without running (else None)."""
    if "False" in (a, b):
        return "False"
    if a == b == "True":
        return "True"
    return None


class _Source:
    """The kernel's source: rules -> statements over ``e<k>`` (event fields), ``r<j>`` (the row) and
    ``q<j>`` (whether the interpreter holds component ``j`` as an int)."""

    def __init__(self, bound: BoundRules, state: Schema) -> None:
        self.bound = bound
        self.kinds = {c: state.type_of(c) for c in bound.components}
        if any(k not in (int, float) for k in self.kinds.values()):
            raise _Unsupported("a component that is no number")
        self.index = {c: j for j, c in enumerate(bound.components)}
        self.reads: list[str] = []
        self.lines: list[str] = []
        self.temps = 0

    def _resolve(self, name: str) -> tuple[str, str]:
        """Where a rule reads ``name`` (as :meth:`flowbus.flow.collapse.BoundRules.read` does):
        the row, else the event."""
        bare = name[6:] if name.startswith(("event.", "state.")) else name
        if not name.startswith("event.") and bare in self.bound.key_names:
            raise _Unsupported("the key")
        if not name.startswith("event.") and bare in self.index:
            return "row", bare
        if self.bound.event.type_of(bare) not in (int, float):
            raise _Unsupported(f"{bare!r} is no number")
        return "event", bare

    def _temp(self, indent: str, code: str) -> str:
        self.temps += 1
        var = f"t{self.temps}"
        self.lines.append(f"{indent}{var} = {code}")
        return var

    def _leaf(self, e: Const | Field) -> _Value:
        if isinstance(e, Const):
            if type(e.value) not in (int, float) or (type(e.value) is int and abs(e.value) > EXACT_INT):
                raise _Unsupported("a constant that is no number")
            return _Value(repr(float(e.value)), "False", str(type(e.value) is int))
        where, name = self._resolve(e.name)
        if where == "row":
            j = self.index[name]
            return _Value(f"r{j}", "False", f"q{j}")
        if name not in self.reads:
            self.reads.append(name)
        return _Value(f"e{self.reads.index(name)}", "False", str(self.bound.event.type_of(name) is int))

    def expr(self, e: Expr, indent: str) -> _Value:
        if isinstance(e, (Const, Field)):
            return self._leaf(e)
        if not isinstance(e, BinOp):
            raise _Unsupported("a call")
        a, b = self.expr(e.left, indent), self.expr(e.right, indent)
        undefined = " or ".join(u for u in (a.undefined, b.undefined) if u != "False") or "False"
        if e.op == "/":
            var = self._temp(indent, f"{a.var} / {b.var} if {b.var} != 0.0 else 0.0")
            undefined = f"({undefined} or {b.var} == 0.0)" if undefined != "False" else f"{b.var} == 0.0"
            value = _Value(var, undefined, "False")
        else:
            is_int = _both(a.is_int, b.is_int) or self._temp(indent, f"{a.is_int} and {b.is_int}")
            value = _Value(self._temp(indent, f"{a.var} {e.op} {b.var}"), undefined, is_int)
        self.lines += [f"{indent}if {value.var} != {value.var}:", f"{indent}    return 1"]  # NaN
        if value.is_int != "False":  # an int: exact within 2**53, and never -0.0
            self.lines += [
                f"{indent}if {value.is_int}:",
                f"{indent}    if abs({value.var}) > {EXACT_INT!r}:",
                f"{indent}        return 1",
                f"{indent}    {value.var} = {value.var} + 0.0",
            ]
        return value

    def literal(self, lit: Predicate | ExprPredicate, indent: str) -> str:
        if isinstance(lit, Predicate):
            if lit.op not in COMPARISON_OPS or isinstance(lit.value, tuple) or lit.value is None:
                raise _Unsupported(f"operator {lit.op}")
            lit = ExprPredicate(Field(lit.attr), lit.op, Const(lit.value), lit.negated)
        if lit.op not in COMPARISON_OPS:
            raise _Unsupported(f"operator {lit.op}")
        a, b = self.expr(lit.left, indent), self.expr(lit.right, indent)
        holds = f"{a.var} {_CMP[lit.op]} {b.var}"
        undefined = " or ".join(u for u in (a.undefined, b.undefined) if u != "False")
        if undefined:
            holds = f"(not ({undefined}) and {holds})"
        return self._temp(indent, f"not {holds}" if lit.negated else holds)

    def guard(self, when: Filter, indent: str) -> str:
        if not when.disjuncts:
            return "False"
        ors = []
        for conj in when.disjuncts:
            ands = [self.literal(lit, indent) for lit in conj.literals]
            ors.append(" and ".join(ands) if ands else "True")
        return " or ".join(f"({x})" for x in ors)

    def rules(self) -> None:
        width = len(self.bound.components)
        indent = " " * 8
        self.lines.append(f"{indent}fired = False")
        for rule in self.bound.ruleset.rules:
            self.lines.append(f"{indent}if not fired:")
            inner = indent + "    "
            test = self.guard(rule.when, inner)
            self.lines.append(f"{inner}if {test}:")
            body = inner + "    "
            sets = {self.index[name]: self.expr(e, body) for name, e in rule.sets}
            undefined = " or ".join(v.undefined for v in sets.values() if v.undefined != "False") or "False"
            self.lines.append(f"{body}if not ({undefined}):")
            for j in range(width):
                self.lines.append(f"{body}    n{j} = {sets[j].var if j in sets else f'r{j}'}")
                self.lines.append(f"{body}    m{j} = {sets[j].is_int if j in sets else f'q{j}'}")
            self.lines.append(f"{body}    fired = True")
        moved = " or ".join(f"n{j} != r{j}" for j in range(width))
        self.lines.append(f"{indent}if fired and ({moved}):")
        self.lines.append(f"{indent}    changed[i] = True")
        self.lines += [f"{indent}    r{j} = n{j}\n{indent}    q{j} = m{j}" for j in range(width)]
        self.lines += [f"{indent}out[i, {j}] = r{j}" for j in range(width)]

    def text(self) -> str:
        self.rules()
        width = len(self.bound.components)
        head = ["def kernel(x, row, ints, out, changed):"]
        for j in range(width):
            head += [f"    r{j} = row[{j}]", f"    q{j} = ints[{j}]", f"    n{j} = r{j}", f"    m{j} = q{j}"]
        head.append("    for i in range(x.shape[1]):")
        head += [f"        e{k} = x[{k}, i]" for k in range(len(self.reads))]
        tail = [f"    ints[{j}] = q{j}" for j in range(width)]
        return "\n".join([*head, *self.lines, *tail, "    return 0", ""])


_COMPILED: dict[str, Callable[..., int]] = {}


def _compile(text: str) -> Callable[..., int]:
    """The numba function of ``text``: compiled once per process and text, and kept on disk (numba's
    cache beside the source, under ``~/.cache/flowbus/kernels``) so other processes -- Spark's Python
    workers, the next run -- load it instead of compiling it again."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:32]
    found = _COMPILED.get(digest)
    if found is None:
        found = _COMPILED[digest] = _load(digest, text)
    return found


def _load(digest: str, text: str) -> Callable[..., int]:
    source = f"from numba import njit\n\n\n@njit(cache=True, nogil=True, error_model='numpy')\n{text}"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flowbus" / "kernels"
    path = base / f"k{digest}.py"
    try:
        if not path.exists():
            base.mkdir(parents=True, exist_ok=True)
            tmp = base / f".k{digest}.{os.getpid()}.tmp"
            tmp.write_text(source)
            tmp.replace(path)  # whole or not at all, for a process reading it meanwhile
        spec = importlib.util.spec_from_file_location(f"flowbus_kernel_{digest}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # numba's cache finds the module's globals by its name
        spec.loader.exec_module(module)
        fn: Callable[..., int] = module.kernel
        return fn
    except OSError:  # no cache directory: compiled in memory only
        from numba import njit

        kernel = define("kernel", [text], {}, where=f"<flowbus kernel {digest}>")
        compiled: Callable[..., int] = njit(nogil=True, error_model="numpy")(kernel)
        return compiled


class RuleKernel:
    """A collapse's rules as one compiled loop over a key's events (see the module notes)."""

    def __init__(self, bound: BoundRules, source: _Source) -> None:
        self.bound = bound
        self.text = source.text()
        self.reads = list(source.reads)
        self.int_reads = [bound.event.type_of(f) is int for f in self.reads]

    @staticmethod
    def of(bound: BoundRules, state: Schema) -> RuleKernel | None:
        """The kernel of ``bound`` (a collapse's rules, ``state`` its space's schema), or None."""
        try:
            source = _Source(bound, state)
            return RuleKernel(bound, source)
        except _Unsupported:
            return None

    def run(
        self, columns: Mapping[str, np.ndarray], n: int, start: StateRow
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """From row ``start`` over ``n`` events (``columns``: each field the rules read, in ``_order``):
        the row after each event (float64, one row per event), where it changed, and which components
        of the last row the interpreter holds as ints; None: fold these events with the interpreter's
        code (a NaN, or an int past 2**53)."""
        row = np.array(start, dtype=np.float64)
        ints = np.array([type(v) is int for v in start], dtype=np.bool_)
        if np.isnan(row).any() or (np.abs(row[ints]) > EXACT_INT).any():
            return None
        x = np.empty((len(self.reads), n), dtype=np.float64)
        for k, f in enumerate(self.reads):
            x[k] = columns[f]
            if np.isnan(x[k]).any() or (self.int_reads[k] and (np.abs(x[k]) > EXACT_INT).any()):
                return None
        out = np.empty((n, len(start)), dtype=np.float64)
        changed = np.zeros(n, dtype=np.bool_)
        if _compile(self.text)(x, row, ints, out, changed) != 0:
            return None
        return out, changed, ints

    @staticmethod
    def row(values: np.ndarray, ints: np.ndarray) -> StateRow:
        """A row of the kernel as the interpreter holds it (an int where ``ints`` says so)."""
        return tuple(int(v) if i else float(v) for v, i in zip(values.tolist(), ints.tolist(), strict=True))
