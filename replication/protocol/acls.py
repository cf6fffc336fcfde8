"""Messages of ACLs and SCRAM credentials: DescribeAcls (29), CreateAcls (30), DeleteAcls (31),
DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), as Kafka's (field names
as Kafka's JSON schemas and kio's), without tagged fields; the ACL messages carry the pattern
type (Kafka's version 1 and later, KIP-290).

Codes are Kafka's (:mod:`replication.security.acl`: resource types, pattern types, operations,
permission types; :data:`replication.security.scram.MECHANISMS`). AlterUserScramCredentials
carries the salted password (``Hi(password, salt, iterations)``), never the password; it is
kept out of the repr all the same.
"""

from __future__ import annotations

from dataclasses import field

from replication.protocol.codec import (
    BYTES,
    INT8,
    INT16,
    INT32,
    NULLABLE_STRING,
    STRING,
    Array,
    array_field,
    message,
    wire,
)

#: PatternType.LITERAL, Kafka's default pattern type
_LITERAL = 3

# --- DescribeAcls (29) --------------------------------------------------------------------------


@message
class DescribeAclsRequest:
    """The bindings matching one filter (ANY = 1 matches every code, None every name)."""

    resource_type_filter: int = field(default=1, metadata=wire(INT8))
    resource_name_filter: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    pattern_type_filter: int = field(default=_LITERAL, metadata=wire(INT8))
    principal_filter: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    host_filter: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    operation: int = field(default=1, metadata=wire(INT8))
    permission_type: int = field(default=1, metadata=wire(INT8))


@message
class AclDescription:
    principal: str = field(metadata=wire(STRING))
    host: str = field(metadata=wire(STRING))
    operation: int = field(metadata=wire(INT8))
    permission_type: int = field(metadata=wire(INT8))


@message
class DescribeAclsResource:
    resource_type: int = field(metadata=wire(INT8))
    resource_name: str = field(metadata=wire(STRING))
    pattern_type: int = field(default=_LITERAL, metadata=wire(INT8))
    acls: list[AclDescription] = array_field(AclDescription)


@message
class DescribeAclsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    resources: list[DescribeAclsResource] = array_field(DescribeAclsResource)


# --- CreateAcls (30) ----------------------------------------------------------------------------


@message
class AclCreation:
    resource_type: int = field(metadata=wire(INT8))
    resource_name: str = field(metadata=wire(STRING))
    resource_pattern_type: int = field(default=_LITERAL, metadata=wire(INT8))
    principal: str = field(metadata=wire(STRING))
    host: str = field(metadata=wire(STRING))
    operation: int = field(metadata=wire(INT8))
    permission_type: int = field(metadata=wire(INT8))


@message
class CreateAclsRequest:
    creations: list[AclCreation] = array_field(AclCreation)


@message
class AclCreationResult:
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class CreateAclsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    results: list[AclCreationResult] = array_field(AclCreationResult)


# --- DeleteAcls (31) ----------------------------------------------------------------------------


@message
class DeleteAclsFilter:
    resource_type_filter: int = field(default=1, metadata=wire(INT8))
    resource_name_filter: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    pattern_type_filter: int = field(default=_LITERAL, metadata=wire(INT8))
    principal_filter: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    host_filter: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    operation: int = field(default=1, metadata=wire(INT8))
    permission_type: int = field(default=1, metadata=wire(INT8))


@message
class DeleteAclsRequest:
    filters: list[DeleteAclsFilter] = array_field(DeleteAclsFilter)


@message
class DeleteAclsMatchingAcl:
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    resource_type: int = field(metadata=wire(INT8))
    resource_name: str = field(metadata=wire(STRING))
    pattern_type: int = field(default=_LITERAL, metadata=wire(INT8))
    principal: str = field(metadata=wire(STRING))
    host: str = field(metadata=wire(STRING))
    operation: int = field(metadata=wire(INT8))
    permission_type: int = field(metadata=wire(INT8))


@message
class DeleteAclsFilterResult:
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    matching_acls: list[DeleteAclsMatchingAcl] = array_field(DeleteAclsMatchingAcl)


@message
class DeleteAclsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    filter_results: list[DeleteAclsFilterResult] = array_field(DeleteAclsFilterResult)


# --- DescribeUserScramCredentials (50) ----------------------------------------------------------


@message
class UserName:
    name: str = field(metadata=wire(STRING))


@message
class DescribeUserScramCredentialsRequest:
    #: None: every user that has a credential
    users: list[UserName] | None = field(
        default=None, metadata=wire(Array(UserName, nullable=True))
    )


@message
class CredentialInfo:
    mechanism: int = field(metadata=wire(INT8))
    iterations: int = field(metadata=wire(INT32))


@message
class DescribeUserScramCredentialsResult:
    user: str = field(metadata=wire(STRING))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    credential_infos: list[CredentialInfo] = array_field(CredentialInfo)


@message
class DescribeUserScramCredentialsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    results: list[DescribeUserScramCredentialsResult] = array_field(
        DescribeUserScramCredentialsResult
    )


# --- AlterUserScramCredentials (51) -------------------------------------------------------------


@message
class ScramCredentialDeletion:
    name: str = field(metadata=wire(STRING))
    mechanism: int = field(metadata=wire(INT8))


@message
class ScramCredentialUpsertion:
    name: str = field(metadata=wire(STRING))
    mechanism: int = field(metadata=wire(INT8))
    iterations: int = field(metadata=wire(INT32))
    salt: bytes = field(repr=False, metadata=wire(BYTES))
    #: Hi(password, salt, iterations): as good as the password to whoever has the salt
    salted_password: bytes = field(repr=False, metadata=wire(BYTES))


@message
class AlterUserScramCredentialsRequest:
    deletions: list[ScramCredentialDeletion] = array_field(ScramCredentialDeletion)
    upsertions: list[ScramCredentialUpsertion] = array_field(ScramCredentialUpsertion)


@message
class AlterUserScramCredentialsResult:
    user: str = field(metadata=wire(STRING))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class AlterUserScramCredentialsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    results: list[AlterUserScramCredentialsResult] = array_field(AlterUserScramCredentialsResult)
