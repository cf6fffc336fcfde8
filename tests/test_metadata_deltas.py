"""Metadata versions as deltas: round trips, catching up, snapshots, stale controllers, upgrades.

In process, on memory storage: real Controllers commit to a real MetadataStore; readers build
the head from the newest snapshot and the deltas after it, or from an image they already hold.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest

from logstore.errors import CorruptRecordError
from logstore.storage import Storage
from replication.controller.controller import Controller
from replication.errors import StaleControllerEpochError
from replication.metadata.delta import (
    DELTA_FORMAT_VERSION,
    MetadataDelta,
    decode_version,
    encode_delta,
)
from replication.metadata.image import (
    BrokerInfo,
    MetadataImage,
    PartitionState,
    TopicInfo,
)
from replication.metadata.store import (
    METADATA_DIR,
    PRUNE_INTERVAL_VERSIONS,
    RETAINED_VERSIONS,
    SNAPSHOT_DIR,
    ControllerClaim,
    MetadataStore,
)
from tests.helpers import register_live

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


class CountingStore(MetadataStore):
    """A MetadataStore that counts the version objects and snapshots it reads."""

    def __init__(self, storage: Storage) -> None:
        super().__init__(storage)
        self.records_read = 0
        self.snapshots_read = 0
        #: called once, right after the next read_latest (to interleave a paused controller)
        self.after_read: Callable[[], None] | None = None
        #: called once, right before the next read_latest
        self.before_read: Callable[[], None] | None = None

    def read_record(self, version: int) -> MetadataImage | MetadataDelta:
        self.records_read += 1
        return super().read_record(version)

    def read_snapshot(self, version: int) -> MetadataImage:
        self.snapshots_read += 1
        return super().read_snapshot(version)

    def read_latest(self, since: MetadataImage | None = None) -> MetadataImage:
        before, self.before_read = self.before_read, None
        if before is not None:
            before()
        image = super().read_latest(since)
        hook, self.after_read = self.after_read, None
        if hook is not None:
            hook()
        return image


def memory_url() -> str:
    return f"memory://deltas-{uuid.uuid4().hex}/meta"


def new_store(url: str | None = None) -> CountingStore:
    return CountingStore(Storage.from_url(url or memory_url()))


def controller(store: MetadataStore, controller_id: int, activate: bool = True) -> Controller:
    c = Controller(store, controller_id, "127.0.0.1", 9000 + controller_id, time_ms=Clock())
    if activate:
        c.activate()
    return c


def with_brokers(c: Controller, n: int = 3) -> None:
    for broker in range(n):
        register_live(c, broker, "127.0.0.1", 9100 + broker, None, f"b{broker}")


def isr_change(c: Controller, topic: str, index: int) -> None:
    info = c.image.topic(topic)
    assert info is not None
    state = info.partitions[index]
    isr = state.replicas if len(state.isr) < len(state.replicas) else state.replicas[:-1]
    c.alter_partition(state.leader, topic, index, state.leader_epoch, state.partition_epoch, isr)


def round_trip(base: MetadataImage, image: MetadataImage) -> MetadataImage:
    delta = decode_version(encode_delta(base, image))
    assert isinstance(delta, MetadataDelta)
    return delta.apply(base)


def part(leader: int, epoch: int = 0) -> PartitionState:
    return PartitionState((leader, leader + 1), (leader, leader + 1), leader, epoch, epoch)


# --- the delta format ---------------------------------------------------------------------------


def test_a_delta_round_trips_every_kind_of_change() -> None:
    base = MetadataImage(
        version=7,
        controller_epoch=2,
        controller_id=100,
        cluster_id="c",
        brokers=(BrokerInfo(0, "h", 1), BrokerInfo(1, "h", 2), BrokerInfo(2, "h", 3)),
        topics=(
            TopicInfo("a", "id-a", (part(0), part(1))),
            TopicInfo("b", "id-b", (part(1),), (("retention.ms", "1"),)),
            TopicInfo("c", "id-c", (part(2),)),
        ),
        next_producer_id=5,
        broker_configs=(("", (("log.retention.ms", "9"),)),),
    )
    a = base.topic("a")
    b = base.topic("b")
    assert a is not None
    assert b is not None
    steps: list[Callable[[MetadataImage], MetadataImage]] = [
        lambda i: i.next(),  # nothing but the version
        lambda i: i.next(controller_epoch=3, controller_id=101, next_producer_id=1000),
        lambda i: i.next().with_topic(TopicInfo("d", "id-d", (part(0), part(2)))),  # a new one
        lambda i: i.next().with_topic(  # one partition of a topic changes
            TopicInfo("a", "id-a", (a.partitions[0], part(1, 4)))
        ),
        lambda i: i.next().with_topic(  # grows, and its configs change
            TopicInfo("b", "id-b", (*b.partitions, part(2), part(0)), (("retention.ms", "2"),))
        ),
        lambda i: i.next().without_topic("c"),
        lambda i: i.next().without_topic("a").with_topic(TopicInfo("a", "id-a2", (part(2),))),
        lambda i: i.next(topics=tuple(reversed(i.topics))),  # only the order
        lambda i: i.next().with_broker(
            BrokerInfo(1, "h", 2, "rack", 5, True, "inc", (("K", "h", 9),))
        ),
        lambda i: i.next().without_broker(0).with_broker(BrokerInfo(7, "h", 8)),
        lambda i: i.next().with_broker_configs("1", {"x": "y"}),
        lambda i: i.next().with_broker_configs("", {}),
    ]
    image = base
    for step in steps:
        after = step(image)
        assert round_trip(image, after) == after
        assert [t.name for t in round_trip(image, after).topics] == [t.name for t in after.topics]
        image = after
    assert round_trip(base, image) == image  # many changes at once


def test_a_partition_change_costs_the_partition_not_the_topic() -> None:
    topic = TopicInfo("big", "id", tuple(part(i % 3) for i in range(10_000)))
    base = MetadataImage(version=1, controller_epoch=1, topics=(topic,))
    parts = list(topic.partitions)
    parts[4321] = part(2, 9)
    image = base.next().with_topic(TopicInfo("big", "id", tuple(parts)))
    data = encode_delta(base, image)
    assert len(data) < 500 < len(image.to_bytes()) // 100
    assert round_trip(base, image) == image


def test_a_delta_applies_only_to_its_base_and_a_newer_format_is_refused() -> None:
    base = MetadataImage(version=3, controller_epoch=1)
    image = base.next().with_topic(TopicInfo("t", "id", (part(0),)))
    delta = decode_version(encode_delta(base, image), where="v4")
    assert isinstance(delta, MetadataDelta)
    assert (delta.version, delta.base_version, delta.base_epoch) == (4, 3, 1)
    with pytest.raises(CorruptRecordError, match=r"follows version 3 .*not version 2"):
        delta.apply(MetadataImage(version=2, controller_epoch=1))
    with pytest.raises(CorruptRecordError, match=r"controller epoch 1.*not version 3 .*epoch 2"):
        delta.apply(MetadataImage(version=3, controller_epoch=2))
    newer = json.dumps({**json.loads(encode_delta(base, image)), "format_version": 9}).encode()
    with pytest.raises(CorruptRecordError, match=r"format_version 9 is not supported.*upgrade"):
        decode_version(newer, where="v4")
    # a full image still decodes as one
    assert decode_version(image.to_bytes()) == image


# --- the store and the controller ---------------------------------------------------------------


def test_version_objects_are_deltas_and_a_reader_builds_the_head_from_a_snapshot() -> None:
    store = new_store()
    c = controller(store, 100)
    with_brokers(c)
    c.create_topic("events", 1_000, 3)
    for change in range(3 * PRUNE_INTERVAL_VERSIONS // 2):
        isr_change(c, "events", change % 1_000)
    head = c.image.version
    record = store.read_record(head)
    assert isinstance(record, MetadataDelta)
    assert len(store.storage.read(f"{METADATA_DIR}/{head:020d}.json")) < 1_000
    snapshots = store.snapshot_versions()
    assert len(snapshots) <= 2
    assert snapshots[-1] < head
    fresh = new_store(store.storage.url)
    assert fresh.read_latest() == c.image
    assert fresh.snapshots_read == 1
    assert fresh.records_read <= head - snapshots[-1] + 1


def test_a_reader_that_holds_a_version_applies_only_the_deltas_after_it() -> None:
    store = new_store()
    c = controller(store, 100)
    with_brokers(c)
    c.create_topic("events", 100, 3)
    reader = new_store(store.storage.url)
    held = reader.read_latest()
    assert held == c.image
    for round_ in range(30):
        for change in range(round_ % 4 + 1):
            isr_change(c, "events", (round_ + change) % 100)
        reader.records_read = reader.snapshots_read = 0
        before = held.version
        held = reader.read_latest(held)
        assert held == c.image
        assert reader.snapshots_read == 0
        assert reader.records_read == held.version - before
    # already at the head: nothing but the head's header
    reader.records_read = 0
    assert reader.read_latest(held) is held
    assert reader.records_read == 1


def test_a_reader_too_far_behind_falls_back_to_the_snapshot() -> None:
    store = new_store()
    c = controller(store, 100)
    with_brokers(c)
    c.create_topic("events", 10, 3)
    reader = new_store(store.storage.url)
    held = reader.read_latest()
    reader.snapshots_read = 0
    for change in range(3 * RETAINED_VERSIONS):
        isr_change(c, "events", change % 10)
    assert store.read_record(c.image.version).controller_epoch == c.epoch
    assert held.version + 1 not in [
        int(i.path.rsplit("/", 1)[-1].removesuffix(".json"))
        for i in store.storage.list(METADATA_DIR)
    ]  # pruned
    assert reader.read_latest(held) == c.image
    assert reader.snapshots_read == 1


def test_a_successor_controller_continues_the_chain() -> None:
    store = new_store()
    first = controller(store, 100)
    with_brokers(first)
    first.create_topic("events", 10, 3)
    for change in range(2 * PRUNE_INTERVAL_VERSIONS + 5):
        isr_change(first, "events", change % 10)
    second = controller(store, 101)
    assert second.image.version == first.image.version + 1
    assert second.image.topics == first.image.topics
    for change in range(25):
        isr_change(second, "events", change % 10)
    assert new_store(store.storage.url).read_latest() == second.image


def test_a_deposed_controllers_delta_in_the_middle_of_the_chain_is_never_applied() -> None:
    """The old controller, paused, writes version V+1 after its successor claimed its epoch
    and read version V; the successor writes V+2 on V. V+1 (which adds broker 7) is no
    version of the valid history: no reader applies it, from a snapshot or from V+1 itself."""
    store = new_store()
    old = controller(store, 100)
    # every version below stays within SNAPSHOT_MIN_INTERVAL_VERSIONS of the first snapshot
    # (version 1), so that readers start below the stale version: two brokers, RF 2
    with_brokers(old, 2)
    old.create_topic("events", 10, 2)
    base = old.image
    seen_stale: list[MetadataImage] = []

    def paused_old_controller_writes() -> None:
        with pytest.raises(StaleControllerEpochError, match="epoch 2 was claimed"):
            old.register_broker(7, "127.0.0.1", 9107, None, "b7")
        # a broker reading now sees the deposed controller's version (not fenced yet)
        stale = new_store(store.storage.url).read_latest()
        assert stale.version == base.version + 1
        assert stale.broker(7) is not None
        seen_stale.append(stale)

    successor_store = new_store(store.storage.url)
    successor_store.after_read = paused_old_controller_writes
    new = controller(successor_store, 101)
    assert seen_stale
    assert new.image.version == base.version + 2
    record = store.read_record(new.image.version)
    assert isinstance(record, MetadataDelta)
    assert (record.base_version, record.base_epoch) == (base.version, 1)
    assert new.image.broker(7) is None

    # a broker that applied the stale version V+1 moves onto the valid chain
    assert store.read_latest(seen_stale[0]) == new.image
    # a fresh reader, from a snapshot older than the stale version, walks over it
    assert store.snapshot_versions()[-1] <= base.version
    assert new_store(store.storage.url).read_latest() == new.image
    for change in range(2):
        isr_change(new, "events", change)
    assert store.snapshot_versions()[-1] <= base.version
    assert new_store(store.storage.url).read_latest() == new.image
    assert store.read_latest(seen_stale[0]) == new.image
    assert new_store(store.storage.url).read_latest().broker(7) is None


def test_a_controller_that_reads_a_newer_epochs_version_at_activation_never_writes() -> None:
    """Standbys claim in a cascade: X claims epoch 2, Y claims 3 and writes before X reads.
    X reads Y's version: it is deposed already, and writes nothing after Y's version."""
    store = new_store()
    first = controller(store, 100)
    with_brokers(first)
    slow = new_store(store.storage.url)
    fast: list[Controller] = []
    slow.before_read = lambda: fast.append(controller(new_store(store.storage.url), 102))
    with pytest.raises(
        StaleControllerEpochError, match=r"claimed epoch 2, but .*epoch 3. wrote metadata"
    ):
        controller(slow, 101)
    epochs = [store.read_record(v).controller_epoch for v in range(1, store.latest_version() + 1)]
    assert epochs == sorted(epochs)  # no version of an older epoch after a newer one
    assert epochs[-1] == 3
    assert new_store(store.storage.url).read_latest() == fast[0].image


def test_a_deposed_controllers_delta_after_the_fence_is_skipped() -> None:
    store = new_store()
    old = controller(store, 100)
    with_brokers(old)
    new = controller(store, 101)
    head = new.image
    # the deposed controller's write after its successor's first version: a PUT that lands,
    # but whose claim check fails; it stays on storage
    stale = head.next(controller_epoch=1, controller_id=100).with_broker(BrokerInfo(7, "h", 1))
    with pytest.raises(StaleControllerEpochError):
        store.write(stale, head)
    assert store.latest_version() == head.version + 1
    assert new_store(store.storage.url).read_latest() == head
    assert store.read_latest(head) is head
    isr_free = new.image
    new.register_broker(5, "127.0.0.1", 9105, None, "b5")
    assert new.image.version == isr_free.version + 2  # over the deposed controller's version
    assert new_store(store.storage.url).read_latest() == new.image
    assert store.read_latest(head) == new.image


def test_a_deposed_controller_never_commits_a_pruned_version_with_deltas() -> None:
    store = new_store()
    old = controller(store, 100)
    new = controller(store, 101)  # old is paused and does not know
    with_brokers(new)
    for _ in range(2 * RETAINED_VERSIONS):
        new.register_broker(0, "127.0.0.1", 9100, None, "b0")
    head = store.read_latest()
    with pytest.raises(StaleControllerEpochError, match="epoch 2 was claimed"):
        old.register_broker(1, "127.0.0.1", 9101, None, "b1-old")
    assert new_store(store.storage.url).read_latest() == head == new.image


# --- upgrades: full images, then deltas -----------------------------------------------------------


def test_a_history_of_full_images_then_deltas_reads_as_one() -> None:
    store = new_store()
    store.claim(ControllerClaim(1, 100, "127.0.0.1", 9100))
    image = MetadataImage(version=1, controller_epoch=1, controller_id=100, cluster_id="c")
    for broker in range(3):
        image = store.write(image.next().with_broker(BrokerInfo(broker, "127.0.0.1", 9100)))
    # versions as an older replog wrote them: full images (format 5, and a format 3 one)
    image = store.write(image.next().with_topic(TopicInfo("t", "id", (part(0), part(1)))))
    doc = json.loads(image.to_bytes())
    doc["format_version"] = 3
    doc["version"] = image.version + 1
    del doc["broker_configs"]
    store.storage.put_if_absent(
        f"{METADATA_DIR}/{image.version + 1:020d}.json", json.dumps(doc).encode()
    )
    legacy_head = image.next()
    assert store.read_latest() == legacy_head
    assert store.snapshot_versions() == []

    upgraded = controller(store, 101)  # writes deltas from now on
    assert upgraded.image.topic("t") == legacy_head.topic("t")
    first = store.read_record(upgraded.image.version)
    assert isinstance(first, MetadataDelta)
    assert store.snapshot_versions() == [upgraded.image.version]  # the first snapshot at once
    isr_change(upgraded, "t", 0)
    # from the snapshot, and (without one) from the last full image
    assert new_store(store.storage.url).read_latest() == upgraded.image
    store.storage.delete(f"{SNAPSHOT_DIR}/{store.snapshot_versions()[0]:020d}.json")
    assert new_store(store.storage.url).read_latest() == upgraded.image
    # the full images are pruned like any version, once there is a snapshot
    for change in range(3 * RETAINED_VERSIONS):
        isr_change(upgraded, "t", change % 2)
    kept = len(store.storage.list(METADATA_DIR))
    assert kept <= RETAINED_VERSIONS + PRUNE_INTERVAL_VERSIONS
    assert all(
        isinstance(store.read_record(v), MetadataDelta)
        for v in range(upgraded.image.version - kept + 1, upgraded.image.version + 1)
    )
    assert new_store(store.storage.url).read_latest() == upgraded.image


def test_the_delta_format_is_the_version_objects_format() -> None:
    store = new_store()
    c = controller(store, 100)
    with_brokers(c)
    doc = json.loads(store.storage.read(f"{METADATA_DIR}/{c.image.version:020d}.json"))
    assert doc["format_version"] == DELTA_FORMAT_VERSION
    assert doc["brokers"]["upsert"] == [[2, "127.0.0.1", 9102, None, 1, False, "b2", []]]


def test_a_reader_catching_up_after_every_kind_of_controller_change_has_the_controllers_image() -> (
    None
):
    from replication.dynamic_config import DELETE, SET

    clock = Clock()
    store = new_store()
    c = Controller(store, 100, "127.0.0.1", 9100, time_ms=clock, session_timeout_ms=1_000)
    c.activate()
    reader = new_store(store.storage.url)
    held = reader.read_latest()

    def check() -> None:
        nonlocal held
        reader.snapshots_read = 0
        held = reader.read_latest(held)
        assert held == c.image
        assert [t.name for t in held.topics] == [t.name for t in c.image.topics]
        assert reader.snapshots_read == 0
        assert new_store(store.storage.url).read_latest() == c.image

    changes: list[Callable[[], object]] = [
        lambda: with_brokers(c, 4),
        lambda: c.create_topic("a", 4, 3),
        lambda: c.create_topic("b", 2, 2, [("retention.ms", "1000")]),
        lambda: c.create_topic("c", 1, 1),
        lambda: isr_change(c, "a", 2),
        lambda: c.create_partitions("a", 6),
        lambda: c.alter_topic_configs("a", [(SET, "retention.ms", "5000")]),
        lambda: c.alter_topic_configs("b", [(DELETE, "retention.ms", None)]),
        lambda: c.alter_broker_configs("", [(SET, "retention.ms", "7")]),
        lambda: c.alter_broker_configs("1", [(SET, "retention.ms", "8")]),
        lambda: c.allocate_producer_ids(),
        lambda: c.alter_partition_reassignments([("a", 0, [3, 2, 1])], throttled_rate=100),
        lambda: c.delete_topic("b"),
        lambda: c.create_topic("b", 3, 3),  # the same name, a new topic id
        lambda: c.register_broker(2, "127.0.0.1", 9202, None, "b2"),
    ]
    for change in changes:
        change()
        check()
    # brokers 0-2 heartbeat; broker 3's session expires: fenced, leaderships moved off it
    clock.now += 600
    for broker in range(3):
        c.heartbeat(broker, c.image.broker(broker).epoch, c.image.version)  # type: ignore[union-attr]
    clock.now += 600
    assert 3 in c.check_sessions()
    check()
    c.delete_topic("c")
    check()
