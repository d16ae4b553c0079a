"""The asyncio driver of the sans-IO protocol cores: the simulator's effects, over TCP.

How it works: a :class:`Runtime` drives one :class:`~flowbus.core.Core` (a ring node, a
Pastry node, a broker...) under the same integer address the core uses in ``Send.dst``, as
the simulator does. A :class:`Directory` says where each address listens.

* ``Send(dst, msg)``. The message goes out as one frame, ``(src, msg)`` encoded by
  :mod:`flowbus.net.codec`, on a persistent connection to ``dst``, opened on first use.
  - There is one connection per destination, so messages to one peer stay in order.
  - The frames of one step to one destination are written at once, in one call (one
    system call, not one per message); while a connection opens, later sends queue
    behind it.
  - If connecting or writing fails, the core's ``on_send_failed(dst, msg, now)`` is called.
    This is the failure notice the simulator's ``failure_notice`` models, given here by TCP.
    A refused connection (the peer's host answered: nothing listens there) is a proof that
    the peer's process is gone, told first with ``on_peer_gone(dst, now)``; a timeout, an
    unreachable host or network (a partition, a paused peer) proves nothing of the kind.
  - A reader on each outgoing connection notices when the peer closes it, or it breaks:
    the core's ``on_link_lost(dst, now)`` (what was in the connection's buffers is gone,
    with no failure notice). The next send then opens a new connection, which fails if the
    peer is gone.
  - **Links that go silent** (a partition, a blackhole route, a link down). Opening a
    connection takes at most ``link_timeout`` seconds, and an open one is given up once what
    was written to it stays unacknowledged by the peer's host that long (``TCP_USER_TIMEOUT``).
    Without it, a connection into a partition lived on: its writes waited in the kernel,
    retransmitted at doubling intervals, and after the heal the link stayed mute until the
    next retransmission, 10 s and more after a 14 s partition (the ring took nothing from
    that neighbour meanwhile, and acknowledged nothing that waited on it). What a given-up
    connection held is the core's to send again (custody, heartbeats), as after a crash.
* **Incoming.** A server accepts connections and decodes frames. The messages of one read
  from one source go to ``on_messages(src, msgs, now)`` as one step (a lone message to
  ``on_message(src, msg, now)``). A malformed or oversized frame closes that connection
  (counted in ``bad_frames``) and changes nothing else.
* ``SetTimer`` / ``CancelTimer`` map to ``loop.call_later`` handles, keyed as in the
  simulator: setting a key again replaces its timer.
* ``Deliver(sub, event)`` goes to the ``on_deliver`` callback, ``DeliverAll(subs, event)``
  to ``on_deliver_all`` (without it, to ``on_deliver`` once per subscription).
* ``now`` is the event loop's clock.
* **Clients on the same port.** If the first frame of an incoming connection is of the
  type ``client_hello`` (a broker passes the client protocol's ``Hello``,
  :mod:`flowbus.client.protocol`), the connection is handed to ``on_client``.
* ``after_step`` is called after every step of the core (a message or the run of messages
  of one read, a timer, a failed send, a local call), for a driver that reads what the step
  changed.
* **Admission and TLS** (:mod:`flowbus.net.admission`). The listener admits each
  connection through a :class:`~flowbus.net.admission.Gate` (a cap per source address,
  TLS if the runtime has a server context, a handshake deadline). The first frame must come
  within the deadline and be at most ``pre_auth_frame`` long, unless its first bytes show
  a ring message from a peer this runtime takes (a broker's certificate; any peer without
  TLS): a ring peer may open with a big state transfer. With TLS, a connection whose
  first frame is a ring message must have presented a broker's certificate signed by the
  authority (:func:`~flowbus.net.tls.is_broker`), else it is closed (``refused_peers``);
  plain connections are taken from peers only if ``plain_peers`` allows. Outgoing
  connections to peers use TLS with the broker's own certificate (mutual TLS) and accept
  only a broker's certificate; with ``plain_peers``, a peer that does not speak TLS is
  dialed in plain text (and remembered as plain).
* **Link classes.** A link is *secure* when its connection is mutual TLS: ``secure(dst)``
  for the connection we send on, and for what arrives, the connection it came on. A
  ``link_filter(peer, msgs, secure, outgoing)`` (the broker's, for spaces that may only cross secure
  links) sees each batch going out and each run coming in, and returns what may pass.
* **Slow links for tests.** ``delay[peer] = seconds``: what arrives from ``peer`` waits that
  long before the core takes it, in order (a link made slow without touching the core).
* **Preparing.** Every ``PREPARE_EVERY`` seconds the core's ``prepare()`` is called (a broker
  builds then, at a quiet moment, the indexes its next events would otherwise wait for).
* :meth:`Runtime.call` runs a local call (``subscribe``, ``publish``, ``join``...) on the
  core and carries out the effects it returns.

Everything runs on one event loop thread, so a core is never entered twice at once: the
single-threaded contract the cores are written for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any

from flowbus.core import CancelTimer, Core, Deliver, DeliverAll, Effect, Outcome, Send, SetTimer
from flowbus.errors import FlowbusError, InternalError, UserError
from flowbus.net.admission import Admission, Gate
from flowbus.net.codec import FrameDecoder, FrameError, decode, encode, frame, head_tag
from flowbus.net.tls import is_broker

__all__ = ["Directory", "Runtime"]

DeliverHook = Callable[[int, Hashable, Any], object]
DeliverAllHook = Callable[[int, tuple[Hashable, ...], Any], object]
OutcomeHook = Callable[[int, Outcome], object]
ClientHook = Callable[
    [Any, asyncio.StreamReader, asyncio.StreamWriter, list[bytes], FrameDecoder], Awaitable[None]
]
"""A client connection: its ``Hello``, the streams, frames read after it, the decoder."""
LinkFilter = Callable[[int, list[Any], bool, bool], list[Any]]
"""``(peer, messages, secure, outgoing)`` -> the messages that may cross that link."""

log = logging.getLogger("flowbus.net")


class Directory:
    """Where each address listens: ``{address: (host, port)}``; an address nobody set is
    read as an IPv4 address and port (:func:`addr_of`)."""

    def __init__(self) -> None:
        self._where: dict[int, tuple[str, int]] = {}

    def set(self, addr: int, host: str, port: int) -> None:
        self._where[addr] = (host, port)

    def get(self, addr: int) -> tuple[str, int] | None:
        return self._where.get(addr) or where_of(addr)


def addr_of(host: str, port: int) -> int:
    """The address of a broker listening on IPv4 ``host``:``port``: the four bytes of the
    host, then the two of the port."""
    try:
        packed = socket.inet_aton(socket.gethostbyname(host))
    except OSError as e:
        raise UserError(f"cannot resolve host {host!r}: {e}") from None
    if not 0 < port < 65536:
        raise UserError(f"a port is 1..65535, got {port}")
    return int.from_bytes(packed, "big") << 16 | port


def where_of(addr: int) -> tuple[str, int] | None:
    """The inverse of :func:`addr_of`; None for a number that is not such an address."""
    if not 0 < addr < 1 << 48 or addr & 0xFFFF == 0:
        return None
    return socket.inet_ntoa((addr >> 16).to_bytes(4, "big")), addr & 0xFFFF


LINK_TIMEOUT = 5.0
"""Seconds a peer connection may take to open, or leave what was written unacknowledged,
before it is given up (see the module note; a broker sets it from its heartbeat)."""

PREPARE_EVERY = 0.05
"""How often the core is asked to prepare (seconds): a broker's indexes are then ready about
two ticks after its subscriptions stop changing (see :meth:`flowbus.core.Core.prepare`)."""


class Runtime:
    """One core on real sockets (see the module note)."""

    def __init__(
        self,
        addr: int,
        core: Core,
        directory: Directory,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        on_deliver: DeliverHook | None = None,
        on_deliver_all: DeliverAllHook | None = None,
        on_outcome: OutcomeHook | None = None,
        on_client: ClientHook | None = None,
        client_hello: type | None = None,
        after_step: Callable[[], object] | None = None,
        admission: Admission | None = None,
        link_timeout: float = LINK_TIMEOUT,
    ) -> None:
        self.addr = addr
        self.link_timeout = link_timeout
        self.core = core
        self.directory = directory
        self.host = host
        self.port = port
        self.on_deliver = on_deliver
        self.on_deliver_all = on_deliver_all
        self.on_outcome = on_outcome
        self.on_client = on_client
        self.client_hello = client_hello
        self.after_step = after_step
        self.admission = admission or Admission()
        self.link_filter: LinkFilter | None = None
        self.trace: Callable[[str, int, Sequence[Any]], None] | None = None  # (net/trace.py)
        self.delay: dict[int, float] = {}  # peer -> seconds its messages wait (a test's slow link)
        self._late: dict[int, deque[tuple[float, list[tuple[int, Any]], bool]]] = {}  # (waiting)
        self.bad_frames = 0
        self.refused_peers = 0  # connections sending ring messages without a broker's certificate
        self.sent = 0
        self.received = 0
        self._gate: Gate | None = None
        self._secure_out: dict[int, bool] = {}  # dst -> its connection is mutual TLS
        self._plain: set[int] = set()  # peers that answered TLS with plain text (plain_peers)
        self._out: dict[int, asyncio.StreamWriter] = {}
        self._opening: dict[int, asyncio.Lock] = {}
        self._queued: dict[int, list[Any]] = {}  # dst -> messages waiting for its connection
        self._timers: dict[Hashable, asyncio.TimerHandle] = {}
        self._prepare: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- life cycle

    async def start(self, *, sock: socket.socket | None = None) -> None:
        """Listen (port 0: any free port; or on ``sock``, bound already) and record where
        in the directory."""
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        self._gate = Gate(self.admission, self._serve)
        self._gate.start(sock)
        self.port = sock.getsockname()[1]
        self.directory.set(self.addr, self.host, self.port)
        if getattr(self.core, "prepare", None) is not None:  # (a test's core may have none)
            self._prepare = asyncio.get_running_loop().call_later(PREPARE_EVERY, self._prepare_tick)

    @property
    def refused(self) -> int:
        """Connections closed at the door or as peers without a broker's certificate."""
        return (self._gate.refused if self._gate is not None else 0) + self.refused_peers

    def secure(self, dst: int) -> bool:
        """Whether our connection to ``dst`` is mutual TLS (False if none is open)."""
        return self._secure_out.get(dst, False)

    def link_known(self, dst: int) -> bool:
        """Whether a connection to ``dst`` was opened (so :meth:`secure` says its class)."""
        return dst in self._secure_out

    async def close(self) -> None:
        """Stop listening, close every connection, drop every timer."""
        self._closed = True
        if self._prepare is not None:
            self._prepare.cancel()
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self._gate is not None:
            await self._gate.close()
        for writer in self._out.values():
            writer.close()
        self._out.clear()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def call(self, fn: Callable[[Any], Sequence[Effect]]) -> None:
        """A local call on the core; its effects are carried out."""
        self._apply(fn(self.core))

    def apply(self, effects: Sequence[Effect]) -> None:
        """Carry out effects a driver got from a local call on the core."""
        self._apply(effects)

    def _prepare_tick(self) -> None:
        self._prepare = asyncio.get_running_loop().call_later(PREPARE_EVERY, self._prepare_tick)
        self.core.prepare()  # (after the next tick is set: a failure here stops no later one)

    # -- effects

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _apply(self, effects: Sequence[Effect] | None) -> None:
        if self._closed:
            return
        if effects:
            self._carry_out(effects)
        if self.after_step is not None:
            self.after_step()

    def _carry_out(self, effects: Sequence[Effect]) -> None:
        loop = asyncio.get_running_loop()
        sends: dict[int, list[Any]] = {}
        for e in effects:
            if type(e) is DeliverAll:
                if self.on_deliver_all is not None:
                    self.on_deliver_all(self.addr, e.subs, e.event)
                elif self.on_deliver is not None:
                    for sub in e.subs:
                        self.on_deliver(self.addr, sub, e.event)
            elif isinstance(e, Deliver):
                if self.on_deliver is not None:
                    self.on_deliver(self.addr, e.sub, e.event)
            elif isinstance(e, Send):
                sends.setdefault(e.dst, []).append(e.msg)
            elif isinstance(e, SetTimer):
                old = self._timers.pop(e.key, None)
                if old is not None:
                    old.cancel()
                self._timers[e.key] = loop.call_later(e.delay, self._fire, e.key)
            elif isinstance(e, CancelTimer):
                handle = self._timers.pop(e.key, None)
                if handle is not None:
                    handle.cancel()
            elif isinstance(e, Outcome):
                if self.on_outcome is not None:
                    self.on_outcome(self.addr, e)
            else:
                raise InternalError(f"node {self.addr}: {e!r} is not an effect")
        for dst, msgs in sends.items():
            if self.trace is not None:
                self.trace("out", dst, msgs)
            self._send_all(dst, msgs)

    def _fire(self, key: Hashable) -> None:
        self._timers.pop(key, None)
        if not self._closed:
            self._apply(self.core.on_timer(key, self._now()))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send_all(self, dst: int, msgs: list[Any]) -> None:
        """Write ``msgs`` to ``dst`` now if its connection is open, else queue them behind
        the connection being opened (opening it if nobody is)."""
        queued = self._queued.get(dst)
        if queued is not None:
            queued.extend(msgs)
            return
        writer = self._out.get(dst)
        if writer is not None and not writer.is_closing():
            self._write(dst, writer, msgs)
            return
        self._queued[dst] = list(msgs)
        self._spawn(self._open_and_send(dst))

    async def _open_and_send(self, dst: int) -> None:
        try:
            writer = await self._connection(dst)
            self._write(dst, writer, self._queued.pop(dst, []))
            await writer.drain()
        except (OSError, ConnectionError, FlowbusError) as e:
            msgs = self._queued.pop(dst, [])
            self._drop(dst)
            if isinstance(e, ConnectionRefusedError):  # (its host answered: nothing listens)
                self._gone(dst)
            for msg in msgs:
                self._failed(dst, msg)

    def _write(self, dst: int, writer: asyncio.StreamWriter, msgs: list[Any]) -> None:
        if self.link_filter is not None:
            msgs = self.link_filter(dst, msgs, self._secure_out.get(dst, False), True)
        writer.write(b"".join([frame(encode((self.addr, m))) for m in msgs]))
        self.sent += len(msgs)

    def _failed(self, dst: int, msg: Any) -> None:
        if not self._closed:
            self._apply(self.core.on_send_failed(dst, msg, self._now()))

    def _gone(self, dst: int) -> None:
        gone = getattr(self.core, "on_peer_gone", None)  # (a test's core may have none)
        if not self._closed and gone is not None:
            self._apply(gone(dst, self._now()))

    async def _connection(self, dst: int) -> asyncio.StreamWriter:
        writer = self._out.get(dst)
        if writer is not None and not writer.is_closing():
            return writer
        lock = self._opening.setdefault(dst, asyncio.Lock())
        async with lock:
            writer = self._out.get(dst)
            if writer is not None and not writer.is_closing():
                return writer
            where = self.directory.get(dst)
            if where is None:
                raise ConnectionError(f"node {dst} is in no directory")
            reader, opened = await asyncio.wait_for(self._dial(dst, *where), self.link_timeout)
            _give_up_after(opened, self.link_timeout)
            self._out[dst] = opened
            self._spawn(self._watch(dst, reader, opened))
            return opened

    async def _dial(
        self, dst: int, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to peer ``dst``: mutual TLS if we have a context (a plain one to a
        peer that does not speak TLS, with ``plain_peers``)."""
        ctx, timeout = self.admission.peer_tls, self.admission.handshake_timeout
        if ctx is not None and dst not in self._plain:
            try:
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=ctx, ssl_handshake_timeout=timeout
                )
            except (ssl.SSLError, ConnectionResetError, asyncio.IncompleteReadError, EOFError) as e:
                if not self.admission.plain_peers:
                    raise ConnectionError(f"TLS to {host}:{port} failed: {e}") from None
                log.info("peer %s:%d does not speak TLS: a plain link", host, port)
                self._plain.add(dst)
            else:
                if is_broker(writer.get_extra_info("peercert")):
                    self._secure_out[dst] = True
                    return reader, writer
                writer.close()
                raise ConnectionError(f"{host}:{port} presented no broker certificate")
        self._secure_out[dst] = False
        return await asyncio.open_connection(host, port)

    async def _watch(self, dst: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The peer never writes on our outgoing connection: EOF means it closed it, an error
        that it broke. Either way, what was written to it and not taken yet is gone without a
        failure notice: the core is told (``on_link_lost``), to send again what it must."""
        with contextlib.suppress(OSError, ConnectionError):
            await reader.read()
        if self._out.get(dst) is writer:
            self._drop(dst)
            lost = getattr(self.core, "on_link_lost", None)  # (a test's core may have none)
            if not self._closed and lost is not None:
                self._apply(lost(dst, self._now()))

    def _drop(self, dst: int) -> None:
        writer = self._out.pop(dst, None)
        if writer is not None:
            writer.close()

    # -- incoming

    def _step_run(self, run: list[tuple[int, Any]], secure: bool) -> None:
        """Messages read together from one source, as one step: to the core's ``on_messages``
        (a broker matches a batch of events in one pass), a lone one to ``on_message``."""
        src = run[0][0]
        if (self._late or self.delay) and (self.delay.get(src) or src in self._late):  # (a test's slow link)
            self._hold(src, run, secure)
            return
        self._take_now(run, secure)

    def _hold(self, src: int, run: list[tuple[int, Any]], secure: bool) -> None:
        """``run`` waits ``delay[src]`` seconds, behind what waits from ``src`` already."""
        loop = asyncio.get_running_loop()
        waiting = self._late.setdefault(src, deque())
        waiting.append((loop.time() + self.delay.get(src, 0.0), run, secure))
        if len(waiting) == 1:
            loop.call_at(waiting[0][0], self._release_late, src)

    def _release_late(self, src: int) -> None:
        waiting = self._late[src]
        loop = asyncio.get_running_loop()
        while waiting and waiting[0][0] <= loop.time() and not self._closed:
            _, run, secure = waiting.popleft()
            self._take_now(run, secure)
        if waiting and not self._closed:
            loop.call_at(waiting[0][0], self._release_late, src)
        else:
            del self._late[src]

    def _take_now(self, run: list[tuple[int, Any]], secure: bool) -> None:
        src = run[0][0]
        if self.link_filter is not None:
            kept = self.link_filter(src, [m for _, m in run], secure, False)
            if len(kept) != len(run):
                run = [(src, m) for m in kept]
                if not run:
                    return
        self.received += len(run)
        if self.trace is not None:
            self.trace("in", src, [m for _, m in run])
        if len(run) > 1:
            self._apply(self.core.on_messages(src, [m for _, m in run], self._now()))
        else:
            self._apply(self.core.on_message(src, run[0][1], self._now()))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tls: bool) -> None:
        """An admitted connection (:class:`~flowbus.net.admission.Gate`): a client's (handed
        to ``on_client``) or a peer's, whose runs of messages go to the core."""
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)  # closed with the runtime
        frames = FrameDecoder()
        first = True
        secure = tls and is_broker(writer.get_extra_info("peercert"))
        try:
            data = await self._first_frame(reader, self._peer_allowed(tls, secure))
            while not self._closed and data:
                bodies = frames.feed(data)
                run: list[Any] = []  # consecutive messages (of one source: one connection)
                try:
                    for i, body in enumerate(bodies):
                        obj = decode(body)
                        hello, on_client = self.client_hello, self.on_client
                        if first and hello and on_client and isinstance(obj, hello):
                            if task is not None:
                                self._tasks.discard(task)  # the client session closes it
                            frames.limit = self.admission.pre_auth_frame  # (the session raises it)
                            await on_client(obj, reader, writer, bodies[i + 1 :], frames)
                            return
                        if first and not self._peer_admitted(tls, secure, writer):
                            return
                        first = False
                        src, msg = _envelope(obj)
                        if run and src != run[0][0]:
                            self._step_run(run, secure)
                            run = []
                        run.append((src, msg))
                finally:
                    if run:  # (what came before a bad frame is taken)
                        self._step_run(run, secure)
                data = await reader.read(65536)
        except FlowbusError:  # a malformed frame, or a message the core refuses
            self.bad_frames += 1
        except (OSError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _first_frame(self, reader: asyncio.StreamReader, peer_allowed: bool) -> bytes:
        """What a new connection sends until its first frame is whole (or, from a peer this
        runtime takes, until its head shows a ring message), within the handshake deadline;
        a first frame over ``pre_auth_frame`` otherwise is a :class:`FrameError`."""
        limit, data = self.admission.pre_auth_frame, b""
        async with asyncio.timeout(self.admission.handshake_timeout):
            while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
                n = int.from_bytes(data[:4], "big") if len(data) >= 4 else 0
                if n > limit and len(data) >= 4 + min(n, 64):
                    if peer_allowed and head_tag(data[4:68]) == "tuple":
                        return data  # (a ring peer's big frame: the decoder takes the rest)
                    raise FrameError(f"a first frame of {n} bytes: over {limit}")
                chunk = await reader.read(65536)
                if not chunk:
                    return b""
                data += chunk
        return data

    def _peer_allowed(self, tls: bool, secure: bool) -> bool:
        """Whether a connection may send ring messages: with TLS, a broker's certificate is
        needed (or a plain connection, with ``plain_peers``)."""
        return self.admission.tls is None or secure or (not tls and self.admission.plain_peers)

    def _peer_admitted(self, tls: bool, secure: bool, writer: asyncio.StreamWriter) -> bool:
        """:meth:`_peer_allowed`, else the connection is counted and logged (to be closed)."""
        if self._peer_allowed(tls, secure):
            return True
        self.refused_peers += 1
        log.warning(
            "ring messages from %s without a broker's certificate: closed", writer.get_extra_info("peername")
        )
        return False


def _envelope(obj: object) -> tuple[int, Any]:
    if not (isinstance(obj, tuple) and len(obj) == 2 and type(obj[0]) is int):
        raise FrameError(f"a frame must hold (source address, message), got {type(obj).__name__}")
    return obj[0], obj[1]


def _give_up_after(writer: asyncio.StreamWriter, seconds: float) -> None:
    """The kernel closes ``writer``'s connection once written data has waited ``seconds``
    for the peer's acknowledgement (Linux; elsewhere, its own retransmission limits)."""
    sock = writer.get_extra_info("socket")
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if sock is not None and option is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, option, max(1, int(seconds * 1000)))
