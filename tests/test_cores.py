"""One core interface: every protocol core in flowbus is a :class:`flowbus.core.Core`, and a
message it does not know is a :class:`ProtocolError` naming the message and the node.

The cores are found by walking flowbus's modules (a class with an ``on_message`` is a core),
so a new core is checked as soon as it exists; :data:`MAKERS` builds one of each, and a core
missing from it fails :func:`test_every_core_is_a_core`."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import random
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

import flowbus
from flowbus.core import Core, Deliver, Effect
from flowbus.errors import ProtocolError
from flowbus.experiments import ring_sim
from flowbus.overlay.cbdlo_tree import Topologies
from flowbus.overlay.chordal_ring import RingNode
from flowbus.overlay.class_router import ClassRouter
from flowbus.overlay.cyclon import Apt
from flowbus.overlay.multigraph import Multigraph
from flowbus.overlay.pastry import PastryNode
from flowbus.overlay.pastry_app import PastryApp
from flowbus.routing.cbdlo import CbdloNode
from flowbus.routing.cbr import ContentRouter
from flowbus.routing.flooding import SimpleNode
from flowbus.routing.irbr import IrbrNode
from flowbus.routing.irbr_broker import IrbrBroker
from flowbus.routing.ring_broker import RingBroker
from flowbus.routing.scribe import ScribeNode
from flowbus.routing.tera import TeraNode

ADDR = 4242
"""The address of every core built here (what an error must name)."""


def _pastry() -> PastryNode:
    return PastryNode(ADDR, random.Random(1).getrandbits(128), rng=random.Random(2))


MAKERS: dict[type, Callable[[], Any]] = {
    PastryNode: _pastry,
    PastryApp: lambda: PastryApp(_pastry()),
    IrbrNode: lambda: IrbrNode(_pastry()),
    ScribeNode: lambda: ScribeNode(_pastry()),
    IrbrBroker: lambda: IrbrBroker(ADDR),
    ClassRouter: lambda: ClassRouter(ADDR, Multigraph([ADDR, ADDR + 1])),
    ContentRouter: lambda: ContentRouter(ADDR, [ADDR + 1]),
    CbdloNode: lambda: CbdloNode(ADDR, topologies=Topologies(), rng=random.Random(3)),
    SimpleNode: lambda: SimpleNode(ADDR, view=[ADDR + 1], rng=random.Random(4)),
    TeraNode: lambda: TeraNode(ADDR, view=[ADDR + 1], rng=random.Random(5), apt=Apt(10)),
    RingNode: lambda: RingNode(ADDR),
    RingBroker: lambda: RingBroker(ADDR),
    ring_sim._Counting: lambda: ring_sim._Counting(RingNode(ADDR), Counter()),
}
"""One instance of each core class in flowbus."""


def _core_classes() -> list[type]:
    """Every class of flowbus with an ``on_message`` (protocols that only declare one aside)."""
    found: list[type] = []
    for info in pkgutil.walk_packages(flowbus.__path__, "flowbus."):
        if info.name.rpartition(".")[2] == "__main__":  # (runs the command line)
            continue
        module = importlib.import_module(info.name)
        for cls in vars(module).values():
            if (
                inspect.isclass(cls)
                and cls.__module__ == module.__name__
                and callable(getattr(cls, "on_message", None))
                and not cls.__dict__.get("_is_protocol", False)
            ):
                found.append(cls)
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


CORES = _core_classes()


@dataclass(frozen=True, slots=True)
class Stranger:
    """A message no core knows."""

    n: int = 7


def test_the_walk_finds_the_cores() -> None:
    assert {PastryNode, IrbrNode, ScribeNode, ContentRouter, CbdloNode, RingNode} <= set(CORES)


@pytest.mark.parametrize("cls", CORES, ids=lambda c: c.__qualname__)
def test_every_core_is_a_core(cls: type) -> None:
    assert Core in cls.__mro__, f"{cls.__module__}.{cls.__qualname__} does not subclass flowbus.core.Core"
    assert cls in MAKERS, f"add {cls.__qualname__} to MAKERS"
    core = MAKERS[cls]()
    assert type(core) is cls
    for name in ("on_message", "on_messages", "on_timer", "on_send_failed"):
        assert callable(getattr(core, name))


@pytest.mark.parametrize("cls", CORES, ids=lambda c: c.__qualname__)
def test_an_unknown_message_is_a_protocol_error_naming_it_and_the_node(cls: type) -> None:
    core = MAKERS[cls]()
    with pytest.raises(ProtocolError) as info:
        core.on_message(ADDR + 1, Stranger(), 0.0)
    text = str(info.value)
    assert "Stranger" in text and str(ADDR) in text


# ------------------------------------------------------------------- the defaults of Core


class _Minimal(Core):
    """Only what a core must write: ``on_message`` and ``on_timer``."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen: list[tuple[int, Any]] = []

    def on_message(self, src: int, msg: Any, now: float) -> Sequence[Effect]:
        self.seen.append((src, msg))
        return [Deliver("s", msg)]

    def on_timer(self, key: Hashable, now: float) -> Sequence[Effect]:
        return []


def test_the_defaults_take_a_run_one_by_one_and_ignore_a_failed_send() -> None:
    core = _Minimal()
    assert core.on_messages(3, ["a", "b", "c"], 0.0) == [Deliver("s", m) for m in "abc"]
    assert core.seen == [(3, "a"), (3, "b"), (3, "c")]
    assert core.on_send_failed(3, "a", 0.0) == []
    assert not hasattr(core, "__dict__")  # Core adds no fields: a slotted core stays slotted
