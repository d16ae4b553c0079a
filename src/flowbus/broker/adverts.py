"""Advertisements: what a broker's publishers say they will publish.

How it works (advertise, subscribe, publish: the content-based routing of Jacobsen's
publish/subscribe lecture, slide 20; with ``advertising: true`` in the broker's
configuration; the ring broker's core does the routing, :mod:`flowbus.routing.cbr`):

* A client advertises a filter over a space (``Advertise``). Its routing filter
  (``__space = s & (f)``, :mod:`flowbus.broker.spaces`) goes to the core under the key
  ``"<client>/<name>"``: subscriptions are then forwarded only towards brokers with an
  overlapping advertisement.
* A publish that none of its client's advertisements matches is refused
  (:meth:`Adverts.admits`; the test is the compiled routing filter, kept per client).
* The same advertisement again (a client back after a lost connection advertises anew)
  is accepted if its filter is the same; another filter under the same name is refused.
* ``Unadvertise`` and ``Bye`` withdraw them; a lost connection keeps them (the client
  advertises again when it is back).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from flowbus.broker.overlays import BrokerCore
from flowbus.broker.spaces import Spaces
from flowbus.client import protocol as p
from flowbus.core import Effect
from flowbus.routing.memo import compiled

if TYPE_CHECKING:
    from flowbus.broker.outbox import Outbox

__all__ = ["Adverts"]


class Adverts:
    """The advertisements made at this broker (see the module note); ``enabled`` is the
    configuration's ``advertising``."""

    def __init__(
        self,
        *,
        core: BrokerCore,
        apply: Callable[[Sequence[Effect]], None],
        spaces: Spaces,
        enabled: bool,
    ) -> None:
        self.core = core
        self.apply = apply
        self.spaces = spaces
        self.enabled = enabled
        self._filters: dict[str, str] = {}  # advertisement key ("client/name") -> its filter text
        self._tests: dict[str, dict[str, Any]] = {}  # client -> advertisement key -> its test

    def advertise(self, session: Outbox, msg: p.Advertise) -> tuple[bool, str | None]:
        """``msg`` from ``session``'s client: ``(True, None)`` or ``(False, why not)``."""
        if not self.enabled:
            return False, "advertising is off in this broker's configuration"
        filt, error = self.spaces.check_filter(msg.space, msg.filter)
        if filt is None:
            return False, error
        key = f"{session.client}/{msg.adv_id}"
        text = filt.to_text()
        routing = self.spaces.routing_filter(msg.space, filt)
        known = self._filters.get(key)
        if known is not None:  # (again, after a reconnect: the same one is fine)
            if known != text:
                return False, f"advertisement {msg.adv_id!r} exists with another filter"
            self._tests.setdefault(session.client, {})[key] = compiled(routing)
            return True, None
        self._filters[key] = text
        self._tests.setdefault(session.client, {})[key] = compiled(routing)
        self.apply(self.core.advertise(key, routing))
        return True, None

    def unadvertise(self, session: Outbox, adv_id: str) -> tuple[bool, str | None]:
        key = f"{session.client}/{adv_id}"
        if key not in self._filters:
            return False, f"no advertisement {adv_id!r} of this client here"
        self._withdraw(session.client, key)
        return True, None

    def withdraw_all(self, session: Outbox) -> None:
        """Withdraw every advertisement ``session``'s client made (it said ``Bye``)."""
        for key in list(self._tests.get(session.client, ())):
            self._withdraw(session.client, key)

    def admits(self, session: Outbox, fields: dict[str, Any]) -> bool:
        """Whether an advertisement of ``session``'s client matches an event (its routed fields)."""
        return any(test(fields) for test in self._tests.get(session.client, {}).values())

    def _withdraw(self, client: str, key: str) -> None:
        tests = self._tests.get(client)
        if tests is not None:
            tests.pop(key, None)
            if not tests:
                del self._tests[client]
        if self._filters.pop(key, None) is not None:
            self.apply(self.core.unadvertise(key))
