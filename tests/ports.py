"""Ports for the tests that start ``flowbus cluster up``: its brokers listen on ``port``,
``port + 1``..., so a test needs that many consecutive free ports, not one."""

from __future__ import annotations

import contextlib
import socket


def consecutive_free_ports(n: int) -> int:
    """A port p such that p .. p + n - 1 are free on 127.0.0.1 (a moment ago)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + n - 1 > 65535:
            continue
        try:
            with contextlib.ExitStack() as stack:
                for port in range(base, base + n):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise AssertionError(f"no {n} consecutive free ports")
