"""The error tree: every class is drawn in ``flowbus.errors``'s tree, and no code raises the
root itself (a raise names whose fault it is)."""

from __future__ import annotations

import ast
from pathlib import Path

import flowbus.errors as errors

SRC = Path(__file__).resolve().parents[1] / "src" / "flowbus"


def _raises_of_the_root(source: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            f = node.exc.func
            if isinstance(f, ast.Name) and f.id == "FlowbusError":
                found.append(f"{where}:{node.lineno}")
    return found


def test_no_code_raises_the_root_of_the_tree() -> None:
    bad = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        for hit in _raises_of_the_root(path.read_text(), str(path.relative_to(SRC)))
    ]
    assert not bad, "raise a class that says whose fault it is, not FlowbusError:\n" + "\n".join(bad)


def test_the_check_finds_a_raise_of_the_root() -> None:
    assert _raises_of_the_root("def f():\n    raise FlowbusError('x')\n", "m.py") == ["m.py:2"]
    assert _raises_of_the_root("def f():\n    raise UserError('x')\n", "m.py") == []


def test_every_error_is_in_the_tree_and_drawn() -> None:
    doc = errors.__doc__ or ""
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.FlowbusError), name
        assert name in doc, f"{name} is not drawn in flowbus.errors' tree"
