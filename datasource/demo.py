"""``replog demo``: the whole mission on an embedded default, in one command.

1. A 3-broker cluster (plus a controller) on local files in a fresh directory.
2. Topics ``events`` and ``events-enriched``: 3 partitions, replication factor 3,
   min.insync.replicas 2.
3. A synthetic event stream produced with acks=all.
4. A Spark Structured Streaming pipeline: replog -> transform -> replog with the exactly-once
   sink, with a leader SIGKILLed midway (``--no-chaos`` skips it) and the failover shown.
5. A verification table: records in, records out, duplicates, missing, per-partition offsets.
   Exit status 0 only if nothing was lost or duplicated.

Every process it starts is stopped on exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from replication.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from replication.tools import local_cluster

IN_TOPIC = "events"
OUT_TOPIC = "events-enriched"
PARTITIONS = 3
#: failover in seconds, not the production default of tens of seconds
FAST = {
    "broker.heartbeat.interval.ms": "200",
    "broker.session.timeout.ms": "2000",
    "replica.lag.time.max.ms": "4000",
    "replica.fetch.wait.max.ms": "100",
}


@dataclass
class DemoReport:
    records_in: int = 0
    records_out: int = 0
    duplicates: int = 0
    missing: int = 0
    in_offsets: dict[int, int] = field(default_factory=dict)
    out_offsets: dict[int, int] = field(default_factory=dict)
    failover: str = "skipped (--no-chaos)"

    @property
    def ok(self) -> bool:
        return (
            self.duplicates == 0 and self.missing == 0 and self.records_out == self.records_in > 0
        )


def _events(start: int, n: int) -> pa.Table:
    ids = range(start, start + n)
    values = [
        json.dumps({"id": i, "user": f"user-{i % 97}", "amount": round((i % 1000) * 0.25, 2)})
        for i in ids
    ]
    keys = [f"user-{i % 97}".encode() for i in ids]
    return pa.table({"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.string())})


def _end_offsets(bootstrap: str, topic: str, committed: bool = True) -> dict[int, int]:
    consumer = Consumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed" if committed else "read_uncommitted",
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return {tp.partition: off for tp, off in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def _leader_of(bootstrap: str, topic: str, partition: int) -> int:
    with Admin(bootstrap_servers=bootstrap) as admin:
        return int(admin.describe_topic(topic).partitions[partition].leader)


def run_demo(*, records: int, data: str | None, chaos: bool = True) -> int:
    console = Console()
    # the demo shows its own story: client retries during the failover are expected
    for name in ("replication", "datasource"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    root = Path(data or tempfile.mkdtemp(prefix="replog-demo-"))
    console.rule("[bold]replog demo")
    console.print(
        f"data directory: [cyan]{root}[/cyan]"
        + (" (kept: you gave --data)" if data else " (a fresh temp dir, removed at the end)"),
        soft_wrap=True,
    )
    nodes: list[local_cluster.NodeProcess] = []
    spark = None

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with console.status("starting a controller and 3 brokers on 127.0.0.1 ..."):
            nodes = local_cluster.cluster_up(str(root), 3, 0, conf_dir=None, overrides=FAST)
        brokers = {n.node_id: n for n in nodes if n.role == "broker"}
        bootstrap = ",".join(n.address for n in brokers.values())
        console.print(f"cluster up: brokers {bootstrap}; each on its own storage root")
        with Admin(bootstrap_servers=bootstrap) as admin:
            admin.create_topics(
                [
                    NewTopic(t, PARTITIONS, 3, {"min.insync.replicas": "2"})
                    for t in (IN_TOPIC, OUT_TOPIC)
                ]
            )
        console.print(f"topics {IN_TOPIC!r} and {OUT_TOPIC!r}: 3 partitions, RF 3, min ISR 2")
        _produce(console, bootstrap, records)
        spark = _spark(console)
        report = _pipeline(console, spark, bootstrap, root, records, chaos, brokers)
        _print_report(console, report)
        return 0 if report.ok else 1
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping everything[/yellow]")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        if spark is not None:
            spark.stop()
        if nodes:
            local_cluster.stop_nodes(nodes)
            (root / local_cluster.STATE_FILE).unlink(missing_ok=True)
        if data is None:
            shutil.rmtree(root, ignore_errors=True)
            console.print(
                f"removed the data directory {root} (--data DIR keeps the logs)", soft_wrap=True
            )
        else:
            console.print(
                f"the logs stay in {root}: `replog log dump {root}/broker-0/{OUT_TOPIC}/0 "
                "--records` shows a partition's batches, transaction markers included",
                soft_wrap=True,
            )


def _produce(console: Console, bootstrap: str, records: int) -> None:
    chunk = 10_000
    with Progress(
        TextColumn("producing events (acks=all)"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("produce", total=records)
        with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=5) as producer:
            for start in range(0, records, chunk):
                n = min(chunk, records - start)
                futures = producer.send_arrow(IN_TOPIC, _events(start, n))
                for f in futures:
                    f.result()
                progress.update(task, advance=n)


def _spark(console: Console) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with console.status("starting Spark (local[2]) ..."):
        from pyspark.sql import SparkSession

        from datasource.source import ReplogDataSource

        spark = (
            SparkSession.builder.master("local[2]")
            .appName("replog-demo")
            .config("spark.sql.shuffle.partitions", "3")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(ReplogDataSource)
    return spark


def _pipeline(
    console: Console,
    spark: Any,
    bootstrap: str,
    root: Path,
    records: int,
    chaos: bool,
    brokers: dict[int, local_cluster.NodeProcess],
) -> DemoReport:
    from pyspark.sql import functions as F

    report = DemoReport(records_in=records)
    events = (
        spark.readStream.format("replog")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", IN_TOPIC)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max(records // 6, 1000)))
        .load()
    )
    schema = "id LONG, user STRING, amount DOUBLE"
    enriched = events.select(
        F.from_json(F.col("value").cast("string"), schema).alias("e"), "key"
    ).select(
        "key",
        F.to_json(
            F.struct(
                F.col("e.id").alias("id"),
                F.upper(F.col("e.user")).alias("user"),
                (F.col("e.amount") * 100).cast("long").alias("cents"),
            )
        ).alias("value"),
    )
    query = (
        enriched.writeStream.format("replog")
        .option("bootstrap.servers", bootstrap)
        .option("topic", OUT_TOPIC)
        .option("checkpointLocation", str(root / "checkpoint"))
        .trigger(processingTime="1 second")
        .start()
    )
    console.print(
        "Spark pipeline running: replog -> from_json/enrich -> replog (exactly-once sink)"
    )

    def processed() -> int:
        """Rows of the micro-batches Spark has committed (the sink committed them first)."""
        return sum(int(p.get("numInputRows", 0)) for p in query.recentProgress)

    try:
        with Progress(
            TextColumn("records through the pipeline"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            task = progress.add_task("out", total=records)
            killed = not chaos
            deadline = time.monotonic() + 150
            while True:
                if query.exception() is not None:
                    raise RuntimeError(f"the streaming query failed: {query.exception()}")
                done = processed()
                progress.update(task, completed=done)
                if done >= records:
                    break
                if not killed and done >= records // 3:
                    killed = True
                    report.failover = _kill_a_leader(console, bootstrap, brokers)
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)
    finally:
        query.stop()
    report.in_offsets = _end_offsets(bootstrap, IN_TOPIC)
    report.out_offsets = _end_offsets(bootstrap, OUT_TOPIC)
    ids = _read_output_ids(bootstrap)
    counts = Counter(ids)
    report.records_out = len(ids)
    report.duplicates = sum(c - 1 for c in counts.values() if c > 1)
    report.missing = len(set(range(records)) - set(counts))
    return report


def _kill_a_leader(
    console: Console, bootstrap: str, brokers: dict[int, local_cluster.NodeProcess]
) -> str:
    leader = _leader_of(bootstrap, OUT_TOPIC, 0)
    victim = brokers[leader]
    os.kill(victim.pid, signal.SIGKILL)
    started = time.monotonic()
    console.print(
        f"[red]chaos:[/red] SIGKILLed broker {leader} (pid {victim.pid}), leader of "
        f"{OUT_TOPIC}-0, mid-stream"
    )
    live = ",".join(b.address for i, b in brokers.items() if i != leader)
    deadline = time.monotonic() + 60
    new = leader
    while new in (-1, leader):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no new leader for {OUT_TOPIC}-0 within 60s")
        time.sleep(0.1)
        new = _leader_of(live, OUT_TOPIC, 0)
    took = time.monotonic() - started
    console.print(f"failover: broker {new} now leads {OUT_TOPIC}-0 ({took:.1f}s after the kill)")
    return f"broker {leader} killed; broker {new} led after {took:.1f}s"


def _read_output_ids(bootstrap: str) -> list[int]:
    consumer = Consumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", auto_offset_reset="earliest"
    )
    ids: list[int] = []
    try:
        tps = [TopicPartition(OUT_TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for record in consumer.poll(timeout_ms=1000):
                ids.append(int(json.loads(record.value or b"{}")["id"]))
    finally:
        consumer.close()
    return ids


def _print_report(console: Console, report: DemoReport) -> None:
    table = Table(title="verification (read_committed)")
    table.add_column("check")
    table.add_column("value", justify="right")
    table.add_row("records in", f"{report.records_in:,}")
    table.add_row("records out", f"{report.records_out:,}")
    table.add_row("duplicates", str(report.duplicates))
    table.add_row("missing", str(report.missing))
    table.add_row("failover", report.failover)
    console.print(table)
    offsets = Table(title="per-partition end offsets")
    offsets.add_column("partition")
    offsets.add_column(IN_TOPIC, justify="right")
    offsets.add_column(f"{OUT_TOPIC} (committed)", justify="right")
    for p in range(PARTITIONS):
        offsets.add_row(str(p), str(report.in_offsets.get(p)), str(report.out_offsets.get(p)))
    console.print(offsets)
    console.print(
        f"{OUT_TOPIC}'s end offsets run ahead of its record count: every micro-batch the sink "
        "committed also wrote a transaction marker (a control record, as in Kafka) on each "
        "partition it wrote to. Markers take an offset each, and readers never see them.",
        soft_wrap=True,
    )
    verdict = "[green]OK: every record exactly once[/green]" if report.ok else "[red]FAILED[/red]"
    console.print(verdict)


__all__ = ["DemoReport", "run_demo"]


def main(argv: list[str] | None = None) -> int:
    """``python -m datasource.demo [--records N] [--data DIR] [--no-chaos]`` (what ``replog
    demo`` runs)."""
    parser = argparse.ArgumentParser(prog="replog demo", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--data", default=None)
    parser.add_argument("--no-chaos", dest="chaos", action="store_false")
    args = parser.parse_args(argv)
    return run_demo(records=args.records, data=args.data, chaos=args.chaos)


if __name__ == "__main__":
    sys.exit(main())
