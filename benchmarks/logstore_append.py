"""Append + flush of 100-byte records to a partition log on local files, and read back.

Prints one JSON line: for batches of 1,000 and 10,000 records, replog's append+flush rate beside
the limit measured in the same run — plain Python writes of the same bytes to the same disk,
one file per flush with write + fsync, as the log's group commit does — and the rate of reading
the segments back into Arrow record batches.

    python benchmarks/logstore_append.py [--records 2000000] [--dir /tmp]
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

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from logstore.batch import build, iter_batches
from logstore.config import LogConfig
from logstore.log import Log
from logstore.storage import Storage

VALUE_BYTES = 100


def make_batches(records: int, batch_records: int) -> list[bytes]:
    value = pa.array([b"x" * VALUE_BYTES] * batch_records, pa.binary())
    ts = pa.array([int(time.time() * 1000)] * batch_records, pa.int64())
    batch = build(pa.table({"value": value, "timestamp": ts}))
    return [batch] * (records // batch_records)


def plain_writes(root: str, batches: list[bytes]) -> float:
    os.makedirs(root, exist_ok=True)
    start = time.perf_counter()
    for i, data in enumerate(batches):
        path = os.path.join(root, f"{i:020d}.bin")
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return time.perf_counter() - start


def replog_appends(root: str, batches: list[bytes]) -> tuple[float, Log]:
    log = Log.open(Storage.from_url(root), LogConfig(segment_bytes=256 * 1024 * 1024))
    start = time.perf_counter()
    for data in batches:
        log.append(data, leader_epoch=0)
        log.flush()
    return time.perf_counter() - start, log


def read_back(log: Log) -> tuple[float, int, int]:
    fresh = Log.open(log.storage, log.config)  # nothing cached: read from the files
    start = time.perf_counter()
    offset, rows, nbytes = fresh.log_start_offset, 0, 0
    while offset < fresh.log_end_offset:
        chunk = fresh.read(offset, 16 * 1024 * 1024)
        nbytes += len(chunk)
        for batch in iter_batches(chunk):
            rows += batch.to_arrow().num_rows
            offset = batch.next_offset
    return time.perf_counter() - start, rows, nbytes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    result: dict[str, object] = {
        "benchmark": "logstore_append",
        "records": args.records,
        "value_bytes": VALUE_BYTES,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
    }
    for batch_records in (1_000, 10_000):
        work = tempfile.mkdtemp(prefix="replog-bench-", dir=args.dir)
        try:
            batches = make_batches(args.records, batch_records)
            total = sum(len(b) for b in batches)
            n = len(batches) * batch_records
            limit_s = plain_writes(os.path.join(work, "plain"), batches)
            replog_s, log = replog_appends(os.path.join(work, "log"), batches)
            read_s, rows, read_bytes = read_back(log)
            assert rows == n, (rows, n)
            key = f"batch_{batch_records}"
            result[key] = {
                "replog_records_per_s": round(n / replog_s),
                "replog_mb_per_s": round(total / replog_s / 1e6, 1),
                "limit_records_per_s": round(n / limit_s),
                "limit_mb_per_s": round(total / limit_s / 1e6, 1),
                "ratio_to_limit": round(limit_s / replog_s, 2),
                "read_arrow_mb_per_s": round(read_bytes / read_s / 1e6, 1),
                "read_arrow_records_per_s": round(rows / read_s),
            }
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
