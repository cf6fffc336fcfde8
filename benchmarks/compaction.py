"""Log compaction's cost: bytes read and written, storage requests and CPU per GB cleaned,
beside the storage's own limit measured in the same run.

A compacted partition log (standalone layout, so every request it makes is its own) is filled
with many updates to few keys (``--records`` records of ``--value-bytes`` over ``--keys`` keys,
``--batch`` records per batch, a segment per ``--segment-batches`` batches), then cleaned once
(``logstore.log_cleaner.clean_log``: offset map, rewrite, swap). Measured for that clean:
wall and CPU seconds, bytes read and written, and storage requests by S3 price class
(GET, PUT, LIST, DELETE; the log's own logical calls, and on S3 also the HTTP requests moto
served). Beside it, the limit: the same objects read whole, one GET each, and as many bytes as
the clean wrote put as as many objects, on the same storage; its seconds are what any cleaner
must spend on I/O.

Storage: local files (a temporary directory) and S3 on a counting moto server
(benchmarks/s3_counter.py in its own process, as benchmarks/storage_cost.py runs it). "Per GB
cleaned" is per GB of log read by the clean. Prints one JSON line.

    python benchmarks/compaction.py [--records 200000] [--keys 1000] [--value-bytes 100]
        [--storage local,s3]                                              # ~1 min
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.produce import cpu_seconds, load_average, machine
from benchmarks.s3_counter import reset_counts
from benchmarks.storage_cost import DUMMY_AWS_ENV, CounterProcess
from logstore.batch import Record, build
from logstore.config import LogConfig
from logstore.log import Log
from logstore.log_cleaner import clean_log
from logstore.storage import Storage
from tests.faulty_fs import FaultyStorage

#: S3's price classes of the Storage calls a log makes
CLASS_OF = {
    "read": "GET",
    "read_range": "GET",
    "exists": "GET",
    "size": "GET",
    "write": "PUT",
    "put_if_absent": "PUT",
    "list": "LIST",
    "delete": "DELETE",
}
GB = 1e9


def by_class(calls: Counter[str]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for op, n in calls.items():
        out[CLASS_OF.get(op, op)] += n
    return dict(out)


def per_gb(counts: dict[str, int], gb: float) -> dict[str, float]:
    return {k: round(v / gb, 1) for k, v in sorted(counts.items())}


def fill(log: Log, args: argparse.Namespace) -> int:
    """Append the updates; the bytes appended."""
    value = b"v" * args.value_bytes
    written = 0
    batches = args.records // args.batch
    for b in range(batches):
        records = [
            Record(f"key-{(b * args.batch + i) % args.keys:06d}".encode(), value, 1_000 + b)
            for i in range(args.batch)
        ]
        data = build(records)
        written += len(data)
        log.append(data, leader_epoch=0)
        if b % args.segment_batches == args.segment_batches - 1:
            log.roll()
            log.flush()
    log.roll()
    log.flush()
    log.update_high_watermark(log.log_end_offset)
    log.checkpoint()
    return written


def measure(
    root: Storage, args: argparse.Namespace, counter: CounterProcess | None
) -> dict[str, Any]:
    config = LogConfig(
        cleanup_policy="compact",
        min_compaction_lag_ms=0,
        file_delete_delay_ms=0,
        segment_bytes=args.segment_bytes,
        tail_cache_bytes=0,  # every read reaches storage, as on a broker long after the writes
    )
    storage = FaultyStorage(root.child(f"compaction-{uuid.uuid4().hex[:8]}/0"))
    log = Log.open(storage, config)
    appended = fill(log, args)
    # copies of the objects the clean will read, for the limit below (not measured)
    limit_storage = root.child(f"limit-{uuid.uuid4().hex[:8]}")
    sources = [s.name for s in log.segments()[:-1]]  # the active segment is never cleaned
    for name in sources:
        limit_storage.write(name, storage.inner.read(name))
    calls0 = storage.calls
    if counter is not None:
        reset_counts(counter.endpoint)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    stats = clean_log(log, now_ms=10**13)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    assert stats is not None
    assert stats.committed
    assert stats.extents_read == len(sources)
    calls = storage.calls - calls0
    http = reset_counts(counter.endpoint)["total"] if counter is not None else None
    gb = stats.bytes_read / GB

    # the limit: the same objects read whole, as many bytes written as as many objects
    wall1 = time.perf_counter()
    read = sum(len(limit_storage.read(name)) for name in sources)
    per_object = max(stats.bytes_written // max(stats.objects_written, 1), 1)
    for i in range(stats.objects_written):
        limit_storage.write(f"out-{i}", b"y" * per_object)
    limit_wall = time.perf_counter() - wall1
    result: dict[str, Any] = {
        "log_bytes": appended,
        "bytes_read": stats.bytes_read,
        "bytes_written": stats.bytes_written,
        "records_read": stats.records_read,
        "records_kept": stats.records_kept,
        "objects_read": stats.extents_read,
        "objects_written": stats.objects_written,
        "seconds": round(wall, 3),
        "cpu_seconds_per_gb": round(cpu / gb, 1),
        "seconds_per_gb": round(wall / gb, 1),
        "requests_per_gb": per_gb(by_class(calls), gb),
        "limit": {
            "what": "the same objects read whole (one GET each) and the written bytes put as "
            "as many objects, on the same storage",
            "bytes_read": read,
            "seconds_per_gb": round(limit_wall / gb, 1),
            "requests_per_gb": per_gb(
                {"GET": stats.extents_read, "PUT": stats.objects_written}, gb
            ),
        },
        "vs_limit": round(wall / max(limit_wall, 1e-9), 1),
    }
    if http is not None:
        result["http_requests_per_gb"] = per_gb(
            {cls: int(v["requests"]) for cls, v in http.items()}, gb
        )
    log.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--segment-batches", type=int, default=40)
    parser.add_argument("--segment-bytes", type=int, default=64 * 1024 * 1024)
    parser.add_argument("--storage", default="local,s3")
    args = parser.parse_args()
    out: dict[str, Any] = {
        "benchmark": "compaction",
        "machine": machine(),
        "load_average": load_average(),
        "records": args.records,
        "keys": args.keys,
        "value_bytes": args.value_bytes,
        "batch": args.batch,
    }
    kinds = args.storage.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        if "local" in kinds:
            out["local"] = measure(Storage.from_url(f"file://{tmp}/local"), args, None)
        if "s3" in kinds:
            os.environ.update(DUMMY_AWS_ENV)
            counter = CounterProcess(Path(tmp))
            try:
                import boto3

                bucket = "compaction"
                s3 = boto3.client("s3", endpoint_url=counter.endpoint, region_name="us-east-1")
                s3.create_bucket(Bucket=bucket)
                root = Storage.from_url(
                    f"s3://{bucket}/root",
                    endpoint_url=counter.endpoint,
                    key="testing",
                    secret="testing",
                )
                out["s3"] = measure(root, args, counter)
                out["s3"]["moto_cpu_seconds"] = round(cpu_seconds(counter.pid), 1)
            finally:
                counter.stop()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
