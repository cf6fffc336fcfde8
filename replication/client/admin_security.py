"""The admin client's security calls: ACL bindings (Kafka's createAcls, describeAcls,
deleteAcls) and SCRAM credentials (describeUserScramCredentials,
alterUserScramCredentials); changes go through the controller."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from replication.client.admin_base import AdminBase, _error
from replication.protocol import ApiKey
from replication.protocol import acls as pa
from replication.security.acl import AclBinding, AclBindingFilter
from replication.security.scram import (
    DEFAULT_ITERATIONS,
    MECHANISMS,
    SALT_BYTES,
    mechanism_name,
    salted_password,
)


@dataclass(frozen=True)
class UserScramCredentialUpsertion:
    """Set ``user``'s SCRAM credential for ``mechanism`` (Kafka's
    UserScramCredentialUpsertion). The password is salted here and never sent; it never shows
    in a repr."""

    user: str
    password: str = field(repr=False)
    mechanism: str = "SCRAM-SHA-512"
    iterations: int = DEFAULT_ITERATIONS


class SecurityCalls(AdminBase):
    """Manage ACLs and SCRAM credentials."""

    # --- ACLs and SCRAM credentials ---------------------------------------------------------

    def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        """Add ACL bindings (through the controller); raises the first binding's error (by
        class: SecurityDisabledError without an authorizer, InvalidRequestError for a bad
        binding) after trying them all."""
        wanted = list(bindings)
        if not wanted:
            return
        request = pa.CreateAclsRequest(
            creations=[
                pa.AclCreation(
                    resource_type=b.resource_type,
                    resource_name=b.resource_name,
                    resource_pattern_type=b.pattern_type,
                    principal=b.principal,
                    host=b.host,
                    operation=b.operation,
                    permission_type=b.permission,
                )
                for b in wanted
            ]
        )

        response: pa.CreateAclsResponse = self._controller_call(
            ApiKey.CREATE_ACLS,
            request,
            f"creating {len(wanted)} ACL(s)",
            codes=lambda r: [x.error_code for x in r.results],
        )
        self._raise_first(
            [
                _error(r.error_code, r.error_message, f"cannot create ACL {_acl_text(b)}")
                for b, r in zip(wanted, response.results, strict=False)
                if r.error_code
            ]
        )

    def describe_acls(self, acl_filter: AclBindingFilter | None = None) -> list[AclBinding]:
        """The ACL bindings ``acl_filter`` matches (default: all), sorted."""
        f = acl_filter or AclBindingFilter()
        request = pa.DescribeAclsRequest(**_filter_fields(f))
        response: pa.DescribeAclsResponse = self._retrying(
            "describing ACLs",
            lambda: self._any_broker(ApiKey.DESCRIBE_ACLS, request),
        )
        if response.error_code:
            raise _error(response.error_code, response.error_message, "cannot describe ACLs")
        return sorted(_binding(r, a) for r in response.resources for a in r.acls)

    def delete_acls(self, filters: Iterable[AclBindingFilter]) -> list[list[AclBinding]]:
        """Remove the bindings each filter matches (through the controller); per filter, the
        bindings it removed. Raises the first filter's error after trying them all."""
        wanted = list(filters)
        if not wanted:
            return []
        request = pa.DeleteAclsRequest(
            filters=[pa.DeleteAclsFilter(**_filter_fields(f)) for f in wanted]
        )

        response: pa.DeleteAclsResponse = self._controller_call(
            ApiKey.DELETE_ACLS,
            request,
            "deleting ACLs",
            codes=lambda r: [x.error_code for x in r.filter_results],
        )
        self._raise_first(
            [
                _error(r.error_code, r.error_message, "cannot delete ACLs")
                for r in response.filter_results
                if r.error_code
            ]
        )
        return [[_binding(a, a) for a in r.matching_acls] for r in response.filter_results]

    def describe_user_scram_credentials(
        self, users: Iterable[str] | None = None
    ) -> dict[str, dict[str, int]]:
        """Each user's SCRAM mechanisms and their iteration counts (never a salt or key):
        ``{"alice": {"SCRAM-SHA-512": 8192}}``. No users named: every user. A user named who
        has no credential raises ResourceNotFoundError."""
        names = None if users is None else list(users)
        request = pa.DescribeUserScramCredentialsRequest(
            users=None if names is None else [pa.UserName(name=n) for n in names]
        )
        response: pa.DescribeUserScramCredentialsResponse = self._retrying(
            "describing SCRAM users",
            lambda: self._any_broker(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, request),
        )
        if response.error_code:
            raise _error(response.error_code, response.error_message, "cannot describe users")
        self._raise_first(
            [
                _error(r.error_code, r.error_message, f"cannot describe user {r.user!r}")
                for r in response.results
                if r.error_code
            ]
        )
        return {
            r.user: {mechanism_name(i.mechanism): i.iterations for i in r.credential_infos}
            for r in response.results
        }

    def alter_user_scram_credentials(
        self,
        upsertions: Iterable[UserScramCredentialUpsertion] = (),
        deletions: Iterable[tuple[str, str]] = (),
    ) -> None:
        """Set users' SCRAM credentials and delete (user, mechanism) ones, through the
        controller. Each password is salted here with a new random salt (Kafka's wire form:
        the salted password); raises the first user's error after trying them all."""
        ups = list(upsertions)
        dels = list(deletions)
        if not ups and not dels:
            return
        wire_ups = []
        for u in ups:
            code = _mechanism(u.mechanism)
            salt = os.urandom(SALT_BYTES)
            wire_ups.append(
                pa.ScramCredentialUpsertion(
                    name=u.user,
                    mechanism=code,
                    iterations=u.iterations,
                    salt=salt,
                    salted_password=salted_password(u.mechanism, u.password, salt, u.iterations),
                )
            )
        wire_dels = []
        for user, mechanism in dels:
            wire_dels.append(pa.ScramCredentialDeletion(name=user, mechanism=_mechanism(mechanism)))
        request = pa.AlterUserScramCredentialsRequest(deletions=wire_dels, upsertions=wire_ups)

        response: pa.AlterUserScramCredentialsResponse = self._controller_call(
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
            request,
            "altering SCRAM credentials",
            codes=lambda r: [x.error_code for x in r.results],
        )
        self._raise_first(
            [
                _error(r.error_code, r.error_message, f"cannot alter the credentials of {r.user!r}")
                for r in response.results
                if r.error_code
            ]
        )


def _acl_text(b: AclBinding) -> str:
    return (
        f"{b.permission.name} {b.principal} {b.operation.name} on "
        f"{b.resource_type.name}:{b.pattern_type.name}:{b.resource_name} from {b.host}"
    )


def _filter_fields(f: AclBindingFilter) -> dict[str, Any]:
    """An ACL filter's fields, as DescribeAcls and DeleteAcls name them on the wire."""
    return {
        "resource_type_filter": f.resource_type,
        "resource_name_filter": f.resource_name,
        "pattern_type_filter": f.pattern_type,
        "principal_filter": f.principal,
        "host_filter": f.host,
        "operation": f.operation,
        "permission_type": f.permission,
    }


def _binding(resource: Any, acl: Any) -> AclBinding:
    """The binding of ``acl`` (principal, host, operation, permission type) on ``resource``
    (resource type, name, pattern type), as DescribeAcls and DeleteAcls answer them."""
    return AclBinding.from_wire(
        resource.resource_type,
        resource.resource_name,
        resource.pattern_type,
        acl.principal,
        acl.host,
        acl.operation,
        acl.permission_type,
    )


def _mechanism(name: str) -> int:
    """The wire code of SCRAM mechanism ``name``; ValueError naming the supported ones."""
    if name not in MECHANISMS:
        raise ValueError(
            f"SCRAM mechanism {name!r} is not supported: use one of {', '.join(MECHANISMS)}"
        )
    return MECHANISMS[name]
