"""The import contract: flowbus's packages form layers, and a module imports only from its own
package or from a layer below it. pyspark is imported only under ``flowbus.spark``.

Read from the source (the AST), so an import inside a function counts as much as one at the
top; imports under ``if TYPE_CHECKING:`` count too (a type from above is a dependency on it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "flowbus"

LAYERS: list[set[str]] = [
    {"errors"},
    {"model", "wire", "core", "meta"},
    {"filters"},
    {"matching"},
    {"flow"},
    {"overlay"},
    {"routing"},
    {"sim", "net"},
    {"client"},
    {"broker"},
    {"experiments"},
    {"spark"},
    {"bench", "chaos"},
    {"cli"},
]
"""Bottom first. Packages of one layer do not import each other."""

FACADE = {"__init__", "__main__"}
"""``flowbus`` itself and ``python -m flowbus``: the top, they may import anything."""

LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        yield ".".join(parts), path


def _imports(path: Path, module: str) -> Iterator[tuple[int, str]]:
    package = module.split(".")[:-1]  # (a package's __init__ is "<package>.__init__")
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["flowbus", *package][: len(package) + 2 - node.level]
                name = ".".join([*base, node.module] if node.module else base)
                yield node.lineno, name
            elif node.module == "flowbus":  # from flowbus import wire: the module wire
                for alias in node.names:
                    yield node.lineno, f"flowbus.{alias.name}"
            else:
                yield node.lineno, node.module or ""


def _top(module: str) -> str:
    return module.split(".")[0]


def test_every_package_has_a_layer() -> None:
    tops = {_top(m) for m, _ in _modules()} - FACADE
    assert tops <= set(LAYER_OF), f"packages with no layer in LAYERS: {sorted(tops - set(LAYER_OF))}"


def _violations() -> list[str]:
    bad = []
    for module, path in _modules():
        mine = _top(module)
        for line, name in _imports(path, module):
            where = f"src/flowbus/{path.relative_to(SRC)}:{line}"
            if _top(name) == "pyspark" and mine != "spark":
                bad.append(f"{where}: imports {name} outside flowbus.spark")
            if name == "flowbus" and mine not in FACADE:  # (import flowbus: the facade)
                bad.append(f"{where}: imports the facade flowbus (import the module that defines the name)")
            if not name.startswith("flowbus.") or mine in FACADE:
                continue
            theirs = _top(name.removeprefix("flowbus."))
            if theirs == mine or name == "flowbus.__version__":
                continue
            if theirs in FACADE or theirs not in LAYER_OF:  # (from flowbus import Client)
                bad.append(f"{where}: imports the facade {name} (import the module that defines it)")
            elif LAYER_OF[theirs] >= LAYER_OF[mine]:
                bad.append(
                    f"{where}: {mine} (layer {LAYER_OF[mine]}) imports {name} (layer {LAYER_OF[theirs]})"
                )
    return bad


def test_layers_import_only_downward() -> None:
    bad = _violations()
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        ("from flowbus.broker import server", "routing.cbr", "routing (layer 6) imports flowbus.broker"),
        ("import pyspark.sql", "flow.local", "imports pyspark.sql outside flowbus.spark"),
        ("from flowbus import cli", "filters.ast", "filters (layer 2) imports flowbus.cli"),
        ("import flowbus", "chaos.workload", "imports the facade flowbus"),
        ("from flowbus import Client", "broker.server", "imports the facade flowbus.Client"),
    ],
)
def test_the_contract_catches_an_upward_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, module: str, expected: str
) -> None:
    """The checker itself can fail: a planted upward import is reported."""
    fake = tmp_path / "flowbus"
    path = fake / (module.replace(".", "/") + ".py")
    path.parent.mkdir(parents=True)
    path.write_text(source + "\n")
    monkeypatch.setattr(__import__(__name__), "SRC", fake)
    assert any(expected in v for v in _violations())


def _class_tests(source: str) -> list[int]:
    """Lines of ``isinstance(..., RingBroker)`` in ``source``."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "isinstance"
        and len(node.args) == 2
        and "RingBroker" in ast.unparse(node.args[1])
    ]


def test_the_broker_asks_no_core_its_class() -> None:
    """What only the ring's core has, the broker reads from ``ring_core`` (set once, by
    ``new_core``), not by testing the core's class."""
    bad = [
        f"src/flowbus/{path.relative_to(SRC)}:{line}"
        for path in sorted((SRC / "broker").glob("*.py"))
        for line in _class_tests(path.read_text())
    ]
    assert not bad, "isinstance(core, RingBroker) in broker/:\n" + "\n".join(bad)
    assert _class_tests("if isinstance(core, RingBroker): pass") == [1]


def test_generated_code_is_made_in_one_place() -> None:
    """``exec`` and ``eval`` are called in ``filters/codegen.py`` only (its ``define``, with
    the one operator table), wherever a function is generated."""
    bad = [
        f"src/flowbus/{path.relative_to(SRC)}:{node.lineno}"
        for path in sorted(SRC.rglob("*.py"))
        if path != SRC / "filters" / "codegen.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("exec", "eval")
    ]
    assert not bad, "exec or eval outside filters/codegen.py:\n" + "\n".join(bad)
