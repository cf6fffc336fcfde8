"""What request handlers call to authorize a request (Kafka's ``AuthHelper``).

A handler asks :meth:`AuthHelper.allowed` (one resource) or :meth:`AuthHelper.filter` (which of
several names) for the principal of the connection being served: the :data:`SESSION` context
variable the socket server sets once a connection is authenticated. The table of what each API
needs is :mod:`replication.security.api_acls`.

- No authorizer (``authorizer.class.name`` unset, the default): everything is allowed and
  nothing reads the session, so in-process handler calls and every cluster without security
  behave exactly as before.
- An authorizer and no session: denied, and logged as a bug. A handler reached without an
  authenticated connection must never fall back to the node's own rights (fail closed).
- The internal session (:func:`~replication.security.principal.internal_scope`: the node
  creating an internal topic or writing transaction markers for itself): allowed.

Each denial logs one INFO line (event ``authorization_denied``) on logger
``replication.security.authorizer`` (Kafka's ``kafka.authorizer.logger``); allowed checks log
at DEBUG. Checks that only narrow a listing (Metadata of all topics, ListGroups) log denials
at DEBUG too, as Kafka does (``logIfDenied = false``): a client listing what it may see is not
refused anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Final

from replication import events
from replication.errors import (
    AuthorizationError,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)
from replication.security.acl import CLUSTER_NAME, AclOperation, ResourceType
from replication.security.authorizer import Authorizer
from replication.security.principal import SESSION, Session

__all__ = [
    "LOGGER_NAME",
    "AuthHelper",
    "denial_message",
    "error_for",
    "operation_name",
    "resource_type_name",
]

#: the logger denials go to (Kafka's kafka.authorizer.logger)
LOGGER_NAME: Final = "replication.security.authorizer"
log = logging.getLogger(LOGGER_NAME)

_ERRORS: Final[dict[ResourceType, type[AuthorizationError]]] = {
    ResourceType.TOPIC: TopicAuthorizationFailedError,
    ResourceType.GROUP: GroupAuthorizationFailedError,
    ResourceType.CLUSTER: ClusterAuthorizationFailedError,
    ResourceType.TRANSACTIONAL_ID: TransactionalIdAuthorizationFailedError,
}


def _camel(name: str) -> str:
    return "".join(word.capitalize() for word in name.split("_"))


def operation_name(operation: AclOperation) -> str:
    """Kafka's name of an operation: ``Write``, ``ClusterAction``, ``DescribeConfigs``."""
    return _camel(operation.name)


def resource_type_name(resource_type: ResourceType) -> str:
    """Kafka's name of a resource type: ``Topic``, ``Group``, ``Cluster``, ``TransactionalId``."""
    return _camel(resource_type.name)


def denial_message(
    principal: str, operation: AclOperation, resource_type: ResourceType, name: str
) -> str:
    """``User:bob is not authorized to Write Topic:events``."""
    return (
        f"{principal} is not authorized to {operation_name(operation)} "
        f"{resource_type_name(resource_type)}:{name}"
    )


def error_for(resource_type: ResourceType, message: str) -> AuthorizationError:
    """The error Kafka answers for a denial on a resource of this type (TOPIC_AUTHORIZATION_FAILED
    for a topic, and so on)."""
    return _ERRORS[resource_type](message)


class AuthHelper:
    """Authorization as a handler sees it. ``authorizer`` is called at each check, so the
    node can install (or replace) its authorizer after the handlers are built."""

    def __init__(self, authorizer: Callable[[], Authorizer | None]) -> None:
        self._authorizer = authorizer

    @property
    def enabled(self) -> bool:
        """Is an authorizer configured (else every check allows)?"""
        return self._authorizer() is not None

    def principal(self) -> str:
        """The principal of the request being handled, for messages (``User:bob``)."""
        session = SESSION.get()
        return str(session.principal) if session is not None else "an unauthenticated caller"

    def allowed(
        self,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str = CLUSTER_NAME,
        *,
        api: str,
        log_denied: bool = True,
    ) -> bool:
        """May the current session do ``operation`` on ``resource_type`` ``name``?

        ``log_denied=False``: a denial is not a refusal of the request (a list is narrowed, or
        another check may still allow it), so it logs at DEBUG only."""
        authorizer = self._authorizer()
        if authorizer is None:
            return True
        session = SESSION.get()
        if session is None:
            # A handler ran outside any authenticated connection and outside internal_scope():
            # a bug in the caller. Deny rather than guess who it is.
            log.error(
                "bug: unauthenticated call: %s %s %s:%s denied (no session)",
                api,
                operation_name(operation),
                resource_type_name(resource_type),
                name,
            )
            return False
        if session.internal:
            return True
        ok = authorizer.authorize(session, operation, resource_type, name)
        if ok:
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "principal=%s host=%s operation=%s resource=%s:%s api=%s result=ALLOWED",
                    session.principal,
                    session.host,
                    operation_name(operation),
                    resource_type_name(resource_type),
                    name,
                    api,
                )
        else:
            self._log_denied(session, operation, resource_type, name, api, log_denied)
        return ok

    def allowed_any(
        self, operation: AclOperation, resource_type: ResourceType, *, api: str
    ) -> bool:
        """May the current session do ``operation`` on at least one resource of the type
        (Kafka's authorizeByResourceType: InitProducerId without a transactional id)?"""
        authorizer = self._authorizer()
        if authorizer is None:
            return True
        session = SESSION.get()
        if session is None:
            log.error("bug: unauthenticated call: %s denied (no session)", api)
            return False
        if session.internal:
            return True
        ok = authorizer.authorize_any(session, operation, resource_type)
        if not ok:
            self._log_denied(session, operation, resource_type, "*", api, True)
        return ok

    def filter(
        self,
        operation: AclOperation,
        resource_type: ResourceType,
        names: Iterable[str],
        *,
        api: str,
        log_denied: bool = True,
    ) -> set[str]:
        """The names among ``names`` the current session may do ``operation`` on."""
        unique = set(names)
        if self._authorizer() is None:
            return unique
        return {
            n
            for n in unique
            if self.allowed(operation, resource_type, n, api=api, log_denied=log_denied)
        }

    def error(
        self, operation: AclOperation, resource_type: ResourceType, name: str = CLUSTER_NAME
    ) -> AuthorizationError:
        """The error of a denial (its code by resource type, the message naming the
        principal, the operation and the resource)."""
        return error_for(
            resource_type, denial_message(self.principal(), operation, resource_type, name)
        )

    def check(
        self,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str = CLUSTER_NAME,
        *,
        api: str,
    ) -> AuthorizationError | None:
        """None if allowed, else the error to answer."""
        if self.allowed(operation, resource_type, name, api=api):
            return None
        return self.error(operation, resource_type, name)

    @staticmethod
    def _log_denied(
        session: Session,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
        api: str,
        loud: bool,
    ) -> None:
        fields = {
            "principal": str(session.principal),
            "host": session.host,
            "operation": operation_name(operation),
            "resource": f"{resource_type_name(resource_type)}:{name}",
            "api": api,
            "result": "DENIED",
        }
        if loud:
            events.event(log, events.AUTHORIZATION_DENIED, **fields)
        elif log.isEnabledFor(logging.DEBUG):
            log.debug(" ".join(f"{k}={v}" for k, v in fields.items()))


#: no authorizer: every check allows (handlers built outside a node, and tests)
NO_AUTH: Final = AuthHelper(lambda: None)
