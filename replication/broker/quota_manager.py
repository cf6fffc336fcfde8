"""Client quotas on a broker, as Kafka's ClientQuotaManager (produce and fetch byte rates) and
ClientRequestQuotaManager (request time): what each request records against the quota that
applies to its user and client id, and how long that client is throttled for it.

The quotas come from the metadata image (:mod:`replication.client_quotas` resolves them), so
every broker enforces the same ones; each broker meters what it is sent itself (as Kafka's:
a quota is per broker). A quota's sensor is shared as Kafka's metric tags say (a user quota by
all that user's clients, ...), and meters with a token bucket holding one second of the quota:

- Produce records the request's bytes once it is answered, Fetch (a consumer's) the bytes of
  its records, every request the time it was handled (without its waits in a purgatory, for
  the ISR or for min_bytes: Kafka meters a request handler thread's time, and a parked
  request holds none). 100% of request time is one second of handling per second.
- A sensor in debt throttles its client for the time the quota takes to repay it (at most
  :data:`MAX_THROTTLE_MS`, Kafka's quota.window.num * quota.window.size.seconds). As Kafka
  since KIP-219, the broker answers at once with that ``throttle_time_ms`` and then reads
  nothing more from the connection for that long; a client that knows KIP-219 waits too.
- A fetch asks for no more than one second of its consumer's quota (Kafka caps fetch.max.bytes
  at the quota's window likewise), so one fetch cannot run up a long debt.

Replication (a follower's Fetch) and the requests of brokers to their controller are never
throttled, as in Kafka. A sensor idle long enough to be full again is dropped, so the number
of sensors is bounded by the clients active in the last second or so.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final

from replication import protocol as p
from replication.broker.throttle import TokenBucket
from replication.client_quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaIndex,
    Quotas,
    quota_index,
    resolve,
)

__all__ = [
    "EXEMPT_APIS",
    "FETCH_QUOTA_BYTES",
    "MAX_THROTTLE_MS",
    "ClientQuotaManager",
    "QuotaManagers",
    "fetched_bytes",
    "with_throttle_time",
]

#: the longest throttle one request gets (Kafka's default 11 windows of 1 s)
MAX_THROTTLE_MS: Final = 11_000
#: the seconds of history of the byte-rate and throttle-time metrics
METRIC_WINDOW_S: Final = 10
#: sensors kept before idle (full) ones are dropped
_PRUNE_ABOVE: Final = 256

#: requests of brokers to their controller: never throttled (Kafka exempts ClusterAction)
EXEMPT_APIS: Final = frozenset(
    {
        p.ApiKey.BROKER_REGISTRATION,
        p.ApiKey.BROKER_HEARTBEAT,
        p.ApiKey.ALTER_PARTITION,
        p.ApiKey.ALLOCATE_PRODUCER_IDS,
        p.ApiKey.WRITE_TXN_MARKERS,
        p.ApiKey.API_VERSIONS,
    }
)


@dataclass
class _Sensor:
    """The meter of one quota entity (its user and client-id tags)."""

    bucket: TokenBucket
    #: per-second (second, value recorded, throttle ms given, requests) of the last
    #: METRIC_WINDOW_S seconds, for the metrics
    samples: collections.deque[list[float]] = field(default_factory=collections.deque)

    def sample(self, now: float, value: float, throttle_ms: int) -> None:
        second = math.floor(now)
        if not self.samples or self.samples[-1][0] != second:
            self.samples.append([second, 0.0, 0.0, 0.0])
            while self.samples[0][0] <= second - METRIC_WINDOW_S:
                self.samples.popleft()
        last = self.samples[-1]
        last[1] += value
        last[2] += throttle_ms
        last[3] += 1


@dataclass(frozen=True, slots=True)
class QuotaMetric:
    """One sensor's figures over the last METRIC_WINDOW_S seconds."""

    user: str
    client_id: str
    #: value recorded per second (bytes/s; for request time, percent of one handler)
    rate: float
    #: mean throttle time per request, ms (Kafka's throttle-time)
    throttle_time_ms: float


class ClientQuotaManager:
    """One quota type: ``Produce`` (producer_byte_rate), ``Fetch`` (consumer_byte_rate) or
    ``Request`` (request_percentage, values in seconds)."""

    def __init__(
        self,
        quota_type: str,
        key: str,
        quotas: Callable[[], Quotas],
        *,
        scale: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.quota_type = quota_type
        self.key = key
        self._quotas = quotas
        #: quota value -> units per second (request_percentage 100 -> 1 s of handling per s)
        self._scale = scale
        self._clock = clock
        self._sensors: dict[tuple[str, str], _Sensor] = {}
        #: (the image's quotas, their index): rebuilt when the image's quotas change
        self._index: tuple[Quotas, QuotaIndex] = ((), {})

    def _bound(self, user: str, client_id: str) -> tuple[float, tuple[str, str]] | None:
        quotas = self._quotas()
        if quotas is not self._index[0]:
            self._index = (quotas, quota_index(quotas))
        match = resolve(self._index[1], self.key, user, client_id)
        if match is None:
            return None
        return match.bound * self._scale, (match.user, match.client_id)

    def record(self, user: str, client_id: str, value: float) -> int:
        """Record ``value`` against the quota of ``user`` and ``client_id``; the throttle
        time (ms) it earns, 0 if within the quota (or none applies)."""
        found = self._bound(user, client_id)
        if found is None:
            return 0
        rate, tags = found
        sensor = self._sensors.get(tags)
        if sensor is None:
            if len(self._sensors) >= _PRUNE_ABOVE:
                self._prune()
            sensor = self._sensors[tags] = _Sensor(TokenBucket(rate, clock=self._clock))
        bucket = sensor.bucket
        bucket.set_rate(rate)
        bucket.consume(value)
        tokens = bucket.available()
        throttle_ms = 0 if tokens >= 0 else min(MAX_THROTTLE_MS, math.ceil(-tokens / rate * 1000))
        sensor.sample(self._clock(), value, throttle_ms)
        return throttle_ms

    def max_value_in_window(self, user: str, client_id: str) -> float | None:
        """The most one request may take: one second of the quota (None: no quota)."""
        found = self._bound(user, client_id)
        return None if found is None else found[0]

    def _prune(self) -> None:
        for tags, sensor in list(self._sensors.items()):
            if sensor.bucket.available() >= sensor.bucket.rate:
                del self._sensors[tags]

    def metrics(self) -> Iterator[QuotaMetric]:
        now = math.floor(self._clock())
        for (user, client_id), sensor in self._sensors.items():
            recent = [s for s in sensor.samples if s[0] > now - METRIC_WINDOW_S]
            value = sum(s[1] for s in recent)
            requests = sum(s[3] for s in recent)
            rate = value / METRIC_WINDOW_S
            if self.key == REQUEST_PERCENTAGE:
                rate *= 100  # seconds per second -> percent of one handler
            throttle = sum(s[2] for s in recent) / requests if requests else 0.0
            yield QuotaMetric(user, client_id, rate, throttle)


class QuotaManagers:
    """A broker's three client quota managers (Kafka's QuotaManagers), over the quotas of its
    metadata image (``quotas()``, read at each request)."""

    def __init__(
        self, quotas: Callable[[], Quotas], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.produce = ClientQuotaManager("Produce", PRODUCER_BYTE_RATE, quotas, clock=clock)
        self.fetch = ClientQuotaManager("Fetch", CONSUMER_BYTE_RATE, quotas, clock=clock)
        self.request = ClientQuotaManager(
            "Request", REQUEST_PERCENTAGE, quotas, scale=0.01, clock=clock
        )
        self._quotas = quotas

    @property
    def active(self) -> bool:
        """Whether any client quota is set (none: requests skip the quota path)."""
        return bool(self._quotas())

    def all(self) -> tuple[ClientQuotaManager, ...]:
        return self.produce, self.fetch, self.request


#: the bytes the current Fetch may return under its consumer's quota (None: no cap), set by the
#: socket server for the fetch handler
FETCH_QUOTA_BYTES: ContextVar[int | None] = ContextVar("FETCH_QUOTA_BYTES", default=None)


def with_throttle_time(response: Any, throttle_ms: int) -> Any:
    """``response`` (a replog message, or the mapping a Kafka handler builds) carrying
    ``throttle_time_ms``; a response without the field is returned as it is."""
    if isinstance(response, dict):
        return {**response, "throttle_time_ms": throttle_ms}
    if (
        dataclasses.is_dataclass(response)
        and not isinstance(response, type)
        and any(f.name == "throttle_time_ms" for f in dataclasses.fields(response))
    ):
        return dataclasses.replace(response, throttle_time_ms=throttle_ms)
    return response


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def fetched_bytes(response: Any) -> int:
    """The record bytes of a Fetch response (a replog FetchResponse, or the Kafka listener's
    mapping of one)."""
    total = 0
    for topic in _get(response, "responses") or ():
        for partition in _get(topic, "partitions") or ():
            records = _get(partition, "records")
            if records is not None:
                total += len(records)
    return total
