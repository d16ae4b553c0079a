"""Fault campaigns on real brokers: ``flowbus chaos``.

How it works: a campaign runs, for each fault mix and seed, a fresh ring of ``flowbus broker
start`` processes, each in a network namespace of its own (as root; else on loopback, with
faults of processes only), with a workload of publishers and durable subscribers in
another, and strikes them with a seeded schedule of faults (crashes, pauses, partitions,
cut client links, full disks, power losses, restarts, brokers starved of CPU; delayed,
lossy, duplicating and reordering links, and clients cut at a publish acknowledgement,
through a proxy in front of each broker). Every publish and every delivery is logged; the
checker then counts, offline, what was acknowledged and lost, duplicated, misrouted, out of
order, how long subscriptions took to catch up after each heal, and whether a publish hung.
The parts:

* :mod:`~flowbus.chaos.hosts` -- namespaces, links, disks, cpu cgroups, and their cleanup;
* :mod:`~flowbus.chaos.brokers` -- the broker processes;
* :mod:`~flowbus.chaos.nemesis` -- the faults, the mixes, the seeded schedules;
* :mod:`~flowbus.chaos.proxy` -- the proxy in front of a broker that strikes its links;
* :mod:`~flowbus.chaos.workload` -- the clients (a process of its own);
* :mod:`~flowbus.chaos.check` -- the offline checker;
* :mod:`~flowbus.chaos.campaign` -- runs and campaigns;
* :mod:`~flowbus.chaos.report` -- CSV, the timeline plots, the campaign's plot.
"""
