"""The fault campaign end to end: the short campaign CI runs (real broker processes in network
namespaces as root, else on loopback), its JSON document, its cleanup; the hosts' cleanup of a
campaign that died; the command's errors."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flowbus.chaos.hosts import REGISTRY, Loopback, Namespaces, can_isolate, sweep
from flowbus.errors import ExperimentError

pytestmark = pytest.mark.broker

ROOT = os.geteuid() == 0 and can_isolate()[0]
KEYS = (
    "runs",
    "faults_injected",
    "acknowledged",
    "expected_deliveries",
    "delivered",
    "lost",
    "duplicated",
    "misrouted",
    "wrong_values",
    "caught_up",
    "out_of_order",
    "hung_publishes",
    "recovery_p99_s",
    "rows",
)


def _netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.mark.skipif(not ROOT, reason="the short campaign's partitions need root and network namespaces")
@pytest.mark.slow
def test_the_short_campaign_runs_checks_and_cleans_up(tmp_path: Path) -> None:
    """Three faults drawn from kill -9, a pause and a broker cut off from the others (seed 1:
    two kills, then an isolation) on a ring of five:
    every acknowledged event is accounted for, none doubled, misrouted or made up, no
    publish hangs, no broker logs a traceback; the files are there and nothing of the hosts
    is left; the campaign's flow (trades -> priced -> big, and a count per symbol in a state)
    is deployed and delivered under the same faults. (Losses and
    per-publisher order are the campaign's open goal: measured and reported here, in
    docs/results/faults.md, not yet held to zero: the short campaign has shown 0-22 lost
    and up to about 1,900 deliveries out of order.)"""
    before = _netns()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowbus",
            "chaos",
            "run",
            "--short",
            "--trace",
            "--json",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert all(k in doc for k in KEYS) and doc["runs"] == 1 and doc["isolated"]
    (row,) = doc["rows"]
    assert (
        row["mix"] == "short"
        and row["seed"] == 1
        and all(k in row for k in KEYS if k not in ("runs", "rows"))
    )
    assert doc["faults_injected"] == 3 and doc["acknowledged"] > 10_000 and doc["failed_runs"] == 0
    assert (
        doc["delivered"] + doc["caught_up"] + doc["lost"] + doc["stranded"] == doc["expected_deliveries"]
    ), row
    assert doc["duplicated"] == doc["misrouted"] == doc["phantom"] == 0, row
    assert doc["hung_publishes"] == 0 and doc["tracebacks"] == 0 and doc["heal_failures"] == 0, row
    spec = json.loads((tmp_path / "chordal-ring" / "short-1" / "spec.json").read_text())
    flow_subs = [s for c in spec["subscribers"] for s in c["subs"] if s["space"] == "big"]
    assert spec["flow"] and any(p["space"] == "trades" for p in spec["publishers"])
    taken = {r.split(",")[0] for r in (tmp_path / "chordal-ring" / "short-1" / "deliveries.csv").open()}
    assert {s["id"] for s in flow_subs} <= taken  # (the flow's derived space was delivered, and checked)
    print(f"short campaign: {doc['lost']} lost, {doc['out_of_order']} out of order of {doc['delivered']:,}")
    run = tmp_path / "chordal-ring" / "short-1"
    for name in (
        "timeline.png",
        "timeline.csv",
        "faults.jsonl",
        "deliveries.csv",
        "publishes.csv",
        "queued.csv",
    ):
        assert (run / name).is_file()
    _follow_one_event(run)
    assert (tmp_path / "chordal-ring" / "campaign.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "chordal-ring" / "campaign.md").read_text().startswith("| mix | runs |")
    assert _netns() == before and not list(REGISTRY.glob(f"{os.getpid()}.json"))


def _follow_one_event(run: Path) -> None:
    """The run was traced (``--trace``): ``flowbus chaos follow`` finds a delivered event of
    a publisher going out of one broker and into another, before it is delivered."""
    with (run / "publishes.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["publisher"] == "pub0" and r["acked"]]
    seq = rows[len(rows) // 2]["pseq"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flowbus",
            "chaos",
            "follow",
            str(run),
            "--publisher",
            "pub0",
            "--seq",
            seq,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    hops = json.loads(done.stdout)["hops"]
    ways = [h["way"] for h in hops]
    assert "out" in ways and "in" in ways and "delivered" in ways, hops
    assert ways.index("out") < max(i for i, w in enumerate(ways) if w == "delivered"), hops
    assert {h["broker"] for h in hops if h["way"] == "out"} != {h["broker"] for h in hops if h["way"] == "in"}


def test_what_the_stores_still_queue_at_the_end_is_read_per_subscription(tmp_path: Path) -> None:
    """Once the brokers are stopped, the campaign reads their stores: every event a queue
    still holds, by broker, subscription and identity (a store missing or unreadable adds
    nothing)."""
    import msgpack  # type: ignore[import-untyped]

    from flowbus.broker.store import Store
    from flowbus.chaos.campaign import _queued_at_end
    from flowbus.chaos.workload import STRIDE, event_of

    class Disks:
        def data_dir(self, host: str) -> Path:
            return tmp_path / host

    for host in ("b0", "b1", "b2"):
        (tmp_path / host).mkdir()
    store = Store(tmp_path / "b0" / "broker.sqlite")
    store.add_subscription("d0-1", client="d0", space="trades", filter="level >= 1", durable=True)
    for q in (7, STRIDE + 3):
        e = event_of(q // STRIDE, q % STRIDE)
        store.enqueue(
            "d0-1",
            repr((f"pub{q // STRIDE}", q % STRIDE)),
            msgpack.packb(([f"pub{q // STRIDE}", q % STRIDE], e)),
        )
    store.close()
    (tmp_path / "b1" / "broker.sqlite").write_bytes(b"not a database")
    _queued_at_end(Disks(), ["b0", "b1", "b2"], tmp_path / "queued.csv")  # type: ignore[arg-type]
    lines = (tmp_path / "queued.csv").read_text().split()
    assert lines == ["broker,sub,quantity", "b0,d0-1,7", f"b0,d0-1,{STRIDE + 3}"]


@pytest.mark.skipif(not ROOT, reason="network namespaces need root")
def test_what_a_dead_campaign_left_is_swept(tmp_path: Path) -> None:
    """A campaign killed before it could clean up leaves its registry; the next one removes
    what it lists (here a namespace made under the pid of a process that is gone)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    ns = f"flowbus-chaos-{gone.pid}-b0"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    REGISTRY.mkdir(parents=True, exist_ok=True)
    (REGISTRY / f"{gone.pid}.json").write_text(json.dumps({"bridge": None, "netns": [ns], "mounts": []}))
    try:
        assert gone.pid in sweep()
        assert ns not in _netns() and not (REGISTRY / f"{gone.pid}.json").exists()
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_without_namespaces_only_faults_of_processes_can_be_made(tmp_path: Path) -> None:
    hosts = Loopback(["b0", "b1", "c"], root=tmp_path)
    assert hosts.address("b0") != hosts.address("b1") and hosts.ip("c") == "127.0.0.1"
    for fault in (
        lambda: hosts.cut("b0", "b1"),
        lambda: hosts.fill("b0"),
        lambda: hosts.link("b0", up=False),
        lambda: hosts.throttle("b0", [os.getpid()], 0.5),
    ):
        with pytest.raises(ExperimentError, match="needs network namespaces"):
            fault()
    assert hosts.data_dir("b0").is_dir()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # (utime + stime)


@pytest.mark.skipif(not ROOT, reason="cpu cgroups need root")
def test_starved_processes_get_their_share_of_a_core_and_are_let_go(tmp_path: Path) -> None:
    """The ``starve`` fault's mechanism: a process spinning on a core gets about the share
    it is throttled to (here a tenth: well under half a second of CPU in two), all of it
    again once let go; the group is removed by ``unthrottle``, and by a sweep when the
    campaign that made it died."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    hosts = Namespaces(["b0", "c"], root=tmp_path)
    try:
        hosts.throttle("b0", [spin.pid], 0.1)
        (group,) = json.loads((REGISTRY / f"{os.getpid()}.json").read_text())["cgroups"]
        assert str(spin.pid) in (Path(group) / "cgroup.procs").read_text().split()
        before = _cpu_seconds(spin.pid)
        subprocess.run(["sleep", "2"], check=True)
        starved = _cpu_seconds(spin.pid) - before
        hosts.unthrottle()
        assert not Path(group).exists()
        before = _cpu_seconds(spin.pid)
        subprocess.run(["sleep", "2"], check=True)
        fed = _cpu_seconds(spin.pid) - before
        assert starved < 0.5 < fed, (starved, fed)
        hosts.throttle("b0", [spin.pid], 0.1)
    finally:
        spin.kill()
        spin.wait()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])  # (the group left by a dead campaign)
    gone.wait()
    listed = json.loads((REGISTRY / f"{os.getpid()}.json").read_text())
    (REGISTRY / f"{gone.pid}.json").write_text(json.dumps(listed))
    hosts._made.cgroups = []  # (as if this campaign had died: the sweep removes the group)
    hosts._made.save()
    assert gone.pid in sweep() and not Path(group).exists()
    hosts.close()
    assert not list(REGISTRY.glob(f"{os.getpid()}.json"))


def test_the_command_lists_its_mixes_and_refuses_bad_ones(tmp_path: Path) -> None:
    from flowbus.cli import app

    runner = CliRunner()
    listed = runner.invoke(app, ["chaos", "mixes", "--json"])
    assert listed.exit_code == 0
    mixes = {m["mix"]: m for m in json.loads(listed.stdout)["mixes"]}
    assert {"crash", "pause", "isolate", "split", "partial", "clients", "disk", "short"} <= set(mixes)
    assert mixes["split"]["needs_root"] and mixes["starve"]["needs_root"]
    assert not mixes["process"]["needs_root"]
    bad = runner.invoke(app, ["chaos", "run", "--mix", "nope", "--out", str(tmp_path), "--json"])
    assert bad.exit_code == 2 and "unknown mix 'nope'" in bad.stderr
    bad = runner.invoke(app, ["chaos", "run", "--overlay", "nope", "--out", str(tmp_path), "--json"])
    assert bad.exit_code == 2 and "--overlay" in bad.stderr
    bad = runner.invoke(app, ["chaos", "run", "--sync", "off", "--out", str(tmp_path), "--json"])
    assert bad.exit_code == 2 and "--sync: full or normal" in bad.stderr
    for seeds, why in (("0", "seeds N must be >= 1"), ("3-1", "an empty range"), ("2,2", "distinct seeds")):
        bad = runner.invoke(app, ["chaos", "run", "--seeds", seeds, "--out", str(tmp_path), "--json"])
        assert bad.exit_code == 2 and why in bad.stderr
    assert not list(tmp_path.iterdir())  # (nothing was made)


@pytest.mark.skipif(not ROOT, reason="network namespaces need root")
def test_a_campaign_stopped_while_its_brokers_start_ends_and_leaves_no_process(tmp_path: Path) -> None:
    """SIGTERM (or Ctrl-C) while a broker's ready line is awaited: the campaign ends at once
    and stops every broker it started (it waited for ever on the reader of that line: the
    broker's namespace was gone, it never joined)."""
    import signal
    import time

    argv = ["chaos", "run", "--mix", "crash", "--seeds", "1", "--out", str(tmp_path), "--json"]
    campaign = subprocess.Popen(
        [sys.executable, "-m", "flowbus", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert campaign.stderr is not None
        for line in campaign.stderr:
            if "starting 5 brokers" in line:
                break
        time.sleep(2.5)  # (the first brokers are up, one is starting)
        campaign.send_signal(signal.SIGTERM)
        campaign.wait(timeout=30)
    finally:
        if campaign.poll() is None:
            campaign.kill()
            campaign.wait()
    for _ in range(100):  # (brokers killed, reaped by init)
        left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
        if not left:
            break
        time.sleep(0.1)
    assert not left
