"""A proxy in front of a broker that strikes its links: delay, jitter, loss, duplication,
reordering, and a client's link cut just before or after a publish acknowledgement.

The kernel a campaign runs on may have neither ``netem`` nor ``iptables``, so the faults of
links are made in user space: in each broker's host, the broker listens on
``127.0.0.1:7001`` and advertises (``--advertise``) the host's ``IP:7000``, where this proxy
listens and forwards every connection to the broker. Peers and clients dial the advertised
address only, so everything that reaches the broker crosses the proxy.

How it works:

* **Frames.** The proxy cuts each direction of a connection into flowbus frames (a 4-byte
  big-endian length, then the body: :mod:`flowbus.net.codec`) and forwards whole frames,
  each at its own time. What is left of a frame when a side closes goes on as it is.
* **Rules** (:class:`Rules`) are a JSON file, read again whenever it changes (polled every
  100 ms; a file that is not valid is reported on standard error and the rules stay as they
  were; no file: no rules)::

      {"links": {"10.250.7.2": {"delay_ms": 40, "jitter_ms": 30, "loss": 0.05,
                                "dup": 0.02, "reorder": 0.05, "reorder_ms": 60}},
       "ack_cut": {"peer": "10.250.7.9", "when": "before"}}

  ``links`` is keyed by the *source IP* of a connection (the peer broker or the clients'
  host that dialed the proxy), and applies, frame by frame, to both directions of that
  connection (a link between two brokers both ways: each broker's proxy names the other).
  Every field is optional (0 by default).
* **A frame's fate** (:class:`Shaper`, one per direction of a connection, with a random
  generator seeded by ``--seed``, the connection's number and the direction). The links
  between brokers are TCP connections: what a lossy, duplicating or reordering network does
  to their packets, the kernels' TCP repairs, and the brokers see it as time. A frame stands
  for a segment, and its fate is what TCP makes of that segment's fault:

  - ``delay_ms`` and ``jitter_ms``: it waits ``delay ± U(jitter)`` ms (never less than 0);
  - ``loss`` (a probability, drawn again for each try): the segment is lost and sent again
    after the retransmission timeout, 200 ms (Linux's least) doubled at each loss of it, at
    most :data:`MAX_RETRIES` times;
  - ``reorder`` (a probability): it arrives ``reorder_ms`` later (50 by default) than it
    would have, after those behind it, which the receiving TCP holds until it comes;
  - ``dup`` (a probability): a copy arrives too, which the receiving TCP drops (counted).

  Whatever its fate, a frame never leaves before the frame ahead of it (TCP delivers in
  order): one that waits holds those behind it. Faults that reach the application as such
  (a connection that breaks, an acknowledgement that never comes) are the partitions' and
  ``ack_cut``'s.
* **ack_cut.** On a connection from ``peer``, the next frame the broker sends the client
  whose tag is ``client.pub_ack`` (:func:`~flowbus.net.codec.head_tag`) is dropped and both
  sides of the connection are closed at once (``"when": "before"``: the client never sees
  the acknowledgement the broker sent), or it is forwarded and then both sides closed
  (``"after"``). The frames ahead of it still go (at their times), nothing after it does.
  It fires once for each change of the file that sets it, then waits for the next change.
* **A broker that is gone.** If the broker refuses the proxy's connection, the client's
  connection is reset (``SO_LINGER`` 0), as a refused connection would be; a connection
  the broker resets is reset on the other side too.
* **Counters** (:class:`Counters`: connections, frames forwarded, dropped (behind an ack
  cut), losses retransmitted, copies duplicated, frames reordered and delayed, cuts,
  resets; by source too) are written to ``RULES.stats.json`` every
  second and when the proxy ends, and printed as one JSON line on standard output at
  ``SIGTERM`` (or ``SIGINT``), after which the proxy exits.

Run it as ``python -m flowbus.chaos.proxy --listen IP:PORT --target HOST:PORT --rules PATH
[--seed N]``; it prints ``proxy ready IP:PORT`` once it listens (port 0: any free port).
:class:`Proxies` is the campaign's side: one proxy per broker host, their rules, their
counters (:mod:`flowbus.chaos.campaign`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import json
import math
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from flowbus.errors import ExperimentError
from flowbus.net.codec import head_tag

if TYPE_CHECKING:
    from flowbus.chaos.hosts import Hosts

__all__ = [
    "PROXY_READY",
    "AckCut",
    "Counters",
    "Fate",
    "LinkRules",
    "Proxies",
    "Proxy",
    "Rules",
    "Shaper",
    "main",
]

PROXY_READY = "proxy ready"
"""The line a proxy prints once it listens: ``proxy ready IP:PORT``."""

POLL = 0.1
"""Seconds between two looks at the rules file."""

STATS_EVERY = 1.0
"""Seconds between two writes of the counters file."""

HELD_LIMIT = 64 << 20
"""Bytes a direction of a connection may hold (delayed frames) before it stops reading."""

PUB_ACK = "client.pub_ack"
_LEN = struct.Struct(">I")
_LINGER_0 = struct.pack("ii", 1, 0)


# ------------------------------------------------------------------------------------- the rules


def _probability(doc: Mapping[str, Any], key: str, where: str) -> float:
    value = doc.get(key, 0.0)
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{where}.{key}: a probability 0..1, got {value!r}")
    return float(value)


def _millis(doc: Mapping[str, Any], key: str, where: str, default: float = 0.0) -> float:
    value = doc.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0.0 <= value < 3_600_000:
        raise ValueError(f"{where}.{key}: milliseconds >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class LinkRules:
    """What happens to the frames of connections from one source (see the module note)."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    reorder_ms: float = 50.0

    FIELDS: ClassVar[tuple[str, ...]] = ("delay_ms", "jitter_ms", "loss", "dup", "reorder", "reorder_ms")

    @classmethod
    def parse(cls, doc: object, where: str) -> LinkRules:
        if not isinstance(doc, dict):
            raise ValueError(f"{where}: an object of {', '.join(cls.FIELDS)}, got {doc!r}")
        unknown = sorted(set(doc) - set(cls.FIELDS))
        if unknown:
            raise ValueError(f"{where}: unknown fields {unknown} (fields: {', '.join(cls.FIELDS)})")
        return cls(
            delay_ms=_millis(doc, "delay_ms", where),
            jitter_ms=_millis(doc, "jitter_ms", where),
            loss=_probability(doc, "loss", where),
            dup=_probability(doc, "dup", where),
            reorder=_probability(doc, "reorder", where),
            reorder_ms=_millis(doc, "reorder_ms", where, 50.0),
        )


@dataclass(frozen=True, slots=True)
class AckCut:
    """Cut the next connection from ``peer`` at a publish acknowledgement, ``before`` or
    ``after`` it reaches the client."""

    peer: str
    when: str

    @classmethod
    def parse(cls, doc: object) -> AckCut:
        if not isinstance(doc, dict) or set(doc) != {"peer", "when"}:
            raise ValueError(f'ack_cut: {{"peer": IP, "when": "before" | "after"}}, got {doc!r}')
        peer, when = doc["peer"], doc["when"]
        if not isinstance(peer, str) or when not in ("before", "after"):
            raise ValueError(f'ack_cut: a peer IP and "when": "before" or "after", got {doc!r}')
        return cls(peer, when)


@dataclass(frozen=True, slots=True)
class Rules:
    """A proxy's rules: by source IP (``links``), and an ``ack_cut`` (see the module note)."""

    links: Mapping[str, LinkRules] = field(default_factory=dict)
    ack_cut: AckCut | None = None

    @classmethod
    def parse(cls, doc: object) -> Rules:
        """The rules of a JSON document; a :class:`ValueError` naming what is wrong."""
        if not isinstance(doc, dict):
            raise ValueError(f"rules: a JSON object, got {type(doc).__name__}")
        unknown = sorted(set(doc) - {"links", "ack_cut"})
        if unknown:
            raise ValueError(f"rules: unknown keys {unknown} (keys: links, ack_cut)")
        links = doc.get("links") or {}
        if not isinstance(links, dict):
            raise ValueError("rules: links is an object keyed by source IP")
        for ip in links:
            try:
                socket.inet_aton(ip)
            except OSError:
                raise ValueError(f"links: {ip!r} is not an IPv4 address") from None
        cut = doc.get("ack_cut")
        return cls(
            {ip: LinkRules.parse(r, f"links[{ip}]") for ip, r in links.items()},
            AckCut.parse(cut) if cut is not None else None,
        )

    @classmethod
    def load(cls, path: Path) -> Rules:
        """The rules of the file ``path`` (none if there is no file)."""
        try:
            text = path.read_text()
        except FileNotFoundError:
            return cls()
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ValueError(f"{path}: not JSON: {e}") from None
        return cls.parse(doc)


# ------------------------------------------------------------------------------ a frame's fate


@dataclass(frozen=True, slots=True)
class Fate:
    """What becomes of one frame: it leaves at ``release`` (the event loop's clock), after
    ``lost`` losses and retransmissions; ``duplicated``: a copy came too (dropped by TCP);
    ``reordered``: it came after the frames behind it (which waited for it)."""

    release: float
    lost: int = 0
    duplicated: bool = False
    reordered: bool = False
    delayed: bool = False


RTO = 0.2
"""Seconds: TCP's retransmission timeout for a lost segment (Linux's least), doubled at each
loss of the same segment."""

MAX_RETRIES = 6
"""Losses of one segment at most (then it gets through): 200 ms + 400 ms ... = 12.6 s."""


class Shaper:
    """Decides the fate of each frame of one direction of a connection, in order."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.tail = -math.inf  # when the last frame leaves

    def decide(self, rules: LinkRules | None, now: float) -> Fate:
        """The fate of the next frame, read at ``now`` (seconds), under ``rules`` (None:
        forwarded as it comes, behind the frames ahead of it)."""
        if rules is None:
            self.tail = max(now, self.tail)
            return Fate(self.tail)
        rng = self.rng
        wait = rules.delay_ms
        if rules.jitter_ms:
            wait += rng.uniform(-rules.jitter_ms, rules.jitter_ms)
        arrives = now + max(0.0, wait) / 1000.0
        lost = 0
        while rules.loss and lost < MAX_RETRIES and rng.random() < rules.loss:
            arrives += RTO * 2**lost
            lost += 1
        reordered = bool(rules.reorder) and rng.random() < rules.reorder
        if reordered:
            arrives += rules.reorder_ms / 1000.0
        duplicated = bool(rules.dup) and rng.random() < rules.dup
        self.tail = max(arrives, self.tail)
        return Fate(self.tail, lost, duplicated, reordered, delayed=self.tail > now)


def _delay_only(rules: LinkRules) -> LinkRules:
    """``rules`` without their chance of loss, duplication or reordering."""
    return LinkRules(delay_ms=rules.delay_ms, jitter_ms=rules.jitter_ms)


def split_frames(buf: bytearray) -> list[bytes]:
    """The whole frames (prefix and body) at the start of ``buf``, taken out of it."""
    out = []
    pos = 0
    while len(buf) - pos >= 4:
        (n,) = _LEN.unpack_from(buf, pos)
        if len(buf) - pos - 4 < n:
            break
        out.append(bytes(buf[pos : pos + 4 + n]))
        pos += 4 + n
    if pos:
        del buf[:pos]
    return out


def frame_tag(frame: bytes) -> str | None:
    """The tag of the value a whole frame holds (:func:`~flowbus.net.codec.head_tag`)."""
    return head_tag(frame[4:68])


# ------------------------------------------------------------------------------------- counters


COUNTS = (
    "connections", "forwarded", "dropped", "retransmitted", "duplicated",
    "reordered", "delayed", "cuts", "resets",
)  # fmt: skip


class Counters:
    """What a proxy did: totals, and by source IP."""

    def __init__(self) -> None:
        self.total: Counter[str] = Counter({k: 0 for k in COUNTS})
        self.by_source: dict[str, Counter[str]] = {}
        self.rule_changes = 0
        self.rule_errors = 0
        self.changed = True

    def add(self, source: str, what: str, n: int = 1) -> None:
        self.total[what] += n
        self.by_source.setdefault(source, Counter())[what] += n
        self.changed = True

    def to_json(self) -> dict[str, Any]:
        return {
            **{k: self.total[k] for k in COUNTS},
            "rule_changes": self.rule_changes,
            "rule_errors": self.rule_errors,
            "by_source": {ip: dict(c) for ip, c in sorted(self.by_source.items())},
        }


# ----------------------------------------------------------------------------------------- proxy


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (``SO_LINGER`` 0), not an orderly close."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_0)
    writer.transport.abort()


class _Direction:
    """One direction of a proxied connection: frames read, shaped, and written at their time."""

    def __init__(
        self, conn: _Connection, name: str, writer: asyncio.StreamWriter, rng: random.Random
    ) -> None:
        self.conn = conn
        self.name = name  # "up" (to the broker) or "down" (to the one who dialed)
        self.writer = writer
        self.shaper = Shaper(rng)
        self.heap: list[tuple[float, int, bytes, bool]] = []  # (release, n, bytes, close after)
        self.n = 0
        self.held = 0
        self.timer: asyncio.TimerHandle | None = None
        self.empty = asyncio.Event()
        self.empty.set()
        self.room = asyncio.Event()
        self.room.set()
        self.cut = False  # (an ack cut is under way: what comes after it is dropped)

    def push(self, release: float, data: bytes, *, close_after: bool = False) -> None:
        self.n += 1
        heapq.heappush(self.heap, (release, self.n, data, close_after))
        self.held += len(data)
        self.empty.clear()
        if self.held > HELD_LIMIT:
            self.room.clear()
        if self.heap[0][1] == self.n:  # (the new head: the timer moves to it)
            self._arm()

    def _arm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = None
        if self.heap:
            self.timer = asyncio.get_running_loop().call_at(self.heap[0][0], self._release)

    def _release(self) -> None:
        self.timer = None
        loop = asyncio.get_running_loop()
        due = loop.time() + 0.001
        out = []
        close = False
        while self.heap and self.heap[0][0] <= due and not close:
            _, _, data, close = heapq.heappop(self.heap)
            self.held -= len(data)
            out.append(data)
        if out and not self.conn.closed:
            self.writer.write(b"".join(out))
        if close:
            self.conn.close()
            return
        if self.held <= HELD_LIMIT // 2:
            self.room.set()
        if self.heap:
            self._arm()
        else:
            self.empty.set()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.heap.clear()
        self.held = 0
        self.empty.set()
        self.room.set()


class _Connection:
    """A connection from ``source``, proxied to the broker in both directions."""

    def __init__(
        self,
        proxy: Proxy,
        number: int,
        source: str,
        down: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self.source = source
        self.readers = {"up": down[0], "down": up[0]}  # (what goes up is read from below)
        self.writers = {"up": up[1], "down": down[1]}
        seed = proxy.seed
        self.dirs = {
            d: _Direction(self, d, self.writers[d], random.Random(f"{seed}/{number}/{d}"))
            for d in ("up", "down")
        }
        self.closed = False
        self.ended: set[str] = set()
        self.tasks: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        self.tasks = [asyncio.ensure_future(self._pump(d)) for d in ("up", "down")]
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.close()

    async def _pump(self, name: str) -> None:
        reader, direction = self.readers[name], self.dirs[name]
        proxy, source = self.proxy, self.source
        loop = asyncio.get_running_loop()
        buf = bytearray()
        try:
            while not self.closed:
                await direction.room.wait()
                await direction.writer.drain()  # (a slow receiver slows the reading)
                data = await reader.read(1 << 16)
                if not data:
                    break
                buf += data
                now = loop.time()
                for frame in split_frames(buf):
                    if self.closed:
                        return
                    self._forward_frame(direction, frame, now, proxy, source)
        except (ConnectionResetError, BrokenPipeError):
            self._reset_both()
            return
        except (OSError, asyncio.IncompleteReadError):
            self.close(abort=True)
            return
        # (an orderly end: what is held and what is left go on, then the other side's write end closes)
        if self.closed:
            return
        if buf:
            direction.push(max(loop.time(), direction.shaper.tail), bytes(buf))
        await direction.empty.wait()
        if self.closed:
            return
        self.ended.add(name)
        writer = self.writers[name]
        if len(self.ended) == 2:
            self.close()
        elif not self.closed and writer.can_write_eof():
            with contextlib.suppress(OSError):
                writer.write_eof()

    def _forward_frame(
        self, direction: _Direction, frame: bytes, now: float, proxy: Proxy, source: str
    ) -> None:
        counts = proxy.counters
        if direction.cut:  # (behind an ack cut: nothing more goes this way)
            counts.add(source, "dropped")
            return
        rules = proxy.rules.links.get(source)
        cut = proxy.rules.ack_cut
        if (
            direction.name == "down"
            and proxy.ack_armed
            and cut is not None
            and cut.peer == source
            and frame_tag(frame) == PUB_ACK
        ):
            proxy.ack_armed = False
            direction.cut = True
            counts.add(source, "cuts")
            print(f"ack cut {cut.when} on a connection from {source}", file=sys.stderr, flush=True)
            release = direction.shaper.decide(None if rules is None else _delay_only(rules), now).release
            if cut.when == "before":  # (the frames ahead of it go, then the connection closes)
                counts.add(source, "dropped")
                direction.push(release, b"", close_after=True)
            else:
                counts.add(source, "forwarded")
                direction.push(release, frame, close_after=True)
            return
        fate = direction.shaper.decide(rules, now)
        direction.push(fate.release, frame)
        counts.add(source, "forwarded")
        if fate.lost:
            counts.add(source, "retransmitted", fate.lost)
        if fate.duplicated:
            counts.add(source, "duplicated")
        if fate.reordered:
            counts.add(source, "reordered")
        if fate.delayed:
            counts.add(source, "delayed")

    def _reset_both(self) -> None:
        if self.closed:
            return
        self.proxy.counters.add(self.source, "resets")
        self.closed = True
        for d in self.dirs.values():
            d.cancel()
        for w in self.writers.values():
            _reset(w)
        self._stop_tasks()

    def close(self, *, abort: bool = False) -> None:
        """Both sides closed: at once (``abort``: what is held and buffered is dropped), or
        after what the transports hold is written."""
        if self.closed:
            return
        self.closed = True
        for d in self.dirs.values():
            d.cancel()
        for w in self.writers.values():
            if abort:
                w.transport.abort()
            else:
                w.close()
        self._stop_tasks()

    def _stop_tasks(self) -> None:
        me = asyncio.current_task()
        for t in self.tasks:
            if t is not me:
                t.cancel()


class Proxy:
    """The proxy (see the module note): listens on ``listen``, forwards to ``target``, under
    the rules of the file ``rules``."""

    def __init__(
        self, listen: tuple[str, int], target: tuple[str, int], rules: Path, *, seed: int = 0
    ) -> None:
        self.listen = listen
        self.target = target
        self.rules_path = rules
        self.stats_path = rules.with_name(rules.name + ".stats.json")
        self.seed = seed
        self.rules = Rules()
        self.ack_armed = False
        self.counters = Counters()
        self.connections: set[_Connection] = set()
        self._signature: tuple[int, int, int] | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._number = 0

    @property
    def address(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def start(self) -> None:
        self.reload()
        self._server = await asyncio.start_server(self._accept, *self.listen, reuse_address=True)
        self._spawn(self._watch())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def reload(self) -> bool:
        """Read the rules again if the file changed (or appeared, or went); whether it did."""
        try:
            st = os.stat(self.rules_path)
            signature: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            signature = None
        if signature == self._signature:
            return False
        self._signature = signature
        try:
            rules = Rules.load(self.rules_path)
        except (OSError, ValueError) as e:
            self.counters.rule_errors += 1
            self.counters.changed = True
            print(f"proxy: rules not changed: {e}", file=sys.stderr, flush=True)
            return False
        self.rules = rules
        self.ack_armed = rules.ack_cut is not None
        self.counters.rule_changes += 1
        self.counters.changed = True
        return True

    async def _watch(self) -> None:
        last_stats = 0.0
        while True:
            await asyncio.sleep(POLL)
            self.reload()
            if self.counters.changed and time.monotonic() - last_stats >= STATS_EVERY:
                self.write_stats()
                last_stats = time.monotonic()

    def write_stats(self) -> None:
        self.counters.changed = False
        tmp = self.stats_path.with_name(self.stats_path.name + ".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(self.counters.to_json()))
            tmp.replace(self.stats_path)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        source = str(peer[0]) if peer else "?"
        self._number += 1
        number = self._number
        self.counters.add(source, "connections")
        try:
            up = await asyncio.open_connection(*self.target)
        except OSError:
            self.counters.add(source, "resets")
            _reset(writer)
            return
        conn = _Connection(self, number, source, (reader, writer), up)
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close(abort=True)
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
        self.write_stats()


def _address(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise SystemExit(f"{what}: HOST:PORT, got {text!r}")
    return host, int(port)


async def _serve(proxy: Proxy) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await proxy.start()
    print(f"{PROXY_READY} {proxy.address}", flush=True)
    try:
        await stop.wait()
    finally:
        await proxy.close()
        print(json.dumps(proxy.counters.to_json()), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m flowbus.chaos.proxy", description="A flowbus proxy that strikes links."
    )
    parser.add_argument("--listen", required=True, help="IP:PORT to listen on (port 0: any free port)")
    parser.add_argument("--target", required=True, help="HOST:PORT of the broker")
    parser.add_argument(
        "--rules", required=True, type=Path, help="the JSON rules file (read when it changes)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random fates")
    args = parser.parse_args(argv)
    proxy = Proxy(
        _address(args.listen, "--listen"), _address(args.target, "--target"), args.rules, seed=args.seed
    )
    asyncio.run(_serve(proxy))


# ---------------------------------------------------------------------------- the campaign's side


BEHIND = "127.0.0.1:7001"
"""Where a proxied broker listens in its host."""

READY_WITHIN = 20.0
"""Seconds a starting proxy has to print its ready line."""


class Proxies:
    """One proxy per broker host of a campaign run (namespaces), their rules and counters.

    ``proxies.start(name)`` runs host ``name``'s proxy on ``IP:7000`` (before its broker),
    forwarding to ``127.0.0.1:7001``; :meth:`set_link` / :meth:`clear_link` change the rules
    of the proxies of both ends of a link, :meth:`set_ack_cut` / :meth:`clear_ack_cut` one
    proxy's; :meth:`close` stops them by process id; :meth:`stats` reads their counters."""

    def __init__(self, hosts: Hosts, *, root: Path, seed: int = 0) -> None:
        self.hosts = hosts
        self.dir = root / "proxy"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.seed = seed
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.links: dict[str, dict[str, dict[str, float]]] = {}  # proxy -> source IP -> rules
        self.cuts: dict[str, dict[str, str]] = {}  # proxy -> its ack_cut

    def rules_path(self, name: str) -> Path:
        return self.dir / f"{name}.rules.json"

    def stats_path(self, name: str) -> Path:
        return self.dir / f"{name}.rules.json.stats.json"

    def start(self, name: str) -> None:
        """Start host ``name``'s proxy; back once it listens."""
        if name in self.procs and self.procs[name].poll() is None:
            return
        self.links.setdefault(name, {})
        self._write(name)
        self.stats_path(name).unlink(missing_ok=True)
        listen = self.hosts.address(name)  # (the broker's address: it advertises it)
        argv = [sys.executable, "-m", "flowbus.chaos.proxy", "--listen", listen, "--target", BEHIND]
        argv += ["--rules", str(self.rules_path(name)), "--seed", str(self.seed * 1000 + len(self.procs))]
        with (self.dir / f"{name}.log").open("a") as log:
            proc = self.hosts.launch(name, argv, stdout=subprocess.PIPE, stderr=log)
        self.procs[name] = proc
        assert proc.stdout is not None
        with ThreadPoolExecutor(1) as pool:
            try:
                line = pool.submit(proc.stdout.readline).result(READY_WITHIN)
            except TimeoutError:
                proc.kill()  # (the reader then sees the end of the file)
                line = ""
        if not line.startswith(PROXY_READY):
            proc.kill()
            proc.wait()
            raise ExperimentError(f"the proxy of {name} did not start: see {self.dir / f'{name}.log'}")

    def _write(self, name: str) -> None:
        doc: dict[str, Any] = {"links": self.links.get(name, {})}
        if name in self.cuts:
            doc["ack_cut"] = self.cuts[name]
        path = self.rules_path(name)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(path)

    def set_link(self, a: str, b: str, rules: Mapping[str, float]) -> None:
        """Both directions of the link between brokers ``a`` and ``b`` under ``rules``."""
        for x, y in ((a, b), (b, a)):
            self.links.setdefault(x, {})[self.hosts.ip(y)] = dict(rules)
            self._write(x)

    def clear_link(self, a: str, b: str) -> None:
        for x, y in ((a, b), (b, a)):
            self.links.setdefault(x, {}).pop(self.hosts.ip(y), None)
            self._write(x)

    def set_ack_cut(self, broker: str, clients: str, when: str) -> None:
        """The clients' next connection to ``broker`` cut at a publish acknowledgement."""
        self.cuts[broker] = {"peer": self.hosts.ip(clients), "when": when}
        self._write(broker)

    def clear_ack_cut(self, broker: str) -> None:
        self.cuts.pop(broker, None)
        self._write(broker)

    def close(self) -> None:
        """Every proxy stopped, by its process id (``SIGTERM``: it writes its counters;
        killed if it does not end within 5 s)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                out, _ = proc.communicate(timeout=5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            if out:
                with (self.dir / f"{name}.log").open("a") as log:
                    log.write(out)

    def stats(self) -> dict[str, Any]:
        """Every proxy's counters summed (``by_proxy``: each one's)."""
        each: dict[str, dict[str, Any]] = {}
        for name in self.procs:
            with contextlib.suppress(OSError, ValueError):
                each[name] = json.loads(self.stats_path(name).read_text())
        total = {k: sum(int(s.get(k, 0)) for s in each.values()) for k in COUNTS}
        return {**total, "by_proxy": each}


if __name__ == "__main__":
    main()
