"""Replication with real broker processes and real faults (SIGKILL, SIGSTOP, restarts)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from logstore.batch import Record, build, iter_batches
from logstore.log import open_replica_log
from logstore.storage import Storage
from replication.metadata.delta import decode_version
from replication.metadata.store import ControllerClaim, MetadataStore
from tests.cluster import Cluster
from tests.conftest import S3Location
from tests.helpers import unique_name, wait_until
from tests.wire import (
    RawConnection,
    broker_address,
    create_topic,
    fetch,
    metadata,
    partition_state,
    produce,
    read_records,
)

pytestmark = [pytest.mark.cluster, pytest.mark.chaos]


class AckedProducer:
    """Sends one unique record per request with acks=all to the current leader; records what
    was acked, at which offset. A failed send is never retried with the same value, so every
    acked value must appear exactly once, at its acked offset."""

    def __init__(self, cluster: Cluster, topic: str, name: str = "") -> None:
        self.cluster = cluster
        self.topic = topic
        self.name = name or topic
        self.acked: dict[int, bytes] = {}
        self.errors: list[int] = []
        self._n = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def send_one(self) -> bool:
        self._n += 1
        value = f"{self.name}-{self._n}".encode()
        try:
            leader = partition_state(self.cluster.bootstrap, self.topic).leader_id
            if leader < 0:
                return False
            with RawConnection(broker_address(self.cluster.bootstrap, leader), timeout=20) as conn:
                resp = produce(conn, self.topic, 0, build([Record(None, value, self._n)]), acks=-1)
        except (OSError, ConnectionError):
            return False
        part = resp.responses[0].partition_responses[0]
        if part.error_code:
            self.errors.append(part.error_code)
            return False
        self.acked[part.base_offset] = value
        return True

    def send_acked(self, timeout: float = 60) -> None:
        """Send records (each value once) until one is acked; metadata may trail a failover."""
        wait_until(self.send_one, timeout=timeout, message="an acked produce")

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                self.send_one()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def halt(self) -> None:
        """Send no more after the request in flight (which may still be acked)."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(60)


def read_committed_log(bootstrap: str, topic: str) -> list[tuple[int, bytes | None]]:
    """Everything below the HW, through the current leader."""
    state = partition_state(bootstrap, topic)
    with RawConnection(broker_address(bootstrap, state.leader_id)) as conn:
        return [(r.offset, r.value) for r in read_records(conn, topic)]


def replica_bytes(cluster: Cluster, broker_id: int, topic: str, end: int) -> bytes:
    """The bytes of a replica's log below ``end``, read from its own storage."""
    log = open_replica_log(
        Storage.from_url(cluster.brokers[broker_id].log_dir), topic, 0, read_only=True
    )
    out = b""
    offset = log.log_start_offset
    while offset < end:
        chunk = log.read(offset, 1 << 20, max_offset=end)
        batches = list(iter_batches(chunk))
        assert batches, f"replica {broker_id} ends before {end}"
        out += chunk
        offset = batches[-1].next_offset
    return out


def produce_to_leader(cluster: Cluster, topic: str, records: bytes, acks: int = -1) -> int:
    """Produce to whoever leads now, following leadership as metadata catches up."""

    def attempt() -> int | None:
        try:
            leader = partition_state(cluster.bootstrap, topic).leader_id
            with RawConnection(broker_address(cluster.bootstrap, leader), timeout=20) as conn:
                part = (
                    produce(conn, topic, 0, records, acks=acks).responses[0].partition_responses[0]
                )
        except (OSError, ConnectionError):
            return None
        return part.base_offset + 1 if part.error_code == 0 else None

    return wait_until(attempt, message="a produce the current leader accepts") - 1


def wait_for_topic(cluster: Cluster, topic: str, isr: int) -> None:
    """Until every live broker's metadata shows the topic with an ISR of ``isr`` replicas and
    its leader serves it: a broker opens its replicas in the background, and answers
    NOT_LEADER_OR_FOLLOWER ("still opening") until it has read its replica from storage."""

    def ready() -> bool:
        for broker in cluster.brokers.values():
            if not broker.alive:
                continue
            try:
                if len(partition_state(broker.bootstrap, topic).isr_nodes) != isr:
                    return False
            except ConnectionError:
                return False
        try:
            leader = partition_state(cluster.bootstrap, topic).leader_id
            if leader < 0:
                return False
            with RawConnection(broker_address(cluster.bootstrap, leader), timeout=5) as conn:
                [t] = fetch(conn, topic, 0, 0).responses
        except (OSError, ConnectionError):
            return False
        return bool(t.partitions[0].error_code == 0)

    wait_until(ready, message=f"{topic} known everywhere with an ISR of {isr}")


def assert_acked_once(acked: dict[int, bytes], log: list[tuple[int, bytes | None]]) -> None:
    by_offset = dict(log)
    for offset, value in acked.items():
        assert by_offset.get(offset) == value, f"acked record lost or moved at offset {offset}"
    values = [v for _, v in log]
    assert len(values) == len(set(values)), "a record appears twice"
    assert [o for o, _ in log] == list(range(len(log))), "offsets are not contiguous"


def test_leader_sigkill_under_acks_all_loses_nothing(
    cluster_factory: Callable[..., Cluster],
) -> None:
    cluster = cluster_factory(brokers=3)
    topic = unique_name("r")
    with RawConnection(cluster.brokers[0].bootstrap) as conn:
        assert (
            create_topic(conn, topic, 1, 3, **{"min.insync.replicas": "2"}).topics[0].error_code
            == 0
        )
    wait_for_topic(cluster, topic, 3)
    producer = AckedProducer(cluster, topic)
    producer.start()
    wait_until(lambda: len(producer.acked) >= 50, message="50 acked records")
    old = partition_state(cluster.bootstrap, topic)
    cluster.brokers[old.leader_id].kill()
    acked_before = len(producer.acked)
    wait_until(
        lambda: partition_state(cluster.bootstrap, topic).leader_id not in (-1, old.leader_id),
        message="a new leader",
    )
    wait_until(lambda: len(producer.acked) >= acked_before + 50, message="producing again")
    producer.stop()
    new = partition_state(cluster.bootstrap, topic)
    assert new.leader_epoch > old.leader_epoch
    assert new.leader_id in old.isr_nodes
    assert_acked_once(producer.acked, read_committed_log(cluster.bootstrap, topic))


def test_leader_crash_restart_while_a_follower_is_paused_loses_nothing(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """The restarted-leader race: the leader is SIGKILLed and restarted at once while a follower is
    paused for less than a session. The followers had fetched the leader's unflushed tail; the
    restarted leader must not lead again at its old epoch with a shorter log."""
    # a long group-commit interval: the leader's unflushed tail, already fetched by the
    # followers, is a few hundred milliseconds of records when it dies
    cluster = cluster_factory(
        brokers=3,
        overrides={"log.flush.interval.ms": "200", "broker.session.timeout.ms": "4000"},
    )
    topic = unique_name("r")
    with RawConnection(cluster.brokers[0].bootstrap) as conn:
        create_topic(conn, topic, 1, 3, **{"min.insync.replicas": "2"})
    wait_for_topic(cluster, topic, 3)
    old = partition_state(cluster.bootstrap, topic)
    # the follower that would be elected next (first in assignment order) is the paused one
    paused = next(r for r in old.replica_nodes if r != old.leader_id)
    producers = [AckedProducer(cluster, topic, f"p{i}") for i in range(3)]
    for producer in producers:
        producer.start()

    def acked() -> int:
        return sum(len(p.acked) for p in producers)

    wait_until(lambda: acked() >= 30, message="30 acked records")
    cluster.brokers[paused].pause()
    resume = threading.Timer(3, cluster.brokers[paused].resume)  # shorter than the session
    resume.start()
    try:
        cluster.brokers[old.leader_id].kill()
        cluster.brokers[old.leader_id].start()
    finally:
        resume.join()
        cluster.brokers[paused].resume()
    before = acked()
    wait_until(lambda: acked() >= before + 30, timeout=60, message="producing again")
    for producer in producers:
        producer.stop()
    new = partition_state(cluster.bootstrap, topic)
    assert new.leader_epoch > old.leader_epoch
    wait_for_topic(cluster, topic, 3)
    log = read_committed_log(cluster.bootstrap, topic)
    all_acked = {o: v for p in producers for o, v in p.acked.items()}
    assert len(all_acked) == acked(), "two acks for one offset"
    assert_acked_once(all_acked, log)
    end = len(log)
    reference = replica_bytes(cluster, new.leader_id, topic, end)
    for broker_id in old.replica_nodes:
        wait_until(
            lambda b=broker_id: replica_bytes_or_empty(cluster, b, topic, end) == reference,
            message=f"replica {broker_id} byte-identical below the HW",
        )


def test_sigterm_finishes_while_followers_long_poll(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """Followers parked in a long-poll fetch (here up to a minute) still shut down at once on
    SIGTERM: exit status 0 means the graceful shutdown finished within shutdown.timeout.ms
    (a broker that overruns it exits with status 1)."""
    cluster = cluster_factory(
        brokers=3,
        overrides={"replica.fetch.wait.max.ms": "60000", "shutdown.timeout.ms": "10000"},
    )
    topic = unique_name("r")
    with RawConnection(cluster.brokers[0].bootstrap) as conn:
        create_topic(conn, topic, 3, 3)
    wait_for_topic(cluster, topic, 3)
    producer = AckedProducer(cluster, topic)
    for _ in range(5):
        producer.send_acked()
    for broker in cluster.brokers.values():
        assert broker.stop(timeout=60) == 0, broker.stderr_tail()
    assert cluster.controller.stop(timeout=60) == 0, cluster.controller.stderr_tail()


def test_follower_sigkill_leaves_isr_and_rejoins(cluster_factory: Callable[..., Cluster]) -> None:
    cluster = cluster_factory(brokers=3)
    topic = unique_name("r")
    with RawConnection(cluster.brokers[0].bootstrap) as conn:
        create_topic(conn, topic, 1, 3, **{"min.insync.replicas": "2"})
    wait_for_topic(cluster, topic, 3)
    state = partition_state(cluster.bootstrap, topic)
    follower = next(r for r in state.replica_nodes if r != state.leader_id)
    producer = AckedProducer(cluster, topic)
    producer.start()
    wait_until(lambda: len(producer.acked) >= 20)
    cluster.brokers[follower].kill()
    wait_until(
        lambda: follower not in partition_state(cluster.bootstrap, topic).isr_nodes,
        message="the dead follower leaves the ISR",
    )
    acked = len(producer.acked)
    wait_until(lambda: len(producer.acked) >= acked + 20, message="produce continues")
    cluster.brokers[follower].start()
    wait_until(
        lambda: follower in partition_state(cluster.bootstrap, topic).isr_nodes,
        timeout=60,
        message="the follower catches up and rejoins the ISR",
    )
    producer.stop()
    log = read_committed_log(cluster.bootstrap, topic)
    assert_acked_once(producer.acked, log)
    end = len(log)
    leader_bytes = replica_bytes(cluster, state.leader_id, topic, end)
    wait_until(
        lambda: len(replica_bytes_or_empty(cluster, follower, topic, end)) == len(leader_bytes)
    )
    assert replica_bytes(cluster, follower, topic, end) == leader_bytes


def replica_bytes_or_empty(cluster: Cluster, broker_id: int, topic: str, end: int) -> bytes:
    try:
        return replica_bytes(cluster, broker_id, topic, end)
    except AssertionError:
        return b""


def test_kip101_divergence_is_truncated_by_leader_epoch(
    cluster_factory: Callable[..., Cluster],
) -> None:
    cluster = cluster_factory(brokers=3)
    topic = unique_name("r")
    with RawConnection(cluster.brokers[0].bootstrap) as conn:
        create_topic(conn, topic, 1, 3)
    wait_for_topic(cluster, topic, 3)
    state = partition_state(cluster.bootstrap, topic)
    old_leader = state.leader_id
    followers = [r for r in state.replica_nodes if r != old_leader]
    with RawConnection(cluster.brokers[old_leader].bootstrap) as conn:
        for i in range(5):
            assert (
                produce(conn, topic, 0, build([Record(None, b"shared-%d" % i, i)]))
                .responses[0]
                .partition_responses[0]
                .error_code
                == 0
            )
        # the followers stop fetching; the leader appends batches they never see, then dies
        for f in followers:
            cluster.brokers[f].pause()
        try:
            for i in range(3):
                produce(conn, topic, 0, build([Record(None, b"lost-%d" % i, i)]), acks=1)
            wait_until(
                lambda: _durable_end(cluster, old_leader, topic) >= 8,
                message="the old leader flushed its divergent tail",
            )
        finally:
            cluster.brokers[old_leader].kill()
            for f in followers:
                cluster.brokers[f].resume()
    wait_until(
        lambda: partition_state(cluster.bootstrap, topic).leader_id in followers,
        message="a follower leads",
    )
    for i in range(4):
        produce_to_leader(cluster, topic, build([Record(None, b"new-%d" % i, i)]))
    new_leader = partition_state(cluster.bootstrap, topic).leader_id
    cluster.brokers[old_leader].start()
    wait_until(
        lambda: old_leader in partition_state(cluster.bootstrap, topic).isr_nodes,
        timeout=60,
        message="the old leader truncates, catches up and rejoins",
    )
    log = read_committed_log(cluster.bootstrap, topic)
    values = [v for _, v in log]
    shared = [b"shared-%d" % i for i in range(5)]
    new = [b"new-%d" % i for i in range(4)]
    # A follower's long poll parked on the old leader may have carried the first divergent
    # batch before the pause took hold; the batches after it were never fetched by anyone.
    middle = values[len(shared) : len(values) - len(new)]
    assert values[: len(shared)] == shared
    assert values[len(values) - len(new) :] == new
    assert middle in ([], [b"lost-0"]), f"unfetched divergent batches survived: {middle}"
    end = len(log)
    reference = replica_bytes(cluster, new_leader, topic, end)
    for broker_id in state.replica_nodes:
        wait_until(
            lambda b=broker_id: replica_bytes_or_empty(cluster, b, topic, end) == reference,
            message=f"replica {broker_id} byte-identical up to the HW",
        )


def _durable_end(cluster: Cluster, broker_id: int, topic: str) -> int:
    log = open_replica_log(
        Storage.from_url(cluster.brokers[broker_id].log_dir), topic, 0, read_only=True
    )
    return log.durable_end_offset


def test_controller_sigkill_standby_takes_over_and_stale_one_cannot_write(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """The controller is paused past its session: a standby (every broker is one) takes over,
    and the old controller, resumed, must not write metadata.

    What the design allows on storage (replication/metadata/store.py): a deposed controller's
    PUT may land *below* its successor's first version (the claim check after the PUT tells
    it that it is stale; the successor builds on whatever version was newest). Nothing else:
    in version order the controller epochs never go back, and no reader takes a deposed
    controller's version. Under load more than one failover may happen (a standby that
    stalls past its session is deposed in turn), so no epoch number is assumed.
    """
    cluster = cluster_factory(brokers=3)
    root = Path(cluster.data_dir / "metadata")
    store = MetadataStore(Storage.from_url(root.as_uri()))

    def claims() -> list[ControllerClaim]:
        return [
            ControllerClaim.from_bytes(f.read_bytes())
            for f in sorted((root / "controller").glob("*.json"))
        ]

    assert [c.epoch for c in claims()] == [1]
    cluster.controller.pause()  # a controller paused past its session: deposed, not dead
    wait_until(lambda: len(claims()) >= 2, message="a standby claims epoch 2")
    # the cluster works under the new controller
    topic = unique_name("r")
    with RawConnection(cluster.brokers[0].bootstrap) as conn:
        wait_until(
            lambda: create_topic(conn, topic, 1, 3).topics[0].error_code == 0,
            message="topic created under the new controller",
        )
    cluster.controller.resume()
    # the old controller wakes up believing it is active; it must not write metadata
    wait_until(
        lambda: (
            "steps down" in cluster.controller.stderr_tail(200)
            or "superseded" in cluster.controller.stderr_tail(200)
        ),
        message="the stale controller notices it was deposed",
    )

    def newest_claim() -> ControllerClaim:
        claim = store.latest_claim()
        assert claim is not None
        return claim

    # the head every reader takes is the newest claimant's own version, never a deposed one's
    def head_is_the_newest_controllers() -> bool:
        head, claim = store.read_latest(), newest_claim()
        return (head.controller_epoch, head.controller_id) == (claim.epoch, claim.controller_id)

    wait_until(head_is_the_newest_controllers, message="the newest controller's version is head")

    def brokers_follow_the_new_controller() -> bool:
        for broker in cluster.brokers.values():
            with RawConnection(broker.bootstrap) as conn:
                if metadata(conn, []).controller_id != newest_claim().controller_id:
                    return False
        return True

    wait_until(brokers_follow_the_new_controller, message="brokers take the new controller's")

    versions = sorted((root / "metadata").glob("*.json"))
    # the version and controller epoch of each (a full image or a delta)
    images = [decode_version(v.read_bytes()) for v in versions]
    assert images[0].controller_epoch == 1
    for before, after in itertools.pairwise(images):
        assert after.controller_epoch >= before.controller_epoch, (
            f"metadata version {after.version} of a deposed controller (epoch "
            f"{after.controller_epoch}) was written after version {before.version} of its "
            f"successor (epoch {before.controller_epoch})"
        )
    assert partition_state(cluster.bootstrap, topic).leader_id >= 0


def test_leader_paused_past_its_session_is_fenced(cluster_factory: Callable[..., Cluster]) -> None:
    cluster = cluster_factory(brokers=3)
    topic = unique_name("r")
    with RawConnection(cluster.brokers[0].bootstrap) as conn:
        create_topic(conn, topic, 1, 3, **{"min.insync.replicas": "2"})
    wait_for_topic(cluster, topic, 3)
    old = partition_state(cluster.bootstrap, topic)
    producer = AckedProducer(cluster, topic)
    for _ in range(10):
        producer.send_acked()
    stale = cluster.brokers[old.leader_id]
    with RawConnection(stale.bootstrap, timeout=60) as conn:
        stale.pause()
        try:
            wait_until(
                lambda: (
                    partition_state(cluster.bootstrap, topic).leader_id not in (-1, old.leader_id)
                ),
                message="a new leader while the old one is paused",
            )
            for _ in range(10):
                producer.send_acked()
        finally:
            stale.resume()
        # the resumed old leader may still think it leads: its acks=all produce must not succeed
        resp = produce(conn, topic, 0, build([Record(None, b"from-the-past", 0)]), acks=-1)
    assert resp.responses[0].partition_responses[0].error_code != 0
    wait_until(
        lambda: old.leader_id in partition_state(cluster.bootstrap, topic).isr_nodes,
        timeout=60,
        message="the old leader rejoins as a follower",
    )
    log = read_committed_log(cluster.bootstrap, topic)
    assert b"from-the-past" not in [v for _, v in log]
    assert_acked_once(producer.acked, log)


@pytest.mark.s3
def test_broker_on_s3(cluster_factory: Callable[..., Cluster], s3_url: S3Location) -> None:
    cluster = cluster_factory(
        brokers=2,
        broker_log_dirs={0: s3_url.sub("broker-0")},
        # the per-partition layout on S3 (log.wal.enable=false stays available); over the WAL:
        # test_wal_cluster::test_broker_on_s3_writes_wal_objects
        overrides={"storage.endpoint.url": s3_url.endpoint_url, "log.wal.enable": "false"},
    )
    topic = unique_name("r")
    with RawConnection(cluster.brokers[0].bootstrap) as conn:
        create_topic(conn, topic, 1, 2, **{"min.insync.replicas": "2"})
    wait_for_topic(cluster, topic, 2)
    producer = AckedProducer(cluster, topic)
    for _ in range(20):
        producer.send_acked()
    assert_acked_once(producer.acked, read_committed_log(cluster.bootstrap, topic))
    storage = Storage.from_url(s3_url.sub("broker-0"), **s3_url.storage_options)
    assert any(i.path.endswith(".seg") for i in storage.list(f"{topic}/0"))
