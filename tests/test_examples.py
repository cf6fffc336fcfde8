"""Every example runs as `python examples/NAME.py` against a cluster from `replog cluster up`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from replication.client import Admin, NewTopic, Producer, TopicPartition
from replication.tools import local_cluster
from tests import maven
from tests.readback import read_to_end

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("examples-cluster")
    nodes = local_cluster.cluster_up(str(data), 3, 0, conf_dir=ROOT / "conf")
    try:
        yield ",".join(n.address for n in nodes if n.role == "broker")
    finally:
        local_cluster.cluster_down(str(data))


def run_example(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def quickstart(bootstrap: str) -> subprocess.CompletedProcess[str]:
    """``examples/quickstart.py`` run once (it writes 1,000 records to the topic quickstart
    and reads them back with Spark); the other examples read that topic. Each run of an
    example starts a Spark JVM, so one run instead of four saves about a minute."""
    result = run_example("quickstart", "--bootstrap-server", bootstrap)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def committed_count(bootstrap: str, topic: str) -> int:
    tps = [TopicPartition(topic, p) for p in range(3)]
    return len(read_to_end(bootstrap, tps, timeout=120).records)


def test_quickstart_then_streaming_read(
    bootstrap: str, quickstart: subprocess.CompletedProcess[str]
) -> None:
    assert "Spark read 1000 records from quickstart" in quickstart.stdout
    result = run_example("streaming_read", "--bootstrap-server", bootstrap, "--available-now")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "total 1000" in result.stdout


def test_exactly_once_pipeline_restarts_from_its_checkpoint(
    bootstrap: str, quickstart: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    args = (
        "--bootstrap-server",
        bootstrap,
        "--source",
        "quickstart",
        "--sink",
        "eo-out",
        "--checkpoint",
        str(tmp_path / "ckpt"),
        "--available-now",
    )
    for _ in range(2):  # the second run restarts from the checkpoint: nothing is written twice
        result = run_example("exactly_once_pipeline", *args)
        assert result.returncode == 0, result.stdout + result.stderr
        assert committed_count(bootstrap, "eo-out") == 1000


def test_to_parquet(
    bootstrap: str, quickstart: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    result = run_example(
        "to_parquet",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        "quickstart",
        "--path",
        str(tmp_path / "parquet"),
        "--available-now",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1000 records in Parquet" in result.stdout


def produce(bootstrap: str, topic: str, first: int, n: int) -> None:
    with Admin(bootstrap_servers=bootstrap) as admin:
        if topic not in admin.list_topics():
            admin.create_topics([NewTopic(topic, 3, 1)])
    with Producer(bootstrap_servers=bootstrap, acks="all") as producer:
        futures = [producer.send(topic, f"delta {i}".encode()) for i in range(first, first + n)]
        for future in futures:
            future.result(timeout=60)


def delta_rows(path: Path) -> list[tuple[int, int, str]]:
    """The table's (partition, offset, value) rows, read without Spark: the Parquet files its
    log's add actions name, less those a remove action took out."""
    files: set[str] = set()
    for entry in sorted((path / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                files.add(action["add"]["path"])
            if "remove" in action:
                files.discard(action["remove"]["path"])
    rows: list[tuple[int, int, str]] = []
    for name in files:
        table = pq.read_table(path / name)
        rows += zip(
            *(table.column(c).to_pylist() for c in ("partition", "offset", "value")), strict=True
        )
    return rows


def test_delta_sink_writes_each_record_once_across_a_replay_and_a_restart(
    bootstrap: str, tmp_path: Path
) -> None:
    # README's test command installs mvn: a failure to fetch the jars fails the test, naming why
    jars = ",".join(str(p) for p in maven.spark_jars("delta"))
    topic, path = "delta-in", tmp_path / "delta"
    args = ("--bootstrap-server", bootstrap, "--topic", topic, "--path", str(path))
    produce(bootstrap, topic, 0, 600)
    result = run_example("delta_sink", *args, "--available-now", "--jars", jars)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "600 records in" in result.stdout
    assert "(600 distinct offsets)" in result.stdout
    assert sorted(v for *_, v in delta_rows(path)) == sorted(f"delta {i}" for i in range(600))

    # a crash after Delta committed a batch but before Spark did: Spark replays the batch with
    # its txnVersion, which Delta has already committed for this txnAppId, so it skips it
    commits = path.parent / "delta-checkpoint" / "commits"
    last = max(commits.glob("[0-9]*"), key=lambda p: int(p.name))
    last.unlink()
    (commits / f".{last.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum beside it
    txns = [
        json.loads(line)["txn"]
        for entry in (path / "_delta_log").glob("*.json")
        for line in entry.read_text().splitlines()
        if "txn" in json.loads(line)
    ]
    assert {t["appId"] for t in txns} == {"replog-delta-example"}
    assert max(t["version"] for t in txns) == int(last.name)

    produce(bootstrap, topic, 600, 400)  # and new records for the restarted query
    result = run_example("delta_sink", *args, "--available-now", "--jars", jars)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1000 records in" in result.stdout
    assert "(1000 distinct offsets)" in result.stdout
    rows = delta_rows(path)
    assert len({(p, o) for p, o, _ in rows}) == len(rows) == 1000
    assert sorted(v for *_, v in rows) == sorted(f"delta {i}" for i in range(1000))


def test_delta_sink_says_what_is_missing(bootstrap: str, tmp_path: Path) -> None:
    result = run_example(
        "delta_sink",
        "--bootstrap-server",
        bootstrap,
        "--path",
        str(tmp_path / "d"),
        "--available-now",
    )
    assert result.returncode == 2, result.stdout + result.stderr
    reason = result.stderr.strip().splitlines()[-1]
    assert reason.startswith("Delta is not available: Delta's JVM jars are not on"), result.stderr
