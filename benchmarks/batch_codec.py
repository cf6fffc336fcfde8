"""Encoding and decoding one record batch of 10,000 records, beside Arrow IPC itself.

A replog batch is a Kafka v2 batch header around an Arrow IPC stream (logstore.batch), so the
floor under ``build`` and ``RecordBatch.to_arrow`` is pyarrow writing and reading the same
table as an IPC stream with the same buffer compression. For each codec (none, lz4, zstd):
``build(table)`` and ``parse_header(data).to_arrow()`` of 10,000 records of 100-byte values,
best of ``--repeat`` runs each, beside ``pa.ipc.new_stream`` / ``pa.ipc.open_stream`` of the
same table, in the same run; the difference is replog's own share (header, CRC, checks).

Prints one JSON line. (This was a timed test, "build and to_arrow under 10 ms"; speed is a
benchmark's business, the tests keep the round trips.)

    python benchmarks/batch_codec.py [--records 10000] [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.produce import machine
from logstore.batch import Compression, build, parse_header


def best_ms(action: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return round(min(times) * 1e3, 3)


def ipc_write(table: pa.Table, codec: str | None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=codec)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def ipc_read(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()

    table = pa.table({"value": pa.array([b"v" * args.value_bytes] * args.records, pa.binary())})
    out: dict[str, object] = {
        "benchmark": "batch_codec",
        "machine": machine(),
        "records": args.records,
        "value_bytes": args.value_bytes,
        "repeat": args.repeat,
    }
    for compression in Compression:
        codec = None if compression is Compression.NONE else compression.name.lower()
        data = build(table, compression=compression)  # warm up
        batch = parse_header(data)
        assert batch.to_arrow().num_rows == args.records
        ipc = ipc_write(table, codec)
        assert ipc_read(ipc).num_rows == args.records
        build_ms = best_ms(lambda c=compression: build(table, compression=c), args.repeat)  # type: ignore[misc]
        decode_ms = best_ms(lambda d=data: parse_header(d).to_arrow(), args.repeat)  # type: ignore[misc]
        write_ms = best_ms(lambda c=codec: ipc_write(table, c), args.repeat)  # type: ignore[misc]
        read_ms = best_ms(lambda d=ipc: ipc_read(d), args.repeat)  # type: ignore[misc]
        out[compression.name.lower()] = {
            "batch_bytes": len(data),
            "build_ms": build_ms,
            "to_arrow_ms": decode_ms,
            "ipc_write_ms": write_ms,
            "ipc_read_ms": read_ms,
            "build_records_per_s": round(args.records / build_ms * 1e3),
            "to_arrow_records_per_s": round(args.records / decode_ms * 1e3),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
