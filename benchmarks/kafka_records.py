"""Transcoding Kafka RecordBatch v2 <-> replog batches, beside Python peers in the same run.

Batches of ``--batch-records`` records (500) with 100-byte values (hex text of random bytes, so
zstd has something to do but not everything; no keys, no headers, as kafka-producer-perf-test
sends), uncompressed and zstd:

- ``kafka_to_replog``: replication.kafka.records.kafka_to_replog of one Kafka batch (what the
  Kafka listener does per partition of a Produce request);
- ``replog_to_kafka``: replog_to_kafka of a fetch result of ``--fetch-batches`` (10) replog
  batches (what the listener does per partition of a Fetch response);

and, as physical peers on the same bytes:

- ``kafka_python_read``: kafka-python's own pure-Python reader (DefaultRecordBatch) iterating
  every record of the same Kafka batch (decompressing it first for zstd);
- ``cramjam_zstd_decompress``: cramjam.zstd.decompress of the zstd Kafka batch's records
  section alone, the decompression floor under both directions;

and the Arrow steps inside the two directions, which every replog reader and writer pays too:

- ``replog_to_arrow``: RecordBatch.to_arrow of the stored replog batch (IPC read, with zstd
  buffer decompression for zstd);
- ``arrow_ipc_write``: writing the same Arrow records as an IPC stream (zstd for zstd), as
  logstore.batch.build does.

Each figure is the median of ``--runs`` runs of ``--records`` records, after a warm-up. MB/s is
the size of the uncompressed Kafka batch (header and records) per second, for every row, so the
rows compare; ``wire_bytes_per_batch`` gives the Kafka batch's size as sent. Prints one JSON
line.

    python benchmarks/kafka_records.py [--records 200000] [--runs 5] [--batch-records 500]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cramjam
import pyarrow as pa
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from logstore.batch import HEADER_SIZE, parse_header, set_base_offset
from replication.kafka.records import kafka_to_replog, replog_to_kafka

VALUE_BYTES = 100
NONE = 0
ZSTD = 4


def kafka_batch(records: int, codec: int, seed: int = 0) -> bytes:
    """A Kafka batch as kafka-python's producer builds it."""
    rng = random.Random(seed)
    builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 1 << 30)
    now = int(time.time() * 1000)
    for i in range(records):
        value = rng.randbytes(VALUE_BYTES // 2).hex().encode()
        assert builder.append(i, now + i, None, value, []) is not None
    data = bytes(builder.build())
    assert DefaultRecordBatch(data).compression_type == codec
    return data


def fetch_result(replog_batch: bytes, batches: int) -> bytes:
    """``batches`` copies of a replog batch at consecutive offsets: a fetch result."""
    count = parse_header(replog_batch).record_count
    out = bytearray()
    for i in range(batches):
        copy = bytearray(replog_batch)
        set_base_offset(copy, i * count)
        out += copy
    return bytes(out)


def kafka_python_read(data: bytes) -> int:
    n = 0
    for _record in DefaultRecordBatch(data):
        n += 1
    return n


def ipc_write(data: pa.RecordBatch, compression: str | None) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, data.schema, options=options) as writer:
        writer.write_batch(data)
    return sink.getvalue()


def measure(fn: Callable[[], object], calls: int, runs: int) -> float:
    """Median seconds for ``calls`` calls of ``fn``, over ``runs`` runs after one warm-up."""
    for _ in range(max(1, calls // 10)):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rates(records: int, logical_bytes: int, seconds: float) -> dict[str, float]:
    return {
        "records_per_s": round(records / seconds),
        "mb_per_s": round(logical_bytes / seconds / 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch-records", type=int, default=500)
    parser.add_argument("--fetch-batches", type=int, default=10)
    args = parser.parse_args()
    per_batch = args.batch_records
    calls = max(1, args.records // per_batch)
    fetch_calls = max(1, args.records // (per_batch * args.fetch_batches))
    plain = kafka_batch(per_batch, NONE)
    result: dict[str, Any] = {
        "benchmark": "kafka_records",
        "records_per_run": calls * per_batch,
        "runs": args.runs,
        "batch_records": per_batch,
        "fetch_batches": args.fetch_batches,
        "value_bytes": VALUE_BYTES,
        "uncompressed_kafka_batch_bytes": len(plain),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
    }
    for name, codec in (("none", NONE), ("zstd", ZSTD)):
        kafka = kafka_batch(per_batch, codec)
        replog = kafka_to_replog(kafka)
        fetch = fetch_result(replog, args.fetch_batches)
        # The transcoded fetch must read back as the same records the producer sent.
        back = replog_to_kafka(fetch)
        first = DefaultRecordBatch(back[: len(plain)])
        assert first.validate_crc()
        assert [r.value for r in first] == [r.value for r in DefaultRecordBatch(plain)]
        row: dict[str, Any] = {
            "wire_bytes_per_batch": len(kafka),
            "replog_bytes_per_batch": len(replog),
        }
        seconds = measure(partial(kafka_to_replog, kafka), calls, args.runs)
        row["kafka_to_replog"] = rates(calls * per_batch, calls * len(plain), seconds)
        seconds = measure(partial(replog_to_kafka, fetch), fetch_calls, args.runs)
        fetched = fetch_calls * args.fetch_batches
        row["replog_to_kafka"] = rates(fetched * per_batch, fetched * len(plain), seconds)
        seconds = measure(partial(kafka_python_read, kafka), calls, args.runs)
        row["kafka_python_read"] = rates(calls * per_batch, calls * len(plain), seconds)
        if codec == ZSTD:
            section = kafka[HEADER_SIZE:]
            seconds = measure(partial(cramjam.zstd.decompress, section), calls, args.runs)
            row["cramjam_zstd_decompress"] = rates(calls * per_batch, calls * len(plain), seconds)
        # The Arrow side alone, shared with every replog reader and writer: reading the stored
        # batch's IPC payload (to_arrow), and writing it (what build does after the records
        # are Arrow columns).
        stored = parse_header(replog)
        seconds = measure(stored.to_arrow, calls, args.runs)
        row["replog_to_arrow"] = rates(calls * per_batch, calls * len(plain), seconds)
        arrow = stored.to_arrow()
        write = partial(ipc_write, arrow, "zstd" if codec == ZSTD else None)
        seconds = measure(write, calls, args.runs)
        row["arrow_ipc_write"] = rates(calls * per_batch, calls * len(plain), seconds)
        row["kafka_to_replog_vs_kafka_python_read"] = round(
            row["kafka_to_replog"]["records_per_s"] / row["kafka_python_read"]["records_per_s"],
            2,
        )
        result[name] = row
    print(json.dumps(result))


if __name__ == "__main__":
    main()
