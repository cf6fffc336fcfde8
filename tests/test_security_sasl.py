"""SASL end to end on real broker processes: a 3-broker cluster whose REPLOG listener (clients,
followers, the controller: the nodes log in as User:broker with SCRAM-SHA-512) and Kafka
listener are SASL_SSL, with replog's client, kcat, confluent-kafka and kafka-python logging in
with SCRAM-SHA-256/512 (and PLAIN over TLS).

Refusals (a wrong password, an unknown user, an unknown mechanism, requests before
authentication, a client that stops half way, seeded garbled SASL frames) close that one
connection with an INFO line; the broker stays up and a good client still produces.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import random
import re
import shutil
import socket
import ssl
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import kafka
import pytest
from scramp import ScramMechanism

from logstore.errors import ConfigError
from replication import protocol as p
from replication.client import Admin, Producer
from replication.client.config import ClientConfig, load
from replication.client.types import PartitionInfo
from replication.common import TopicPartition
from replication.config import broker_config_from
from replication.errors import SaslAuthenticationFailedError, UnknownTopicOrPartitionError
from replication.security.connector import broker_connector, client_login_factory
from replication.security.sasl import Login, SaslClient, SaslServer, parse_jaas_config
from replication.security.scram import ScramCredential
from replication.server.node import listener_security
from tests.cluster import BrokerProcess, Cluster, wait_until
from tests.helpers import unique_name
from tests.readback import confluent_read_count, read_to_end
from tests.security_env import SecurityEnv

pytestmark = pytest.mark.cluster

AUTH_TIMEOUT_MS = 3_000
BAD_LOGIN = "Authentication failed during authentication due to invalid credentials"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> SecurityEnv:
    return SecurityEnv.create(tmp_path_factory.mktemp("sasl-secrets"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, env: SecurityEnv) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path_factory.mktemp("sasl-cluster"),
        brokers=3,
        kafka=True,
        overrides=env.broker_overrides(
            "SASL_SSL",
            **{
                "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
                "authentication.timeout.ms": str(AUTH_TIMEOUT_MS),
            },
        ),
        client=env.client_config("SASL_SSL"),
    )
    env.bootstrap(c.metadata_root)
    try:
        yield c.start()
    finally:
        c.stop()  # also after a failed start: no process left behind


def stderr(cluster: Cluster) -> str:
    return "\n".join(b.stderr_tail(100_000) for b in cluster.brokers.values())


def new_topic(cluster: Cluster) -> str:
    topic = unique_name("sasl")
    with Admin({**cluster.client, "bootstrap_servers": cluster.bootstrap}) as admin:
        admin.create_topic(topic, 1, 3)
    return topic


def read_values(cluster: Cluster, topic: str) -> list[bytes | None]:
    read = read_to_end(
        cluster.bootstrap,
        [TopicPartition(topic, 0)],
        isolation_level="read_uncommitted",
        **cluster.client,
    )
    return [r.value for r in read.records]


def produce(cluster: Cluster, topic: str, values: list[bytes], **settings: Any) -> None:
    config = {**cluster.client, **settings, "bootstrap_servers": cluster.bootstrap, "acks": "all"}
    with Producer(config) as producer:
        futures = [producer.send(topic, v, partition=0) for v in values]
        producer.flush()
        for f in futures:
            f.result()


def good_client_still_works(cluster: Cluster) -> None:
    assert all(b.alive for b in cluster.brokers.values())
    topic = new_topic(cluster)
    produce(cluster, topic, [b"still-good"])
    assert read_values(cluster, topic) == [b"still-good"]


# --- the good path ------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_replog_client_over_sasl_ssl(cluster: Cluster, mechanism: str) -> None:
    topic = new_topic(cluster)
    values = [f"{mechanism}-{i}".encode() for i in range(10)]
    produce(cluster, topic, values, sasl_mechanism=mechanism)
    assert read_values(cluster, topic) == values
    # the nodes logged in to each other (followers, the controller) as User:broker
    wait_until(lambda: "as User:broker on listener REPLOG" in stderr(cluster), timeout=15)
    assert "as User:alice on listener REPLOG" in stderr(cluster)


def test_jaas_config_login(cluster: Cluster, env: SecurityEnv) -> None:
    topic = new_topic(cluster)
    settings = {
        **env.client_config("SASL_SSL"),
        "sasl.username": "",
        "sasl.password": "",
        "sasl.jaas.config": env.jaas("alice"),
    }
    with Producer({**settings, "bootstrap_servers": cluster.bootstrap, "acks": "all"}) as pr:
        pr.send(topic, b"jaas", partition=0).result(timeout=30)
    assert read_values(cluster, topic) == [b"jaas"]


def _librdkafka(cluster: Cluster, env: SecurityEnv, mechanism: str) -> dict[str, str]:
    return {
        "bootstrap.servers": cluster.kafka_bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": mechanism,
        "sasl.username": "alice",
        "sasl.password": env.users["alice"],
        "ssl.ca.location": str(env.ca),
    }


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_confluent_kafka_over_sasl_ssl(cluster: Cluster, env: SecurityEnv, mechanism: str) -> None:
    topic = new_topic(cluster)
    producer = confluent_kafka.Producer({**_librdkafka(cluster, env, mechanism), "acks": "all"})
    errors: list[object] = []
    for i in range(5):
        producer.produce(
            topic, f"ck-{i}".encode(), partition=0, on_delivery=lambda e, m: errors.append(e)
        )
    assert producer.flush(30) == 0
    assert errors == [None] * 5
    got = confluent_read_count(_librdkafka(cluster, env, mechanism), topic, 1, 5)
    assert [m.value() for m in got] == [f"ck-{i}".encode() for i in range(5)]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kcat_over_sasl_ssl(cluster: Cluster, env: SecurityEnv, mechanism: str) -> None:
    topic = new_topic(cluster)
    options = [
        f"-X{k}={v}"
        for k, v in _librdkafka(cluster, env, mechanism).items()
        if k != "bootstrap.servers"
    ]
    base = ["kcat", "-b", cluster.kafka_bootstrap, *options]
    produced = subprocess.run(
        [*base, "-P", "-t", topic, "-p", "0", "-X", "acks=all"],
        input=b"k1\nk2\nk3\n",
        timeout=60,
        capture_output=True,
    )
    assert produced.returncode == 0, produced.stderr.decode()
    out = subprocess.run(
        [*base, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q"],
        timeout=60,
        capture_output=True,
    )
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.split() == [b"k1", b"k2", b"k3"]


def test_kafka_python_over_sasl_ssl(cluster: Cluster, env: SecurityEnv) -> None:
    topic = new_topic(cluster)
    producer = kafka.KafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap,
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username="alice",
        sasl_plain_password=env.users["alice"],
        ssl_cafile=str(env.ca),
        acks="all",
    )
    producer.send(topic, b"kafka-python", partition=0).get(timeout=30)
    producer.close()
    assert read_values(cluster, topic) == [b"kafka-python"]


# --- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "password"), [("alice", "wrong-password"), ("nobody", "whatever")]
)
def test_bad_login_is_refused(cluster: Cluster, env: SecurityEnv, user: str, password: str) -> None:
    settings = {
        **env.client_config("SASL_SSL"),
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": user,
        "sasl.password": password,
        "bootstrap_servers": cluster.bootstrap,
    }
    with (
        pytest.raises(SaslAuthenticationFailedError, match=BAD_LOGIN + ".*SCRAM-SHA-256"),
        Admin({**settings, "request_timeout_ms": 5_000}) as admin,
    ):
        admin.list_topics()
    wait_until(lambda: f"({BAD_LOGIN} with SASL mechanism SCRAM-SHA-256)" in stderr(cluster))
    assert password not in stderr(cluster)
    good_client_still_works(cluster)


def test_confluent_kafka_with_a_wrong_password_fails(cluster: Cluster, env: SecurityEnv) -> None:
    errors: list[confluent_kafka.KafkaError] = []
    settings: dict[str, Any] = {
        **_librdkafka(cluster, env, "SCRAM-SHA-512"),
        "sasl.password": "nope",
        "error_cb": errors.append,
    }
    producer = confluent_kafka.Producer(settings)
    wait_until(
        lambda: producer.poll(0.2) is not None and any(BAD_LOGIN in e.str() for e in errors),
        timeout=30,
    )
    good_client_still_works(cluster)


class RawSasl:
    """Hand-made frames over TLS to the REPLOG listener, for what no client would send."""

    def __init__(self, cluster: Cluster, env: SecurityEnv, *, kafka: bool = False) -> None:
        ctx = ssl.create_default_context(cafile=str(env.ca))
        broker = cluster.brokers[0]
        port = broker.kafka_port if kafka else broker.port
        raw = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.port = raw.getsockname()[1]
        self.sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        self._ids = 0

    def send(self, api_key: p.ApiKey, version: int, body: Any) -> None:
        self._ids += 1
        header = p.RequestHeader(
            api_key=api_key, api_version=version, correlation_id=self._ids, client_id="raw"
        )
        self.sock.sendall(p.encode_request(header, body))

    def send_raw(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def recv(self, api_key: p.ApiKey, version: int) -> Any:
        size = struct.unpack(">i", self._exactly(4))[0]
        return p.decode_response(self._exactly(size), api_key, version)[1]

    def _exactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionResetError("closed")
            out += chunk
        return out

    def closed_by_broker(self) -> bool:
        self.sock.settimeout(AUTH_TIMEOUT_MS / 1000 * 5)
        try:
            while self.sock.recv(4096):
                pass
        except (ConnectionResetError, ssl.SSLError):
            pass
        self.sock.close()
        return True


def refusal_logged(cluster: Cluster, port: int, reason: str) -> None:
    pattern = re.compile(
        rf"Failed authentication with \('127\.0\.0\.1', {port}\) on listener REPLOG \(.*{reason}"
    )
    wait_until(lambda: pattern.search(stderr(cluster)) is not None, timeout=15)


def test_requests_before_authentication_are_refused(cluster: Cluster, env: SecurityEnv) -> None:
    raw = RawSasl(cluster, env)
    raw.send(p.ApiKey.API_VERSIONS, 1, p.ApiVersionsRequest())
    versions = raw.recv(p.ApiKey.API_VERSIONS, 1)
    served = {k.api_key for k in versions.api_keys}
    assert {p.ApiKey.SASL_HANDSHAKE, p.ApiKey.SASL_AUTHENTICATE} <= served
    raw.send(p.ApiKey.METADATA, 0, p.MetadataRequest(topics=None))
    assert raw.closed_by_broker()
    refusal_logged(cluster, raw.port, "ILLEGAL_SASL_STATE: METADATA request before SASL")
    good_client_still_works(cluster)


def test_authenticate_before_handshake_is_illegal(cluster: Cluster, env: SecurityEnv) -> None:
    raw = RawSasl(cluster, env)
    raw.send(p.ApiKey.SASL_AUTHENTICATE, 1, p.SaslAuthenticateRequest(auth_bytes=b"n,,n=a,r=b"))
    answer = raw.recv(p.ApiKey.SASL_AUTHENTICATE, 1)
    assert answer.error_code == 34  # ILLEGAL_SASL_STATE
    assert raw.closed_by_broker()
    refusal_logged(cluster, raw.port, "ILLEGAL_SASL_STATE")


def test_unknown_mechanism_lists_the_enabled_ones(cluster: Cluster, env: SecurityEnv) -> None:
    raw = RawSasl(cluster, env)
    raw.send(p.ApiKey.SASL_HANDSHAKE, 1, p.SaslHandshakeRequest(mechanism="GSSAPI"))
    answer = raw.recv(p.ApiKey.SASL_HANDSHAKE, 1)
    assert answer.error_code == 33  # UNSUPPORTED_SASL_MECHANISM
    assert answer.mechanisms == ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]
    assert raw.closed_by_broker()
    refusal_logged(cluster, raw.port, "UNSUPPORTED_SASL_MECHANISM: 'GSSAPI'")


def test_cut_after_client_first_is_refused(cluster: Cluster, env: SecurityEnv) -> None:
    raw = RawSasl(cluster, env)
    raw.send(p.ApiKey.SASL_HANDSHAKE, 1, p.SaslHandshakeRequest(mechanism="SCRAM-SHA-256"))
    assert raw.recv(p.ApiKey.SASL_HANDSHAKE, 1).error_code == 0
    client = SaslClient("SCRAM-SHA-256", Login("alice", env.users["alice"]))
    raw.send(p.ApiKey.SASL_AUTHENTICATE, 1, p.SaslAuthenticateRequest(auth_bytes=client.first()))
    assert raw.recv(p.ApiKey.SASL_AUTHENTICATE, 1).error_code == 0
    raw.sock.close()  # gone half way
    refusal_logged(cluster, raw.port, "closed the connection during SASL authentication")
    good_client_still_works(cluster)


def test_silent_after_handshake_is_closed_at_the_deadline(
    cluster: Cluster, env: SecurityEnv
) -> None:
    raw = RawSasl(cluster, env)
    raw.send(p.ApiKey.SASL_HANDSHAKE, 1, p.SaslHandshakeRequest(mechanism="SCRAM-SHA-512"))
    assert raw.recv(p.ApiKey.SASL_HANDSHAKE, 1).error_code == 0
    assert raw.closed_by_broker()
    refusal_logged(cluster, raw.port, "not done within authentication.timeout.ms")


def test_plain_on_sasl_plaintext_needs_the_insecure_flag() -> None:
    base = {
        "bootstrap_servers": "x:1",
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_username": "alice",
        "sasl_password": "pw",
    }
    with pytest.raises(ConfigError, match="in the clear"):
        client_login_factory(load(ClientConfig, base, {}))
    assert client_login_factory(load(ClientConfig, base, {"sasl.plain.insecure.enable": True}))
    with pytest.raises(ConfigError, match="both set"):
        client_login_factory(
            load(ClientConfig, base, {"sasl_mechanism": "SCRAM-SHA-256", "sasl_jaas_config": "x"})
        )


# --- fuzz -------------------------------------------------------------------------------------

#: REPLOG_FUZZ_SEED=<int> replays or varies a run; the seed is in the failure message
FUZZ_SEED = int(os.environ.get("REPLOG_FUZZ_SEED", "0x5A515EED"), 0)
FUZZ_CONNECTIONS = 120


def _frames(rng: random.Random, env: SecurityEnv) -> list[bytes]:
    """A plausible SASL exchange (handshake, client-first, a client-final), each frame
    possibly mutated; payloads without their length prefix."""
    mechanism = rng.choice(["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN", "GSSAPI", ""])
    client = SaslClient(
        mechanism if mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN") else "PLAIN",
        Login(rng.choice(["alice", "bob", "=2C", ""]) or "x", "pw"),
    )
    tokens = [
        client.first(),
        b"c=biws,r=" + bytes(rng.randrange(256) for _ in range(rng.randrange(60))) + b",p=AA==",
    ]
    frames = []
    body: Any = p.SaslHandshakeRequest(mechanism=mechanism)
    frames.append(_encode(p.ApiKey.SASL_HANDSHAKE, 1, body, rng))
    for token in tokens:
        frames.append(
            _encode(
                p.ApiKey.SASL_AUTHENTICATE,
                rng.choice([0, 1]),
                p.SaslAuthenticateRequest(auth_bytes=token),
                rng,
            )
        )
    return frames


def _encode(api_key: p.ApiKey, version: int, body: Any, rng: random.Random) -> bytes:
    header = p.RequestHeader(api_key=api_key, api_version=version, correlation_id=1, client_id="f")
    data = bytearray(p.encode_request(header, body)[4:])
    kind = rng.randrange(6)
    if kind == 0 and data:
        return bytes(data[: rng.randrange(len(data))])  # truncated
    if kind == 1 and data:
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    if kind == 2 and len(data) >= 4:
        struct.pack_into(">h", data, 2, rng.choice([-1, 0, 2, 3, 99]))  # a bad version
    if kind == 3:
        data += bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
    return bytes(data)


@pytest.mark.parametrize("listener", ["REPLOG", "KAFKA"])
def test_fuzzed_sasl_frames_never_kill_the_broker(
    cluster: Cluster, env: SecurityEnv, listener: str
) -> None:
    topic = new_topic(cluster)
    acked = [f"before-{i}".encode() for i in range(10)]
    produce(cluster, topic, acked)
    rng = random.Random(FUZZ_SEED)
    for _ in range(FUZZ_CONNECTIONS):
        raw = RawSasl(cluster, env, kafka=listener == "KAFKA")
        try:
            for frame in _frames(rng, env):
                if rng.random() < 0.1:
                    break  # a random disconnect
                raw.send_raw(frame)
            raw.sock.close()
        except OSError:
            raw.sock.close()
    assert all(b.alive for b in cluster.brokers.values()), f"seed {FUZZ_SEED:#x}"
    for sign in ("bug:", "Traceback", "Unhandled exception"):
        assert sign not in stderr(cluster), f"seed {FUZZ_SEED:#x}: {sign}"
    assert read_values(cluster, topic) == acked
    good_client_still_works(cluster)


def test_a_broker_with_a_wrong_password_never_registers(
    cluster: Cluster, env: SecurityEnv, tmp_path: Path
) -> None:
    """The controller refuses its login (and says so); the broker says why it cannot reach
    the controller; the cluster does not change."""
    intruder = BrokerProcess(
        tmp_path / "intruder",
        broker_id=42,
        overrides={
            **cluster.brokers[0].overrides,
            "sasl.jaas.config": env.jaas("broker", "not-the-password"),
        },
    )
    with open(intruder.stderr_path, "w") as stderr_file:
        proc = subprocess.Popen(
            intruder.command(),
            stdout=subprocess.DEVNULL,
            stderr=stderr_file,
        )
    try:
        controller_log = cluster.controller.stderr_path
        wait_until(
            lambda: (
                f"({BAD_LOGIN} with SASL mechanism SCRAM-SHA-512)" in controller_log.read_text()
            ),
            timeout=30,
        )
        wait_until(
            lambda: "SASL authentication failed" in intruder.stderr_path.read_text(), timeout=30
        )
        assert "not-the-password" not in controller_log.read_text()
        assert "not-the-password" not in intruder.stderr_path.read_text()
        with Admin({**cluster.client, "bootstrap_servers": cluster.bootstrap}) as admin:
            assert 42 not in {b.node_id for b in admin.describe_cluster().brokers}
    finally:
        proc.kill()
        proc.wait()


def test_transactions_write_markers_to_other_brokers_over_sasl(cluster: Cluster) -> None:
    """A transaction over partitions led by every broker: the coordinator sends its markers
    to the other leaders through the broker connector (SASL_SSL, as User:broker)."""
    topic = unique_name("sasl-txn")
    with Admin({**cluster.client, "bootstrap_servers": cluster.bootstrap}) as admin:
        admin.create_topic(topic, 6, 3)
    config = {
        **cluster.client,
        "bootstrap_servers": cluster.bootstrap,
        "transactional_id": unique_name("txn"),
    }
    with Producer(config) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for partition in range(6):
            producer.send(topic, f"committed-{partition}".encode(), partition=partition)
        producer.commit_transaction()
        producer.begin_transaction()
        for partition in range(6):
            producer.send(topic, b"aborted", partition=partition)
        producer.abort_transaction()
    tps = [TopicPartition(topic, i) for i in range(6)]
    read = read_to_end(cluster.bootstrap, tps, isolation_level="read_committed", **cluster.client)
    assert sorted(r.value for r in read.records if r.value is not None) == sorted(
        f"committed-{i}".encode() for i in range(6)
    )


@pytest.mark.unit
def test_sasl_plaintext_listener_offers_plain_only_when_insecure_is_enabled(
    env: SecurityEnv,
) -> None:
    def mechanisms(**extra: str) -> list[str]:
        config = broker_config_from(
            {
                "broker.id": "0",
                "log.dir": "memory://x",
                "listener.security.protocol.map": "REPLOG:SASL_PLAINTEXT",
                "sasl.enabled.mechanisms": "SCRAM-SHA-256,PLAIN",
                "sasl.jaas.config": env.jaas("broker"),
                "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256",
                **extra,
            }
        )
        security = listener_security(config, "REPLOG", lambda user, mechanism: None)
        assert security.sasl is not None
        return security.sasl().mechanisms

    assert mechanisms() == ["SCRAM-SHA-256"]
    assert mechanisms(**{"sasl.plain.insecure.enable": "true"}) == ["SCRAM-SHA-256", "PLAIN"]
    with pytest.raises(ConfigError, match="PLAIN is the only one"):
        mechanisms(**{"sasl.enabled.mechanisms": "PLAIN"})


@pytest.mark.unit
def test_sasl_inter_broker_listener_needs_the_node_login() -> None:
    config = broker_config_from(
        {
            "broker.id": "0",
            "log.dir": "memory://x",
            "listener.security.protocol.map": "REPLOG:SASL_PLAINTEXT",
        }
    )
    with pytest.raises(ConfigError, match=r"sasl\.jaas\.config is empty.*REPLOG listener"):
        broker_connector(config)


def test_leader_kill_loses_no_acked_record_over_sasl(cluster: Cluster) -> None:
    """SIGKILL the leader between two acked batches: a new leader (elected by the controller
    the brokers reach over SASL_SSL, caught up by followers fetching over it) serves both;
    the killed broker comes back and catches up. Runs last: it restarts a broker."""
    topic = new_topic(cluster)
    described: list[PartitionInfo] = []
    with Admin({**cluster.client, "bootstrap_servers": cluster.bootstrap}) as admin:

        def fully_replicated() -> bool:
            try:
                described.append(admin.describe_topics([topic])[0].partitions[0])
            except UnknownTopicOrPartitionError:  # not in this broker's metadata yet
                return False
            return len(described[-1].isr) == 3

        wait_until(fully_replicated, timeout=30)
    leader = described[-1].leader
    first = [f"before-kill-{i}".encode() for i in range(50)]
    second = [f"after-kill-{i}".encode() for i in range(50)]
    produce(cluster, topic, first)
    victim = cluster.brokers[leader]
    victim.kill()
    try:
        produce(cluster, topic, second, delivery_timeout_ms=60_000)
        assert read_values(cluster, topic) == first + second
    finally:
        victim.start()
    with Admin({**cluster.client, "bootstrap_servers": cluster.bootstrap}) as admin:
        wait_until(fully_replicated, timeout=60)


def test_no_password_in_any_log(cluster: Cluster, env: SecurityEnv) -> None:
    logs = stderr(cluster) + cluster.controller.stderr_tail(100_000)
    for password in env.users.values():
        assert password not in logs


# --- the state machines alone -----------------------------------------------------------------


def _credentials(password: str = "pw") -> dict[tuple[str, str], ScramCredential]:
    out = {}
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        salt, stored, server, iterations = ScramMechanism(mechanism).make_auth_info(
            password, iteration_count=4096
        )
        out[("alice", mechanism)] = ScramCredential(
            "alice", mechanism, iterations, salt, stored, server
        )
    return out


def _login(mechanism: str, user: str, password: str) -> SaslServer:
    creds = _credentials()
    server = SaslServer(["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"], lambda u, m: creds.get((u, m)))
    assert server.handshake(mechanism)
    client = SaslClient(mechanism, Login(user, password))
    token: bytes | None = client.first()
    while token is not None:
        token = client.step(server.step(token))
    assert client.complete
    return server


@pytest.mark.unit
@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_sasl_state_machines_log_in_and_refuse(mechanism: str) -> None:
    server = _login(mechanism, "alice", "pw")
    assert server.complete
    assert str(server.principal) == "User:alice"
    for user, password in (("alice", "wrong"), ("nobody", "pw")):
        with pytest.raises(SaslAuthenticationFailedError, match=f"mechanism {mechanism}$"):
            _login(mechanism, user, password)


@pytest.mark.unit
def test_scram_accepts_librdkafka_2_0_client_final_nonce() -> None:
    """librdkafka 2.0 (kcat 1.7) repeats its own nonce in front of the server's in
    client-final; Kafka's broker accepts that (endsWith), so replog does."""
    creds = _credentials()
    server = SaslServer(["SCRAM-SHA-256"], lambda u, m: creds.get((u, m)))
    server.handshake("SCRAM-SHA-256")
    client_nonce = "kcatNonce"
    first = server.step(f"n,,n=alice,r={client_nonce}".encode()).decode()
    attrs = dict(part.split("=", 1) for part in first.split(","))
    salted = hashlib.pbkdf2_hmac("sha256", b"pw", base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    without_proof = f"c=biws,r={client_nonce}{attrs['r']}"
    auth_message = f"n=alice,r={client_nonce},{first},{without_proof}".encode()
    signature = hmac.new(hashlib.sha256(client_key).digest(), auth_message, hashlib.sha256)
    proof = bytes(a ^ b for a, b in zip(client_key, signature.digest(), strict=True))
    final = server.step(f"{without_proof},p={base64.b64encode(proof).decode()}".encode())
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    expected = hmac.new(server_key, auth_message, hashlib.sha256).digest()
    assert final == b"v=" + base64.b64encode(expected)
    assert str(server.principal) == "User:alice"


@pytest.mark.unit
def test_garbage_tokens_only_ever_fail_authentication() -> None:
    rng = random.Random(FUZZ_SEED)
    creds = _credentials()
    for _ in range(2_000):
        mechanism = rng.choice(["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
        server = SaslServer([mechanism], lambda u, m: creds.get((u, m)))
        server.handshake(mechanism)
        good = SaslClient(mechanism, Login("alice", "pw")).first()
        for _round in range(rng.randint(1, 3)):
            token = bytearray(good if rng.random() < 0.5 else b"")
            for _ in range(rng.randint(0, 5)):
                if token and rng.random() < 0.5:
                    token[rng.randrange(len(token))] = rng.randrange(256)
                else:
                    token.insert(rng.randrange(len(token) + 1), rng.randrange(256))
            try:
                server.step(bytes(token))
            except SaslAuthenticationFailedError:
                break


@pytest.mark.unit
def test_jaas_config_is_parsed_and_never_echoed() -> None:
    kind, login = parse_jaas_config(
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="broker" password="p\\"w;x";'
    )
    assert (kind, login.username, login.password) == ("SCRAM", "broker", 'p"w;x')
    assert 'p\\"w' not in repr(login)
    assert 'p"w' not in repr(login)
    with pytest.raises(ConfigError) as info:
        parse_jaas_config('ScramLoginModule required username="u" password="hunter2"')
    assert "hunter2" not in str(info.value)
