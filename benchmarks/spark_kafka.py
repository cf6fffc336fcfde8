"""Spark's own Kafka connector reading from replog, beside replog's data source and beside
Apache Kafka.

Produces ``--rows`` records of 100-byte values with confluent-kafka (acks=all, lz4) into a
3-partition, RF=3 topic on a 3-broker replog cluster (through its Kafka listeners) and on a
3-broker Apache Kafka 4.4.0 cluster (benchmarks/peers/kafka.py), then, in one local
SparkSession (local[2], the connector's jars from tests/maven.py), reads all of them into the
``noop`` sink with a batch query, ``--runs`` times each, interleaved, after one warm-up each:

- ``kafka_on_replog``: ``format("kafka")`` on replog's Kafka listener (Fetch over the wire);
- ``replog``: ``format("replog")`` (direct reads of the segment objects);
- ``kafka_on_kafka``: ``format("kafka")`` on Apache Kafka.

Prints one JSON line: median seconds and rows/s per reader, and the ratios.

    python benchmarks/spark_kafka.py [--rows 500000] [--runs 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.peers.kafka import KafkaCluster
from tests import maven
from tests.cluster import Cluster
from tests.spark_session import prepare_worker_environment

PARTITIONS = 3
VALUE_BYTES = 100
TOPIC = "bench-spark-kafka"


def create_topic(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(TOPIC, PARTITIONS, 3, config={"min.insync.replicas": "2"})]
    )
    futures[TOPIC].result(timeout=60)
    deadline = time.monotonic() + 60
    while True:
        topics = admin.list_topics(TOPIC, timeout=10).topics
        parts = topics[TOPIC].partitions if TOPIC in topics else {}
        if len(parts) == PARTITIONS and all(p.leader >= 0 for p in parts.values()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{TOPIC} has no leader for every partition on {bootstrap}")
        time.sleep(0.2)


def produce(bootstrap: str, rows: int) -> float:
    """``rows`` records, row i to partition i % 3; the seconds it took."""
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "compression.type": "lz4",
            "linger.ms": 20,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    value = os.urandom(VALUE_BYTES)
    start = time.perf_counter()
    for i in range(rows):
        while True:
            try:
                producer.produce(TOPIC, value=value, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(300) != 0:
        raise RuntimeError(f"records to {bootstrap} not delivered in 300 s")
    return time.perf_counter() - start


def session() -> Any:
    prepare_worker_environment()
    from pyspark.sql import SparkSession

    jars = ",".join(str(p) for p in maven.spark_jars("spark-kafka"))
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("replog-bench-spark-kafka")
        .config("spark.jars", jars)
        .config("spark.driver.memory", "512m")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def read_seconds(spark: Any, source: str, bootstrap: str, rows: int) -> float:
    start = time.perf_counter()
    df = (
        spark.read.format(source)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", TOPIC)
        .load()
    )
    df.write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - start
    count = df.count()
    if count != rows:
        raise RuntimeError(f"{source} on {bootstrap} read {count} rows, not {rows}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-spark-kafka-", dir=args.dir))
    replog = Cluster(work / "replog", brokers=3, kafka=True).start()
    try:
        with KafkaCluster(work / "kafka", brokers=3) as kafka:
            create_topic(replog.kafka_bootstrap)
            create_topic(kafka.bootstrap)
            produce_s = {
                "replog": produce(replog.kafka_bootstrap, args.rows),
                "kafka": produce(kafka.bootstrap, args.rows),
            }
            readers = {
                "kafka_on_replog": ("kafka", replog.kafka_bootstrap),
                "replog": ("replog", replog.bootstrap),
                "kafka_on_kafka": ("kafka", kafka.bootstrap),
            }
            spark = session()
            try:
                times: dict[str, list[float]] = {name: [] for name in readers}
                for run in range(args.runs + 1):  # the first round warms up
                    for name, (source, bootstrap) in readers.items():
                        seconds = read_seconds(spark, source, bootstrap, args.rows)
                        if run:
                            times[name].append(seconds)
            finally:
                spark.stop()
    finally:
        replog.stop()
        shutil.rmtree(work, ignore_errors=True)
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(
        json.dumps(
            {
                "benchmark": "spark_kafka",
                "rows": args.rows,
                "value_bytes": VALUE_BYTES,
                "runs": args.runs,
                "produce_s": {k: round(v, 2) for k, v in produce_s.items()},
                "read_s": {k: round(v, 2) for k, v in medians.items()},
                "rows_per_s": {k: round(args.rows / v) for k, v in medians.items()},
                "kafka_on_replog_vs_kafka": round(
                    medians["kafka_on_kafka"] / medians["kafka_on_replog"], 2
                ),
                "replog_vs_kafka": round(medians["kafka_on_kafka"] / medians["replog"], 2),
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            }
        )
    )


if __name__ == "__main__":
    main()
