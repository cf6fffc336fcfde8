"""Retrying a request: one policy (deadline, exponential backoff with jitter), one loop.

Every client call that retries requests (Admin, the transaction coordinator, ListOffsets, the
producer's wait for a topic's metadata, the Spark driver's questions) goes through
:func:`call_with_retries`::

    policy = RetryPolicy.of(config, config.default_api_timeout_ms, "default.api.timeout.ms")
    topics = call_with_retries("describing topics", lambda: describe(names), policy)

An attempt that raises a retriable error (``ReplogError.retriable``, or what ``retriable``
says) is tried again after a backoff — retry.backoff.ms, doubling per attempt up to
retry.backoff.max.ms, each wait spread by ±20 % as Kafka's ``ExponentialBackoff`` does, so
clients that failed together do not retry together — until the deadline. Any other error is
raised at once. At the deadline the last error is raised again as a new error of the same
class whose message says what was tried, how many times and for how long, ``from`` the last
one (:func:`exhausted`).

The producer's sender retries batches without blocking (each batch carries its own retry
time): it uses :meth:`RetryPolicy.backoff_s` for the same waits.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from replication.errors import BrokerUnreachableError, ReplogError

__all__ = [
    "SYSTEM_CLOCK",
    "Clock",
    "RetryPolicy",
    "call_with_retries",
    "exhausted",
    "is_retriable",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


class _Config(Protocol):
    @property
    def retry_backoff_ms(self) -> int: ...
    @property
    def retry_backoff_max_ms(self) -> int: ...


class Clock(Protocol):
    """What the retry loop needs of time (tests pass a fake one)."""

    def monotonic(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...
    def random(self) -> float:
        """Uniform in [0, 1): picks the jitter."""
        ...


class _SystemClock:
    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)
    random = staticmethod(random.random)


SYSTEM_CLOCK: Clock = _SystemClock()


@dataclass(frozen=True)
class RetryPolicy:
    """How long and how often a request is retried (Kafka's retry.backoff.ms and
    retry.backoff.max.ms, plus the deadline of the call).

    ``timeout_ms`` None: the caller passes a deadline, or only ``max_retries`` bounds the
    retries. ``timeout_name`` is the setting the timeout came from, named in the error at the
    deadline.
    """

    timeout_ms: int | None
    backoff_ms: int = 100
    backoff_max_ms: int = 1000
    #: Retries after the first attempt (None: as many as the deadline allows).
    max_retries: int | None = None
    #: Each wait is multiplied by a random factor in [1 - jitter, 1 + jitter).
    jitter: float = 0.2
    timeout_name: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")

    @classmethod
    def of(cls, config: _Config, timeout_ms: int | None, timeout_name: str = "") -> RetryPolicy:
        """The policy of a client's settings (retry.backoff.ms, retry.backoff.max.ms)."""
        return cls(
            timeout_ms=timeout_ms,
            backoff_ms=config.retry_backoff_ms,
            backoff_max_ms=config.retry_backoff_max_ms,
            timeout_name=timeout_name,
        )

    def backoff_s(self, attempt: int, rand: float = 0.5) -> float:
        """The wait after failed attempt ``attempt`` (1-based), in seconds: backoff.ms doubled
        per attempt, times a jitter factor picked by ``rand`` in [0, 1) (0.5: none), at most
        backoff.max.ms (or backoff.ms, if that is larger)."""
        term = self.backoff_ms * 2.0 ** min(max(attempt - 1, 0), 30)
        factor = 1 + self.jitter * (2 * rand - 1)
        cap = max(self.backoff_max_ms, self.backoff_ms)
        return min(term * factor, cap) / 1000

    def describe_timeout(self) -> str:
        if self.timeout_ms is None:
            if self.max_retries is not None:
                return f"{self.max_retries} retries"
            return self.timeout_name or "the caller's deadline"
        if self.timeout_name:
            return f"{self.timeout_name}={self.timeout_ms}"
        return f"timeout {self.timeout_ms} ms"


def is_retriable(error: BaseException) -> bool:
    """The default test: replog errors whose class says ``retriable``."""
    return isinstance(error, ReplogError) and error.retriable


def exhausted(last: ReplogError, text: str) -> ReplogError:
    """A new error of ``last``'s class saying ``text``, then ``last``'s message; raise it
    ``from last``.

    Callers catch by class (UnknownTopicOrPartitionError, NotEnoughReplicasError...), so the
    class stays. Every retriable class takes its message as its only argument, except
    BrokerUnreachableError, which carries the address it could not reach.
    """
    if isinstance(last, BrokerUnreachableError):
        reason = f"{text}; {last.reason}" if last.reason else text
        return BrokerUnreachableError(last.host, last.port, reason)
    return type(last)(f"{text}: {last}")


def call_with_retries(
    what: str,
    call: Callable[[], T],
    policy: RetryPolicy,
    *,
    retriable: Callable[[BaseException], bool] = is_retriable,
    on_retry: Callable[[ReplogError, int], None] | None = None,
    deadline: float | None = None,
    log_level: int = logging.WARNING,
    clock: Clock = SYSTEM_CLOCK,
) -> T:
    """``call()``, tried again after retriable errors until the policy's deadline.

    ``what`` names the call in logs and in the error at the deadline ("listing offsets").
    ``on_retry(error, attempt)`` runs after each retriable failure, before the deadline is
    checked (refresh metadata, find a coordinator again); an error it raises ends the loop.
    ``deadline`` (``clock.monotonic()`` time) replaces the policy's timeout, for callers that
    share one deadline between several calls. The first attempt always runs; no attempt
    starts after the deadline. Each retry is logged at ``log_level`` (WARNING, with the
    attempt; DEBUG for expected waits such as a new topic's metadata reaching a broker).

    Raises the first non-retriable error as it is, and at the deadline (or after
    ``max_retries``) :func:`exhausted` of the last error, e.g. ``NotEnoughReplicasError:
    listing offsets: gave up after 7 attempts in 30.0 s (default.api.timeout.ms=30000): ...``.
    """
    start = clock.monotonic()
    if deadline is None and policy.timeout_ms is not None:
        deadline = start + policy.timeout_ms / 1000
    if deadline is None and policy.max_retries is None:
        raise ValueError(f"{what}: retrying needs a timeout, a deadline or max_retries")
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except ReplogError as err:
            if not retriable(err):
                raise
            if on_retry is not None:
                on_retry(err, attempt)
            now = clock.monotonic()
            remaining = None if deadline is None else deadline - now
            out_of_retries = policy.max_retries is not None and attempt > policy.max_retries
            if out_of_retries or (remaining is not None and remaining <= 0):
                raise exhausted(
                    err,
                    f"{what}: gave up after {attempt} attempt{'s' if attempt > 1 else ''} in "
                    f"{now - start:.1f} s ({policy.describe_timeout()})",
                ) from err
            delay = policy.backoff_s(attempt, clock.random())
            if remaining is not None:
                delay = min(delay, remaining)
            log.log(
                log_level,
                "%s failed (attempt %d, retrying in %d ms): %s",
                what,
                attempt,
                round(delay * 1000),
                err,
            )
            clock.sleep(delay)
