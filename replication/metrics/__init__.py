"""Prometheus metrics of a replog node, named as the Prometheus JMX exporter names Kafka's
(``kafka_server_replicamanager_underreplicatedpartitions``, ...), plus ``replog_*`` metrics of
what Kafka does not have (object storage, metadata writes).

- :mod:`.endpoint`: the process's one CollectorRegistry, served over HTTP (``metrics.port``);
- :mod:`.requests`: request counts and times per API, observed by the socket servers;
- :mod:`.storage`: storage requests, bound to logstore's storage observer;
- :mod:`.broker` and :mod:`.controller`: collectors that read the node's state at scrape
  time (gauges, and the counters the hot paths keep as plain integers);
- :mod:`.quotas`: the client quota metrics per user and client id, read from the quota
  managers at scrape time;
- :mod:`.snapshot`: running a collector's read on the node's event loop.

The hot paths (produce, fetch) never touch a metrics library except for the request time
histogram: state-derived values are computed only when Prometheus scrapes.
"""
