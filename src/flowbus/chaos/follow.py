"""Following events through a traced run (``flowbus chaos run --trace``, then ``flowbus chaos
follow RUN --publisher pub0 --seq 11154-11160``).

How it works: a traced run's ``traces/NAME.jsonl`` hold each broker's messages in and out
with the ids of the events they carry (:mod:`flowbus.net.trace`); an event's id between
brokers is ``(client, publish sequence number)``. :func:`follow` gathers every line that
carries one of the chosen events, and the events' deliveries (``deliveries.csv``, by the
publisher's ``k`` that ``publishes.csv`` gives each sequence number), into one list in time
order, ``t`` counted from the run's first publish: where each event went, when, and in which
order, hop by hop.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flowbus.chaos.check import _read_csv
from flowbus.chaos.workload import STRIDE, Spec
from flowbus.errors import ExperimentError

__all__ = ["follow"]


def follow(root: Path, publisher: str, first: int, last: int) -> list[dict[str, Any]]:
    """The hops and deliveries of ``publisher``'s events with sequence numbers ``first`` to
    ``last`` in the traced run at ``root`` (see the module note), in time order."""
    traces = sorted((root / "traces").glob("*.jsonl"))
    if not traces:
        raise ExperimentError(f"{root}: no traces (run it with flowbus chaos run --trace)")
    publishes = _read_csv(root / "publishes.csv")
    sent = [float(r["sent"]) for r in publishes if r.get("sent")]
    t0 = min(sent, default=0.0)
    k_of = {int(r["pseq"]): int(r["k"]) for r in publishes if r["publisher"] == publisher and r.get("pseq")}
    if not k_of:
        raise ExperimentError(f"{root}: no publishes of {publisher!r} (publishes.csv)")
    wanted = set(range(first, last + 1))
    out: list[dict[str, Any]] = []
    for path in traces:
        for line in path.read_text().splitlines():
            t, way, peer, msgs = json.loads(line)
            for msg in msgs:
                kind, ids = msg[0], msg[1:]
                seqs = [i[1] for i in ids if isinstance(i, list) and len(i) == 2 and i[0] == publisher]
                for seq in seqs:
                    if seq in wanted:
                        where = {"broker": path.stem, "way": way, "peer": peer, "message": kind}
                        out.append({"t": round(t - t0, 4), "seq": seq, **where})
    spec = Spec.from_json((root / "spec.json").read_text())
    pub_index = [c.name for c in spec.publishers].index(publisher)  # (the checker's numbering)
    ks = {k_of[s]: s for s in wanted if s in k_of}
    for row in _read_csv(root / "deliveries.csv"):
        q = int(row["quantity"])
        if q // STRIDE == pub_index and q % STRIDE in ks:
            seq = ks[q % STRIDE]
            where = {"broker": row["broker"], "way": "delivered", "peer": row["sub"], "message": ""}
            out.append({"t": round(float(row["t"]) - t0, 4), "seq": seq, **where})
    out.sort(key=lambda r: (r["t"], r["seq"]))
    return out
