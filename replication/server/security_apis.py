"""The handlers of the ACL and SCRAM credential APIs. CreateAcls, DeleteAcls and
AlterUserScramCredentials change the cluster's metadata: the active controller answers them
(:class:`~replication.server.controller_apis.ControllerApis` routes them here, brokers forward
them to it). DescribeAcls and DescribeUserScramCredentials are answered by any node from its
metadata image (:func:`security_handlers`).

Without an authorizer, the ACL APIs answer SECURITY_DISABLED, as Kafka's: ACLs nothing
enforces would only mislead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from logstore.errors import ReplogError
from replication import protocol as p
from replication.config import BrokerConfig
from replication.controller.controller import Controller
from replication.errors import (
    DuplicateResourceError,
    ResourceNotFoundError,
    SecurityDisabledError,
    UnacceptableCredentialError,
    UnsupportedSaslMechanismError,
)
from replication.metadata.image import MetadataImage
from replication.protocol import acls as pa
from replication.security.acl import AclBinding, AclBindingFilter
from replication.security.scram import (
    MECHANISMS,
    ScramCredential,
    credential_from_salted,
    mechanism_name,
)
from replication.server.responses import Handler, error_code, error_message

__all__ = [
    "acl_creation_error",
    "acl_filter_error",
    "alter_user_scram_credentials",
    "create_acls",
    "delete_acls",
    "describe_acls",
    "describe_user_scram_credentials",
    "security_handlers",
]

#: an item of a request (W), parsed (T), its outcome (R), its answer (A)
A = TypeVar("A")
R = TypeVar("R")
T = TypeVar("T")
W = TypeVar("W")

_NO_AUTHORIZER = (
    "no authorizer is configured: set authorizer.class.name="
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer on the brokers and controllers"
)


async def create_acls(
    config: BrokerConfig, controller: Controller, body: pa.CreateAclsRequest
) -> pa.CreateAclsResponse:
    """Add ACLs, one result per creation."""

    def created(failure: ReplogError | None) -> pa.AclCreationResult:
        return pa.AclCreationResult() if failure is None else acl_creation_error(failure)

    return pa.CreateAclsResponse(
        results=await _apply_each(
            config,
            body.creations,
            _acl_binding,
            controller.create_acls,
            acl_creation_error,
            created,
        )
    )


async def delete_acls(
    config: BrokerConfig, controller: Controller, body: pa.DeleteAclsRequest
) -> pa.DeleteAclsResponse:
    """Remove the ACLs each filter matches; per filter, the ACLs it removed."""

    def deleted(bindings: list[AclBinding]) -> pa.DeleteAclsFilterResult:
        return pa.DeleteAclsFilterResult(
            matching_acls=[
                pa.DeleteAclsMatchingAcl(
                    resource_type=b.resource_type,
                    resource_name=b.resource_name,
                    pattern_type=b.pattern_type,
                    principal=b.principal,
                    host=b.host,
                    operation=b.operation,
                    permission_type=b.permission,
                )
                for b in bindings
            ]
        )

    return pa.DeleteAclsResponse(
        filter_results=await _apply_each(
            config, body.filters, _acl_filter, controller.delete_acls, acl_filter_error, deleted
        )
    )


async def _apply_each(
    config: BrokerConfig,
    items: Sequence[W],
    parse: Callable[[W], T],
    apply: Callable[[list[T]], Sequence[R]],
    failed: Callable[[ReplogError], A],
    done: Callable[[R], A],
) -> list[A]:
    """One answer per item of an ACL change: SECURITY_DISABLED on each without an authorizer;
    else each item parsed (one that is not: its error), the parsed ones applied at once
    (``apply``, off the event loop; its error is every item's), and each one's outcome."""
    if not config.security.authorizer_class_name:
        return [failed(SecurityDisabledError(_NO_AUTHORIZER))] * len(items)
    parsed: list[T | ReplogError] = []
    for item in items:
        try:
            parsed.append(parse(item))
        except ReplogError as err:
            parsed.append(err)
    valid = [x for x in parsed if not isinstance(x, ReplogError)]
    try:
        outcomes = iter(await asyncio.to_thread(apply, valid))
    except ReplogError as err:
        return [failed(err)] * len(parsed)
    return [failed(x) if isinstance(x, ReplogError) else done(next(outcomes)) for x in parsed]


async def alter_user_scram_credentials(
    controller: Controller, body: pa.AlterUserScramCredentialsRequest
) -> pa.AlterUserScramCredentialsResponse:
    """Set or delete users' SCRAM credentials, one result per user. The request carries
    salted passwords; only the keys derived from them are kept."""
    failed: dict[str, ReplogError] = {}
    upserts: list[ScramCredential] = []
    deletions: list[tuple[str, str]] = []
    for d in body.deletions:
        try:
            deletions.append((_scram_user(d.name), _scram_mechanism(d.mechanism)))
        except ReplogError as err:
            failed.setdefault(d.name, err)
    for u in body.upsertions:
        try:
            mechanism = _scram_mechanism(u.mechanism)
            try:
                upserts.append(
                    credential_from_salted(
                        _scram_user(u.name), mechanism, u.iterations, u.salt, u.salted_password
                    )
                )
            except ValueError as err:
                raise UnacceptableCredentialError(str(err)) from None
        except ReplogError as err:
            failed.setdefault(u.name, err)
    users = list(
        dict.fromkeys([d.name for d in body.deletions] + [u.name for u in body.upsertions])
    )
    try:
        outcomes = await asyncio.to_thread(
            controller.alter_scram_credentials,
            [c for c in upserts if c.user not in failed],
            [(u, m) for u, m in deletions if u not in failed],
        )
    except ReplogError as err:
        outcomes = dict.fromkeys(users, err)
    results = []
    for user in users:
        error = failed.get(user) or outcomes.get(user)
        results.append(
            pa.AlterUserScramCredentialsResult(
                user=user,
                error_code=error_code(error) if error else 0,
                error_message=error_message(error) if error else None,
            )
        )
    return pa.AlterUserScramCredentialsResponse(results=results)


def acl_creation_error(err: ReplogError) -> pa.AclCreationResult:
    return pa.AclCreationResult(error_code=error_code(err), error_message=error_message(err))


def acl_filter_error(err: ReplogError) -> pa.DeleteAclsFilterResult:
    return pa.DeleteAclsFilterResult(error_code=error_code(err), error_message=error_message(err))


def _acl_binding(c: pa.AclCreation) -> AclBinding:
    return AclBinding.from_wire(
        c.resource_type,
        c.resource_name,
        c.resource_pattern_type,
        c.principal,
        c.host,
        c.operation,
        c.permission_type,
    )


def _acl_filter(f: pa.DeleteAclsFilter | pa.DescribeAclsRequest) -> AclBindingFilter:
    """The filter of a DeleteAcls entry, or of a DescribeAcls (the same fields)."""
    return AclBindingFilter.from_wire(
        f.resource_type_filter,
        f.resource_name_filter,
        f.pattern_type_filter,
        f.principal_filter,
        f.host_filter,
        f.operation,
        f.permission_type,
    )


def _scram_user(name: str) -> str:
    if not name:
        raise UnacceptableCredentialError("a SCRAM user name must not be empty")
    return name


def _scram_mechanism(code: int) -> str:
    try:
        return mechanism_name(code)
    except ValueError as err:
        raise UnsupportedSaslMechanismError(str(err)) from None


def describe_acls(
    config: BrokerConfig, image: MetadataImage, body: pa.DescribeAclsRequest
) -> pa.DescribeAclsResponse:
    """DescribeAcls from a metadata image: the bindings the filter matches, grouped by
    resource pattern (SECURITY_DISABLED without an authorizer, as Kafka)."""
    if not config.security.authorizer_class_name:
        err: ReplogError = SecurityDisabledError(_NO_AUTHORIZER)
        return pa.DescribeAclsResponse(error_code=error_code(err), error_message=error_message(err))
    try:
        f = _acl_filter(body)
    except ReplogError as err:
        return pa.DescribeAclsResponse(error_code=error_code(err), error_message=error_message(err))
    by_pattern: dict[tuple[int, str, int], list[pa.AclDescription]] = {}
    for b in image.acls:
        if f.matches(b):
            by_pattern.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(
                pa.AclDescription(
                    principal=b.principal,
                    host=b.host,
                    operation=b.operation,
                    permission_type=b.permission,
                )
            )
    return pa.DescribeAclsResponse(
        resources=[
            pa.DescribeAclsResource(
                resource_type=rtype, resource_name=name, pattern_type=pattern, acls=acls
            )
            for (rtype, name, pattern), acls in by_pattern.items()
        ]
    )


def describe_user_scram_credentials(
    image: MetadataImage, body: pa.DescribeUserScramCredentialsRequest
) -> pa.DescribeUserScramCredentialsResponse:
    """DescribeUserScramCredentials from a metadata image: each user's mechanisms and
    iteration counts (never a salt or key). No users named: every user with a credential."""
    infos: dict[str, list[pa.CredentialInfo]] = {}
    for c in image.scram_credentials:
        infos.setdefault(c.user, []).append(
            pa.CredentialInfo(mechanism=MECHANISMS[c.mechanism], iterations=c.iterations)
        )
    if not body.users:
        return pa.DescribeUserScramCredentialsResponse(
            results=[
                pa.DescribeUserScramCredentialsResult(user=user, credential_infos=found)
                for user, found in infos.items()
            ]
        )
    names = [u.name for u in body.users]
    results = []
    for user in dict.fromkeys(names):
        error: ReplogError | None = None
        if names.count(user) > 1:
            error = DuplicateResourceError(f"user {user!r} is named more than once")
        elif user not in infos:
            error = ResourceNotFoundError(f"user {user!r} has no SCRAM credential")
        results.append(
            pa.DescribeUserScramCredentialsResult(
                user=user,
                error_code=error_code(error) if error else 0,
                error_message=error_message(error) if error else None,
                credential_infos=[] if error else infos[user],
            )
        )
    return pa.DescribeUserScramCredentialsResponse(results=results)


def security_handlers(
    config: BrokerConfig, image: Callable[[], MetadataImage]
) -> dict[int, Handler]:
    """The handlers of DescribeAcls and DescribeUserScramCredentials, which any node answers
    from its metadata image (``image()``, read at each request); KafkaApis registers them.
    CreateAcls, DeleteAcls and AlterUserScramCredentials are forwarded (FORWARDED_APIS)."""

    async def handle_describe_acls(header: p.RequestHeader, body: pa.DescribeAclsRequest) -> Any:
        return describe_acls(config, image(), body)

    async def handle_describe_user_scram_credentials(
        header: p.RequestHeader, body: pa.DescribeUserScramCredentialsRequest
    ) -> Any:
        return describe_user_scram_credentials(image(), body)

    return {
        p.ApiKey.DESCRIBE_ACLS: handle_describe_acls,
        p.ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: handle_describe_user_scram_credentials,
    }
