"""A broker's flows: deploying, withdrawing and listing them for clients, and keeping the
registry in SQLite.

How it works: the registry itself is the routing core's (:mod:`flowbus.routing.flows`:
flooded on the broker tree, the same at every broker). This part answers the client
requests (``Deploy``, ``Undeploy``, ``ListFlows``), deploys the ``--flow`` files a broker is
started with once it has joined the ring, and after each step of the core writes the
registry to the store when it changed, so that a restarted broker knows every flow before
its neighbours sync it (:meth:`BrokerFlows.restore`); if the store is full, at a later step.
Only the chordal ring runs flows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from flowbus.broker.store import Store
from flowbus.core import Effect
from flowbus.errors import FlowbusError, StoreFull, UserError
from flowbus.flow.deploy import Deployment
from flowbus.net.codec import decode, encode
from flowbus.routing.flows import DeployRecord
from flowbus.routing.ring_broker import RingBroker

__all__ = ["BrokerFlows", "describe"]


def describe(rec: DeployRecord, d: Deployment) -> dict[str, Any]:
    """A deployed flow as ``flowbus flow ls`` shows it (plain data)."""
    return {
        "name": rec.name,
        "version": rec.version,
        "owners": len(rec.owners),
        "spaces": [
            {
                "name": s.name,
                "kind": s.kind,
                "publishable": s.publishable,
                "subscribable": s.subscribable,
                "derived": s.derived,
                "schema": s.schema.to_dict(),
            }
            for s in d.spaces.values()
        ],
    }


class BrokerFlows:
    """The flows of a broker process (see the module note); ``core`` is None for an overlay
    that runs no flows (every request is refused, naming the overlay)."""

    def __init__(
        self,
        *,
        core: RingBroker | None,
        overlay: str,
        apply: Callable[[Sequence[Effect]], None],
        store: Store,
        own_spaces: Sequence[str],
    ) -> None:
        self.core = core
        self.overlay = overlay
        self.apply = apply
        self.store = store
        self.own_spaces = tuple(own_spaces)
        self._saved: dict[str, DeployRecord] = {}

    def _ring(self) -> RingBroker:
        if self.core is None:
            raise UserError(f"the {self.overlay} overlay runs no flows (use the chordal-ring overlay)")
        return self.core

    def deploy(self, d: Deployment) -> dict[str, Any]:
        """Deploy flow ``d`` on the network (a UserError naming what is wrong)."""
        core = self._ring()
        rec, effects = core.deploy(d, nonce=time.time_ns() & 0x7FFFFFFF, taken=self.own_spaces)
        self.apply(effects)
        return describe(rec, core.flows.deployments[rec.name])

    def undeploy(self, name: str) -> dict[str, Any]:
        core = self._ring()
        rec = core.flows.records.get(name)
        self.apply(core.undeploy(name))
        assert rec is not None  # (undeploy refused an unknown name)
        return {"name": name, "version": rec.version}

    def list(self) -> list[dict[str, Any]]:
        if self.core is None:
            return []
        flows = self.core.flows
        return [describe(rec, flows.deployments[name]) for name, rec in sorted(flows.records.items())]

    def answer(self, what: Callable[[], Any]) -> tuple[bool, str | None, Any]:
        """A client request's reply fields: ``(ok, error, data)``."""
        try:
            return True, None, what()
        except FlowbusError as e:
            return False, str(e), None

    def restore(self) -> None:
        """The flows the store knows, known again (a restart: no partitions are made)."""
        if self.core is None:
            return
        for blob in self.store.flows():
            rec = decode(blob)
            if isinstance(rec, DeployRecord):
                self.apply(self.core.restore_flow(rec))
        self._saved = dict(self.core.flows.records)

    def after_step(self) -> None:
        """The registry to the store, if it changed (a full store: at a later step)."""
        if self.core is None:
            return
        records = self.core.flows.records
        if records != self._saved:
            try:
                self.store.save_flows({name: encode(rec) for name, rec in records.items()})
            except StoreFull:
                return
            self._saved = dict(records)
