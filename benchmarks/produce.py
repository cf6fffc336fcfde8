"""One broker, one producer, acks=1, 100-byte values: replog's produce path against its limit.

Starts a broker process on a temp directory (as tests/cluster.BrokerProcess does), then runs
``replog perf produce`` in this process (replication.tools.perf.produce_perf) twice:

- ``--mode records``: Producer.send per record, as kafka-producer-perf-test; latency per
  record (send() to ack, one record in 16 timed);
- ``--mode arrow``: Producer.send_arrow of 10,000-row Arrow tables, the Spark sink's path;
  latency per batch (send_arrow() to the batch's ack);

and, in the same run, logstore's append limit: benchmarks/logstore_append.py's
``replog_appends`` of 10,000-record batches (append + group-commit flush to the same disk,
no broker, no network). It prints one JSON line with the CPU seconds the broker and this
process spent in each run, which says which side limits the rate (2 cores here).

    python benchmarks/produce.py [--records 1000000] [--arrow-records 3000000] [--partitions 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.logstore_append import make_batches, replog_appends
from replication.client import Admin
from replication.tools.perf import produce_perf
from tests.cluster import BrokerProcess

GOAL_RECORDS_PER_S = 300_000


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def load_average() -> float:
    """The 1-minute load average: other work on the machine skews every figure here."""
    return round(os.getloadavg()[0], 2)


def measured(broker_pid: int, run: Any) -> tuple[Any, dict[str, float]]:
    """Run ``run()`` and return its result with the CPU seconds each side spent."""
    broker_before, client_before = cpu_seconds(broker_pid), time.process_time()
    result = run()
    return result, {
        "broker_cpu_s": round(cpu_seconds(broker_pid) - broker_before, 2),
        "client_cpu_s": round(time.process_time() - client_before, 2),
    }


def summary(result: Any, cpu: dict[str, float]) -> dict[str, Any]:
    return {
        "records": result.records,
        "records_per_s": round(result.records_per_s),
        "mb_per_s": result.mb_per_s,
        "latency": result.latency,
        "latency_p50_ms": result.latency_p50_ms,
        "latency_p99_ms": result.latency_p99_ms,
        "latency_max_ms": result.latency_max_ms,
        "elapsed_s": result.elapsed_s,
        "errors": result.errors,
        **cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records mode")
    parser.add_argument("--arrow-records", type=int, default=3_000_000, help="arrow mode")
    parser.add_argument("--logstore-records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--dir", default=None, help="where the temp directories go")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="replog-bench-produce-", dir=args.dir))
    broker = BrokerProcess(work / "broker")
    out: dict[str, Any] = {
        "benchmark": "produce",
        "machine": machine(),
        "load_average_at_start": load_average(),
        "brokers": 1,
        "acks": "1",
        "partitions": args.partitions,
        "value_bytes": args.value_bytes,
    }
    try:
        broker.start()
        bootstrap = broker.bootstrap
        with Admin(bootstrap_servers=bootstrap) as admin:
            admin.create_topic("bench", args.partitions, 1)
            admin.create_topic("warmup", 1, 1)
        # Warm up connections, imports and the broker's code paths.
        produce_perf(bootstrap, "warmup", 50_000, args.value_bytes, acks="1")
        produce_perf(bootstrap, "warmup", 50_000, args.value_bytes, acks="1", mode="arrow")

        records, cpu = measured(
            broker.pid,
            lambda: produce_perf(
                bootstrap, "bench", args.records, args.value_bytes, acks="1", mode="records"
            ),
        )
        out["records_mode"] = summary(records, cpu)
        arrow, cpu = measured(
            broker.pid,
            lambda: produce_perf(
                bootstrap, "bench", args.arrow_records, args.value_bytes, acks="1", mode="arrow"
            ),
        )
        out["arrow_mode"] = summary(arrow, cpu)
    finally:
        broker.stop()

    # The limit, same disk, same run: logstore appends of 10,000-record batches, no broker.
    try:
        batches = make_batches(args.logstore_records, 10_000)
        total = sum(len(b) for b in batches)
        n = len(batches) * 10_000
        seconds, _ = replog_appends(str(work / "logstore"), batches)
        out["logstore_append_limit"] = {
            "batch_records": 10_000,
            "records_per_s": round(n / seconds),
            "batch_mb_per_s": round(total / seconds / 1e6, 1),  # encoded batches
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)

    out["goal_records_per_s"] = GOAL_RECORDS_PER_S
    out["goal_met"] = {
        "records_mode": out["records_mode"]["records_per_s"] >= GOAL_RECORDS_PER_S,
        "arrow_mode": out["arrow_mode"]["records_per_s"] >= GOAL_RECORDS_PER_S,
    }
    out["load_average_at_end"] = load_average()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
