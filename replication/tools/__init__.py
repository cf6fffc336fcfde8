"""Tools on top of the client and the node: the ``replog`` CLI, local clusters of processes,
the perf tools. (``replog demo`` runs :mod:`datasource.demo`, which needs Spark.)"""
