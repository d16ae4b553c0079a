"""A broker process: a routing core on real sockets, with clients and a SQLite store.

How it works:

* **One core, one loop.** A routing core (:mod:`flowbus.broker.overlays`: by default the
  :class:`~flowbus.routing.ring_broker.RingBroker`, chordal ring membership, backups,
  failure repair, covering-based routing and custody) runs under the
  :class:`~flowbus.net.runtime.Runtime`, the asyncio driver of the same effects the
  simulator carries out. Peers and clients share the listening port; a client's first
  frame is ``Hello`` (:mod:`flowbus.client.protocol`). The broker's address in the ring is
  its IPv4 address and port (:func:`~flowbus.net.runtime.addr_of`): those it listens on, or
  those it *advertises* (``advertise``, ``--advertise HOST:PORT``), where something else
  listens and forwards to it (a proxy, a NAT's port): peers and clients are then told, and
  dial, the advertised address only (:class:`~flowbus.client.protocol.Welcome`).
* **The parts**, each with one concern, built once the socket is bound and the core and
  store exist (:meth:`Broker.start`), so none is ever half made:

  - :mod:`~flowbus.broker.sessions`: the client connections, and what each message does;
  - :mod:`~flowbus.broker.ledger`: publishes, from ``Publish`` to ``PubAck``, each once,
    with the per-publisher mark in SQLite that survives a restart;
  - :mod:`~flowbus.broker.queues`: the subscriptions served here and their queues (flow
    control, spilling to SQLite, acknowledgements, takeover, catch-up with collapse rule sets);
  - :mod:`~flowbus.broker.adverts`: advertisements;
  - :mod:`~flowbus.broker.flows`: the flows deployed on the network (deploy, undeploy, list,
    kept in SQLite);
  - :mod:`~flowbus.broker.spaces`: the spaces' schemas, the routing filter that keeps them
    apart, the collapse rule sets bound to them;
  - :mod:`~flowbus.broker.ringlog`: the log's line for each change of the ring;
  - :mod:`~flowbus.broker.acl` and :mod:`~flowbus.broker.links`: who may publish and
    subscribe where, and the spaces whose events cross only mutual-TLS links
    (docs/security.md; with ``tls``, the runtime serves and dials in TLS);
    :mod:`~flowbus.broker.reload`: the rights read again from the config file while it
    runs (:meth:`Broker.reload_acl`: ``SIGHUP``, or a client's ``ReloadAcl``);
  - :mod:`~flowbus.broker.store`: the SQLite database;
  - :mod:`~flowbus.broker.console`: the web console and ``/metrics``, if started with
    ``http`` (``--http HOST:PORT``), in the same event loop, and STOMP over WebSocket at its
    ``/stomp`` (served by the STOMP door, a listener's or one of its own);
  - :mod:`~flowbus.broker.stomp`: a STOMP listener, if started with ``stomp`` (``--stomp
    HOST:PORT`` or the config's ``stomp``): its connections are sessions like the
    native clients' (in TLS with the broker's certificate when it has ``tls``).

  The runtime calls three of them: the core's deliveries go to the queues, a client
  connection to the sessions, and after each step of the core the broker hands what the
  step left to the queues (spilled events), the ledger (settled publishes) and the ring log.
* **Durability.** Durable subscriptions, spilled queues and publisher sequence numbers are
  in SQLite (:mod:`flowbus.broker.store`). A broker restarted on its data directory serves
  its durable subscriptions again once it has joined the ring (:meth:`Broker.joined`).
* **A full disk** (:class:`~flowbus.errors.StoreFull`). The parts keep what the store could
  not take in memory (the queues' spills, in custody, up to their limit; the ledger's
  marks) and the broker tries them again every ``RETRY_EVERY`` until nothing waits. Its log
  has one warning when the store starts failing and one when it has caught up;
  :meth:`Broker.stats` has ``store_full`` and ``store_refused`` (deliveries refused meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowbus.broker.acl import Acl
from flowbus.broker.adapt import AdaptLog
from flowbus.broker.adverts import Adverts
from flowbus.broker.config import DEFAULT, BrokerConfig, parse_address
from flowbus.broker.fence import Fence
from flowbus.broker.flows import BrokerFlows
from flowbus.broker.handover import Finder, Rejoin
from flowbus.broker.ledger import Ledger
from flowbus.broker.links import SecureLinks
from flowbus.broker.overlays import BrokerCore, address_text, check_overlay, new_core
from flowbus.broker.queues import HOLD_LIMIT, RETRY_EVERY, Queues
from flowbus.broker.reload import AclReload
from flowbus.broker.ringlog import RingLog
from flowbus.broker.sessions import Sessions
from flowbus.broker.spaces import Spaces
from flowbus.broker.store import Store
from flowbus.client import protocol as p
from flowbus.core import Ended, Outcome, PublishRefused, Settled
from flowbus.errors import AccessError, ConfigError, ExternalError, FlowbusError, StoreFull
from flowbus.flow.deploy import Deployment
from flowbus.matching.matcher import warm_up
from flowbus.net.admission import Admission
from flowbus.net.runtime import Directory, Runtime, addr_of
from flowbus.net.tls import BrokerTls
from flowbus.net.trace import Trace
from flowbus.overlay.ring_messages import Peer
from flowbus.routing.ring_broker import RingBroker
from flowbus.routing.ring_handover import Backlog, BacklogAck, HeldHere, WhereIs

if TYPE_CHECKING:
    from flowbus.broker.console import Console
    from flowbus.broker.stomp import StompDoor

__all__ = ["Broker", "parse_address", "parse_advertised"]

log = logging.getLogger("flowbus.broker")

WATCH_EVERY = 0.25
"""Seconds between two looks at the ring lease (:mod:`flowbus.broker.fence`)."""

NOBODY_AFTER = 10.0
NOBODY_HEARTBEATS = 10
"""A broker back as a new member serves again a subscription of its store that no other
broker has served for max(NOBODY_AFTER, NOBODY_HEARTBEATS heartbeats) seconds (a taker that
died is taken over within a few heartbeats: :mod:`flowbus.broker.handover`)."""

LINK_TIMEOUT_MIN = 2.0
LINK_TIMEOUT_HEARTBEATS = 3
"""A link to a peer broker is given up after max(LINK_TIMEOUT_MIN, LINK_TIMEOUT_HEARTBEATS
heartbeats) seconds without an acknowledgement of what was written (or to open it): a lease
lasts three heartbeats, so after a heal the ring talks again before it would find anyone
dead (see :mod:`flowbus.net.runtime`)."""


def parse_advertised(text: str) -> tuple[str, int]:
    """An advertised ``"host:port"`` -> ``(ip, port)``: a host that resolves to an IPv4
    address and a port 1..65535 (peers dial it), or a :class:`ConfigError` naming
    ``--advertise``."""
    try:
        host, port = parse_address(text)
    except ConfigError as e:
        raise ConfigError(f"--advertise: {e}") from None
    if port == 0:
        raise ConfigError(f"--advertise: a port 1..65535 (peers dial it), got {text!r}")
    try:
        ip = socket.gethostbyname(host)
    except OSError as e:
        raise ConfigError(f"--advertise: cannot resolve host {host!r}: {e}") from None
    return ip, port


def _admission(config: BrokerConfig, tls: BrokerTls | None) -> Admission:
    """How the broker's port admits connections: its TLS, the config's ``security``."""
    sec = config.security
    return Admission(
        tls=tls.server if tls else None,
        peer_tls=tls.peer if tls else None,
        plain_peers=sec["plain_peers"],
        handshake_timeout=sec["handshake_timeout"],
        per_address=sec["per_address"],
    )


class Broker:
    """A broker listening on ``host:port``, serving clients and peers with its parts (see
    the module note). Made by :meth:`start`; stopped by :meth:`close`."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        overlay: str,
        config: BrokerConfig,
        core: BrokerCore,
        ring: RingBroker | None,
        runtime: Runtime,
        store: Store,
        advertised: tuple[str, int] | None = None,
    ) -> None:
        """The broker of ``core`` (``ring``: the same core if it is the chordal ring's),
        driven by ``runtime`` (not started yet: the broker sets its hooks), keeping its state
        in ``store``; listening on ``host:port``, known as ``advertised`` if given (else as
        ``host:port``)."""
        self.host = host
        self.port = port
        self.advertised = advertised
        self.addr = runtime.addr
        self.overlay = overlay
        self.config = config
        self.core = core
        self.ring_core = ring  # (flows, takeovers, fencing, the ring's pages: the ring's only)
        self.runtime = runtime
        self.store = store
        self.links = (
            SecureLinks(ring, config, runtime.secure, known=runtime.link_known, apply=runtime.apply)
            if ring is not None
            else None
        )
        if self.links is not None:
            runtime.link_filter = self.links.filter
        self.spaces = Spaces(config, ring.flows if ring is not None else None)
        self.flows = BrokerFlows(
            core=ring, overlay=overlay, apply=runtime.apply, store=store, own_spaces=list(config.spaces)
        )
        self.adverts = Adverts(core=core, apply=runtime.apply, spaces=self.spaces, enabled=config.advertising)
        self.ledger = Ledger(
            core=core,
            apply=runtime.apply,
            store=store,
            spaces=self.spaces,
            adverts=self.adverts,
            admit=self._admit,
        )
        self.fence = Fence(
            serving=ring.serving if ring is not None else None,
            address=self.address,
            close_all=self._close_clients,
        )
        self.queues = Queues(
            core=core,
            ring=ring,
            apply=runtime.apply,
            store=store,
            spaces=self.spaces,
            config=config,
            name=f"broker {self.address}",
        )
        self.queues.fence = self.fence
        self.sessions = Sessions(
            welcome=self._welcome,
            ledger=self.ledger,
            queues=self.queues,
            adverts=self.adverts,
            flows=self.flows,
            acl=config.acl,
            step_interval=config.step_interval,
            keepalive=config.keepalive,
            fence=self.fence,
        )
        self.ring_log = RingLog(ring.ring, self.address, log) if ring is not None else None
        self.adapt = AdaptLog(ring, self.address, log) if ring is not None else None
        self.acl_reload = AclReload(
            path=None, sessions=self.sessions, queues=self.queues, adverts=self.adverts, install=self._install
        )
        self.sessions.reload = self._reload_reply
        self._documents: list[Deployment] = []  # flows to deploy once joined
        self._store_failing: StoreFull | None = None  # (the store's failure, as logged)
        self._store_retry: asyncio.TimerHandle | None = None
        self.console: Console | None = None  # the web console, if started with http
        self.stomp: StompDoor | None = None  # the STOMP listener, if started with stomp
        self.rejoin: Rejoin | None = None  # (coming back as a new ring member: broker/handover.py)
        self.finder = (  # (a durable subscription is opened afresh only if no other broker serves it)
            Finder(core=ring, apply=runtime.apply, pending=self._pending) if ring is not None else None
        )
        self.sessions.finder = self.finder
        self.stepped_down = asyncio.Event()  # the ring found this broker dead: start it again
        self._member: tuple[int, tuple[str, ...]] | None = None  # the membership last saved
        self._member_seen = -1  # (the ring log's changes when it was)
        self._watch: asyncio.TimerHandle | None = None  # (the lease, looked at every WATCH_EVERY)
        self._outcomes: list[Outcome] = []  # what the core settled, refused, ended in this step
        runtime.on_deliver = self._deliver
        runtime.on_deliver_all = self.queues.on_deliver_all
        runtime.on_outcome = lambda _addr, outcome: self._outcomes.append(outcome)
        runtime.on_client = self.sessions.serve
        runtime.after_step = self._after_step

    @classmethod
    async def start(
        cls,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        join: tuple[str, ...] | list[str] = (),
        data: Path | str | None = None,
        config: BrokerConfig = DEFAULT,
        overlay: str = "chordal-ring",
        flows: tuple[str | Path, ...] | list[str | Path] = (),
        tls: BrokerTls | None = None,
        http: str | None = None,
        config_file: Path | str | None = None,
        advertise: str | None = None,
        stomp: str | None = None,
    ) -> Broker:
        """A broker listening on ``host:port`` (0: any free port), joining the ring through
        ``join`` (addresses ``"host:port"``; none: a new ring), keeping its state in ``data``
        (a directory; None: in memory, for tests and trials), deploying the flow spec files
        ``flows`` once it has joined (a flow deployed already with the same version is left
        as it is), serving and dialing its peers in TLS with ``tls`` (mutual TLS between
        brokers), serving the web console on ``http`` (``"host:port"``; None: no console),
        reading its rights again from ``config_file`` on :meth:`reload_acl` (the file
        ``config`` was read from), known in the ring and to clients as ``advertise``
        (``"host:port"`` where a forwarder to ``host:port`` listens; None: as ``host:port``),
        serving STOMP clients on ``stomp`` (``"host:port"``, port 0: any free port; None: the
        config's ``stomp``, if any). Wait for :meth:`joined` before counting on it."""
        peers = [parse_address(j) for j in join]
        advertised = parse_advertised(advertise) if advertise is not None else None
        console_at = parse_address(http) if http is not None else None
        stomp = stomp if stomp is not None else config.stomp
        if stomp is not None:
            parse_address(stomp)  # (a bad address: refused before anything starts)
        check_overlay(overlay, config)
        if any(c != "normal" for c in config.classes.values()) and overlay != "chordal-ring":
            raise ConfigError(
                f"classes: the {overlay} overlay has no link classes (use the chordal-ring overlay)"
            )
        if flows and overlay != "chordal-ring":
            raise ConfigError(f"--flow: the {overlay} overlay runs no flows (use the chordal-ring overlay)")
        documents = [Deployment.from_file(f) for f in flows]  # (a bad spec: refused before anything starts)
        # compiled (or loaded from numba's cache) before serving: compiling under load would
        # stall this broker for seconds, and its neighbours would take it for dead
        took = await asyncio.to_thread(warm_up)
        log.info("matching kernels ready in %.1f s", took)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            port = sock.getsockname()[1]
            addr = addr_of(*(advertised or (host, port)))
            core, ring = new_core(overlay, addr, config)
            if data is not None:
                Path(data).mkdir(parents=True, exist_ok=True)
            store = Store(Path(data) / "broker.sqlite" if data is not None else ":memory:", sync=config.sync)
        except BaseException:
            sock.close()
            raise
        runtime = Runtime(
            addr,
            core,
            Directory(),
            host=host,
            port=port,
            client_hello=p.Hello,
            admission=_admission(config, tls),
            link_timeout=max(LINK_TIMEOUT_MIN, LINK_TIMEOUT_HEARTBEATS * config.heartbeat),
        )
        runtime.trace = Trace.from_env(address_text)  # (FLOWBUS_TRACE: the messages, for diagnosis)
        broker = cls(
            host=host,
            port=port,
            overlay=overlay,
            config=config,
            core=core,
            ring=ring,
            runtime=runtime,
            store=store,
            advertised=advertised,
        )
        broker._documents = documents
        broker.acl_reload.path = Path(config_file) if config_file is not None else None
        try:
            broker.flows.restore()
            await runtime.start(sock=sock)
            broker._enter([addr_of(h, n) for h, n in peers])
            broker._watch_lease()
        except BaseException:
            sock.close()
            await broker.close()
            raise
        from flowbus.broker.stomp import StompDoor

        if stomp is not None:
            try:
                broker.stomp = await StompDoor.start(
                    broker.sessions, stomp, admission=runtime.admission, heartbeat=config.keepalive
                )
            except BaseException:
                await broker.close()
                raise
        if console_at is not None:
            from flowbus.broker.console import Console  # (its libraries: only for a console)

            # (the console's WebSockets are STOMP connections of the listener's door, or of
            # one with no port of its own when the broker has no listener)
            door = broker.stomp or StompDoor(broker.sessions, runtime.admission, heartbeat=config.keepalive)
            try:
                broker.console = await Console.start(broker, *console_at, stomp=door)
            except BaseException:
                await broker.close()
                raise
        return broker

    @property
    def address(self) -> str:
        """``"host:port"`` as the ring and clients know it (the advertised one, if any)."""
        host, port = self.advertised or (self.host, self.port)
        return f"{host}:{port}"

    async def joined(self, *, timeout: float = 10.0) -> None:
        """Wait until this broker is a member of the ring; then restore durable subscriptions."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not self.core.joined:
            if loop.time() > end:
                raise ExternalError(f"broker {self.address}: could not join the ring in {timeout} s")
            await asyncio.sleep(0.02)
        for d in self._documents:
            self.flows.deploy(d)
        self._documents = []
        self.queues.restore(skip=self.rejoin.pending if self.rejoin is not None else set())

    def _enter(self, peers: list[int]) -> None:
        """Join the ring through ``peers`` (none: start a new one); first, if the store says
        this broker was a ring member, come back as a new one (broker/handover.py)."""
        core, ring, runtime = self.core, self.ring_core, self.runtime
        previous = self.store.membership() if ring is not None else None
        window = [addr_of(*parse_address(a)) for a in previous[1]] if previous else []
        candidates = peers or window
        if previous is not None and candidates and ring is not None:
            self.rejoin = Rejoin(
                core=ring,
                store=self.store,
                apply=runtime.apply,
                previous=Peer(previous[0], self.addr),
                candidates=candidates,
                announce_to=sorted({*window, *peers}),
                address=self.address,
                restore=self.queues.restore_one,
                nobody_after=max(NOBODY_AFTER, NOBODY_HEARTBEATS * self.config.heartbeat),
            )
            self.rejoin.start()
            return
        if previous is not None:  # (it was alone: nobody to tell; it serves its store again)
            with contextlib.suppress(FlowbusError):
                self.store.forget_membership()
        runtime.apply(core.join(peers) if peers else core.start())

    def _pending(self) -> set[str]:
        """The subscriptions of the store not handed over yet (coming back as a new member)."""
        return self.rejoin.pending if self.rejoin is not None else set()

    def _watch_lease(self) -> None:
        """Look at the lease now and then (its loss closes the client connections), not only
        when a client or a delivery asks: a client idle behind keepalives would stay on."""
        self.fence.ok()
        self._watch = asyncio.get_running_loop().call_later(WATCH_EVERY, self._watch_lease)

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self.rejoin is not None:
            self.rejoin.cancel()
        if self._store_retry is not None:
            self._store_retry.cancel()
            self._store_retry = None
        if self.console is not None:
            await self.console.close()
        self.queues.close()
        self.sessions.close()
        if self.stomp is not None:
            await self.stomp.close()
        await self.runtime.close()
        if isinstance(self.runtime.trace, Trace):
            self.runtime.trace.close()
        self.store.close()

    def peers(self) -> list[int]:
        return self.core.peer_addrs()

    def stats(self) -> dict[str, Any]:
        core = self.core
        return {
            "address": self.address,
            "overlay": self.overlay,
            "node_id": core.node_id if core.joined else None,
            "peers": [address_text(a) for a in self.peers()],
            "subscriptions": len(self.queues.subs),
            "sessions": len(self.sessions.by_client),
            "published": self.ledger.published,
            "delivered": self.queues.delivered,
            "spilled": self.queues.spilled,
            "in_custody": core.in_custody(),
            "queued_in_memory": self.queues.in_memory(),
            "refused_connections": self.runtime.refused,
            "secure_dropped": self.links.dropped if self.links else 0,
            "serving": self.fence.ok(),  # (the ring's lease: it may serve its clients)
            "store_full": self.store_full() is not None,  # (writes fail, or wait in memory)
            "store_refused": self.queues.refused,  # deliveries refused while the store was full
            "adapt": self.adapt.view() if self.adapt is not None else None,  # (shares, express links)
            "stomp": self.stomp.address if self.stomp is not None else None,  # (its STOMP listener)
        }

    def _admit(self, session: Any, space: str, fields: dict[str, Any]) -> str | None:
        """Why ``session`` may not publish this event (the ledger's ``admit``): no
        ``publish`` right on ``space``, or no secure link on a secure space's route."""
        try:
            self.config.acl.check(session.identity, "publish", space)
        except AccessError as e:
            return str(e)
        return self.links.refusal(space, fields) if self.links is not None else None

    def reload_acl(self) -> dict[str, Any]:
        """Read the rights of the config file again and apply them to the sessions
        (:mod:`flowbus.broker.reload`): what changed. A :class:`ConfigError` if the file is
        missing or not valid: nothing changed, the old rights stay."""
        return self.acl_reload.reload()

    def _install(self, acl: Acl) -> None:
        self.config = self.config.with_(acl=acl)
        self.sessions.acl = acl

    def _reload_reply(self) -> tuple[bool, str | None, Any]:
        """A client's ``ReloadAcl``, answered: (ok, error, what changed)."""
        try:
            return True, None, self.reload_acl()
        except ConfigError as e:
            return False, str(e), None

    def _welcome(self) -> p.Welcome:
        """What a new client session is told: this broker, the others, the spaces."""
        peers = tuple(address_text(a) for a in self.peers())
        return p.Welcome(self.address, peers, self.spaces.listed())

    def _after_step(self) -> None:
        """After each step of the core: the ring's changes to the log, what the step spilled
        to disk, and the publishes it settled acknowledged."""
        if self.ring_log is not None:
            self.ring_log.update()
        if self.adapt is not None:
            self.adapt.update()
        self.queues.after_step()
        self.flows.after_step()
        if self._outcomes:  # (after the step's spills: a publish is acknowledged once settled)
            outcomes, self._outcomes = self._outcomes, []
            for r in outcomes:
                if type(r) is Ended:
                    self.queues.ended(list(r.subs))
            for r in outcomes:
                if type(r) is Settled:
                    self.ledger.settled(list(r.ids), self.sessions.by_client, tell=self.fence.ok())
            for r in outcomes:
                if type(r) is PublishRefused:  # (secure spaces: refused on the way)
                    self.ledger.refused(list(r.items), self.sessions.by_client)
        if self.links is not None:
            self.links.after_step()
        self._store_health()
        if self.ring_log is not None and self.ring_log.changes != self._member_seen:
            self._save_membership()

    def _save_membership(self) -> None:
        """The ring member this broker is, kept in the store (a restart announces it)."""
        core = self.ring_core
        assert core is not None and self.ring_log is not None
        ring = core.ring
        if not ring.joined or ring.declared_dead is not None:
            return
        member = (ring.me.id, tuple(address_text(p.addr) for p in ring.window))
        if member != self._member:
            try:
                self.store.save_membership(*member)
            except FlowbusError:  # (a full store: kept at the next change)
                return
            self._member = member
        self._member_seen = self.ring_log.changes

    # -- what the ring tells the broker itself (Deliver(("ring", ...)), not for a subscription)

    def _deliver(self, addr: int, sub: Hashable, event: Any) -> None:
        if type(sub) is tuple and sub[:1] == ("ring",):
            self._ring_notice(sub[1], event)
        else:
            self.queues.on_deliver(addr, sub, event)

    def _ring_notice(self, kind: Hashable, what: Any) -> None:
        if kind == "dead":  # (found dead while alive: paused, or cut off)
            self.queues.close()  # (nothing more to disk: what is in custody here is re-sent
            self.fence.step_down()  # by its senders to the taker)
            self.stepped_down.set()
        elif kind == "buried" and self.rejoin is not None:
            self.rejoin.buried(what)
        elif kind == "handover":
            src, msg = what
            if isinstance(msg, Backlog):
                core = self.ring_core
                assert core is not None  # (only the ring's brokers hand over)

                def answer(taken: bool = True) -> None:  # (once the ring's backups know this disk has it)
                    if not self.queues.closed:
                        self.runtime.apply(core.hand_over(src, BacklogAck(msg.sub, msg.part, taken)))

                try:
                    here = self.queues.take_backlog(msg, taken=answer)
                except FlowbusError as e:  # (not taken: the sender tries again, then asks anew)
                    log.warning("broker %s: backlog of %r not taken: %s", self.address, msg.sub, e)
                    return
                if here is None:  # (not served here: nothing taken, told at once)
                    answer(False)
                return
            if isinstance(msg, HeldHere) and self.finder is not None:
                self.finder.held(src, msg)
            elif isinstance(msg, WhereIs) and self.finder is not None:
                self.finder.walked(msg)
            if self.rejoin is None:
                return
            if isinstance(msg, BacklogAck):
                self.rejoin.acked(msg)
            elif isinstance(msg, HeldHere):
                self.rejoin.held(src, msg)
            elif isinstance(msg, WhereIs):
                self.rejoin.walked(msg)

    def _close_clients(self, reason: str) -> None:
        self.sessions.close_clients(reason)

    def store_full(self) -> StoreFull | None:
        """Why the store fails: what the parts' writes wait for, or the last write's failure."""
        return self.queues.full or self.ledger.full or self.store.full

    def _store_health(self) -> None:
        """After a step or a retry: one warning when the store starts failing, one when it
        takes writes again and nothing waits for it; tried again every ``RETRY_EVERY`` meanwhile."""
        full = self.store_full()
        if full is not None and self._store_failing is None:
            self._store_failing = full
            log.warning(
                "broker %s: %s; what is for the disk waits in memory, in custody (at most %d "
                "deliveries a subscription, then refused), tried again every %.1f s",
                self.address,
                full,
                HOLD_LIMIT * self.config.memory,
                RETRY_EVERY,
            )
        elif full is None and self._store_failing is not None:
            self._store_failing = None
            log.warning(
                "broker %s: its store %s takes writes again; what waited is written "
                "(%d deliveries refused so far)",
                self.address,
                self.store.path,
                self.queues.refused,
            )
        if full is not None and self._store_retry is None and not self.queues.closed:
            self._store_retry = asyncio.get_running_loop().call_later(RETRY_EVERY, self._retry_store)

    def _retry_store(self) -> None:
        """What waits for the store, tried again (the queues' and the ledger's)."""
        self._store_retry = None
        self.queues.retry()
        self.ledger.retry()
        self._store_health()
