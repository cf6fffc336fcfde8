"""Spark streaming writes to replog beside the ceilings of the write path.

Starts a controller and three brokers as processes on local files (tests/cluster.Cluster),
writes ``--rows`` rows of 100-byte random values as Parquet files (one column, ``value``
binary; ``--file-rows`` rows a file, fewer if that would make fewer than 10 files), and
measures in one local SparkSession (local[2], as the tests) the same rows through:

(a) replog: Spark's Parquet file-stream source (maxFilesPerTrigger=2: two files, so two tasks,
    a micro-batch; 5 micro-batches of 1,000,000 rows at the defaults) written with
    ``trigger(availableNow=True)`` by the exactly-once sink (datasource/sink.py: one
    transaction per task, acks=all, the driver commits them all as one sink batch) into a
    topic of 3 partitions, RF=3, min.insync.replicas=2;
(b) discard: the same stream into a Python data source defined here whose
    ``DataSourceStreamArrowWriter`` counts its Arrow batches and drops them -- the ceiling of
    Spark's Python data source write path;
(c) parquet: the same stream into Spark's own Parquet file sink;
(d) produce_perf: ``replog perf produce``'s engine in this process, Arrow mode (send_arrow of
    10,000-row tables), acks=all, as many rows of 100 bytes into another topic of 3
    partitions, RF=3, min.insync.replicas=2 -- the brokers' limit for one producer.

Each runs ``--runs`` times, interleaved, after one warm-up each (the Spark ones over two
Parquet files of at most 50,000 rows, (a)'s under the plain ``format("replog")``); every
replog run writes a fresh topic. Reported, the median over runs: rows/s over the whole query
(start-up included) and, for the Spark ones, over the micro-batches' own ``triggerExecution``
("once started") and over the micro-batches after the first ("steady": the first is where
Spark starts the query's Python workers -- about 3-8 s for the replog sink, whose commit runs in
a worker of its own); replog / min(discard, produce_perf) (goal >= 0.8, judged on the whole
query) and replog / parquet, for each.

Commit latency. The sink's ``commit()`` runs in a Python worker the driver launches for it, so
the measured (a) runs a subclass of the replog data source defined here (format
``replog_bench_timed``) that calls the real ``ReplogStreamWriter.write``/``commit`` and appends
their wall-clock start and end to a file: per micro-batch,

- ``commit_ms``: ``ReplogStreamWriter.commit()`` itself -- opening an Admin, CommitSinkBatch
  at the transaction coordinator (the decision record appended acks=all, commit markers to
  every partition of every task's transaction, their completion), closing the Admin;
- ``driver_commit_ms``: from the last task returning from ``write()`` to the end of
  ``commit()``: what the query waits for once its rows are written -- Spark gathering the
  commit messages, launching the commit worker, unpickling the data source, making the writer,
  then ``commit()``;
- ``add_batch_ms``: Spark's ``durationMs.addBatch`` (the tasks' writes and the commit).

p50/p99 are Kafka's perf-test percentiles (``sorted[int(n * q)]``) over every micro-batch of
every run: with 5 micro-batches a run, p99 is the slowest.

Correctness of (a): every replog topic is read back with a read_committed Consumer; its
committed records must number ``--rows`` and every value be 100 bytes, else ``error`` says
what differed. Prints one JSON line.

    python benchmarks/spark_write.py [--rows 5000000] [--runs 1] [--file-rows 500000] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StructField, StructType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from datasource.sink import ReplogCommitMessage, ReplogStreamWriter
from datasource.source import ReplogDataSource
from replication.client import Admin, Consumer, TopicPartition
from replication.client.describe import describe_topic_waiting
from replication.tools.perf import produce_perf
from tests.cluster import Cluster, wait_until
from tests.spark_session import start_local_session

VALUE_BYTES = 100
PARTITIONS = 3
REPLICATION_FACTOR = 3
MIN_INSYNC_REPLICAS = "2"
FILES_PER_TRIGGER = 2
MIN_FILES = 10
WARM_UP_FILE_ROWS = 50_000
GOAL_VS_CEILING = 0.8
SCHEMA = StructType([StructField("value", BinaryType())])
VARIANTS = ("replog", "discard", "parquet", "produce_perf")


# --- (b): the Python data source write path with nothing behind it ---------------------------


@dataclass(frozen=True)
class CountedRows(WriterCommitMessage):
    rows: int


class DiscardStreamWriter(DataSourceStreamArrowWriter):
    """Counts the rows of its Arrow batches and drops them."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> CountedRows:
        return CountedRows(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: list[Any], batchId: int) -> None:
        pass

    def abort(self, messages: list[Any], batchId: int) -> None:
        pass


class DiscardDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "replog_bench_discard"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DiscardStreamWriter:
        return DiscardStreamWriter()


# --- (a) with its write() and commit() timed --------------------------------------------------


def _append_timing(path: str, entry: dict[str, Any]) -> None:
    # one short line per write: O_APPEND keeps lines from several processes whole
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


class TimedReplogStreamWriter(ReplogStreamWriter):
    """replog's stream writer, unchanged, appending the wall-clock span of each call."""

    def __init__(self, schema: StructType, options: Any, overwrite: bool) -> None:
        rest = dict(options)  # the sink refuses options it does not know: keep ours apart
        self.timings = str(rest.pop("bench.timings"))
        super().__init__(schema, rest, overwrite)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ReplogCommitMessage:
        start = time.time()
        message = super().write(iterator)
        end = time.time()
        entry = {"call": "write", "batch": message.batch_id, "start": start, "end": end}
        _append_timing(self.timings, {**entry, "rows": message.rows})
        return message

    def commit(self, messages: list[Any], batchId: int) -> None:
        start = time.time()
        super().commit(messages, batchId)
        end = time.time()
        _append_timing(
            self.timings, {"call": "commit", "batch": batchId, "start": start, "end": end}
        )


class TimedReplogDataSource(ReplogDataSource):
    @classmethod
    def name(cls) -> str:
        return "replog_bench_timed"

    def streamWriter(self, schema: StructType, overwrite: bool) -> TimedReplogStreamWriter:
        return TimedReplogStreamWriter(schema, self.options, overwrite)


# --- data -------------------------------------------------------------------------------------


def random_values(n: int, seed: int) -> pa.Array:
    rng = np.random.default_rng(seed)
    offsets = np.arange(0, (n + 1) * VALUE_BYTES, VALUE_BYTES, dtype=np.int32)
    data = rng.integers(0, 256, n * VALUE_BYTES, dtype=np.uint8)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def write_parquet(directory: Path, rows: int, file_rows: int) -> int:
    """``rows`` rows as Parquet files of ``file_rows`` rows; returns how many files."""
    directory.mkdir(parents=True)
    files = 0
    for first in range(0, rows, file_rows):
        n = min(file_rows, rows - first)
        table = pa.table({"value": random_values(n, first)})
        pq.write_table(table, directory / f"part-{files:05d}.parquet")
        files += 1
    return files


def create_topic(admin: Admin, topic: str) -> None:
    """3 partitions, RF=3, min.insync.replicas=2; returns once every ISR is full."""
    admin.create_topic(
        topic, PARTITIONS, REPLICATION_FACTOR, {"min.insync.replicas": MIN_INSYNC_REPLICAS}
    )
    wait_until(
        lambda: all(
            x.leader >= 0 and len(x.isr) == REPLICATION_FACTOR
            for x in describe_topic_waiting(admin, topic, 30_000).partitions
        ),
        timeout=60,
        message=f"every partition of {topic} has a leader and a full ISR",
    )


def committed_records(bootstrap: str, topic: str) -> dict[str, int]:
    """Records of ``topic`` a read_committed consumer sees, their values not 100 bytes long,
    and the sum of the partitions' LSOs (records + control markers + aborted records)."""
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    records = wrong_size = 0
    consumer = Consumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", auto_offset_reset="earliest"
    )
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            fetched = consumer.poll_arrow(timeout_ms=1000)
            if fetched:
                deadline = time.monotonic() + 60
            elif time.monotonic() > deadline:
                raise RuntimeError(f"reading {topic} back made no progress for 60 s")
            for f in fetched:
                records += f.num_rows
                lengths = pc.binary_length(f.batch.column("value"))
                wrong_size += f.num_rows - pc.sum(pc.equal(lengths, VALUE_BYTES)).as_py()
    finally:
        consumer.close()
    return {"records": records, "wrong_size": wrong_size, "lso_sum": sum(ends.values())}


# --- measuring --------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Kafka's perf-test percentile, as replication.tools.perf: ``sorted[int(n * q)]``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else 0.0


class Runner:
    def __init__(self, spark: Any, work: Path, bootstrap: str, admin: Admin) -> None:
        self.spark, self.work, self.bootstrap, self.admin = spark, work, bootstrap, admin
        self.queries = 0

    def _next(self) -> Path:
        self.queries += 1
        return self.work / "queries" / f"q{self.queries}"

    def spark_query(
        self, variant: str, source: Path, rows: int, timed: bool = True
    ) -> dict[str, Any]:
        """One availableNow query of ``variant`` over the Parquet files in ``source``."""
        here = self._next()
        here.mkdir(parents=True)
        topic = f"sink-{here.name}"
        timings = here / "timings.jsonl"
        if variant == "replog":
            create_topic(self.admin, topic)
        start = time.perf_counter()
        stream = (
            self.spark.readStream.schema(SCHEMA)
            .option("maxFilesPerTrigger", FILES_PER_TRIGGER)
            .parquet(str(source))
        )
        writer = stream.writeStream.option("checkpointLocation", str(here / "checkpoint"))
        if variant == "replog":
            writer = writer.option("bootstrap.servers", self.bootstrap).option("topic", topic)
            if timed:
                writer = writer.format(TimedReplogDataSource.name())
                writer = writer.option("bench.timings", str(timings))
            else:
                writer = writer.format("replog")
        elif variant == "discard":
            writer = writer.format(DiscardDataSource.name())
        elif variant == "parquet":
            writer = writer.format("parquet").option("path", str(here / "out"))
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        seconds = time.perf_counter() - start
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
        read = sum(p["numInputRows"] for p in progress)
        if read != rows:
            raise RuntimeError(f"{variant} wrote {read} rows, expected {rows}")
        busy = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
        # after the first micro-batch, in which Spark starts this query's Python workers
        later = progress[1:] or progress
        steady = sum(p["durationMs"]["triggerExecution"] for p in later) / 1000
        out: dict[str, Any] = {
            "seconds": seconds,
            "rows_per_s": rows / seconds,
            "started_rows_per_s": rows / busy,
            "steady_rows_per_s": sum(p["numInputRows"] for p in later) / steady,
            "micro_batches": len(progress),
        }
        if variant == "replog":
            out["topic"] = topic
            out["add_batch_ms"] = [p["durationMs"]["addBatch"] for p in progress]
            if timed:
                out.update(commit_timings(timings, [p["batchId"] for p in progress]))
        shutil.rmtree(here / "out", ignore_errors=True)  # the parquet sink's copy of the rows
        return out

    def produce(self, rows: int) -> dict[str, Any]:
        topic = f"perf-{self._next().name}"
        create_topic(self.admin, topic)
        start = time.perf_counter()
        result = produce_perf(self.bootstrap, topic, rows, VALUE_BYTES, acks="all", mode="arrow")
        seconds = time.perf_counter() - start
        if result.errors:
            raise RuntimeError(f"produce_perf: {result.errors} errors, first {result.first_error}")
        return {
            "seconds": seconds,
            "rows_per_s": result.records_per_s,
            "batch_latency_p50_ms": result.latency_p50_ms,
            "batch_latency_p99_ms": result.latency_p99_ms,
        }


def commit_timings(path: Path, batches: list[int]) -> dict[str, list[float]]:
    """Per micro-batch: commit() (ms) and last write() end to commit() end (ms)."""
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    commits = {e["batch"]: e for e in entries if e["call"] == "commit"}
    commit_ms, driver_ms = [], []
    for batch in batches:
        writes = [e for e in entries if e["call"] == "write" and e["batch"] == batch]
        if batch not in commits or not writes:
            raise RuntimeError(f"no timings of micro-batch {batch} in {path}")
        done = commits[batch]["end"]
        commit_ms.append((done - commits[batch]["start"]) * 1000)
        driver_ms.append((done - max(e["end"] for e in writes)) * 1000)
    return {"commit_ms": commit_ms, "driver_commit_ms": driver_ms}


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "spark_cores": 2,
        "platform": platform.platform(terse=True),
    }


def load_average() -> float:
    """The 1-minute load average: other work on the machine skews every figure here."""
    return round(os.getloadavg()[0], 2)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "rows_per_s": round(statistics.median(r["rows_per_s"] for r in runs)),
        "seconds": [round(r["seconds"], 2) for r in runs],
    }
    if "started_rows_per_s" in runs[0]:
        out["started_rows_per_s"] = round(statistics.median(r["started_rows_per_s"] for r in runs))
        out["steady_rows_per_s"] = round(statistics.median(r["steady_rows_per_s"] for r in runs))
        out["micro_batches"] = runs[0]["micro_batches"]
    for key in ("batch_latency_p50_ms", "batch_latency_p99_ms"):
        if key in runs[0]:
            out[key] = statistics.median(r[key] for r in runs)
    for key in ("add_batch_ms", "commit_ms", "driver_commit_ms"):
        if key in runs[0]:
            values = [v for r in runs for v in r[key]]
            out[key] = {
                "p50": round(percentile(values, 0.50), 1),
                "p99": round(percentile(values, 0.99), 1),
                "samples": len(values),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--file-rows", type=int, default=500_000, help="rows per Parquet file")
    parser.add_argument("--dir", default=None, help="where the temp directories go")
    args = parser.parse_args()
    file_rows = max(min(args.file_rows, math.ceil(args.rows / MIN_FILES)), 1)
    if math.ceil(math.ceil(args.rows / file_rows) / FILES_PER_TRIGGER) > 100:
        parser.error("more than 100 micro-batches (Spark keeps 100 progresses): raise --file-rows")
    work = Path(tempfile.mkdtemp(prefix="replog-bench-spark-write-", dir=args.dir))
    out: dict[str, Any] = {
        "benchmark": "spark_write",
        "machine": machine(),
        "load_average_at_start": load_average(),
        "rows": args.rows,
        "value_bytes": VALUE_BYTES,
        "brokers": 3,
        "storage": "local files",
        "topic": {"partitions": PARTITIONS, "replication_factor": REPLICATION_FACTOR},
        "runs": args.runs,
    }
    started = time.perf_counter()
    cluster = Cluster(work / "cluster", brokers=3)
    spark = None
    try:
        cluster.start()
        out["parquet_files"] = write_parquet(work / "parquet", args.rows, file_rows)
        out["file_rows"] = file_rows
        out["max_files_per_trigger"] = FILES_PER_TRIGGER
        warm_rows = min(WARM_UP_FILE_ROWS, file_rows)
        write_parquet(work / "warm-up", 2 * warm_rows, warm_rows)
        spark = start_local_session("replog-bench-spark-write")
        spark.dataSource.register(DiscardDataSource)
        spark.dataSource.register(TimedReplogDataSource)
        with Admin(bootstrap_servers=cluster.bootstrap) as admin:
            runner = Runner(spark, work, cluster.bootstrap, admin)
            # the JVM's JIT, Python workers and their imports, the brokers' first transactions
            for variant in VARIANTS[:3]:
                runner.spark_query(variant, work / "warm-up", 2 * warm_rows, timed=False)
            runner.produce(2 * warm_rows)
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
            for i in range(args.runs):
                # Interleaved, and each variant first in turn, so drift in the machine hits all.
                for variant in VARIANTS[i % 4 :] + VARIANTS[: i % 4]:
                    if variant == "produce_perf":
                        runs[variant].append(runner.produce(args.rows))
                    else:
                        runs[variant].append(
                            runner.spark_query(variant, work / "parquet", args.rows)
                        )
            out["elapsed_measuring_s"] = round(time.perf_counter() - started, 1)
            out["load_average_after_runs"] = load_average()
            out["results"] = {v: summary(runs[v]) for v in VARIANTS}
            checks = [committed_records(cluster.bootstrap, r["topic"]) for r in runs["replog"]]
        out["replog_committed"] = checks
        errors = [
            f"{r['topic']}: {c['records']} committed records ({c['wrong_size']} not "
            f"{VALUE_BYTES} bytes), expected {args.rows}"
            for r, c in zip(runs["replog"], checks, strict=True)
            if c["records"] != args.rows or c["wrong_size"]
        ]
        if errors:
            out["error"] = "; ".join(errors)
        rate = {v: out["results"][v]["rows_per_s"] for v in VARIANTS}
        started_rate = {v: out["results"][v].get("started_rows_per_s", rate[v]) for v in VARIANTS}
        out["ratio_vs_ceiling"] = round(
            rate["replog"] / min(rate["discard"], rate["produce_perf"]), 2
        )
        out["started_ratio_vs_ceiling"] = round(
            started_rate["replog"] / min(started_rate["discard"], started_rate["produce_perf"]), 2
        )
        steady = {v: out["results"][v].get("steady_rows_per_s", rate[v]) for v in VARIANTS}
        out["steady_ratio_vs_ceiling"] = round(
            steady["replog"] / min(steady["discard"], steady["produce_perf"]), 2
        )
        out["ratio_vs_parquet"] = round(rate["replog"] / rate["parquet"], 2)
        out["steady_ratio_vs_parquet"] = round(steady["replog"] / steady["parquet"], 2)
        out["started_ratio_vs_parquet"] = round(started_rate["replog"] / started_rate["parquet"], 2)
        out["commit_latency_ms"] = {
            k: out["results"]["replog"][k]
            for k in ("commit_ms", "driver_commit_ms", "add_batch_ms")
        }
        out["goals"] = {
            "replog_vs_min_discard_produce_perf_at_least": GOAL_VS_CEILING,
            "met": out["ratio_vs_ceiling"] >= GOAL_VS_CEILING,
        }
    finally:
        if spark is not None:
            spark.stop()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    out["elapsed_s"] = round(time.perf_counter() - started, 1)
    out["load_average_at_end"] = load_average()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
