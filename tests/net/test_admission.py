"""The listener's gate: a connection that arrives as the gate closes is no error."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from flowbus.net.admission import Admission, Gate

pytestmark = pytest.mark.broker


def test_a_connection_arriving_as_the_gate_closes_is_no_error() -> None:
    """A broker found dead starts again and closes its gate; a peer's connection may arrive
    in that very turn of the event loop. With ``loop.sock_accept`` (Python 3.11) it was taken
    into the cancelled waiter: an ``InvalidStateError`` and its traceback in the log (a
    campaign counts tracebacks), and the connection leaked."""

    async def main() -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))

        async def handler(_reader: Any, writer: asyncio.StreamWriter, _tls: bool) -> None:
            writer.close()

        for _ in range(5):
            gate = Gate(Admission(), handler)
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            gate.start(sock)
            await asyncio.sleep(0.01)  # (the gate waits for a connection)
            peer = socket.create_connection(sock.getsockname())  # (in the kernel's queue now)
            for task in list(gate._tasks):  # (cancelled before the accept runs, in the same turn)
                loop.call_soon(task.cancel)
            await asyncio.sleep(0.01)
            await gate.close()
            peer.close()
        return errors

    assert asyncio.run(main()) == []
