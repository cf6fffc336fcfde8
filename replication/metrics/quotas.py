"""The client quota metrics of a broker, per quota entity, as Kafka's
``kafka.server:type=Produce|Fetch|Request,user=...,client-id=...`` (named as the JMX exporter
names them), read from the quota managers at scrape time:

- ``kafka_server_produce_byte_rate`` and ``kafka_server_fetch_byte_rate``: bytes/s recorded
  against the quota over the last 10 s;
- ``kafka_server_request_request_time``: request handling time over the last 10 s, in percent
  of one request handler (what ``request_percentage`` bounds);
- ``kafka_server_{produce,fetch,request}_throttle_time``: the mean throttle time (ms) per
  request over the last 10 s.

The labels are the quota's sensor's (Kafka's tags): ``user`` and ``client_id``, "" where the
quota is not per that type (a user quota is shared by all that user's client ids). Only
entities with a quota and recent traffic are exported.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from replication.broker.quota_manager import QuotaManagers
from replication.metrics.snapshot import on_loop

_RATE_NAMES = {"Produce": "byte_rate", "Fetch": "byte_rate", "Request": "request_time"}


class QuotaCollector:
    def __init__(
        self, quotas: QuotaManagers, loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self.quotas = quotas
        self.loop = loop

    def collect(self) -> Iterable[Metric]:
        return on_loop(self.loop, self.read)

    def read(self) -> list[Metric]:
        out: list[Metric] = []
        for manager in self.quotas.all():
            kind = manager.quota_type
            prefix = f"kafka_server_{kind.lower()}_"
            rate = GaugeMetricFamily(
                prefix + _RATE_NAMES[kind],
                f"{kind}: the rate recorded against the client quota over the last 10 s "
                f"({'percent of one request handler' if kind == 'Request' else 'bytes/s'})",
                labels=["user", "client_id"],
            )
            throttle = GaugeMetricFamily(
                prefix + "throttle_time",
                f"{kind}: mean throttle time per request (ms) over the last 10 s",
                labels=["user", "client_id"],
            )
            for m in manager.metrics():
                rate.add_metric([m.user, m.client_id], m.rate)
                throttle.add_metric([m.user, m.client_id], m.throttle_time_ms)
            out += [rate, throttle]
        return out
