"""flowbus.sim: the discrete-event driver of the sans-IO protocol cores.

How it works: :class:`Simulator` (``engine``) keeps a heap of timed events and
hands each to a core; the cores' effects go through a chain of transport layers
(``transport``: latency, loss, crashes, link failures, partitions) and are
counted by :class:`Metrics` (``metrics``). One master seed fixes every random
stream, so a run is reproducible byte for byte. The cores it drives are
:class:`flowbus.core.Core` objects.
"""

from flowbus.sim.engine import EXTERNAL, SimError, Simulator, derive_seed
from flowbus.sim.metrics import DeliveryRecord, Metrics
from flowbus.sim.transport import (
    Chain,
    ConstantLatency,
    CoordinateLatency,
    Crashes,
    Layer,
    LinkFailure,
    Loss,
    Partition,
    TransportError,
    UniformLatency,
)

__all__ = [
    "EXTERNAL",
    "Chain",
    "ConstantLatency",
    "CoordinateLatency",
    "Crashes",
    "DeliveryRecord",
    "Layer",
    "LinkFailure",
    "Loss",
    "Metrics",
    "Partition",
    "SimError",
    "Simulator",
    "TransportError",
    "UniformLatency",
    "derive_seed",
]
