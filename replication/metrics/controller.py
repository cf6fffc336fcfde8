"""The controller's metrics (a prometheus_client Collector), as Kafka's KafkaController.

Only the active controller reports the cluster's counts; a standby reports 0 for each, so
each count summed over the controller candidates is the cluster's, and
``activecontrollercount`` sums to 1 in a healthy cluster (Kafka's alerting rule).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from replication.controller.service import ControllerService
from replication.metadata.image import MetadataImage
from replication.metrics.snapshot import on_loop

#: seconds: a local put-if-absent to a slow S3 conditional PUT
WRITE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def metadata_write_histogram(registry: CollectorRegistry) -> Histogram:
    """``replog_metadata_write_duration_seconds``: each metadata version the controller
    writes (MetadataStore.write), whatever its outcome."""
    return Histogram(
        "replog_metadata_write_duration_seconds",
        "Duration of the controller's metadata version writes",
        buckets=WRITE_BUCKETS,
        registry=registry,
    )


class ControllerCollector:
    def __init__(
        self, service: ControllerService, loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self.service = service
        self.loop = loop

    def collect(self) -> Iterable[Metric]:
        return on_loop(self.loop, self.read)

    def read(self) -> list[Metric]:
        active = self.service.active
        image = self.service.controller.image if active else MetadataImage()
        partitions = [p for t in image.topics for p in t.partitions]
        prefix = "kafka_controller_kafkacontroller_"
        return [
            _gauge(prefix + "activecontrollercount", "1 on the active controller", int(active)),
            _gauge(
                prefix + "offlinepartitionscount",
                "Partitions without a leader",
                sum(1 for p in partitions if p.leader < 0),
            ),
            _gauge(prefix + "globalpartitioncount", "Partitions in the cluster", len(partitions)),
            _gauge(prefix + "globaltopiccount", "Topics in the cluster", len(image.topics)),
            _gauge(
                prefix + "activebrokercount",
                "Registered brokers not fenced",
                sum(1 for b in image.brokers if not b.fenced),
            ),
            _gauge(
                prefix + "fencedbrokercount",
                "Registered brokers fenced (session expired or shut down)",
                sum(1 for b in image.brokers if b.fenced),
            ),
        ]


def _gauge(name: str, documentation: str, value: float) -> Metric:
    return GaugeMetricFamily(name, documentation, value=value)
