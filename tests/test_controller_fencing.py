"""Controller fencing when standbys race to take over, in process on one file:// store.

Each controller has its own MetadataStore and Storage on the same root, as separate processes
do. The interleavings are forced with the storage observer (called after every operation of
one controller's storage), so each test is deterministic.

The contract (DESIGN, "a stale controller cannot write"): once a controller epoch has written
its first metadata version, no version with an older epoch lands after it, and no reader (a
broker's or a later controller's ``read_latest``) ever takes a deposed controller's version.
A deposed controller's PUT may still land *below* its successor's first version (the store's
claim check then tells it that it is stale); the successor builds on whatever was newest.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from logstore.storage import Storage
from replication.controller.controller import Controller
from replication.errors import NotControllerError, StaleControllerEpochError
from replication.metadata.delta import MetadataDelta, decode_version
from replication.metadata.image import MetadataImage
from replication.metadata.store import METADATA_DIR, ControllerClaim, MetadataStore
from tests.faulty_fs import FaultyStorage, InjectedStorageError

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def controller(root: str, controller_id: int) -> Controller:
    store = MetadataStore(Storage.from_url(root))
    return Controller(store, controller_id, "127.0.0.1", 9000 + controller_id, time_ms=Clock())


def on_storage_op(c: Controller, op: str, action: Callable[[], object]) -> list[object]:
    """Run ``action`` once, right after the first ``op`` of ``c``'s storage; returns a list
    that holds the action's result once it ran."""
    ran: list[object] = []

    def observe(done: str, seconds: float, err: BaseException | None) -> None:
        if done == op and not ran:
            ran.append(action())

    c.store.storage.observer = observe
    return ran


def history(root: str) -> list[MetadataImage | MetadataDelta]:
    """Every metadata version on storage, in order (full images and deltas)."""
    store = MetadataStore(Storage.from_url(root))
    names = sorted(i.path for i in store.storage.list(METADATA_DIR))
    return [decode_version(store.storage.read(n)) for n in names]


def assert_epochs_never_go_back(root: str) -> None:
    """No version lands after the first version of a newer controller epoch."""
    images = history(root)
    for before, after in itertools.pairwise(images):
        assert after.controller_epoch >= before.controller_epoch, (
            f"metadata version {after.version} (controller epoch {after.controller_epoch}) was "
            f"written after version {before.version} of epoch "
            f"{before.controller_epoch}: a deposed controller wrote after its successor"
        )


def test_a_controller_overtaken_between_its_claim_and_its_first_version_writes_nothing(
    tmp_path: Path,
) -> None:
    """Two standbys take over at once: the slow one claims epoch 2, the fast one claims 3 and
    writes its first version before the slow one reads the head. The slow one must not build
    on its successor's version: it steps down without writing."""
    root = (tmp_path / "metadata").as_uri()
    first = controller(root, 100)
    first.activate()  # epoch 1: the controller that goes silent
    slow, fast = controller(root, 0), controller(root, 1)
    overtaken = on_storage_op(slow, "put_if_absent", fast.activate)  # right after slow's claim

    with pytest.raises(StaleControllerEpochError):
        slow.activate()
    assert overtaken
    assert fast.active
    assert fast.epoch == 3
    assert slow.epoch == 2
    assert not slow.active
    assert_epochs_never_go_back(root)
    assert [im.controller_epoch for im in history(root)] == [1, 3]  # slow wrote nothing
    assert fast.store.read_latest() == fast.image

    # a third controller claims epoch 4: before it writes, every reader takes epoch 3's head
    fast.store.claim(ControllerClaim(4, 2, "127.0.0.1", 9002))
    head = MetadataStore(Storage.from_url(root)).read_latest()
    assert (head.controller_id, head.controller_epoch) == (1, 3)
    assert head == fast.image


def test_a_controller_deposed_after_its_claim_check_gives_up_instead_of_writing_on(
    tmp_path: Path,
) -> None:
    """The slow standby's first PUT lands, then another standby claims epoch 3 before the
    slow one's claim check: the slow one learns it is stale. Its version stays below the
    successor's first version (the successor builds on it), and it writes nothing more."""
    root = (tmp_path / "metadata").as_uri()
    controller(root, 100).activate()
    slow, fast = controller(root, 0), controller(root, 1)
    puts = 0

    def observe(op: str, seconds: float, err: BaseException | None) -> None:
        nonlocal puts
        if op == "put_if_absent":
            puts += 1
            if puts == 2:  # slow's first version landed; epoch 3 is claimed before its check
                fast.store.claim(ControllerClaim(3, 2, "127.0.0.1", 9002))

    slow.store.storage.observer = observe
    with pytest.raises(StaleControllerEpochError, match="epoch 3 was claimed"):
        slow.activate()
    assert not slow.active
    assert puts == 2, "the deposed controller went on writing after it learned it was stale"
    assert [im.controller_epoch for im in history(root)] == [1, 2]

    fast.activate()  # epoch 4 (the holder of epoch 3 never wrote)
    assert fast.epoch == 4
    assert fast.image.version == 3
    assert_epochs_never_go_back(root)
    assert MetadataStore(Storage.from_url(root)).read_latest() == fast.image


def test_a_standby_takes_over_only_from_the_controller_it_found_silent(tmp_path: Path) -> None:
    """Three standbys find epoch 1 silent at once: the first claims epoch 2; the others lose
    the election instead of claiming epoch 3 and deposing a controller they never watched."""
    root = (tmp_path / "metadata").as_uri()
    controller(root, 100).activate()
    standbys = [controller(root, i) for i in range(3)]
    standbys[0].activate(after=1)
    for late in standbys[1:]:
        with pytest.raises(StaleControllerEpochError, match="epoch 2 was claimed"):
            late.activate(after=1)
        assert not late.active
    assert standbys[0].active
    assert standbys[0].epoch == 2
    store = MetadataStore(Storage.from_url(root))
    latest = store.latest_claim()
    assert latest is not None
    assert (latest.epoch, latest.controller_id) == (2, 0)
    assert [im.controller_epoch for im in history(root)] == [1, 2]
    assert store.read_latest() == standbys[0].image


def test_a_controller_whose_first_version_failed_is_not_active(tmp_path: Path) -> None:
    """A storage failure on the activation write (its outcome unknown) leaves the standby
    inactive, not answering as the controller from the empty image it held before. It takes
    over again with a new epoch, on top of whatever landed."""
    root = (tmp_path / "metadata").as_uri()
    first = controller(root, 100)
    first.activate()
    first.register_broker(0, "127.0.0.1", 9100, None, "a0")
    faulty = FaultyStorage(Storage.from_url(root))
    standby = Controller(MetadataStore(faulty), 1, "127.0.0.1", 9001, time_ms=Clock())
    faulty.fail("put_if_absent", after=True, path_prefix=METADATA_DIR)
    with pytest.raises(InjectedStorageError):
        standby.activate()
    assert not standby.active
    with pytest.raises(NotControllerError):
        standby.register_broker(7, "127.0.0.1", 9107, None, "r7")

    standby.activate()
    assert standby.epoch == 3
    assert standby.image.version == 4  # on top of epoch 2's version, which landed
    assert standby.image.broker(0) is not None
    assert_epochs_never_go_back(root)
