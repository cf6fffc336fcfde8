"""The metadata store on object storage: bounded history, and fencing that survives pruning.

In process, on memory storage: a controller commits versions, prunes the old ones, and a
controller deposed long ago (paused past the retained history) can still never commit.
"""

from __future__ import annotations

import json
import uuid

import pytest

from logstore.errors import KafkaStorageError
from logstore.storage import Storage
from replication.controller.controller import Controller
from replication.errors import NotControllerError, StaleControllerEpochError
from replication.metadata.store import (
    CLAIM_FORMAT_VERSION,
    CONTROLLER_DIR,
    METADATA_DIR,
    PRUNE_INTERVAL_VERSIONS,
    RETAINED_VERSIONS,
    ControllerClaim,
    MetadataStore,
)

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def new_store() -> MetadataStore:
    return MetadataStore(Storage.from_url(f"memory://metadata-{uuid.uuid4().hex}/meta"))


def active_controller(store: MetadataStore, controller_id: int) -> Controller:
    c = Controller(store, controller_id, "127.0.0.1", 9000 + controller_id, time_ms=Clock())
    c.activate()
    return c


def versions(store: MetadataStore) -> list[int]:
    return sorted(
        int(i.path.rsplit("/", 1)[-1].removesuffix(".json"))
        for i in store.storage.list(METADATA_DIR)
    )


def commit_many(c: Controller, n: int) -> None:
    """``n`` metadata versions: broker 0 registering again (a new broker epoch each time)."""
    for _ in range(n):
        c.register_broker(0, "127.0.0.1", 9100, None, "a0")


def test_the_controller_keeps_the_metadata_directory_bounded() -> None:
    store = new_store()
    c = active_controller(store, 100)
    commit_many(c, 3 * RETAINED_VERSIONS)
    kept = versions(store)
    head = c.image.version
    assert head > 3 * RETAINED_VERSIONS
    assert len(kept) <= RETAINED_VERSIONS + PRUNE_INTERVAL_VERSIONS
    assert kept == list(range(kept[0], head + 1))  # the newest ones, without holes
    assert store.read_latest() == c.image
    # a controller that takes over reads the head from the pruned store
    successor = active_controller(store, 101)
    assert successor.image.version == head + 1
    assert successor.image.broker(0) is not None


def test_a_controller_deposed_before_pruning_cannot_commit_a_pruned_version() -> None:
    store = new_store()
    old = active_controller(store, 100)
    stale_version = old.image.version
    new = active_controller(store, 101)  # old is paused and does not know
    commit_many(new, 2 * RETAINED_VERSIONS)
    assert stale_version + 1 not in versions(store)  # pruned: a PUT there would succeed
    head = store.read_latest()

    with pytest.raises(StaleControllerEpochError, match="epoch 2 was claimed"):
        old.register_broker(1, "127.0.0.1", 9101, None, "b1")
    assert not old.active
    with pytest.raises(NotControllerError):
        old.register_broker(1, "127.0.0.1", 9101, None, "b1")
    assert store.read_latest() == head  # the head is the new controller's, unchanged
    assert head.broker(1) is None


def test_claims_carry_a_format_version_and_old_claims_still_read() -> None:
    store = new_store()
    active_controller(store, 100)
    doc = json.loads(store.storage.read(f"{CONTROLLER_DIR}/{1:020d}.json"))
    assert doc["format_version"] == CLAIM_FORMAT_VERSION

    legacy = {k: v for k, v in doc.items() if k != "format_version"}
    assert ControllerClaim.from_bytes(json.dumps(legacy).encode()).controller_id == 100

    newer = json.dumps({**doc, "format_version": CLAIM_FORMAT_VERSION + 1}).encode()
    with pytest.raises(KafkaStorageError, match=r"newer than this replog reads.*upgrade"):
        ControllerClaim.from_bytes(newer, "claim 1")
    with pytest.raises(KafkaStorageError, match="claim 1: not a controller claim"):
        ControllerClaim.from_bytes(b'{"epoch": 1, "colour": "red"}', "claim 1")
