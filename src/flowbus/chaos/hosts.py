"""The hosts of a fault campaign: brokers and clients on a network the campaign can break.

How it works:

* **Namespaces** (:class:`Namespaces`, as root). Each host (``b0``, ``b1``... the brokers;
  ``c`` the clients) is a network namespace with one veth link to a bridge in the root
  namespace, and its own address on the bridge's /24 (``10.250.K.i``; the bridge itself has
  ``.254``, so the campaign reaches every host from the root namespace, and every host is
  reachable from every other until a fault says otherwise). A program runs in a host with
  ``ip netns exec``, which replaces itself with the program: the process id the campaign
  holds is the program's own (what ``kill -STOP`` must reach).
* **Faults of the network.** ``cut(a, b)`` drops what ``a`` sends to ``b`` (a blackhole
  route in ``a``'s namespace: connecting fails at once, and the packets of open connections
  vanish, so TCP retransmits until ``mend``); both ways takes a cut on each side, one way
  only one. ``link(h, up=False)`` takes the host's link down altogether (clients included).
  Slower, lossy, duplicating or reordering links are not made here (the kernel may have no
  ``netem``): a proxy in front of each broker makes them (:mod:`flowbus.chaos.proxy`,
  launched in the broker's host like any program).
* **Disks.** A host's data directory can be a small ext4 file system of its own on a loop
  device (:meth:`Namespaces.disk`): ``fill`` takes all its free space (a store then meets
  ``ENOSPC``), ``drain`` gives it back; ``power_loss`` keeps only what the kernel had written
  to the device (what an ``fsync`` forced, and what write-back did on its own): the image is
  copied before the file system is unmounted, then mounted again from the copy.
* **CPU.** ``throttle(host, pids, share)`` puts processes in a cpu cgroup of the host's own
  whose quota is ``share`` of one core for all of them together (cgroup v1's
  ``cpu.cfs_quota_us``, or v2's ``cpu.max``): they run in slices, as on an overloaded
  machine; ``unthrottle`` moves every throttled process back and removes the groups.
* **Always cleaned up.** Every namespace, link, mount, loop device and cgroup made is
  written to a registry file (``/run/flowbus-chaos/PID.json``) before it is made;
  :meth:`close` removes them, and :func:`sweep` removes those of campaigns whose process is
  gone (killed, or crashed), which every new campaign runs first. A campaign's ``SIGINT``
  and ``SIGTERM`` close the hosts before the process ends.
* **Without root** (:class:`Loopback`): every host is ``127.0.0.1``, brokers on ports of
  their own; only faults of processes can be made (``cut``, ``link``, ``fill``...
  raise :class:`~flowbus.errors.ExperimentError`). :func:`can_isolate` tells which applies.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from flowbus.errors import ExperimentError

__all__ = ["REGISTRY", "Hosts", "Loopback", "Namespaces", "can_isolate", "open_hosts", "sweep"]

REGISTRY = Path("/run/flowbus-chaos")
"""Where each campaign lists what it made (one JSON file per campaign process)."""

BROKER_PORT = 7000
"""The port every broker listens on in its own namespace (or, behind a proxy, the port the
proxy listens on and the broker advertises: :mod:`flowbus.chaos.proxy`)."""


class Hosts(Protocol):
    """What a campaign needs of its hosts (see the module note)."""

    isolated: bool  # whether network faults and disks can be made (namespaces)

    def address(self, host: str) -> str: ...  # a broker host's "ip:port"
    def ip(self, host: str) -> str: ...
    def launch(self, host: str, argv: Sequence[str], **popen: Any) -> subprocess.Popen[str]: ...
    def data_dir(self, host: str) -> Path: ...
    def cut(self, a: str, b: str, *, both: bool = True) -> None: ...
    def mend(self, a: str, b: str, *, both: bool = True) -> None: ...
    def link(self, host: str, *, up: bool) -> None: ...
    def fill(self, host: str) -> None: ...
    def drain(self, host: str) -> None: ...
    def power_loss(self, host: str) -> None: ...
    def throttle(self, host: str, pids: Sequence[int], share: float) -> None: ...
    def unthrottle(self) -> None: ...
    def close(self) -> None: ...


def can_isolate() -> tuple[bool, str]:
    """Whether network namespaces can be made here (root, ``ip`` from iproute2); if not, why."""
    if os.geteuid() != 0:
        return False, "not root: network namespaces need root (only faults of processes, on loopback)"
    if shutil.which("ip") is None:
        return False, "no ip command (iproute2): only faults of processes, on loopback"
    probe = f"flowbus-chaos-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return False, f"cannot make a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True, ""


def open_hosts(names: Sequence[str], *, root: Path, isolate: bool) -> Hosts:
    """The hosts ``names`` (brokers first, then ``c``), in namespaces if ``isolate``."""
    if isolate:
        sweep()
        return Namespaces(names, root=root)
    return Loopback(names, root=root)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise ExperimentError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True)
    if check and done.returncode != 0:
        raise ExperimentError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


@dataclass
class _Made:
    """What one campaign made (its registry file), to be removed in reverse order."""

    pid: int
    bridge: str | None = None
    netns: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)

    def save(self) -> None:
        REGISTRY.mkdir(parents=True, exist_ok=True)
        path = REGISTRY / f"{self.pid}.json"
        tmp = path.with_suffix(".tmp")
        listed = {"bridge": self.bridge, "netns": self.netns, "mounts": self.mounts, "cgroups": self.cgroups}
        tmp.write_text(json.dumps(listed))
        tmp.replace(path)

    def remove(self) -> None:
        """Remove everything listed (what is gone already is skipped), then the file."""
        for group in reversed(self.cgroups):
            _release(Path(group))
        for mount in reversed(self.mounts):
            _run("umount", "-l", mount, check=False)
        for ns in reversed(self.netns):
            _ip("netns", "del", ns, check=False)
        if self.bridge is not None:
            _ip("link", "del", self.bridge, check=False)
        (REGISTRY / f"{self.pid}.json").unlink(missing_ok=True)


CPU_PERIOD_US = 100_000
"""The period of a throttled group's CPU quota (microseconds)."""


def _cpu_root() -> Path | None:
    """Where cpu cgroups are made here (v1's ``cpu`` hierarchy, or v2's root with the cpu
    controller), or None."""
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").exists():
        return v1
    v2 = Path("/sys/fs/cgroup")
    with contextlib.suppress(OSError):
        if "cpu" in (v2 / "cgroup.controllers").read_text().split():
            (v2 / "cgroup.subtree_control").write_text("+cpu")
            return v2
    return None


def _release(group: Path) -> None:
    """Move a cpu cgroup's processes back to its parent's group, and remove it."""
    if not group.is_dir():
        return
    with contextlib.suppress(OSError):
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # (gone meanwhile)
                (group.parent / "cgroup.procs").write_text(pid)
    with contextlib.suppress(OSError):
        group.rmdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep() -> list[int]:
    """Remove what campaigns whose process is gone left behind; their process ids."""
    swept = []
    for path in sorted(REGISTRY.glob("*.json")) if REGISTRY.exists() else ():
        pid = int(path.stem)
        if pid == os.getpid() or _alive(pid):
            continue
        try:
            listed = json.loads(path.read_text())
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            continue
        _Made(
            pid,
            listed.get("bridge"),
            listed.get("netns", []),
            listed.get("mounts", []),
            listed.get("cgroups", []),
        ).remove()
        swept.append(pid)
    return swept


class Namespaces:
    """Hosts in network namespaces on one bridge (see the module note)."""

    isolated = True

    def __init__(self, names: Sequence[str], *, root: Path) -> None:
        self.names = list(names)
        self.root = root
        self._made = _Made(os.getpid())
        self.tag = f"{os.getpid() % 46656:03x}"[-3:]  # (interface names: 15 characters at most)
        self.subnet = _free_subnet()
        self._ips = {h: f"10.250.{self.subnet}.{i + 1}" for i, h in enumerate(self.names)}
        self._cuts: set[tuple[str, str]] = set()
        self._disks: dict[str, Path] = {}  # host -> its file system's image
        self._old_handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in self._old_handlers:
            signal.signal(s, self._on_signal)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _on_signal(self, signum: int, frame: object) -> None:
        self.close()
        raise KeyboardInterrupt

    def _ns(self, host: str) -> str:
        return f"flowbus-chaos-{os.getpid()}-{host}"

    def _build(self) -> None:
        bridge = f"fbc{self.tag}br"
        self._made.bridge = bridge
        self._made.save()
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"10.250.{self.subnet}.254/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for host in self.names:
            ns, veth = self._ns(host), f"fbc{self.tag}{host}"
            self._made.netns.append(ns)
            self._made.save()
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self._ips[host]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def ip(self, host: str) -> str:
        return self._ips[host]

    def address(self, host: str) -> str:
        return f"{self._ips[host]}:{BROKER_PORT}"

    def launch(self, host: str, argv: Sequence[str], **popen: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(["ip", "netns", "exec", self._ns(host), *argv], text=True, **popen)

    def data_dir(self, host: str) -> Path:
        """The host's data directory: an ext4 file system of 64 MiB of its own."""
        where = self.root / "data" / host
        if host in self._disks:
            return where
        where.mkdir(parents=True, exist_ok=True)
        image = self.root / "disks" / f"{host}.img"
        image.parent.mkdir(parents=True, exist_ok=True)
        with image.open("wb") as f:
            f.truncate(64 << 20)
        _run("mkfs.ext4", "-q", "-F", "-E", "nodiscard", str(image))
        self._mount(image, where)
        self._disks[host] = image
        return where

    def _mount(self, image: Path, where: Path) -> None:
        self._made.mounts.append(str(where))
        self._made.save()
        _run("mount", "-o", "loop", str(image), str(where))

    def _unmount(self, where: Path) -> None:
        _run("umount", str(where))
        with contextlib.suppress(ValueError):
            self._made.mounts.remove(str(where))
        self._made.save()

    def cut(self, a: str, b: str, *, both: bool = True) -> None:
        for x, y in ((a, b), (b, a)) if both else ((a, b),):
            if (x, y) not in self._cuts:
                _ip("-n", self._ns(x), "route", "add", "blackhole", f"{self._ips[y]}/32")
                self._cuts.add((x, y))

    def mend(self, a: str, b: str, *, both: bool = True) -> None:
        for x, y in ((a, b), (b, a)) if both else ((a, b),):
            if (x, y) in self._cuts:
                _ip("-n", self._ns(x), "route", "del", "blackhole", f"{self._ips[y]}/32", check=False)
                self._cuts.discard((x, y))

    def link(self, host: str, *, up: bool) -> None:
        _ip("-n", self._ns(host), "link", "set", "eth0", "up" if up else "down")

    def fill(self, host: str) -> None:
        """Take every free byte of the host's file system (the store then meets ENOSPC)."""
        where = self.data_dir(host)
        free = shutil.disk_usage(where).free
        filler = where / "filler"
        _run("fallocate", "-l", str(max(free, 4096)), str(filler), check=False)
        with contextlib.suppress(OSError), filler.open("ab") as f:  # (what fallocate left)
            while True:
                f.write(b"\0" * 65536)
                f.flush()

    def drain(self, host: str) -> None:
        (self.data_dir(host) / "filler").unlink(missing_ok=True)

    def power_loss(self, host: str) -> None:
        """Keep only what the kernel had written to the host's disk (its processes must be
        gone first): the image is copied as the device has it, then mounted from the copy."""
        where = self.data_dir(host)
        image = self._disks[host]
        snapshot = image.with_suffix(".lost")
        _run("cp", "--sparse=always", str(image), str(snapshot))
        self._unmount(where)
        snapshot.replace(image)
        self._mount(image, where)

    def throttle(self, host: str, pids: Sequence[int], share: float) -> None:
        """Starve ``pids`` of CPU: ``share`` of one core for them all (see the module note)."""
        root = _cpu_root()
        if root is None:
            raise ExperimentError("starving brokers of CPU needs a cpu cgroup (v1 cpu, or v2 with cpu)")
        group = root / self._ns(host)
        if str(group) not in self._made.cgroups:
            self._made.cgroups.append(str(group))
            self._made.save()
        group.mkdir(exist_ok=True)
        quota = max(1000, round(share * CPU_PERIOD_US))
        if (group / "cpu.max").exists():
            (group / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        for pid in pids:
            with contextlib.suppress(OSError):  # (a process gone already)
                (group / "cgroup.procs").write_text(str(pid))

    def unthrottle(self) -> None:
        for group in self._made.cgroups:
            _release(Path(group))
        self._made.cgroups = []
        self._made.save()

    def close(self) -> None:
        self._made.remove()
        self._made = _Made(os.getpid())
        for s, handler in self._old_handlers.items():
            with contextlib.suppress(ValueError, TypeError):  # (not the main thread)
                signal.signal(s, handler)
        self._old_handlers = {}


def _free_subnet() -> int:
    """A third byte K for 10.250.K.0/24 that no route of the root namespace uses."""
    used = _ip("route", "show").stdout
    start = os.getpid() % 200
    for k in range(200):
        n = 20 + (start + k) % 200
        if f"10.250.{n}." not in used:
            return n
    raise ExperimentError("no free 10.250.K.0/24 subnet for the campaign's bridge")


class Loopback:
    """Every host on 127.0.0.1, brokers on ports of their own: faults of processes only."""

    isolated = False

    def __init__(self, names: Sequence[str], *, root: Path) -> None:
        self.names = list(names)
        self.root = root
        self._ports = {h: _free_port() for h in self.names}

    def ip(self, host: str) -> str:
        return "127.0.0.1"

    def address(self, host: str) -> str:
        return f"127.0.0.1:{self._ports[host]}"

    def launch(self, host: str, argv: Sequence[str], **popen: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(list(argv), text=True, **popen)

    def data_dir(self, host: str) -> Path:
        where = self.root / "data" / host
        where.mkdir(parents=True, exist_ok=True)
        return where

    def _needs_root(self, what: str) -> None:
        raise ExperimentError(f"{what} needs network namespaces (root); this campaign runs on loopback")

    def cut(self, a: str, b: str, *, both: bool = True) -> None:
        self._needs_root("a cut link")

    def mend(self, a: str, b: str, *, both: bool = True) -> None:
        self._needs_root("a cut link")

    def link(self, host: str, *, up: bool) -> None:
        self._needs_root("a link down")

    def fill(self, host: str) -> None:
        self._needs_root("a full disk")

    def drain(self, host: str) -> None:
        self._needs_root("a full disk")

    def power_loss(self, host: str) -> None:
        self._needs_root("a power loss")

    def throttle(self, host: str, pids: Sequence[int], share: float) -> None:
        self._needs_root("starving brokers of CPU")

    def unthrottle(self) -> None:
        self._needs_root("starving brokers of CPU")

    def close(self) -> None:
        pass


def _free_port() -> int:
    """A port free on 127.0.0.1 now, below the kernel's ephemeral range (a broker of the
    campaign starts, and starts again, on it long after it was chosen: a port from that
    range may meanwhile be another program's, any socket bound to port 0 or any outgoing
    connection; a test run beside it made one broker fail "address already in use")."""
    low, _ = _ephemeral_range()
    for port in random.Random().sample(range(max(1024, low - 12_000), low), 400):
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            return port
    with socket.socket() as s:  # (none below it free: one from the kernel)
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for port 0 and outgoing connections (Linux's; else its default)."""
    with contextlib.suppress(OSError, ValueError):
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    return 32768, 60999
