"""confluent-kafka (librdkafka) through replog's Kafka listener, beside replog's own client on
replog's own listener, in the same run on the same cluster.

Starts a controller and three brokers with Kafka listeners (tests.cluster.Cluster, kafka=True)
on a temp directory and creates, through the Kafka listener (confluent-kafka's AdminClient),
topics of 6 partitions, replication factor 3, min.insync.replicas 2. Values are 100 bytes (a
10-digit sequence number, then padding), no keys. Both producers are set alike: acks=all,
idempotent, linger.ms 5, batch.size 1,000,000 bytes, no compression, up to 5 requests in
flight, sticky partitioning of unkeyed records (see PRODUCER_SETTINGS). After a warm-up of
both clients (off the clock):

- ``confluent_produce``: confluent_kafka.Producer into the Kafka listener, N records, as fast
  as it takes them (produce() then poll(0) per record; on BufferError poll and retry). records/s
  from the first produce() to flush() done; latency of every record from its produce() call to
  its delivery callback (time.perf_counter in the callback; callbacks run inside poll()).
- ``replog_produce``: replog's Producer into replog's listener, the same N records,
  Producer.send per record; latency of every record from send() to its future's done callback
  (which runs in the producer's I/O thread). ``replog perf produce`` times one record in 16;
  timing all of them costs the producer a share of its speed, as it does confluent's.
- ``paced``: each producer again, into a topic of its own, at a fixed PACED_RATE records/s
  for PACED_SECONDS (sleeping, or for confluent poll()ing, whenever a millisecond ahead of
  schedule, as Kafka's ThroughputThrottler). At full speed both latencies are mostly time
  spent queued in the client (librdkafka queues up to 100,000 messages; replog's
  buffer.memory is 32 MiB), so the paced figures are the latency that means something.
- ``confluent_produce_paced_in_flight_1``: the paced confluent run again with
  max.in.flight.requests.per.connection 1. A broker handles one request at a time per
  connection, as Kafka's does; librdkafka keeps one connection per broker and (idempotent) up
  to 5 produce requests in flight on it, so its requests wait behind one another's acks=all
  round trip, while replog's Producer opens max.in.flight connections per broker and keeps
  one batch per partition in flight. This run shows how much of the paced latency that is.
- ``confluent_produce_paced_no_idempotence``: the paced confluent run with
  enable.idempotence false (5 in flight, as the first). librdkafka's statistics
  (``librdkafka`` in each confluent produce result: Produce requests, records per request,
  request round trip as librdkafka measures it, broker-thread wakeups) show its broker
  threads waking up hundreds of thousands of times a second when idempotent (here, where
  the acks=all round trip is longer than linger.ms), which costs this process CPU the
  brokers share on a small machine; this run shows the difference.
- ``confluent_consume``: a confluent_kafka.Consumer, assign() of every partition from offset
  0 (a group.id it never joins or commits to), consume(10,000) in a loop, reading what the
  confluent producer wrote; records/s from assign() to the Nth record.
- ``replog_consume``: replog's Consumer, assign() + seek_to_beginning, poll_arrow() (as
  ``replog perf consume``), reading the same records.

Each consumer's values are checked afterwards (off the clock): exactly N records, every
sequence number once. For every phase the CPU seconds of the three brokers and of this
process (librdkafka's threads included) are reported too. The brokers' CPU per record of a
confluent phase over the replog phase (``ratios``) is the Kafka listener's cost in place (its
wire protocol and the RecordBatch transcoding; benchmarks/kafka_records.py times the
transcoding alone) together with any difference in how the two clients batch. Delivery
errors, lost or duplicated records and hangs are reported in the JSON (``complete``: false)
and the brokers' stderr tails go to stderr.

Prints one JSON line.

    python benchmarks/kafka_clients.py [--records 300000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka
import pyarrow as pa
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replication import protocol as p
from replication.client import Consumer, Producer, TopicPartition
from tests.cluster import Cluster
from tests.wire import RawConnection

PARTITIONS = 6
REPLICATION = 3
MIN_INSYNC = 2
VALUE_BYTES = 100
WARMUP_RECORDS = 20_000
PACED_RATE = 5_000
PACED_SECONDS = 5.0
#: the consumers give up after this long without a record
IDLE_TIMEOUT_S = 15.0
FLUSH_TIMEOUT_S = 120.0
CONSUME_BATCH = 10_000
#: where each producer sends a record to every partition before its clock starts
PRIME_TOPIC = "bench-prime"
STATS_INTERVAL_MS = 500

#: the same producer settings for both clients, in each one's names
PRODUCER_SETTINGS: dict[str, dict[str, Any]] = {
    "confluent": {
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "compression.type": "none",
        # the idempotent producer's limit (librdkafka caps it at 5 with idempotence)
        "max.in.flight.requests.per.connection": 5,
    },
    "replog": {
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "compression.type": "none",
        # replog keeps one batch per partition in flight; this opens 5 connections per broker
        "max.in.flight.requests.per.connection": 5,
    },
}
CONSUMER_SETTINGS: dict[str, dict[str, Any]] = {
    "confluent": {
        "group.id": "bench-kafka-clients",  # assign() only: never joined, nothing committed
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
    },
    "replog": {"auto.offset.reset": "earliest"},
}

clock = time.perf_counter


def values(count: int, start: int = 0) -> list[bytes]:
    """``count`` 100-byte values: a 10-digit sequence number, then padding."""
    pad = b"x" * (VALUE_BYTES - 10)
    return [b"%010d" % i + pad for i in range(start, start + count)]


# --- cluster -------------------------------------------------------------------------------


def create_topics(cluster: Cluster, names: list[str]) -> None:
    """Topics created through the Kafka listener, then waited for on every broker."""
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    futures = admin.create_topics(
        [
            NewTopic(name, PARTITIONS, REPLICATION, config={"min.insync.replicas": str(MIN_INSYNC)})
            for name in names
        ]
    )
    for future in futures.values():
        future.result(timeout=30)
    deadline = time.monotonic() + 30
    while not all(known(cluster, name) for name in names):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the brokers did not learn of {names} and their leaders in 30 s")
        time.sleep(0.05)


def known(cluster: Cluster, topic: str) -> bool:
    """Every broker knows ``topic``, its partitions and their leaders (each learns on its own)."""
    for broker in cluster.brokers.values():
        with RawConnection(broker.bootstrap) as conn:
            response = conn.request(
                p.ApiKey.METADATA, p.MetadataRequest(topics=[p.MetadataRequestTopic(name=topic)])
            )
        (info,) = response.topics
        if info.error_code or len(info.partitions) != PARTITIONS:
            return False
        if any(part.leader_id < 0 for part in info.partitions):
            return False
    return True


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(cluster: Cluster, records: int, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()``'s result plus the CPU the brokers and this process spent on it."""
    pids = [b.pid for b in cluster.brokers.values()]
    brokers_before = sum(cpu_seconds(pid) for pid in pids)
    client_before = time.process_time()
    result = run()
    broker_cpu = sum(cpu_seconds(pid) for pid in pids) - brokers_before
    client_cpu = time.process_time() - client_before
    return {
        **result,
        "brokers_cpu_s": round(broker_cpu, 2),
        "client_cpu_s": round(client_cpu, 2),
        "brokers_cpu_us_per_record": round(broker_cpu / records * 1e6, 2),
        "client_cpu_us_per_record": round(client_cpu / records * 1e6, 2),
    }


# --- producers -----------------------------------------------------------------------------


def percentile(ordered: list[float], q: float) -> float:
    """Kafka's perf-test percentile, ``sorted[int(n * q)]``, in ms."""
    if not ordered:
        return float("nan")
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 2)


def produce_summary(
    records: int,
    elapsed: float,
    latencies: list[float],
    errors: list[Any],
    unflushed: int,
    rate: float | None,
) -> dict[str, Any]:
    latencies.sort()
    out: dict[str, Any] = {}
    if rate:
        out["target_records_per_s"] = rate
    out.update(
        {
            "records": records,
            "elapsed_s": round(elapsed, 3),
            "records_per_s": round(records / elapsed),
            "latency_p50_ms": percentile(latencies, 0.50),
            "latency_p99_ms": percentile(latencies, 0.99),
            "latency_max_ms": percentile(latencies, 1.0),
            "latency_samples": len(latencies),
            "errors": len(errors),
            "first_error": str(errors[0]) if errors else None,
        }
    )
    if unflushed:
        out["unflushed"] = unflushed
    return out


def confluent_produce(
    bootstrap: str,
    topic: str,
    data: list[bytes],
    rate: float | None = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Produce ``data`` with confluent_kafka.Producer (at ``rate`` records/s if given)."""
    stats = RdkafkaStats()
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            **PRODUCER_SETTINGS["confluent"],
            **(overrides or {}),
            "statistics.interval.ms": STATS_INTERVAL_MS,
            "stats_cb": stats.add,
        }
    )
    # off the clock: metadata, a connection to every broker and the producer id
    producer.list_topics(topic, timeout=30)
    for i in range(PARTITIONS):
        producer.produce(PRIME_TOPIC, b"", partition=i)
    if producer.flush(30):
        raise RuntimeError("confluent-kafka could not deliver its priming records in 30 s")
    stats.next_window(producer)
    stats.reset()
    latencies: list[float] = []
    errors: list[Any] = []

    def delivered(sent_at: float, err: Any, message: Any) -> None:
        now = clock()
        if err is not None:
            errors.append(err)
        else:
            latencies.append(now - sent_at)

    produce = producer.produce
    poll = producer.poll
    partial = functools.partial
    interval = 1.0 / rate if rate else 0.0
    start = clock()
    for i, value in enumerate(data):
        if interval:
            ahead = start + i * interval - clock()
            while ahead > 0.001:
                poll(ahead)  # serves delivery callbacks while it waits
                ahead = start + i * interval - clock()
        sent_at = clock()
        while True:
            try:
                produce(topic, value, on_delivery=partial(delivered, sent_at))
                break
            except BufferError:  # queue.buffering.max.messages reached: let it drain
                poll(0.005)
        poll(0)
    unflushed = producer.flush(FLUSH_TIMEOUT_S)
    elapsed = clock() - start
    stats.next_window(producer)  # the last statistics window
    return {
        **produce_summary(len(data), elapsed, latencies, errors, unflushed, rate),
        "librdkafka": stats.summary(len(data)),
    }


class RdkafkaStats:
    """librdkafka's statistics (stats_cb, every STATS_INTERVAL_MS): Produce requests sent,
    their round trip as librdkafka measures it (request written to response read: the broker's
    queueing of pipelined requests included) and the broker threads' wakeups, over every
    broker, since :meth:`reset`."""

    def __init__(self) -> None:
        self.windows = 0
        self.produce: dict[str, int] = {}
        self.wakeups: dict[str, int] = {}
        self.reset()

    def reset(self) -> None:
        self.produce_base = dict(self.produce)
        self.wakeups_base = dict(self.wakeups)
        self.rtt_count = 0
        self.rtt_sum_us = 0.0
        self.rtt_p99_us = 0

    def add(self, text: str) -> None:
        data = json.loads(text)
        for name, broker in data.get("brokers", {}).items():
            if broker.get("nodeid", -1) < 0:
                continue
            self.produce[name] = broker.get("req", {}).get("Produce", 0)
            self.wakeups[name] = broker.get("wakeups", 0)
            rtt = broker.get("rtt", {})
            if rtt.get("cnt"):
                self.rtt_count += rtt["cnt"]
                self.rtt_sum_us += rtt["avg"] * rtt["cnt"]
                self.rtt_p99_us = max(self.rtt_p99_us, rtt.get("p99", 0))
        self.windows += 1

    def next_window(self, producer: Any) -> None:
        """Serve callbacks until a new statistics window has come in."""
        seen = self.windows
        deadline = clock() + 10 * STATS_INTERVAL_MS / 1000
        while self.windows == seen and clock() < deadline:
            producer.poll(0.05)

    def summary(self, records: int) -> dict[str, Any]:
        requests = sum(n - self.produce_base.get(k, 0) for k, n in self.produce.items())
        wakeups = sum(n - self.wakeups_base.get(k, 0) for k, n in self.wakeups.items())
        return {
            "produce_requests": requests,
            "records_per_request": round(records / requests, 1) if requests else None,
            "request_rtt_avg_ms": round(self.rtt_sum_us / self.rtt_count / 1000, 2)
            if self.rtt_count
            else None,
            # the highest p99 of any broker in any window
            "request_rtt_max_window_p99_ms": round(self.rtt_p99_us / 1000, 2),
            "broker_thread_wakeups": wakeups,
        }


def replog_produce(
    bootstrap: str, topic: str, data: list[bytes], rate: float | None = None
) -> dict[str, Any]:
    """Produce ``data`` with replog's Producer.send (at ``rate`` records/s if given)."""
    latencies: list[float] = []
    errors: list[Any] = []

    def delivered(sent_at: float, future: Any) -> None:
        now = clock()
        error = future.exception()
        if error is not None:
            errors.append(error)
        else:
            latencies.append(now - sent_at)

    unflushed = 0
    with Producer({"bootstrap.servers": bootstrap, **PRODUCER_SETTINGS["replog"]}) as producer:
        # off the clock: metadata, a connection to every broker and the producer id
        producer.partitions_for(topic)
        for i in range(PARTITIONS):
            producer.send(PRIME_TOPIC, b"", partition=i)
        producer.flush(30)
        send = producer.send
        partial = functools.partial
        interval = 1.0 / rate if rate else 0.0
        start = clock()
        for i, value in enumerate(data):
            if interval:
                ahead = start + i * interval - clock()
                if ahead > 0.001:
                    time.sleep(ahead)
            sent_at = clock()
            send(topic, value).add_done_callback(partial(delivered, sent_at))
        try:
            producer.flush(FLUSH_TIMEOUT_S)
        except Exception as e:  # a timeout: count what was not acknowledged
            errors.append(e)
            unflushed = len(data) - len(latencies) - len(errors) + 1
        elapsed = clock() - start
    return produce_summary(len(data), elapsed, latencies, errors, unflushed, rate)


# --- consumers -----------------------------------------------------------------------------


def check(sequence_numbers: list[int], expected: int) -> dict[str, Any]:
    """Exactly ``expected`` records, each sequence number 0..expected-1 once."""
    seen = bytearray(expected)
    duplicates = out_of_range = 0
    for n in sequence_numbers:
        if not 0 <= n < expected:
            out_of_range += 1
        elif seen[n]:
            duplicates += 1
        else:
            seen[n] = 1
    missing = expected - sum(seen)
    return {
        "complete": len(sequence_numbers) == expected and not (missing or duplicates),
        "missing": missing,
        "duplicates": duplicates,
        "out_of_range": out_of_range,
    }


def consume_summary(read: int, elapsed: float) -> dict[str, Any]:
    return {
        "records": read,
        "elapsed_s": round(elapsed, 3),
        "records_per_s": round(read / elapsed) if elapsed > 0 else 0,
    }


def confluent_consume(bootstrap: str, topic: str, expected: int) -> dict[str, Any]:
    """Read ``topic`` from offset 0 with confluent_kafka.Consumer until ``expected`` records."""
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, **CONSUMER_SETTINGS["confluent"]}
    )
    got: list[bytes | None] = []
    errors: list[Any] = []
    try:
        consumer.list_topics(topic, timeout=30)  # connections and metadata, off the clock
        start = last = clock()
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, i, confluent_kafka.OFFSET_BEGINNING)
                for i in range(PARTITIONS)
            ]
        )
        consume = consumer.consume
        append = got.append
        while len(got) < expected and clock() - last < IDLE_TIMEOUT_S:
            messages = consume(CONSUME_BATCH, 0.5)
            if not messages:
                continue
            last = clock()
            for message in messages:
                if message.error() is not None:
                    errors.append(message.error())
                else:
                    append(message.value())
        end = clock() if len(got) >= expected else last
        # anything beyond ``expected`` would be a duplicate: look for it, off the clock
        for message in consumer.consume(CONSUME_BATCH, 1.0):
            if message.error() is None:
                got.append(message.value())
        ends = sum(
            consumer.get_watermark_offsets(confluent_kafka.TopicPartition(topic, i), timeout=10)[1]
            for i in range(PARTITIONS)
        )
    finally:
        consumer.close()
    return {
        **consume_summary(min(len(got), expected), end - start),
        **check([int(v[:10]) if v else -1 for v in got], expected),
        "high_watermarks_sum": ends,
        "errors": len(errors),
        "first_error": str(errors[0]) if errors else None,
    }


def replog_consume(bootstrap: str, topic: str, expected: int) -> dict[str, Any]:
    """Read ``topic`` from offset 0 with replog's Consumer.poll_arrow until ``expected``."""
    tps = [TopicPartition(topic, i) for i in range(PARTITIONS)]
    chunks: list[pa.Array] = []
    read = 0
    with Consumer({"bootstrap.servers": bootstrap, **CONSUMER_SETTINGS["replog"]}) as consumer:
        consumer.end_offsets(tps)  # connections and metadata, off the clock
        start = last = clock()
        consumer.assign(tps)
        consumer.seek_to_beginning()
        while read < expected and clock() - last < IDLE_TIMEOUT_S:
            fetched = consumer.poll_arrow(timeout_ms=500)
            if not fetched:
                continue
            last = clock()
            for f in fetched:
                column = f.batch.column(2)
                chunks.append(column)
                read += len(column)
        end = clock() if read >= expected else last
        for f in consumer.poll_arrow(timeout_ms=1000):  # duplicates beyond ``expected``?
            chunks.append(f.batch.column(2))
        ends = sum(consumer.end_offsets(tps).values())
    got = [v[:10] if v else None for chunk in chunks for v in chunk.to_pylist()]
    return {
        **consume_summary(min(read, expected), end - start),
        **check([int(v) if v else -1 for v in got], expected),
        "high_watermarks_sum": ends,
    }


# --- main ----------------------------------------------------------------------------------


def broker_stderr(cluster: Cluster) -> None:
    for broker in cluster.brokers.values():
        print(f"--- {broker.stderr_path} (tail)", file=sys.stderr)
        print(broker.stderr_tail(60), file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--dir", default=None, help="where the cluster keeps its data")
    args = parser.parse_args()
    n = args.records
    paced_n = int(PACED_RATE * PACED_SECONDS)
    data = values(n)
    paced = values(paced_n)
    out: dict[str, Any] = {
        "benchmark": "kafka_clients",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "records": n,
        "value_bytes": VALUE_BYTES,
        "brokers": 3,
        "partitions": PARTITIONS,
        "replication_factor": REPLICATION,
        "min_insync_replicas": MIN_INSYNC,
        "producer_settings": PRODUCER_SETTINGS,
        "load_average_at_start": round(os.getloadavg()[0], 2),
    }
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="replog-bench-kafka-", dir=args.dir) as tmp:
        cluster = Cluster(Path(tmp), brokers=3, kafka=True)
        cluster.start()
        try:
            kafka, replog = cluster.kafka_bootstrap, cluster.bootstrap
            topics = [
                "prime",
                "warmup",
                "confluent",
                "replog",
                "confluent-paced",
                "confluent-paced-1",
                "confluent-paced-noidem",
                "replog-paced",
            ]
            create_topics(cluster, [f"bench-{t}" for t in topics])
            # warm-up, off the clock: connections, imports, the brokers' code paths
            warm = values(WARMUP_RECORDS)
            confluent_produce(kafka, "bench-warmup", warm)
            replog_produce(replog, "bench-warmup", warm)
            confluent_consume(kafka, "bench-warmup", 2 * WARMUP_RECORDS)
            replog_consume(replog, "bench-warmup", 2 * WARMUP_RECORDS)

            results["confluent_produce"] = measured(
                cluster, n, lambda: confluent_produce(kafka, "bench-confluent", data)
            )
            results["replog_produce"] = measured(
                cluster, n, lambda: replog_produce(replog, "bench-replog", data)
            )
            results["confluent_produce_paced"] = measured(
                cluster,
                paced_n,
                lambda: confluent_produce(kafka, "bench-confluent-paced", paced, PACED_RATE),
            )
            # the same, one request in flight per connection (see the module docstring)
            results["confluent_produce_paced_in_flight_1"] = measured(
                cluster,
                paced_n,
                lambda: confluent_produce(
                    kafka,
                    "bench-confluent-paced-1",
                    paced,
                    PACED_RATE,
                    {"max.in.flight.requests.per.connection": 1},
                ),
            )
            results["confluent_produce_paced_no_idempotence"] = measured(
                cluster,
                paced_n,
                lambda: confluent_produce(
                    kafka,
                    "bench-confluent-paced-noidem",
                    paced,
                    PACED_RATE,
                    {"enable.idempotence": False},
                ),
            )
            results["replog_produce_paced"] = measured(
                cluster,
                paced_n,
                lambda: replog_produce(replog, "bench-replog-paced", paced, PACED_RATE),
            )
            results["confluent_consume"] = measured(
                cluster, n, lambda: confluent_consume(kafka, "bench-confluent", n)
            )
            results["replog_consume"] = measured(
                cluster, n, lambda: replog_consume(replog, "bench-confluent", n)
            )
            results["ratios"] = {
                "produce_confluent_to_replog": round(
                    results["confluent_produce"]["records_per_s"]
                    / results["replog_produce"]["records_per_s"],
                    3,
                ),
                "consume_confluent_to_replog": round(
                    results["confluent_consume"]["records_per_s"]
                    / max(results["replog_consume"]["records_per_s"], 1),
                    3,
                ),
                # what the Kafka listener costs the brokers per record over replog's own path
                "brokers_cpu_produce_kafka_to_replog": round(
                    results["confluent_produce"]["brokers_cpu_us_per_record"]
                    / results["replog_produce"]["brokers_cpu_us_per_record"],
                    3,
                ),
                "brokers_cpu_consume_kafka_to_replog": round(
                    results["confluent_consume"]["brokers_cpu_us_per_record"]
                    / results["replog_consume"]["brokers_cpu_us_per_record"],
                    3,
                ),
            }
            complete = (
                all(
                    results[k]["errors"] == 0 and not results[k].get("unflushed")
                    for k in (
                        "confluent_produce",
                        "replog_produce",
                        "confluent_produce_paced",
                        "confluent_produce_paced_in_flight_1",
                        "confluent_produce_paced_no_idempotence",
                        "replog_produce_paced",
                    )
                )
                and results["confluent_consume"]["complete"]
                and results["replog_consume"]["complete"]
            )
            out["complete"] = complete
            if not complete:
                broker_stderr(cluster)
        except BaseException:
            broker_stderr(cluster)
            raise
        finally:
            cluster.stop()
    out["results"] = results
    out["load_average_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
