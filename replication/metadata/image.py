"""The cluster metadata image: brokers, topics, partition assignments, leaders, ISRs, the
security metadata (SCRAM credentials, ACLs) and the client quotas.

One immutable :class:`MetadataImage` per metadata version. The controller writes each new
version to the metadata store; brokers apply versions in order. The image is a frozen,
versioned model (``format_version``) so a newer replog can refuse or migrate an older file.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from logstore.errors import CorruptRecordError
from replication.security.acl import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from replication.security.scram import ScramCredential

#: 2 added each broker's incarnation; version 1 files are read with an unknown incarnation.
#: 3 added each broker's other listeners (endpoints); older files are read with none.
#: 4 added dynamic broker configs (cluster default and per broker); older files have none.
#: 5 added partition reassignments (adding and removing replicas, the catch-up throttle) as
#: three optional trailing fields of a partition; older files are read with none in progress.
#: (6 is not an image: it is the format of a delta, :mod:`replication.metadata.delta`.)
#: 7 added the security metadata: SCRAM credentials and ACLs; older files are read with none.
#: An image with neither is still written as format 5 (it is exactly that), so a cluster that
#: uses no security stays readable by a replog from before format 7 (a rolling upgrade).
#: 8 added client quotas (Kafka's ClientQuotaRecord); older files are read with none. An image
#: without quotas is still written as format 7 (or 5, as above).
FORMAT_VERSION = 8
READABLE_FORMAT_VERSIONS = frozenset({1, 2, 3, 4, 5, 7, 8})
#: the newest format an image without security metadata needs
_PLAIN_FORMAT_VERSION = 5
#: the newest format an image without client quotas needs
_SECURITY_FORMAT_VERSION = 7
NO_LEADER = -1
#: A client quota entity: its (entity type, name) components sorted by type, a name of None
#: for the default entity (``(("client-id", None), ("user", "alice"))``: alice's clients
#: without a quota of their own)
QuotaEntity = tuple[tuple[str, str | None], ...]
#: The entity name of the cluster-wide default broker configs (Kafka's ``--entity-default``;
#: a broker's own dynamic configs are under its id, as a string).
DEFAULT_BROKER_ENTITY = ""


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    broker_id: int
    host: str
    port: int
    rack: str | None = None
    #: bumped at every registration of this broker id (Kafka's broker epoch)
    epoch: int = 0
    fenced: bool = False
    #: the process that holds this registration (a new one at every broker start); a new
    #: incarnation lost whatever its predecessor had not flushed
    incarnation: str = ""
    #: the broker's listeners other than replog's own (host, port): (name, host, port), e.g.
    #: ("KAFKA", host, port) for the Kafka protocol listener
    endpoints: tuple[tuple[str, str, int], ...] = ()

    def endpoint(self, name: str) -> tuple[str, int] | None:
        """(host, port) of the listener ``name``, if this broker has one."""
        for listener, host, port in self.endpoints:
            if listener == name:
                return host, port
        return None


@dataclass(frozen=True, slots=True)
class PartitionState:
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int = 0
    #: versions every change of this partition's ISR or leadership (Kafka's partition epoch)
    partition_epoch: int = 0
    #: a reassignment in progress (KIP-455): replicas joining, which catch up as followers ...
    adding_replicas: tuple[int, ...] = ()
    #: ... and replicas leaving once every target replica is in the ISR
    removing_replicas: tuple[int, ...] = ()
    #: bytes/s the adding replicas fetch at while they catch up (0: no throttle here; the
    #: broker's follower.replication.throttled.rate applies)
    throttled_rate: int = 0

    @property
    def reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)

    @property
    def target_replicas(self) -> tuple[int, ...]:
        """The replicas once the reassignment in progress completes (or the replicas)."""
        return tuple(r for r in self.replicas if r not in self.removing_replicas)

    @property
    def original_replicas(self) -> tuple[int, ...]:
        """The replicas before the reassignment in progress (what a cancel goes back to)."""
        return tuple(r for r in self.replicas if r not in self.adding_replicas)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: str
    partitions: tuple[PartitionState, ...]
    configs: tuple[tuple[str, str], ...] = ()

    def config_map(self) -> dict[str, str]:
        return dict(self.configs)


@dataclass(frozen=True, slots=True)
class MetadataImage:
    version: int = 0
    controller_epoch: int = 0
    controller_id: int = -1
    cluster_id: str = ""
    brokers: tuple[BrokerInfo, ...] = ()
    topics: tuple[TopicInfo, ...] = ()
    #: first producer id not yet handed out (ids are allocated in blocks by the controller)
    next_producer_id: int = 0
    #: dynamic broker configs set with AlterConfigs: (entity, ((key, value), ...)) sorted by
    #: entity, where the entity is DEFAULT_BROKER_ENTITY (every broker) or a broker id
    broker_configs: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    format_version: int = FORMAT_VERSION
    #: SCRAM credentials (salted and hashed, never a password), sorted by (user, mechanism);
    #: kept out of the repr all the same
    scram_credentials: tuple[ScramCredential, ...] = field(default=(), repr=False)
    #: the ACL bindings, sorted (the authorizer indexes this tuple, rebuilt only when the
    #: tuple is another object: untouched, it is the same object in every following version)
    acls: tuple[AclBinding, ...] = ()
    #: client quotas set with AlterClientQuotas: (entity, ((key, value), ...)), both sorted
    client_quotas: tuple[tuple[QuotaEntity, tuple[tuple[str, float], ...]], ...] = ()
    _topic_index: dict[str, TopicInfo] = field(default_factory=dict, compare=False, repr=False)
    #: (the credentials tuple it indexes, the index): valid while that tuple is this image's
    _scram_index: tuple[tuple[ScramCredential, ...], dict[tuple[str, str], ScramCredential]] = (
        field(default=((), {}), compare=False, repr=False)
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_topic_index", {t.name: t for t in self.topics})

    def topic(self, name: str) -> TopicInfo | None:
        return self._topic_index.get(name)

    def broker(self, broker_id: int) -> BrokerInfo | None:
        for b in self.brokers:
            if b.broker_id == broker_id:
                return b
        return None

    def with_topic(self, topic: TopicInfo) -> MetadataImage:
        """This image with ``topic`` added at the end, or replacing the topic of its name in
        place (the order of topics is kept, so a metadata delta need not carry it)."""
        if topic.name not in self._topic_index:
            return replace(self, topics=(*self.topics, topic))
        return replace(
            self, topics=tuple(topic if t.name == topic.name else t for t in self.topics)
        )

    def without_topic(self, name: str) -> MetadataImage:
        return replace(self, topics=tuple(t for t in self.topics if t.name != name))

    def broker_config_map(self, entity: str) -> dict[str, str]:
        """The dynamic configs of one broker entity (a broker id, or the cluster default)."""
        return _entry_map(self.broker_configs, entity)

    def with_broker_configs(self, entity: str, configs: dict[str, str]) -> MetadataImage:
        """This image with the dynamic configs of ``entity`` replaced (none: removed)."""
        entries = _with_entry(self.broker_configs, entity, configs)
        return replace(self, broker_configs=tuple(sorted(entries)))

    def without_broker(self, broker_id: int) -> MetadataImage:
        return replace(self, brokers=tuple(b for b in self.brokers if b.broker_id != broker_id))

    def with_broker(self, broker: BrokerInfo) -> MetadataImage:
        others = tuple(b for b in self.brokers if b.broker_id != broker.broker_id)
        return replace(self, brokers=tuple(sorted((*others, broker), key=lambda b: b.broker_id)))

    # --- security -------------------------------------------------------------------------------

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        """The credential of ``user`` for SCRAM ``mechanism`` (``SCRAM-SHA-256``), if any
        (what the SASL server looks up at each login: one dict lookup)."""
        indexed, index = self._scram_index
        if indexed is not self.scram_credentials:
            index = {(c.user, c.mechanism): c for c in self.scram_credentials}
            object.__setattr__(self, "_scram_index", (self.scram_credentials, index))
        return index.get((user, mechanism))

    def with_scram_credentials(
        self,
        upserts: Iterable[ScramCredential] = (),
        deletions: Iterable[tuple[str, str]] = (),
    ) -> MetadataImage:
        """This image with credentials added or replaced (by user and mechanism) and the
        (user, mechanism) pairs in ``deletions`` removed."""
        by_key = {(c.user, c.mechanism): c for c in self.scram_credentials}
        for user, mechanism in deletions:
            by_key.pop((user, mechanism), None)
        for c in upserts:
            by_key[(c.user, c.mechanism)] = c
        return replace(self, scram_credentials=tuple(by_key[k] for k in sorted(by_key)))

    def with_acls(self, acls: Iterable[AclBinding]) -> MetadataImage:
        """This image with ``acls`` as its ACL bindings (deduplicated, sorted)."""
        return replace(self, acls=tuple(sorted(set(acls))))

    # --- client quotas ------------------------------------------------------------------------

    def client_quota_map(self, entity: QuotaEntity) -> dict[str, float]:
        """The quotas of one entity (none: an empty dict)."""
        return _entry_map(self.client_quotas, entity)

    def with_client_quotas(self, entity: QuotaEntity, values: dict[str, float]) -> MetadataImage:
        """This image with the quotas of ``entity`` replaced (none: removed)."""
        entries = _with_entry(self.client_quotas, entity, values)
        return replace(self, client_quotas=tuple(sorted(entries, key=_quota_sort_key)))

    def next(self, **changes: Any) -> MetadataImage:
        """The following version with ``changes`` applied."""
        return replace(self, version=self.version + 1, **changes)

    # --- serialization ---------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        security = bool(self.scram_credentials or self.acls)
        if self.client_quotas:
            format_version = self.format_version
        elif security:
            format_version = min(self.format_version, _SECURITY_FORMAT_VERSION)
        else:
            format_version = min(self.format_version, _PLAIN_FORMAT_VERSION)
        doc: dict[str, Any] = {
            "format_version": format_version,
            "version": self.version,
            "controller_epoch": self.controller_epoch,
            "controller_id": self.controller_id,
            "cluster_id": self.cluster_id,
            "next_producer_id": self.next_producer_id,
            "brokers": [
                [
                    b.broker_id,
                    b.host,
                    b.port,
                    b.rack,
                    b.epoch,
                    b.fenced,
                    b.incarnation,
                    [list(e) for e in b.endpoints],
                ]
                for b in self.brokers
            ],
            "topics": [
                {
                    "name": t.name,
                    "id": t.topic_id,
                    "configs": [list(c) for c in t.configs],
                    "partitions": [_partition(p) for p in t.partitions],
                }
                for t in self.topics
            ],
            "broker_configs": {
                entity: [list(c) for c in configs] for entity, configs in self.broker_configs
            },
        }
        if security:
            doc["scram"] = [scram_fields(c) for c in self.scram_credentials]
            doc["acls"] = [acl_fields(b) for b in self.acls]
        if self.client_quotas:
            doc["client_quotas"] = client_quota_fields(self.client_quotas)
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str = "metadata") -> MetadataImage:
        try:
            doc = json.loads(data)
            if doc.get("format_version") not in READABLE_FORMAT_VERSIONS:
                raise CorruptRecordError(
                    f"{where}: metadata format_version {doc.get('format_version')!r} is not "
                    f"supported (this replog reads {sorted(READABLE_FORMAT_VERSIONS)}); "
                    "upgrade replog"
                )
            return cls(
                version=int(doc["version"]),
                controller_epoch=int(doc["controller_epoch"]),
                controller_id=int(doc["controller_id"]),
                cluster_id=str(doc["cluster_id"]),
                next_producer_id=int(doc["next_producer_id"]),
                brokers=tuple(_broker(b) for b in doc["brokers"]),
                topics=tuple(
                    TopicInfo(
                        name=str(t["name"]),
                        topic_id=str(t["id"]),
                        configs=tuple((str(k), str(v)) for k, v in t["configs"]),
                        partitions=tuple(_partition_state(p) for p in t["partitions"]),
                    )
                    for t in doc["topics"]
                ),
                broker_configs=tuple(  # formats 1 to 3 had no dynamic broker configs
                    sorted(
                        (str(entity), tuple((str(k), str(v)) for k, v in configs))
                        for entity, configs in doc.get("broker_configs", {}).items()
                    )
                ),
                # formats 1 to 5 had no security metadata
                scram_credentials=tuple(
                    sorted(
                        (scram_credential(f) for f in doc.get("scram", ())),
                        key=lambda c: (c.user, c.mechanism),
                    )
                ),
                acls=tuple(sorted(acl_binding(f) for f in doc.get("acls", ()))),
                # formats 1 to 7 had no client quotas
                client_quotas=client_quotas_of(doc.get("client_quotas", ())),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise CorruptRecordError(f"{where}: unreadable metadata: {err}") from err


def _partition(p: PartitionState) -> list[Any]:
    fields: list[Any] = [list(p.replicas), list(p.isr), p.leader, p.leader_epoch, p.partition_epoch]
    if p.reassigning or p.throttled_rate:
        fields += [list(p.adding_replicas), list(p.removing_replicas), p.throttled_rate]
    return fields


def _partition_state(fields: list[Any]) -> PartitionState:
    replicas, isr, leader, leader_epoch, partition_epoch, *rest = fields
    adding, removing, throttled_rate = rest if rest else ((), (), 0)  # before format 5: none
    return PartitionState(
        tuple(int(r) for r in replicas),
        tuple(int(r) for r in isr),
        int(leader),
        int(leader_epoch),
        int(partition_epoch),
        tuple(int(r) for r in adding),
        tuple(int(r) for r in removing),
        int(throttled_rate),
    )


def _broker(fields: list[Any]) -> BrokerInfo:
    broker_id, host, port, rack, epoch, fenced, *rest = fields
    incarnation = str(rest[0]) if rest else ""  # format 1 had no incarnation
    endpoints = tuple(  # formats 1 and 2 had no other listeners
        (str(name), str(ehost), int(eport)) for name, ehost, eport in (rest[1] if rest[1:] else ())
    )
    return BrokerInfo(
        int(broker_id),
        str(host),
        int(port),
        rack,
        int(epoch),
        bool(fenced),
        incarnation,
        endpoints,
    )


def scram_fields(c: ScramCredential) -> list[Any]:
    return [
        c.user,
        c.mechanism,
        c.iterations,
        base64.b64encode(c.salt).decode(),
        base64.b64encode(c.stored_key).decode(),
        base64.b64encode(c.server_key).decode(),
    ]


def scram_credential(fields: list[Any]) -> ScramCredential:
    user, mechanism, iterations, salt, stored_key, server_key = fields
    return ScramCredential(
        str(user),
        str(mechanism),
        int(iterations),
        base64.b64decode(salt, validate=True),
        base64.b64decode(stored_key, validate=True),
        base64.b64decode(server_key, validate=True),
    )


def acl_fields(b: AclBinding) -> list[Any]:
    return [
        int(b.resource_type),
        b.resource_name,
        int(b.pattern_type),
        b.principal,
        b.host,
        int(b.operation),
        int(b.permission),
    ]


def acl_binding(fields: list[Any]) -> AclBinding:
    rtype, name, pattern, principal, host, operation, permission = fields
    return AclBinding(
        ResourceType(int(rtype)),
        str(name),
        PatternType(int(pattern)),
        str(principal),
        str(host),
        AclOperation(int(operation)),
        AclPermissionType(int(permission)),
    )


_E = TypeVar("_E")
_V = TypeVar("_V")
#: entities, each with its (key, value) pairs: broker configs, client quotas
_Entries = tuple[tuple[_E, tuple[tuple[str, _V], ...]], ...]


def _entry_map(entries: _Entries[_E, _V], entity: _E) -> dict[str, _V]:
    """The (key, value) pairs of ``entity`` in a tuple of (entity, pairs), as a dict."""
    for name, values in entries:
        if name == entity:
            return dict(values)
    return {}


def _with_entry(
    entries: _Entries[_E, _V], entity: _E, values: dict[str, _V]
) -> list[tuple[_E, tuple[tuple[str, _V], ...]]]:
    """``entries`` with those of ``entity`` replaced by ``values`` (none: removed), unsorted."""
    others = [(n, v) for n, v in entries if n != entity]
    if values:
        others.append((entity, tuple(sorted(values.items(), key=lambda kv: kv[0]))))
    return others


def _quota_sort_key(item: tuple[QuotaEntity, Any]) -> list[tuple[str, str]]:
    # None (the default entity) sorts before every name
    return [(kind, "" if name is None else "\x00" + name) for kind, name in item[0]]


def client_quota_fields(
    quotas: tuple[tuple[QuotaEntity, tuple[tuple[str, float], ...]], ...],
) -> list[Any]:
    return [[[list(c) for c in entity], [list(v) for v in values]] for entity, values in quotas]


def client_quotas_of(
    fields: Iterable[Any],
) -> tuple[tuple[QuotaEntity, tuple[tuple[str, float], ...]], ...]:
    entries = [
        (
            tuple(sorted((str(kind), None if n is None else str(n)) for kind, n in entity)),
            tuple(sorted((str(k), float(v)) for k, v in values)),
        )
        for entity, values in fields
    ]
    return tuple(sorted(entries, key=_quota_sort_key))
