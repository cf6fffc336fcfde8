"""ACL matching and Kafka's StandardAuthorizer rules: implication, DENY precedence, prefixed
and wildcard patterns, super.users, default deny and allow.everyone.if.no.acl.found, filters
(DescribeAcls/DeleteAcls) and authorizeByResourceType (InitProducerId)."""

from __future__ import annotations

import pytest

from logstore.errors import ConfigError
from replication.errors import InvalidRequestError
from replication.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from replication.security.authorizer import StandardAuthorizer, authorizer_from
from replication.security.config import SecurityConfig
from replication.security.principal import KafkaPrincipal, Session, internal_scope

pytestmark = pytest.mark.unit

Op = AclOperation
ALLOW = AclPermissionType.ALLOW
DENY = AclPermissionType.DENY
TOPIC = ResourceType.TOPIC
GROUP = ResourceType.GROUP
LITERAL = PatternType.LITERAL
PREFIXED = PatternType.PREFIXED


def acl(
    name: str,
    op: AclOperation,
    permission: AclPermissionType = ALLOW,
    *,
    principal: str = "User:alice",
    host: str = "*",
    pattern: PatternType = LITERAL,
    rtype: ResourceType = TOPIC,
) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, permission)


def session(name: str = "alice", host: str = "10.0.0.1") -> Session:
    return Session(KafkaPrincipal("User", name), host)


def authorizer(*acls: AclBinding, **config: object) -> StandardAuthorizer:
    return StandardAuthorizer(SecurityConfig(**config), acls)  # type: ignore[arg-type]


ALICE = session()
BOB = session("bob")


def test_allow_of_read_write_delete_alter_implies_describe_and_nothing_else() -> None:
    for op in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        a = authorizer(acl("t", op))
        assert a.authorize(ALICE, op, TOPIC, "t")
        assert a.authorize(ALICE, Op.DESCRIBE, TOPIC, "t"), op
        assert not a.authorize(ALICE, Op.CREATE, TOPIC, "t"), op
        assert not a.authorize(ALICE, Op.DESCRIBE_CONFIGS, TOPIC, "t"), op
    a = authorizer(acl("t", Op.ALTER_CONFIGS))
    assert a.authorize(ALICE, Op.DESCRIBE_CONFIGS, TOPIC, "t")
    assert not a.authorize(ALICE, Op.DESCRIBE, TOPIC, "t")
    # Describe implies nothing
    a = authorizer(acl("t", Op.DESCRIBE))
    assert not a.authorize(ALICE, Op.READ, TOPIC, "t")


def test_all_matches_every_operation() -> None:
    a = authorizer(acl("t", Op.ALL))
    for op in Op:
        if op not in (Op.ANY,):
            assert a.authorize(ALICE, op, TOPIC, "t"), op
    a = authorizer(acl("t", Op.ALL), acl("t", Op.ALL, DENY))
    assert not a.authorize(ALICE, Op.READ, TOPIC, "t")


def test_deny_beats_allow_and_implies_nothing() -> None:
    a = authorizer(acl("t", Op.READ), acl("t", Op.READ, DENY, principal="User:*"))
    assert not a.authorize(ALICE, Op.READ, TOPIC, "t")
    # a DENY of Read does not deny Describe (only ALLOW implies), as Kafka
    assert a.authorize(ALICE, Op.DESCRIBE, TOPIC, "t")
    # DENY on a prefix beats a literal ALLOW
    a = authorizer(acl("payments", Op.WRITE), acl("pay", Op.WRITE, DENY, pattern=PREFIXED))
    assert not a.authorize(ALICE, Op.WRITE, TOPIC, "payments")
    # DENY from one host only
    a = authorizer(acl("t", Op.READ), acl("t", Op.READ, DENY, host="10.0.0.9"))
    assert a.authorize(ALICE, Op.READ, TOPIC, "t")
    assert not a.authorize(session(host="10.0.0.9"), Op.READ, TOPIC, "t")


def test_prefixed_literal_and_wildcard_resource_names() -> None:
    a = authorizer(
        acl("replog-sink/", Op.WRITE, pattern=PREFIXED, rtype=ResourceType.TRANSACTIONAL_ID),
        acl("events", Op.READ),
        acl("*", Op.DESCRIBE, principal="User:bob"),
    )
    tid = ResourceType.TRANSACTIONAL_ID
    assert a.authorize(ALICE, Op.WRITE, tid, "replog-sink/s1/0")
    assert a.authorize(ALICE, Op.WRITE, tid, "replog-sink/")
    assert not a.authorize(ALICE, Op.WRITE, tid, "replog-sink")
    assert not a.authorize(ALICE, Op.WRITE, tid, "other")
    assert not a.authorize(ALICE, Op.WRITE, TOPIC, "replog-sink/s1")  # another resource type
    assert a.authorize(ALICE, Op.READ, TOPIC, "events")
    assert not a.authorize(ALICE, Op.READ, TOPIC, "events2")  # literal is not a prefix
    assert a.authorize(BOB, Op.DESCRIBE, TOPIC, "anything")
    assert not a.authorize(BOB, Op.READ, TOPIC, "anything")


def test_wildcard_principal_and_host() -> None:
    a = authorizer(acl("t", Op.READ, principal="User:*", host="10.0.0.1"))
    assert a.authorize(ALICE, Op.READ, TOPIC, "t")
    assert a.authorize(BOB, Op.READ, TOPIC, "t")
    assert not a.authorize(session(host="10.0.0.2"), Op.READ, TOPIC, "t")
    a = authorizer(acl("t", Op.READ))
    assert not a.authorize(BOB, Op.READ, TOPIC, "t")


def test_no_acl_on_the_resource_denies_unless_allow_everyone() -> None:
    a = authorizer(acl("t", Op.READ))
    assert not a.authorize(ALICE, Op.READ, TOPIC, "other")
    assert not authorizer().authorize(ALICE, Op.READ, TOPIC, "t")
    everyone = {"allow_everyone_if_no_acl_found": True}
    a = authorizer(acl("t", Op.READ), **everyone)
    assert a.authorize(BOB, Op.WRITE, TOPIC, "other")  # no ACL names "other"
    assert not a.authorize(BOB, Op.READ, TOPIC, "t")  # an ACL names "t", not for bob
    # a prefixed ACL covering the name counts as "an ACL on the resource"
    a = authorizer(acl("o", Op.READ, pattern=PREFIXED), **everyone)
    assert not a.authorize(BOB, Op.READ, TOPIC, "other")


def test_super_users_and_the_internal_session_may_do_everything() -> None:
    a = authorizer(
        acl("t", Op.ALL, DENY, principal="User:*"),
        super_users=" User:admin ; User:broker;",
    )
    assert a.authorize(session("admin"), Op.WRITE, TOPIC, "t")
    assert a.authorize(session("broker"), Op.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME)
    assert not a.authorize(ALICE, Op.READ, TOPIC, "t")
    with internal_scope() as internal:
        assert a.authorize(internal, Op.WRITE, TOPIC, "t")
    assert a.authorize_any(session("admin"), Op.WRITE, TOPIC)


def test_authorize_any_is_kafka_s_authorize_by_resource_type() -> None:
    write = Op.WRITE
    assert not authorizer().authorize_any(ALICE, write, TOPIC)
    assert authorizer(allow_everyone_if_no_acl_found=True).authorize_any(ALICE, write, TOPIC)
    assert authorizer(acl("t", write)).authorize_any(ALICE, write, TOPIC)
    assert not authorizer(acl("t", write)).authorize_any(BOB, write, TOPIC)
    assert not authorizer(acl("t", Op.READ)).authorize_any(ALICE, write, TOPIC)
    assert not authorizer(acl("t", write, rtype=GROUP)).authorize_any(ALICE, write, TOPIC)
    # a literal allow cancelled by the same literal deny, or by a deny of a prefix of it
    assert not authorizer(acl("t", write), acl("t", write, DENY)).authorize_any(ALICE, write, TOPIC)
    denied = authorizer(acl("team-a", write), acl("team", write, DENY, pattern=PREFIXED))
    assert not denied.authorize_any(ALICE, write, TOPIC)
    allowed = authorizer(
        acl("team-a", write), acl("team", write, DENY, pattern=PREFIXED), acl("x", write)
    )
    assert allowed.authorize_any(ALICE, write, TOPIC)
    # wildcards
    assert authorizer(acl("*", Op.ALL)).authorize_any(ALICE, write, TOPIC)
    assert not authorizer(acl("t", write), acl("*", write, DENY)).authorize_any(ALICE, write, TOPIC)


def test_filters_select_bindings_as_kafka_s() -> None:
    lit = acl("events", Op.READ)
    pre = acl("ev", Op.WRITE, pattern=PREFIXED)
    star = acl("*", Op.DESCRIBE, principal="User:bob", host="10.0.0.1")
    grp = acl("events", Op.READ, rtype=GROUP)
    every = [lit, pre, star, grp]

    def selected(f: AclBindingFilter) -> list[AclBinding]:
        return [b for b in every if f.matches(b)]

    assert selected(AclBindingFilter()) == every
    assert selected(AclBindingFilter(TOPIC)) == [lit, pre, star]
    assert selected(AclBindingFilter(TOPIC, "events")) == [lit]  # ANY: exact name
    assert selected(AclBindingFilter(TOPIC, "events", LITERAL)) == [lit]
    assert selected(AclBindingFilter(TOPIC, "ev", PREFIXED)) == [pre]
    assert selected(AclBindingFilter(TOPIC, "events", PREFIXED)) == []
    # MATCH: every binding that applies to the topic "events"
    assert selected(AclBindingFilter(TOPIC, "events", PatternType.MATCH)) == [lit, pre, star]
    assert selected(AclBindingFilter(TOPIC, "other", PatternType.MATCH)) == [star]
    assert selected(AclBindingFilter(principal="User:bob")) == [star]
    assert selected(AclBindingFilter(host="10.0.0.1")) == [star]
    assert selected(AclBindingFilter(operation=Op.WRITE)) == [pre]
    assert selected(AclBindingFilter(permission=DENY)) == []


def test_bindings_from_the_wire_are_validated() -> None:
    good = AclBinding.from_wire(2, "t", 3, "User:alice", "*", 3, 3)
    assert good == acl("t", Op.READ)
    cases = [
        ((1, "t", 3, "User:a", "*", 3, 3), "resource type ANY"),
        ((9, "t", 3, "User:a", "*", 3, 3), r"ResourceType code 9 is unknown: use one of"),
        ((2, "t", 2, "User:a", "*", 3, 3), "pattern type MATCH is only for filters"),
        ((2, "t", 3, "User:a", "*", 1, 3), "operation ANY is only for filters"),
        ((2, "t", 3, "User:a", "*", 3, 1), "permission type ANY"),
        ((2, "", 3, "User:a", "*", 3, 3), "resource name is empty"),
        ((4, "other", 3, "User:a", "*", 7, 3), "named 'kafka-cluster'"),
        ((2, "t", 3, "alice", "*", 3, 3), "principal 'alice' is not TYPE:NAME"),
        ((2, "t", 3, "User:a", "", 3, 3), "host is empty"),
    ]
    for args, message in cases:
        with pytest.raises(InvalidRequestError, match=message):
            AclBinding.from_wire(*args)
    assert AclBindingFilter.from_wire(1, None, 2, None, None, 1, 1) == AclBindingFilter(
        pattern_type=PatternType.MATCH
    )
    with pytest.raises(InvalidRequestError, match="AclOperation code 0"):
        AclBindingFilter.from_wire(1, None, 1, None, None, 0, 1)


def test_authorizer_from_config_caches_by_the_acls_tuple() -> None:
    acls: list[tuple[AclBinding, ...]] = [(acl("t", Op.READ),)]
    assert authorizer_from(SecurityConfig(), lambda: acls[0]) is None
    for name in (
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "kafka.security.authorizer.AclAuthorizer",
    ):
        a = authorizer_from(SecurityConfig(authorizer_class_name=name), lambda: acls[0])
        assert a is not None
        assert a.authorize(ALICE, Op.READ, TOPIC, "t")
        acls[0] = (acl("t", Op.READ, DENY, principal="User:*"), *acls[0])
        assert not a.authorize(ALICE, Op.READ, TOPIC, "t")
        acls[0] = acls[0][1:]
    with pytest.raises(ConfigError, match=r"kafka\.Mine.*StandardAuthorizer"):
        authorizer_from(SecurityConfig(authorizer_class_name="kafka.Mine"), lambda: ())


def test_the_index_is_built_once_per_acls_tuple() -> None:
    tuples: list[tuple[AclBinding, ...]] = [(acl("t", Op.READ),)]
    a = authorizer_from(
        SecurityConfig(authorizer_class_name="kafka.security.authorizer.AclAuthorizer"),
        lambda: tuples[-1],
    )
    assert a is not None
    first = a.current()  # type: ignore[attr-defined]
    a.authorize(ALICE, Op.READ, TOPIC, "t")
    assert a.current() is first  # type: ignore[attr-defined]
    tuples.append((*tuples[-1], acl("u", Op.READ)))
    assert a.authorize(ALICE, Op.READ, TOPIC, "u")
    assert a.current() is not first  # type: ignore[attr-defined]
