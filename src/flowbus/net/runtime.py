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
  - A reader on each outgoing connection notices when the peer closes it. The next send
    then opens a new connection, which fails if the peer is gone.
* **Incoming.** A server accepts connections and decodes frames. The messages of one read
  from one source go to ``on_messages(src, msgs, now)`` as one step (a lone message to
  ``on_message(src, msg, now)``). A malformed or oversized frame closes that connection
  (counted in ``bad_frames``) and changes nothing else.
* ``SetTimer`` / ``CancelTimer`` map to ``loop.call_later`` handles, keyed as in the
  simulator: setting a key again replaces its timer.
* ``Deliver(sub, event)`` goes to the ``on_deliver`` callback.
* ``now`` is the event loop's clock.
* **Clients on the same port.** If the first frame of an incoming connection is of the
  type ``client_hello`` (a broker passes the client protocol's ``Hello``,
  :mod:`flowbus.client.protocol`), the connection is handed to ``on_client``.
* ``after_step`` is called after every step of the core (a message or the run of messages
  of one read, a timer, a failed send, a local call), for a driver that reads what the step
  changed.
* :meth:`Runtime.call` runs a local call (``subscribe``, ``publish``, ``join``...) on the
  core and carries out the effects it returns.

Everything runs on one event loop thread, so a core is never entered twice at once: the
single-threaded contract the cores are written for.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any

from flowbus.core import CancelTimer, Core, Deliver, Effect, Send, SetTimer
from flowbus.errors import FlowbusError
from flowbus.net.codec import FrameDecoder, FrameError, decode, encode, frame

__all__ = ["Directory", "Runtime"]

DeliverHook = Callable[[int, Hashable, Any], object]
ClientHook = Callable[
    [Any, asyncio.StreamReader, asyncio.StreamWriter, list[bytes], FrameDecoder], Awaitable[None]
]
"""A client connection: its ``Hello``, the streams, frames read after it, the decoder."""


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
        raise FlowbusError(f"cannot resolve host {host!r}: {e}") from None
    if not 0 < port < 65536:
        raise FlowbusError(f"a port is 1..65535, got {port}")
    return int.from_bytes(packed, "big") << 16 | port


def where_of(addr: int) -> tuple[str, int] | None:
    """The inverse of :func:`addr_of`; None for a number that is not such an address."""
    if not 0 < addr < 1 << 48 or addr & 0xFFFF == 0:
        return None
    return socket.inet_ntoa((addr >> 16).to_bytes(4, "big")), addr & 0xFFFF


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
        on_client: ClientHook | None = None,
        client_hello: type | None = None,
        after_step: Callable[[], object] | None = None,
    ) -> None:
        self.addr = addr
        self.core = core
        self.directory = directory
        self.host = host
        self.port = port
        self.on_deliver = on_deliver
        self.on_client = on_client
        self.client_hello = client_hello
        self.after_step = after_step
        self.bad_frames = 0
        self.sent = 0
        self.received = 0
        self._server: asyncio.Server | None = None
        self._out: dict[int, asyncio.StreamWriter] = {}
        self._opening: dict[int, asyncio.Lock] = {}
        self._queued: dict[int, list[Any]] = {}  # dst -> messages waiting for its connection
        self._timers: dict[Hashable, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- life cycle

    async def start(self, *, sock: socket.socket | None = None) -> None:
        """Listen (port 0: any free port; or on ``sock``, bound already) and record where
        in the directory."""
        if sock is not None:
            self._server = await asyncio.start_server(self._serve, sock=sock)
        else:
            self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        self.directory.set(self.addr, self.host, self.port)

    async def close(self) -> None:
        """Stop listening, close every connection, drop every timer."""
        self._closed = True
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
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
            if isinstance(e, Deliver):
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
            else:
                raise FlowbusError(f"node {self.addr}: {e!r} is not an effect")
        for dst, msgs in sends.items():
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
            writer.write(b"".join([frame(encode((self.addr, m))) for m in msgs]))
            self.sent += len(msgs)
            return
        self._queued[dst] = list(msgs)
        self._spawn(self._open_and_send(dst))

    async def _open_and_send(self, dst: int) -> None:
        try:
            writer = await self._connection(dst)
            msgs = self._queued.pop(dst, [])
            writer.write(b"".join([frame(encode((self.addr, m))) for m in msgs]))
            self.sent += len(msgs)
            await writer.drain()
        except (OSError, ConnectionError, FlowbusError):
            msgs = self._queued.pop(dst, [])
            self._drop(dst)
            for msg in msgs:
                self._failed(dst, msg)

    def _failed(self, dst: int, msg: Any) -> None:
        if not self._closed:
            self._apply(self.core.on_send_failed(dst, msg, self._now()))

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
            reader, writer = await asyncio.open_connection(*where)
            self._out[dst] = writer
            self._spawn(self._watch(dst, reader, writer))
            return writer

    async def _watch(self, dst: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The peer never writes on our outgoing connection: EOF means it closed it."""
        with contextlib.suppress(OSError, ConnectionError):
            await reader.read()
        if self._out.get(dst) is writer:
            self._drop(dst)

    def _drop(self, dst: int) -> None:
        writer = self._out.pop(dst, None)
        if writer is not None:
            writer.close()

    # -- incoming

    def _take(self, run: list[tuple[int, Any]]) -> None:
        """Messages read together from one source, as one step: to the core's ``on_messages``
        (a broker matches a batch of events in one pass), a lone one to ``on_message``."""
        self.received += len(run)
        src = run[0][0]
        if len(run) > 1:
            self._apply(self.core.on_messages(src, [m for _, m in run], self._now()))
        else:
            self._apply(self.core.on_message(src, run[0][1], self._now()))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)  # closed with the runtime
        frames = FrameDecoder()
        first = True
        try:
            while not self._closed:
                data = await reader.read(65536)
                if not data:
                    break
                bodies = frames.feed(data)
                run: list[Any] = []  # consecutive messages (of one source: one connection)
                try:
                    for i, body in enumerate(bodies):
                        obj = decode(body)
                        hello, on_client = self.client_hello, self.on_client
                        if first and hello and on_client and isinstance(obj, hello):
                            if task is not None:
                                self._tasks.discard(task)  # the client session closes it
                            await on_client(obj, reader, writer, bodies[i + 1 :], frames)
                            return
                        first = False
                        src, msg = _envelope(obj)
                        if run and src != run[0][0]:
                            self._take(run)
                            run = []
                        run.append((src, msg))
                finally:
                    if run:  # (what came before a bad frame is taken)
                        self._take(run)
        except FlowbusError:  # a malformed frame, or a message the core refuses
            self.bad_frames += 1
        except (OSError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            if task is not None:
                self._tasks.discard(task)


def _envelope(obj: object) -> tuple[int, Any]:
    if not (isinstance(obj, tuple) and len(obj) == 2 and type(obj[0]) is int):
        raise FrameError(f"a frame must hold (source address, message), got {type(obj).__name__}")
    return obj[0], obj[1]
