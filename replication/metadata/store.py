"""The metadata store: controller epochs and the versioned metadata log on object storage.

Layout under the cluster's metadata root::

    controller/<epoch:020d>.json   one claim per controller epoch, written put-if-absent
    metadata/<version:020d>.json   one full MetadataImage per version, written put-if-absent

A controller becomes active by creating the claim of epoch N+1; only one creator can win. It
then advances the metadata by creating version V+1. A stale controller (one that lost its epoch
while paused) tries to create a version that its successor already created and fails with
:class:`StaleControllerEpochError`: it can never write. There is no ZooKeeper and no extra
server; each write is one conditional PUT, so this is used for metadata changes only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import asdict, dataclass

from logstore.errors import ObjectExistsError, ObjectNotFoundError
from logstore.storage import Storage
from replication.errors import StaleControllerEpochError
from replication.metadata.image import MetadataImage

log = logging.getLogger(__name__)

CONTROLLER_DIR = "controller"
#: how far back a reader looks past versions written by a deposed controller
MAX_STALE_VERSIONS = 100
METADATA_DIR = "metadata"


@dataclass(frozen=True, slots=True)
class ControllerClaim:
    epoch: int
    controller_id: int
    host: str
    port: int
    claimed_ms: int = 0
    #: unique per controller process start, so a restarted controller knows its old claim
    incarnation: str = ""

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ControllerClaim:
        return cls(**json.loads(data))


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

    # --- controller epochs ------------------------------------------------------------------

    def latest_claim(self) -> ControllerClaim | None:
        epochs = _numbers(self.storage, CONTROLLER_DIR)
        if not epochs:
            return None
        return ControllerClaim.from_bytes(self.storage.read(_name(CONTROLLER_DIR, epochs[-1])))

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
        while True:
            try:
                self.storage.put_if_absent(_name(METADATA_DIR, image.version), image.to_bytes())
                return image
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

    def prune(self, keep: int = 100) -> int:
        """Delete all but the newest ``keep`` metadata versions."""
        versions = _numbers(self.storage, METADATA_DIR)
        doomed = versions[:-keep] if keep else versions
        for version in doomed:
            self.storage.delete(_name(METADATA_DIR, version))
        return len(doomed)
