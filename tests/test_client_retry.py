"""The client's one retry loop (replication/client/retry.py), on a fake clock: no sleeps."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pytest

from replication.client.retry import RetryPolicy, call_with_retries, exhausted
from replication.errors import (
    BrokerUnreachableError,
    InvalidTopicError,
    LeaderNotAvailableError,
    NotEnoughReplicasError,
    ReplogError,
)

pytestmark = pytest.mark.unit


class FakeClock:
    """Time moves only when the loop sleeps; ``rand`` is the jitter draw."""

    def __init__(self, rand: float = 0.5) -> None:
        self.now = 1000.0
        self.rand = rand
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds

    def random(self) -> float:
        return self.rand


def failing(errors: list[ReplogError], result: str = "ok") -> tuple[Callable[[], str], list[int]]:
    """A call that raises ``errors`` in turn, then returns ``result``; counts its calls."""
    calls = [0]

    def call() -> str:
        calls[0] += 1
        if errors:
            raise errors.pop(0)
        return result

    return call, calls


def test_returns_after_retriable_errors_with_growing_backoff() -> None:
    clock = FakeClock()
    call, calls = failing([LeaderNotAvailableError("no leader")] * 3)
    policy = RetryPolicy(timeout_ms=60_000, backoff_ms=100, backoff_max_ms=10_000, jitter=0.0)
    assert call_with_retries("asking", call, policy, clock=clock) == "ok"
    assert calls[0] == 4
    assert clock.sleeps == pytest.approx([0.1, 0.2, 0.4])


def test_backoff_caps_at_backoff_max() -> None:
    policy = RetryPolicy(timeout_ms=None, backoff_ms=100, backoff_max_ms=1000, max_retries=99)
    waits = [policy.backoff_s(attempt) for attempt in range(1, 10)]
    assert waits == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0, 1.0])
    # a huge attempt number neither overflows nor passes the cap
    assert policy.backoff_s(10_000) == pytest.approx(1.0)
    # backoff.max.ms below backoff.ms: backoff.ms wins (as Kafka)
    flat = RetryPolicy(timeout_ms=1000, backoff_ms=500, backoff_max_ms=100)
    assert flat.backoff_s(1) == flat.backoff_s(5) == pytest.approx(0.5)


def test_jitter_spreads_waits_within_its_bounds_and_under_the_cap() -> None:
    policy = RetryPolicy(timeout_ms=1000, backoff_ms=100, backoff_max_ms=1000, jitter=0.2)
    assert policy.backoff_s(1, rand=0.0) == pytest.approx(0.08)
    assert policy.backoff_s(1, rand=0.5) == pytest.approx(0.1)
    assert policy.backoff_s(1, rand=0.999999) == pytest.approx(0.12, rel=1e-4)
    assert policy.backoff_s(20, rand=0.999999) == pytest.approx(1.0)  # capped after jitter
    with pytest.raises(ValueError, match="jitter"):
        RetryPolicy(timeout_ms=1000, jitter=1.0)


def test_deadline_is_honoured_and_the_error_names_what_and_how_long() -> None:
    clock = FakeClock()
    start = clock.now
    errors: list[ReplogError] = [NotEnoughReplicasError(f"isr too small {i}") for i in range(100)]
    call, calls = failing(errors)
    policy = RetryPolicy(
        timeout_ms=2000, backoff_ms=100, backoff_max_ms=500, timeout_name="default.api.timeout.ms"
    )
    with pytest.raises(NotEnoughReplicasError) as info:
        call_with_retries("listing offsets", call, policy, clock=clock)
    assert clock.now - start == pytest.approx(2.0)  # the last wait was cut to the deadline
    assert max(clock.sleeps) <= 0.5
    message = str(info.value)
    assert message.startswith(f"listing offsets: gave up after {calls[0]} attempts in 2.0 s")
    assert "default.api.timeout.ms=2000" in message
    assert message.endswith(f"isr too small {calls[0] - 1}")  # the last error's text
    assert isinstance(info.value.__cause__, NotEnoughReplicasError)
    assert str(info.value.__cause__) == f"isr too small {calls[0] - 1}"


def test_no_attempt_starts_after_the_deadline() -> None:
    clock = FakeClock()
    starts: list[float] = []

    def call() -> str:
        starts.append(clock.now)
        clock.now += 0.7  # each attempt takes 0.7 s
        raise LeaderNotAvailableError()

    policy = RetryPolicy(timeout_ms=1000, backoff_ms=100, backoff_max_ms=100, jitter=0.0)
    with pytest.raises(LeaderNotAvailableError, match=r"gave up after 2 attempts in 1\.5 s"):
        call_with_retries("x", call, policy, clock=clock)
    assert all(t < 1000.0 + 1.0 for t in starts)


def test_non_retriable_error_is_raised_at_once_unchanged() -> None:
    clock = FakeClock()
    error = InvalidTopicError("bad name")
    call, calls = failing([LeaderNotAvailableError(), error])
    policy = RetryPolicy(timeout_ms=60_000)
    with pytest.raises(InvalidTopicError) as info:
        call_with_retries("creating topics", call, policy, clock=clock)
    assert info.value is error
    assert calls[0] == 2
    assert len(clock.sleeps) == 1


def test_other_exceptions_are_not_caught() -> None:
    clock = FakeClock()

    def call() -> str:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        call_with_retries("x", call, RetryPolicy(timeout_ms=1000), clock=clock)
    assert clock.sleeps == []


def test_retriable_predicate_and_on_retry_hook() -> None:
    clock = FakeClock()
    unreachable = BrokerUnreachableError("127.0.0.1", 1, "refused")
    call, _ = failing([unreachable])
    with pytest.raises(BrokerUnreachableError) as info:
        call_with_retries(
            "x", call, RetryPolicy(timeout_ms=1000), retriable=lambda e: False, clock=clock
        )
    assert info.value is unreachable

    seen: list[tuple[str, int]] = []
    call, _ = failing([LeaderNotAvailableError("a"), LeaderNotAvailableError("b")])
    result = call_with_retries(
        "x",
        call,
        RetryPolicy(timeout_ms=1000),
        on_retry=lambda err, attempt: seen.append((str(err), attempt)),
        clock=clock,
    )
    assert result == "ok"
    assert seen == [("a", 1), ("b", 2)]

    # an error from on_retry ends the loop
    def give_up(err: ReplogError, attempt: int) -> None:
        raise InvalidTopicError("the topic does not exist")

    call, calls = failing([LeaderNotAvailableError()] * 5)
    with pytest.raises(InvalidTopicError):
        call_with_retries("x", call, RetryPolicy(timeout_ms=1000), on_retry=give_up, clock=clock)
    assert calls[0] == 1


def test_max_retries_bound_without_a_deadline() -> None:
    clock = FakeClock()
    call, calls = failing([LeaderNotAvailableError()] * 10)
    policy = RetryPolicy(timeout_ms=None, backoff_ms=50, backoff_max_ms=50, max_retries=3, jitter=0)
    with pytest.raises(LeaderNotAvailableError, match=r"gave up after 4 attempts .*\(3 retries\)"):
        call_with_retries("fetching offsets", call, policy, clock=clock)
    assert calls[0] == 4
    assert clock.sleeps == pytest.approx([0.05] * 3)
    with pytest.raises(ValueError, match="needs a timeout"):
        call_with_retries("x", call, RetryPolicy(timeout_ms=None), clock=clock)


def test_explicit_deadline_replaces_the_timeout() -> None:
    clock = FakeClock()
    call, calls = failing([LeaderNotAvailableError()] * 100)
    with pytest.raises(LeaderNotAvailableError, match=r"in 0\.3 s \(the caller's deadline\)"):
        call_with_retries(
            "x",
            call,
            RetryPolicy(timeout_ms=None, backoff_ms=100, backoff_max_ms=100, jitter=0),
            deadline=clock.now + 0.3,
            clock=clock,
        )
    assert calls[0] == 4


def test_exhausted_keeps_the_class_and_broker_address() -> None:
    plain = exhausted(NotEnoughReplicasError("isr is 1"), "producing: gave up")
    assert type(plain) is NotEnoughReplicasError
    assert str(plain) == "producing: gave up: isr is 1"

    unreachable = exhausted(BrokerUnreachableError("10.0.0.1", 9092, "refused"), "gave up")
    assert isinstance(unreachable, BrokerUnreachableError)
    assert (unreachable.host, unreachable.port) == ("10.0.0.1", 9092)
    assert "gave up; refused" in str(unreachable)
    again = pickle.loads(pickle.dumps(unreachable))
    assert str(again) == str(unreachable)
