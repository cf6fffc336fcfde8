"""A Jepsen-style fault-injection harness for replog.

``python -m tests.chaos --seed 1 --schedules 100`` runs seeded schedules, each against a fresh
cluster of real processes (2 controllers, 3 brokers behind proxies, on storage that can fail):
workloads write and read while a seeded nemesis kills, pauses, cuts, stalls and breaks storage,
empties a broker's store, fills its disk and steps a node's wall clock;
then the cluster is healed and stopped, and a checker compares what clients were told with what
the logs and every replica hold. One JSON line per schedule, then a summary line.

Modules: :mod:`~tests.chaos.launcher` (a broker with faulty storage), :mod:`~tests.chaos.cluster`
(the processes and proxies), :mod:`~tests.chaos.disks` (a broker's tmpfs disk),
:mod:`~tests.chaos.clocks` (a node's wall clock under libfaketime), :mod:`~tests.chaos.nemesis`
(the faults),
:mod:`~tests.chaos.workload` (producers and readers), :mod:`~tests.chaos.kafka_workload` (the
same on confluent-kafka, through the Kafka listeners), :mod:`~tests.chaos.history` (what is
recorded), :mod:`~tests.chaos.checker` (the rules), :mod:`~tests.chaos.runner` (one schedule).
This package imports nothing at import time, so the launcher starts fast in broker processes.
"""
