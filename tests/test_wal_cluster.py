"""Brokers over the broker WAL (``log.wal.enable``): real broker processes.

What must hold when every partition's batches go through one write-ahead object per broker
per flush: the number of objects a broker writes follows its flushes, not its partitions;
acked records survive SIGKILL of every broker (recovery rebuilds each log from the WAL's
objects alone); compaction into packed objects and the collection of the WAL objects it
replaced lose nothing, across a restart too; on S3 the data lives in WAL objects only.
The fault harness runs a schedule over the WAL as well (tests/test_chaos.py).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from pathlib import Path

import pytest

from logstore.batch import Record, build
from logstore.journal import JOURNAL_DIR
from logstore.storage import Storage
from logstore.wal_index import WAL_PREFIX, WalIndex
from replication import protocol as p
from tests.cluster import Cluster
from tests.conftest import S3Location
from tests.helpers import unique_name, wait_until
from tests.test_metrics import scrape, value
from tests.test_replication import (
    AckedProducer,
    assert_acked_once,
    read_committed_log,
    replica_bytes_or_empty,
    wait_for_topic,
)
from tests.wire import RawConnection, broker_address, create_topic, metadata, read_records

pytestmark = [pytest.mark.cluster, pytest.mark.chaos]

WAL = {"log.wal.enable": "true"}


def wal_objects(log_dir: str, level: int = 0) -> set[str]:
    """The WAL objects of one level under a broker root (fence objects included)."""
    with Storage.from_url(log_dir, fsync=False) as root:
        return {i.path for i in root.list(f"{WAL_PREFIX}/L{level}")}


def l0_bytes(log_dir: str) -> int:
    """The bytes of every L0 WAL object under a broker root."""
    with Storage.from_url(log_dir, fsync=False) as root:
        return sum(i.size for i in root.list(f"{WAL_PREFIX}/L0"))


def leaders(bootstrap: str, topic: str) -> dict[int, list[int]]:
    """Partitions of ``topic`` by leader broker."""
    with RawConnection(bootstrap.split(",")[0]) as conn:
        (info,) = metadata(conn, [topic]).topics
    out: dict[int, list[int]] = {}
    for part in info.partitions:
        out.setdefault(part.leader_id, []).append(part.partition_index)
    return out


def produce_many(conn: RawConnection, topic: str, partitions: list[int], tag: str) -> None:
    """One acks=all produce request carrying a batch for each of ``partitions``."""
    response = conn.request(
        p.ApiKey.PRODUCE,
        p.ProduceRequest(
            acks=-1,
            timeout_ms=30_000,
            topic_data=[
                p.ProduceRequestTopic(
                    name=topic,
                    partition_data=[
                        p.ProduceRequestPartition(
                            index=i, records=build([Record(None, f"{tag}-{i}".encode(), 0)])
                        )
                        for i in partitions
                    ],
                )
            ],
        ),
    )
    codes = {r.index: r.error_code for t in response.responses for r in t.partition_responses}
    assert codes == dict.fromkeys(partitions, 0), codes


def test_objects_follow_flushes_not_partitions(cluster_factory: Callable[..., Cluster]) -> None:
    """60 partitions, RF=3, two rounds of one acks=all request per leader: the old layout
    writes at least one object per partition replica per round (120 per broker); over the
    WAL a broker writes one object per flush of its own appends and one per follower fetch
    response, whatever the number of partitions in them."""
    cluster = cluster_factory(brokers=3, overrides=WAL, metrics=True)
    topic = unique_name("wal-many")
    partitions = 60
    with RawConnection(cluster.brokers[0].bootstrap) as conn:
        create_topic(conn, topic, partitions, 3, **{"min.insync.replicas": "2"})

    def every_broker_knows_every_leader() -> bool:
        return all(
            sum(len(v) for k, v in leaders(broker.bootstrap, topic).items() if k >= 0) == partitions
            for broker in cluster.brokers.values()
        )

    wait_until(every_broker_knows_every_leader, message="every broker knows every leader")
    before = {b: wal_objects(broker.log_dir) for b, broker in cluster.brokers.items()}
    scraped = {b: scrape(broker) for b, broker in cluster.brokers.items()}
    for round_ in range(2):
        for leader, led in leaders(cluster.bootstrap, topic).items():
            with RawConnection(broker_address(cluster.bootstrap, leader)) as conn:
                produce_many(conn, topic, led, f"r{round_}")
    written = {
        b: len(wal_objects(broker.log_dir) - before[b]) for b, broker in cluster.brokers.items()
    }
    # per broker and round: its leader's flushes (1-2: the writer may take a request's first
    # partitions before the last is appended) and one per follower fetch response from each
    # of 2 other leaders (1-2 each): about 10 in all; 120 in the per-partition layout
    assert all(0 < n <= 40 for n in written.values()), written
    for b, broker in cluster.brokers.items():  # /metrics counts what the listing shows
        after = scrape(broker)
        exported = value(after, "replog_wal_objects_written_total") - value(
            scraped[b], "replog_wal_objects_written_total"
        )
        assert exported == written[b], (b, exported, written[b])
        # nothing compacted yet: the backlog is every L0 object but the chunkless fences
        backlog = value(after, "replog_wal_l0_live_bytes")
        assert 0 < backlog <= l0_bytes(broker.log_dir), (b, backlog)
        assert value(after, "replog_wal_write_failures_total") == 0
        assert value(after, "replog_log_flushes_total") >= written[b]
    for i in range(partitions):
        with RawConnection(cluster.brokers[0].bootstrap) as conn:
            leader = {
                part.partition_index: part.leader_id
                for part in metadata(conn, [topic]).topics[0].partitions
            }[i]
        with RawConnection(broker_address(cluster.bootstrap, leader)) as conn:
            values = [r.value for r in read_records(conn, topic, i)]
        assert values == [f"r0-{i}".encode(), f"r1-{i}".encode()]


@pytest.mark.parametrize("journal", [True, False], ids=["journaled", "a-file-each"])
def test_acked_records_survive_sigkill_of_every_broker(
    cluster_factory: Callable[..., Cluster], journal: bool
) -> None:
    """Acked records live only in WAL objects (nothing compacted yet); every broker is
    SIGKILLed at once and restarted: each log is rebuilt from the WAL and holds every acked
    record exactly once, and the replicas agree byte for byte below the HW. On local files
    the small WAL objects are frames in journal files (log.wal.journal.enable, the default),
    or a file each."""
    overrides = {**WAL, "log.wal.journal.enable": str(journal).lower()}
    cluster = cluster_factory(brokers=3, overrides=overrides)
    topic = unique_name("wal-kill")
    with RawConnection(cluster.brokers[0].bootstrap) as conn:
        create_topic(conn, topic, 1, 3, **{"min.insync.replicas": "2"})
    wait_for_topic(cluster, topic, 3)
    producer = AckedProducer(cluster, topic)
    producer.start()
    wait_until(lambda: len(producer.acked) >= 200, timeout=120, message="200 acked records")
    producer.halt()  # its request in flight meets the kill
    for broker in cluster.brokers.values():
        broker.kill()
    producer.stop()
    for broker in cluster.brokers.values():
        assert not any(
            i.path.endswith(".seg")
            for i in Storage.from_url(broker.log_dir, fsync=False).list(f"{topic}/0")
        ), "the test wants the acked records in WAL objects only"
        root = Path(urllib.parse.urlparse(broker.log_dir).path)
        files = list((root / WAL_PREFIX / "L0").glob("*.wal"))
        journals = list((root / JOURNAL_DIR).glob("*.jnl"))
        assert len(wal_objects(broker.log_dir)) > 50
        if journal:
            assert journals, "a broker on local files journals its small WAL objects"
            assert not files
        else:
            assert files
            assert not journals
    for broker in cluster.brokers.values():
        broker.start()
    wait_for_topic(cluster, topic, 3)
    producer.send_acked()  # the restarted cluster takes writes again
    log = read_committed_log(cluster.bootstrap, topic)
    assert_acked_once(producer.acked, log)
    end = len(log)

    def identical() -> bool:
        found = {replica_bytes_or_empty(cluster, b, topic, end) for b in cluster.brokers}
        return len(found) == 1 and b"" not in found

    wait_until(identical, timeout=60, message="replicas byte-identical below the HW")


def test_compaction_replaces_wal_objects_and_loses_nothing(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """With a short L0 age the brokers compact their WAL objects into packed L1 objects and
    delete the L0 objects (file.delete.delay.ms=0, garbage collected every second by the
    maintenance round); reads, and reads after a restart, return every acked record once."""
    cluster = cluster_factory(
        brokers=3,
        overrides={
            **WAL,
            "wal.compaction.l0.max.age.ms": "500",
            "file.delete.delay.ms": "0",
            "log.retention.check.interval.ms": "1000",
            # the test's records carry tiny timestamps: 7 days of retention would drop them
            "retention.ms": "-1",
        },
    )
    topic = unique_name("wal-compact")
    with RawConnection(cluster.brokers[0].bootstrap) as conn:
        create_topic(conn, topic, 1, 3, **{"min.insync.replicas": "2"})
    wait_for_topic(cluster, topic, 3)
    producer = AckedProducer(cluster, topic)
    for _ in range(50):
        producer.send_acked()

    def compacted(log_dir: str) -> bool:
        with Storage.from_url(log_dir, fsync=False) as root:
            index = WalIndex.load(root, delete_temp_files=False)
        levels = {o.name.level for o in index.objects() if o.index.chunks}
        return levels == {1}

    for broker in cluster.brokers.values():
        wait_until(
            lambda b=broker: compacted(b.log_dir),
            timeout=60,
            message=f"broker {broker.broker_id}: every chunk in L1 objects, no L0 data object",
        )
    assert_acked_once(producer.acked, read_committed_log(cluster.bootstrap, topic))
    for broker in cluster.brokers.values():
        broker.kill()
    for broker in cluster.brokers.values():
        broker.start()
    wait_for_topic(cluster, topic, 3)
    producer.send_acked()
    assert_acked_once(producer.acked, read_committed_log(cluster.bootstrap, topic))


def test_the_bytes_trigger_starts_a_round_without_waiting_for_the_age(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """A broker compacts as soon as its live L0 bytes reach the window (and its phase of a
    window more): the object written that brings them there wakes the compaction loop, which
    otherwise sleeps until the oldest object's age (an hour here) and never polls. Each
    broker's /metrics backlog stays under the trigger afterwards."""
    window = 8 * 1024
    cluster = cluster_factory(
        brokers=3,
        overrides={
            **WAL,
            "wal.compaction.window.bytes": str(window),
            "wal.compaction.l0.max.age.ms": "3600000",
        },
        metrics=True,
    )
    topic = unique_name("wal-bytes")
    with RawConnection(cluster.brokers[0].bootstrap) as conn:
        create_topic(conn, topic, 1, 3, **{"min.insync.replicas": "2"})
    wait_for_topic(cluster, topic, 3)
    producer = AckedProducer(cluster, topic)
    for _ in range(120):  # an L0 object of a few hundred bytes each: several windows
        producer.send_acked()
    for broker in cluster.brokers.values():
        wait_until(
            lambda b=broker: wal_objects(b.log_dir, level=1),
            timeout=60,
            message=f"broker {broker.broker_id}: a packed object, long before the L0 age",
        )
        assert value(scrape(broker), "replog_wal_l0_live_bytes") < 2 * window
    assert_acked_once(producer.acked, read_committed_log(cluster.bootstrap, topic))


@pytest.mark.s3
def test_broker_on_s3_writes_wal_objects(
    cluster_factory: Callable[..., Cluster], s3_url: S3Location
) -> None:
    """On S3 the log's batches are in WAL objects under ``_replog/wal/``; no segment object
    per partition per flush."""
    cluster = cluster_factory(
        brokers=2,
        broker_log_dirs={0: s3_url.sub("broker-0")},
        overrides={**WAL, "storage.endpoint.url": s3_url.endpoint_url},
    )
    topic = unique_name("wal-s3")
    with RawConnection(cluster.brokers[0].bootstrap) as conn:
        create_topic(conn, topic, 1, 2, **{"min.insync.replicas": "2"})
    wait_for_topic(cluster, topic, 2)
    producer = AckedProducer(cluster, topic)
    for _ in range(20):
        producer.send_acked()
    assert_acked_once(producer.acked, read_committed_log(cluster.bootstrap, topic))
    storage = Storage.from_url(s3_url.sub("broker-0"), **s3_url.storage_options)
    assert any(i.path.endswith(".wal") for i in storage.list(f"{WAL_PREFIX}/L0"))
    assert not any(i.path.endswith(".seg") for i in storage.list(f"{topic}/0"))


def test_a_log_dir_written_through_the_wal_refuses_a_broker_without_it(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """Turning the WAL off for a log dir written through it would serve logs without their
    WAL-resident tails: the broker refuses to start and names the key."""
    cluster = cluster_factory(brokers=1, overrides=WAL)
    topic = unique_name("wal-off")
    with RawConnection(cluster.brokers[0].bootstrap) as conn:
        create_topic(conn, topic, 1, 1)
    wait_for_topic(cluster, topic, 1)
    AckedProducer(cluster, topic).send_acked()
    broker = cluster.brokers[0]
    broker.stop()
    broker.overrides["log.wal.enable"] = "false"
    with pytest.raises(RuntimeError, match=r"start this broker with log\.wal\.enable=true"):
        broker.start()
