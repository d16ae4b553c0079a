"""One local SparkSession for every Spark test (a session takes 5-7 s to start).

The tests skip only when Java is absent; pyspark itself is a dependency.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from flowbus.spark.session import java_available

if not java_available():
    pytest.skip("Java is not installed: the Spark tests need it", allow_module_level=True)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from flowbus.spark.session import spark_session

    session = spark_session(
        master="local[2]",
        app_name="flowbus-tests",
        conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
    )
    yield session
    session.stop()
