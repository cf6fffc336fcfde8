"""ACLs as Kafka's ``org.apache.kafka.common.acl``: a binding allows or denies a principal,
from a host, an operation on a resource pattern (a literal name, a prefix, or ``*``).

Codes are Kafka's wire values (CreateAcls, DescribeAcls and DeleteAcls carry them).

Matching is Kafka's: a LITERAL binding applies to the resource of its name, or to every
resource of its type when the name is ``*``; a PREFIXED binding applies to every resource whose
name starts with it. A binding's principal ``User:*`` and host ``*`` match anyone. A filter
(DescribeAcls, DeleteAcls) selects bindings: ANY and None match everything, and pattern type
MATCH selects the bindings that apply to the named resource.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Final, TypeVar

from replication.errors import InvalidRequestError

__all__ = [
    "CLUSTER_NAME",
    "WILDCARD",
    "WILDCARD_PRINCIPAL",
    "AclBinding",
    "AclBindingFilter",
    "AclOperation",
    "AclPermissionType",
    "PatternType",
    "ResourceType",
    "code",
]

#: The one cluster resource's name (Kafka's ``kafka-cluster``).
CLUSTER_NAME: Final = "kafka-cluster"
#: A literal resource name or principal or host matching every one.
WILDCARD: Final = "*"
#: The principal of a binding that applies to every principal (Kafka's wildcard principal).
WILDCARD_PRINCIPAL: Final = "User:*"


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

    @classmethod
    def from_wire(
        cls,
        resource_type: int,
        resource_name: str,
        pattern_type: int,
        principal: str,
        host: str,
        operation: int,
        permission: int,
    ) -> AclBinding:
        """A binding from the codes of a CreateAcls entry, validated (InvalidRequestError
        names what is wrong)."""
        binding = cls(
            code(ResourceType, resource_type),
            resource_name,
            code(PatternType, pattern_type),
            principal,
            host,
            code(AclOperation, operation),
            code(AclPermissionType, permission),
        )
        binding.validate()
        return binding

    def applies_to(self, resource_type: ResourceType, name: str) -> bool:
        """Does this binding's resource pattern cover the resource ``resource_type`` ``name``?"""
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name in (name, WILDCARD)

    def matches_principal(self, principal: str, host: str) -> bool:
        """Does this binding name ``principal`` (``User:alice``) connecting from ``host``?"""
        return self.principal in (principal, WILDCARD_PRINCIPAL) and self.host in (host, WILDCARD)

    def validate(self) -> None:
        """Refuse what Kafka's CreateAcls refuses: filter-only values (ANY, MATCH), a cluster
        resource not named ``kafka-cluster``, an empty name, a principal not TYPE:NAME.
        InvalidRequestError names the field and what to use instead."""
        if self.resource_type not in _BINDING_RESOURCE_TYPES:
            raise InvalidRequestError(
                f"ACL resource type {_name(ResourceType, self.resource_type)} is not one an ACL "
                "can name: use TOPIC, GROUP, CLUSTER or TRANSACTIONAL_ID"
            )
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidRequestError(
                f"ACL pattern type {_name(PatternType, self.pattern_type)} is only for filters: "
                "an ACL is LITERAL or PREFIXED"
            )
        if self.operation == AclOperation.ANY:
            raise InvalidRequestError(
                f"ACL operation {_name(AclOperation, self.operation)} is only for filters: name "
                "an operation (READ, WRITE, ..., or ALL)"
            )
        if self.permission not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
            raise InvalidRequestError(
                f"ACL permission type {_name(AclPermissionType, self.permission)} is only for "
                "filters: an ACL is ALLOW or DENY"
            )
        if not self.resource_name:
            raise InvalidRequestError("ACL resource name is empty: name a resource (or * for all)")
        if self.resource_type == ResourceType.CLUSTER and self.resource_name != CLUSTER_NAME:
            raise InvalidRequestError(
                f"ACL on the cluster names {self.resource_name!r}: the cluster resource is "
                f"named {CLUSTER_NAME!r}"
            )
        kind, sep, who = self.principal.partition(":")
        if not sep or not kind or not who:
            raise InvalidRequestError(
                f"ACL principal {self.principal!r} is not TYPE:NAME: use e.g. User:alice or User:*"
            )
        if not self.host:
            raise InvalidRequestError("ACL host is empty: name an address, or * for any host")


_BINDING_RESOURCE_TYPES: Final = frozenset(
    {ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID}
)


E = TypeVar("E", bound=IntEnum)


def code(enum: type[E], value: int) -> E:
    """``enum(value)``, or InvalidRequestError naming the field and the known codes."""
    try:
        return enum(value)
    except ValueError:
        raise InvalidRequestError(
            f"{enum.__name__} code {value} is unknown: use one of "
            + ", ".join(f"{m.name} ({m.value})" for m in enum)
        ) from None


def _name(enum: type[IntEnum], value: int) -> str:
    try:
        return enum(value).name
    except ValueError:
        return f"code {value}"


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

    @classmethod
    def from_wire(
        cls,
        resource_type: int,
        resource_name: str | None,
        pattern_type: int,
        principal: str | None,
        host: str | None,
        operation: int,
        permission: int,
    ) -> AclBindingFilter:
        """A filter from the codes of DescribeAcls or a DeleteAcls entry (InvalidRequestError
        for an unknown code)."""
        return cls(
            code(ResourceType, resource_type),
            resource_name,
            code(PatternType, pattern_type),
            principal,
            host,
            code(AclOperation, operation),
            code(AclPermissionType, permission),
        )

    def matches(self, binding: AclBinding) -> bool:
        """Does ``binding`` pass this filter (Kafka's ``AclBindingFilter.matches``)?"""
        if self.resource_type != ResourceType.ANY and self.resource_type != binding.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH, binding.pattern_type):
            return False
        if self.resource_name is not None:
            if self.pattern_type in (PatternType.ANY, binding.pattern_type):
                if self.resource_name != binding.resource_name:
                    return False
            elif binding.pattern_type == PatternType.PREFIXED:  # MATCH
                if not self.resource_name.startswith(binding.resource_name):
                    return False
            elif binding.resource_name not in (self.resource_name, WILDCARD):  # MATCH, LITERAL
                return False
        return (
            (self.principal is None or self.principal == binding.principal)
            and (self.host is None or self.host == binding.host)
            and self.operation in (AclOperation.ANY, binding.operation)
            and self.permission in (AclPermissionType.ANY, binding.permission)
        )
