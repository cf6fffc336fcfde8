"""ACLs as Kafka's ``org.apache.kafka.common.acl``: a binding allows or denies a principal,
from a host, an operation on a resource pattern (a literal name, a prefix, or ``*``).

Codes are Kafka's wire values (CreateAcls, DescribeAcls and DeleteAcls carry them)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Final

__all__ = [
    "CLUSTER_NAME",
    "WILDCARD",
    "AclBinding",
    "AclBindingFilter",
    "AclOperation",
    "AclPermissionType",
    "PatternType",
    "ResourceType",
]

#: The one cluster resource's name (Kafka's ``kafka-cluster``).
CLUSTER_NAME: Final = "kafka-cluster"
#: A literal resource name or principal or host matching every one.
WILDCARD: Final = "*"


class ResourceType(IntEnum):
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(IntEnum):
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(IntEnum):
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class AclPermissionType(IntEnum):
    ANY = 1
    DENY = 2
    ALLOW = 3


@dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    """One ACL: ``permission`` for ``principal`` (``User:alice`` or ``User:*``) from ``host``
    (an address or ``*``) to do ``operation`` on resources of ``resource_type`` whose name is
    ``resource_name`` (LITERAL; ``*`` is every one) or starts with it (PREFIXED)."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """Which bindings DescribeAcls lists and DeleteAcls removes (Kafka's AclBindingFilter):
    ANY and None match everything; pattern type MATCH matches the bindings that apply to the
    named resource (literal, wildcard, and prefixes of it)."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermissionType = AclPermissionType.ANY
