"""A node's metrics endpoint: the process's one CollectorRegistry, served over HTTP by
prometheus_client's own server (a daemon thread) at ``http://metrics.host:metrics.port/metrics``.

Created only when ``metrics.port`` is set (>= 0); a node without it creates no metric object,
and its hot paths count only the plain integers the collectors would read.
"""

from __future__ import annotations

import logging
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, disable_created_metrics, start_http_server

from logstore.errors import ConfigError
from replication.metrics.requests import RequestMetrics
from replication.metrics.storage import StorageMetrics

log = logging.getLogger(__name__)


class MetricsEndpoint:
    def __init__(self) -> None:
        # No ``*_created`` series beside each counter and histogram: the JMX exporter has none,
        # and they double the series per label. (A prometheus_client setting of the process:
        # the node is the only user of prometheus_client in it.)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        #: observed by the socket servers of every listener
        self.requests = RequestMetrics(self.registry)
        #: bound to the node's storages (Storage.observer)
        self.storage = StorageMetrics(self.registry)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self, host: str, port: int) -> int:
        """Serve the registry on ``host:port`` (0: any free port); returns the bound port."""
        try:
            self._server, self._thread = start_http_server(port, host, registry=self.registry)
        except OSError as err:
            raise ConfigError(
                f"config metrics.port={port}: the metrics endpoint cannot listen on "
                f"{host}:{port} ({err}); use a free port (0: any), or -1 for no endpoint"
            ) from err
        bound: int = self._server.server_port
        log.info("metrics on http://%s:%d/metrics", host, bound)
        return bound

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
