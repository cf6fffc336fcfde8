"""Client quotas: a throttled producer and consumer get their quota, and an unthrottled
neighbour keeps its latency.

One controller and one broker as processes on local files (tests/cluster.Cluster; quotas are
per broker, so one broker makes the quota the whole rate), with the Kafka listener. Clients
are confluent-kafka (librdkafka, which backs off on ``throttle_time_ms`` as KIP-219 asks):

(a) ``neighbour_alone``: an unthrottled producer (its own client id, no quota) sends 100-byte
    values synchronously (linger.ms 0, one in flight) for ``--neighbour-seconds``: p50/p99;
(b) ``producer``: a producer under ``producer_byte_rate`` (``--quota``) sends 1 KB values as
    fast as librdkafka lets it for ``--seconds``, the neighbour sending meanwhile
    (``neighbour_beside_throttled``: p50/p99 again). The rate is the key and value bytes
    acknowledged per second after the first ``--warmup-seconds`` (the first second's burst
    of the quota's bucket is left out), over the quota: ``ratio``;
(c) ``consumer``: a consumer under ``consumer_byte_rate`` (the same quota) reads a topic
    written beforehand (unthrottled) for ``--seconds``: key and value bytes per second after
    the warm-up, over the quota.

The quota meters what the broker sees (a Produce request's bytes, a Fetch response's record
batches), a few percent more than the key and value bytes measured here (batch and record
headers): a ratio slightly under 1.0 is the quota held exactly.

    python benchmarks/quotas.py [--quota 1000000] [--seconds 12] [--neighbour-seconds 6]

prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import confluent_kafka

from benchmarks.peers.nats import percentiles
from benchmarks.produce import load_average, machine
from replication.client import Admin, NewTopic
from replication.client.describe import describe_topic_waiting
from tests.cluster import Cluster

VALUE = b"v" * 1000
NEIGHBOUR_VALUE = b"n" * 100


def _rate(events: list[tuple[float, int]], start: float, warmup_s: float) -> float:
    """Bytes per second of ``events`` (time, bytes) after ``start + warmup_s``."""
    after = [(t, n) for t, n in events if t >= start + warmup_s]
    if len(after) < 2:
        return 0.0
    span = after[-1][0] - (start + warmup_s)
    return sum(n for _, n in after) / span if span > 0 else 0.0


def _neighbour(bootstrap: str, topic: str, stop: threading.Event, out: list[float]) -> None:
    """Synchronous 100-byte sends until ``stop``: each one's latency (ms) into ``out``."""
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "client.id": "neighbour", "linger.ms": 0, "acks": "all"}
    )
    while not stop.is_set():
        started = time.perf_counter()
        producer.produce(topic, NEIGHBOUR_VALUE)
        producer.flush(30)
        out.append((time.perf_counter() - started) * 1000)


def _neighbour_run(bootstrap: str, topic: str, seconds: float) -> list[float]:
    latencies: list[float] = []
    stop = threading.Event()
    thread = threading.Thread(target=_neighbour, args=(bootstrap, topic, stop, latencies))
    thread.start()
    stop.wait(seconds)
    stop.set()
    thread.join()
    return latencies


def _throttled_producer(bootstrap: str, topic: str, seconds: float) -> tuple[list[Any], float]:
    """Produce 1 KB values as fast as allowed for ``seconds``: (time, bytes) of each
    acknowledged record, and the start time."""
    acked: list[tuple[float, int]] = []
    throttles: list[float] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            acked.append((time.monotonic(), len(msg.value()) + len(msg.key() or b"")))

    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "throttled-producer",
            "linger.ms": 5,
            "queue.buffering.max.kbytes": 4096,
            "throttle_cb": lambda e: throttles.append(e.throttle_time),
        }
    )
    start = time.monotonic()
    i = 0
    while time.monotonic() - start < seconds:
        try:
            producer.produce(topic, VALUE, key=b"%08d" % i, on_delivery=delivered)
            i += 1
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    producer.flush(60)
    return [acked, len(throttles)], start


def _throttled_consumer(bootstrap: str, topic: str, seconds: float) -> tuple[list[Any], float]:
    consumed: list[tuple[float, int]] = []
    throttles: list[float] = []
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "throttled-consumer",
            "group.id": "quota-bench",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "throttle_cb": lambda e: throttles.append(e.throttle_time),
        }
    )
    consumer.subscribe([topic])
    start = time.monotonic()
    try:
        while time.monotonic() - start < seconds:
            for m in consumer.consume(500, 0.2):
                if m.error() is None:
                    consumed.append((time.monotonic(), len(m.value()) + len(m.key() or b"")))
    finally:
        consumer.close()
    return [consumed, len(throttles)], start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quota", type=int, default=1_000_000, help="bytes/s")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--warmup-seconds", type=float, default=2.0)
    parser.add_argument("--neighbour-seconds", type=float, default=6.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp), brokers=1, kafka=True).start()
        try:
            result = run(cluster, args)
        finally:
            cluster.stop()
    print(json.dumps(result))


def run(cluster: Cluster, args: Any) -> dict[str, Any]:
    bootstrap = cluster.kafka_bootstrap
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        for name in ("neighbour", "throttled", "preloaded"):
            admin.create_topics([NewTopic(name, 1, 1)])
            describe_topic_waiting(admin, name)
        admin.alter_client_quotas(
            {"client-id": "throttled-producer"}, set_quotas={"producer_byte_rate": args.quota}
        )
        admin.alter_client_quotas(
            {"client-id": "throttled-consumer"}, set_quotas={"consumer_byte_rate": args.quota}
        )
    # the consumer's topic: more than it may read in the run, written without a quota
    loader = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(int(args.quota * (args.seconds + 2) / len(VALUE))):
        while True:
            try:
                loader.produce("preloaded", VALUE, key=b"%08d" % i)
                break
            except BufferError:
                loader.poll(0.05)
    loader.flush(120)

    alone = _neighbour_run(bootstrap, "neighbour", args.neighbour_seconds)
    beside: list[float] = []
    stop = threading.Event()
    thread = threading.Thread(target=_neighbour, args=(bootstrap, "neighbour", stop, beside))
    thread.start()
    (acked, producer_throttles), p_start = _throttled_producer(bootstrap, "throttled", args.seconds)
    stop.set()
    thread.join()
    (consumed, consumer_throttles), c_start = _throttled_consumer(
        bootstrap, "preloaded", args.seconds
    )
    produced_rate = _rate(acked, p_start, args.warmup_seconds)
    consumed_rate = _rate(consumed, c_start, args.warmup_seconds)
    return {
        "benchmark": "quotas",
        "machine": machine(),
        "load_average": load_average(),
        "quota_bytes_per_s": args.quota,
        "producer": {
            "bytes_per_s": round(produced_rate),
            "ratio": round(produced_rate / args.quota, 3),
            "throttle_callbacks": producer_throttles,
        },
        "consumer": {
            "bytes_per_s": round(consumed_rate),
            "ratio": round(consumed_rate / args.quota, 3),
            "throttle_callbacks": consumer_throttles,
        },
        "neighbour_alone": {"sends": len(alone), **percentiles(alone)},
        "neighbour_beside_throttled": {"sends": len(beside), **percentiles(beside)},
        "within_10_percent": all(
            0.9 <= r / args.quota <= 1.1 for r in (produced_rate, consumed_rate)
        ),
    }


if __name__ == "__main__":
    main()
