"""Reading a topic back from offset 0, as the tests check what a log holds: through replog's
Consumer to the partitions' ends, or until a count of records, and with confluent-kafka
(librdkafka, on the Kafka listener) until a count; and one partition's log read in process.

    records = read_to_end(bootstrap, [TopicPartition(topic, 0)]).records
    records = read_count(bootstrap, tps, 300)              # at least 300, from the earliest
    messages = confluent_read_count({"bootstrap.servers": kafka_bootstrap}, topic, 3, 600)
    pairs = log_values(log)                                # (offset, value) through Log.read

Every read has a deadline and fails naming how far it got. Wire-level reads (a raw Fetch loop
below the HW) are :func:`tests.wire.read_records`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import confluent_kafka

from logstore.batch import iter_batches
from logstore.log import Log
from replication.client import Consumer, ConsumerRecord, TopicPartition
from tests.helpers import unique_name, wait_until


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


def read_count(
    bootstrap: str,
    tps: Sequence[TopicPartition],
    count: int,
    *,
    timeout: float = 30,
    **settings: Any,
) -> list[ConsumerRecord]:
    """Records of ``tps`` from their earliest offsets, polled by a fresh Consumer (``settings``
    are its options) until at least ``count`` came (all those of the last poll are kept: a
    record beyond ``count`` shows). An AssertionError if they do not within ``timeout``."""
    out: list[ConsumerRecord] = []
    config = {"bootstrap_servers": bootstrap, "auto_offset_reset": "earliest", **settings}
    with Consumer(config) as consumer:
        consumer.assign(tps)

        def polled() -> bool:
            out.extend(consumer.poll(500, max_records=100_000))
            return len(out) >= count

        wait_until(polled, timeout=timeout, interval=0, message=f"{count} records of {tps}")
    return out


def confluent_read_count(
    config: Mapping[str, Any],
    topic: str,
    partitions: int,
    count: int,
    *,
    timeout: float = 60,
) -> list[Any]:
    """confluent-kafka Messages of ``topic``'s partitions ``0..partitions-1`` from their
    beginning (assigned, no group join; ``config`` holds ``bootstrap.servers`` and any other
    librdkafka setting) until at least ``count`` came. An error message fails the read."""
    consumer = confluent_kafka.Consumer(
        {
            "group.id": unique_name("readback"),
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **config,
        }
    )
    got: list[Any] = []
    try:
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in range(partitions)
            ]
        )

        def consumed() -> bool:
            for message in consumer.consume(1000, 0.5):
                assert message.error() is None, message.error()
                got.append(message)
            return len(got) >= count

        wait_until(consumed, timeout=timeout, interval=0, message=f"{count} records of {topic}")
    finally:
        consumer.close()
    return got


def log_values(
    log: Log, start: int | None = None, end: int | None = None
) -> list[tuple[int, bytes]]:
    """(offset, value) of every record of ``log`` in [start, end), read through Log.read."""
    out: list[tuple[int, bytes]] = []
    offset = log.log_start_offset if start is None else start
    end = log.log_end_offset if end is None else end
    while offset < end:
        batches = list(iter_batches(log.read(offset, 64 * 1024, max_offset=end)))
        assert batches, f"no progress at {offset}"
        for batch in batches:
            for record in batch.records():
                if record.offset >= offset:
                    assert record.value is not None
                    out.append((record.offset, record.value))
            offset = batch.next_offset
    return out
