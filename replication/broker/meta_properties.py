"""``meta.properties``: which cluster and which node a broker's ``log.dir`` belongs to.

As Kafka's: the first start of a broker on an empty ``log.dir`` writes the cluster's id (the
metadata image's, minted by the first active controller) and the broker's ``node.id`` into a
``meta.properties`` object at the root of its storage, in Kafka's format
(``key=value`` lines). Every later start checks them before the broker registers or touches a
replica: a broker started against another cluster's metadata (a different
``metadata.log.dir``, say) would otherwise take that cluster's image for its own and delete
the replicas it does not name as strays. A mismatch refuses to start, naming both ids and the
directory. The broker also sends its stored id in its registration, so the controller refuses
it too (INCONSISTENT_CLUSTER_ID) when the metadata it reads at start had no cluster yet.

Written with ``put_if_absent``: on object storage two processes starting on one ``log.dir``
cannot both write their own id.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar

from logstore.errors import ConfigError, ObjectExistsError, ObjectNotFoundError, StorageError
from logstore.storage import Storage
from replication.errors import InconsistentClusterIdError

__all__ = ["META_PROPERTIES", "MetaProperties", "check", "read", "write"]

#: the object's name at the root of a broker's log.dir, as Kafka names the file in a log dir
META_PROPERTIES: Final = "meta.properties"
#: Kafka's meta.properties version for KRaft nodes
VERSION: Final = 1
#: attempts at a read or write that meets a transient storage error (about 8 s in all)
RETRIES: Final = 12

_T = TypeVar("_T")

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MetaProperties:
    cluster_id: str
    node_id: int

    def encode(self) -> bytes:
        return (
            "# written by replog at this log.dir's first start; do not edit\n"
            f"cluster.id={self.cluster_id}\nnode.id={self.node_id}\nversion={VERSION}\n"
        ).encode()

    @classmethod
    def decode(cls, data: bytes, where: str) -> MetaProperties:
        values: dict[str, str] = {}
        for line in data.decode("utf-8", "replace").splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "!")) and "=" in line:
                key, _, value = line.partition("=")
                values[key.strip()] = value.strip()
        try:
            return cls(values["cluster.id"], int(values["node.id"]))
        except (KeyError, ValueError):
            raise ConfigError(
                f"{where} is not a meta.properties replog can read (it needs cluster.id and a "
                f"numeric node.id; found keys {sorted(values)}): restore it, or start this "
                "broker on an empty log.dir"
            ) from None


def read(storage: Storage) -> MetaProperties | None:
    """The log.dir's meta.properties; None on a log.dir that has none yet."""
    try:
        data = _retrying(lambda: storage.read(META_PROPERTIES))
    except ObjectNotFoundError:
        return None
    return MetaProperties.decode(data, _where(storage))


def write(storage: Storage, meta: MetaProperties) -> MetaProperties:
    """Write ``meta`` unless the log.dir has one already; what the log.dir holds after."""
    try:
        _retrying(lambda: storage.put_if_absent(META_PROPERTIES, meta.encode()))
    except ObjectExistsError:  # another start's, or this one's own retried write
        found = read(storage)
        assert found is not None  # meta.properties is never deleted
        return found
    return meta


def _retrying(call: Callable[[], _T]) -> _T:
    """``call``, again after a transient storage error (up to RETRIES times, backing off):
    object stores fail requests now and then, and a broker should not fail its start on one,
    where Kafka's local file read would have no such failure to ride out."""
    for attempt in range(RETRIES):
        try:
            return call()
        except StorageError as err:
            if not err.retriable or attempt == RETRIES - 1:
                raise
            pause = min(0.05 * 2**attempt, 1.0)  # in a thread of its own, not on the loop
            log.warning("%s failed (attempt %d), again in %.0f ms: %s", META_PROPERTIES,
                        attempt + 1, pause * 1000, err)  # fmt: skip
            time.sleep(pause)
    raise AssertionError("unreachable")


def check(stored: MetaProperties, cluster_id: str, node_id: int, storage: Storage) -> None:
    """Refuse a log.dir that belongs to another cluster or another node."""
    where = _where(storage)
    if stored.node_id != node_id:
        raise ConfigError(
            f"{where} belongs to node.id {stored.node_id}, but this broker is node.id "
            f"{node_id}: give this broker its own log.dir, or start it with "
            f"node.id={stored.node_id}"
        )
    if cluster_id and stored.cluster_id != cluster_id:
        raise InconsistentClusterIdError(
            f"{where} belongs to cluster {stored.cluster_id}, but the metadata this broker "
            f"reads is cluster {cluster_id}: point metadata.log.dir at cluster "
            f"{stored.cluster_id}'s metadata (every node of a cluster shares one), or start "
            "this broker on an empty log.dir to join the other"
        )


def _where(storage: Storage) -> str:
    return f"log.dir {storage.url} ({META_PROPERTIES})"
