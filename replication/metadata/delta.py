"""Metadata deltas: one version object holds what changed since the version it follows.

A version object in the metadata store (see :mod:`replication.metadata.store`) is either a full
:class:`MetadataImage` (``format_version`` 1 to 5, as every version was before deltas) or a
:class:`MetadataDelta` (``format_version`` :data:`DELTA_FORMAT_VERSION`): the version and
controller epoch it was written at, the version and controller epoch of the image it follows
(its *base*, which is not always the version before it: a version a deposed controller wrote
in between is not a base), the scalar fields of the new image, and only what changed —

- brokers upserted (whole) and removed, by broker id;
- topics removed, and topics upserted: a new topic (or one deleted and created again under
  its name) whole; a changed topic as the partitions that changed, by index, plus its new
  partition count and, if they changed, its configs;
- the dynamic broker configs, whole, if they changed (one small entry per broker at most);
- the SCRAM credentials upserted and removed, by (user, mechanism), and the ACL bindings added
  and removed, each key present only if something changed (image format 7's security
  metadata; a replog from before it ignores the keys, and has no authorizer to fail open);
- the client quotas, whole, if they changed (image format 8's; a replog from before it
  ignores them and enforces none).

Changes are found by object identity first: images are immutable and an untouched topic, broker
or partition is the same object in both images, so a change costs what changed, not the
cluster size. Applying a delta keeps the order of topics and brokers (an upsert replaces in
place, a new one goes at the end); when the new image's order is not that, the delta carries
the order.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from logstore.errors import CorruptRecordError
from replication.metadata.image import (
    READABLE_FORMAT_VERSIONS,
    BrokerInfo,
    MetadataImage,
    PartitionState,
    TopicInfo,
    _broker,
    _partition,
    _partition_state,
    acl_binding,
    acl_fields,
    client_quota_fields,
    client_quotas_of,
    scram_credential,
    scram_fields,
)
from replication.security.scram import ScramCredential

#: the format of a delta version object (full images are formats 1 to 5, 7 and 8)
DELTA_FORMAT_VERSION = 6

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class MetadataDelta:
    """One delta version object, parsed (its changes are applied by :meth:`apply`)."""

    version: int
    controller_epoch: int
    #: the version and controller epoch of the image this delta is applied to (0: empty)
    base_version: int
    base_epoch: int
    changes: dict[str, Any]
    where: str = "metadata delta"

    def apply(self, base: MetadataImage) -> MetadataImage:
        """The image this delta makes of ``base`` (which must be its base version)."""
        if (base.version, base.controller_epoch) != (self.base_version, self.base_epoch):
            raise CorruptRecordError(
                f"{self.where}: delta of version {self.version} follows version "
                f"{self.base_version} (controller epoch {self.base_epoch}), not version "
                f"{base.version} (controller epoch {base.controller_epoch})"
            )
        c = self.changes
        try:
            brokers = _apply_keyed(
                base.brokers,
                [_broker(b) for b in c["brokers"]["upsert"]],
                {int(b) for b in c["brokers"]["remove"]},
                c["brokers"].get("order"),
                lambda b: b.broker_id,
            )
            upserts = c["topics"]["upsert"]
            topics = _apply_keyed(
                base.topics,
                [_topic(base.topic(str(t["name"])), t, self.where) for t in upserts],
                {str(n) for n in c["topics"]["remove"]},
                c["topics"].get("order"),
                lambda t: t.name,
            )
            broker_configs = base.broker_configs
            if "broker_configs" in c:
                broker_configs = tuple(
                    sorted(
                        (str(entity), tuple((str(k), str(v)) for k, v in configs))
                        for entity, configs in c["broker_configs"].items()
                    )
                )
            scram_credentials = base.scram_credentials
            if "scram" in c:
                scram_credentials = _apply_scram(
                    base.scram_credentials,
                    [scram_credential(f) for f in c["scram"]["upsert"]],
                    {(str(user), str(mechanism)) for user, mechanism in c["scram"]["remove"]},
                )
            acls = base.acls
            if "acls" in c:
                removed = {acl_binding(f) for f in c["acls"]["remove"]}
                acls = tuple(
                    sorted(
                        {b for b in base.acls if b not in removed}
                        | {acl_binding(f) for f in c["acls"]["add"]}
                    )
                )
            client_quotas = base.client_quotas
            if "client_quotas" in c:
                client_quotas = client_quotas_of(c["client_quotas"])
            return replace(
                base,
                version=self.version,
                controller_epoch=self.controller_epoch,
                controller_id=int(c["controller_id"]),
                cluster_id=str(c["cluster_id"]),
                next_producer_id=int(c["next_producer_id"]),
                brokers=brokers,
                topics=topics,
                broker_configs=broker_configs,
                scram_credentials=scram_credentials,
                acls=acls,
                client_quotas=client_quotas,
            )
        except (ValueError, KeyError, TypeError, IndexError) as err:
            raise CorruptRecordError(f"{self.where}: unreadable metadata delta: {err}") from err


def encode_delta(base: MetadataImage, image: MetadataImage) -> bytes:
    """The delta version object that makes ``image`` of ``base``."""
    doc: dict[str, Any] = {
        "format_version": DELTA_FORMAT_VERSION,
        "version": image.version,
        "controller_epoch": image.controller_epoch,
        "base_version": base.version,
        "base_epoch": base.controller_epoch,
        "controller_id": image.controller_id,
        "cluster_id": image.cluster_id,
        "next_producer_id": image.next_producer_id,
        "brokers": _diff_keyed(
            base.brokers,
            image.brokers,
            lambda b: b.broker_id,
            lambda old, new: None if old == new else _broker_fields(new),
        ),
        "topics": _diff_keyed(base.topics, image.topics, lambda t: t.name, _topic_change),
    }
    if image.broker_configs is not base.broker_configs and (
        image.broker_configs != base.broker_configs
    ):
        doc["broker_configs"] = {
            entity: [list(c) for c in configs] for entity, configs in image.broker_configs
        }
    if image.scram_credentials is not base.scram_credentials and (
        image.scram_credentials != base.scram_credentials
    ):
        doc["scram"] = _diff_scram(base.scram_credentials, image.scram_credentials)
    if image.acls is not base.acls and image.acls != base.acls:
        before, after = set(base.acls), set(image.acls)
        doc["acls"] = {
            "add": [acl_fields(b) for b in image.acls if b not in before],
            "remove": [acl_fields(b) for b in base.acls if b not in after],
        }
    if image.client_quotas is not base.client_quotas and (
        image.client_quotas != base.client_quotas
    ):
        doc["client_quotas"] = client_quota_fields(image.client_quotas)
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_version(data: bytes, *, where: str = "metadata") -> MetadataImage | MetadataDelta:
    """A version object: a full image (formats 1 to 5, 7, 8) or a delta (format 6)."""
    try:
        doc = json.loads(data)
        fmt = doc.get("format_version")
    except (ValueError, AttributeError) as err:
        raise CorruptRecordError(f"{where}: unreadable metadata: {err}") from err
    if fmt in READABLE_FORMAT_VERSIONS:
        return MetadataImage.from_bytes(data, where=where)
    if fmt != DELTA_FORMAT_VERSION:
        raise CorruptRecordError(
            f"{where}: metadata format_version {fmt!r} is not supported (this replog reads "
            f"{sorted({*READABLE_FORMAT_VERSIONS, DELTA_FORMAT_VERSION})}); upgrade replog"
        )
    try:
        return MetadataDelta(
            version=int(doc["version"]),
            controller_epoch=int(doc["controller_epoch"]),
            base_version=int(doc["base_version"]),
            base_epoch=int(doc["base_epoch"]),
            changes=doc,
            where=where,
        )
    except (KeyError, TypeError, ValueError) as err:
        raise CorruptRecordError(f"{where}: unreadable metadata delta: {err}") from err


# --- diffs of keyed sequences (brokers by id, topics by name) ----------------------------------


def _diff_keyed(
    old: Sequence[T],
    new: Sequence[T],
    key: Callable[[T], K],
    change: Callable[[T | None, T], Any],
) -> dict[str, Any]:
    """Upserts (``change(old, new)`` of each item not identical to the old one of its key, if
    not None), removals, and the order if applying those to ``old`` would not give ``new``'s."""
    if old is new:
        return {"upsert": [], "remove": []}
    before = {key(item): item for item in old}
    upsert = []
    added: list[K] = []
    for item in new:
        k = key(item)
        was = before.get(k)
        if was is item:
            continue
        if was is None:
            added.append(k)
        entry = change(was, item)
        if entry is not None:
            upsert.append(entry)
    after = {key(item) for item in new}
    remove = [k for k in before if k not in after]
    doc: dict[str, Any] = {"upsert": upsert, "remove": remove}
    gone = set(remove)
    applied = [k for k in before if k not in gone] + added
    if applied != [key(item) for item in new]:
        doc["order"] = [key(item) for item in new]
    return doc


def _apply_keyed(
    old: tuple[T, ...],
    upserts: list[T],
    removed: set[Any],
    order: list[Any] | None,
    key: Callable[[T], Any],
) -> tuple[T, ...]:
    if not upserts and not removed and order is None:
        return old
    changed = {key(item): item for item in upserts}
    out = [changed.pop(key(item), item) for item in old if key(item) not in removed]
    out += changed.values()  # the new ones, in the delta's order
    if order is not None:
        by_key = {key(item): item for item in out}
        out = [by_key[k] for k in order]
    return tuple(out)


def _broker_fields(b: BrokerInfo) -> list[Any]:
    return [
        b.broker_id,
        b.host,
        b.port,
        b.rack,
        b.epoch,
        b.fenced,
        b.incarnation,
        [list(e) for e in b.endpoints],
    ]


def _topic_change(old: TopicInfo | None, new: TopicInfo) -> dict[str, Any] | None:
    if old is None or old.topic_id != new.topic_id:
        return {
            "name": new.name,
            "id": new.topic_id,
            "configs": [list(c) for c in new.configs],
            "partitions": [_partition(p) for p in new.partitions],
        }
    was = old.partitions
    changed = [
        [index, _partition(state)]
        for index, (before, state) in enumerate(zip(was, new.partitions, strict=False))
        if before is not state and before != state
    ]
    changed += [
        [index, _partition(new.partitions[index])] for index in range(len(was), len(new.partitions))
    ]
    entry: dict[str, Any] = {
        "name": new.name,
        "id": new.topic_id,
        "count": len(new.partitions),
        "changed": changed,
    }
    if new.configs != old.configs:
        entry["configs"] = [list(c) for c in new.configs]
    elif not changed and len(new.partitions) == len(was):
        return None
    return entry


def _topic(old: TopicInfo | None, doc: dict[str, Any], where: str) -> TopicInfo:
    name, topic_id = str(doc["name"]), str(doc["id"])
    configs = None if "configs" not in doc else tuple((str(k), str(v)) for k, v in doc["configs"])
    if "partitions" in doc:  # the whole topic
        return TopicInfo(
            name, topic_id, tuple(_partition_state(p) for p in doc["partitions"]), configs or ()
        )
    if old is None or old.topic_id != topic_id:
        raise CorruptRecordError(
            f"{where}: the delta changes partitions of topic {name!r} (id {topic_id}), which the "
            "image it follows does not have"
        )
    count = int(doc["count"])
    parts: list[PartitionState | None] = [*old.partitions[:count]]
    parts += [None] * (count - len(parts))
    for index, fields in doc["changed"]:
        parts[int(index)] = _partition_state(fields)
    if any(p is None for p in parts):
        raise CorruptRecordError(
            f"{where}: the delta grows topic {name!r} to {count} partitions without the new ones"
        )
    return TopicInfo(
        name,
        topic_id,
        tuple(p for p in parts if p is not None),
        old.configs if configs is None else configs,
    )


# --- the security metadata: credentials by (user, mechanism), ACLs as a set -------------------


def _diff_scram(
    old: tuple[ScramCredential, ...], new: tuple[ScramCredential, ...]
) -> dict[str, Any]:
    before = {(c.user, c.mechanism): c for c in old}
    after = {(c.user, c.mechanism) for c in new}
    return {
        "upsert": [scram_fields(c) for c in new if before.get((c.user, c.mechanism)) != c],
        "remove": [list(k) for k in before if k not in after],
    }


def _apply_scram(
    old: tuple[ScramCredential, ...],
    upserts: list[ScramCredential],
    removed: set[tuple[str, str]],
) -> tuple[ScramCredential, ...]:
    by_key = {(c.user, c.mechanism): c for c in old if (c.user, c.mechanism) not in removed}
    by_key.update({(c.user, c.mechanism): c for c in upserts})
    return tuple(by_key[k] for k in sorted(by_key))
