"""Spark streaming reads from replog beside the ceiling of the Python data source path.

Produces ``--rows`` records of 100-byte random values into a 3-partition topic on one broker
(local files), writes the same rows as Parquet, then measures in one local SparkSession
(local[2], as the tests):

- throughput: a streaming read with ``trigger(availableNow=True)`` into the ``noop`` sink of
  (a) replog (direct reads of the segment objects, read_committed, the defaults), (b) a trivial
  Python data source that yields the same Arrow batches (same schema, same batch size, as many
  input partitions as replog plans) from memory -- the ceiling of Spark's Python data source
  path -- and (c) Spark's own Parquet
  file-stream source over the same rows. Each runs ``--runs`` times, interleaved, after two
  warm-up queries each; the median is reported, as rows/s over the whole query (start-up
  included) and over the micro-batches' own durations ("once started").
- micro-batch latency: the median ``triggerExecution`` of 10,000-row micro-batches under a
  processing-time trigger, for replog (maxOffsetsPerTrigger=10000), the in-memory source and
  Spark's ``rate-micro-batch`` source (rowsPerBatch=10000).

Goals: replog at least 0.8x the in-memory source's rows/s, and micro-batches within
1.5x of the in-memory source's. Prints one JSON line.

    python benchmarks/spark_read.py [--rows 5000000] [--runs 5] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from datasource.schema import arrow_schema, spark_schema
from replication.client import Admin, Producer
from tests.cluster import BrokerProcess
from tests.spark_session import start_local_session

VALUE_BYTES = 100
PARTITIONS = 3
TOPIC = "bench"
MICRO_BATCH_ROWS = 10_000
MICRO_BATCHES = 30
WARM_UP_ROUNDS = 2
GOAL_VS_MEMORY = 0.8
GOAL_MICRO_BATCH_VS_MEMORY = 1.5


# --- the in-memory peer ---------------------------------------------------------------------


class _Range(InputPartition):
    def __init__(self, partition: int, start: int, end: int, batch_rows: int) -> None:
        self.partition, self.start, self.end, self.batch_rows = partition, start, end, batch_rows


_TEMPLATE: dict[int, pa.RecordBatch] = {}


def _template(batch_rows: int) -> pa.RecordBatch:
    """One batch of the source's schema with random 100-byte values, made once per worker."""
    if batch_rows not in _TEMPLATE:
        rng = np.random.default_rng(1)
        values = pa.Array.from_buffers(
            pa.binary(),
            batch_rows,
            [
                None,
                pa.py_buffer(np.arange(0, (batch_rows + 1) * VALUE_BYTES, VALUE_BYTES, np.int32)),
                pa.py_buffer(rng.integers(0, 256, batch_rows * VALUE_BYTES, np.uint8)),
            ],
        )
        now = int(time.time() * 1_000_000)
        _TEMPLATE[batch_rows] = pa.RecordBatch.from_arrays(
            [
                pa.nulls(batch_rows, pa.binary()),
                values,
                pa.repeat(pa.scalar(TOPIC), batch_rows),
                pa.repeat(pa.scalar(0, pa.int32()), batch_rows),
                pa.array(np.arange(batch_rows, dtype=np.int64)),
                pa.repeat(pa.scalar(now, pa.timestamp("us", tz="UTC")), batch_rows),
                pa.repeat(pa.scalar(0, pa.int32()), batch_rows),
            ],
            schema=arrow_schema(False),
        )
    return _TEMPLATE[batch_rows]


class MemoryStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets per partition up to ``rows``; read() yields slices of one in-memory batch."""

    def __init__(self, rows: int, batch_rows: int, splits: int, max_rows: int | None) -> None:
        self.rows, self.batch_rows, self.splits, self.max_rows = rows, batch_rows, splits, max_rows

    def initialOffset(self) -> dict[str, int]:
        return {str(p): 0 for p in range(PARTITIONS)}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_rows is None else ReadMaxRows(self.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        ends = {p: len(range(int(p), self.rows, PARTITIONS)) for p in start}
        if isinstance(limit, ReadMaxRows):
            share = limit.max_rows // PARTITIONS
            return {p: min(start[p] + share, ends[p]) for p in start}
        return ends

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        # Split like replog's plan of the same offsets, so both use the cores alike.
        out: list[InputPartition] = []
        for p in start:
            size = end[p] - start[p]
            parts = max(min(self.splits, size // self.batch_rows), 1)
            cuts = [start[p] + size * i // parts for i in range(parts + 1)]
            pieces = itertools.pairwise(cuts)
            out.extend(_Range(int(p), lo, hi, self.batch_rows) for lo, hi in pieces if hi > lo)
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Range)
        template = _template(partition.batch_rows)
        at = partition.start
        while at < partition.end:
            n = min(partition.batch_rows, partition.end - at)
            yield template.slice(0, n)
            at += n


class MemorySource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "replog_bench_memory"

    def schema(self) -> Any:
        return spark_schema(False)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        max_rows = self.options.get("maxrows")
        return MemoryStreamReader(
            int(self.options["rows"]),
            int(self.options["batchrows"]),
            int(self.options["splits"]),
            None if max_rows is None else int(max_rows),
        )


# --- data -------------------------------------------------------------------------------------


def random_values(n: int, seed: int) -> pa.Array:
    rng = np.random.default_rng(seed)
    offsets = np.arange(0, (n + 1) * VALUE_BYTES, VALUE_BYTES, dtype=np.int32)
    data = rng.integers(0, 256, n * VALUE_BYTES, dtype=np.uint8)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def produce(bootstrap: str, rows: int, chunk: int = 500_000) -> float:
    """``rows`` records, row i to partition i % 3; returns the seconds it took."""
    start = time.perf_counter()
    with Producer(bootstrap_servers=bootstrap, linger_ms=20) as producer:
        futures = []
        for first in range(0, rows, chunk):
            n = min(chunk, rows - first)
            table = pa.table(
                {
                    "value": random_values(n, first),
                    "partition": pa.array(np.arange(first, first + n) % PARTITIONS, pa.int32()),
                }
            )
            futures.extend(producer.send_arrow(TOPIC, table))
        for future in futures:
            future.result(timeout=600)
    return time.perf_counter() - start


def write_parquet(directory: Path, rows: int, chunk: int = 500_000) -> None:
    """The same rows, in the source's schema, as Parquet files of ``chunk`` rows."""
    directory.mkdir(parents=True)
    now = int(time.time() * 1_000_000)
    for i, first in enumerate(range(0, rows, chunk)):
        n = min(chunk, rows - first)
        index = np.arange(first, first + n)
        table = pa.Table.from_arrays(
            [
                pa.nulls(n, pa.binary()),
                random_values(n, first),
                pa.repeat(pa.scalar(TOPIC), n),
                pa.array(index % PARTITIONS, pa.int32()),
                pa.array(index // PARTITIONS, pa.int64()),
                pa.repeat(pa.scalar(now, pa.timestamp("us", tz="UTC")), n),
                pa.repeat(pa.scalar(0, pa.int32()), n),
            ],
            schema=arrow_schema(False),
        )
        pq.write_table(table, directory / f"part-{i:05d}.parquet")


# --- measuring --------------------------------------------------------------------------------


class Runner:
    def __init__(
        self, spark: Any, work: Path, bootstrap: str, rows: int, batch_rows: int, splits: int
    ) -> None:
        self.spark, self.work, self.bootstrap = spark, work, bootstrap
        self.rows, self.batch_rows, self.splits = rows, batch_rows, splits
        self.queries = 0

    def stream(self, source: str, micro_batch: bool = False) -> Any:
        reader = self.spark.readStream
        if source == "replog":
            reader = (
                reader.format("replog")
                .option("bootstrap.servers", self.bootstrap)
                .option("subscribe", TOPIC)
                .option("startingOffsets", "earliest")
            )
            if micro_batch:
                reader = reader.option("maxOffsetsPerTrigger", MICRO_BATCH_ROWS)
        elif source == "memory":
            reader = (
                reader.format(MemorySource.name())
                .option("rows", self.rows)
                .option("batchRows", self.batch_rows)
                .option("splits", self.splits)
            )
            if micro_batch:
                reader = reader.option("maxRows", MICRO_BATCH_ROWS)
        elif source == "parquet":
            reader = reader.format("parquet").schema(spark_schema(False))
            return reader.load(str(self.work / "parquet"))
        elif source == "rate-micro-batch":
            return reader.format("rate-micro-batch").option("rowsPerBatch", MICRO_BATCH_ROWS).load()
        return reader.load()

    def _checkpoint(self) -> str:
        self.queries += 1
        return str(self.work / "checkpoints" / f"q{self.queries}")

    def available_now(self, source: str) -> dict[str, float]:
        """One availableNow query into noop: rows/s overall and once started."""
        start = time.perf_counter()
        query = (
            self.stream(source)
            .writeStream.format("noop")
            .option("checkpointLocation", self._checkpoint())
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        seconds = time.perf_counter() - start
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
        rows = sum(p["numInputRows"] for p in progress)
        busy = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
        if rows != self.rows:
            raise RuntimeError(f"{source} read {rows} rows, expected {self.rows}")
        return {"seconds": seconds, "rows_per_s": rows / seconds, "started_rows_per_s": rows / busy}

    def micro_batches(self, source: str) -> float:
        """Median triggerExecution (ms) of 10,000-row micro-batches, after 3 warm-up ones."""
        stream = self.stream(source, micro_batch=True)
        writer = stream.writeStream.format("noop").option("checkpointLocation", self._checkpoint())
        query = writer.trigger(processingTime="100 milliseconds").start()
        # as many as the rows make (a small --rows run has fewer than MICRO_BATCHES + 3)
        wanted = max(min(MICRO_BATCHES + 3, self.rows // MICRO_BATCH_ROWS), 4)
        try:
            deadline = time.monotonic() + 600
            while True:
                done = [p for p in query.recentProgress if p["numInputRows"] > 0]
                if len(done) >= wanted or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        finally:
            query.stop()
        sizes = {p["numInputRows"] for p in done[3:]}
        if not sizes <= {MICRO_BATCH_ROWS, MICRO_BATCH_ROWS - MICRO_BATCH_ROWS % PARTITIONS}:
            raise RuntimeError(f"{source}: micro-batches of {sorted(sizes)} rows")
        return statistics.median(p["durationMs"]["triggerExecution"] for p in done[3:])


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "spark_cores": 2,
        "platform": platform.platform(terse=True),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the temp directories go")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="replog-bench-spark-read-", dir=args.dir))
    broker = BrokerProcess(work / "broker")
    out: dict[str, Any] = {
        "benchmark": "spark_read",
        "machine": machine(),
        "rows": args.rows,
        "value_bytes": VALUE_BYTES,
        "partitions": PARTITIONS,
        "runs": args.runs,
    }
    spark = None
    try:
        broker.start()
        with Admin(bootstrap_servers=broker.bootstrap) as admin:
            admin.create_topic(TOPIC, PARTITIONS, 1)
        out["produce_s"] = round(produce(broker.bootstrap, args.rows), 1)
        write_parquet(work / "parquet", args.rows)
        batch_rows, splits = _replog_plan(broker.bootstrap)
        out["arrow_batch_rows"] = batch_rows
        out["input_partitions"] = splits * PARTITIONS
        spark = start_local_session("replog-bench-spark-read")
        spark.dataSource.register(MemorySource)
        runner = Runner(spark, work, broker.bootstrap, args.rows, batch_rows, splits)
        sources = ("replog", "memory", "parquet")
        for _ in range(WARM_UP_ROUNDS):  # the JVM's JIT, Python workers, imports
            for source in sources:
                runner.available_now(source)
        runs: dict[str, list[dict[str, float]]] = {s: [] for s in sources}
        for i in range(args.runs):
            # Interleaved, and each source first in turn, so drift in the machine hits all.
            for source in sources[i % 3 :] + sources[: i % 3]:
                runs[source].append(runner.available_now(source))
        through = {
            s: {
                "rows_per_s": round(statistics.median(r["rows_per_s"] for r in runs[s])),
                "started_rows_per_s": round(
                    statistics.median(r["started_rows_per_s"] for r in runs[s])
                ),
                "seconds": [round(r["seconds"], 2) for r in runs[s]],
            }
            for s in sources
        }
        out["available_now"] = through
        replog, memory, parquet = (through[s]["rows_per_s"] for s in sources)
        out["ratio_vs_memory"] = round(replog / memory, 2)
        out["ratio_vs_parquet"] = round(replog / parquet, 2)
        out["started_ratio_vs_memory"] = round(
            through["replog"]["started_rows_per_s"] / through["memory"]["started_rows_per_s"], 2
        )
        micro = {s: runner.micro_batches(s) for s in ("replog", "memory", "rate-micro-batch")}
        out["micro_batch_ms"] = {s: round(ms) for s, ms in micro.items()}
        out["micro_batch_ratio_vs_memory"] = round(micro["replog"] / micro["memory"], 2)
        out["goals"] = {
            "throughput_vs_memory_at_least": GOAL_VS_MEMORY,
            "micro_batch_vs_memory_at_most": GOAL_MICRO_BATCH_VS_MEMORY,
            "throughput_met": out["ratio_vs_memory"] >= GOAL_VS_MEMORY,
            "micro_batch_met": out["micro_batch_ratio_vs_memory"] <= GOAL_MICRO_BATCH_VS_MEMORY,
        }
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out))


def _replog_plan(bootstrap: str) -> tuple[int, int]:
    """Rows per log batch (what replog's read() yields per Arrow batch) and input partitions
    per topic partition in replog's plan of the whole topic: the in-memory peer does alike."""
    from datasource.options import parse_source_options
    from datasource.planner import Planner
    from logstore.reader import SegmentReader

    planner = Planner(
        parse_source_options({"bootstrap.servers": bootstrap, "subscribe": TOPIC}, streaming=False)
    )
    try:
        tps = planner.view.topic_partitions()
        planned = planner.plan(planner.view.earliest(tps), planner.view.latest(tps))
        first = planned[0]
        replica = first.replicas[0]
        # The plan's objects say where the first replica holds the range: segment objects,
        # or chunks of its broker's WAL objects, which no listing of the partition finds.
        with SegmentReader.open(replica.log_dir, first.topic, first.partition) as reader:
            batch = next(iter(reader.batches(first.start, first.start + 1, objects=first.objects)))
        return int(batch.record_count), max(len(planned) // len(tps), 1)
    finally:
        planner.close()


if __name__ == "__main__":
    main()
