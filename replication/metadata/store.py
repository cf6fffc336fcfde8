"""The metadata store: controller epochs and the versioned metadata log on object storage.

Layout under the cluster's metadata root::

    controller/<epoch:020d>.json   one claim per controller epoch, written put-if-absent
    metadata/<version:020d>.json   one full MetadataImage per version, written put-if-absent

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
from replication.metadata.image import MetadataImage

log = logging.getLogger(__name__)

CONTROLLER_DIR = "controller"
#: how far back a reader looks past versions written by a deposed controller
MAX_STALE_VERSIONS = 100
METADATA_DIR = "metadata"
#: versions kept by :meth:`MetadataStore.prune` (more than a reader may look back)
RETAINED_VERSIONS = 2 * MAX_STALE_VERSIONS
#: the controller prunes once every this many versions
PRUNE_INTERVAL_VERSIONS = 100
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

    def read(self, version: int) -> MetadataImage:
        name = _name(METADATA_DIR, version)
        return MetadataImage.from_bytes(self.storage.read(name), where=f"{self.storage.url}/{name}")

    def read_latest(self) -> MetadataImage:
        """The newest valid image (an empty image at version 0 if there is none).

        A version written by a deposed controller after its successor's first version (its
        fence) carries an older controller epoch and is skipped: the valid head is the newest
        version written at the newest claimed epoch, or, before the newest claimant has
        written anything, simply the newest version.
        """
        newest = self.latest_version()
        if newest == 0:
            return MetadataImage()
        # A newer version may appear between the list and the read: follow it.
        while self.storage.exists(_name(METADATA_DIR, newest + 1)):
            newest += 1
        claim = self.latest_claim()
        head = self.read(newest)
        if claim is None or head.controller_epoch >= claim.epoch:
            return head
        version = newest - 1
        while version > 0 and newest - version <= MAX_STALE_VERSIONS:
            try:
                image = self.read(version)
            except ObjectNotFoundError:
                break
            if image.controller_epoch >= claim.epoch:
                return image
            if image.controller_epoch < head.controller_epoch:
                break  # past the stale stretch without meeting the new epoch: not fenced yet
            version -= 1
        return head

    def write(self, image: MetadataImage) -> MetadataImage:
        """Create version ``image.version`` (or the next free one, if the version is taken by
        a deposed controller with an older epoch); returns the image as written.

        Raises StaleControllerEpochError if a controller with an epoch at least ours wrote it.
        """
        started = time.perf_counter()
        try:
            return self._write(image)
        finally:
            if self.on_write is not None:
                self.on_write(time.perf_counter() - started)

    def _write(self, image: MetadataImage) -> MetadataImage:
        while True:
            try:
                self.storage.put_if_absent(_name(METADATA_DIR, image.version), image.to_bytes())
            except ObjectExistsError as err:
                other = self.read(image.version)
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
        """Delete the metadata versions older than ``below``; returns how many went.

        Only the active controller prunes, after a commit, keeping at least
        :data:`RETAINED_VERSIONS` (what a reader may look back past a deposed controller's
        versions). Claims are never pruned: there is one per failover, and :meth:`write`
        relies on them.
        """
        doomed = [v for v in _numbers(self.storage, METADATA_DIR) if v < below]
        for version in doomed:
            self.storage.delete(_name(METADATA_DIR, version))
        return len(doomed)
