"""flowbus on Spark: the only package that imports pyspark (lazily, inside its modules).

* :mod:`flowbus.spark.session` -- one session set-up: embedded ``local[*]`` by
  default, ``master=`` for a cluster, ``remote=`` for Spark Connect, shipping
  flowbus's own code to the executors.
* :mod:`flowbus.spark.bulk` -- bulk matching of an event table against a
  subscription table through one broadcast :class:`~flowbus.matching.Matcher`
  applied in ``mapInArrow``, and the broadcast-hash-join formulation it is
  measured against.

Importing this package does not import pyspark; the functions do, and raise a
:class:`~flowbus.errors.FlowbusError` when pyspark or Java is missing.
"""

from flowbus.spark.session import spark_session

__all__ = ["spark_session"]
