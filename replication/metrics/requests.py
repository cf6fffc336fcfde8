"""Request metrics per API, as Kafka's RequestMetrics (``kafka.network``).

Every request a listener handles counts once, under Kafka's name of its API (``Produce``,
``Fetch``, ``Metadata``, ...; a follower's Fetch is ``FetchFollower``, as in Kafka), on
replog's listener and on the Kafka listener alike. Its total time runs from the decoded
request to the response written to the socket, long-poll waits included (Kafka's
TotalTimeMs).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

#: seconds: sub-millisecond metadata answers up to long-polled fetches and timed-out produces
TIME_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


class RequestMetrics:
    """``kafka_network_requestmetrics_requests_total`` and ``..._totaltime_seconds``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._requests = Counter(
            "kafka_network_requestmetrics_requests",
            "Requests handled, by Kafka's API name (FetchFollower: fetches of followers)",
            ["request"],
            registry=registry,
        )
        self._time = Histogram(
            "kafka_network_requestmetrics_totaltime_seconds",
            "Time from a decoded request to its response written, by Kafka's API name",
            ["request"],
            buckets=TIME_BUCKETS,
            registry=registry,
        )
        #: the labelled children by request name (labels() costs a lock and a lookup)
        self._children: dict[str, tuple[Counter, Histogram]] = {}
        self._authentications = {
            ok: Counter(
                f"kafka_server_socket_server_metrics_{'successful' if ok else 'failed'}"
                "_authentication",
                f"Connections {'authenticated' if ok else 'refused'} by TLS or SASL, by "
                "listener (Kafka's socket-server-metrics)",
                ["listener"],
                registry=registry,
            )
            for ok in (True, False)
        }

    def authentication(self, listener: str, ok: bool) -> None:
        """One connection authenticated (``ok``) or refused on ``listener``."""
        self._authentications[ok].labels(listener).inc()

    def observe(self, request: str, seconds: float) -> None:
        children = self._children.get(request)
        if children is None:
            children = (self._requests.labels(request), self._time.labels(request))
            self._children[request] = children
        children[0].inc()
        children[1].observe(seconds)
