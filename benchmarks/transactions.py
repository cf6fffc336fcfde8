"""Transactional produce beside idempotent produce, in the same run, and commit latency.

Starts a controller and three brokers (tests.cluster.Cluster on a temp directory), creates a
topic with replication factor 3 (min.insync.replicas 2), and sends 100-byte values with
acks=all as Arrow tables (Producer.send_arrow, the Spark sink's path) for the same time:

- idempotent: the default producer (enable.idempotence), no transactions;
- transactional: transactions of one second each: begin_transaction(), send for 1 s,
  commit_transaction(); the time of the commits counts against its rate.

The two alternate (idempotent, transactional, idempotent, transactional) so a drift of the
machine hits both. Prints one JSON line: the records/s of each, their ratio (goal >= 0.8),
and the commit latency percentiles: ``commit`` is commit_transaction() as a caller sees it
(flushing what is still buffered, then EndTxn: markers written to every partition and
replicated), ``end_txn`` the EndTxn part alone.

    python benchmarks/transactions.py [--seconds 8] [--partitions 6] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replication.client import Admin, Producer
from tests.cluster import Cluster

VALUE_BYTES = 100
ROWS_PER_TABLE = 5_000
TRANSACTION_S = 1.0
GOAL_RATIO = 0.8


def table() -> pa.Table:
    return pa.table({"value": pa.array([b"x" * VALUE_BYTES] * ROWS_PER_TABLE, pa.binary())})


def settings(bootstrap: str) -> dict[str, Any]:
    """The same settings for both producers. buffer.memory is kept small (4 MiB, enough to
    keep the brokers busy here): commit_transaction() first flushes what is buffered, and a
    large buffer makes every commit wait for seconds of queued records."""
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "max.in.flight.requests.per.connection": 5,
        "buffer.memory": 4 * 1024 * 1024,
    }


def send_for(producer: Producer, topic: str, data: pa.Table, seconds: float) -> int:
    """send_arrow tables for ``seconds`` (send blocks when buffer.memory is full)."""
    sent = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        producer.send_arrow(topic, data)
        sent += data.num_rows
    return sent


def idempotent_run(bootstrap: str, topic: str, seconds: float) -> tuple[int, float]:
    data = table()
    with Producer(settings(bootstrap)) as producer:
        producer.send_arrow(topic, data)  # metadata and producer id before the clock starts
        producer.flush()
        start = time.perf_counter()
        sent = send_for(producer, topic, data, seconds)
        producer.flush()
        return sent, time.perf_counter() - start


def transactional_run(
    bootstrap: str, topic: str, seconds: float, transactional_id: str
) -> tuple[int, float, list[float], list[float]]:
    data = table()
    commits: list[float] = []
    end_txns: list[float] = []
    with Producer({**settings(bootstrap), "transactional.id": transactional_id}) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_arrow(topic, data)  # metadata and partitions before the clock starts
        producer.commit_transaction()
        sent = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            producer.begin_transaction()
            sent += send_for(producer, topic, data, TRANSACTION_S)
            t0 = time.perf_counter()
            producer.flush()
            t1 = time.perf_counter()
            producer.commit_transaction()
            t2 = time.perf_counter()
            commits.append((t2 - t0) * 1000)
            end_txns.append((t2 - t1) * 1000)
        return sent, time.perf_counter() - start, commits, end_txns


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each kind, alternating")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--dir", default=None, help="where the cluster keeps its data")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        cluster = Cluster(Path(tmp), brokers=3)
        cluster.start()
        try:
            bootstrap = cluster.bootstrap
            topic = "bench-txn"
            with Admin(bootstrap_servers=bootstrap) as admin:
                admin.create_topic(topic, args.partitions, 3, {"min.insync.replicas": "2"})
            idem_sent = txn_sent = 0
            idem_s = txn_s = 0.0
            commits: list[float] = []
            end_txns: list[float] = []
            for round_ in range(args.rounds):
                sent, elapsed = idempotent_run(bootstrap, topic, args.seconds)
                idem_sent, idem_s = idem_sent + sent, idem_s + elapsed
                sent, elapsed, c, e = transactional_run(
                    bootstrap, topic, args.seconds, f"bench-{round_}"
                )
                txn_sent, txn_s = txn_sent + sent, txn_s + elapsed
                commits += c
                end_txns += e
        finally:
            cluster.stop()

    idem_rate = idem_sent / idem_s
    txn_rate = txn_sent / txn_s
    print(
        json.dumps(
            {
                "benchmark": "transactions",
                "brokers": 3,
                "replication_factor": 3,
                "partitions": args.partitions,
                "acks": "all",
                "value_bytes": VALUE_BYTES,
                "rows_per_send_arrow": ROWS_PER_TABLE,
                "transaction_s": TRANSACTION_S,
                "idempotent_records_per_s": round(idem_rate),
                "transactional_records_per_s": round(txn_rate),
                "transactional_mb_per_s": round(txn_rate * VALUE_BYTES / 1e6, 1),
                "ratio": round(txn_rate / idem_rate, 3),
                "goal_ratio": GOAL_RATIO,
                "transactions": len(commits),
                "commit_ms_p50": percentile(commits, 0.5),
                "commit_ms_p99": percentile(commits, 0.99),
                "end_txn_ms_p50": percentile(end_txns, 0.5),
                "end_txn_ms_p99": percentile(end_txns, 0.99),
                "seconds_per_run": args.seconds,
                "rounds": args.rounds,
                "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                f"Python {platform.python_version()}",
                "load_average": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
