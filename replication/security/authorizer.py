"""What decides whether a principal may do an operation on a resource.

:class:`Authorizer` is the interface request handlers call (through the session of the
connection, :mod:`.principal`). Kafka's rules hold: super.users may do everything; DENY beats
ALLOW; ALLOW of Read, Write, Delete or Alter implies Describe, and AlterConfigs implies
DescribeConfigs; with no ACL on a resource, deny unless allow.everyone.if.no.acl.found.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Final, Protocol

from logstore.errors import ConfigError
from replication.security.acl import (
    WILDCARD,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from replication.security.config import SecurityConfig
from replication.security.principal import Session

__all__ = [
    "ACCEPTED_CLASS_NAMES",
    "STANDARD_AUTHORIZER",
    "Authorizer",
    "StandardAuthorizer",
    "authorizer_from",
    "super_users",
]


class Authorizer(Protocol):
    def authorize(
        self, session: Session, operation: AclOperation, resource_type: ResourceType, name: str
    ) -> bool:
        """May ``session`` do ``operation`` on the resource ``resource_type`` ``name``?"""
        ...

    def authorize_any(
        self, session: Session, operation: AclOperation, resource_type: ResourceType
    ) -> bool:
        """May ``session`` do ``operation`` on at least one resource of ``resource_type``
        (Kafka's authorizeByResourceType, for InitProducerId without a transactional id)?"""
        ...


#: authorizer.class.name values that mean :class:`StandardAuthorizer` (Kafka's KRaft one, and
#: the ZooKeeper-era one, whose ACL semantics are the same)
STANDARD_AUTHORIZER: Final = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
ACCEPTED_CLASS_NAMES: Final = frozenset(
    {STANDARD_AUTHORIZER, "kafka.security.authorizer.AclAuthorizer"}
)

#: operations an ALLOW of another operation implies (Kafka's AclEntry.supportedOperations
#: rules): Describe by Read, Write, Delete, Alter; DescribeConfigs by AlterConfigs
_IMPLIED_BY: Final = {
    AclOperation.DESCRIBE: frozenset(
        {
            AclOperation.DESCRIBE,
            AclOperation.READ,
            AclOperation.WRITE,
            AclOperation.DELETE,
            AclOperation.ALTER,
            AclOperation.ALL,
        }
    ),
    AclOperation.DESCRIBE_CONFIGS: frozenset(
        {AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS, AclOperation.ALL}
    ),
}


def super_users(config: SecurityConfig) -> frozenset[str]:
    """The principals of super.users (``User:admin;User:broker``)."""
    return frozenset(u.strip() for u in config.super_users.split(";") if u.strip())


class StandardAuthorizer:
    """Kafka's StandardAuthorizer over one set of ACL bindings (those of one metadata image).

    The bindings are indexed once: literal ones by (resource type, name), ``*`` among them,
    prefixed ones by (resource type, prefix), so a check looks up the name, the wildcard and
    each prefix of the name (a few dict lookups, whatever the number of ACLs).
    """

    def __init__(self, config: SecurityConfig, acls: Iterable[AclBinding] = ()) -> None:
        self.super_users = super_users(config)
        self.allow_everyone_if_no_acl_found = config.allow_everyone_if_no_acl_found
        self.acls = tuple(acls)
        self._literal: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        self._prefixed: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        self._by_type: dict[ResourceType, list[AclBinding]] = {}
        for binding in self.acls:
            index = (
                self._prefixed if binding.pattern_type == PatternType.PREFIXED else self._literal
            )
            index.setdefault((binding.resource_type, binding.resource_name), []).append(binding)
            self._by_type.setdefault(binding.resource_type, []).append(binding)
        self._prefix_lengths = {
            rtype: sorted({len(name) for t, name in self._prefixed if t == rtype})
            for rtype in {t for t, _ in self._prefixed}
        }

    def _bindings(self, resource_type: ResourceType, name: str) -> list[AclBinding]:
        """Every binding that applies to the resource, whoever it names."""
        out = [
            *self._literal.get((resource_type, name), ()),
            *(self._literal.get((resource_type, WILDCARD), ()) if name != WILDCARD else ()),
        ]
        for length in self._prefix_lengths.get(resource_type, ()):
            if length > len(name):
                break
            out += self._prefixed.get((resource_type, name[:length]), ())
        return out

    def _privileged(self, session: Session) -> bool:
        return session.internal or str(session.principal) in self.super_users

    def authorize(
        self, session: Session, operation: AclOperation, resource_type: ResourceType, name: str
    ) -> bool:
        if self._privileged(session):
            return True
        bindings = self._bindings(resource_type, name)
        if not bindings:
            return self.allow_everyone_if_no_acl_found
        principal = str(session.principal)
        implied = _IMPLIED_BY.get(operation, frozenset({operation, AclOperation.ALL}))
        allowed = False
        for b in bindings:
            if not b.matches_principal(principal, session.host):
                continue
            if b.permission == AclPermissionType.DENY:
                if b.operation in (operation, AclOperation.ALL):
                    return False  # DENY beats any ALLOW
            elif b.permission == AclPermissionType.ALLOW and b.operation in implied:
                allowed = True
        return allowed

    def authorize_any(
        self, session: Session, operation: AclOperation, resource_type: ResourceType
    ) -> bool:
        """Kafka's ``Authorizer.authorizeByResourceType``: allowed if some ALLOW of
        ``operation`` (or ALL) on a resource of the type is not covered by a DENY (a literal
        DENY of the same name, or a prefixed DENY of a prefix of it); a wildcard DENY denies
        and a wildcard ALLOW allows. Super users are allowed, and so is everyone, with
        allow.everyone.if.no.acl.found, if no ACL names the type at all (Kafka checks a
        made-up resource name for both)."""
        if self.authorize(session, operation, resource_type, "hardcode"):
            return True
        principal = str(session.principal)
        deny: dict[PatternType, set[str]] = {
            PatternType.LITERAL: set(),
            PatternType.PREFIXED: set(),
        }
        allow: dict[PatternType, set[str]] = {
            PatternType.LITERAL: set(),
            PatternType.PREFIXED: set(),
        }
        wildcard_allow = False
        for b in self._by_type.get(resource_type, ()):
            if not b.matches_principal(principal, session.host):
                continue
            if b.operation not in (operation, AclOperation.ALL):
                continue
            literal_wildcard = b.pattern_type == PatternType.LITERAL and b.resource_name == WILDCARD
            if b.permission == AclPermissionType.DENY:
                if literal_wildcard:
                    return False
                deny[b.pattern_type].add(b.resource_name)
            elif b.permission == AclPermissionType.ALLOW:
                if literal_wildcard:
                    wildcard_allow = True
                else:
                    allow[b.pattern_type].add(b.resource_name)
        if wildcard_allow:
            return True
        for pattern_type, names in allow.items():
            for name in names:
                if pattern_type == PatternType.LITERAL and name in deny[PatternType.LITERAL]:
                    continue
                if any(name[:i] in deny[PatternType.PREFIXED] for i in range(1, len(name) + 1)):
                    continue
                return True
        return False


class _ImageAuthorizer:
    """A StandardAuthorizer over the ACLs of the current metadata: rebuilt when the tuple of
    bindings ``acls()`` returns is another object (a metadata image keeps its tuple until an
    ACL changes, so this costs one identity check per request)."""

    def __init__(self, config: SecurityConfig, acls: Callable[[], tuple[AclBinding, ...]]) -> None:
        self._config = config
        self._acls = acls
        self._current = StandardAuthorizer(config, ())
        self._lock = threading.Lock()

    def current(self) -> StandardAuthorizer:
        acls = self._acls()
        current = self._current
        if current.acls is acls:
            return current
        with self._lock:
            if self._current.acls is not acls:
                built = StandardAuthorizer(self._config, acls)
                built.acls = acls  # the very tuple, for the identity check
                self._current = built
            return self._current

    def authorize(
        self, session: Session, operation: AclOperation, resource_type: ResourceType, name: str
    ) -> bool:
        return self.current().authorize(session, operation, resource_type, name)

    def authorize_any(
        self, session: Session, operation: AclOperation, resource_type: ResourceType
    ) -> bool:
        return self.current().authorize_any(session, operation, resource_type)


def authorizer_from(
    config: SecurityConfig, acls: Callable[[], tuple[AclBinding, ...]]
) -> Authorizer | None:
    """The authorizer authorizer.class.name names, over the ACLs ``acls()`` returns (the
    current metadata image's, read at each check); None when the key is empty (no
    authorization: everything is allowed). Another class name is refused: only Kafka's
    StandardAuthorizer semantics exist here."""
    name = config.authorizer_class_name.strip()
    if not name:
        return None
    if name not in ACCEPTED_CLASS_NAMES:
        raise ConfigError(
            f"config authorizer.class.name={name!r} is not an authorizer replog has: use "
            f"{STANDARD_AUTHORIZER} (ACLs kept in the cluster metadata), or leave it empty for "
            "no authorization"
        )
    return _ImageAuthorizer(config, acls)
