"""What decides whether a principal may do an operation on a resource.

:class:`Authorizer` is the interface request handlers call (through the session of the
connection, :mod:`.principal`). Kafka's rules hold: super.users may do everything; DENY beats
ALLOW; ALLOW of Read, Write, Delete or Alter implies Describe, and AlterConfigs implies
DescribeConfigs; with no ACL on a resource, deny unless allow.everyone.if.no.acl.found.
"""

from __future__ import annotations

from typing import Protocol

from replication.security.acl import AclOperation, ResourceType
from replication.security.principal import Session

__all__ = ["Authorizer"]


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
