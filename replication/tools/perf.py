"""Produce and consume throughput, as kafka-producer-perf-test and kafka-consumer-perf-test.

:func:`produce_perf` sends ``num_records`` records of ``record_size`` bytes (one random payload,
reused, as Kafka's tool does) and waits for every acknowledgement; :func:`consume_perf` reads
``messages`` records of a topic from the beginning. Both return a frozen result whose
:meth:`to_json` is what ``replog perf ... --json`` prints. MB is 10^6 bytes; rates count the
whole run, from the first send (fetch) to the last acknowledgement (record).

Two ways to produce:

- ``mode="records"``: :meth:`Producer.send` per record, what kafka-producer-perf-test does.
  Latency is *per record*: from ``send()`` to the record's acknowledgement (its future done),
  measured on every ``latency_sample_every``-th record (a callback on every record would cost
  the producer a fifth of its speed; Kafka's tool samples its percentiles too).
- ``mode="arrow"``: :meth:`Producer.send_arrow` of ``arrow_batch_records``-row tables, the
  path the Spark sink takes. Latency is *per batch*: from the ``send_arrow()`` call to the
  acknowledgement of each batch it was cut into, measured on every batch.

``throughput`` (records/s, -1: as fast as possible) throttles the sends as Kafka's
ThroughputThrottler does: the sender sleeps whenever it is ahead of schedule.
"""

from __future__ import annotations

import functools
import gc
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

import pyarrow as pa
import pyarrow.compute as pc

from replication.client import Admin, Consumer, Producer, TopicPartition
from replication.client.describe import describe_topic_waiting
from replication.client.types import RecordMetadata
from replication.errors import ReplogError

__all__ = [
    "ConsumePerfResult",
    "PerfError",
    "ProducePerfResult",
    "consume_perf",
    "freeze_startup_heap",
    "produce_perf",
]

MB: Final = 1_000_000
#: Default spacing of latency samples in records mode (about 1.5% of the producer's time).
DEFAULT_LATENCY_SAMPLE_EVERY: Final = 16
#: Default rows per send_arrow() call in arrow mode.
DEFAULT_ARROW_BATCH_RECORDS: Final = 10_000
#: Progress callbacks at most this often (seconds).
_PROGRESS_INTERVAL_S: Final = 0.1

Mode = Literal["records", "arrow"]
Progress = Callable[[int], None]


class PerfError(ReplogError):
    """A performance test could not run or did not finish; the message says why."""


@dataclass(frozen=True)
class ProducePerfResult:
    """What one :func:`produce_perf` run measured (see the module docstring)."""

    mode: str
    topic: str
    acks: str
    records: int
    record_size: int
    #: Value bytes sent (records x record_size).
    bytes: int
    elapsed_s: float
    records_per_s: float
    mb_per_s: float
    #: "record": send() to the record's ack; "batch": send_arrow() to the batch's ack.
    latency: str
    #: Records mode: one latency sample every this many records (1: every record).
    latency_sample_every: int
    latency_samples: int
    latency_avg_ms: float
    latency_p50_ms: float
    latency_p95_ms: float
    latency_p99_ms: float
    latency_max_ms: float
    #: The --throughput asked for (records/s; -1: unthrottled).
    target_records_per_s: float
    #: Failed sends seen: sampled records (records mode) or batches (arrow mode).
    errors: int
    first_error: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ConsumePerfResult:
    """What one :func:`consume_perf` run measured."""

    topic: str
    records: int
    #: Key and value bytes of the records read.
    bytes: int
    elapsed_s: float
    records_per_s: float
    mb_per_s: float
    #: False if the topic ran dry (no record for ``timeout_ms``) before ``messages`` came.
    complete: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _percentile(ordered: list[float], q: float) -> float:
    """Kafka's perf-test percentile: ``sorted[int(n * q)]`` (0 without samples)."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


class _Throttler:
    """Sleep whenever ``sent`` records are ahead of ``records_per_s`` (Kafka's throttler)."""

    def __init__(self, records_per_s: float, start: float) -> None:
        self.interval = 1.0 / records_per_s if records_per_s > 0 else 0.0
        self.start = start

    def __call__(self, sent: int) -> None:
        if not self.interval:
            return
        ahead = self.start + sent * self.interval - time.perf_counter()
        if ahead > 0.001:  # below a millisecond a sleep overshoots more than it helps
            time.sleep(ahead)


class _Acks:
    """Latency samples and failures, filled by future callbacks in the producer's I/O threads."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors = 0
        self.first_error: BaseException | None = None

    def done(self, sent_at: float, future: Future[Any]) -> None:
        now = time.perf_counter()
        error = future.exception()
        if error is not None:
            self.errors += 1
            if self.first_error is None:
                self.first_error = error
            return
        self.latencies.append(now - sent_at)


def _payload(record_size: int) -> bytes:
    """One random payload of printable bytes, as kafka-producer-perf-test makes."""
    raw = os.urandom(record_size)
    return bytes(65 + b % 26 for b in raw)


def freeze_startup_heap() -> None:
    """Move what the measuring process holds so far (its imported modules: pyarrow and the
    client, ~100,000 objects) out of the cyclic collector's full scans (:func:`gc.freeze`),
    for the run that follows. Without it a records-mode run at 100k records/s paid a full
    collection of 30-45 ms in its own process every ~0.6 s (the records in flight keep
    promoting objects to the oldest generation), which showed as its p99 (61 ms; 22-32 ms
    with the heap frozen). A benchmark's own setting, as a JVM's perf tool runs with its
    collector tuned; the producer library leaves its user's collector alone."""
    gc.collect()
    gc.freeze()


def produce_perf(
    bootstrap_servers: str,
    topic: str,
    num_records: int,
    record_size: int,
    *,
    mode: Mode = "records",
    throughput: float = -1,
    acks: str = "1",
    batch_size: int | None = None,
    linger_ms: int | None = None,
    compression_type: str | None = None,
    partition: int | None = None,
    producer_props: Mapping[str, Any] | None = None,
    client_props: Mapping[str, Any] | None = None,
    latency_sample_every: int = DEFAULT_LATENCY_SAMPLE_EVERY,
    arrow_batch_records: int = DEFAULT_ARROW_BATCH_RECORDS,
    progress: Progress | None = None,
) -> ProducePerfResult:
    """Send ``num_records`` records of ``record_size`` bytes to ``topic``; wait for every ack.

    Raises PerfError for bad arguments, UnknownTopicOrPartitionError if the topic does not
    exist (after a second's grace for a topic just created), BrokerUnreachableError if no
    broker answers. ``client_props`` go to every client of the run (the admin client too):
    the security configs of ``--command-config``.
    """
    if num_records < 1:
        raise PerfError(f"--num-records {num_records}: must be at least 1")
    if record_size < 0:
        raise PerfError(f"--record-size {record_size}: must be 0 or more bytes")
    if mode not in ("records", "arrow"):
        raise PerfError(f"--mode {mode!r}: expected records or arrow")
    if latency_sample_every < 1:
        raise PerfError(f"--latency-sample-every {latency_sample_every}: must be at least 1")
    if arrow_batch_records < 1:
        raise PerfError(f"--arrow-batch-records {arrow_batch_records}: must be at least 1")
    common = {**(client_props or {}), "bootstrap.servers": bootstrap_servers}
    config: dict[str, Any] = {**common, "acks": acks}
    for name, value in (
        ("batch.size", batch_size),
        ("linger.ms", linger_ms),
        ("compression.type", compression_type),
    ):
        if value is not None:
            config[name] = value
    config.update(producer_props or {})
    acks_text = str(config["acks"])
    payload = _payload(record_size)
    acks_seen = _Acks()
    report = progress or (lambda sent: None)
    with Admin(common) as admin:
        described = describe_topic_waiting(admin, topic)  # or raise: unknown, unreachable
    partitions = [p.partition for p in described.partitions]
    if partition is not None and partition not in partitions:
        raise PerfError(
            f"--partition {partition}: topic {topic!r} has partitions 0..{len(partitions) - 1}"
        )
    with Producer(config) as producer:
        producer.partitions_for(topic)  # the producer's metadata first, off the clock
        start = time.perf_counter()
        throttle = _Throttler(throughput, start)
        if mode == "records":
            _send_records(
                producer,
                topic,
                partition,
                payload,
                num_records,
                latency_sample_every,
                acks_seen,
                throttle,
                report,
            )
        else:
            _send_arrow(
                producer,
                topic,
                partition,
                payload,
                num_records,
                arrow_batch_records,
                acks_seen,
                throttle,
                report,
            )
        producer.flush()
        elapsed = time.perf_counter() - start
    report(num_records)
    ordered = sorted(acks_seen.latencies)
    ms = [x * 1000 for x in ordered]
    total_bytes = num_records * record_size
    return ProducePerfResult(
        mode=mode,
        topic=topic,
        acks="all" if acks_text in ("-1", "all") else acks_text,
        records=num_records,
        record_size=record_size,
        bytes=total_bytes,
        elapsed_s=round(elapsed, 3),
        records_per_s=round(num_records / elapsed, 1),
        mb_per_s=round(total_bytes / elapsed / MB, 2),
        latency="record" if mode == "records" else "batch",
        latency_sample_every=latency_sample_every if mode == "records" else 1,
        latency_samples=len(ms),
        latency_avg_ms=round(sum(ms) / len(ms), 2) if ms else 0.0,
        latency_p50_ms=round(_percentile(ms, 0.50), 2),
        latency_p95_ms=round(_percentile(ms, 0.95), 2),
        latency_p99_ms=round(_percentile(ms, 0.99), 2),
        latency_max_ms=round(ms[-1], 2) if ms else 0.0,
        target_records_per_s=throughput if throughput > 0 else -1,
        errors=acks_seen.errors,
        first_error=None if acks_seen.first_error is None else str(acks_seen.first_error),
    )


def _send_records(
    producer: Producer,
    topic: str,
    partition: int | None,
    payload: bytes,
    num_records: int,
    sample_every: int,
    acks: _Acks,
    throttle: _Throttler,
    report: Progress,
) -> None:
    send = producer.send
    done = acks.done
    clock = time.perf_counter
    next_report = clock()
    sent = 0
    while sent < num_records:
        chunk = min(sample_every, num_records - sent)
        for _ in range(chunk - 1):
            send(topic, payload, None, partition)
        sent_at = clock()
        future: Future[RecordMetadata] = send(topic, payload, None, partition)
        future.add_done_callback(functools.partial(done, sent_at))
        sent += chunk
        throttle(sent)
        if sent_at >= next_report:
            report(sent)
            next_report = sent_at + _PROGRESS_INTERVAL_S


def _send_arrow(
    producer: Producer,
    topic: str,
    partition: int | None,
    payload: bytes,
    num_records: int,
    batch_records: int,
    acks: _Acks,
    throttle: _Throttler,
    report: Progress,
) -> None:
    rows = min(batch_records, num_records)
    table = pa.table({"value": pa.array([payload] * rows, pa.binary())})
    clock = time.perf_counter
    next_report = clock()
    sent = 0
    while sent < num_records:
        n = min(rows, num_records - sent)
        piece = table if n == rows else table.slice(0, n)
        sent_at = clock()
        for future in producer.send_arrow(topic, piece, partition):
            future.add_done_callback(functools.partial(acks.done, sent_at))
        sent += n
        throttle(sent)
        if sent_at >= next_report:
            report(sent)
            next_report = sent_at + _PROGRESS_INTERVAL_S


def consume_perf(
    bootstrap_servers: str,
    topic: str,
    messages: int,
    *,
    timeout_ms: int = 10_000,
    fetch_size: int | None = None,
    consumer_props: Mapping[str, Any] | None = None,
    client_props: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
) -> ConsumePerfResult:
    """Read ``messages`` records of every partition of ``topic`` from the beginning.

    Stops early, with ``complete=False``, if no record arrives for ``timeout_ms``. Raises
    UnknownTopicOrPartitionError if the topic does not exist.
    """
    if messages < 1:
        raise PerfError(f"--messages {messages}: must be at least 1")
    common = {**(client_props or {}), "bootstrap.servers": bootstrap_servers}
    config: dict[str, Any] = {**common, "auto.offset.reset": "earliest"}
    if fetch_size is not None:
        config["max.partition.fetch.bytes"] = fetch_size
    config.update(consumer_props or {})
    report = progress or (lambda read: None)
    with Admin(common) as admin:
        described = describe_topic_waiting(admin, topic)
    with Consumer(config) as consumer:
        consumer.assign([TopicPartition(topic, p.partition) for p in described.partitions])
        consumer.seek_to_beginning()
        records = 0
        nbytes = 0
        clock = time.perf_counter
        start = last_record = clock()
        next_report = start
        while records < messages:
            now = clock()
            idle_ms = (now - last_record) * 1000
            if idle_ms >= timeout_ms:
                break
            fetched = consumer.poll_arrow(timeout_ms=int(min(500, timeout_ms - idle_ms)) + 1)
            if not fetched:
                continue
            last_record = clock()
            for f in fetched:
                batch = f.batch
                if records + batch.num_rows > messages:
                    batch = batch.slice(0, messages - records)
                records += batch.num_rows
                nbytes += _binary_bytes(batch.column(1)) + _binary_bytes(batch.column(2))
                if records >= messages:
                    break
            if last_record >= next_report:
                report(records)
                next_report = last_record + _PROGRESS_INTERVAL_S
        # A run that went dry is timed to its last record, not to the end of the wait.
        end = clock() if records >= messages else last_record
        elapsed = max(end - start, 1e-9)
    report(records)
    return ConsumePerfResult(
        topic=topic,
        records=records,
        bytes=nbytes,
        elapsed_s=round(elapsed, 3),
        records_per_s=round(records / elapsed, 1),
        mb_per_s=round(nbytes / elapsed / MB, 2),
        complete=records >= messages,
    )


@dataclass(frozen=True)
class GroupConsumePerfResult:
    """What one :func:`consume_group_perf` run measured."""

    topic: str
    group: str
    members: int
    records: int
    bytes: int
    #: from subscribe() until every partition had an owner (the first rebalance)
    join_s: float
    #: from the first record to the last (the join not counted, as kafka-consumer-perf-test)
    elapsed_s: float
    records_per_s: float
    #: from subscribe() to the last record: what a caller of poll() waits, join included
    records_per_s_with_join: float
    mb_per_s: float
    complete: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def consume_group_perf(
    bootstrap_servers: str,
    topic: str,
    messages: int,
    *,
    group: str,
    members: int = 3,
    timeout_ms: int = 10_000,
    consumer_props: Mapping[str, Any] | None = None,
    client_props: Mapping[str, Any] | None = None,
) -> GroupConsumePerfResult:
    """Read ``messages`` records of ``topic`` with ``members`` consumers of one group, each
    in its own thread (subscribe(), the group's assignment, from the beginning).

    Progress is the records read once: per partition, the highest offset read + 1. A record
    read again after a rebalance (nothing is committed here) is work, not progress."""
    if messages < 1 or members < 1:
        raise PerfError(f"--messages {messages}, --members {members}: each must be at least 1")
    common = {**(client_props or {}), "bootstrap.servers": bootstrap_servers}
    config: dict[str, Any] = {
        **common,
        "auto.offset.reset": "earliest",
        "group.id": group,
        "enable.auto.commit": False,
        **(consumer_props or {}),
    }
    with Admin(common) as admin:
        partitions = len(describe_topic_waiting(admin, topic).partitions)
    lock = threading.Lock()
    counts = {"records": 0, "bytes": 0}
    reached: dict[int, int] = {}
    owned: list[set[TopicPartition]] = [set() for _ in range(members)]
    marks: dict[str, float] = {}
    done = threading.Event()
    clock = time.perf_counter
    start = clock()

    def member(index: int) -> None:
        with Consumer(config) as consumer:
            consumer.subscribe([topic])
            idle_since = clock()
            while not done.is_set():
                fetched = consumer.poll_arrow(timeout_ms=200)
                owned[index] = consumer.assignment()
                if sum(map(len, owned)) >= partitions and "joined" not in marks:
                    marks.setdefault("joined", clock())
                if not fetched:
                    if (clock() - idle_since) * 1000 >= timeout_ms and "first" in marks:
                        done.set()
                    continue
                idle_since = now = clock()
                with lock:
                    marks.setdefault("first", now)
                    for f in fetched:
                        last = int(f.batch.column(0)[f.batch.num_rows - 1].as_py()) + 1
                        gained = last - reached.get(f.partition, 0)
                        if gained <= 0:
                            continue  # read again after a rebalance: no progress
                        reached[f.partition] = last
                        counts["records"] += gained
                        batch = f.batch.slice(max(f.batch.num_rows - gained, 0))
                        counts["bytes"] += _binary_bytes(batch.column(1)) + _binary_bytes(
                            batch.column(2)
                        )
                    marks["last"] = now
                    if counts["records"] >= messages:
                        done.set()

    threads = [threading.Thread(target=member, args=(i,), daemon=True) for i in range(members)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first, last = marks.get("first", start), marks.get("last", start)
    elapsed = max(last - first, 1e-9)
    return GroupConsumePerfResult(
        topic=topic,
        group=group,
        members=members,
        records=counts["records"],
        bytes=counts["bytes"],
        join_s=round(marks.get("joined", clock()) - start, 3),
        elapsed_s=round(elapsed, 3),
        records_per_s=round(counts["records"] / elapsed, 1),
        records_per_s_with_join=round(counts["records"] / max(last - start, 1e-9), 1),
        mb_per_s=round(counts["bytes"] / elapsed / MB, 2),
        complete=counts["records"] >= messages,
    )


def _binary_bytes(column: pa.Array) -> int:
    if len(column) == 0 or column.null_count == len(column):
        return 0
    total = pc.sum(pc.binary_length(column)).as_py()
    return int(total or 0)
