"""flowbus benchmarks, run by ``flowbus bench ...`` (:mod:`flowbus.cli.bench`).

Each module has a ``run(...) -> dict`` (``measure`` for the floor) whose result the command
prints as one JSON document with ``--json``; figures come from these, never from timed tests.

* :mod:`~flowbus.bench.match` -- matching throughput on W1 / W1-mixed / W-REIN (``bench match``);
* :mod:`~flowbus.bench.flow` -- the stock flow on the local interpreter, original against
  rewritten, and A* reconnects (``bench flow``);
* :mod:`~flowbus.bench.spark_flow`, :mod:`~flowbus.bench.spark_match` -- the stock flow and
  bulk matching on Spark (``bench spark``, ``bench spark-match``);
* :mod:`~flowbus.bench.broker` -- broker processes on loopback (``bench broker``), and
  :mod:`~flowbus.bench.broker_floor`, what one delivery costs at the least (``bench floor``);
  :mod:`~flowbus.bench.activemq`, ActiveMQ beside them (``--baseline activemq``), and
  :mod:`~flowbus.bench.stomp_clients`, the stomp.py program that measures ActiveMQ and, with
  ``--protocol stomp``, flowbus's brokers at their STOMP doors;
* :mod:`~flowbus.bench.flow_bus` -- the stock flow deployed on broker processes against plain
  content routing of the same brokers (``bench flow-bus``);
* :mod:`~flowbus.bench.cbr`, :mod:`~flowbus.bench.cbr_adverts` -- the covering-based content
  router alone (``bench cbr``, ``bench cbr-adverts``);
* :mod:`~flowbus.bench.workloads` -- the seeded workloads they share;
* ``plot_match``, ``plot_broker``, ``plot_spark`` -- the figures of ``docs/results``
  (``bench plot``).

Importing this package imports none of them.
"""
