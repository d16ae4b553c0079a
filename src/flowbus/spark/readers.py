"""What a run of the Spark engine wrote, read back: a subscription point's events, in ``_order``.

How it works: the sinks write one directory per micro-batch and point,
``OUT/<point>/<log>-<batch>`` (:mod:`flowbus.spark.flow`); these read every
micro-batch's files of a point with Spark, sort by ``_order`` (the reference
interpreter's order) and drop it. Points served through a matcher are read from
``OUT/<point>.matched``, partitioned by ``_target``.
"""

from __future__ import annotations

from functools import reduce
from pathlib import Path
from typing import Any, Literal

from pyspark.sql import DataFrame, SparkSession

__all__ = ["read_matched", "read_outputs"]


def read_outputs(
    spark: SparkSession, out: Path, point: str, sink: Literal["parquet", "jsonl", "console"] = "parquet"
) -> list[dict[str, Any]]:
    """The events written for ``point`` (without ``_order``), in ``_order``."""
    base = Path(out) / point
    if not base.exists() or not any(base.iterdir()):
        return []
    reader = spark.read.parquet if sink == "parquet" else spark.read.json
    df = reader(str(base / "*"))
    if "_order" not in df.columns:  # JSON lines of micro-batches that delivered nothing
        return []
    rows = [r.asDict(recursive=True) for r in df.orderBy("_order").collect()]
    return [{k: v for k, v in r.items() if k != "_order" and v is not None} for r in rows]


def read_matched(spark: SparkSession, out: Path, point: str) -> dict[str, list[dict[str, Any]]]:
    """The events delivered through ``point``'s matcher (Parquet), per subscription point, in ``_order``."""
    base = Path(out) / f"{point}.matched"
    if not base.is_dir():
        return {}
    frames = [spark.read.parquet(str(d)) for d in sorted(base.iterdir()) if d.is_dir() and any(d.iterdir())]
    if not frames:
        return {}
    got: dict[str, list[dict[str, Any]]] = {}
    for r in reduce(DataFrame.unionByName, frames).orderBy("_order").collect():
        row = r.asDict(recursive=True)
        target = row.pop("_target")
        row.pop("_order")
        got.setdefault(target, []).append({k: v for k, v in row.items() if v is not None})
    return got
