"""`replog records delete` (as kafka-delete-records.sh) and Admin.delete_records behind it, on
real brokers: the log start offset moves on every replica, records before it are gone for
consumers, and bad input is one line on stderr with exit status 1."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from replication.client import Admin, NewTopic, Producer, TopicPartition
from replication.errors import OffsetOutOfRangeError, UnknownTopicOrPartitionError
from tests.cluster import Cluster
from tests.helpers import unique_name, wait_until
from tests.readback import read_count

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("records-cli"), brokers=2).start()
    yield c
    c.stop()


def replog_records(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "replication.tools.cli",
            "records",
            "delete",
            *args,
            "--bootstrap-server",
            cluster.bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def topic_with_records(cluster: Cluster, partitions: int, records: int) -> str:
    topic = unique_name("rec")
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, partitions, 2)])
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        for i in range(records):
            producer.send(topic, value=b"v%d" % i, partition=i % partitions)
        producer.flush()
    return topic


def log_starts(admin: Admin, tp: TopicPartition) -> list[int]:
    """The log start offset of ``tp`` on each replica."""
    logs = admin.describe_log_dirs([tp])
    return sorted(r[tp].log_start_offset for r in logs.values() if not isinstance(r, Exception))


def test_records_delete_moves_the_log_start_offset(cluster: Cluster, tmp_path: Path) -> None:
    topic = topic_with_records(cluster, 2, 20)  # 10 records in each partition
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    done = replog_records(cluster, "--topic", topic, "--partition", "0", "--offset", "4")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "Records delete operation completed:",
        f"partition: {topic}-0\tlow_watermark: 4",
    ]
    offsets = tmp_path / "offsets.json"
    offsets.write_text(
        json.dumps(
            {
                "partitions": [
                    {"topic": topic, "partition": 0, "offset": 7},
                    {"topic": topic, "partition": 1, "offset": -1},  # its high watermark
                ],
                "version": 1,
            }
        )
    )
    done = replog_records(cluster, "--offset-json-file", str(offsets))
    assert done.returncode == 0, done.stderr
    assert f"partition: {topic}-0\tlow_watermark: 7" in done.stdout
    assert f"partition: {topic}-1\tlow_watermark: 10" in done.stdout
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        assert admin.list_offsets({tp0: "earliest", tp1: "earliest"}) == {tp0: 7, tp1: 10}
        # followers follow the leader's log start offset in their fetches
        wait_until(lambda: log_starts(admin, tp0) == [7, 7], message="both replicas start at 7")
    # the records left in partition 0
    assert [r.offset for r in read_count(cluster.bootstrap, [tp0], 3)] == [7, 8, 9]


def test_records_delete_refuses_bad_input_in_one_line(cluster: Cluster, tmp_path: Path) -> None:
    topic = topic_with_records(cluster, 1, 5)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"partitions": [{"topic": "x"}]}')
    cases = [
        (
            ["--topic", topic, "--partition", "0", "--offset", "99"],
            f"cannot delete records of {topic}-0 before offset 99: the offset must be between",
        ),
        (["--offset-json-file", str(tmp_path / "none.json")], "no such file"),
        (["--offset-json-file", str(bad_json)], "needs a topic (string), a partition and an"),
        (["--topic", topic], "--offset-json-file FILE, or --topic T --partition P --offset O"),
    ]
    for args, message in cases:
        failed = replog_records(cluster, *args)
        assert failed.returncode == 1, failed.stdout
        assert failed.stderr.count("\n") == 1, failed.stderr
        assert message in " ".join(failed.stderr.split()), failed.stderr
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        tp = TopicPartition(topic, 0)
        with pytest.raises(OffsetOutOfRangeError):
            admin.delete_records({tp: 6})
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.delete_records({TopicPartition(unique_name("none"), 0): 1}, timeout_ms=3000)
        assert admin.list_offsets({tp: "earliest"}) == {tp: 0}
