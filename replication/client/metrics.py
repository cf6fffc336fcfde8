"""A client's own metrics, as Kafka's client ``metrics()`` (no metrics library needed).

A :class:`Sensor` records values (a batch's record count, a request's latency) and reads as a
lifetime total and as a rate, average or maximum over a sampled window: ``metrics.num.samples``
samples of ``metrics.sample.window.ms`` each (Kafka's defaults: 2 of 30 s). As Kafka's
``Rate``, the window a rate divides by is at least ``num.samples - 1`` sample windows, so a
rate read in the first 30 s of traffic is lower than the true one; the ``*-total`` values are
exact. An average or maximum over no sample is NaN (as Kafka's).

:class:`ProducerMetrics` and :class:`ConsumerMetrics` hold a client's sensors and read them
as one flat dict, ``{"record-send-rate": ..., "record-send-total": ...}``: Kafka's names of
the ``producer-metrics`` and ``consumer-fetch-manager-metrics`` groups. Thread-safe: the
producer's sender thread records while the application reads.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from replication.client.config import ClientConfig


class _Sample:
    __slots__ = ("count", "maximum", "start", "total")

    def __init__(self, start: float) -> None:
        self.start = start
        self.count = 0
        self.total = 0.0
        self.maximum = -math.inf


class Sensor:
    """One recorded quantity (see the module doc)."""

    def __init__(self, window_s: float, num_samples: int, clock: Callable[[], float]) -> None:
        self._window_s = window_s
        self._num_samples = num_samples
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: list[_Sample] = []
        self.count = 0
        self.total = 0.0

    def record(self, value: float = 1.0) -> None:
        with self._lock:
            now = self._clock()
            samples = self._samples
            if not samples or now - samples[-1].start >= self._window_s:
                samples.append(_Sample(now))
                del samples[: -self._num_samples]
            sample = samples[-1]
            sample.count += 1
            sample.total += value
            sample.maximum = max(sample.maximum, value)
            self.count += 1
            self.total += value

    def _live(self, now: float) -> list[_Sample]:
        oldest = now - self._window_s * self._num_samples
        return [s for s in self._samples if s.start > oldest]

    def rate(self, *, of_count: bool = False) -> float:
        """Values (or, with ``of_count``, recordings) per second over the window."""
        with self._lock:
            now = self._clock()
            live = self._live(now)
            if not live:
                return 0.0
            elapsed = max(now - live[0].start, (self._num_samples - 1) * self._window_s, 1e-3)
            return sum(s.count if of_count else s.total for s in live) / elapsed

    def avg(self) -> float:
        with self._lock:
            live = self._live(self._clock())
            count = sum(s.count for s in live)
            return sum(s.total for s in live) / count if count else math.nan

    def max(self) -> float:
        with self._lock:
            live = self._live(self._clock())
            return max(s.maximum for s in live) if live else math.nan


class _Sensors:
    """Makes the sensors of one client, with its sample window and count."""

    def __init__(self, config: ClientConfig, clock: Callable[[], float]) -> None:
        self._window_s = config.metrics_sample_window_ms / 1000
        self._num_samples = config.metrics_num_samples
        self._clock = clock

    def __call__(self) -> Sensor:
        return Sensor(self._window_s, self._num_samples, self._clock)


class ProducerMetrics:
    """Kafka's ``producer-metrics``: what the sender records, read by ``Producer.metrics()``."""

    def __init__(self, config: ClientConfig, clock: Callable[[], float] = time.monotonic) -> None:
        sensor = _Sensors(config, clock)
        #: records of each batch put in a produce request (every attempt, as Kafka counts)
        self.record_send = sensor()
        #: records of each batch to be sent again after a retriable error
        self.record_retry = sensor()
        #: records of each batch that failed for good
        self.record_error = sensor()
        #: bytes of each batch sent (encoded, compressed)
        self.batch_size = sensor()
        #: records per produce request
        self.records_per_request = sensor()
        #: milliseconds from a produce request sent to its response (acks=0: not recorded)
        self.request_latency = sensor()
        #: each produce response's throttle_time_ms (a client quota; 0 when not throttled)
        self.produce_throttle_time = sensor()

    def snapshot(self) -> dict[str, float]:
        return {
            "record-send-rate": self.record_send.rate(),
            "record-send-total": self.record_send.total,
            "record-retry-rate": self.record_retry.rate(),
            "record-retry-total": self.record_retry.total,
            "record-error-rate": self.record_error.rate(),
            "record-error-total": self.record_error.total,
            "batch-size-avg": self.batch_size.avg(),
            "batch-size-max": self.batch_size.max(),
            "records-per-request-avg": self.records_per_request.avg(),
            "request-rate": self.request_latency.rate(of_count=True),
            "request-total": float(self.request_latency.count),
            "request-latency-avg": self.request_latency.avg(),
            "request-latency-max": self.request_latency.max(),
            "produce-throttle-time-avg": self.produce_throttle_time.avg(),
            "produce-throttle-time-max": self.produce_throttle_time.max(),
        }


class ConsumerMetrics:
    """Kafka's ``consumer-fetch-manager-metrics``, read by ``Consumer.metrics()``."""

    def __init__(self, config: ClientConfig, clock: Callable[[], float] = time.monotonic) -> None:
        sensor = _Sensors(config, clock)
        #: records returned by each poll
        self.records_consumed = sensor()
        #: bytes of each partition's fetched records
        self.bytes_consumed = sensor()
        #: bytes of each fetch response's records
        self.fetch_size = sensor()
        #: records decoded from each fetch response
        self.records_per_request = sensor()
        #: milliseconds from a fetch request sent to its response (long-poll wait included)
        self.fetch_latency = sensor()

    def snapshot(self, records_lag_max: float) -> dict[str, float]:
        return {
            "records-consumed-rate": self.records_consumed.rate(),
            "records-consumed-total": self.records_consumed.total,
            "bytes-consumed-rate": self.bytes_consumed.rate(),
            "bytes-consumed-total": self.bytes_consumed.total,
            "fetch-size-avg": self.fetch_size.avg(),
            "fetch-size-max": self.fetch_size.max(),
            "records-per-request-avg": self.records_per_request.avg(),
            "fetch-rate": self.fetch_latency.rate(of_count=True),
            "fetch-total": float(self.fetch_latency.count),
            "fetch-latency-avg": self.fetch_latency.avg(),
            "fetch-latency-max": self.fetch_latency.max(),
            "records-lag-max": records_lag_max,
        }
