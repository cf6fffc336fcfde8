"""The replog sink under real faults: failed task attempts, a failed query, a SIGKILLed
output leader and a SIGKILLed Spark driver. Every row is written exactly once whatever fails.

Failures inside tasks come from a "tripwire": a Python UDF in the pipeline that raises when it
meets one chosen row (on the first attempt only, or on every attempt while a file exists), so
the task dies in the middle of its micro-batch, with the sink's transaction open.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from replication.client import Admin, NewTopic
from tests.cluster import BrokerProcess, Cluster
from tests.helpers import unique_name, wait_until
from tests.test_spark_sink import committed_values, create, produce_ids

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.chaos]

ROOT = Path(__file__).resolve().parent.parent


def tripwire(directory: Path, row: int, *, every_attempt: bool) -> Any:
    """A UDF passing ``value`` through, but raising on the row ``{"id": row}`` while
    ``directory/armed`` exists: on a task's first attempt only, or on every attempt. Each trip
    leaves a file ``tripped-<partition>-<attempt>`` behind."""
    from pyspark.sql import functions as F

    where = str(directory)

    def check(value: bytes) -> bytes:
        from pyspark import TaskContext

        if json.loads(value)["id"] == row and os.path.exists(os.path.join(where, "armed")):
            context = TaskContext.get()
            assert context is not None  # inside a task
            attempt = context.attemptNumber()
            if every_attempt or attempt == 0:
                name = f"tripped-{context.partitionId()}-{attempt}"
                open(os.path.join(where, name), "w").close()
                raise RuntimeError(f"tripwire: row {row}, attempt {attempt}")
        return value

    return F.udf(check, "binary", useArrow=False)


def query(
    spark: Any,
    bootstrap: str,
    source: str,
    sink: str,
    checkpoint: Path,
    *,
    wire: Any = None,
    max_offsets: int | None = None,
    sink_id: str | None = None,
) -> Any:
    """replog ``source`` -> (tripwire) -> replog ``sink``, exactly once, availableNow."""
    from pyspark.sql import functions as F

    reader = (
        spark.readStream.format("replog")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
    )
    if max_offsets is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
    value = F.col("value") if wire is None else wire(F.col("value"))
    writer = (
        reader.load()
        .select(value.alias("value"))
        .writeStream.format("replog")
        .option("bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    if sink_id is not None:
        writer = writer.option("sink.id", sink_id)
    return writer.start()


def ids(values: list[bytes]) -> Counter[int]:
    return Counter(json.loads(v)["id"] for v in values)


@pytest.fixture
def small_arrow_batches(spark: Any) -> Any:
    """Arrow batches of 50 rows, so a task has handed rows to its transaction before the
    tripwire fires."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "50")
    yield
    spark.conf.set(key, before)


def test_a_task_failing_once_then_retried_writes_its_rows_once(
    spark: Any, broker: BrokerProcess, tmp_path: Path, small_arrow_batches: Any
) -> None:
    source, sink = unique_name("in"), unique_name("out")
    create(broker.bootstrap, source, sink)
    produce_ids(broker.bootstrap, source, range(1000))
    (tmp_path / "armed").touch()
    wire = tripwire(tmp_path, 700, every_attempt=False)
    q = query(spark, broker.bootstrap, source, sink, tmp_path / "ckpt", wire=wire)
    q.awaitTermination(240)
    assert q.exception() is None
    # the task holding row 700 failed on its first attempt, mid-batch, and its retry succeeded
    tripped = sorted(p.name for p in tmp_path.glob("tripped-*"))
    assert len(tripped) == 1, tripped
    assert tripped[0].endswith("-0"), tripped
    assert ids(committed_values(broker.bootstrap, sink)) == Counter(range(1000))


def test_a_query_failing_mid_batch_shows_nothing_then_writes_all_once_on_restart(
    spark: Any, broker: BrokerProcess, tmp_path: Path, small_arrow_batches: Any
) -> None:
    source, sink = unique_name("in"), unique_name("out")
    create(broker.bootstrap, source, sink)
    produce_ids(broker.bootstrap, source, range(1000))
    checkpoint = tmp_path / "ckpt"
    (tmp_path / "armed").touch()
    wire = tripwire(tmp_path, 700, every_attempt=True)
    # one micro-batch of all 1,000 rows: its task holding row 700 fails on every attempt
    failed = query(spark, broker.bootstrap, source, sink, checkpoint, wire=wire)
    with pytest.raises(Exception, match="tripwire"):
        failed.awaitTermination(240)
    assert len(list(tmp_path.glob("tripped-*"))) == 2  # both attempts of that task
    assert committed_values(broker.bootstrap, sink) == []  # nothing of the failed batch
    (tmp_path / "armed").unlink()
    restarted = query(spark, broker.bootstrap, source, sink, checkpoint, wire=wire)
    restarted.awaitTermination(240)
    assert restarted.exception() is None
    assert ids(committed_values(broker.bootstrap, sink)) == Counter(range(1000))


def open_sink_transactions(admin: Admin, sink_id: str) -> list[Any]:
    """The sink's task transactions that are open and hold data."""
    prefix = f"replog-sink/{sink_id}/"
    return [
        t
        for t in admin.list_transactions(["Ongoing"])
        if t.transactional_id.startswith(prefix) and t.partitions
    ]


def test_sigkill_of_an_output_leader_during_a_batch(
    spark: Any, cluster_factory: Any, tmp_path: Path
) -> None:
    cluster: Cluster = cluster_factory(brokers=3)
    source, sink, sink_id = unique_name("in"), unique_name("out"), unique_name("eo")
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics(
            [
                NewTopic(source, 2, 3),
                NewTopic(sink, 3, 3, {"min.insync.replicas": "2"}),
            ]
        )
    produce_ids(cluster.bootstrap, source, range(4000))
    bootstrap = cluster.bootstrap
    q = query(spark, bootstrap, source, sink, tmp_path / "ckpt", max_offsets=200, sink_id=sink_id)
    with Admin(bootstrap_servers=bootstrap) as admin:
        # a batch is being written: a task's transaction is open on some output partition
        # (after at least one batch has committed, so the kill lands mid-stream)
        def writing() -> list[Any]:
            if admin.last_committed_batch(sink_id) < 1:
                return []
            return open_sink_transactions(admin, sink_id)

        open_txn = wait_until(writing, timeout=180, message="a sink transaction in flight")[0]
        partition = open_txn.partitions[0]
        leader = admin.describe_topic(sink).partitions[partition.partition].leader
    cluster.brokers[leader].kill()  # SIGKILL
    q.awaitTermination(300)
    assert q.exception() is None
    live = cluster.bootstrap
    assert ids(committed_values(live, sink, partitions=3)) == Counter(range(4000))


def start_driver(bootstrap: str, source: str, sink: str, checkpoint: Path, *extra: str) -> Any:
    """examples/exactly_once_pipeline.py as its own Spark driver, in its own process group
    (the Python driver, its JVM and its Python workers)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "examples" / "exactly_once_pipeline.py"),
            "--bootstrap-server",
            bootstrap,
            "--source",
            source,
            "--sink",
            sink,
            "--checkpoint",
            str(checkpoint),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )


def test_sigkill_of_the_spark_driver_mid_batch_then_restart(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    source, sink = unique_name("in"), unique_name("out")
    create(broker.bootstrap, source)
    produce_ids(broker.bootstrap, source, range(20_000))  # 20 micro-batches of 1,000 rows
    checkpoint = tmp_path / "ckpt"
    driver = start_driver(broker.bootstrap, source, sink, checkpoint)
    try:
        query_id = wait_until(
            lambda: (
                (checkpoint / "metadata").exists()
                and json.loads((checkpoint / "metadata").read_text())["id"]
            ),
            timeout=180,
            message="the query's checkpoint metadata",
        )
        with Admin(bootstrap_servers=broker.bootstrap) as admin:

            def mid_batch() -> list[Any]:
                if driver.poll() is not None:
                    raise AssertionError(f"the driver exited early: {driver.stdout.read()}")
                if admin.last_committed_batch(query_id) < 1:
                    return []
                return open_sink_transactions(admin, query_id)

            wait_until(mid_batch, timeout=180, message="a micro-batch being written")
            os.killpg(driver.pid, signal.SIGKILL)  # the driver, its JVM, its Python workers
            driver.wait(timeout=30)
            committed_before = admin.last_committed_batch(query_id)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)
        driver.stdout.close()
    # killed mid-stream: what is visible is whole committed batches, never all of the input
    before = upper_ids(committed_values(broker.bootstrap, sink, partitions=3))
    assert max(before.values(), default=1) == 1
    assert len(before) < 20_000
    restarted = start_driver(broker.bootstrap, source, sink, checkpoint, "--available-now")
    out, _ = restarted.communicate(timeout=300)
    assert restarted.returncode == 0, out
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        assert admin.last_committed_batch(query_id) > committed_before
    assert upper_ids(committed_values(broker.bootstrap, sink, partitions=3)) == Counter(
        range(20_000)
    )


def upper_ids(values: list[bytes]) -> Counter[int]:
    """The example upper-cases values: {"id": 7} -> {"ID": 7}."""
    return Counter(json.loads(v)["ID"] for v in values)
