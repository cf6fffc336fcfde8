"""The replication throttle of replicas catching up in a reassignment (Kafka's
follower.replication.throttled.rate, KIP-73): a token bucket on fetched bytes. The client
quotas (:mod:`replication.broker.quota_manager`) meter with the same bucket.

The bucket holds up to one second of ``rate`` bytes. A fetch of throttled partitions asks for
no more than the bucket holds (at least one byte: a leader still returns one whole batch, as
Kafka's KIP-74) and takes what came back; while the bucket is empty those partitions are left
out of fetches. So over any window of ``t`` seconds a throttled follower fetches at most
``rate * (t + 1)`` bytes plus one batch.

    >>> clock = [0.0]
    >>> bucket = TokenBucket(1000, clock=lambda: clock[0])
    >>> bucket.available()
    1000.0
    >>> bucket.consume(1500); bucket.available()
    -500.0
    >>> bucket.seconds_until_available()
    0.5
    >>> clock[0] = 1.0; bucket.available()
    500.0
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """``rate`` units/s (bytes, or seconds of request time for the client request quota),
    bursts of up to one second's worth; 0 = no limit."""

    def __init__(self, rate: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.rate = rate
        self._tokens = float(rate)
        self._last = clock()

    def set_rate(self, rate: float) -> None:
        if rate != self.rate:
            self._refill()
            self.rate = rate
            self._tokens = min(self._tokens, float(rate))

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.rate), self._tokens + (now - self._last) * self.rate)
        self._last = now

    def available(self) -> float:
        """Bytes that may be fetched now (negative: a debt to wait out)."""
        if self.rate <= 0:
            return float("inf")
        self._refill()
        return self._tokens

    def consume(self, size: float) -> None:
        if self.rate > 0:
            self._refill()
            self._tokens -= size

    def seconds_until_available(self) -> float:
        """How long until the bucket holds a byte again (0 if it does)."""
        tokens = self.available()
        return 0.0 if tokens > 0 else max(-tokens, 1.0) / self.rate
