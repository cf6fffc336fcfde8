"""Apache Kafka beside replog: the same client, the same workloads, in the same run.

Two clusters on this machine, one after the other (never both at once: they would share the two
cores): replog (tests.cluster.Cluster with Kafka listeners, a controller and three brokers on
local files, broker timings at their defaults) and Apache Kafka 4.4.0 (benchmarks/peers/
kafka.py: a KRaft controller and three brokers as JVM processes on the same disk). Optionally
a third, Kafka with ``log.flush.interval.messages=1`` (``--kafka-fsync``: an fsync per append on
every replica, the nearest Kafka setting to replog's acks=all contract; see HONESTY_NOTE).

The client on both is confluent-kafka (librdkafka), set as in benchmarks/kafka_clients.py
(acks=all, idempotent, linger.ms 5, no compression), so the difference is the brokers. Every
topic: replication factor 3, min.insync.replicas 2, created through the cluster's own
AdminClient API. Each side measures, in this order:

- ``produce_100b`` / ``produce_1kb``: N (and N/4) records as fast as the producer takes them,
  6 partitions; records/s, MB/s, per-record latency p50/p99 (mostly client queueing at full
  speed), and the brokers' CPU seconds per million records (/proc utime+stime of the three
  broker processes over the run).
- ``consume``: a confluent Consumer assign()ed to every partition of ``produce_100b``'s topic
  from offset 0, until all N records are in; every sequence number checked once.
- ``sync``: one partition, linger.ms 0, produce() then flush() per record: the synchronous
  acks=all round trip, p50/p99 over ``--sync-records``.
- ``half_rate``: half of ``produce_100b``'s rate, paced, for ``--half-rate-seconds``:
  p50/p99 of the latency that matters when the producer is not its own bottleneck.
- ``end_to_end``: a producer paced at ``--e2e-rate`` records/s and a consumer (another thread
  of this process, subscribed from the end) on 6 partitions; each value carries its send
  time (time.perf_counter_ns, one clock in one process); p50/p99 of receive minus send.
- ``idle_cpu``: after the traffic, a pause, then each broker's CPU over a window as a
  fraction of one core (the controller is not counted on either side).
- ``failover``: one partition, a producer sending one record at a time (produce + flush);
  the partition's leader is SIGKILLed, and the figure is the time from the kill to the first
  record acknowledged after it. Both sides detect the dead broker the same way (the
  controller fences a broker after ``broker.session.timeout.ms`` without heartbeats; a
  follower's fetch from the dead leader fails too); Kafka is given replog's defaults for it
  (``broker.heartbeat.interval.ms`` 500, ``broker.session.timeout.ms`` 3000; Kafka's own are
  2000 and 9000), so the figure compares the mechanisms, not the defaults.
- ``producer_perf``: Kafka's own ``kafka-producer-perf-test`` (the Java client,
  org.apache.kafka.tools.ProducerPerformance) producing N 100-byte records, acks=all: its
  records/s and latency percentiles as it prints them. A second client, and Kafka's tool, as a
  cross-check of the first figure.

Prints one JSON line; ``complete`` is false if any record was lost, duplicated or not
acknowledged.

    python benchmarks/kafka_peer.py [--records 300000] [--kafka-fsync] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.kafka_clients import (
    PARTITIONS,
    PRIME_TOPIC,
    PRODUCER_SETTINGS,
    check,
    confluent_consume,
    confluent_produce,
    cpu_seconds,
    percentile,
    values,
)
from benchmarks.latency import broker_defaults
from benchmarks.peers.kafka import HONESTY_NOTE, KafkaCluster, describe, java, kafka_classpath
from tests.cluster import FAST_FAILOVER, Cluster

REPLICATION = 3
MIN_INSYNC = 2
WARMUP_RECORDS = 20_000
#: replog's own defaults for failure detection, given to Kafka too (see the module)
SAME_DETECTION = {"broker.heartbeat.interval.ms": "500", "broker.session.timeout.ms": "3000"}
FAILOVER_TIMEOUT_S = 60.0

clock = time.perf_counter


class Side:
    """One cluster as the workloads see it: a Kafka bootstrap, the broker pids by id."""

    def __init__(
        self,
        name: str,
        bootstrap: str,
        pids: dict[int, int],
        kill: Callable[[int], object],
        info: dict[str, Any] | None = None,
    ):
        self.name = name
        self.bootstrap = bootstrap
        self.pids = pids
        self.kill = kill
        #: what to print beside the side's figures (version, topology, settings)
        self.info = info or {}

    def brokers_cpu(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids.values())


# --- set-up --------------------------------------------------------------------------------


def create_topics(bootstrap: str, partitions: dict[str, int]) -> None:
    """Topics through the cluster's AdminClient API, then waited for until every partition has
    a leader and a full ISR in the metadata a client sees."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [
            NewTopic(name, n, REPLICATION, config={"min.insync.replicas": str(MIN_INSYNC)})
            for name, n in partitions.items()
        ]
    )
    for future in futures.values():
        future.result(timeout=60)
    deadline = time.monotonic() + 60
    while True:
        metadata = admin.list_topics(timeout=10)
        ready = all(
            name in metadata.topics
            and len(metadata.topics[name].partitions) == n
            and all(
                p.leader >= 0 and len(p.isrs) == REPLICATION
                for p in metadata.topics[name].partitions.values()
            )
            for name, n in partitions.items()
        )
        if ready:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics {sorted(partitions)} had no leaders or full ISR in 60 s")
        time.sleep(0.1)


def measured(side: Side, records: int, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()``'s result plus the brokers' CPU spent on it, per million records."""
    before = side.brokers_cpu()
    result = run()
    spent = side.brokers_cpu() - before
    return {
        **result,
        "brokers_cpu_s": round(spent, 2),
        "brokers_cpu_s_per_million_records": round(spent / records * 1e6, 1),
    }


# --- workloads -----------------------------------------------------------------------------


def produce_rate(result: dict[str, Any], value_bytes: int) -> dict[str, Any]:
    result["mb_per_s"] = round(result["records_per_s"] * value_bytes / 1e6, 1)
    return result


def sync_latency(bootstrap: str, topic: str, records: int) -> dict[str, Any]:
    """produce() + flush() per record, linger.ms 0: the synchronous acks=all round trip."""
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, **PRODUCER_SETTINGS["confluent"], "linger.ms": 0}
    )
    errors: list[Any] = []

    def delivered(err: Any, _message: Any) -> None:
        if err is not None:
            errors.append(err)

    data = values(records)
    for value in data[:50]:  # off the clock: connections, metadata, the producer id
        producer.produce(topic, value, on_delivery=delivered)
        producer.flush(30)
    latencies: list[float] = []
    for value in data:
        sent = clock()
        producer.produce(topic, value, on_delivery=delivered)
        producer.flush(30)
        latencies.append(clock() - sent)
    latencies.sort()
    return {
        "records": records,
        "latency_p50_ms": percentile(latencies, 0.50),
        "latency_p99_ms": percentile(latencies, 0.99),
        "latency_max_ms": percentile(latencies, 1.0),
        "errors": len(errors),
    }


def end_to_end(bootstrap: str, topic: str, rate: int, seconds: float) -> dict[str, Any]:
    """A paced producer and a consumer thread; receive time minus send time per record."""
    count = int(rate * seconds)
    received: list[float] = []
    seen: list[int] = []
    ready = threading.Event()
    stop = threading.Event()

    def consume() -> None:
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-e2e-{os.getpid()}",
                "auto.offset.reset": "latest",
                "enable.auto.commit": False,
            }
        )

        def assigned(c: Any, partitions: list[Any]) -> None:
            ready.set()

        consumer.subscribe([topic], on_assign=assigned)
        try:
            while not stop.is_set() and len(received) < count:
                for message in consumer.consume(1000, 0.1):
                    now = time.perf_counter_ns()
                    value = message.value()
                    if message.error() is None and value:
                        seen.append(int(value[:10]))
                        received.append((now - int(value[11:30])) / 1e9)
        finally:
            consumer.close()

    thread = threading.Thread(target=consume, name="e2e-consumer", daemon=True)
    thread.start()
    if not ready.wait(60):
        stop.set()
        raise RuntimeError("the end-to-end consumer got no assignment in 60 s")
    time.sleep(1.0)  # the assignment's fetch positions (latest) resolved before the first send
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, **PRODUCER_SETTINGS["confluent"]}
    )
    pad = b"x" * 70
    interval = 1.0 / rate
    start = clock()
    for i in range(count):
        ahead = start + i * interval - clock()
        while ahead > 0.001:
            producer.poll(ahead)
            ahead = start + i * interval - clock()
        producer.produce(topic, b"%010d %019d " % (i, time.perf_counter_ns()) + pad)
        producer.poll(0)
    producer.flush(60)
    deadline = time.monotonic() + 30
    while len(received) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join(30)
    received.sort()
    return {
        "rate": rate,
        "records": count,
        "latency_p50_ms": percentile(received, 0.50),
        "latency_p99_ms": percentile(received, 0.99),
        "latency_max_ms": percentile(received, 1.0),
        **check(seen, count),
    }


def idle_cpu(side: Side, wait: float, seconds: float) -> dict[str, Any]:
    """Each broker's CPU over ``seconds`` after ``wait``, as a fraction of one core."""
    time.sleep(wait)
    before = {i: cpu_seconds(pid) for i, pid in side.pids.items()}
    time.sleep(seconds)
    cores = [(cpu_seconds(pid) - before[i]) / seconds for i, pid in side.pids.items()]
    return {
        "window_s": seconds,
        "max_core": round(max(cores), 4),
        "mean_core": round(sum(cores) / len(cores), 4),
    }


def leader_of(bootstrap: str, topic: str) -> int:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return int(metadata.topics[topic].partitions[0].leader)


def failover(side: Side, topic: str) -> dict[str, Any]:
    """SIGKILL the partition's leader while a producer sends one record at a time; the time
    from the kill to the first record acknowledged after it."""
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": side.bootstrap,
            **PRODUCER_SETTINGS["confluent"],
            "linger.ms": 0,
            "message.timeout.ms": int(FAILOVER_TIMEOUT_S * 1000),
        }
    )
    acked: list[float] = []
    errors: list[Any] = []

    def delivered(err: Any, _message: Any) -> None:
        if err is None:
            acked.append(clock())
        else:
            errors.append(err)

    for i in range(200):  # a steady state before the kill
        producer.produce(topic, b"%010d" % i, on_delivery=delivered)
        producer.flush(30)
    leader = leader_of(side.bootstrap, topic)
    killed_at = clock()
    side.kill(leader)
    sent = 200
    while clock() - killed_at < FAILOVER_TIMEOUT_S and not (acked and acked[-1] > killed_at):
        producer.produce(topic, b"%010d" % sent, on_delivery=delivered)
        sent += 1
        producer.flush(1.0)
    remaining = producer.flush(FAILOVER_TIMEOUT_S)
    after = [t for t in acked if t > killed_at]
    return {
        "killed_broker": leader,
        "failover_s": round(after[0] - killed_at, 2) if after else None,
        "new_leader": leader_of(side.bootstrap, topic) if after else None,
        "records_sent": sent,
        "records_acked": len(acked),
        "errors": len(errors),
        "unflushed": remaining,
    }


PERF_LINE = re.compile(
    r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency,"
    r" ([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99.9th"
)


def producer_perf(bootstrap: str, topic: str, records: int) -> dict[str, Any]:
    """Kafka's kafka-producer-perf-test (its Java client) against ``bootstrap``."""
    command = [
        java(),
        "-Xmx512m",
        "-cp",
        kafka_classpath(),
        "org.apache.kafka.tools.ProducerPerformance",
        "--topic",
        topic,
        "--num-records",
        str(records),
        "--record-size",
        "100",
        "--throughput",
        "-1",
        "--producer-props",
        f"bootstrap.servers={bootstrap}",
        "acks=all",
        "linger.ms=5",
        "batch.size=1000000",
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    match = PERF_LINE.search(run.stdout.strip().splitlines()[-1] if run.stdout.strip() else "")
    if run.returncode != 0 or match is None:
        return {"error": (run.stdout + run.stderr)[-2000:]}
    sent, rate, mb, avg, worst, p50, p95, p99, p999 = match.groups()
    return {
        "latency_p95_ms": int(p95),
        "latency_p999_ms": int(p999),
        "records": int(sent),
        "records_per_s": round(float(rate)),
        "mb_per_s": float(mb),
        "latency_avg_ms": float(avg),
        "latency_p50_ms": int(p50),
        "latency_p99_ms": int(p99),
        "latency_max_ms": float(worst),
    }


def workloads(side: Side, args: argparse.Namespace, full: bool = True) -> dict[str, Any]:
    n = args.records
    create_topics(
        side.bootstrap,
        {
            PRIME_TOPIC: PARTITIONS,
            "bench-warmup": PARTITIONS,
            "bench-100b": PARTITIONS,
            "bench-1kb": PARTITIONS,
            "bench-sync": 1,
            "bench-half": PARTITIONS,
            "bench-e2e": PARTITIONS,
            "bench-failover": 1,
            "bench-perf": PARTITIONS,
        },
    )
    out: dict[str, Any] = {}
    warm = values(WARMUP_RECORDS)
    confluent_produce(side.bootstrap, "bench-warmup", warm)  # off the clock
    data = values(n)
    out["produce_100b"] = produce_rate(
        measured(side, n, lambda: confluent_produce(side.bootstrap, "bench-100b", data)), 100
    )
    if full:
        kilo = [v + b"y" * 924 for v in values(n // 4)]
        out["produce_1kb"] = produce_rate(
            measured(side, n // 4, lambda: confluent_produce(side.bootstrap, "bench-1kb", kilo)),
            1024,
        )
        out["consume"] = measured(
            side, n, lambda: confluent_consume(side.bootstrap, "bench-100b", n)
        )
    out["sync"] = sync_latency(side.bootstrap, "bench-sync", args.sync_records)
    half = max(1, out["produce_100b"]["records_per_s"] // 2)
    paced = values(int(half * args.half_rate_seconds))
    out["half_rate"] = measured(
        side, len(paced), lambda: confluent_produce(side.bootstrap, "bench-half", paced, half)
    )
    for key in ("produce_100b", "produce_1kb", "half_rate"):
        out.get(key, {}).pop("librdkafka", None)
    if full:
        out["end_to_end"] = end_to_end(side.bootstrap, "bench-e2e", args.e2e_rate, args.e2e_seconds)
        out["producer_perf"] = producer_perf(side.bootstrap, "bench-perf", n)
        out["idle_cpu"] = idle_cpu(side, args.idle_wait, args.idle_seconds)
        out["failover"] = failover(side, "bench-failover")
    return out


# --- the clusters --------------------------------------------------------------------------


@contextmanager
def replog_side(work: Path) -> Iterator[Side]:
    timings = broker_defaults(list(FAST_FAILOVER))
    cluster = Cluster(work, brokers=3, kafka=True, overrides=timings)
    cluster.start()
    try:
        yield Side(
            "replog",
            cluster.kafka_bootstrap,
            {i: b.pid for i, b in cluster.brokers.items()},
            lambda i: cluster.brokers[i].kill(),
            {
                "topology": "1 controller + 3 brokers (Python processes), local files",
                "broker_timings": timings,
            },
        )
    finally:
        cluster.stop()


@contextmanager
def kafka_side(work: Path, flush_every_message: bool = False) -> Iterator[Side]:
    cluster = KafkaCluster(
        work, brokers=3, overrides=SAME_DETECTION, flush_every_message=flush_every_message
    )
    with cluster as kafka:
        yield Side(
            "kafka_flush_every_message" if flush_every_message else "kafka",
            kafka.bootstrap,
            dict(zip(kafka.broker_ids, kafka.pids, strict=True)),
            kafka.kill,
            {**describe(kafka), "start": kafka.timings},
        )


def ratios(replog: dict[str, Any], kafka: dict[str, Any]) -> dict[str, Any]:
    """replog's figure over Kafka's for each headline (rates: > 1 is replog faster;
    latencies and CPU: < 1 is replog lower)."""

    def ratio(path: tuple[str, str]) -> float | None:
        a = replog.get(path[0], {}).get(path[1])
        b = kafka.get(path[0], {}).get(path[1])
        return round(a / b, 2) if a and b else None

    keys = {
        "produce_100b_records_per_s": ("produce_100b", "records_per_s"),
        "produce_1kb_records_per_s": ("produce_1kb", "records_per_s"),
        "consume_records_per_s": ("consume", "records_per_s"),
        "sync_p50": ("sync", "latency_p50_ms"),
        "sync_p99": ("sync", "latency_p99_ms"),
        "half_rate_p99": ("half_rate", "latency_p99_ms"),
        "end_to_end_p99": ("end_to_end", "latency_p99_ms"),
        "produce_cpu_per_million": ("produce_100b", "brokers_cpu_s_per_million_records"),
        "failover_s": ("failover", "failover_s"),
        "idle_max_core": ("idle_cpu", "max_core"),
    }
    return {name: ratio(path) for name, path in keys.items()}


def complete(result: dict[str, Any]) -> bool:
    ok = all(
        result[k].get("errors", 0) == 0 and not result[k].get("unflushed")
        for k in ("produce_100b", "produce_1kb", "sync", "half_rate")
        if k in result
    )
    if "consume" in result:
        ok = ok and result["consume"]["complete"]
    if "end_to_end" in result:
        ok = ok and result["end_to_end"]["complete"]
    if "failover" in result:
        ok = ok and result["failover"]["failover_s"] is not None
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--sync-records", type=int, default=2000)
    parser.add_argument("--half-rate-seconds", type=float, default=10.0)
    parser.add_argument("--e2e-rate", type=int, default=2000)
    parser.add_argument("--e2e-seconds", type=float, default=10.0)
    parser.add_argument("--idle-wait", type=float, default=10.0)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument(
        "--kafka-fsync",
        action="store_true",
        help="also Kafka with log.flush.interval.messages=1 (produce, sync, half rate only)",
    )
    parser.add_argument("--only", choices=["replog", "kafka"], help="one side only")
    parser.add_argument("--dir", default=None, help="where the clusters keep their data")
    args = parser.parse_args()
    out: dict[str, Any] = {
        "benchmark": "kafka_peer",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "python": platform.python_version(),
        "client": f"confluent-kafka {confluent_kafka.__version__}"
        f" (librdkafka {confluent_kafka.libversion()[0]})",
        "producer_settings": PRODUCER_SETTINGS["confluent"],
        "records": args.records,
        "replication_factor": REPLICATION,
        "min_insync_replicas": MIN_INSYNC,
        "kafka_failure_detection": SAME_DETECTION,
        "durability": HONESTY_NOTE,
        "load_average_at_start": round(os.getloadavg()[0], 2),
    }
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="replog-bench-kafka-peer-", dir=args.dir) as tmp:
        work = Path(tmp)
        if args.only in (None, "replog"):
            with replog_side(work / "replog") as side:
                results["replog"] = {"about": side.info, **workloads(side, args)}
        if args.only in (None, "kafka"):
            with kafka_side(work / "kafka") as side:
                results["kafka"] = {"about": side.info, **workloads(side, args)}
        if args.kafka_fsync:
            with kafka_side(work / "kafka-flush-every-message", flush_every_message=True) as side:
                results["kafka_flush_every_message"] = {
                    "about": side.info,
                    **workloads(side, args, full=False),
                }
    if "replog" in results and "kafka" in results:
        out["replog_over_kafka"] = ratios(results["replog"], results["kafka"])
    out["complete"] = all(complete(r) for r in results.values())
    out["results"] = results
    out["load_average_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
