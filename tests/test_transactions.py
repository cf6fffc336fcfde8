"""Idempotence and transactions end to end: the client library against real broker processes.

Faults are real: a TCP proxy that loses a produce response, SIGKILL of a partition leader and
of the transaction coordinator, SIGSTOP of a data partition's leader. Tests that break their
cluster get their own; the others share one three-broker cluster (unique topics and
transactional ids per test).
"""

from __future__ import annotations

import json
import logging
import pickle
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from logstore.batch import iter_batches
from replication import protocol as p
from replication.client import (
    Admin,
    Consumer,
    Producer,
    ProducerConfig,
    SinkCommitResult,
    TopicPartition,
    TransactionAbortedError,
    TransactionHandle,
    TransactionStateError,
)
from replication.client.config import load
from replication.coordinator.transaction import TRANSACTION_TOPIC
from replication.errors import (
    CommitFailedError,
    CommitStateUnknownError,
    ConfigError,
    ProducerFencedError,
    UnknownTopicOrPartitionError,
)
from tests.cluster import BrokerProcess, Cluster
from tests.helpers import free_port, unique_name, wait_until
from tests.proxy import TcpProxy
from tests.readback import read_to_end
from tests.wire import RawConnection, metadata

pytestmark = [pytest.mark.timeout(180)]


FAST = {
    "linger_ms": 2,
    "retry_backoff_ms": 20,
    "retry_backoff_max_ms": 200,
    "request_timeout_ms": 10_000,
    "delivery_timeout_ms": 90_000,
    "max_block_ms": 60_000,
}


def producer(bootstrap: str, **kwargs: Any) -> Producer:
    return Producer({"bootstrap_servers": bootstrap, **FAST, **kwargs})


def txn_producer(bootstrap: str, transactional_id: str, **kwargs: Any) -> Producer:
    prod = producer(bootstrap, transactional_id=transactional_id, **kwargs)
    prod.init_transactions()
    return prod


def read_all(
    bootstrap: str, tps: list[TopicPartition], isolation: str = "read_committed"
) -> dict[TopicPartition, list[bytes]]:
    """Every record value below the end (LSO with read_committed, else HW) of each partition."""
    out: dict[TopicPartition, list[bytes]] = {tp: [] for tp in tps}
    for record in read_to_end(bootstrap, tps, isolation_level=isolation).records:
        out[TopicPartition(record.topic, record.partition)].append(record.value or b"")
    return out


def end_offsets(bootstrap: str, tps: list[TopicPartition], isolation: str) -> dict[Any, int]:
    with Consumer(bootstrap_servers=bootstrap, isolation_level=isolation) as consumer:
        return consumer.end_offsets(tps)


def all_brokers_known(cluster: Cluster) -> None:
    """Until every broker's metadata lists every broker: the first FindCoordinator creates
    __transaction_state with min(3, live brokers) replicas, as the answering broker sees them."""

    def known() -> bool:
        for broker in cluster.brokers.values():
            with RawConnection(broker.bootstrap) as conn:
                if len(metadata(conn, []).brokers) < len(cluster.brokers):
                    return False
        return True

    wait_until(known, message="every broker knows every broker")


def leaders_of(admin: Admin, topic: str) -> dict[int, int]:
    """partition -> leader, once a broker's metadata has the new topic with every leader."""

    def known() -> dict[int, int] | None:
        try:
            parts = admin.describe_topic(topic).partitions
        except UnknownTopicOrPartitionError:
            return None
        leaders = {q.partition: q.leader for q in parts}
        return leaders if all(leader >= 0 for leader in leaders.values()) else None

    found: dict[int, int] = wait_until(known, message=f"leaders of {topic}")
    return found


def listing(admin: Admin, transactional_id: str) -> Any:
    return next(t for t in admin.list_transactions() if t.transactional_id == transactional_id)


def coordinator_of(admin: Admin) -> int:
    def leader() -> list[int]:  # a list, so that broker 0 counts as found
        state = admin.describe_topic(TRANSACTION_TOPIC).partitions[0]
        return [state.leader] if state.leader >= 0 else []

    found: list[int] = wait_until(leader, message="a leader of __transaction_state-0")
    return found[0]


# --- without a broker ----------------------------------------------------------------------------


@pytest.mark.unit
def test_idempotence_and_transaction_settings() -> None:
    def config(**values: Any) -> ProducerConfig:
        return load(ProducerConfig, {"bootstrap.servers": "h:1", **values}, {})

    assert config().enable_idempotence  # Kafka 3+: on by default
    assert config().transactional_id is None
    # not asked for: turned off by settings it cannot work with, as Kafka does
    assert not config(acks="1").enable_idempotence
    assert not config(retries=0).enable_idempotence
    assert not config(**{"max.in.flight.requests.per.connection": 6}).enable_idempotence
    assert config(**{"max.in.flight.requests.per.connection": 5}).enable_idempotence
    # asked for: those settings are refused, naming the key
    with pytest.raises(ConfigError, match="acks=1: the idempotent producer needs acks=all"):
        config(acks="1", **{"enable.idempotence": "true"})
    with pytest.raises(ConfigError, match=r"max\.in\.flight.*at most 5"):
        config(**{"enable.idempotence": True, "max.in.flight.requests.per.connection": 6})
    with pytest.raises(ConfigError, match="acks"):
        config(acks="0", **{"transactional.id": "t"})
    with pytest.raises(ConfigError, match=r"transactional\.id='t' needs enable\.idempotence"):
        config(**{"transactional.id": "t", "enable.idempotence": "false"})
    assert config(**{"transactional.id": "t"}).enable_idempotence
    assert config(**{"transactional.id": ""}).transactional_id is None
    assert config(**{"transaction.timeout.ms": "900"}).transaction_timeout_ms == 900


@pytest.mark.unit
def test_sequence_numbers_wrap_as_the_broker_expects() -> None:
    from logstore.batch import Record, build, parse_header
    from replication.client.transactions import increment_sequence

    top = 2**31 - 1
    assert increment_sequence(5, 3) == 8
    assert increment_sequence(top, 1) == 0
    assert increment_sequence(top - 1, 4) == 2
    base = top - 1
    batch = parse_header(
        build([Record(None, b"v", 0)] * 4, producer_id=1, producer_epoch=0, base_sequence=base)
    )
    assert increment_sequence(batch.last_sequence, 1) == increment_sequence(base, 4)


@pytest.mark.unit
def test_handles_and_results_are_small_and_picklable() -> None:
    handle = TransactionHandle("sink-q-b3-t1", 4000, 2)
    assert pickle.loads(pickle.dumps(handle)) == handle
    result = SinkCommitResult(committed=False, last_committed_batch=3)
    assert pickle.loads(pickle.dumps(result)) == result
    with pytest.raises(AttributeError):
        handle.producer_epoch = 3  # type: ignore[misc]


@pytest.mark.unit
def test_transaction_calls_in_the_wrong_state_say_what_to_do() -> None:
    port = free_port()  # nothing listens: none of these calls needs a broker
    with Producer(bootstrap_servers=f"127.0.0.1:{port}", transactional_id="t") as prod:
        with pytest.raises(TransactionStateError, match="init_transactions"):
            prod.begin_transaction()
        with pytest.raises(TransactionStateError, match="init_transactions"):
            prod.send("topic", b"v")
        with pytest.raises(TransactionStateError):
            prod.commit_transaction()
        with pytest.raises(TransactionStateError):
            prod.abort_transaction()
    with Producer(bootstrap_servers=f"127.0.0.1:{port}") as plain:
        with pytest.raises(TransactionStateError, match=r"set transactional\.id"):
            plain.begin_transaction()
        with pytest.raises(TransactionStateError, match=r"set transactional\.id"):
            plain.init_transactions()


# --- a cluster shared by the tests that do not break it ---------------------------------------


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("txn-cluster"), brokers=3)
    cluster.start()
    all_brokers_known(cluster)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def admin(shared: Cluster) -> Iterator[Admin]:
    with Admin(bootstrap_servers=shared.bootstrap, default_api_timeout_ms=30_000) as client:
        yield client


def make_topic(admin: Admin, prefix: str, partitions: int = 3, rf: int = 3) -> list[TopicPartition]:
    topic = unique_name(prefix)
    admin.create_topic(topic, partitions, rf, {"min.insync.replicas": str(min(rf, 2))})
    return [TopicPartition(topic, i) for i in range(partitions)]


# --- idempotence ---------------------------------------------------------------------------------


def produce_requests(proxy: TcpProxy) -> list[tuple[int, int, int]]:
    """(producer id, epoch, base sequence) of every batch in the PRODUCE requests seen."""
    out = []
    for req in proxy.requests:
        if req.api_key != p.ApiKey.PRODUCE or not req.decoded:
            continue
        for t in req.body.topic_data:
            for part in t.partition_data:
                for batch in iter_batches(part.records or b""):
                    out.append((batch.producer_id, batch.producer_epoch, batch.base_sequence))
    return out


@pytest.mark.cluster
@pytest.mark.chaos
@pytest.mark.parametrize("idempotent", [True, False])
def test_lost_produce_responses_are_retried_without_duplicates(
    broker_factory: Callable[..., BrokerProcess], idempotent: bool
) -> None:
    """A proxy loses produce responses: the producer resends the same batch (same producer id
    and sequence numbers) and the broker appends it once. Without idempotence, the same
    fault duplicates records (the control)."""
    port = free_port()
    with TcpProxy("127.0.0.1", port) as proxy:
        broker_factory(port=port, overrides={"advertised.listeners": proxy.address})
        with Admin(bootstrap_servers=proxy.address) as admin:
            admin.create_topic("idem", 1, 1)
        tp = TopicPartition("idem", 0)
        sent: list[bytes] = []
        acked: dict[int, bytes] = {}
        with producer(proxy.address, enable_idempotence=idempotent) as prod:
            for round_ in range(4):
                if round_:
                    proxy.drop_next_response(p.ApiKey.PRODUCE)
                values = [b"r%d-%d" % (round_, i) for i in range(25)]
                futures = [prod.send("idem", v, partition=0) for v in values]
                sent += values
                for value, future in zip(values, futures, strict=True):
                    acked[future.result(timeout=60).offset] = value
            assert proxy.drop_pending(p.ApiKey.PRODUCE) == 0, "every armed drop happened"
        log = read_all(proxy.address, [tp], "read_uncommitted")[tp]
        stamps = produce_requests(proxy)
    retried = len(stamps) - len(set(stamps))
    if idempotent:
        assert retried >= 3, f"each lost response was followed by a resend: {stamps}"
        assert all(pid >= 0 and seq >= 0 for pid, _, seq in stamps)
        assert log == sent, "every record once, in order: no duplicate, no gap"
        assert acked == dict(enumerate(sent)), "acked offsets are where the records are"
    else:
        assert all(seq == -1 for _, _, seq in stamps)
        assert len(log) > len(sent), "without idempotence a resent batch is appended twice"
        assert set(log) == set(sent)


@pytest.mark.cluster
@pytest.mark.chaos
def test_idempotent_producer_across_a_leader_sigkill(
    cluster_factory: Callable[..., Cluster], caplog: pytest.LogCaptureFixture
) -> None:
    """Records stream to an RF=3 partition while its leader is SIGKILLed: everything is acked,
    and the log holds each record exactly once, in the order sent."""
    cluster = cluster_factory(brokers=3)
    topic = unique_name("idem-kill")
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topic(topic, 2, 3, {"min.insync.replicas": "2"})
        leader = leaders_of(admin, topic)[0]
    sent: dict[int, list[bytes]] = {0: [], 1: []}
    futures: list[Any] = []
    stop = threading.Event()
    with (
        caplog.at_level(logging.WARNING, logger="replication.client.producer"),
        producer(cluster.bootstrap, request_timeout_ms=3000) as prod,
    ):

        def stream() -> None:
            i = 0
            while not stop.is_set():
                part = i % 2
                value = b"v%06d" % i
                sent[part].append(value)
                futures.append(prod.send(topic, value, partition=part))
                i += 1
                if i % 20 == 0:
                    stop.wait(0.002)

        thread = threading.Thread(target=stream)
        thread.start()
        try:
            wait_until(lambda: len(futures) > 2000, message="streaming")
            cluster.brokers[leader].kill()
            count = len(futures)
            wait_until(lambda: len(futures) > count + 3000, timeout=60, message="streaming on")
            done = sum(f.done() for f in futures)
            wait_until(
                lambda: sum(f.done() for f in futures) > done + 1000,
                timeout=60,
                message="acks after the failover",
            )
        finally:
            stop.set()
            thread.join(30)
        prod.flush(timeout=90)
        for future in futures:
            future.result(timeout=0)  # every record acked
    assert any("retrying" in r.getMessage() for r in caplog.records), "the kill hit a send"
    log = read_all(cluster.bootstrap, tps, "read_uncommitted")
    for part, tp in enumerate(tps):
        assert log[tp] == sent[part], f"{tp}: duplicates or gaps after the failover"


# --- transactions --------------------------------------------------------------------------------


@pytest.mark.cluster
def test_committed_transaction_becomes_visible_at_once_and_the_lso_holds(
    shared: Cluster, admin: Admin
) -> None:
    bootstrap = shared.bootstrap
    tps = make_topic(admin, "commit")
    with txn_producer(bootstrap, unique_name("tx-commit")) as prod:
        prod.begin_transaction()
        for tp in tps:
            for i in range(10):
                prod.send(tp.topic, b"%d-%d" % (tp.partition, i), partition=tp.partition)
        prod.flush()
        # open: the LSO stays at the transaction's first offset; read_uncommitted sees it all
        assert end_offsets(bootstrap, tps, "read_committed") == dict.fromkeys(tps, 0)
        assert end_offsets(bootstrap, tps, "read_uncommitted") == dict.fromkeys(tps, 10)
        assert read_all(bootstrap, tps) == {tp: [] for tp in tps}
        with Consumer(
            bootstrap_servers=bootstrap,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
        ) as consumer:
            consumer.assign(tps)
            assert consumer.poll(300) == []
            prod.commit_transaction()
            # committed: every partition's records at once (10 + the COMMIT marker)
            assert end_offsets(bootstrap, tps, "read_committed") == dict.fromkeys(tps, 11)
            got: list[Any] = []

            def polled_all() -> bool:
                got.extend(consumer.poll(200))
                return len(got) >= 30

            wait_until(polled_all, timeout=20, message="the committed records")
    assert read_all(bootstrap, tps) == {
        tp: [b"%d-%d" % (tp.partition, i) for i in range(10)] for tp in tps
    }
    assert sorted(r.value for r in got) == sorted(
        b"%d-%d" % (tp.partition, i) for tp in tps for i in range(10)
    )


@pytest.mark.cluster
def test_aborted_transaction_is_never_visible(shared: Cluster, admin: Admin) -> None:
    bootstrap = shared.bootstrap
    tps = make_topic(admin, "abort")
    with txn_producer(bootstrap, unique_name("tx-abort")) as prod:
        prod.begin_transaction()
        for tp in tps:
            prod.send(tp.topic, b"aborted-%d" % tp.partition, partition=tp.partition)
        prod.flush()
        prod.abort_transaction()
        # the ABORT marker ends it: the LSO moves past it
        assert end_offsets(bootstrap, tps, "read_committed") == dict.fromkeys(tps, 2)
        prod.begin_transaction()
        queued = prod.send(tps[0].topic, b"never-sent", partition=0)
        prod.abort_transaction()  # sent or not, it is aborted; if not sent, it fails
        error = queued.exception(timeout=10)
        assert error is None or isinstance(error, TransactionAbortedError), error
        prod.begin_transaction()
        for tp in tps:
            prod.send(tp.topic, b"committed-%d" % tp.partition, partition=tp.partition)
        prod.commit_transaction()
        with pytest.raises(TransactionStateError, match="begin_transaction"):
            prod.send(tps[0].topic, b"outside", partition=0)
    committed = read_all(bootstrap, tps)
    assert committed == {tp: [b"committed-%d" % tp.partition] for tp in tps}
    everything = read_all(bootstrap, tps, "read_uncommitted")
    for tp in tps:
        assert b"aborted-%d" % tp.partition in everything[tp]


@pytest.mark.cluster
def test_transaction_open_past_its_timeout_is_aborted(shared: Cluster, admin: Admin) -> None:
    bootstrap = shared.bootstrap
    tps = make_topic(admin, "timeout", partitions=2)
    transactional_id = unique_name("tx-timeout")
    with txn_producer(bootstrap, transactional_id, transaction_timeout_ms=1500) as prod:
        prod.begin_transaction()
        for tp in tps:
            prod.send(tp.topic, b"late", partition=tp.partition)
        prod.flush()
        assert listing(admin, transactional_id).state == "Ongoing"
        wait_until(
            lambda: listing(admin, transactional_id).state == "CompleteAbort",
            timeout=20,
            message="the coordinator aborts the transaction after its timeout",
        )
        assert end_offsets(bootstrap, tps, "read_committed") == dict.fromkeys(tps, 2)
        with pytest.raises(ProducerFencedError, match=r"transaction\.timeout\.ms=1500"):
            prod.commit_transaction()
        with pytest.raises(ProducerFencedError):
            prod.begin_transaction()
    assert read_all(bootstrap, tps) == {tp: [] for tp in tps}


@pytest.mark.cluster
def test_zombie_producer_is_fenced(shared: Cluster, admin: Admin) -> None:
    bootstrap = shared.bootstrap
    tps = make_topic(admin, "zombie", partitions=2)
    transactional_id = unique_name("tx-zombie")
    zombie = txn_producer(bootstrap, transactional_id)
    try:
        zombie.begin_transaction()
        zombie.send(tps[0].topic, b"zombie-1", partition=0).result(timeout=30)
        # a second instance with the same transactional.id: new epoch, the zombie's open
        # transaction is aborted
        with txn_producer(bootstrap, transactional_id) as fresh:
            new = listing(admin, transactional_id)
            assert new.producer_epoch > 0
            late = zombie.send(tps[0].topic, b"zombie-2", partition=0)
            with pytest.raises(ProducerFencedError, match="fenced"):
                late.result(timeout=30)
            with pytest.raises(ProducerFencedError):
                zombie.commit_transaction()
            with pytest.raises(ProducerFencedError):
                zombie.send(tps[1].topic, b"zombie-3", partition=1)
            fresh.begin_transaction()
            fresh.send(tps[1].topic, b"fresh", partition=1)
            fresh.commit_transaction()
    finally:
        zombie.close()
    assert read_all(bootstrap, tps) == {tps[0]: [], tps[1]: [b"fresh"]}
    assert b"zombie-1" in read_all(bootstrap, tps, "read_uncommitted")[tps[0]]


# --- the Spark sink commit -------------------------------------------------------------------


def task_handles(
    bootstrap: str, tps: list[TopicPartition], sink: str, batch: int, attempt: int
) -> list[TransactionHandle]:
    """One producer per "task", each writing its partition's rows of the batch; their handles."""
    handles = []
    for tp in tps:
        with txn_producer(bootstrap, f"{sink}-b{batch}-t{tp.partition}-a{attempt}") as prod:
            prod.begin_transaction()
            for i in range(5):
                prod.send(tp.topic, b"b%d-row%d" % (batch, i), partition=tp.partition)
            handle = prod.transaction_handle()
            assert prod.transaction_handle() == handle
            with pytest.raises(TransactionStateError):
                prod.send(tp.topic, b"after the hand-off", partition=tp.partition)
        handles.append(pickle.loads(pickle.dumps(handle)))  # they travel to the driver
    return handles


@pytest.mark.cluster
def test_sink_batch_replayed_is_visible_once(shared: Cluster, admin: Admin) -> None:
    bootstrap = shared.bootstrap
    tps = make_topic(admin, "sink")
    sink = unique_name("sink")
    assert admin.last_committed_batch(sink) == -1
    first = task_handles(bootstrap, tps, sink, 0, attempt=0)
    # nothing is visible before the driver commits
    assert read_all(bootstrap, tps) == {tp: [] for tp in tps}
    result = admin.commit_sink_batch(sink, 0, first)
    assert (result.committed, result.last_committed_batch) == (True, 0)
    # the same batch again (a replay after a driver restart): aborted, visible once
    replay = task_handles(bootstrap, tps, sink, 0, attempt=1)
    result = admin.commit_sink_batch(sink, 0, replay)
    assert (result.committed, result.last_committed_batch) == (False, 0)
    states = {t.transactional_id: t.state for t in admin.list_transactions()}
    assert {states[h.transactional_id] for h in first} == {"CompleteCommit"}
    assert {states[h.transactional_id] for h in replay} == {"CompleteAbort"}
    # an aborted batch, then the next batch
    dropped = task_handles(bootstrap, tps, sink, 1, attempt=0)
    assert admin.abort_sink_batch(sink, 1, dropped).committed is False
    assert admin.commit_sink_batch(sink, 1, task_handles(bootstrap, tps, sink, 1, 1)).committed
    assert admin.last_committed_batch(sink) == 1
    expected = [b"b%d-row%d" % (b, i) for b in (0, 1) for i in range(5)]
    assert read_all(bootstrap, tps) == dict.fromkeys(tps, expected)
    # a fenced task's transaction cannot be committed: nothing happened, say so
    fenced = task_handles(bootstrap, tps[:1], sink, 2, attempt=0)
    txn_producer(bootstrap, fenced[0].transactional_id).close()
    with pytest.raises(CommitFailedError, match="did not happen"):
        admin.commit_sink_batch(sink, 2, fenced)
    assert admin.last_committed_batch(sink) == 1
    assert admin.list_transactions(["Ongoing", "PrepareCommit", "PrepareAbort"]) == []


# --- the coordinator dies between the decision and the markers ---------------------------------


@pytest.mark.cluster
@pytest.mark.chaos
@pytest.mark.parametrize("how", ["end_txn", "sink", "sink_abandoned"])
def test_coordinator_sigkill_mid_commit_completes_on_the_new_coordinator(
    cluster_factory: Callable[..., Cluster], how: str
) -> None:
    """The leader of a data partition is SIGSTOPped so the COMMIT markers cannot all be
    written; once the coordinator has recorded PrepareCommit it is SIGKILLed. The new
    coordinator (the new leader of __transaction_state-0) finishes the commit: every record of
    the transaction becomes visible, and the sink's committed batch survives the failover.

    end_txn / sink: the producer's EndTxn (the driver's CommitSinkBatch) is retried at the new
    coordinator, which answers "still completing" (retriable) while the data leader is
    stopped, then success. sink_abandoned: the driver gives up (outcome unknown) and the
    transaction's timeout passes meanwhile: the new coordinator must still commit it, not
    abort it as a timed-out open transaction, or one partition would end committed and the
    other aborted."""
    cluster = cluster_factory(brokers=3)
    all_brokers_known(cluster)  # so __transaction_state gets 3 replicas
    bootstrap = cluster.bootstrap
    topic = unique_name("mid-commit")
    transactional_id = unique_name(f"tx-{how}")
    sink = unique_name("sink")
    timeout_ms = 3000 if how == "sink_abandoned" else 60_000
    # a short request timeout: a request that picks the stopped broker costs only that
    with Admin(
        bootstrap_servers=bootstrap, default_api_timeout_ms=60_000, request_timeout_ms=2000
    ) as admin:
        admin.create_topic(topic, 3, 1)  # RF=1: a stopped leader blocks its markers
        prod = txn_producer(
            bootstrap, transactional_id, request_timeout_ms=5000, transaction_timeout_ms=timeout_ms
        )
        coordinator = coordinator_of(admin)
        assert len(admin.describe_topic(TRANSACTION_TOPIC).partitions[0].replicas) == 3
        leaders = leaders_of(admin, topic)
        tps = [TopicPartition(topic, i) for i, leader in leaders.items() if leader != coordinator]
        stopped = leaders[tps[0].partition]
        assert len(tps) == 2
        assert stopped != coordinator
        prod.begin_transaction()
        for tp in tps:
            for i in range(20):
                prod.send(topic, b"%d-%d" % (tp.partition, i), partition=tp.partition)
        handle = prod.transaction_handle() if how != "end_txn" else None
        prod.flush()

        outcome: list[Any] = []
        # the driver's client finds the coordinator before the data leader stops (a request to
        # a stopped broker costs request.timeout.ms)
        driver = Admin(bootstrap_servers=bootstrap, default_api_timeout_ms=100_000)
        assert driver.last_committed_batch(sink) == -1
        assert listing(admin, transactional_id).state == "Ongoing"

        def commit() -> None:
            try:
                if handle is None:
                    prod.commit_transaction(timeout=100)
                    outcome.append("committed")
                else:
                    # abandoned: gives up before a new coordinator can exist (its broker's
                    # session must expire first, 2 s after the kill)
                    limit = 3500 if how == "sink_abandoned" else None
                    outcome.append(driver.commit_sink_batch(sink, 7, [handle], timeout_ms=limit))
            except Exception as err:
                outcome.append(err)
            finally:
                driver.close()

        cluster.brokers[stopped].pause()
        committer = threading.Thread(target=commit, daemon=True)
        try:
            committer.start()
            wait_until(
                lambda: listing(admin, transactional_id).state == "PrepareCommit",
                timeout=30,
                message="the coordinator records the commit decision",
            )
            cluster.brokers[coordinator].kill()
            if how != "sink_abandoned":
                # the new coordinator has the decision; it cannot finish while the data
                # leader is stopped, and the retried commit is told to wait, not refused
                assert listing(admin, transactional_id).state == "PrepareCommit"
                wait_until(lambda: coordinator_of(admin) != coordinator, message="failover")
                committer.join(1.5)
                assert committer.is_alive(), f"the commit gave up: {outcome}"
        finally:
            cluster.brokers[stopped].resume()
        committer.join(120)
        assert not committer.is_alive()
        prod.close()
        assert len(outcome) == 1
        if how == "end_txn":
            assert outcome == ["committed"]
        elif how == "sink":
            result = outcome[0]
            assert not isinstance(result, Exception), result
            assert (result.committed, result.last_committed_batch) == (True, 7)
        else:
            assert isinstance(outcome[0], CommitStateUnknownError), outcome
        bootstrap = cluster.bootstrap  # the brokers still alive
        wait_until(lambda: coordinator_of(admin) != coordinator, message="a new coordinator")
        wait_until(
            lambda: listing(admin, transactional_id).state in ("CompleteCommit", "CompleteAbort"),
            timeout=30,
            message="the new coordinator completes the transaction",
        )
        assert listing(admin, transactional_id).state == "CompleteCommit"
        assert read_all(bootstrap, tps) == {
            tp: [b"%d-%d" % (tp.partition, i) for i in range(20)] for tp in tps
        }
        if how != "end_txn":
            assert admin.last_committed_batch(sink) == 7
            replay = txn_producer(bootstrap, unique_name("tx-replay"))
            replay.begin_transaction()
            replay.send(topic, b"replayed", partition=tps[1].partition)
            again = admin.commit_sink_batch(sink, 7, [replay.transaction_handle()])
            replay.close()
            assert (again.committed, again.last_committed_batch) == (False, 7)
            assert b"replayed" not in read_all(bootstrap, tps)[tps[1]]


# --- replog transactions list -------------------------------------------------------------------


@pytest.mark.cluster
def test_cli_lists_open_transactions(shared: Cluster, admin: Admin) -> None:
    from typer.testing import CliRunner

    from replication.tools.cli_transactions import transactions_app

    runner = CliRunner()
    bootstrap = shared.bootstrap
    tps = make_topic(admin, "cli", partitions=2)
    transactional_id = unique_name("tx-cli")

    def run(*args: str) -> Any:
        result = runner.invoke(transactions_app, ["list", "--bootstrap-server", bootstrap, *args])
        assert result.exit_code == 0, result.output
        return result

    with txn_producer(bootstrap, transactional_id) as prod:
        prod.begin_transaction()
        for tp in tps:
            prod.send(tp.topic, b"x", partition=tp.partition)
        prod.flush()
        table = run().output
        assert transactional_id in table
        assert "Ongoing" in table
        rows = {r["transactional_id"]: r for r in json.loads(run("--json").output)}
        row = rows[transactional_id]
        assert row["state"] == "Ongoing"
        assert sorted(row["partitions"]) == sorted(f"{tp.topic}-{tp.partition}" for tp in tps)
        assert row["age_ms"] >= 0
        assert row["coordinator"] == coordinator_of(admin)
        prod.commit_transaction()
    assert transactional_id not in {r["transactional_id"] for r in json.loads(run("--json").output)}
    done = json.loads(run("--all", "--json").output)
    assert {"transactional_id": transactional_id, "state": "CompleteCommit"}.items() <= next(
        r for r in done if r["transactional_id"] == transactional_id
    ).items()
    bad = runner.invoke(transactions_app, ["list", "--bootstrap-server", bootstrap, "--state", "X"])
    assert bad.exit_code == 1
    assert "unknown transaction state" in bad.output
