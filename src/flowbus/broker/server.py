"""A broker process: the ring's routing core on real sockets, with clients and a SQLite store.

How it works:

* **One core, one loop.** A :class:`~flowbus.routing.ring_broker.RingBroker` (chordal
  ring membership, backups, failure repair, covering-based routing, custody) runs under
  the :class:`~flowbus.net.runtime.Runtime`, the asyncio driver of the same effects the
  simulator carries out. Peers and clients share the listening port; a client's first
  frame is ``Hello`` (:mod:`flowbus.client.protocol`). The broker's address in the ring
  is its IPv4 address and port (:func:`~flowbus.net.runtime.addr_of`). With
  ``overlay="pastry-irbr"`` the core is IRBR over Pastry instead
  (:mod:`flowbus.routing.irbr_broker`: no custody, no takeover).
* **Spaces.** Each event carries its space in the field ``__space``, and each
  subscription's filter is ``__space = "<space>" & (<filter>)``: one routing table serves
  every space. An event that does not fit its space's schema is refused (``Nack``).
* **Publishing.** A client's publishes go to the core in batches (one per frame). The core
  keeps each in custody until every broker and local subscription it went to is done with
  it; then the broker sends ``PubAck``. A publish is thus acknowledged once it is where
  every matching subscriber will get it: with its subscriber's client, or in the queue on
  that subscriber's broker's disk. A re-sent publish (same ``(client, pseq)``) the broker
  has acknowledged already is acknowledged again and not published twice. SQLite keeps,
  per publisher, the highest ``pseq`` up to which every publish was settled (or refused):
  after a restart, a re-send at or below it is acknowledged, one above it (accepted, maybe
  not settled when the broker died) is published again (its id de-duplicates downstream).
* **Delivering, flow control.** Each subscription served here has one ordered queue.
  - At most ``window`` deliveries are in flight to its client, unacknowledged. The client
    acknowledges a prefix (``Ack``), and the core is told the deliveries are settled.
  - At most ``memory`` deliveries (those in flight included) are held in memory, still in
    the sender's custody. Beyond that, events are *spilled* to the SQLite queue and settled
    at once: the disk has them.
  - A subscription with no client attached (a durable one whose client is away, one taken
    over from a dead broker) queues on disk straight away.
  - So a slow or absent subscriber costs this broker bounded memory, and holds a
    publisher's acknowledgements up for at most ``memory`` events (keep it below the
    clients' publish window): the rest wait on disk. Once anything is on disk, later
    events go there too, until the disk part is drained, so the order is kept.
* **Resuming.** A client whose broker died reconnects to another one and re-attaches its
  subscriptions (``resume``). The broker that took the dead one's state over serves them:
  the core re-sends what the dead broker had not finished (custody), and the client drops
  what it had seen (by event id). A subscription that names a collapse rule set gets,
  instead of its backlog, the shortest sequence of events equivalent to it
  (:mod:`flowbus.broker.interpret`).
* **Durability.** Durable subscriptions, spilled queues and publisher sequence numbers are
  in SQLite (:mod:`flowbus.broker.store`). A broker restarted on its data directory serves
  its durable subscriptions again.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import socket
from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgpack  # type: ignore[import-untyped]

from flowbus.broker.config import DEFAULT, BrokerConfig
from flowbus.broker.interpret import Interpretation, Interpretations
from flowbus.broker.store import Store
from flowbus.client import protocol as p
from flowbus.core import Effect
from flowbus.errors import FlowbusError, SchemaError
from flowbus.filters import Filter, parse
from flowbus.filters.ast import Conjunction, Op, Predicate
from flowbus.matching.matcher import warm_up
from flowbus.net.codec import FrameDecoder, decode, encode, frame
from flowbus.net.runtime import Directory, Runtime, addr_of, where_of
from flowbus.overlay.chordal_ring import RingNode
from flowbus.routing.irbr_broker import IrbrBroker
from flowbus.routing.memo import compiled
from flowbus.routing.ring_broker import EVENT_ID, RingBroker

__all__ = ["OVERLAYS", "Broker", "BrokerCore", "parse_address"]

OVERLAYS = ("chordal-ring", "pastry-irbr")


class BrokerCore(Protocol):
    """What a broker process needs of its routing core (a sans-IO core: ``RingBroker``,
    ``IrbrBroker``)."""

    subs: Any
    settled: list[Any]

    @property
    def joined(self) -> bool: ...
    @property
    def node_id(self) -> int: ...
    def peer_addrs(self) -> list[int]: ...
    def in_custody(self) -> int: ...
    def meta_of(self, sub_id: Hashable) -> Any: ...
    def start(self) -> list[Effect]: ...
    def join(self, candidates: Sequence[int]) -> list[Effect]: ...
    def subscribe(self, sub_id: Hashable, filt: Filter, *, meta: Any = None) -> list[Effect]: ...
    def unsubscribe(self, sub_id: Hashable) -> list[Effect]: ...
    def advertise(self, adv_id: Hashable, filt: Filter) -> list[Effect]: ...
    def unadvertise(self, adv_id: Hashable) -> list[Effect]: ...
    def publish_batch(self, items: Sequence[tuple[Hashable, Mapping[str, Any]]]) -> list[Effect]: ...
    def settle(self, sub_id: Hashable, event_id: Hashable) -> list[Effect]: ...
    def settle_many(self, pairs: Iterable[tuple[Hashable, Hashable]]) -> list[Effect]: ...
    def on_message(self, src: int, msg: Any, now: float) -> list[Effect]: ...
    def on_timer(self, key: Hashable, now: float) -> list[Effect]: ...
    def on_send_failed(self, dst: int, msg: Any, now: float) -> list[Effect]: ...


log = logging.getLogger("flowbus.broker")


SPACE = "__space"
"""The field that carries an event's space between brokers."""

_HIDDEN = (EVENT_ID, SPACE)


def parse_address(text: str) -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)``, or a :class:`FlowbusError` naming the problem."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise FlowbusError(f"an address is HOST:PORT, got {text!r}")
    return host, int(port)


def _text(addr: int) -> str:
    where = where_of(addr)
    return f"{where[0]}:{where[1]}" if where else str(addr)


# ------------------------------------------------------------------------------ subscriptions

Entry = tuple[Any, dict[str, Any], int | None]
"""A queued delivery: (event id, event, where it is kept: None = in custody, settled when the
client acknowledges it; n > 0 = SQLite queue position; 0 = nowhere, a catch-up event)."""


@dataclass(eq=False)
class _Sub:
    sub_id: str
    client: str
    space: str
    filter: str
    durable: bool
    collapse: str | None
    session: _Session | None = None
    pending: deque[Entry] = field(default_factory=deque)  # to send, oldest first
    inflight: deque[tuple[int, Entry]] = field(default_factory=deque)  # (dseq, entry), sent
    dseq: int = 0  # the last delivery number on the current session
    on_disk: int = 0  # events in the SQLite queue not loaded into pending
    disk_pos: int = 0  # the queue position of the last event loaded from disk
    in_memory: int = 0  # entries in pending/inflight still in custody
    seen: Any = None  # the collapsed state of what the client took (collapse rule sets only)
    linger: asyncio.TimerHandle | None = None

    def meta(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "space": self.space,
            "filter": self.filter,
            "durable": self.durable,
            "collapse": self.collapse,
        }


# ----------------------------------------------------------------------------------- sessions


class _Session:
    """One client connection."""

    def __init__(self, broker: Broker, client: str, writer: asyncio.StreamWriter) -> None:
        self.broker = broker
        self.client = client
        self.writer = writer
        self.subs: set[str] = set()
        self.adverts: dict[str, Any] = {}  # advertisement key -> its test (the routing filter's)
        self._out: list[Any] = []
        self._events: list[list[Any]] = []  # [sub id, delivery number, publisher, pseq, event]
        self._acks: list[int] = []
        self._flush_due = False
        self.closed = False

    def send(self, msg: Any) -> None:
        self._out.append(msg)
        self._due()

    def deliver(self, sub_id: str, first: int, entries: list[Entry]) -> None:
        """Send ``entries`` of ``sub_id``, numbered from ``first``."""
        self._events.extend(
            [sub_id, dseq, eid[0], eid[1], event] for dseq, (eid, event, _) in enumerate(entries, first)
        )
        self._due()

    def pub_ack(self, pseq: int) -> None:
        self._acks.append(pseq)
        self._due()

    def _due(self) -> None:
        if not self._flush_due and not self.closed:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_due = False
        if self.closed:
            return
        msgs = self._out
        if self._acks:
            msgs.append(p.PubAck(p.pack_pubacks(self._acks)))
        for i in range(0, len(self._events), 2000):  # (frames well under the size limit)
            msgs.append(p.Events(p.pack_event_rows(self._events[i : i + 2000])))
        self._out, self._acks, self._events = [], [], []
        if msgs:
            self.writer.write(b"".join(frame(encode(m)) for m in msgs))


# ------------------------------------------------------------------------------------- broker


class Broker:
    """A broker listening on ``host:port`` (0: any free port), joining the ring through
    ``join`` (addresses ``"host:port"``; none: a new ring), keeping its state in ``data``
    (a directory; None: in memory, for tests and trials)."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        join: tuple[str, ...] | list[str] = (),
        data: Path | str | None = None,
        config: BrokerConfig = DEFAULT,
        overlay: str = "chordal-ring",
    ) -> None:
        if overlay not in OVERLAYS:
            raise FlowbusError(f"unknown overlay {overlay!r} (expected {' or '.join(OVERLAYS)})")
        self.overlay = overlay
        self.host = host
        self.port = port
        self.config = config
        self.join = [parse_address(j) for j in join]
        self.data = Path(data) if data is not None else None
        self.addr = 0
        self.core: BrokerCore | None = None
        self.runtime: Runtime | None = None
        self.store: Store | None = None
        self.subs: dict[str, _Sub] = {}
        self.sessions: dict[str, _Session] = {}  # client name -> its session
        self.published = 0
        self.delivered = 0
        self.spilled = 0
        self._last_pseq: dict[str, int] = {}
        self._inflight_pub: dict[tuple[str, int], None] = {}
        self._open_pseqs: dict[str, list[int]] = {}  # publisher -> heap of its pseqs published
        # here (those still in _inflight_pub are not settled; the others are dropped lazily)
        self._interpretations: Interpretations | None = None
        self._settling: list[tuple[str, Any]] = []
        self._spill: list[tuple[str, str, bytes]] = []
        self._pumps: set[_Sub] = set()
        self._pump_due = False
        self._sessions_tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._ring_seen: tuple[Any, ...] = ()  # what the log last said of the ring
        self._ring_quick: tuple[int, ...] = ()  # (and a cheap signature of it)
        self._adverts: dict[str, str] = {}  # advertisement key ("client/name") -> its filter text
        self._plain_of: Any = None  # the last event delivered, and its fields without the
        self._plain: dict[str, Any] = {}  # hidden ones (shared by its deliveries: read only)

    # -- life cycle

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        # compiled (or loaded from numba's cache) before serving: compiling under load would
        # stall this broker for seconds, and its neighbours would take it for dead
        took = await asyncio.to_thread(warm_up)
        log.info("matching kernels ready in %.1f s", took)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self.addr = addr_of(self.host, self.port)
        c = self.config
        if self.overlay == "pastry-irbr":
            if c.advertising:
                raise FlowbusError("advertising: the pastry-irbr overlay has no advertisements")
            self.core = IrbrBroker(self.addr, heartbeat=c.heartbeat)
        else:
            self.core = RingBroker(
                self.addr,
                backup=c.backup,
                heartbeat=c.heartbeat,
                custody=True,
                local_ack=True,
                advertising=c.advertising,
                probe_timeout=2 * c.heartbeat,
                ping_timeout=2 * c.heartbeat,
            )
        if self.data is not None:
            self.data.mkdir(parents=True, exist_ok=True)
        self.store = Store(self.data / "broker.sqlite" if self.data is not None else ":memory:")
        self.runtime = Runtime(
            self.addr,
            self.core,
            Directory(),
            host=self.host,
            port=self.port,
            on_deliver=self._on_deliver,
            on_client=self._serve_client,
            client_hello=p.Hello,
            after_step=self._after_step,
        )
        await self.runtime.start(sock=sock)
        if self.join:
            peers = [addr_of(h, port) for h, port in self.join]
            await self.runtime.call(lambda core: core.join(peers))
        else:
            await self.runtime.call(lambda core: core.start())

    async def joined(self, timeout: float = 10.0) -> None:
        """Wait until this broker is a member of the ring; then restore durable subscriptions."""
        assert self.core is not None
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not self.core.joined:
            if loop.time() > end:
                raise FlowbusError(f"broker {self.address}: could not join the ring in {timeout} s")
            await asyncio.sleep(0.02)
        await self._restore()

    async def close(self) -> None:
        self._closed = True
        for s in list(self.sessions.values()):
            s.closed = True
            s.writer.close()
        for t in list(self._sessions_tasks):
            t.cancel()
        for sub in self.subs.values():
            if sub.linger is not None:
                sub.linger.cancel()
        if self.runtime is not None:
            await self.runtime.close()
        if self.store is not None:
            self.store.close()

    def stats(self) -> dict[str, Any]:
        assert self.core is not None
        return {
            "address": self.address,
            "overlay": self.overlay,
            "node_id": self.core.node_id if self.core.joined else None,
            "peers": [_text(a) for a in self.peers()],
            "subscriptions": len(self.subs),
            "sessions": len(self.sessions),
            "published": self.published,
            "delivered": self.delivered,
            "spilled": self.spilled,
            "in_custody": self.core.in_custody(),
            "queued_in_memory": sum(s.in_memory for s in self.subs.values()),
        }

    def peers(self) -> list[int]:
        assert self.core is not None
        return self.core.peer_addrs()

    async def _restore(self) -> None:
        """Serve again the durable subscriptions the store holds (a restart)."""
        assert self.store is not None and self.core is not None
        for row in self.store.subscriptions():
            if row.sub_id in self.subs:
                continue
            if not row.durable:
                self.store.remove_subscription(row.sub_id)
                continue
            sub = _Sub(row.sub_id, row.client, row.space, row.filter, True, row.collapse)
            sub.on_disk = self.store.depth(row.sub_id)
            self.subs[row.sub_id] = sub
            filt = self._routing_filter(row.space, parse(row.filter))
            if row.sub_id not in self.core.subs:
                await self.runtime_call(lambda c, s=sub, f=filt: c.subscribe(s.sub_id, f, meta=s.meta()))

    async def runtime_call(self, fn: Any) -> None:
        assert self.runtime is not None
        await self.runtime.call(fn)

    # -- the core's deliveries and settlements

    def _on_deliver(self, addr: int, sub_id: Hashable, event: Any) -> None:
        sub = self.subs.get(sub_id) if isinstance(sub_id, str) else None
        if sub is None:
            sub = self._adopt(sub_id)
            if sub is None:
                return
        eid = event[EVENT_ID]
        if event is not self._plain_of:  # (an event's deliveries come one after the other)
            self._plain_of = event
            self._plain = {k: v for k, v in event.items() if k not in _HIDDEN}
        plain = self._plain
        self.delivered += 1
        if sub.on_disk or sub.session is None or sub.in_memory >= self.config.memory:
            self._spill.append((sub.sub_id, repr(eid), msgpack.packb((list(eid), plain))))
            sub.on_disk += 1
            self._settling.append((sub.sub_id, eid))
        else:
            sub.pending.append((eid, plain, None))
            sub.in_memory += 1
        if sub.session is not None:  # (_pump_soon, inlined: once per delivery)
            self._pumps.add(sub)
            if not self._pump_due:
                self._pump_due = True
                asyncio.get_running_loop().call_soon(self._pump_all)

    def _adopt(self, sub_id: Hashable) -> _Sub | None:
        """A subscription the core took over from a dead broker: serve it here."""
        assert self.core is not None and self.store is not None
        meta = self.core.meta_of(sub_id)
        if not isinstance(sub_id, str) or not isinstance(meta, Mapping):
            return None
        sub = _Sub(
            sub_id, meta["client"], meta["space"], meta["filter"], bool(meta["durable"]), meta["collapse"]
        )
        self.subs[sub_id] = sub
        with contextlib.suppress(FlowbusError):
            self.store.add_subscription(
                sub_id,
                client=sub.client,
                space=sub.space,
                filter=sub.filter,
                durable=sub.durable,
                collapse=sub.collapse,
            )
        if not sub.durable:
            self._start_linger(sub)
        return sub

    def _after_step(self) -> None:
        core = self.core
        assert core is not None and self.store is not None
        if log.isEnabledFor(logging.INFO):
            self._log_ring()
        if self._spill:
            spill, self._spill = self._spill, []
            self.store.enqueue_many(spill)
            self.spilled += len(spill)
        if self._settling:
            settling, self._settling = self._settling, []
            self._apply_later(settling)
        if core.settled:
            settled, core.settled = core.settled, []
            for eid in settled:
                self._inflight_pub.pop(eid, None)
                session = self.sessions.get(eid[0]) if isinstance(eid, tuple) else None
                if session is not None:
                    session.pub_ack(eid[1])
                if isinstance(eid, tuple):
                    self._lowest_open_pseq(eid[0])  # (drops what is settled from the heap)

    def _log_ring(self) -> None:  # (after every step: cheap when nothing changed)
        """Log the ring's changes: this broker's window, suspects, dead and taken over."""
        ring: RingNode | None = getattr(self.core, "ring", None)
        if ring is None or not ring.joined:
            return
        quick = (
            ring.version,
            len(ring.succ),
            len(ring.pred),
            len(ring.dead),
            len(ring.taken_over),
            ring.watched,
        )
        if quick == self._ring_quick:
            return
        self._ring_quick = quick
        seen = (
            tuple(_text(peer.addr) for peer in ring.window),
            tuple(ring.suspects),
            tuple(sorted(ring.dead)),
            tuple(ring.taken_over),
        )
        if seen != self._ring_seen:
            self._ring_seen = seen
            window, suspects, dead, taken = seen
            log.info(
                "ring %s (id %d): window %s, suspects %s, dead %s, taken over %s",
                self.address,
                ring.id,
                list(window),
                list(suspects),
                list(dead),
                list(taken),
            )

    def _apply_later(self, settling: list[tuple[str, Any]]) -> None:
        """Settle in the core, outside the step that asked for it."""
        asyncio.get_running_loop().call_soon(self._settle, settling)

    def _settle(self, settling: list[tuple[str, Any]]) -> None:
        if self._closed or self.runtime is None:
            return
        assert self.core is not None
        self.runtime.apply(self.core.settle_many(settling))

    # -- pumping queues to clients

    def _pump_soon(self, sub: _Sub) -> None:
        if sub.session is None:
            return
        self._pumps.add(sub)
        if not self._pump_due:
            self._pump_due = True
            asyncio.get_running_loop().call_soon(self._pump_all)

    def _pump_all(self) -> None:
        self._pump_due = False
        pumps, self._pumps = self._pumps, set()
        for sub in pumps:
            self._pump(sub)

    def _pump(self, sub: _Sub) -> None:
        session = sub.session
        if session is None or session.closed:
            return
        room = self.config.window - len(sub.inflight)
        pending, inflight = sub.pending, sub.inflight
        while room > 0:
            if not pending and sub.on_disk:
                self._load(sub, room)
            n = min(room, len(pending))
            if not n:
                break
            first = sub.dseq + 1
            sub.dseq += n
            batch = [pending.popleft() for _ in range(n)]
            inflight.extend(zip(range(first, first + n), batch, strict=True))
            session.deliver(sub.sub_id, first, batch)
            room -= n

    def _load(self, sub: _Sub, n: int) -> None:
        assert self.store is not None
        rows = self.store.pending(sub.sub_id, limit=max(n, 256), after=sub.disk_pos)
        for row in rows:
            eid, event = msgpack.unpackb(row.payload)
            sub.pending.append((tuple(eid), event, row.seq))
            sub.disk_pos = row.seq
        sub.on_disk = max(0, sub.on_disk - len(rows)) if rows else 0

    def _ack(self, sub: _Sub, upto: int) -> None:
        settle: list[tuple[str, Any]] = []
        disk = 0
        done: list[dict[str, Any]] = []
        while sub.inflight and sub.inflight[0][0] <= upto:
            _, (eid, event, where) = sub.inflight.popleft()
            if where is None:
                settle.append((sub.sub_id, eid))
                sub.in_memory -= 1
            elif where > 0:
                disk = max(disk, where)
            if sub.collapse is not None:
                done.append(event)
        if disk:
            assert self.store is not None
            self.store.ack(sub.sub_id, disk)
        if done:
            self._fold(sub, done)
        if settle:
            self._settle(settle)
        self._pump_soon(sub)

    # -- collapse rule sets

    def _interpretation(self, name: str, space: str) -> Interpretation:
        """The collapse rule set ``name`` bound to ``space``'s schema (built once)."""
        if self._interpretations is None:
            self._interpretations = Interpretations(self.config.rulesets)
        return self._interpretations.get(name, self.config.spaces.get(space))

    def _fold(self, sub: _Sub, events: list[dict[str, Any]]) -> None:
        assert sub.collapse is not None
        sub.seen = self._interpretation(sub.collapse, sub.space).fold(sub.seen, events)

    def _catch_up(self, sub: _Sub) -> None:
        """Replace the backlog of a subscription with a collapse rule set by its shortest
        equivalent sequence (the backlog's own events are settled: this broker has them)."""
        assert sub.collapse is not None and self.store is not None
        if sub.on_disk:
            self._load(sub, sub.on_disk + 1)
        backlog = list(sub.pending)
        if len(backlog) < 2:
            return
        events = self._interpretation(sub.collapse, sub.space).catch_up(sub.seen, [e for _, e, _ in backlog])
        settle = [(sub.sub_id, eid) for eid, _, where in backlog if where is None]
        disk = max((where for _, _, where in backlog if where), default=0)
        if disk:
            self.store.ack(sub.sub_id, disk)
        sub.in_memory -= len(settle)
        tag = next(_catch_ups)
        sub.pending = deque(((f"catch-up/{tag}", i), e, 0) for i, e in enumerate(events))
        if settle:
            self._settle(settle)

    # -- client sessions

    async def _serve_client(
        self,
        hello: p.Hello,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        early: list[bytes],
        frames: FrameDecoder,
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._sessions_tasks.add(task)
        session = _Session(self, hello.client, writer)
        old = self.sessions.get(hello.client)
        if old is not None:  # the client reconnected before we saw its old connection go
            self._end_session(old, bye=False)
        self.sessions[hello.client] = session
        session.send(p.Welcome(self.address, tuple(_text(a) for a in self.peers()), self.config.schemas()))
        bye = False
        try:
            for body in early:
                bye = bye or self._on_client_msg(session, decode(body))
            while not bye and not session.closed:
                data = await reader.read(1 << 16)
                if not data:
                    break
                for body in frames.feed(data):
                    if self._on_client_msg(session, decode(body)):
                        bye = True
                        break
        except FlowbusError as e:  # a malformed frame or message: this connection only
            session.send(p.Error(str(e)))
            session.flush()
        except (OSError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._end_session(session, bye=bye)
            if task is not None:
                self._sessions_tasks.discard(task)

    def _end_session(self, session: _Session, *, bye: bool) -> None:
        if session.closed and self.sessions.get(session.client) is not session:
            return
        session.flush()
        session.closed = True
        with contextlib.suppress(Exception):
            session.writer.close()
        if self.sessions.get(session.client) is session:
            del self.sessions[session.client]
        for sub_id in list(session.subs):
            sub = self.subs.get(sub_id)
            if sub is None or sub.session is not session:
                continue
            self._detach(sub)
            if not sub.durable:
                if bye:
                    self._remove(sub)
                else:
                    self._start_linger(sub)
        if bye:  # (a lost connection keeps them: the client advertises again when back)
            for key in list(session.adverts):
                self._drop_advert(session, key)

    def _detach(self, sub: _Sub) -> None:
        """Deliveries in flight go back to the front of the queue, for the next session."""
        if sub.session is not None:
            sub.session.subs.discard(sub.sub_id)
        sub.session = None
        sub.pending.extendleft(entry for _, entry in reversed(sub.inflight))
        sub.inflight.clear()

    def _start_linger(self, sub: _Sub) -> None:
        if self._closed:
            return
        if sub.linger is not None:
            sub.linger.cancel()
        sub.linger = asyncio.get_running_loop().call_later(self.config.linger, self._expire, sub.sub_id)

    def _expire(self, sub_id: str) -> None:
        sub = self.subs.get(sub_id)
        if sub is not None and sub.session is None and not self._closed:
            self._remove(sub)

    def _remove(self, sub: _Sub) -> None:
        assert self.core is not None and self.store is not None and self.runtime is not None
        self.subs.pop(sub.sub_id, None)
        if sub.linger is not None:
            sub.linger.cancel()
        settle = [(sub.sub_id, eid) for eid, _, where in sub.pending if where is None]
        settle += [(sub.sub_id, eid) for _, (eid, _, where) in sub.inflight if where is None]
        if sub.sub_id in self.core.subs:
            self.runtime.apply(self.core.unsubscribe(sub.sub_id))
        if settle:
            self._settle(settle)
        with contextlib.suppress(FlowbusError):
            self.store.remove_subscription(sub.sub_id)

    def _on_client_msg(self, session: _Session, msg: Any) -> bool:
        """Handle one message; True for ``Bye``."""
        if isinstance(msg, p.Publish):
            self._publish(session, msg)
        elif isinstance(msg, p.Ack):
            for sub_id, upto in msg.items():
                sub = self.subs.get(sub_id)
                if sub is not None and sub.session is session:
                    self._ack(sub, upto)
        elif isinstance(msg, p.Subscribe):
            session.send(p.Reply(msg.req, *self._subscribe(session, msg)))
        elif isinstance(msg, p.Unsubscribe):
            session.send(p.Reply(msg.req, *self._unsubscribe(session, msg)))
        elif isinstance(msg, p.Advertise):
            session.send(p.Reply(msg.req, *self._advertise(session, msg)))
        elif isinstance(msg, p.Unadvertise):
            session.send(p.Reply(msg.req, *self._unadvertise(session, msg.adv_id)))
        elif isinstance(msg, p.Bye):
            return True
        else:
            raise FlowbusError(f"a client may not send {type(msg).__name__}")
        return False

    # -- publish

    def _publish(self, session: _Session, msg: p.Publish) -> None:
        assert self.core is not None and self.runtime is not None and self.store is not None
        client = session.client
        schema = self.config.spaces.get(msg.space, _UNKNOWN)
        last = self._last_pseq.get(client)
        if last is None:
            last = self._last_pseq[client] = self.store.last_seq(client) or 0
        items = []
        top = last
        for pseq, event in msg.items():
            if type(pseq) is not int or pseq < 1:
                session.send(
                    p.Nack(pseq if type(pseq) is int else -1, f"bad publish sequence number {pseq!r}")
                )
                continue
            eid = (client, pseq)
            if pseq <= last:  # a re-send: acknowledged at once if settled, later if not
                if eid not in self._inflight_pub:
                    session.pub_ack(pseq)
                continue
            fields, error = self._checked_event(msg.space, schema, event)
            if fields is None:
                session.send(p.Nack(pseq, error))
                top = max(top, pseq)
                continue
            fields[SPACE] = msg.space
            if self.config.advertising and not any(test(fields) for test in session.adverts.values()):
                session.send(
                    p.Nack(pseq, f"no advertisement of this client matches the event in {msg.space!r}")
                )
                top = max(top, pseq)
                continue
            items.append((eid, fields))
            self._inflight_pub[eid] = None
            heapq.heappush(self._open_pseqs.setdefault(client, []), pseq)
            top = max(top, pseq)
        if top > last:
            self._last_pseq[client] = top
        if items:
            self.published += len(items)
            self.runtime.apply(self.core.publish_batch(items))
        if top > last:
            self._keep_pseq(client, top)

    def _keep_pseq(self, client: str, top: int) -> None:
        """Keep in SQLite the highest ``pseq`` of ``client`` up to which every publish is
        settled or refused, not the highest accepted: a publish accepted but not settled
        when this broker dies (its events waited in memory, in custody) must be published
        again when its publisher re-sends it after the restart, not acknowledged and lost.
        (A mark lagging behind is safe: it only lets more re-sends be published again.)"""
        assert self.store is not None
        lowest = self._lowest_open_pseq(client)
        self.store.accept(client, top if lowest is None else lowest - 1)  # (not above the kept one: no-op)

    def _lowest_open_pseq(self, client: str) -> int | None:
        """The lowest ``pseq`` of ``client`` published here and not settled yet, if any."""
        heap = self._open_pseqs.get(client)
        while heap and (client, heap[0]) not in self._inflight_pub:
            heapq.heappop(heap)
        if heap:
            return heap[0]
        self._open_pseqs.pop(client, None)
        return None

    def _checked_event(self, space: str, schema: Any, event: Any) -> tuple[dict[str, Any] | None, str]:
        """The event's fields, checked against the space's schema; or None and what is wrong."""
        if schema is _UNKNOWN:
            return None, f"unknown space {space!r} (known: {', '.join(sorted(self.config.spaces))})"
        if not isinstance(event, dict) or not all(isinstance(k, str) for k in event):
            return None, f"an event is a map of field names to values, got {type(event).__name__}"
        if any(k.startswith("__") for k in event):
            return None, "field names starting with '__' are reserved"
        if schema is None:
            return dict(event), ""
        try:
            return schema.validate(event), ""
        except SchemaError as e:
            return None, f"space {space!r}: {e}"

    # -- subscribe

    def _routing_filter(self, space: str, filt: Filter) -> Filter:
        """``__space = space & (filt)``, built from the parsed filter (not parsed again)."""
        in_space = Predicate(SPACE, Op.EQ, space)
        return Filter(tuple(Conjunction((in_space, *c.literals)) for c in filt.disjuncts))

    def _checked_filter(self, space: str, text: str) -> tuple[Filter | None, str]:
        """``text`` parsed, its fields checked against ``space``'s schema; or None and why not."""
        schema = self.config.spaces.get(space, _UNKNOWN)
        if schema is _UNKNOWN:
            return None, f"unknown space {space!r} (known: {', '.join(sorted(self.config.spaces))})"
        try:
            filt = parse(text)
        except FlowbusError as e:
            return None, f"filter: {e}"
        if schema is not None:
            unknown = sorted(f for f in filt.fields() if f not in schema)
            if unknown:
                fields = ", ".join(schema)
                return None, f"filter: unknown field {unknown[0]!r} in space {space!r} (fields: {fields})"
        return filt, ""

    def _subscribe(self, session: _Session, msg: p.Subscribe) -> tuple[bool, str | None]:
        assert self.core is not None and self.runtime is not None and self.store is not None
        sub = self.subs.get(msg.sub_id)
        if sub is None and msg.sub_id in self.core.subs:  # taken over from a dead broker, and
            sub = self._adopt(msg.sub_id)  # not delivered to since: serve it from now on
        if sub is not None:  # re-attaching
            if sub.session is not None and sub.session is not session:
                if sub.session.client != session.client:
                    return False, f"subscription {msg.sub_id!r} is attached to another client"
                self._detach(sub)
            self._attach(session, sub)
            return True, None
        if msg.resume:
            return False, p.NOT_HERE
        filt, error = self._checked_filter(msg.space, msg.filter)
        if filt is None:
            return False, error
        if msg.collapse is not None:
            if msg.collapse not in self.config.rulesets:
                known = ", ".join(sorted(self.config.rulesets)) or "none"
                return False, f"unknown collapse rule set {msg.collapse!r} (known: {known})"
            try:
                self._interpretation(msg.collapse, msg.space)
            except FlowbusError as e:
                return False, f"collapse rule set {msg.collapse!r}: {e}"
        sub = _Sub(msg.sub_id, session.client, msg.space, filt.to_text(), msg.durable, msg.collapse)
        try:
            self.store.add_subscription(
                sub.sub_id,
                client=sub.client,
                space=sub.space,
                filter=sub.filter,
                durable=sub.durable,
                collapse=sub.collapse,
            )
        except FlowbusError as e:
            return False, str(e)
        self.subs[sub.sub_id] = sub
        routing = self._routing_filter(msg.space, filt)
        self.runtime.apply(self.core.subscribe(sub.sub_id, routing, meta=sub.meta()))
        self._attach(session, sub)
        return True, None

    # -- advertise

    def _advertise(self, session: _Session, msg: p.Advertise) -> tuple[bool, str | None]:
        assert self.core is not None and self.runtime is not None
        if not self.config.advertising:
            return False, "advertising is off in this broker's configuration"
        filt, error = self._checked_filter(msg.space, msg.filter)
        if filt is None:
            return False, error
        key = f"{session.client}/{msg.adv_id}"
        text = filt.to_text()
        known = self._adverts.get(key)
        if known is not None:  # (again, after a reconnect: the same one is fine)
            if known != text:
                return False, f"advertisement {msg.adv_id!r} exists with another filter"
            session.adverts[key] = compiled(self._routing_filter(msg.space, filt))
            return True, None
        routing = self._routing_filter(msg.space, filt)
        self._adverts[key] = text
        session.adverts[key] = compiled(routing)
        self.runtime.apply(self.core.advertise(key, routing))
        return True, None

    def _unadvertise(self, session: _Session, adv_id: str) -> tuple[bool, str | None]:
        key = f"{session.client}/{adv_id}"
        if key not in self._adverts:
            return False, f"no advertisement {adv_id!r} of this client here"
        self._drop_advert(session, key)
        return True, None

    def _drop_advert(self, session: _Session, key: str) -> None:
        assert self.core is not None and self.runtime is not None
        session.adverts.pop(key, None)
        if self._adverts.pop(key, None) is not None:
            self.runtime.apply(self.core.unadvertise(key))

    def _attach(self, session: _Session, sub: _Sub) -> None:
        if sub.linger is not None:
            sub.linger.cancel()
            sub.linger = None
        sub.session = session
        sub.dseq = 0
        session.subs.add(sub.sub_id)
        if sub.collapse is not None and (sub.pending or sub.on_disk):
            self._catch_up(sub)
        self._pump_soon(sub)

    def _unsubscribe(self, session: _Session, msg: p.Unsubscribe) -> tuple[bool, str | None]:
        sub = self.subs.get(msg.sub_id)
        if sub is None or (sub.session is not None and sub.session is not session):
            return False, f"no subscription {msg.sub_id!r} of this client here"
        session.subs.discard(sub.sub_id)
        self._remove(sub)
        return True, None


_UNKNOWN: Any = object()
_catch_ups = itertools.count(1)
