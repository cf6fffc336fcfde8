"""What many test modules (and the chaos harness) need, kept once: unique names, free ports,
polling a condition with a deadline, and reading partitions to their end through the client.

    topic = unique_name("orders")                       # "orders-1f0c9a7e"
    wait_until(lambda: broker.alive, message="the broker up")
    records = read_to_end(bootstrap, [TopicPartition(topic, 0)]).records

Wire-level reads (a raw Fetch loop) are in :mod:`tests.wire`; broker processes in
:mod:`tests.cluster`.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from replication.client import Consumer, ConsumerRecord, TopicPartition

T = TypeVar("T")


def unique_name(prefix: str = "t") -> str:
    """``<prefix>-<8 hex digits>``: a topic (or transactional id, bucket...) no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago. Another process may take it before
    the caller binds it: callers that cannot use port 0 retry on a failed start."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(
    # Callable[..., ...]: mypy infers no type for a lambda binding a loop variable as a default
    # argument (``lambda i=i: ...``) against Callable[[], ...]. It is called with no argument.
    condition: Callable[..., T | None],
    timeout: float = 30,
    interval: float = 0.02,
    message: str = "",
) -> T:
    """Poll ``condition()`` until it returns a truthy value (returned) or fail after ``timeout``
    seconds with an AssertionError naming ``message``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or condition}")
        time.sleep(interval)


class PartitionsRead(NamedTuple):
    """What :func:`read_to_end` read: the records, and the end offsets it read up to."""

    records: list[ConsumerRecord]
    ends: dict[TopicPartition, int]


def read_to_end(
    bootstrap: str,
    tps: Sequence[TopicPartition],
    *,
    isolation_level: str = "read_committed",
    timeout: float = 30,
    **settings: Any,
) -> PartitionsRead:
    """Every record of ``tps`` from offset 0 up to their end when the read starts (the LSO with
    read_committed, else the HW), through a fresh Consumer (``settings`` are its options).
    TimeoutError, naming the positions reached, if that takes longer than ``timeout``."""
    deadline = time.monotonic() + timeout
    out: list[ConsumerRecord] = []
    with Consumer(
        {
            "bootstrap_servers": bootstrap,
            "isolation_level": isolation_level,
            "auto_offset_reset": "earliest",
            **settings,
        }
    ) as consumer:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                behind = {str(tp): (consumer.position(tp), ends[tp]) for tp in tps}
                raise TimeoutError(f"reading to the end did not finish in {timeout}s: {behind}")
            for record in consumer.poll(timeout_ms=500):
                if record.offset < ends[TopicPartition(record.topic, record.partition)]:
                    out.append(record)
    return PartitionsRead(out, ends)
