"""The metadata store: controller epochs and the versioned metadata log on object storage.

Layout under the cluster's metadata root::

    controller/<epoch:020d>.json   one claim per controller epoch, written put-if-absent
    metadata/<version:020d>.json   one version object per version, written put-if-absent: the
                                   delta from the version it follows (format 6), or, as
                                   written before deltas, a full MetadataImage (formats 1-5)
    snapshot/<version:020d>.json   the full image of committed version <version>

A controller becomes active by creating the claim of epoch N+1; only one creator can win. It
then advances the metadata by creating version V+1. A stale controller (one that lost its epoch
while paused) tries to create a version that its successor already created and fails with
:class:`StaleControllerEpochError`: it can never write. There is no ZooKeeper and no extra
server; each write is one conditional PUT, so this is used for metadata changes only.

The active controller prunes old versions (:meth:`MetadataStore.prune`), so the directory every
refresh lists stays bounded. Pruning frees version numbers a put-if-absent would accept again:
a controller paused for longer than the retained history could re-create a pruned version and
take it for a commit. So every write checks, after its PUT, that no controller has claimed a
newer epoch (claims are numbered without gaps and never pruned: one per failover). Kafka's
KRaft fences by the Raft log instead; object storage gives us put-if-absent and this check.

A PUT that lands and then fails the claim check is refused to its writer, but the object stays:
if it landed before the successor's first version, the successor builds on it (it is part of
the history from then on, though its writer was told it failed). Nothing may land *after* a
successor's first version, and two rules in the controller see to it: a controller activates
on the head it reads after its claim and steps down without writing if a newer epoch wrote
that head; and a standby claims exactly the epoch after the one it found silent, so it never
deposes a controller it has not watched. In version order, controller epochs never go back.

Deltas and snapshots, as KRaft has records and snapshots. A full image per version made every
change cost the cluster size (at 10,000 partitions: a 240 kB image, ~24 ms to serialize, per
ISR change) and made every broker read and parse it all at every version. So a version object
holds what changed (:mod:`replication.metadata.delta`): the scalar fields, the brokers and
topics upserted or removed, a changed topic's changed partitions only. The fencing above is
untouched: a delta is still one put-if-absent of the version's name, then the claim check.

Each delta names its *base*, the version and controller epoch of the image it was computed
from. The base is not always the version before it: when a deposed controller's version took
V+1 after its successor read V, the successor writes V+2 on V. So the valid history is a chain
followed backwards from the valid head (the head rule of :meth:`MetadataStore.read_latest` is
unchanged) through the bases; a deposed controller's version off that chain is never applied.
A version number names one object, hence one image, as long as it is retained (a pruned number
re-created by a stale controller fails its claim check, lies far below every head, and no
valid delta names it as a base); each step also checks the base's controller epoch.

The controller that committed a version writes its full image as a snapshot (a plain PUT of
derived data, after the commit) when none exists, at least every
:data:`PRUNE_INTERVAL_VERSIONS`, and sooner (not before :data:`SNAPSHOT_MIN_INTERVAL_VERSIONS`)
when the deltas since the last one outgrow it. A reader that holds an image on the chain
applies only the deltas after it; any other reader (a broker starting, a controller
activating, a reader whose version was pruned or was a deposed controller's) reads the
newest snapshot on the chain and the deltas after it, checking the snapshot against the
controller epoch the chain names for it. So a broker's start reads O(the bound) objects,
as before. Pruning keeps the newest :data:`RETAINED_SNAPSHOTS` snapshots and the versions from
the older of them or from head - :data:`RETAINED_VERSIONS`, whichever is older; with no
snapshot yet (a store written before deltas) nothing is pruned, and a full-image version
object ends a chain as a snapshot does, so a history of full images then deltas reads as one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from logstore.errors import KafkaStorageError, ObjectExistsError, ObjectNotFoundError
from logstore.storage import Storage
from replication.errors import StaleControllerEpochError
from replication.metadata.delta import MetadataDelta, decode_version, encode_delta
from replication.metadata.image import MetadataImage

log = logging.getLogger(__name__)

Record = MetadataImage | MetadataDelta

CONTROLLER_DIR = "controller"
#: how far back a reader looks past versions written by a deposed controller
MAX_STALE_VERSIONS = 100
METADATA_DIR = "metadata"
#: full images of committed versions, where a reader starts before applying deltas
SNAPSHOT_DIR = "snapshot"
#: versions kept by :meth:`MetadataStore.prune` (more than a reader may look back)
RETAINED_VERSIONS = 2 * MAX_STALE_VERSIONS
#: the controller prunes once every this many versions, and writes a snapshot at least as often
PRUNE_INTERVAL_VERSIONS = 100
#: ... and more often when the deltas since the last snapshot outgrow it, but not more often
#: than once every this many versions
SNAPSHOT_MIN_INTERVAL_VERSIONS = 10
#: snapshots kept: the newest, and the one before it for a reader that listed before it came
RETAINED_SNAPSHOTS = 2
#: the claim document's format; version 0 is a claim written before it had the field
CLAIM_FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class ControllerClaim:
    epoch: int
    controller_id: int
    host: str
    port: int
    claimed_ms: int = 0
    #: unique per controller process start, so a restarted controller knows its old claim
    incarnation: str = ""
    format_version: int = CLAIM_FORMAT_VERSION

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "controller claim") -> ControllerClaim:
        try:
            doc = json.loads(data)
            version = doc.pop("format_version", 0)
            if version not in (0, CLAIM_FORMAT_VERSION):
                raise KafkaStorageError(
                    f"{where}: claim format_version {version!r} is newer than this replog reads "
                    f"({CLAIM_FORMAT_VERSION}); upgrade replog on this node"
                )
            return cls(**doc)
        except (ValueError, TypeError, AttributeError) as err:
            raise KafkaStorageError(f"{where}: not a controller claim ({err})") from err


def _name(directory: str, number: int) -> str:
    return f"{directory}/{number:020d}.json"


def _numbers(storage: Storage, directory: str) -> list[int]:
    out = []
    for info in storage.list(directory):
        stem = info.path.rsplit("/", 1)[-1].removesuffix(".json")
        if stem.isdigit():
            out.append(int(stem))
    return sorted(out)


class MetadataStore:
    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        #: told how long each :meth:`write` took, in seconds, whatever its outcome (the
        #: controller's ``replog_metadata_write_duration_seconds``)
        self.on_write: Callable[[float], None] | None = None
        #: the size of the last version object :meth:`write` created
        self.last_write_bytes = 0

    # --- controller epochs ------------------------------------------------------------------

    def latest_claim(self) -> ControllerClaim | None:
        epochs = _numbers(self.storage, CONTROLLER_DIR)
        if not epochs:
            return None
        name = _name(CONTROLLER_DIR, epochs[-1])
        return ControllerClaim.from_bytes(self.storage.read(name), f"{self.storage.url}/{name}")

    def claim(self, claim: ControllerClaim) -> None:
        """Create the claim of ``claim.epoch``; StaleControllerEpochError if someone has it."""
        try:
            self.storage.put_if_absent(_name(CONTROLLER_DIR, claim.epoch), claim.to_bytes())
        except ObjectExistsError as err:
            raise StaleControllerEpochError(
                f"controller epoch {claim.epoch} was claimed by another controller"
            ) from err

    # --- metadata versions ------------------------------------------------------------------

    def latest_version(self) -> int:
        versions = _numbers(self.storage, METADATA_DIR)
        return versions[-1] if versions else 0

    def read_record(self, version: int) -> MetadataImage | MetadataDelta:
        """Version object ``version`` as stored: a full image (format 5 or older) or a delta."""
        name = _name(METADATA_DIR, version)
        return decode_version(self.storage.read(name), where=f"{self.storage.url}/{name}")

    def snapshot_versions(self) -> list[int]:
        """The versions that have a snapshot (a full image), oldest first."""
        return _numbers(self.storage, SNAPSHOT_DIR)

    def snapshot_size(self, version: int) -> int:
        """The bytes of the snapshot of ``version`` (0 if it is gone: pruned meanwhile)."""
        try:
            return self.storage.size(_name(SNAPSHOT_DIR, version))
        except ObjectNotFoundError:
            return 0

    def read_snapshot(self, version: int) -> MetadataImage:
        name = _name(SNAPSHOT_DIR, version)
        return MetadataImage.from_bytes(self.storage.read(name), where=f"{self.storage.url}/{name}")

    def write_snapshot(self, image: MetadataImage) -> int:
        """Write the full image of committed version ``image.version``; returns its size.

        Only the controller that committed the version writes it, after the commit (derived
        data: a reader checks it against the controller epoch the deltas name for it).
        """
        data = image.to_bytes()
        self.storage.write(_name(SNAPSHOT_DIR, image.version), data)
        return len(data)

    def delete_snapshot(self, version: int) -> None:
        self.storage.delete(_name(SNAPSHOT_DIR, version))

    def read_latest(self, since: MetadataImage | None = None) -> MetadataImage:
        """The newest valid image (an empty image at version 0 if there is none).

        A version written by a deposed controller after its successor's first version (its
        fence) carries an older controller epoch and is skipped: the valid head is the newest
        version written at the newest claimed epoch, or, before the newest claimant has
        written anything, simply the newest version.

        The head is built from the chain of deltas that leads to it (each names the version it
        follows): from ``since`` (an image this reader already holds) if the chain passes
        through it, otherwise from the newest snapshot (or full image) on the chain.
        """
        for _ in range(3):
            try:
                return self._read_latest(since)
            except ObjectNotFoundError as err:  # pruned while we read: start again
                log.info("metadata changed while being read (%s); reading again", err)
                since = None
        return self._read_latest(None)

    def _read_latest(self, since: MetadataImage | None) -> MetadataImage:
        records: dict[int, MetadataImage | MetadataDelta] = {}

        def record(version: int) -> MetadataImage | MetadataDelta:
            if version not in records:
                records[version] = self.read_record(version)
            return records[version]

        newest = self.latest_version()
        if newest == 0:
            return MetadataImage()
        # A newer version may appear between the list and the read: follow it.
        while self.storage.exists(_name(METADATA_DIR, newest + 1)):
            newest += 1
        head = self._valid_head(newest, record)
        if since is not None and (since.version, since.controller_epoch) == (
            head,
            record(head).controller_epoch,
        ):
            return since
        if since is not None and since.version < head:
            image = self._build(head, record, since, [])
            if image is not None:
                return image
        return self._build(head, record, None, self.snapshot_versions()) or MetadataImage()

    def _valid_head(self, newest: int, record: Callable[[int], Record]) -> int:
        claim = self.latest_claim()
        head = record(newest)
        if claim is None or head.controller_epoch >= claim.epoch:
            return newest
        version = newest - 1
        while version > 0 and newest - version <= MAX_STALE_VERSIONS:
            try:
                image = record(version)
            except ObjectNotFoundError:
                break
            if image.controller_epoch >= claim.epoch:
                return version
            if image.controller_epoch < head.controller_epoch:
                break  # past the stale stretch without meeting the new epoch: not fenced yet
            version -= 1
        return newest

    def _build(
        self,
        head: int,
        record: Callable[[int], Record],
        since: MetadataImage | None,
        snapshots: list[int],
    ) -> MetadataImage | None:
        """The image of version ``head``: its chain of deltas walked back to ``since`` (None if
        the chain does not pass through it), a snapshot, a full image, or the empty version 0;
        then applied forward."""
        chain: list[MetadataDelta] = []
        have = set(snapshots)
        version, epoch = head, record(head).controller_epoch
        while True:
            if since is not None:
                if version < since.version:
                    return None  # ``since`` is not on the chain (a deposed controller's)
                if version == since.version:
                    if since.controller_epoch != epoch:
                        return None
                    base = since
                    break
            if version == 0:
                base = MetadataImage()
                break
            if version in have:
                base = self.read_snapshot(version)
                if (base.version, base.controller_epoch) != (version, epoch):
                    raise KafkaStorageError(
                        f"{self.storage.url}/{_name(SNAPSHOT_DIR, version)}: snapshot of version "
                        f"{base.version} at controller epoch {base.controller_epoch} does not "
                        f"match metadata version {version} at controller epoch {epoch}"
                    )
                break
            found = record(version)
            if isinstance(found, MetadataImage):  # a full image (written before deltas)
                base = found
                break
            if found.base_version >= version:
                raise KafkaStorageError(
                    f"{self.storage.url}/{_name(METADATA_DIR, version)}: metadata delta of "
                    f"version {version} follows version {found.base_version}, not an older one"
                )
            chain.append(found)
            version, epoch = found.base_version, found.base_epoch
        for delta in reversed(chain):
            base = delta.apply(base)
        return base

    def write(self, image: MetadataImage, base: MetadataImage | None = None) -> MetadataImage:
        """Create version ``image.version`` (or the next free one, if the version is taken by
        a deposed controller with an older epoch); returns the image as written.

        With ``base`` (the image ``image`` follows), the version object is the delta from it;
        without, the full image. Raises StaleControllerEpochError if a controller with an
        epoch at least ours wrote it.
        """
        started = time.perf_counter()
        try:
            return self._write(image, base)
        finally:
            if self.on_write is not None:
                self.on_write(time.perf_counter() - started)

    def _write(self, image: MetadataImage, base: MetadataImage | None) -> MetadataImage:
        while True:
            data = image.to_bytes() if base is None else encode_delta(base, image)
            try:
                self.storage.put_if_absent(_name(METADATA_DIR, image.version), data)
            except ObjectExistsError as err:
                other = self.read_record(image.version)
                if other.controller_epoch >= image.controller_epoch:
                    raise StaleControllerEpochError(
                        f"metadata version {image.version} was written by controller epoch "
                        f"{other.controller_epoch}; this controller (epoch "
                        f"{image.controller_epoch}) is stale"
                    ) from err
                log.warning(
                    "skipping metadata version %d, written by deposed controller epoch %d",
                    image.version,
                    other.controller_epoch,
                )
                image = dataclasses.replace(image, version=image.version + 1)
                continue
            self.last_write_bytes = len(data)
            # The PUT may have re-created a version pruned long ago: it only counts if no
            # controller has claimed a newer epoch (see the module docstring).
            successor = image.controller_epoch + 1
            if image.controller_epoch and self.storage.exists(_name(CONTROLLER_DIR, successor)):
                raise StaleControllerEpochError(
                    f"controller epoch {successor} was claimed; this controller (epoch "
                    f"{image.controller_epoch}) is stale and its metadata version "
                    f"{image.version} does not count"
                )
            return image

    def prune(self, below: int) -> int:
        """Delete the metadata versions older than ``below`` (or than the older snapshot kept,
        if that is older: a reader may start there) and every snapshot but the newest
        :data:`RETAINED_SNAPSHOTS`; returns how many went.

        Only the active controller prunes, after a commit, keeping at least
        :data:`RETAINED_VERSIONS` (what a reader may look back past a deposed controller's
        versions, or be behind and catch up by deltas). Nothing is pruned while there is no
        snapshot. Claims are never pruned: there is one per failover, and :meth:`write`
        relies on them.
        """
        snapshots = self.snapshot_versions()
        if not snapshots:
            return 0
        keep = snapshots[-RETAINED_SNAPSHOTS:]
        below = min(below, keep[0])
        doomed = [_name(METADATA_DIR, v) for v in _numbers(self.storage, METADATA_DIR) if v < below]
        doomed += [_name(SNAPSHOT_DIR, v) for v in snapshots if v < keep[0]]
        for name in doomed:
            self.storage.delete(name)
        return len(doomed)
