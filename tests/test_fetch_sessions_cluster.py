"""Fetch sessions (KIP-227) between real brokers, watched on the wire through a real TCP proxy.

Each test runs a controller and two brokers (ids 0 and 1) as processes on 127.0.0.1. Broker 0
listens on a real port but registers (``advertised.listeners``) the port of a
:class:`tests.proxy.TcpProxy` in front of it, so broker 1's replica fetcher reaches broker 0
only through the proxy: every follower Fetch request to broker 0 is recorded there, and the
proxy can lose a response or cut the connections. The tests only use partitions whose leader
is broker 0 (checked in the metadata), so broker 1 follows them through the proxy.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from logstore.batch import Record, build, iter_batches
from logstore.errors import ReplogError
from logstore.log import open_replica_log
from logstore.storage import Storage
from replication import protocol as p
from replication.common import TopicPartition
from replication.errors import FetchSessionIdNotFoundError, InvalidFetchSessionEpochError
from tests.cluster import FAST_FAILOVER, BrokerProcess
from tests.helpers import free_port, unique_name, wait_until
from tests.proxy import RecordedRequest, TcpProxy
from tests.wire import RawConnection, create_topic, fetch, produce, read_records

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

LEADER = 0
FOLLOWER = 1


# --- a cluster whose broker 0 is reached by its peers through a proxy ----------------------------


class ProxiedCluster:
    """A controller, broker 0 (the leader, behind ``proxy``) and broker 1 (its follower)."""

    def __init__(self, data_dir: Path, leader_overrides: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.common = {**FAST_FAILOVER, "metadata.log.dir": (data_dir / "metadata").as_uri()}
        self.leader_overrides = {**self.common, **(leader_overrides or {})}
        self.controller = BrokerProcess(
            data_dir / "controller", broker_id=100, role="controller", overrides=self.common
        )
        self.brokers: dict[int, BrokerProcess] = {
            FOLLOWER: BrokerProcess(
                data_dir / "broker-1", broker_id=FOLLOWER, overrides=self.common
            )
        }
        self.proxy: TcpProxy = self._new_leader()

    def _new_leader(self) -> TcpProxy:
        """A proxy to a fresh free port, and broker 0 set to listen there behind it."""
        port = free_port()
        proxy = TcpProxy("127.0.0.1", port).start()
        self.brokers[LEADER] = BrokerProcess(
            self.data_dir / "broker-0",
            broker_id=LEADER,
            port=port,
            overrides={
                **self.leader_overrides,
                "listeners": f"127.0.0.1:{port}",
                "advertised.listeners": proxy.address,
            },
        )
        return proxy

    def start(self) -> ProxiedCluster:
        self.controller.start()
        # A broker prints its ready line once registered: start both at once.
        with ThreadPoolExecutor(2) as pool:
            follower = pool.submit(self.brokers[FOLLOWER].start)
            for attempt in range(3):
                try:
                    self.brokers[LEADER].start()
                    break
                except RuntimeError:
                    # The free port was taken before broker 0 bound it: try another one.
                    if attempt == 2:
                        raise
                    self.proxy.stop()
                    self.proxy = self._new_leader()
            follower.result()
        assert self.brokers[LEADER].port == self.proxy.target[1]
        return self

    @property
    def leader(self) -> BrokerProcess:
        return self.brokers[LEADER]

    def stop(self) -> None:
        for proc in [*self.brokers.values(), self.controller]:
            if proc.alive:
                proc.kill()
        self.proxy.stop()

    def follower_values(self, topic: str, partition: int) -> list[tuple[int, bytes | None]]:
        """(offset, value) of every record broker 1 holds durable of the partition, in either
        layout (its segment objects, or its chunks of its WAL objects).

        Read straight from its storage through a read-only log (recovery that changes nothing,
        safe beside the live broker); an object merged or compacted away meanwhile: [] (the
        caller polls again).
        """
        directory = Path(self.brokers[FOLLOWER].data_dir) / "logs" / topic / str(partition)
        out: list[tuple[int, bytes | None]] = []
        if not directory.is_dir():
            return out
        root = Storage.from_url(self.brokers[FOLLOWER].log_dir)
        try:
            plog = open_replica_log(root, topic, partition, read_only=True)
        except (ReplogError, FileNotFoundError):
            return []
        try:
            offset, end = plog.log_start_offset, plog.durable_end_offset
            while offset < end:
                batches = list(iter_batches(plog.read(offset, 1 << 20, max_offset=end)))
                if not batches:
                    break
                out += [(r.offset, r.value) for b in batches for r in b.records()]
                offset = batches[-1].next_offset
        except (ReplogError, FileNotFoundError):
            return []
        finally:
            plog.close()
        return out


@pytest.fixture
def proxied_cluster(tmp_path: Path) -> Iterator[Any]:
    """``proxied_cluster(leader_overrides=None)`` starts a :class:`ProxiedCluster`."""
    started: list[ProxiedCluster] = []

    def make(leader_overrides: dict[str, str] | None = None) -> ProxiedCluster:
        cluster = ProxiedCluster(tmp_path / f"cluster{len(started)}", leader_overrides)
        started.append(cluster)
        return cluster.start()

    yield make
    for cluster in started:
        cluster.stop()


# --- wire helpers ------------------------------------------------------------------------------


def batch(*values: bytes) -> bytes:
    return build([Record(None, v, 1_000 + i) for i, v in enumerate(values)])


def leaders(conn: RawConnection, topic: str) -> list[int]:
    meta = conn.request(
        p.ApiKey.METADATA, p.MetadataRequest(topics=[p.MetadataRequestTopic(name=topic)])
    )
    (info,) = meta.topics
    return [part.leader_id for part in sorted(info.partitions, key=lambda x: x.partition_index)]


def create_led_by_leader(conn: RawConnection, topic: str, partitions: int, rf: int) -> list[int]:
    """Create ``topic`` and return the partitions broker 0 leads (once every one has a leader)."""
    result = create_topic(conn, topic, partitions=partitions, rf=rf).topics[0]
    assert result.error_code == 0, result

    def led_everywhere() -> list[int] | None:
        found = leaders(conn, topic)
        return found if found and all(x >= 0 for x in found) else None

    found = wait_until(led_everywhere, message=f"leaders of {topic}")
    led = [i for i, leader in enumerate(found) if leader == LEADER]
    assert led, f"broker 0 leads no partition of {topic}: {found}"
    return led


def leader_values(
    conn: RawConnection, topic: str, partition: int
) -> list[tuple[int, bytes | None]]:
    """Every record below the leader's HW, fetched without a session."""
    return [(r.offset, r.value) for r in read_records(conn, topic, partition)]


def high_watermark(conn: RawConnection, topic: str, partition: int) -> int:
    part = fetch(conn, topic, partition, 0, max_bytes=1).responses[0].partitions[0]
    assert part.error_code == 0, part
    return int(part.high_watermark)


def fetch_request(
    session_id: int, session_epoch: int, parts: list[TopicPartition], *, offset: int = 0
) -> p.FetchRequest:
    """A consumer's (replica_id -1) fetch in a session, naming ``parts``."""
    topics: dict[str, list[p.FetchRequestPartition]] = {}
    for topic, index in parts:
        topics.setdefault(topic, []).append(
            p.FetchRequestPartition(
                partition=index, fetch_offset=offset, partition_max_bytes=1 << 20
            )
        )
    return p.FetchRequest(
        replica_id=p.CONSUMER_REPLICA_ID,
        max_wait_ms=0,
        min_bytes=1,
        session_id=session_id,
        session_epoch=session_epoch,
        topics=[p.FetchRequestTopic(topic=t, partitions=ps) for t, ps in topics.items()],
    )


def responded(response: Any) -> set[TopicPartition]:
    return {
        TopicPartition(t.topic, part.partition_index)
        for t in response.responses
        for part in t.partitions
    }


def named(request: RecordedRequest) -> dict[TopicPartition, p.FetchRequestPartition]:
    return {
        TopicPartition(t.topic, part.partition): part
        for t in request.body.topics
        for part in t.partitions
    }


def forgotten(request: RecordedRequest) -> set[TopicPartition]:
    """The partitions a Fetch request removes from its session."""
    return {
        TopicPartition(t.topic, index)
        for t in request.body.forgotten_topics_data
        for index in t.partitions
    }


def follower_fetches(proxy: TcpProxy, since: int = 0) -> list[RecordedRequest]:
    """The follower's Fetch requests the proxy saw (replica_id >= 0), from position ``since``."""
    out = []
    for req in proxy.requests[since:]:
        if req.api_key != p.ApiKey.FETCH:
            continue
        assert req.decoded, f"a Fetch request that does not decode: {req}"
        if req.body.replica_id >= 0:
            out.append(req)
    return out


def wait_settled(proxy: TcpProxy, partitions: set[TopicPartition]) -> tuple[int, int]:
    try:
        return wait_until(
            lambda: settled_session(proxy, partitions), message="the follower's session settles"
        )
    except AssertionError as err:
        last = [
            (r.body.session_id, r.body.session_epoch, len(named(r)))
            for r in follower_fetches(proxy)[-5:]
        ]
        raise AssertionError(
            f"{err}; last follower fetches (session, epoch, named): {last}"
        ) from None


def settled_session(proxy: TcpProxy, partitions: set[TopicPartition]) -> tuple[int, int] | None:
    """(session id, position) once the follower's session covers ``partitions`` and its last
    three round trips named no partition either way (nothing left to tell); the position is
    that of the first of the three."""
    reqs = follower_fetches(proxy)
    fulls = [i for i, r in enumerate(reqs) if r.body.session_epoch == 0]
    if not fulls:
        return None
    after = reqs[fulls[-1] :]
    covered: set[TopicPartition] = set()
    for req in after:
        covered |= set(named(req))
    if not covered >= partitions or len(after) < 4:
        return None
    answers = {(r.conn_id, r.correlation_id): r for r in proxy.responses}
    last = after[-3:]
    for req in last:
        answer = answers.get((req.conn_id, req.correlation_id))
        if named(req) or answer is None or answer.dropped or responded(answer.decode()):
            return None
    return int(last[0].body.session_id), last[0].seq


# --- 1. incremental requests name only what changed --------------------------------------------


def test_incremental_fetches_name_only_changed_partitions(proxied_cluster: Any) -> None:
    cluster = proxied_cluster()
    proxy = cluster.proxy
    topic = unique_name("fs")
    with RawConnection(cluster.leader.bootstrap) as conn:
        # Leaders alternate between the two brokers: 200 partitions give broker 0 a hundred,
        # all followed by broker 1 in its one session with broker 0.
        led = create_led_by_leader(conn, topic, partitions=200, rf=2)
        assert len(led) == 100
        session_tps = {TopicPartition(topic, i) for i in led}
        session_id, quiet = wait_settled(proxy, session_tps)
        mark = len(proxy.requests)

        produced = [led[0], led[41], led[99]]
        for n, index in enumerate(produced):
            values = [f"p{index}-{i}".encode() for i in range(5)]
            resp = produce(conn, topic, index, batch(*values), acks=-1)
            assert resp.responses[0].partition_responses[0].error_code == 0, resp
            assert resp.responses[0].partition_responses[0].base_offset == 0
            # acks=all answered: the HW counts the follower's durable copy.
            assert high_watermark(conn, topic, index) == 5, n
        for index in produced:
            expected = [(i, f"p{index}-{i}".encode()) for i in range(5)]
            wait_until(
                lambda index=index, expected=expected: (
                    cluster.follower_values(topic, index) == expected
                ),
                timeout=10,
                message=f"the follower's stored records of {topic}-{index}",
            )
            assert leader_values(conn, topic, index) == expected
        # The follower reports its new fetch offsets in its next requests.
        wait_until(
            lambda: (
                {
                    tp
                    for r in follower_fetches(proxy, mark)
                    for tp, part in named(r).items()
                    if part.fetch_offset == 5
                }
                == {TopicPartition(topic, i) for i in produced}
            ),
            timeout=10,
            message="incremental fetches naming the produced partitions at offset 5",
        )

    reqs = follower_fetches(proxy)
    assert {r.body.replica_id for r in reqs} == {FOLLOWER}
    full, incrementals = reqs[0], reqs[1:]
    # One session from start to end: one full fetch, then only incrementals. The follower opens
    # its replicas in the background, in batches, so the full fetch names those open then and
    # incrementals add the rest (at offset 0) before the session settles.
    assert (full.body.session_id, full.body.session_epoch) == (0, 0)
    assert set(named(full)) <= session_tps
    assert all(part.fetch_offset == 0 for part in named(full).values())
    assert [r.body.session_id for r in incrementals] == [session_id] * len(incrementals)
    assert [r.body.session_epoch for r in incrementals] == list(range(1, len(incrementals) + 1))
    # Before the session settles a partition may leave it for a moment: the follower leaves
    # out a partition the leader refused (a leader that has not read the new topic yet: a
    # metadata disagreement) until its short retry delay, then adds it back, as Kafka's
    # fetcher leaves out a delayed partition. Once settled, nothing is forgotten.
    assert all(not forgotten(r) for r in incrementals if r.seq >= mark)

    # Replay the session: an incremental request names a partition only when its fetch offset
    # moved; before the produce it names none, after it only the produced ones.
    offsets = {tp: part.fetch_offset for tp, part in named(full).items()}
    for req in incrementals:
        for tp in forgotten(req):
            assert tp in offsets, f"{req} forgets {tp}, which is not in the session"
            del offsets[tp]
        for tp, part in named(req).items():
            if tp not in offsets:  # added to the session once the follower opened it
                assert tp in session_tps, f"{req} names {tp}, which the follower does not follow"
                assert req.seq < mark, f"{req} adds {tp} after the session settled"
                offsets[tp] = part.fetch_offset
                continue
            assert req.seq >= mark, f"{req} names {tp} although nothing changed"
            assert part.fetch_offset > offsets[tp], f"{req} names {tp} with an unchanged offset"
            offsets[tp] = part.fetch_offset
        if req.seq >= mark:
            assert set(named(req)) <= {TopicPartition(topic, i) for i in produced}
    assert set(offsets) == session_tps
    assert {tp for tp, off in offsets.items() if off} == {
        TopicPartition(topic, i) for i in produced
    }
    assert all(offsets[TopicPartition(topic, i)] == 5 for i in produced)

    # ... and once quiet, the leader answers them with only the partitions that have news:
    # records, then the new high watermark, of the produced ones.
    responses = {(r.conn_id, r.correlation_id): r for r in proxy.responses}
    full_response = responses[(full.conn_id, full.correlation_id)].decode()
    assert responded(full_response) == set(named(full))
    errors = sorted(
        {
            (x.partition_index, x.error_code)
            for t in full_response.responses
            for x in t.partitions
            if x.error_code
        }
    )
    if errors:
        print(f"\nfull fetch response errors: {errors}")
    news: set[TopicPartition] = set()
    for req in incrementals:
        resp = responses.get((req.conn_id, req.correlation_id))
        if resp is None:  # the last request may still be parked on the leader
            continue
        body = resp.decode()
        assert (body.error_code, body.session_id) == (0, session_id)
        if req.seq >= quiet:
            assert responded(body) <= {TopicPartition(topic, i) for i in produced}, req
            news |= responded(body)
    assert news == {TopicPartition(topic, i) for i in produced}

    # A full fetch of the whole session costs about this (the full one may name fewer).
    whole = full.size * len(session_tps) / len(named(full))
    settled = [r for r in incrementals if r.seq >= mark]
    sizes = sorted({r.size for r in settled})
    biggest = max(r.size for r in settled)
    print(
        f"\nfull fetch request: {full.size} bytes ({len(named(full))} partitions); "
        f"settled incremental request sizes: {sizes} bytes; largest = "
        f"{100 * biggest / whole:.1f}% of a full one of the session's {len(session_tps)}"
    )
    assert biggest <= 0.05 * whole, (biggest, whole)


# --- 2. a lost response ------------------------------------------------------------------------


def test_lost_fetch_response_falls_back_to_a_full_fetch(proxied_cluster: Any) -> None:
    cluster = proxied_cluster()
    proxy = cluster.proxy
    topic = unique_name("fs")
    with RawConnection(cluster.leader.bootstrap) as conn:
        led = create_led_by_leader(conn, topic, partitions=4, rf=2)
        session_tps = {TopicPartition(topic, i) for i in led}
        index = led[0]
        resp = produce(conn, topic, index, batch(b"before"), acks=-1)
        assert resp.responses[0].partition_responses[0].error_code == 0
        wait_settled(proxy, session_tps)

        proxy.drop_next_response(p.ApiKey.FETCH)
        wait_until(lambda: proxy.drop_pending() == 0, timeout=10, message="a response dropped")
        (dropped,) = [r for r in proxy.responses if r.dropped]
        (lost,) = [
            r
            for r in follower_fetches(proxy)
            if (r.conn_id, r.correlation_id) == (dropped.conn_id, dropped.correlation_id)
        ]
        old_session = lost.body.session_id
        assert old_session != 0, "the lost one was in a session"
        assert lost.body.session_epoch > 0, "the lost one was incremental"

        after = wait_until(
            lambda: [r for r in follower_fetches(proxy) if r.seq > lost.seq],
            timeout=10,
            message="the follower's next fetch",
        )
        retry = after[0]
        assert retry.conn_id != lost.conn_id, "the follower reconnected"
        assert retry.body.session_epoch == 0, f"not a full fetch: {retry.body}"
        assert retry.body.session_id in (old_session, 0)
        assert set(named(retry)) == session_tps
        # That full fetch closed the old session on the leader: it is gone, not leaked (a
        # request in it with the very epoch the leader last expected is not served).
        wait_until(
            lambda: [r for r in follower_fetches(proxy) if r.seq > retry.seq],
            timeout=10,
            message="the follower's fetch after the full one",
        )
        stale = conn.request(
            p.ApiKey.FETCH, fetch_request(old_session, lost.body.session_epoch + 1, [])
        )
        assert stale.error_code == FetchSessionIdNotFoundError.code, stale

        # Replication carries on in a new session.
        resp = produce(conn, topic, index, batch(b"after"), acks=-1)
        assert resp.responses[0].partition_responses[0].error_code == 0, resp
        wait_until(
            lambda: [v for _, v in cluster.follower_values(topic, index)] == [b"before", b"after"],
            timeout=10,
            message="the follower has the record produced after the loss",
        )
        later = [r for r in follower_fetches(proxy) if r.seq > retry.seq]
        assert later, "incremental fetches after the full one"
        new_sessions = {r.body.session_id for r in later}
        assert len(new_sessions) == 1
        assert not new_sessions & {old_session, 0}
        assert all(r.body.session_epoch > 0 for r in later)


# --- 3. connections cut while producing with acks=all ------------------------------------------


def test_cut_connections_mid_stream_lose_no_acked_record(proxied_cluster: Any) -> None:
    cluster = proxied_cluster()
    proxy = cluster.proxy
    topic = unique_name("fs")
    with RawConnection(cluster.leader.bootstrap) as conn:
        led = create_led_by_leader(conn, topic, partitions=2, rf=2)
    index = led[0]
    acked: list[bytes] = []
    failures: list[str] = []
    stop = threading.Event()

    def producer() -> None:
        # Through the proxy too: the cuts hit the producer's connection and the follower's.
        n = 0
        client: RawConnection | None = None
        while not stop.is_set():
            value = f"v{n}".encode()
            n += 1
            try:
                if client is None:
                    client = RawConnection(proxy.address, timeout=30)
                resp = produce(client, topic, index, batch(value), acks=-1)
            except OSError as err:  # cut: the outcome is unknown, reconnect and go on
                failures.append(repr(err))
                if client is not None:
                    client.close()
                    client = None
                continue
            code = resp.responses[0].partition_responses[0].error_code
            if code == 0:
                acked.append(value)
            else:
                failures.append(f"error {code}")
        if client is not None:
            client.close()

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    try:
        for _ in range(3):
            before = len(acked)
            wait_until(
                lambda before=before: len(acked) >= before + 20,
                timeout=20,
                message="acked produce goes on",
            )
            conns_before = proxy.accepted
            assert proxy.cut_all() >= 1
            # Produce resumes: more acks, over new connections.
            wait_until(
                lambda conns_before=conns_before: proxy.accepted >= conns_before + 2,
                timeout=10,
                message="producer and follower reconnect",
            )
        before = len(acked)
        wait_until(lambda: len(acked) >= before + 20, timeout=20, message="produce resumes")
    finally:
        stop.set()
        thread.join(40)
    assert not thread.is_alive()
    assert not [f for f in failures if f.startswith("error")], failures

    with RawConnection(cluster.leader.bootstrap) as conn:

        def both() -> tuple[list[tuple[int, bytes | None]], list[tuple[int, bytes | None]]] | None:
            on_leader = leader_values(conn, topic, index)
            on_follower = cluster.follower_values(topic, index)
            return (on_leader, on_follower) if on_leader == on_follower else None

        # Once the producer stopped, the follower catches up and the HW reaches the end: both
        # replicas hold the same records at the same offsets, every acked one among them.
        on_leader, _ = wait_until(both, timeout=15, message="the replicas agree")
    values = [v for _, v in on_leader]
    assert set(acked) <= set(values)
    assert len(set(acked)) == len(acked)
    fulls = [r for r in follower_fetches(proxy) if r.body.session_epoch == 0]
    assert len(fulls) >= 2, "each cut made the follower start its session over"
    print(
        f"\n{len(acked)} acked records; {len(failures)} produce requests cut; "
        f"{len(fulls)} full fetches"
    )


# --- 4. eviction of a consumer's session by a follower's ---------------------------------------


def test_follower_session_evicts_consumer_session(proxied_cluster: Any) -> None:
    cluster = proxied_cluster({"max.incremental.fetch.session.cache.slots": "1"})
    proxy = cluster.proxy
    solo, rep = unique_name("fs"), unique_name("fs")
    with RawConnection(cluster.leader.bootstrap) as conn:
        # Replication factor 1: broker 1 follows nothing on broker 0, so holds no session there.
        solo_tp = TopicPartition(solo, create_led_by_leader(conn, solo, partitions=2, rf=1)[0])
        assert not follower_fetches(proxy)

        # A consumer takes the only slot ...
        full = conn.request(p.ApiKey.FETCH, fetch_request(0, 0, [solo_tp]))
        assert full.error_code == 0
        assert responded(full) == {solo_tp}
        consumer_session = full.session_id
        assert consumer_session != 0, "the consumer got a session"
        inc = conn.request(p.ApiKey.FETCH, fetch_request(consumer_session, 1, []))
        assert (inc.error_code, inc.session_id) == (0, consumer_session)

        # ... then broker 1 starts following broker 0: its privileged session evicts it (the
        # consumer's session is not privileged; a follower's may evict it at any age).
        rep_led = create_led_by_leader(conn, rep, partitions=2, rf=2)
        wait_until(
            lambda: any(r.body.session_epoch > 0 for r in follower_fetches(proxy)),
            timeout=10,
            message="the follower holds a session (the only slot)",
        )

        gone = conn.request(p.ApiKey.FETCH, fetch_request(consumer_session, 2, []))
        assert gone.error_code == FetchSessionIdNotFoundError.code == 70, gone
        assert not responded(gone)

        # A full fetch still works; it gets no session, as it may not evict the follower's.
        again = conn.request(p.ApiKey.FETCH, fetch_request(consumer_session, 0, [solo_tp]))
        assert again.error_code == 0, again
        assert responded(again) == {solo_tp}
        assert all(part.error_code == 0 for t in again.responses for part in t.partitions)
        assert again.session_id == 0

        # The follower's session is untouched: acks=all produce goes through.
        resp = produce(conn, rep, rep_led[0], batch(b"x"), acks=-1)
        assert resp.responses[0].partition_responses[0].error_code == 0, resp
    follower_sessions = {r.body.session_id for r in follower_fetches(proxy) if r.body.session_epoch}
    assert len(follower_sessions) == 1


# --- 5. a wrong session epoch ------------------------------------------------------------------


def test_invalid_session_epoch_then_full_fetch_recovers(proxied_cluster: Any) -> None:
    cluster = proxied_cluster()
    topic = unique_name("fs")
    with RawConnection(cluster.leader.bootstrap) as admin:
        index = create_led_by_leader(admin, topic, partitions=2, rf=2)[0]
        resp = produce(admin, topic, index, batch(b"a", b"b"), acks=-1)
        assert resp.responses[0].partition_responses[0].error_code == 0
    tp = TopicPartition(topic, index)
    # The raw client goes through the proxy as well, beside the follower.
    with RawConnection(cluster.proxy.address) as conn:
        # At the end (offset 2): incremental fetches then have no news to answer.
        full = conn.request(p.ApiKey.FETCH, fetch_request(0, 0, [tp], offset=2))
        assert full.error_code == 0
        assert responded(full) == {tp}
        session = full.session_id
        assert session != 0
        ok = conn.request(p.ApiKey.FETCH, fetch_request(session, 1, []))
        assert (ok.error_code, ok.session_id, responded(ok)) == (0, session, set())

        bad = conn.request(p.ApiKey.FETCH, fetch_request(session, 7, []))
        assert bad.error_code == InvalidFetchSessionEpochError.code == 71, bad
        assert not responded(bad)

        # A full fetch naming the old session closes it and opens a new one.
        new = conn.request(p.ApiKey.FETCH, fetch_request(session, 0, [tp], offset=1))
        assert new.error_code == 0, new
        (part,) = new.responses[0].partitions
        assert part.error_code == 0
        assert part.high_watermark == 2
        assert [r.value for b in iter_batches(part.records) for r in b.records()] == [b"a", b"b"]
        assert new.session_id not in (0, session)
        nxt = conn.request(p.ApiKey.FETCH, fetch_request(new.session_id, 1, []))
        assert (nxt.error_code, nxt.session_id) == (0, new.session_id)
        stale = conn.request(p.ApiKey.FETCH, fetch_request(session, 2, []))
        assert stale.error_code == FetchSessionIdNotFoundError.code
    consumer = [
        r for r in cluster.proxy.requests if r.api_key == p.ApiKey.FETCH and r.body.replica_id < 0
    ]
    assert [(r.body.session_id, r.body.session_epoch) for r in consumer] == [
        (0, 0),
        (session, 1),
        (session, 7),
        (session, 0),
        (new.session_id, 1),
        (session, 2),
    ]
