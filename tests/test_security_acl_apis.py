"""CreateAcls, DescribeAcls, DeleteAcls, AlterUserScramCredentials and
DescribeUserScramCredentials, in process: a real controller on memory storage behind the
node's KafkaApis (a controller-only node answers them all), every request and response
through replog's wire encoding. Without an authorizer the ACL APIs answer SECURITY_DISABLED,
as Kafka's; the SCRAM APIs work either way."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import uuid
from typing import Any

import pytest

from logstore.storage import Storage
from replication import protocol as p
from replication.config import BrokerConfig, broker_config_from
from replication.controller.acl_control import bootstrap_credentials
from replication.controller.service import ControllerService
from replication.errors import (
    DuplicateResourceError,
    InvalidRequestError,
    NotControllerError,
    ResourceNotFoundError,
    SecurityDisabledError,
    UnacceptableCredentialError,
    UnsupportedSaslMechanismError,
)
from replication.metadata.store import MetadataStore
from replication.protocol import acls as pa
from replication.protocol.framing import decode_request, decode_response, encode_request
from replication.protocol.framing import encode_response as encode_reply
from replication.security.acl import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from replication.security.scram import new_credential, salted_password
from replication.server.apis import KafkaApis
from replication.server.controller_apis import ControllerApis

pytestmark = pytest.mark.unit

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


class Node:
    """A controller-only node's KafkaApis over a real, active controller."""

    def __init__(self, secure: bool = True, url: str | None = None) -> None:
        values = {"broker.id": 1, "process.roles": "controller"}
        if secure:
            values["authorizer.class.name"] = AUTHORIZER
        self.config: BrokerConfig = broker_config_from(values)
        self.store = MetadataStore(
            Storage.from_url(url or f"memory://acl-apis-{uuid.uuid4().hex}/meta")
        )
        self.service = ControllerService(self.config, self.store, "127.0.0.1", 9999)
        self.apis = KafkaApis(self.config, None, ControllerApis(self.config, self.service), None)

    def activate(self) -> Node:
        self.service.controller.activate()
        return self

    def call(self, api: p.ApiKey, body: Any) -> Any:
        """One request and its response, both through the wire encoding."""
        frame = encode_request(p.RequestHeader(api_key=api, api_version=0, correlation_id=5), body)
        header, decoded = decode_request(frame[4:])
        response = asyncio.run(self.apis.handle(header, decoded))
        _, back = decode_response(encode_reply(5, api, 0, response)[4:], api, 0)
        return back


def creation(
    name: str,
    op: AclOperation = AclOperation.READ,
    *,
    principal: str = "User:alice",
    pattern: PatternType = PatternType.LITERAL,
    rtype: ResourceType = ResourceType.TOPIC,
    permission: AclPermissionType = AclPermissionType.ALLOW,
) -> pa.AclCreation:
    return pa.AclCreation(
        resource_type=rtype,
        resource_name=name,
        resource_pattern_type=pattern,
        principal=principal,
        host="*",
        operation=op,
        permission_type=permission,
    )


def upsertion(user: str, password: str, mechanism: int = 1, iterations: int = 4096) -> Any:
    """What a Kafka client sends: Hi(password, salt, iterations), salted on the client
    (by hand here, so that values replog refuses can be sent too)."""
    salt = uuid.uuid4().bytes
    return pa.ScramCredentialUpsertion(
        name=user,
        mechanism=mechanism,
        iterations=iterations,
        salt=salt,
        salted_password=hashlib.pbkdf2_hmac(
            "sha512" if mechanism == 2 else "sha256", password.encode(), salt, iterations
        ),
    )


def test_acls_are_created_described_and_deleted() -> None:
    node = Node().activate()
    created = node.call(
        p.ApiKey.CREATE_ACLS,
        pa.CreateAclsRequest(
            creations=[
                creation("events"),
                creation("ev", AclOperation.WRITE, pattern=PatternType.PREFIXED),
                creation("g", rtype=ResourceType.GROUP),
                creation("other", rtype=ResourceType.CLUSTER),  # refused: not kafka-cluster
                creation("events"),  # a duplicate: a success that changes nothing
            ]
        ),
    )
    codes = [r.error_code for r in created.results]
    assert codes == [0, 0, 0, InvalidRequestError.code, 0]
    assert "kafka-cluster" in created.results[3].error_message
    image = node.service.controller.image
    assert len(image.acls) == 3
    # the committed metadata has them, for any reader
    assert MetadataStore(node.store.storage).read_latest().acls == image.acls

    everything = node.call(p.ApiKey.DESCRIBE_ACLS, pa.DescribeAclsRequest(pattern_type_filter=1))
    assert everything.error_code == 0
    assert {(r.resource_type, r.resource_name, r.pattern_type) for r in everything.resources} == {
        (2, "events", 3),
        (2, "ev", 4),
        (3, "g", 3),
    }
    # MATCH: what applies to the topic "events"
    matching = node.call(
        p.ApiKey.DESCRIBE_ACLS,
        pa.DescribeAclsRequest(
            resource_type_filter=2, resource_name_filter="events", pattern_type_filter=2
        ),
    )
    assert sorted(r.resource_name for r in matching.resources) == ["ev", "events"]
    assert matching.resources[0].acls[0].principal == "User:alice"
    bad = node.call(p.ApiKey.DESCRIBE_ACLS, pa.DescribeAclsRequest(operation=0))
    assert bad.error_code == InvalidRequestError.code

    deleted = node.call(
        p.ApiKey.DELETE_ACLS,
        pa.DeleteAclsRequest(
            filters=[
                pa.DeleteAclsFilter(resource_type_filter=2, pattern_type_filter=1),
                pa.DeleteAclsFilter(resource_type_filter=2, resource_name_filter="none"),
                pa.DeleteAclsFilter(resource_type_filter=42),
            ]
        ),
    )
    first, second, third = deleted.filter_results
    assert sorted(a.resource_name for a in first.matching_acls) == ["ev", "events"]
    assert first.matching_acls[0].principal == "User:alice"
    assert (second.error_code, second.matching_acls) == (0, [])
    assert third.error_code == InvalidRequestError.code
    assert [b.resource_name for b in node.service.controller.image.acls] == ["g"]


def test_acl_apis_answer_security_disabled_without_an_authorizer() -> None:
    node = Node(secure=False).activate()
    version = node.service.controller.image.version
    created = node.call(
        p.ApiKey.CREATE_ACLS, pa.CreateAclsRequest(creations=[creation("t"), creation("u")])
    )
    assert [r.error_code for r in created.results] == [SecurityDisabledError.code] * 2
    assert "authorizer.class.name" in created.results[0].error_message
    described = node.call(p.ApiKey.DESCRIBE_ACLS, pa.DescribeAclsRequest())
    assert described.error_code == SecurityDisabledError.code
    deleted = node.call(p.ApiKey.DELETE_ACLS, pa.DeleteAclsRequest(filters=[pa.DeleteAclsFilter()]))
    assert deleted.filter_results[0].error_code == SecurityDisabledError.code
    assert node.service.controller.image.version == version  # nothing committed
    # SCRAM credentials need no authorizer (SASL works without ACLs)
    altered = node.call(
        p.ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
        pa.AlterUserScramCredentialsRequest(upsertions=[upsertion("alice", "pw")]),
    )
    assert altered.results[0].error_code == 0


def test_a_standby_answers_not_controller() -> None:
    node = Node()  # never activated
    created = node.call(p.ApiKey.CREATE_ACLS, pa.CreateAclsRequest(creations=[creation("t")]))
    assert created.results[0].error_code == NotControllerError.code
    deleted = node.call(p.ApiKey.DELETE_ACLS, pa.DeleteAclsRequest(filters=[pa.DeleteAclsFilter()]))
    assert deleted.filter_results[0].error_code == NotControllerError.code
    altered = node.call(
        p.ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
        pa.AlterUserScramCredentialsRequest(
            upsertions=[upsertion("alice", "pw")],
            deletions=[pa.ScramCredentialDeletion(name="bob", mechanism=1)],
        ),
    )
    assert [(r.user, r.error_code) for r in altered.results] == [
        ("bob", NotControllerError.code),
        ("alice", NotControllerError.code),
    ]


def test_scram_credentials_are_set_described_and_deleted_from_salted_passwords() -> None:
    node = Node().activate()
    altered = node.call(
        p.ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
        pa.AlterUserScramCredentialsRequest(
            upsertions=[
                upsertion("alice", "alice-pw"),
                upsertion("alice", "alice-pw-512", mechanism=2, iterations=8192),
                upsertion("bob", "bob-pw"),
                upsertion("carol", "x", iterations=1000),  # too few iterations
                upsertion("dave", "x", mechanism=3),  # no such mechanism
                upsertion("", "x"),  # no name
            ]
        ),
    )
    assert [(r.user, r.error_code) for r in altered.results] == [
        ("alice", 0),
        ("bob", 0),
        ("carol", UnacceptableCredentialError.code),
        ("dave", UnsupportedSaslMechanismError.code),
        ("", UnacceptableCredentialError.code),
    ]
    assert "4096..16384" in altered.results[2].error_message
    image = node.service.controller.image
    stored = image.scram_credential("alice", "SCRAM-SHA-256")
    assert stored is not None
    # the stored keys are those of the password (as a login checks them), not the salted one
    salted = salted_password("SCRAM-SHA-256", "alice-pw", stored.salt, 4096)
    assert stored == new_credential("alice", "SCRAM-SHA-256", "alice-pw", 4096, stored.salt)
    assert salted not in (stored.stored_key, stored.server_key)
    assert stored.server_key == hmac.digest(salted, b"Server Key", hashlib.sha256)

    described = node.call(
        p.ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, pa.DescribeUserScramCredentialsRequest()
    )
    assert {
        r.user: [(i.mechanism, i.iterations) for i in r.credential_infos] for r in described.results
    } == {"alice": [(1, 4096), (2, 8192)], "bob": [(1, 4096)]}
    named = node.call(
        p.ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
        pa.DescribeUserScramCredentialsRequest(
            users=[pa.UserName(name="bob"), pa.UserName(name="zed"), pa.UserName(name="bob")]
        ),
    )
    assert [(r.user, r.error_code) for r in named.results] == [
        ("bob", DuplicateResourceError.code),
        ("zed", ResourceNotFoundError.code),
    ]

    version = node.service.controller.image.version
    deleted = node.call(
        p.ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
        pa.AlterUserScramCredentialsRequest(
            deletions=[
                pa.ScramCredentialDeletion(name="alice", mechanism=2),
                pa.ScramCredentialDeletion(name="bob", mechanism=2),  # bob has no 512 one
                pa.ScramCredentialDeletion(name="carol", mechanism=1),
            ],
            upsertions=[upsertion("carol", "c")],  # carol: twice in one request
        ),
    )
    assert [(r.user, r.error_code) for r in deleted.results] == [
        ("alice", 0),
        ("bob", ResourceNotFoundError.code),
        ("carol", DuplicateResourceError.code),
    ]
    image = node.service.controller.image
    assert image.version == version + 1  # one version for the whole request
    assert image.scram_credential("alice", "SCRAM-SHA-512") is None
    assert image.scram_credential("alice", "SCRAM-SHA-256") is not None
    assert image.scram_credential("bob", "SCRAM-SHA-256") is not None
    assert image.scram_credential("carol", "SCRAM-SHA-256") is None


def test_the_wire_form_of_a_credential_hides_the_salted_password() -> None:
    shown = repr(upsertion("alice", "alice-pw"))
    assert "alice" in shown
    assert "salted_password" not in shown
    assert "salt=" not in shown


def test_bootstrapped_users_survive_the_first_controller_activation() -> None:
    url = f"memory://bootstrap-{uuid.uuid4().hex}/meta"
    store = MetadataStore(Storage.from_url(url))
    broker = new_credential("broker", "SCRAM-SHA-512", "broker-pw")
    admin = new_credential("admin", "SCRAM-SHA-256", "admin-pw")
    everything = AclBinding(
        ResourceType.CLUSTER,
        "kafka-cluster",
        PatternType.LITERAL,
        "User:admin",
        "*",
        AclOperation.ALL,
        AclPermissionType.ALLOW,
    )
    first = bootstrap_credentials(store, [broker], [everything])
    assert first.version == 1
    assert first.cluster_id == ""
    # another call before any controller ran adds to it (one user per `replog users add`)
    second = bootstrap_credentials(store, [admin])
    assert second.version == 2
    assert second.scram_credential("broker", "SCRAM-SHA-512") == broker
    node = Node(url=url).activate()
    image = node.service.controller.image
    assert image.version == 3
    assert image.cluster_id  # the first controller fills it in
    assert image.scram_credential("broker", "SCRAM-SHA-512") == broker
    assert image.scram_credential("admin", "SCRAM-SHA-256") == admin
    assert image.acls == (everything,)
    # and a later change keeps them
    node.call(
        p.ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
        pa.AlterUserScramCredentialsRequest(upsertions=[upsertion("alice", "pw")]),
    )
    latest = MetadataStore(Storage.from_url(url)).read_latest()
    assert latest.scram_credential("broker", "SCRAM-SHA-512") == broker
    assert latest.scram_credential("alice", "SCRAM-SHA-256") is not None
    # a metadata log in use is refused, naming the online way
    with pytest.raises(InvalidRequestError, match=r"in use.*replog users add"):
        bootstrap_credentials(store, [admin])


@pytest.mark.parametrize(
    ("schema", "versions"),
    [
        ("describe_acls", (1, 2, 3)),
        ("create_acls", (1, 2, 3)),
        ("delete_acls", (1, 2, 3)),
        ("describe_user_scram_credentials", (0,)),
        ("alter_user_scram_credentials", (0,)),
    ],
)
def test_the_messages_translate_to_and_from_kio_s_schemas(
    schema: str, versions: tuple[int, ...]
) -> None:
    """Field names equal Kafka's (kio's), so the Kafka listener can serve these APIs through
    its generic translation (kafka/translate.py) at the versions kio has."""
    import importlib

    from replication.kafka.translate import to_kafka, to_replog

    samples: dict[str, tuple[Any, Any]] = {
        "describe_acls": (
            pa.DescribeAclsRequest(resource_type_filter=2, resource_name_filter="t", operation=3),
            pa.DescribeAclsResponse(
                resources=[
                    pa.DescribeAclsResource(
                        resource_type=2,
                        resource_name="t",
                        pattern_type=4,
                        acls=[
                            pa.AclDescription(
                                principal="User:a", host="*", operation=3, permission_type=3
                            )
                        ],
                    )
                ]
            ),
        ),
        "create_acls": (
            pa.CreateAclsRequest(creations=[creation("t", pattern=PatternType.PREFIXED)]),
            pa.CreateAclsResponse(results=[pa.AclCreationResult(error_code=54, error_message="x")]),
        ),
        "delete_acls": (
            pa.DeleteAclsRequest(filters=[pa.DeleteAclsFilter(resource_name_filter="t")]),
            pa.DeleteAclsResponse(
                filter_results=[
                    pa.DeleteAclsFilterResult(
                        matching_acls=[
                            pa.DeleteAclsMatchingAcl(
                                resource_type=2,
                                resource_name="t",
                                principal="User:a",
                                host="*",
                                operation=3,
                                permission_type=3,
                            )
                        ]
                    )
                ]
            ),
        ),
        "describe_user_scram_credentials": (
            pa.DescribeUserScramCredentialsRequest(users=[pa.UserName(name="a")]),
            pa.DescribeUserScramCredentialsResponse(
                results=[
                    pa.DescribeUserScramCredentialsResult(
                        user="a", credential_infos=[pa.CredentialInfo(mechanism=1, iterations=4096)]
                    )
                ]
            ),
        ),
        "alter_user_scram_credentials": (
            pa.AlterUserScramCredentialsRequest(
                upsertions=[upsertion("a", "pw")],
                deletions=[pa.ScramCredentialDeletion(name="b", mechanism=2)],
            ),
            pa.AlterUserScramCredentialsResponse(
                results=[pa.AlterUserScramCredentialsResult(user="a", error_code=93)]
            ),
        ),
    }
    request, response = samples[schema]
    for version in versions:
        for message, kind in ((request, "request"), (response, "response")):
            module = importlib.import_module(f"kio.schema.{schema}.v{version}.{kind}")
            kio_class = getattr(module, type(message).__name__)
            assert to_replog(to_kafka(message, kio_class), type(message)) == message
