"""The random flows of the Spark equivalence tests (tests/spark/flowgen.py) as spec documents,
so that they can be deployed on brokers."""

from __future__ import annotations

import random
from typing import Any

from tests.spark.flowgen import CODE, component

from flowbus.flow.deploy import Deployment


class SpecRecorder:
    """Takes the :class:`~flowbus.flow.FlowBuilder` calls ``component`` makes, as a spec."""

    def __init__(self, name: str) -> None:
        self.spec: dict[str, Any] = {"name": name, "lookups": {"code": dict(CODE)}, "spaces": {},
                                     "rulesets": {}, "arcs": []}  # fmt: skip

    def source(self, name: str, schema: dict[str, str]) -> None:
        self.spec["spaces"][name] = {"kind": "source", "schema": dict(schema)}

    def sink(self, name: str, schema: dict[str, str]) -> None:
        self.spec["spaces"][name] = {"kind": "sink", "schema": dict(schema)}

    def events(
        self, name: str, schema: dict[str, str], *, publish: bool = False, subscribe: bool = False
    ) -> None:
        self.spec["spaces"][name] = {"kind": "events", "schema": dict(schema), "publish": publish,
                                     "subscribe": subscribe}  # fmt: skip

    def state(self, name: str, schema: dict[str, str], *, key: str, initial: dict[str, Any]) -> None:
        self.spec["spaces"][name] = {
            "kind": "state",
            "schema": dict(schema),
            "key": [key],
            "initial": initial,
        }

    def rules(self, name: str, *, key: dict[str, str], rules: list[dict[str, Any]]) -> None:
        self.spec["rulesets"][name] = {"key": key, "rules": rules}

    def _arc(self, kind: str, name: str, src: str, dst: str, value: Any) -> None:
        self.spec["arcs"].append({"name": name, "from": src, "to": dst, kind: value})

    def select(self, name: str, src: str, dst: str, text: str) -> None:
        self._arc("select", name, src, dst, text)

    def transform(self, name: str, src: str, dst: str, outputs: dict[str, str]) -> None:
        self._arc("transform", name, src, dst, dict(outputs))

    def collapse(self, name: str, src: str, dst: str, rules: Any) -> None:
        self._arc("collapse", name, src, dst, rules)

    def expand(self, name: str, src: str, dst: str, rules: Any) -> None:
        self._arc("expand", name, src, dst, rules)


def random_deployment(seed: int, components: int = 3) -> Deployment:
    """The random flow of ``seed`` (tests/spark/flowgen.py's generator) as a deployment."""
    rng = random.Random(seed)
    rec = SpecRecorder(f"random{seed}")
    for c in range(components):
        component(rng, rec, f"c{c}_")  # type: ignore[arg-type]
    return Deployment.from_spec(rec.spec)
