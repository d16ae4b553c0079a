"""A fault campaign: runs of (mix, seed), each on a fresh ring of real brokers, checked offline.

How it works (:func:`run_one`):

1. The hosts (:mod:`flowbus.chaos.hosts`: network namespaces as root, else loopback), the
   brokers (:mod:`flowbus.chaos.brokers`), started one after the other into one ring. If
   the mix has faults of links (:func:`flowbus.chaos.nemesis.proxied`), each broker host
   first gets its proxy (:mod:`flowbus.chaos.proxy`), and its broker runs behind it.
2. The schedule of the run's faults (:func:`flowbus.chaos.nemesis.schedule`, from the mix
   and the seed), and the workload (:mod:`flowbus.chaos.workload`) in the clients' host,
   publishing until some seconds after the last heal.
3. Once the workload is ready, each fault is made at its time and healed at its end
   (:class:`~flowbus.chaos.nemesis.Nemesis`); meanwhile every broker's console is polled
   each second for the durable subscriptions it serves (``states.jsonl``).
4. The workload ends by itself (its publishes acknowledged or refused, its subscriptions
   quiet), the brokers and then the proxies are stopped by process id; what their stores
   still queue is read (``queued.csv``), and the hosts removed, whatever happened.
5. :func:`flowbus.chaos.check.check_run` gives the run's row (with the proxies' counters
   summed in ``proxy``, if it had proxies: frames forwarded, dropped, losses
   retransmitted, duplicated, reordered, delayed, connections cut); its timeline goes to ``timeline.csv`` and
   ``timeline.png`` with the faults drawn as bands.

:func:`run_campaign` runs each mix with each seed, and sums the rows
(:func:`flowbus.chaos.report.summarize`, and the proxies' counters, ``proxy``, if runs had them): the JSON
document ``flowbus chaos run --json`` prints.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from flowbus.chaos.brokers import Brokers
from flowbus.chaos.check import check_run, timeline
from flowbus.chaos.hosts import Hosts, can_isolate, open_hosts
from flowbus.chaos.nemesis import Fault, Mix, Nemesis, check_mixes, proxied, schedule
from flowbus.chaos.proxy import COUNTS, Proxies
from flowbus.chaos.report import TOTALS, summarize
from flowbus.chaos.workload import COUNT_FILTERS, FLOW, FLOW_FILTERS, Client, Spec, SubSpec, filters_for
from flowbus.errors import ExperimentError
from flowbus.experiments.cpu import process_cpu_s

__all__ = ["Campaign", "run_campaign", "run_one", "source_commit"]


FLOW_RATE = 50.0
"""Events a second the flow's publisher sends into the campaign flow's source space."""

CLIENT = {"idle_timeout": 5.0, "publish_timeout": 30.0}
"""The workload's client options: a silent broker is left after 5 s, and a publish not
acknowledged in 30 s is given up (reported as refused, with its reason: none hangs)."""


@dataclass(frozen=True)
class Campaign:
    """A campaign's settings (``flowbus chaos run``'s options)."""

    out: Path
    mixes: tuple[str, ...] = ("short",)
    seeds: tuple[int, ...] = (1,)  # the seeds each mix runs with
    overlay: str = "chordal-ring"
    brokers: int = 5
    publishers: int = 2
    rate: float = 150.0
    subscribers: int = 5
    subscriptions: int = 40
    heartbeat: float = 1.0
    tail: float = 12.0  # seconds of publishing after the last heal
    isolate: bool | None = None  # None: namespaces if possible
    sync: str = "full"  # the brokers' store syncing (a power loss costs what it did not sync)
    flow: bool = True  # the campaign's flow deployed and under fire (the chordal ring only)
    state: bool = False  # subscriptions downstream of the flow's state too (see _workload)
    trace: bool = False  # each broker's messages traced (traces/NAME.jsonl: flowbus.net.trace)

    def __post_init__(self) -> None:
        if self.overlay not in ("chordal-ring", "pastry-irbr"):
            raise ExperimentError(f"--overlay: chordal-ring or pastry-irbr, got {self.overlay!r}")
        if not 3 <= self.brokers <= 12:
            raise ExperimentError(f"--brokers: 3 to 12, got {self.brokers}")
        if not self.seeds or min(self.seeds) < 1 or len(set(self.seeds)) != len(self.seeds):
            raise ExperimentError(f"--seeds: distinct seeds >= 1, got {list(self.seeds)}")
        if not 20 <= self.subscriptions <= 100 or self.subscribers < 1:
            raise ExperimentError("20 to 100 subscriptions, >= 1 subscriber")
        if self.sync not in ("full", "normal"):
            raise ExperimentError(f"--sync: full or normal, got {self.sync!r}")

    @property
    def detect(self) -> float:
        """About how long the brokers take to find a broker dead (heartbeats and a probe)."""
        return 5.0 * self.heartbeat


def _config(path: Path, c: Campaign) -> Path:
    path.write_text(f"heartbeat: {c.heartbeat}\nsync: {c.sync}\n")
    return path


def _workload(c: Campaign, brokers: list[str], out: Path, publish_for: float, seed: int) -> Spec:
    """The run's clients. On the chordal ring (the overlay that runs flows), the campaign's
    flow too: a publisher into its source space, and per subscriber client one subscription
    of its stateless derived space (``big``); with ``state``, one downstream of its state
    (``counted``) too. (Off by default: a subscriber of ``counted`` that moves to another
    broker is caught up by the shortest sequence from what that broker last knew it had
    seen, which skips changes by design and, that knowledge lagging, gives it again the
    latest ones it had: 29 duplicates in the short campaign; open.)"""
    filters = filters_for(c.subscriptions, seed)
    per = -(-c.subscriptions // c.subscribers)
    flow = c.flow and c.overlay == "chordal-ring"
    subscribers = tuple(
        Client(
            f"sub{i}",
            i % c.brokers,
            tuple(
                SubSpec(f"d{i}-{j}", filters[i * per + j]) for j in range(min(per, c.subscriptions - i * per))
            )
            + (
                (SubSpec(f"f{i}", FLOW_FILTERS[i % len(FLOW_FILTERS)], "big"),)
                + ((SubSpec(f"c{i}", COUNT_FILTERS[i % len(COUNT_FILTERS)], "counted"),) if c.state else ())
                if flow
                else ()
            ),
        )
        for i in range(c.subscribers)
    )
    publishers = tuple(Client(f"pub{i}", (2 * i + 1) % c.brokers) for i in range(c.publishers))
    if flow:
        publishers += (Client("fpub", (2 * c.publishers + 1) % c.brokers, space="trades", rate=FLOW_RATE),)
    return Spec(
        brokers=tuple(brokers),
        publishers=publishers,
        subscribers=subscribers,
        out=str(out),
        rate=c.rate,
        publish_for=publish_for,
        settle=max(30.0, 4 * c.detect),
        client=dict(CLIENT),
        flow=FLOW if flow else "",
    )


class _FlowOps:
    """Deploys and undeploys flows for the nemesis (``redeploy``), as a client of the
    brokers from the campaign's process: through one broker first, the others after it."""

    def __init__(self, brokers: Brokers, names: Sequence[str]) -> None:
        self.brokers = brokers
        self.names = list(names)

    def _run(self, broker: str, call: Callable[[Any], Any]) -> str | None:
        import asyncio

        from flowbus.client import connect
        from flowbus.errors import FlowbusError

        i = self.names.index(broker)
        first = [self.brokers.address(n) for n in self.names[i:] + self.names[:i]]

        async def main() -> None:
            async with connect(*first, name="nemesis", idle_timeout=5.0, publish_timeout=30.0) as client:
                await asyncio.wait_for(call(client), 30.0)

        try:
            asyncio.run(main())
        except (FlowbusError, OSError, TimeoutError) as e:
            return f"{type(e).__name__}: {e}"
        return None

    def deploy(self, broker: str, text: str) -> str | None:
        return self._run(broker, lambda client: client.deploy(text))

    def undeploy(self, broker: str, name: str) -> str | None:
        return self._run(broker, lambda client: client.undeploy(name))


class _Poller(threading.Thread):
    """Polls every broker's console each second: the durable subscriptions each serves (a
    broker without its ring lease serves none: it refuses clients), and the flows it has;
    which brokers answered, and each broker process's CPU seconds so far (``cpu``: a
    broker that neither answers nor gains CPU time is paused or starved, one that gains a
    second a second and does not answer is busy)."""

    def __init__(self, brokers: Brokers, path: Path) -> None:
        super().__init__(daemon=True)
        self.brokers = brokers
        self.path = path
        self.done = threading.Event()

    def run(self) -> None:
        with self.path.open("a") as f:
            while not self.done.wait(1.0):
                served, rings, flows, answered, cpu = {}, {}, {}, [], {}
                for name in list(self.brokers.up):
                    pid = self.brokers.pid(name)
                    if pid is not None and not math.isnan(seconds := round(process_cpu_s(pid), 2)):
                        cpu[name] = seconds
                    state = self.brokers.poll(name)
                    if state is not None:
                        answered.append(name)
                    if state is None or not state["broker"].get("serving", True):
                        continue  # (paused, gone, or without its lease: serving no client)
                    served[name] = [
                        s["id"] for sp in state["spaces"] for s in sp["subscriptions"] if s["durable"]
                    ]
                    flows[name] = sorted(state["broker"].get("flows", []))
                    ring = state.get("ring", {})
                    rings[name] = {
                        "dead": len(ring.get("dead", [])),
                        "suspects": len(ring.get("suspects", [])),
                    }
                row = {
                    "t": time.time(),
                    "every": 1.0,
                    "served": served,
                    "rings": rings,
                    "flows": flows,
                    "answered": answered,
                    "cpu": cpu,
                }
                f.write(json.dumps(row) + "\n")
                f.flush()


def run_one(
    c: Campaign, mix: Mix, seed: int, *, say: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """One run of ``mix`` with ``seed`` (see the module note): its checked row."""
    isolate = can_isolate()[0] if c.isolate is None else c.isolate
    root = c.out / c.overlay / f"{mix.name}-{seed}"
    root.mkdir(parents=True, exist_ok=True)
    for stale in ("faults.jsonl", "states.jsonl", "where.json"):
        (root / stale).unlink(missing_ok=True)
    names = [f"b{i}" for i in range(c.brokers)]
    if proxied(mix) and not isolate:
        raise ExperimentError(f"mix {mix.name!r}: faults of links need network namespaces (root)")
    hosts = open_hosts([*names, "c"], root=root, isolate=isolate)
    proxies = Proxies(hosts, root=root, seed=seed) if proxied(mix) else None
    brokers = Brokers(
        hosts,
        names,
        root=root,
        config=_config(root / "broker.yaml", c),
        overlay=c.overlay,
        proxied=proxies is not None,
        trace=c.trace,
    )
    try:
        if proxies is not None:
            say(f"{mix.name} seed {seed}: starting {c.brokers} proxies")
            for name in names:
                proxies.start(name)
        say(f"{mix.name} seed {seed}: starting {c.brokers} brokers")
        brokers.start_all()
        time.sleep(2.0 * c.heartbeat + 1.0)  # (the ring settles)
        order = brokers.ring_order() if c.overlay == "chordal-ring" else names
        if len(order) != c.brokers:
            raise ExperimentError(f"only {len(order)} of {c.brokers} brokers answered after the start")
        faults = schedule(mix, seed, brokers=c.brokers, detect=c.detect)
        publish_for = faults[-1].end + c.tail
        spec = _workload(c, [brokers.address(n) for n in names], root, publish_for, seed)
        (root / "spec.json").write_text(spec.to_json())
        nemesis = Nemesis(
            hosts,
            brokers,
            order=order,
            clients="c",
            log=root / "faults.jsonl",
            proxies=proxies,
            publishers={p.name: names[p.first] for p in spec.publishers},
            where=root / "where.json",
            ring_order=brokers.ring_order if c.overlay == "chordal-ring" else None,
            flows=_FlowOps(brokers, names),
        )
        poller = _Poller(brokers, root / "states.jsonl")
        poller.start()
        try:
            _drive(hosts, spec, root, faults, nemesis, say=say, mix=mix, seed=seed)
        finally:
            poller.done.set()
            poller.join()
    finally:
        try:
            brokers.close()
            if proxies is not None:
                proxies.close()
            _queued_at_end(hosts, names, root / "queued.csv")
        finally:
            hosts.close()
    row = {
        "mix": mix.name,
        "seed": seed,
        "overlay": c.overlay,
        "brokers": c.brokers,
        "sync": c.sync,
        **check_run(root),
    }
    if proxies is not None:
        row["proxy"] = proxies.stats()
    _write_timeline(root, mix, seed)
    (root / "row.json").write_text(json.dumps(row, indent=1))
    return row


def _queued_at_end(hosts: Hosts, names: Sequence[str], path: Path) -> None:
    """What the brokers' stores still queue once their processes are stopped, one row
    ``broker,sub,quantity`` per queued event, in ``path`` (the checker counts an
    acknowledged event found there and never taken as ``stranded``, not lost: it waits on
    a disk; a store that cannot be read adds nothing)."""
    import sqlite3

    import msgpack  # type: ignore[import-untyped]

    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["broker", "sub", "quantity"])
        for name in names:
            store = hosts.data_dir(name) / "broker.sqlite"
            if not store.exists():
                continue
            try:
                db = sqlite3.connect(store)
                try:
                    for sub, payload in db.execute("SELECT sub_id, payload FROM queue"):
                        _, fields = msgpack.unpackb(payload, strict_map_key=False)
                        if isinstance(fields, dict) and isinstance(fields.get("quantity"), int):
                            out.writerow([name, sub, fields["quantity"]])
                finally:
                    db.close()
            except (sqlite3.Error, ValueError, TypeError, msgpack.UnpackException):
                continue


def _drive(
    hosts: Hosts,
    spec: Spec,
    root: Path,
    faults: Sequence[Fault],
    nemesis: Nemesis,
    *,
    say: Callable[[str], None],
    mix: Mix,
    seed: int,
) -> None:
    """The workload, and the faults at their times; waits for the workload to end."""
    argv = [sys.executable, "-m", "flowbus.chaos.workload", str(root / "spec.json")]
    with (root / "workload.log").open("w") as log:
        proc = hosts.launch("c", argv, stdout=subprocess.PIPE, stderr=log)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("ready"):
            raise ExperimentError(f"the workload did not start: see {root / 'workload.log'}")
        t0 = float(line.split()[1])
        steps = sorted(
            [(f.start, 0, i) for i, f in enumerate(faults)] + [(f.end, 1, i) for i, f in enumerate(faults)]
        )
        for at, heal, i in steps:
            time.sleep(max(0.0, t0 + at - time.time()))
            fault = faults[i]
            if heal:
                nemesis.heal(fault)
            else:
                say(f"{mix.name} seed {seed}: {fault.kind} at {fault.start:.0f} s for {fault.duration:.1f} s")
                nemesis.inject(fault)
        proc.wait(timeout=spec.publish_for + 3 * spec.settle + 60.0)
    except BaseException:
        proc.kill()
        raise
    finally:
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    if proc.returncode != 0:
        raise ExperimentError(f"the workload failed (exit {proc.returncode}): see {root / 'workload.log'}")


def _write_timeline(root: Path, mix: Mix, seed: int) -> None:
    from flowbus.chaos.report import plot_timeline, write_csv

    rows = timeline(root)
    write_csv(root / "timeline.csv", rows)
    faults = [json.loads(line) for line in (root / "faults.jsonl").read_text().splitlines() if line.strip()]
    plot_timeline(root / "timeline.png", rows, faults, title=f"{mix.name}, seed {seed}")


def failed_row(c: Campaign, mix: str, seed: int, error: str) -> dict[str, Any]:
    """The row of a run that could not be made (its ``error``; every count 0)."""
    zero = dict.fromkeys(TOTALS, 0)
    return {
        "mix": mix,
        "seed": seed,
        "overlay": c.overlay,
        "brokers": c.brokers,
        "sync": c.sync,
        **zero,
        "recovery_p99_s": 0.0,
        "recovery_max_s": 0.0,
        "error": error,
    }


def source_commit() -> str:
    """The commit of the code that runs (``git rev-parse``), ``+dirty`` if its sources differ
    from it; ``unknown`` outside a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return "unknown"
        changed = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--", str(here.parent)],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if changed.stdout.strip() else "")


def run_campaign(c: Campaign, *, say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Every mix of ``c`` with each of ``c.seeds``; the summed document (see :func:`summarize`),
    with the commit of the code that ran."""
    isolated, why = can_isolate()
    if c.isolate is False:
        isolated = False
    elif c.isolate and not isolated:
        raise ExperimentError(why)
    if not isolated and why:
        say(why)
    mixes = check_mixes(c.mixes, isolated=isolated)
    c = replace(c, isolate=isolated)
    commit = source_commit()
    rows = []
    for mix in mixes:
        for seed in c.seeds:
            try:
                rows.append(run_one(c, mix, seed, say=say))
            except ExperimentError as e:  # (one run that could not be made: the others go on)
                say(f"{mix.name} seed {seed}: the run failed: {e}")
                rows.append(failed_row(c, mix.name, seed, str(e)))
                continue
            r = rows[-1]
            say(
                f"{mix.name} seed {seed}: {r['acknowledged']} acknowledged, {r['lost']} lost, "
                f"{r['duplicated']} duplicated, {r['out_of_order']} out of order, {r['hung_publishes']} hung"
            )
            if "proxy" in r:
                say(f"{mix.name} seed {seed}: proxies " + ", ".join(f"{k} {r['proxy'][k]}" for k in COUNTS))
    doc = summarize(rows, overlay=c.overlay, isolated=isolated, commit=commit)
    from flowbus.chaos.report import write_campaign

    write_campaign(c.out / c.overlay, doc)
    return doc
