"""CPU seconds from ``/proc``: of one process, and of the whole machine (what the benchmarks
and the fault campaign report beside their figures, the machine being shared). ``nan`` where
there is no ``/proc`` or the process is gone."""

from __future__ import annotations

import os

__all__ = ["machine_busy_s", "process_cpu_s"]


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores; ``/proc/stat``)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")
