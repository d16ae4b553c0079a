"""flowbus.experiments: the figures of the source documents, reproduced in the simulator.

How it works: every experiment has one shape, config -> rows -> CSV / JSON / PNG.

* A config is a frozen dataclass, checked when built (an
  :class:`~flowbus.errors.ExperimentError` names the key): :class:`~.pastry_hops.PastryHops`,
  :class:`~.irbr.IrbrSweep`, :class:`~.ring.RingJoin`, :class:`~.ring.RingRepair`,
  :class:`~.ring.RingClasses`, :class:`~.ring.RingFaults`, :class:`~.cbdlo.CbdloSweep`. The
  sweeps read ``experiments/<name>.yaml`` through :mod:`~.config`.
* A run takes the config and gives a :class:`~.output.Result`: the rows (one per run or
  point), the summary over seeds (:mod:`~.stats`), the findings, the timing.
* :func:`~.output.write_outputs` writes any result: its CSV files (the same bytes for the
  same config), its JSON document and its PNG. ``flowbus sim <name>`` (:mod:`flowbus.cli.sim`)
  does the three steps; :mod:`flowbus.spark.sweep` runs the IRBR sweeps as Spark tasks.

One module per reproduced figure or family, with the run machinery it needs:

* ``pastry_hops``: Pastry routing hops (the Pastry paper's figure 4).
* ``irbr`` (sweeps, figure 4 of the 002 document) and ``irbr_run`` (one IRBR or Scribe run
  on a static Pastry network).
* ``ring`` (the 003 document: join and repair cost, link classes, broker crashes),
  ``ring_sim`` (rings of ``RingNode`` / ``RingBroker`` cores in the simulator) and
  ``ring_plots``.
* ``cbdlo`` (the 004 document's figures 5 to 9 and APT hit rate), ``cbdlo_run`` (one CBDLO,
  Simple or TERA run on a converged network) and ``cbdlo_plots``.
"""
