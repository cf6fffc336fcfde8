"""The authorization matrix over real broker processes: for every API a broker serves
(the list comes from the broker's own ApiVersions answer, so an API added later without a case
here fails), a valid request from ``User:alice`` with no ACLs is refused with Kafka's
authorization error (or, for a listing, an answer with everything filtered out) and changes
nothing; with the minimal ACL of its row in security/api_acls.py the same request gets past
authorization. The count of unauthorized operations that succeed must be 0.

The same cases go through the Kafka listener too (raw Kafka frames written with kio), for the
APIs its ApiVersions answer lists. The broker-to-controller APIs are sent by alice both to a
broker and to the controller itself.

A broker that logs in as a user without ClusterAction (``intruder``) never registers and its
follower fetches are refused, until ``replog acls add --cluster --operation ClusterAction``;
then it joins the ISR, and falls out again once the ACL is removed. A process that does not
log in at all gets no answer to BrokerRegistration.

The cluster: a controller and two brokers, both listeners SASL_SSL, the StandardAuthorizer,
``super.users=User:broker;User:admin``; ``admin`` sets up the resources and grants ACLs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import re
import socket
import ssl
import struct
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer
from scramp import ScramClient

from replication import protocol as p
from replication.client import Admin, Producer
from replication.common import TopicPartition
from replication.errors import (
    BrokerIdNotRegisteredError,
    ReplogError,
)
from replication.kafka.records import replog_to_kafka
from replication.kafka.translate import to_kafka, to_replog
from replication.kafka.wire import response_class
from replication.protocol import acls as pa
from replication.security.acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from tests.authz_cases import (
    ALICE,
    AUTH_CODES,
    CLUSTER_DENIED,
    DOOMED,
    DOOMED_GROUP,
    EXEMPT,
    FAKE_BROKER,
    GROUP_DENIED,
    GROW,
    NOT_ATTEMPTED,
    RESPONSES,
    SINK,
    TOPIC_DENIED,
    TRIM,
    TRIMMED_GROUP,
    TX,
    TXN_DENIED,
    Case,
    Ctx,
    G,
    T,
    cases,
    client_config,
    connect,
    error_codes,
    fetch_request,
    send,
    served,
    txn_coordinator,
)
from tests.cluster import START_TIMEOUT_S, BrokerProcess, Cluster, wait_until
from tests.security_env import SecurityEnv

pytestmark = [pytest.mark.cluster]

# --- the cluster -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> SecurityEnv:
    env = SecurityEnv.create(tmp_path_factory.mktemp("matrix-secrets"))
    env.users["admin"] = "admin-secret-5e0b"
    env.users["intruder"] = "intruder-secret-77a1"
    env.users["victim"] = "victim-secret-1d93"
    return env


def overrides(env: SecurityEnv, login: str = "broker") -> dict[str, str]:
    return env.broker_overrides(
        "SASL_SSL",
        **{
            "sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "sasl.jaas.config": env.jaas(login),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:broker;User:admin",
        },
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, env: SecurityEnv) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path_factory.mktemp("matrix-cluster"),
        brokers=2,
        kafka=True,
        overrides=overrides(env),
        client=client_config(env, "admin"),
    )
    env.bootstrap(c.metadata_root)
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture(scope="module")
def admin(cluster: Cluster) -> Iterator[Admin]:
    with Admin({**cluster.client, "bootstrap_servers": cluster.bootstrap}) as a:
        yield a


# --- state -------------------------------------------------------------------------------------


def state(ctx: Ctx) -> dict[str, Any]:
    """What an unauthorized request must not change, as the admin (a super user) sees it."""
    admin = ctx.admin
    topics = admin.list_topics(include_internal=True)
    described = {
        t.name: [(q.partition, q.replicas) for q in t.partitions]
        for t in admin.describe_topics(topics)
    }
    partitions = [TopicPartition(t, 0) for t in (T, TRIM)]
    groups = sorted(g for g, _ in admin.list_consumer_groups())
    return {
        "topics": described,
        "brokers": [b.node_id for b in admin.describe_cluster().brokers],
        "end offsets": admin.list_offsets(dict.fromkeys(partitions, "latest")),
        "start offsets": admin.list_offsets(dict.fromkeys(partitions, "earliest")),
        "groups": groups,
        "group offsets": {g: admin.list_consumer_group_offsets(g) for g in groups if "matrix" in g},
        "acls": admin.describe_acls(),
        "users": admin.describe_user_scram_credentials(),
        "configs": {k: v.value for k, v in admin.describe_configs("topic", T).items()},
        "sink": admin.last_committed_batch(SINK),
        "transactions": sorted((t.transactional_id, t.state) for t in admin.list_transactions()),
    }


def alice_acls_everywhere(ctx: Ctx, expected: list[AclBinding]) -> bool:
    """Whether every node (controller included) has applied exactly ``expected`` for alice."""
    request = pa.DescribeAclsRequest(principal_filter=ALICE)
    want = sorted(expected)
    for node in [ctx.cluster.controller, *ctx.cluster.brokers.values()]:
        with closing(connect(ctx.env, node.bootstrap, "admin")) as conn:
            response = send(conn, p.ApiKey.DESCRIBE_ACLS, request)
        seen = sorted(
            AclBinding.from_wire(
                r.resource_type,
                r.resource_name,
                r.pattern_type,
                a.principal,
                a.host,
                a.operation,
                a.permission_type,
            )
            for r in response.resources
            for a in r.acls
        )
        if seen != want:
            return False
    return True


def forget_fake_broker(ctx: Ctx) -> None:
    """Unregister the broker the BrokerRegistration case registered (fenced, as every new
    registration: no heartbeat of it reports the metadata), and wait until no node lists it:
    a later case's state check must not see it leave (nor list groups from it)."""
    with contextlib.suppress(BrokerIdNotRegisteredError):
        ctx.admin.unregister_broker(FAKE_BROKER)

    def gone_everywhere() -> bool:
        for node in ctx.cluster.brokers.values():
            with closing(connect(ctx.env, node.bootstrap, "admin")) as conn:
                response = send(conn, p.ApiKey.METADATA, p.MetadataRequest(topics=[]))
            if FAKE_BROKER in {b.node_id for b in response.brokers}:
                return False
        return True

    wait_until(gone_everywhere, timeout=30)


def set_alice_acls(ctx: Ctx, grants: list[tuple[AclOperation, ResourceType, str]]) -> None:
    ctx.admin.delete_acls([AclBindingFilter(principal=ALICE)])
    bindings = [
        AclBinding(rt, name, PatternType.LITERAL, ALICE, "*", op, AclPermissionType.ALLOW)
        for op, rt, name in grants
    ]
    ctx.admin.create_acls(bindings)
    wait_until(lambda: alice_acls_everywhere(ctx, bindings), timeout=30)


# --- the setup -----------------------------------------------------------------------------------


def retrying(action: Callable[..., object]) -> None:
    """``action()`` until it stops failing with a retriable error (a coordinator that is
    still loading, a leader not yet elected)."""

    def attempt() -> bool:
        try:
            action()
        except ReplogError as err:
            if not err.retriable:
                raise
            return False
        return True

    wait_until(attempt, timeout=30)


def set_up(ctx: Ctx) -> None:
    admin = ctx.admin
    for topic in (T, TRIM, GROW, DOOMED):
        admin.create_topic(topic, 1, 2)
    config = {**ctx.cluster.client, "bootstrap_servers": ctx.cluster.bootstrap, "acks": "all"}
    with Producer(config) as producer:
        for topic in (T, TRIM):
            for i in range(3):
                producer.send(topic, b"v%d" % i, partition=0).result()
    for group in (G, DOOMED_GROUP, TRIMMED_GROUP):
        retrying(lambda g=group: admin.alter_consumer_group_offsets(g, {TopicPartition(T, 0): 1}))
    # a transactional id that exists (so that listings have something to hide), with a
    # producer id and epoch the transactional cases use
    with Producer({**config, "transactional_id": TX}) as producer:
        producer.init_transactions()
    with closing(connect(ctx.env, txn_coordinator(ctx), "admin")) as conn:
        (state_,) = send(
            conn,
            p.ApiKey.DESCRIBE_TRANSACTIONS,
            p.DescribeTransactionsRequest(transactional_ids=[TX]),
        ).transaction_states
    ctx.producer_id, ctx.producer_epoch = state_.producer_id, state_.producer_epoch


# --- the matrix ----------------------------------------------------------------------------------


@dataclass
class Row:
    case: str
    api: p.ApiKey
    target: str
    denied_as: str
    allowed_after: str
    unauthorized_success: bool
    vacuous: bool


def describe_codes(codes: list[int]) -> str:
    names = {
        TOPIC_DENIED: "TOPIC_AUTHORIZATION_FAILED",
        GROUP_DENIED: "GROUP_AUTHORIZATION_FAILED",
        CLUSTER_DENIED: "CLUSTER_AUTHORIZATION_FAILED",
        TXN_DENIED: "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        NOT_ATTEMPTED: "OPERATION_NOT_ATTEMPTED",
        0: "NONE",
    }
    return ",".join(sorted({names.get(c, str(c)) for c in codes})) or "no error codes"


def run_case(
    ctx: Ctx, case: Case, send_as_alice: Callable[[p.ApiKey, Any], Any] | None = None
) -> Row:
    """Send the case's request as alice without ACLs, then with its grants."""
    set_alice_acls(ctx, [])
    target = case.target(ctx)
    if send_as_alice is None:
        conn = ctx.as_alice(target)

        def send_as_alice(api: p.ApiKey, body: Any) -> Any:
            return send(conn, api, body)

    before = state(ctx)
    response = send_as_alice(case.api, case.request(ctx))
    changed = [k for k, v in state(ctx).items() if before[k] != v]
    codes = error_codes(response)
    auth = set(codes) & AUTH_CODES
    if case.filtered is not None:
        denied = case.filtered(response) and not auth and set(codes) <= {0}
        denied_as = "filtered" if denied else f"NOT filtered ({describe_codes(codes)})"
    else:
        denied = bool(auth) and set(codes) <= AUTH_CODES | {0, NOT_ATTEMPTED}
        if case.denied_code is not None:
            denied = denied and auth == {case.denied_code}
        denied_as = (
            describe_codes([c for c in codes if c])
            if denied
            else (f"NOT denied ({describe_codes(codes)})")
        )
    if changed:
        denied_as += f"; CHANGED {', '.join(changed)}"
    set_alice_acls(ctx, case.grants)
    response = send_as_alice(case.api, case.request(ctx))
    codes = error_codes(response)
    allowed = not set(codes) & AUTH_CODES and case.allowed(response)
    allowed_after = ("ok " if allowed else "STILL REFUSED ") + describe_codes(codes)
    return Row(
        case.name,
        case.api,
        target,
        denied_as,
        allowed_after,
        unauthorized_success=not denied or bool(changed),
        vacuous=not allowed,
    )


def print_matrix(rows: list[Row]) -> None:
    width = max(len(r.case) for r in rows)
    print(f"\n{'API':<{width}}  {'denied as':<45}  allowed after the ACL")
    for r in rows:
        print(f"{r.case:<{width}}  {r.denied_as:<45}  {r.allowed_after}")


@pytest.fixture(scope="module")
def ctx(env: SecurityEnv, cluster: Cluster, admin: Admin) -> Ctx:
    """The cluster with the resources the cases work on."""
    ctx = Ctx(env, cluster, admin)
    set_up(ctx)
    return ctx


def test_every_api_is_refused_without_its_acl_and_allowed_with_it(
    env: SecurityEnv, cluster: Cluster, admin: Admin, ctx: Ctx
) -> None:
    all_cases = cases()
    covered = {case.api for case in all_cases}
    # the APIs come from the nodes' own ApiVersions answers: one served without a case fails
    for node in [*cluster.brokers.values(), cluster.controller]:
        with closing(connect(env, node.bootstrap, "alice")) as conn:
            missing = served(conn) - EXEMPT - covered
        assert not missing, f"{node.role} {node.broker_id} serves APIs without a case: {missing}"
    rows: list[Row] = []
    try:
        for case in all_cases:
            rows.append(run_case(ctx, case))
    finally:
        for conn in ctx.alice.values():
            conn.close()
        if rows:
            print_matrix(rows)
        set_alice_acls(ctx, [])
        forget_fake_broker(ctx)
    unauthorized = [r.case for r in rows if r.unauthorized_success]
    vacuous = [r.case for r in rows if r.vacuous]
    print(
        f"{len(rows)} cases over {len(covered)} APIs; unauthorized successes: {len(unauthorized)}"
    )
    assert unauthorized == []
    assert vacuous == []


# --- the Kafka listener --------------------------------------------------------------------------

#: the version each API is sent at on the Kafka listener: the lowest it serves (closest to
#: replog's own messages), except where that version cannot say what the case says
#: versions that carry the refusal: DescribeLogDirs before v3 has no top-level error code,
#: so an unauthorized caller gets an empty answer there, as from Kafka
KAFKA_VERSIONS = {
    p.ApiKey.FIND_COORDINATOR: 3,
    p.ApiKey.METADATA: 4,
    p.ApiKey.ELECT_LEADERS: 1,
    p.ApiKey.DESCRIBE_LOG_DIRS: 3,
}


def kio_request(api: int, version: int) -> Any:
    """kio's request class of an API version (typed loosely: its fields differ per class)."""
    return load_request_schema(api, version)


class KafkaConnection:
    """A raw Kafka-protocol connection over TLS, logged in with SCRAM-SHA-512 (SaslHandshake
    v1 and SaslAuthenticate v2, scramp doing the SCRAM), that sends kio messages."""

    def __init__(self, env: SecurityEnv, address: str, user: str) -> None:
        host, port = address.rsplit(":", 1)
        context = ssl.create_default_context(cafile=str(env.ca))
        raw = socket.create_connection((host, int(port)), timeout=30)
        self.sock = context.wrap_socket(raw, server_hostname=host)
        self._ids = itertools.count(1)
        handshake = self.request(kio_request(p.ApiKey.SASL_HANDSHAKE, 1)(
            mechanism="SCRAM-SHA-512"
        ))  # fmt: skip
        assert handshake.error_code == 0, handshake
        scram = ScramClient(["SCRAM-SHA-512"], user, env.users[user])
        authenticate = kio_request(p.ApiKey.SASL_AUTHENTICATE, 2)
        first = self.request(authenticate(auth_bytes=scram.get_client_first().encode()))
        assert first.error_code == 0, first
        scram.set_server_first(first.auth_bytes.decode())
        final = self.request(authenticate(auth_bytes=scram.get_client_final().encode()))
        assert final.error_code == 0, final
        scram.set_server_final(final.auth_bytes.decode())
        versions = self.request(
            kio_request(p.ApiKey.API_VERSIONS, 3)(
                client_software_name="matrix", client_software_version="1"
            )
        )
        self.api_versions = {
            int(k.api_key): (k.min_version, k.max_version) for k in versions.api_keys
        }

    def close(self) -> None:
        self.sock.close()

    def request(self, body: Any) -> Any:
        cls = type(body)
        header_cls: Any = cls.__header_schema__
        out = io.BytesIO()
        correlation_id = next(self._ids)
        entity_writer(header_cls)(
            out,
            header_cls(
                request_api_key=cls.__api_key__,
                request_api_version=cls.__version__,
                correlation_id=correlation_id,
                client_id="matrix",
            ),
        )
        entity_writer(cls)(out, body)
        data = out.getvalue()
        self.sock.sendall(struct.pack(">i", len(data)) + data)
        (size,) = struct.unpack(">i", self._recv(4))
        frame = self._recv(size)
        response_cls: Any = response_class(cls.__api_key__, cls.__version__)
        header, offset = entity_reader(response_cls.__header_schema__)(frame, 0)
        assert header.correlation_id == correlation_id
        response, _ = entity_reader(response_cls)(frame, offset)
        return response

    def _recv(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            out += chunk
        return bytes(out)

    def send(self, api: p.ApiKey, body: Any) -> Any:
        """Send replog's message ``body`` as Kafka's; the answer as replog's message."""
        low, high = self.api_versions[api]
        version = min(max(KAFKA_VERSIONS.get(api, low), low), high)
        if api == p.ApiKey.PRODUCE:  # a Kafka client sends Kafka's record batches
            body = dataclasses.replace(
                body,
                topic_data=[
                    dataclasses.replace(
                        t,
                        partition_data=[
                            dataclasses.replace(q, records=replog_to_kafka(q.records))
                            for q in t.partition_data
                        ],
                    )
                    for t in body.topic_data
                ],
            )
        response = self.request(to_kafka(body, load_request_schema(api, version)))
        if api == p.ApiKey.CONSUMER_GROUP_HEARTBEAT:  # Kafka's assignment is a struct
            response = dataclasses.replace(response, assignment=None)
        if api == p.ApiKey.LIST_TRANSACTIONS:  # Kafka names the listings transaction_states
            return p.ListTransactionsResponse(
                error_code=response.error_code,
                transactions=[
                    p.TransactionListing(
                        transactional_id=t.transactional_id,
                        producer_id=t.producer_id,
                        transaction_state=t.transaction_state,
                    )
                    for t in response.transaction_states
                ],
            )
        return to_replog(response, RESPONSES[api])


def kafka_address(ctx: Ctx, address: str) -> str | None:
    """The Kafka listener of the broker at ``address`` (None: the controller has none)."""
    for broker in ctx.cluster.brokers.values():
        if broker.bootstrap == address:
            return broker.kafka_bootstrap
    return None


def test_the_kafka_listener_refuses_every_api_without_its_acl_too(
    env: SecurityEnv, cluster: Cluster, admin: Admin, ctx: Ctx
) -> None:
    """The same matrix through the Kafka listener, whose Produce, Fetch, Metadata,
    FindCoordinator and LeaveGroup are its own handlers (the rest are translated to replog's
    messages and answered by the same handlers)."""
    conn = KafkaConnection(env, cluster.brokers[0].kafka_bootstrap, "alice")
    served_kafka = {p.ApiKey(k) for k in conn.api_versions}
    conn.close()
    kafka_cases = [c for c in cases() if c.api in served_kafka and "follower" not in c.name]
    missing = served_kafka - EXEMPT - {c.api for c in kafka_cases}
    assert not missing, f"the Kafka listener serves APIs without a case: {missing}"
    connections: dict[str, KafkaConnection] = {}
    rows: list[Row] = []
    try:
        for case in kafka_cases:
            address = kafka_address(ctx, case.target(ctx))
            if address is None:
                continue
            if address not in connections:
                connections[address] = KafkaConnection(env, address, "alice")
            kafka = connections[address]
            rows.append(run_case(ctx, case, kafka.send))
    finally:
        for k in connections.values():
            k.close()
        if rows:
            print_matrix(rows)
        set_alice_acls(ctx, [])
        forget_fake_broker(ctx)
    unauthorized = [r.case for r in rows if r.unauthorized_success]
    print(f"Kafka listener: {len(rows)} cases; unauthorized successes: {len(unauthorized)}")
    assert unauthorized == []
    assert [r.case for r in rows if r.vacuous] == []


# --- no login at all -------------------------------------------------------------------------


def test_an_unauthenticated_process_cannot_register_as_a_broker(
    env: SecurityEnv, cluster: Cluster, admin: Admin
) -> None:
    """A process that speaks TLS but does not log in: its BrokerRegistration (to a broker,
    which would forward it, or to the controller) closes the connection unanswered, and no
    broker appears. (The controller's claim is written to the metadata store, not sent over
    any listener: there is no request that claims it.)"""
    cluster_id = admin.describe_cluster().cluster_id or ""
    request = p.BrokerRegistrationRequest(
        broker_id=FAKE_BROKER + 2,
        cluster_id=cluster_id,
        incarnation_id=uuid.uuid4(),
        listeners=[p.BrokerRegistrationListener(name="REPLOG", host="127.0.0.1", port=1)],
    )
    context = ssl.create_default_context(cafile=str(env.ca))
    for node in (cluster.brokers[0], cluster.controller):
        raw = socket.create_connection(("127.0.0.1", node.port), timeout=30)
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            header = p.RequestHeader(
                api_key=p.ApiKey.BROKER_REGISTRATION, api_version=0, correlation_id=1
            )
            sock.sendall(p.encode_request(header, request))
            try:
                answer = sock.recv(4)
            except (ConnectionResetError, ssl.SSLError):
                answer = b""
            assert answer == b"", f"{node.role} answered a request before authentication"
    with pytest.raises(BrokerIdNotRegisteredError):  # not even fenced: never registered
        admin.unregister_broker(FAKE_BROKER + 2)


# --- a broker without ClusterAction --------------------------------------------------------------


def replog_cli(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "replication.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}{result.stdout}"
    return result.stdout


def isr(admin: Admin, topic: str) -> set[int] | None:
    """The ISR of partition 0, or None while the broker asked has not heard of the topic."""
    try:
        return set(admin.describe_topic(topic).partitions[0].isr)
    except ReplogError:
        return None


def knows(env: SecurityEnv, broker: BrokerProcess, topic: str) -> bool:
    """Whether ``broker`` has applied the metadata that created ``topic``."""
    request = p.MetadataRequest(topics=[p.MetadataRequestTopic(name=topic)])
    with closing(connect(env, broker.bootstrap, "admin")) as conn:
        return all(t.error_code == 0 for t in send(conn, p.ApiKey.METADATA, request).topics)


def test_a_broker_without_cluster_action_cannot_register_or_replicate_until_granted(
    env: SecurityEnv, cluster: Cluster, admin: Admin, tmp_path: Path
) -> None:
    """``intruder`` is a real user with a good password, but not a super user: a broker that
    logs in as intruder is refused BrokerRegistration (so it never gets a replica) and its
    follower fetches are refused; ``replog acls add --cluster --operation ClusterAction``
    lets it in, and it then catches up and joins the ISR."""
    node = BrokerProcess(
        cluster.data_dir / "broker-intruder",
        broker_id=3,
        overrides={**cluster.brokers[0].overrides, "sasl.jaas.config": env.jaas("intruder")},
        client=cluster.client,
    )
    # a broker prints its ready line once registered: start it in the background
    start_errors: list[BaseException] = []

    def start() -> None:
        try:
            node.start()
        except BaseException as err:
            start_errors.append(err)

    starting = threading.Thread(target=start, daemon=True)
    followed = "matrix-followed"
    retrying(lambda: admin.create_topic(followed, 1, 2))
    try:
        starting.start()
        # the controller refuses it, logging who and what
        wait_until(
            lambda: "broker registration refused" in node.stderr_tail(1000),
            message="the intruder's registration was not refused",
        )
        log = cluster.controller.stderr_tail(100_000)
        assert re.search(r"User:intruder.*ClusterAction.*BrokerRegistration", log), log[-3000:]
        assert 3 not in {b.node_id for b in admin.describe_cluster().brokers}
        # it cannot follow either: its follower fetch is refused as Kafka refuses it
        ctx = Ctx(env, cluster, admin)
        with closing(connect(env, ctx.leader(followed), "intruder")) as conn:
            response = send(conn, p.ApiKey.FETCH, fetch_request(3, followed)(ctx))
        assert set(error_codes(response)) - {0} == {TOPIC_DENIED}
        assert 3 not in {b.node_id for b in admin.describe_cluster().brokers}

        # the operator grants ClusterAction
        properties = tmp_path / "admin.properties"
        properties.write_text(
            "security.protocol=SASL_SSL\n"
            f"ssl.truststore.location={env.ca}\n"
            "sasl.mechanism=SCRAM-SHA-512\n"
            f"sasl.jaas.config={env.jaas('admin')}\n"
        )
        properties.chmod(0o600)
        replog_cli(
            "acls", "add", "--allow-principal", "User:intruder", "--cluster",
            "--operation", "ClusterAction",
            "--bootstrap-server", cluster.bootstrap, "--command-config", str(properties),
        )  # fmt: skip
        wait_until(
            lambda: 3 in {b.node_id for b in admin.describe_cluster().brokers},
            message="the intruder did not register after ClusterAction was granted",
        )
        starting.join(START_TIMEOUT_S)
        assert not starting.is_alive()
        assert not start_errors, start_errors
        topic = "matrix-replicated"
        retrying(lambda: admin.create_topic(topic, 1, 3))
        # (each broker answers from the metadata it has applied: poll until they all know it)
        nodes = [*cluster.brokers.values(), node]
        wait_until(lambda: all(knows(env, b, topic) for b in nodes))
        assert 3 in admin.describe_topic(topic).partitions[0].replicas
        config = {**cluster.client, "bootstrap_servers": cluster.bootstrap, "acks": "all"}
        with Producer(config) as producer:
            producer.send(topic, b"replicated", partition=0).result()
        wait_until(lambda: isr(admin, topic) == {0, 1, 3}, message="broker 3 did not join the ISR")

        # and once ClusterAction is taken away again, it falls out of the ISR while the
        # others go on committing without it
        replog_cli(
            "acls", "remove", "--allow-principal", "User:intruder", "--cluster",
            "--operation", "ClusterAction", "--force",
            "--bootstrap-server", cluster.bootstrap, "--command-config", str(properties),
        )  # fmt: skip
        # (not idempotent: broker 3 cannot get producer ids any more, and a producer that asks
        # it for one is told to retry)
        with Producer({**config, "enable_idempotence": False}) as producer:
            producer.send(topic, b"without-the-intruder", partition=0).result()
        wait_until(lambda: isr(admin, topic) == {0, 1}, message="broker 3 stayed in the ISR")
    finally:
        starting.join(START_TIMEOUT_S)
        if node.alive:
            node.kill()
        admin.delete_acls([AclBindingFilter(principal="User:intruder")])
