"""Brokers on loopback: one broker and a 3-broker ring, K subscriptions, events published as fast as
the publisher's window lets (``flowbus bench broker --json``; ``--out DIR`` adds a CSV and the
plot of :mod:`flowbus.bench.plot_broker`).

Measured for each (brokers, K), on fresh broker processes (``flowbus broker start``, a config
with one space ``bench``: ``symbol`` of 50 values, ``price``, ``quantity``, ``exchange`` of 5
values, ``level`` 0-9, and ``t``, the publisher's clock at publishing):

* ``subscribe_s`` -- K subscriptions (equality on ``symbol`` and ranges on 2-4 of the other
  attributes, seeded; an event matches about K / 500 of them: ``deliveries_per_event``), spread
  over ``clients`` subscriber connections (spread over the brokers), made in bulk
  (``subscribe_many``, ``subscribe_chunk`` a request, the connections' requests at once);
  ``routed_s`` -- that, and then until a probe event published at the publisher's broker reaches a
  sentinel subscription made last on each subscriber connection (the ring has routed them all).
* ``events_per_s_in`` -- N / (first publish .. ``flush()`` done). A publish is acknowledged when
  every matching subscriber's client took the event, so this is end-to-end throughput.
* ``deliveries_per_s`` -- deliveries / (first publish .. the last expected delivery).
* ``latency_p50_ms`` / ``latency_p99_ms`` -- receive ``time.time()`` minus the event's ``t``, over
  every delivery. Publishing as fast as possible keeps ``window`` publishes in flight, so by
  Little's law the latency is about ``window / events_per_s_in`` (``publish_window`` is in each
  row); ``rate`` paces the publisher instead.
* ``deliveries_match_offline`` -- every subscription got exactly the events its filter matches
  (counted offline with :class:`flowbus.matching.Matcher`, itself checked against
  ``Filter.matches`` on a sample of events).
* ``broker_kb_per_subscription`` -- how much the brokers' VmRSS grew (summed: the ring's
  backup copies count) from before subscribing to when every subscription is routed, per
  subscription (the filters' text included).
* ``broker_rss_mb`` / ``broker_hwm_mb`` -- VmRSS / VmHWM of the broker processes at the end
  (the largest); ``broker_cpu_s`` / ``client_cpu_s`` -- CPU time of the brokers (summed) and of
  the client process while publishing; ``other_cpu_s`` -- what the rest of the machine used
  meanwhile (other processes compete for the same cores: a busy machine skews the figures).
* In a ring, ``ring_after_subscribe`` / ``ring_after_publish`` -- the peers each broker names
  in its ``Welcome`` to a fresh connection; ``ring_intact``: every broker names all the others.

With ``tls``, a development authority is made for the run (:mod:`flowbus.net.certs`): the
brokers serve their clients in TLS and link to each other in mutual TLS, the clients connect
in TLS (each row says ``tls``); the ratio to a plain run is the cost of TLS.

The publisher and every subscriber run in this process, on one asyncio event loop (on a
2-core machine, the brokers get the rest). Generating events and filters and the offline count
are not timed. A row whose run fails carries ``error`` (the traceback) and the sweep goes on.

With ``protocol="stomp"`` (``--protocol stomp``) the clients are not flowbus's: each broker
also serves STOMP (``--stomp 127.0.0.1:0``), and the rows are measured by the stomp.py program
that measures the ActiveMQ baseline (:mod:`flowbus.bench.stomp_clients`), with the same JMS
selectors (:func:`~flowbus.bench.activemq.jms_selector`), the same connections, layout,
receipts and end of the run; only the address and how an event rides differ (a JSON body
here, headers there). Subscriber connection ``c`` is at broker ``c % brokers``'s door, the
publisher at the first's, as in a native row. So with ``--baseline activemq`` the ratio is
broker against broker through one client. Each row says its ``protocol``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import platform
import select
import ssl
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flowbus.bench.workloads import STOCK_PROBE_EVENT, STOCK_PROBE_FILTER, stock_events, stock_filters
from flowbus.broker.config import parse_address
from flowbus.broker.process import start_process, stomp_of, wait_ready
from flowbus.client import Client, Subscription, connect
from flowbus.client import protocol as p
from flowbus.errors import ExternalError, UserError
from flowbus.experiments.cpu import machine_busy_s, process_cpu_s
from flowbus.filters import parse
from flowbus.matching import Matcher
from flowbus.net import certs
from flowbus.net.codec import FrameDecoder, decode, encode, frame
from flowbus.net.tls import client_context

Progress = Callable[[str, int, int], None]

SPACE = "bench"
SCHEMA = {
    "symbol": "str",
    "price": "float",
    "quantity": "int",
    "exchange": "str",
    "level": "int",
    "t": "float",
}

REFERENCE = {
    "system": "ActiveMQ 5.17, same kind of selectors, this machine (the issue)",
    "events_per_s_in": {"1000": [11_800, 17_700], "10000": [699]},
}
GOAL = {"subscriptions": 10_000, "events_per_s_in": 20_000, "latency_p99_ms": 50.0}


# ------------------------------------------------------------------------------------ workload


make_events = stock_events  # (events without ``t``: the publisher stamps it)
make_filters = stock_filters


def offline_counts(
    filters: Sequence[str], events: Sequence[dict[str, Any]], sample: int = 200
) -> tuple[np.ndarray, bool]:
    """How many of ``events`` each filter matches (Matcher), and whether Matcher agrees with
    ``Filter.matches`` on the first ``sample`` events (fewer for many filters)."""
    m = Matcher()
    parsed = [parse(f) for f in filters]
    m.add_many(list(enumerate(parsed)))
    counts = np.zeros(len(filters), np.int64)
    for i in range(0, len(events), 5_000):
        ids = m.match_batch(list(events[i : i + 5_000]))
        flat = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        counts += np.bincount(flat.astype(np.int64), minlength=len(filters))
    head = list(events[: max(2, min(sample, 2_000_000 // max(1, len(filters))))])
    got = [sorted(r.tolist()) for r in m.match_batch(head)]
    want = [[i for i, f in enumerate(parsed) if f.matches(e)] for e in head]
    return counts, got == want


# ------------------------------------------------------------------------------------ brokers


def _proc_status(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of ``pid`` in MB."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out


def _start(
    listen: str, join: list[str], config: Path, profile: Path | None, tls: tuple[Path, str] | None = None,
    stomp: str | None = None,
) -> subprocess.Popen[str]:  # fmt: skip
    if profile is None:
        pki, name = tls if tls is not None else (None, None)
        return start_process(listen, join=join, config=config, tls=pki, tls_name=name, stomp=stomp)
    cmd = [sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "flowbus", "broker", "start"]
    cmd += ["--listen", listen, "--config", str(config)]
    if tls is not None:
        cmd += ["--tls", str(tls[0]), "--tls-name", tls[1]]
    if stomp is not None:
        cmd += ["--stomp", stomp]
    for j in join:
        cmd += ["--join", j]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def _ready(proc: subprocess.Popen[str], timeout: float = 60.0) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise ExternalError(f"broker process {proc.pid} not ready after {timeout} s")
    return wait_ready(proc)


@dataclass
class Ring:
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    pki: Path | None = None  # a certs init directory: TLS (brokers broker-1, broker-2...)
    stomps: list[str] = field(default_factory=list)  # their STOMP doors (start_ring(stomp=True))

    def client_tls(self) -> ssl.SSLContext | None:
        return client_context(self.pki) if self.pki is not None else None

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start_ring(
    n: int, config: Path, profile_dir: Path | None = None, tag: str = "", ring: Ring | None = None,
    stomp: bool = False,
) -> Ring:  # fmt: skip
    """``n`` broker processes on 127.0.0.1 (free ports), the others joining the first, in ``ring``
    (or a new one); with ``stomp``, each with a STOMP door on 127.0.0.1 too (``ring.stomps``).
    The caller stops them (``Ring.stop``), also when this raises: give a ``ring`` to hold what
    started by then."""
    ring = Ring() if ring is None else ring
    for i in range(n):
        prof = profile_dir / f"broker{tag}-{i + 1}.prof" if profile_dir is not None else None
        tls = (ring.pki, certs.broker_name(i + 1)) if ring.pki is not None else None
        proc = _start("127.0.0.1:0", ring.addresses[:1], config, prof, tls, "127.0.0.1:0" if stomp else None)
        ring.procs.append(proc)
        ring.addresses.append(_ready(proc))
        if stomp:
            door = stomp_of(proc)
            if door is None:
                raise ExternalError(f"broker process {proc.pid} started with --stomp names no STOMP door")
            ring.stomps.append(door)
    if n > 1:
        time.sleep(1.0)  # let the ring settle
    return ring


def write_config(directory: Path, **limits: float | None) -> Path:
    """The brokers' YAML: the ``bench`` space, and the limits given (``window``, ``memory``,
    ``heartbeat``...; None: the broker's default)."""
    lines = ["spaces:", f"  {SPACE}: {{{', '.join(f'{k}: {v}' for k, v in SCHEMA.items())}}}"]
    lines += [f"{key}: {value}" for key, value in limits.items() if value is not None]
    path = directory / "broker.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------------------------------ clients


def hold_gc() -> None:
    """The measuring client's collector off while it measures (:func:`release_gc` after):
    what it held before is frozen, and what it takes in (every delivery, in the flow bench
    hundreds of thousands of events kept for the check) is not walked again and again, in
    pauses that would read as the brokers' latency."""
    gc.collect()
    gc.freeze()
    gc.disable()


def release_gc() -> None:
    gc.enable()
    gc.unfreeze()


class _Tally:
    def __init__(self, k: int, expected: int) -> None:
        self.counts = np.zeros(k, np.int64)
        self.latency = array("d")
        self.total = 0
        self.expected = expected
        self.last = 0.0  # perf_counter of the latest delivery
        self.done = asyncio.Event()
        if expected == 0:
            self.done.set()


async def _consume(conn: Client, index: dict[str, int], tally: _Tally) -> None:
    """Take the events of ``conn``'s (merged) subscriptions as they come, all that have come
    at each wake-up; ``index``: a subscription's number among the filters."""
    lat, counts = tally.latency, tally.counts
    async for batch in conn.merged():
        now = time.time()
        lat.extend([now - event["t"] for _, event in batch])
        np.add.at(counts, [index[sub.id] for sub, _ in batch], 1)
        tally.total += len(batch)
        tally.last = time.perf_counter()
        if tally.total >= tally.expected:
            tally.done.set()


async def _sentinel(sub: Subscription, seen: asyncio.Event) -> None:
    async for _ in sub:
        seen.set()


async def ring_view(
    addresses: Sequence[str], timeout: float = 10.0, tls: ssl.SSLContext | None = None
) -> dict[str, list[str] | str]:
    """The peers each broker names in its ``Welcome`` (its live ring links), from a fresh
    connection: in a healthy ring of n brokers each names the n - 1 others."""

    async def one(address: str) -> list[str] | str:
        host, _, port = address.rpartition(":")
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port), ssl=tls), timeout
            )
        except (TimeoutError, OSError) as e:
            return f"unreachable: {e!r}"
        try:
            writer.write(frame(encode(p.Hello(f"bench-ring-view-{uuid.uuid4().hex[:8]}"))))
            frames = FrameDecoder()
            while True:
                data = await asyncio.wait_for(reader.read(1 << 16), timeout)
                if not data:
                    return "closed"
                bodies = frames.feed(data)
                if bodies:
                    msg = decode(bodies[0])
                    if not isinstance(msg, p.Welcome):
                        return f"unexpected {type(msg).__name__}"
                    writer.write(frame(encode(p.Bye())))
                    return sorted(msg.peers)
        except TimeoutError:
            return f"no Welcome in {timeout} s (busy?)"
        finally:
            writer.close()

    views = await asyncio.gather(*(one(a) for a in addresses))
    return dict(zip(addresses, views, strict=True))


def _ring_ok(view: dict[str, list[str] | str]) -> bool:
    return all(isinstance(v, list) and len(v) == len(view) - 1 for v in view.values())


def _stop(ring: Ring, row: dict[str, Any]) -> None:
    """The brokers' memory into ``row`` (VmRSS, VmHWM: the largest), then the brokers stopped."""
    status = [_proc_status(proc.pid) for proc in ring.procs]
    row["broker_rss_mb"] = max((s["VmRSS"] for s in status if "VmRSS" in s), default=None)
    row["broker_hwm_mb"] = max((s["VmHWM"] for s in status if "VmHWM" in s), default=None)
    ring.stop()


async def _clients_run(
    ring: Ring, row: dict[str, Any], filters: list[str], events: list[dict[str, Any]],
    expected: np.ndarray, *, clients: int, window: int, rate: float, chunk: int, subscribe_timeout: float,
    progress: Progress | None, label: str,
) -> None:  # fmt: skip
    """Fill ``row`` in as the run goes (what was measured stays there if a later step fails);
    stop the brokers before the clients close (a client's ``Bye`` would have its broker remove
    all of its subscriptions: not measured, and slow)."""
    addresses = ring.addresses
    k = len(filters)
    tally = _Tally(k, int(expected.sum()))
    tasks: list[asyncio.Task[None]] = []
    conns: list[Client] = []
    multi = len(addresses) > 1
    try:
        tls = ring.client_tls()
        subs = [
            connect(addresses[c % len(addresses)], name=f"bench-sub-{c}", tls=tls) for c in range(clients)
        ]
        pub = connect(addresses[0], name="bench-pub", window=window, tls=tls)
        conns = [*subs, pub]
        await asyncio.gather(*(c.open() for c in conns))

        # -- subscribe, pipelined
        idle = [_proc_status(proc.pid).get("VmRSS", 0.0) for proc in ring.procs]
        index: dict[str, int] = {}
        tasks.extend(asyncio.create_task(_consume(c, index, tally)) for c in subs)

        async def subscribe_all() -> None:
            for lo in range(0, k, chunk * clients):  # (each connection's in bulk, a chunk a request)
                mine = [range(lo + c, min(k, lo + chunk * clients), clients) for c in range(clients)]
                got = await asyncio.gather(
                    *(
                        subs[c].subscribe_many(SPACE, [filters[i] for i in idx], merged=True, batch=chunk)
                        for c, idx in enumerate(mine)
                        if idx
                    )
                )
                for made, idx in zip(got, [i for i in mine if i], strict=True):
                    index.update((s.id, i) for s, i in zip(made, idx, strict=True))
                if progress:
                    progress(f"{label}: subscribe", min(k, lo + chunk * clients), k)

        t0 = time.perf_counter()
        try:
            await asyncio.wait_for(subscribe_all(), subscribe_timeout)
        except TimeoutError:
            row["subscribed"] = len(index)
            raise ExternalError(
                f"subscribing: only {len(index):,} of {k:,} subscriptions done in {subscribe_timeout:.0f} s"
            ) from None
        row["subscribe_s"] = time.perf_counter() - t0
        # -- until the publisher's broker routes to every subscriber connection
        seen = [asyncio.Event() for _ in subs]
        for c, seen_ev in zip(subs, seen, strict=True):
            s = await c.subscribe(SPACE, STOCK_PROBE_FILTER)
            tasks.append(asyncio.create_task(_sentinel(s, seen_ev)))
        t1 = time.perf_counter()
        while not all(e.is_set() for e in seen):
            if time.perf_counter() - t1 > 120:
                missing = [subs[i].broker for i, e in enumerate(seen) if not e.is_set()]
                view = await ring_view(addresses, tls=tls) if multi else {}
                row["ring_after_subscribe"] = view
                row["ring_intact"] = _ring_ok(view)
                raise ExternalError(
                    f"subscriptions at {sorted(set(map(str, missing)))} not routed to the publisher's broker "
                    f"{addresses[0]} after 120 s; the brokers' ring links: {view}"
                )
            await pub.publish(SPACE, {**STOCK_PROBE_EVENT, "t": time.time()})
            await pub.flush(120)
            await asyncio.sleep(0.02)
        row["routed_s"] = time.perf_counter() - t0
        grown = [
            _proc_status(proc.pid).get("VmRSS", 0.0) - before
            for proc, before in zip(ring.procs, idle, strict=True)
        ]
        row["broker_kb_per_subscription"] = sum(grown) * 1024 / k  # (all brokers' growth: backups counted)
        if multi:
            row["ring_after_subscribe"] = view = await ring_view(addresses, tls=tls)
            row["ring_intact"] = _ring_ok(view)

        # -- publish
        hold_gc()
        cpu0 = time.process_time()
        bcpu0 = [process_cpu_s(proc.pid) for proc in ring.procs]
        busy0 = machine_busy_s()
        row["loadavg_before_publish"] = os.getloadavg()[0]
        t0 = time.perf_counter()
        for n, base in enumerate(events, 1):
            if rate:
                ahead = t0 + n / rate - time.perf_counter()
                if ahead > 0.001:
                    await asyncio.sleep(ahead)
            ev = dict(base)
            ev["t"] = time.time()
            await pub.publish(SPACE, ev)
            if progress and n % 1000 == 0:
                progress(f"{label}: publish", n, len(events))
        await pub.flush(max(120.0, len(events) / 50))
        t_in = time.perf_counter() - t0
        row["client_cpu_s"] = time.process_time() - cpu0
        row["broker_cpu_s"] = sum(
            process_cpu_s(proc.pid) - c for proc, c in zip(ring.procs, bcpu0, strict=True)
        )
        row["other_cpu_s"] = max(0.0, machine_busy_s() - busy0 - row["broker_cpu_s"] - row["client_cpu_s"])
        # every delivery was taken before its publish was acknowledged (unless spilled to disk):
        # wait for stragglers only while they keep coming
        while not tally.done.is_set():
            before = tally.total
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(tally.done.wait(), 3.0)
            if tally.total == before:
                break
        t_out = (tally.last - t0) if tally.total else float("nan")
        release_gc()
        lat_ms = np.frombuffer(tally.latency, dtype=np.float64) * 1000.0 if tally.total else np.zeros(1)
        row.update(
            publish_s=t_in,
            events_per_s_in=len(events) / t_in,
            deliveries=tally.total,
            deliveries_per_s=tally.total / t_out if tally.total else 0.0,
            latency_p50_ms=float(np.percentile(lat_ms, 50)),
            latency_p99_ms=float(np.percentile(lat_ms, 99)),
            latency_max_ms=float(lat_ms.max()),
            deliveries_match_offline=bool(np.array_equal(tally.counts, expected)),
        )
        if multi:
            row["ring_after_publish"] = view = await ring_view(addresses, tls=tls)
            row["ring_intact"] = _ring_ok(view)
    finally:
        release_gc()
        _stop(ring, row)
        for c in conns:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.close(), 10)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _stomp_clients_run(
    ring: Ring, row: dict[str, Any], filters: list[str], events: list[dict[str, Any]], expected: np.ndarray,
    *, clients: int, subscribe_timeout: float, progress: Progress | None, label: str,
) -> None:  # fmt: skip
    """``--protocol stomp``: the stomp.py program of the ActiveMQ baseline
    (:func:`flowbus.bench.stomp_clients.run`) at the brokers' STOMP doors, with the same JMS
    selectors, the events as JSON bodies (:data:`~flowbus.bench.stomp_clients.JSON_BODY`) into
    the space's topic. As :func:`_clients_run`, the brokers stop before the clients close."""
    from flowbus.bench import stomp_clients
    from flowbus.bench.activemq import jms_selector

    def ending() -> None:
        if len(ring.addresses) > 1:
            row["ring_after_publish"] = view = asyncio.run(ring_view(ring.addresses))
            row["ring_intact"] = _ring_ok(view)
        _stop(ring, row)

    target = stomp_clients.Target(
        label, [parse_address(door) for door in ring.stomps], f"/topic/{SPACE}", stomp_clients.JSON_BODY,
        [proc.pid for proc in ring.procs], cpu_field="broker_cpu_s", ending=ending,
    )  # fmt: skip
    selectors = [jms_selector(f) for f in filters]
    stomp_clients.run(
        target, selectors, jms_selector(STOCK_PROBE_FILTER), events, expected, row, clients=clients,
        progress=progress, subscribe_timeout=subscribe_timeout,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------- run


def _row(
    brokers: int, filters: list[str], events: list[dict[str, Any]], expected: np.ndarray, config: Path, *,
    clients: int, window: int, rate: float, chunk: int, subscribe_timeout: float, progress: Progress | None,
    profile_dir: Path | None, pki: Path | None = None, protocol: str = "native",
) -> dict[str, Any]:  # fmt: skip
    k = len(filters)
    stomp = protocol == "stomp"
    row: dict[str, Any] = {
        "brokers": brokers,
        "subscriptions": k,
        "events": len(events),
        "protocol": protocol,
        "deliveries_expected": int(expected.sum()),
        "deliveries_per_event": float(expected.sum()) / max(1, len(events)),
        "publish_window": None if stomp else window,  # (STOMP has none: TCP paces the publisher)
        "rate": rate or None,
        "tls": pki is not None,
    }
    label = f"{brokers} broker(s), K={k:,}" + (", STOMP" if stomp else "")
    ring = Ring(pki=pki)
    try:
        start_ring(brokers, config, profile_dir, tag=f"-b{brokers}-k{k}", ring=ring, stomp=stomp)
        if stomp:
            _stomp_clients_run(
                ring, row, filters, events, expected, clients=clients, subscribe_timeout=subscribe_timeout,
                progress=progress, label=label,
            )  # fmt: skip
        else:
            asyncio.run(
                _clients_run(
                    ring, row, filters, events, expected, clients=clients, window=window, rate=rate,
                    chunk=chunk, subscribe_timeout=subscribe_timeout, progress=progress, label=label,
                )
            )  # fmt: skip
    except Exception:
        row["error"] = traceback.format_exc()
        row["deliveries_match_offline"] = False
    finally:
        ring.stop()
    return row


def run(
    *,
    brokers: Sequence[int] = (1, 3),
    subscriptions: Sequence[int] = (10, 1_000, 10_000, 100_000),
    events: int = 20_000,
    seed: int = 1,
    clients: int = 4,
    window: int | None = None,
    rate: float = 0.0,
    broker_window: int | None = None,
    broker_memory: int | None = None,
    broker_heartbeat: float | None = None,
    max_ring_subscriptions: int = 10_000,
    subscribe_chunk: int = 2_000,
    subscribe_timeout: float = 900.0,
    profile_dir: Path | None = None,
    progress: Progress | None = None,
    tls: bool = False,
    baseline: str | None = None,
    protocol: str = "native",
) -> dict[str, Any]:
    """The sweep over ``brokers`` x ``subscriptions`` (see the module note).

    ``window``: the publisher's window of unacknowledged publishes (None: :data:`WINDOW`);
    ``rate``: events/s to pace the publisher at (0: as fast as the window lets);
    ``broker_window`` / ``broker_memory`` / ``broker_heartbeat``: the brokers' settings (None:
    their defaults); rings of more than one broker run only up to ``max_ring_subscriptions``
    (the others are rows with ``skipped``); a row whose subscribing takes longer than
    ``subscribe_timeout`` seconds ends with an error; ``profile_dir``: run each broker under
    cProfile, writing ``broker-b<B>-k<K>-<i>.prof`` there; ``tls``: brokers and clients in
    (mutual) TLS;
    ``baseline``: one of ``BASELINES``, run on the same workload after each K's rows, beside them
    (:mod:`flowbus.bench.activemq`); ``protocol``: one of ``PROTOCOLS``, how the clients reach the
    brokers (``stomp``: the baseline's stomp.py program at each broker's STOMP door, see
    :func:`_stomp_clients_run`; it takes no ``window``, ``rate`` nor ``tls``). A
    :class:`UserError` for an unknown name or a combination that cannot run."""
    _check_protocol(protocol, window=window, rate=rate, tls=tls)
    add_baseline = _baseline(baseline)
    stomp = protocol == "stomp"
    evs = make_events(events, seed)
    rows = []
    total = len(subscriptions) * len(brokers)
    with tempfile.TemporaryDirectory(prefix="flowbus-bench-") as tmp:
        config = write_config(
            Path(tmp), window=broker_window, memory=broker_memory, heartbeat=broker_heartbeat
        )
        pki = Path(tmp) / "pki" if tls else None
        if pki is not None:
            certs.init(pki, brokers=max(brokers))
        for k in subscriptions:
            filters = make_filters(k, seed + k)
            t = time.perf_counter()
            expected, agrees = offline_counts(filters, evs)
            offline_s = time.perf_counter() - t
            for b in brokers:
                if b > 1 and k > max_ring_subscriptions:
                    row: dict[str, Any] = {
                        "brokers": b,
                        "subscriptions": k,
                        "events": events,
                        "protocol": protocol,
                        "skipped": f"rings run up to {max_ring_subscriptions:,} subscriptions "
                        "(max_ring_subscriptions / --max-ring-subscriptions)",
                    }
                else:
                    row = _row(
                        b, filters, evs, expected, config, clients=clients,
                        window=WINDOW if window is None else window, rate=rate, chunk=subscribe_chunk,
                        subscribe_timeout=subscribe_timeout, progress=progress, profile_dir=profile_dir,
                        pki=pki, protocol=protocol,
                    )  # fmt: skip
                    row["offline_matcher_agrees_with_filter_matches"] = agrees
                    row["offline_s"] = offline_s
                rows.append(row)
                if progress:
                    progress("rows", len(rows), total)
            if add_baseline is not None:
                add_baseline(
                    rows[-len(brokers) :], filters, evs, expected, clients=clients, progress=progress
                )
    return {
        "benchmark": "broker",
        "rows": rows,
        "reference": REFERENCE,
        "goal": GOAL,
        "protocol": protocol,
        "clients": STOMP_CLIENTS if stomp else "one process, one event loop",
        "subscriber_connections": clients,
        "publisher": "one connection, to the first broker" + ("'s STOMP door" if stomp else ""),
        "broker_config": {
            "window": broker_window,
            "memory": broker_memory,
            "heartbeat": broker_heartbeat,
            "note": "None: the broker's default",
        },
        "seed": seed,
        "baseline": baseline,
        "machine": {
            "cpu_count": os.cpu_count(),
            "cpu": _cpu_model(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
    }


WINDOW = 10_000
"""The native publisher's window when none is given."""

PROTOCOLS = ("native", "stomp")
STOMP_CLIENTS = "one process, stomp.py: a thread per connection (the program of --baseline activemq)"
_STOMP_HAS_NO = {
    "window": "STOMP has no publish window: TCP's backpressure paces the publisher",
    "rate": "its publisher sends flat out, as the ActiveMQ baseline's does",
    "tls": "its clients connect in plain text, as the ActiveMQ baseline's do",
}


def _check_protocol(protocol: str, *, window: int | None, rate: float, tls: bool) -> None:
    """A :class:`UserError` for an unknown protocol, an option ``stomp`` has no use for (its
    clients are the ActiveMQ baseline's program), or a missing ``bench`` extra."""
    if protocol not in PROTOCOLS:
        raise UserError(f"unknown protocol {protocol!r} (expected one of {', '.join(PROTOCOLS)})")
    if protocol != "stomp":
        return
    given = {"window": window is not None, "rate": bool(rate), "tls": tls}
    if refused := [f"--{name} ({why})" for name, why in _STOMP_HAS_NO.items() if given[name]]:
        raise UserError(f"--protocol stomp takes no {'; no '.join(refused)}")
    try:
        from flowbus.bench import stomp_clients  # noqa: F401
    except ImportError as exc:
        raise UserError(f"--protocol stomp needs pip install 'flowbus[bench]' ({exc})") from None


BASELINES = ("activemq",)


def _baseline(name: str | None) -> Callable[..., None] | None:
    """What runs the baseline ``name`` on a K's workload and adds its columns to the K's rows (None:
    no baseline); a :class:`UserError` for an unknown name or a missing ``bench`` extra."""
    if name is None:
        return None
    if name not in BASELINES:
        raise UserError(f"unknown baseline {name!r} (expected one of {', '.join(BASELINES)})")
    try:
        from flowbus.bench import activemq
    except ImportError as exc:
        raise UserError(f"--baseline {name} needs pip install 'flowbus[bench]' ({exc})") from None
    activemq.ensure_installed()
    return activemq.add_to_rows


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return None


# --------------------------------------------------------------------------------------- table

COLUMNS = [
    ("brokers", "B", "{}"),
    ("protocol", "protocol", "{}"),
    ("subscriptions", "K", "{:,}"),
    ("events", "N", "{:,}"),
    ("subscribe_s", "subscribe s", "{:.1f}"),
    ("events_per_s_in", "events/s in", "{:,.0f}"),
    ("deliveries", "deliveries", "{:,}"),
    ("deliveries_per_s", "deliv/s out", "{:,.0f}"),
    ("latency_p50_ms", "p50 ms", "{:.1f}"),
    ("latency_p99_ms", "p99 ms", "{:.1f}"),
    ("broker_rss_mb", "RSS MB", "{:.0f}"),
    ("broker_hwm_mb", "HWM MB", "{:.0f}"),
    ("broker_kb_per_subscription", "KB/sub", "{:.1f}"),
    ("broker_cpu_s", "broker CPU s", "{:.1f}"),
    ("client_cpu_s", "client CPU s", "{:.1f}"),
    ("other_cpu_s", "other CPU s", "{:.1f}"),
    ("deliveries_match_offline", "ok", "{}"),
]


def markdown_rows(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> list[str]:
    """``rows`` as the lines of a Markdown table: one column per ``(key, header, format)``
    (a missing value: ``-``)."""
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = ["-" if r.get(key) is None else fmt.format(r[key]) for key, _, fmt in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


BASELINE_COLUMNS = [
    ("activemq_events_per_s_in", "ActiveMQ events/s in", "{:,.0f}"),
    ("ratio_to_activemq", "ratio", "{:.2f}"),
]


def table(result: dict[str, Any]) -> str:
    """The rows as a Markdown table (with the baseline's columns when it ran)."""
    beside = any("activemq_events_per_s_in" in r for r in result["rows"])
    lines = markdown_rows(result["rows"], COLUMNS + BASELINE_COLUMNS if beside else COLUMNS)
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"\nB={r['brokers']} K={r['subscriptions']}: {r['error']}")
        elif "skipped" in r:
            lines.append(f"\nB={r['brokers']} K={r['subscriptions']}: skipped: {r['skipped']}")
    return "\n".join(lines)
