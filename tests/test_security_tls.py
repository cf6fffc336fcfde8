"""TLS end to end on real broker processes: a 3-broker cluster whose REPLOG listener (clients,
followers, the controller) and Kafka listener speak TLS with client certificates required.

Every refusal (an untrusted, expired or missing client certificate, a plaintext client,
garbage instead of a ClientHello, a silent peer, seeded garbled TLS records) closes that one
connection with an INFO line naming the peer, the listener and the reason; the broker stays
up and a good client still produces with acks=all afterwards.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import ssl
import struct
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import kafka
import pytest
from prometheus_client.parser import text_string_to_metric_families

from logstore.errors import ReplogError
from replication import protocol as p
from replication.client import Admin, Producer
from replication.client.config import ClientConfig, load
from replication.client.connection import BrokerConnection
from replication.common import TopicPartition
from replication.errors import IllegalSaslStateError, SslAuthenticationError
from replication.security.tls import PrincipalMapper, client_context
from tests.cluster import Cluster, wait_until
from tests.helpers import unique_name
from tests.readback import read_to_end
from tests.security_env import SecurityEnv

pytestmark = pytest.mark.cluster

AUTH_TIMEOUT_MS = 2_000
#: the user name is the certificate's CN, lower case; other names as they are
RULES = "RULE:^CN=([^,]*),O=replog-test$/$1/L,DEFAULT"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> SecurityEnv:
    return SecurityEnv.create(tmp_path_factory.mktemp("tls-secrets"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, env: SecurityEnv) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path_factory.mktemp("tls-cluster"),
        brokers=3,
        kafka=True,
        metrics=True,
        overrides=env.broker_overrides(
            "SSL",
            **{
                "ssl.client.auth": "required",
                "ssl.principal.mapping.rules": RULES,
                "authentication.timeout.ms": str(AUTH_TIMEOUT_MS),
            },
        ),
        client=env.client_config("SSL", keystore=env.client),
    )
    try:
        yield c.start()
    finally:
        c.stop()  # also after a failed start: no process left behind


def stderr(cluster: Cluster) -> str:
    return "\n".join(b.stderr_tail(100_000) for b in cluster.brokers.values())


def produce_and_read(cluster: Cluster, topic: str, n: int = 20) -> None:
    """acks=all produce and read back, through TLS with the good client certificate."""
    with Producer({**cluster.client, "bootstrap_servers": cluster.bootstrap, "acks": "all"}) as pr:
        futures = [pr.send(topic, f"v{i}".encode(), partition=0) for i in range(n)]
        pr.flush()
        offsets = [f.result().offset for f in futures]
    read = read_to_end(
        cluster.bootstrap,
        [TopicPartition(topic, 0)],
        isolation_level="read_uncommitted",
        **cluster.client,
    )
    values = {r.offset: r.value for r in read.records}
    assert [values[o] for o in offsets] == [f"v{i}".encode() for i in range(n)]


def new_topic(cluster: Cluster) -> str:
    topic = unique_name("tls")
    with Admin({**cluster.client, "bootstrap_servers": cluster.bootstrap}) as admin:
        admin.create_topic(topic, 1, 3)
    return topic


def refusal_logged(cluster: Cluster, port: int, reason: str) -> None:
    """Some broker logged the refusal of the connection from local ``port`` with ``reason``."""
    pattern = re.compile(
        rf"Failed authentication with \('127\.0\.0\.1', {port}\) on listener \w+ \(.*{reason}"
    )
    wait_until(lambda: pattern.search(stderr(cluster)) is not None, timeout=15)


def broker_alive_and_serving(cluster: Cluster, topic: str) -> None:
    assert all(b.alive for b in cluster.brokers.values())
    produce_and_read(cluster, topic, 5)


# --- the good path ------------------------------------------------------------------------------


def test_tls_cluster_replicates_and_serves(cluster: Cluster) -> None:
    topic = new_topic(cluster)
    produce_and_read(cluster, topic)
    # the followers fetched over TLS as User:broker (the broker certificate's CN)
    wait_until(lambda: "as User:broker on listener REPLOG" in stderr(cluster), timeout=15)


def test_client_certificate_gives_the_principal(cluster: Cluster, env: SecurityEnv) -> None:
    conn = BrokerConnection(
        "127.0.0.1",
        cluster.brokers[0].port,
        "who",
        10_000,
        ssl_context=client_context(
            load(ClientConfig, cluster.client, {"bootstrap_servers": "x:1"})
        ),
    )
    conn.send(p.ApiKey.API_VERSIONS, 0, p.ApiVersionsRequest())
    port = conn._sock.getsockname()[1]  # type: ignore[union-attr]
    conn.close()
    pattern = rf"Authenticated \('127\.0\.0\.1', {port}\) as User:alice on listener REPLOG"
    wait_until(lambda: re.search(pattern, stderr(cluster)) is not None, timeout=15)


def test_confluent_kafka_over_ssl_with_client_certificate(
    cluster: Cluster, env: SecurityEnv
) -> None:
    topic = new_topic(cluster)
    settings = {
        "bootstrap.servers": cluster.kafka_bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": str(env.ca),
        "ssl.certificate.location": str(env.client),
        "ssl.key.location": str(env.client),
    }
    producer = confluent_kafka.Producer({**settings, "acks": "all"})
    delivered: list[object] = []
    producer.produce(
        topic, b"from-librdkafka", partition=0, on_delivery=lambda e, m: delivered.append(e)
    )
    assert producer.flush(30) == 0
    assert delivered == [None]
    read = read_to_end(
        cluster.bootstrap,
        [TopicPartition(topic, 0)],
        isolation_level="read_uncommitted",
        **cluster.client,
    )
    assert [r.value for r in read.records] == [b"from-librdkafka"]


# --- refusals -----------------------------------------------------------------------------------


def _attempt(cluster: Cluster, settings: dict[str, str]) -> tuple[int, ReplogError]:
    """ApiVersions through BrokerConnection with ``settings``; (local port, the error)."""
    conn = BrokerConnection(
        "127.0.0.1",
        cluster.brokers[0].port,
        "bad",
        5_000,
        ssl_context=client_context(load(ClientConfig, settings, {"bootstrap_servers": "x:1"})),
    )
    ports: list[int] = []
    real_wrap = conn._wrap

    def wrap(sock: socket.socket, ctx: ssl.SSLContext) -> socket.socket:
        ports.append(sock.getsockname()[1])
        return real_wrap(sock, ctx)

    conn._wrap = wrap  # type: ignore[method-assign,assignment]
    with pytest.raises(ReplogError) as info:
        conn.send(p.ApiKey.API_VERSIONS, 0, p.ApiVersionsRequest())
    conn.close()
    return ports[0], info.value


@pytest.mark.parametrize(
    ("keystore", "reason"),
    [
        ("untrusted", "certificate verify failed|unknown ca|SSL handshake failed"),
        ("expired", "certificate (verify failed|has expired)|SSL handshake failed"),
        (None, "peer did not return a certificate|SSL handshake failed"),
    ],
)
def test_bad_client_certificate_is_refused(
    cluster: Cluster, env: SecurityEnv, keystore: str | None, reason: str
) -> None:
    topic = new_topic(cluster)
    settings = env.client_config("SSL", keystore=getattr(env, keystore) if keystore else None)
    port, _ = _attempt(cluster, settings)
    refusal_logged(cluster, port, reason)
    broker_alive_and_serving(cluster, topic)


def test_untrusted_broker_is_refused_by_the_client(cluster: Cluster, env: SecurityEnv) -> None:
    settings = {
        **env.client_config("SSL", keystore=env.client),
        "ssl.truststore.location": str(env.untrusted_ca),
    }
    _, err = _attempt(cluster, settings)
    assert isinstance(err, SslAuthenticationError)
    assert f"127.0.0.1:{cluster.brokers[0].port}" in str(err)
    assert "certificate verify failed" in str(err).lower()


def _raw(cluster: Cluster) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", cluster.brokers[0].port), timeout=30)
    return sock


def _closed_by_broker(sock: socket.socket) -> None:
    """Read until the broker closes (a TLS alert may come first); TimeoutError if it does
    not within five times authentication.timeout.ms."""
    sock.settimeout(AUTH_TIMEOUT_MS / 1000 * 5)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    sock.close()


def _api_versions_frame() -> bytes:
    header = p.RequestHeader(
        api_key=p.ApiKey.API_VERSIONS, api_version=0, correlation_id=1, client_id="plain"
    )
    return p.encode_request(header, p.ApiVersionsRequest())


@pytest.mark.parametrize(
    ("send", "reason"),
    [
        (_api_versions_frame(), "SSL handshake failed"),
        (bytes(range(256)) * 4, "SSL handshake failed"),
        (b"", "not done within authentication.timeout.ms"),
    ],
    ids=["plaintext-api-versions", "garbage", "silent"],
)
def test_non_tls_peers_are_closed(cluster: Cluster, send: bytes, reason: str) -> None:
    topic = new_topic(cluster)
    sock = _raw(cluster)
    port = sock.getsockname()[1]
    if send:
        sock.sendall(send)
    _closed_by_broker(sock)
    refusal_logged(cluster, port, reason)
    broker_alive_and_serving(cluster, topic)


def test_authentications_are_counted(cluster: Cluster) -> None:
    """Kafka's socket-server-metrics: refused and authenticated connections per listener
    (after the refusals above)."""
    sock = _raw(cluster)
    sock.sendall(b"not a ClientHello")
    _closed_by_broker(sock)

    def total(name: str) -> float:
        with urllib.request.urlopen(cluster.brokers[0].metrics_url, timeout=10) as response:
            text = response.read().decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and sample.labels.get("listener") == "REPLOG"
        )

    prefix = "kafka_server_socket_server_metrics"
    wait_until(lambda: total(f"{prefix}_failed_authentication_total") >= 1, timeout=15)
    assert total(f"{prefix}_successful_authentication_total") >= 1


def test_principal_mapping_rules() -> None:
    mapper = PrincipalMapper(RULES)
    assert mapper.name("CN=Alice,O=replog-test") == "alice"
    assert mapper.name("CN=x,O=other") == "CN=x,O=other"
    upper = PrincipalMapper(r"RULE:^CN=(.*?),OU=(.*?)$/$1@$2/U")
    assert upper.name("CN=bob,OU=ops") == "BOB@OPS"
    with pytest.raises(ValueError, match=r"no ssl\.principal\.mapping\.rules rule applies"):
        upper.name("CN=bob")


# --- fuzz -------------------------------------------------------------------------------------

#: REPLOG_FUZZ_SEED=<int> replays or varies a run; the seed is in the failure message
FUZZ_SEED = int(os.environ.get("REPLOG_FUZZ_SEED", "0x7150EED"), 0)
FUZZ_CONNECTIONS = 150


def _client_hello() -> bytes:
    """A real ClientHello (what ssl writes first), to garble."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def _garble(rng: random.Random, hello: bytes) -> bytes:
    data = bytearray(hello)
    kind = rng.randrange(5)
    if kind == 0:  # truncated
        return bytes(data[: rng.randrange(len(data))])
    if kind == 1:  # flipped bytes
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data)
    if kind == 2:  # a record length that lies
        struct.pack_into(">H", data, 3, rng.choice([0, 1, 0x3FFF, 0xFFFF, rng.randrange(65536)]))
        return bytes(data)
    if kind == 3:  # a good hello, then garbage records
        return hello + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 600)))


def test_fuzzed_tls_records_never_kill_the_broker(cluster: Cluster) -> None:
    topic = new_topic(cluster)
    produce_and_read(cluster, topic, 10)
    rng = random.Random(FUZZ_SEED)
    hello = _client_hello()
    for _ in range(FUZZ_CONNECTIONS):
        sock = _raw(cluster)
        try:
            sock.sendall(_garble(rng, hello))
            if rng.random() < 0.5:
                sock.close()  # a random disconnect
                continue
            sock.shutdown(socket.SHUT_WR)
            _closed_by_broker(sock)
        except OSError:
            sock.close()
    assert all(b.alive for b in cluster.brokers.values()), f"seed {FUZZ_SEED:#x}"
    for sign in ("bug:", "Traceback", "Unhandled exception"):
        assert sign not in stderr(cluster), f"seed {FUZZ_SEED:#x}: {sign}"
    read = read_to_end(
        cluster.bootstrap,
        [TopicPartition(topic, 0)],
        isolation_level="read_uncommitted",
        **cluster.client,
    )
    assert [r.value for r in read.records][:10] == [f"v{i}".encode() for i in range(10)]
    broker_alive_and_serving(cluster, topic)


def _tool(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{argv[0]} failed: {done.stderr}{done.stdout}"


@pytest.fixture(scope="module")
def java_stores(env: SecurityEnv) -> dict[str, Path]:
    """The stores a Java (Kafka) user brings: PKCS12 keystores made by openssl, a PKCS12
    truststore made by Java's keytool (its default type since Java 9), and a JKS keystore."""
    if shutil.which("keytool") is None or shutil.which("openssl") is None:
        pytest.fail("keytool (Java 17) and openssl are needed: install a JDK and openssl")
    root = env.root / "java-stores"
    root.mkdir(exist_ok=True)
    stores = {name: root / f"{name}.p12" for name in ("client", "broker", "trust")}
    for name in ("client", "broker"):
        pem = str(getattr(env, name))
        _tool("openssl", "pkcs12", "-export", "-in", pem, "-inkey", pem,
              "-out", str(stores[name]), "-passout", "pass:store-secret")  # fmt: skip
    _tool("keytool", "-importcert", "-noprompt", "-alias", "replog-ca", "-file", str(env.ca),
          "-keystore", str(stores["trust"]), "-storetype", "PKCS12",
          "-storepass", "changeit")  # fmt: skip
    stores["jks"] = root / "client.jks"
    _tool("keytool", "-importkeystore", "-noprompt",
          "-srckeystore", str(stores["client"]), "-srcstoretype", "PKCS12",
          "-srcstorepass", "store-secret", "-destkeystore", str(stores["jks"]),
          "-deststoretype", "JKS", "-deststorepass", "store-secret")  # fmt: skip
    return stores


def test_pkcs12_stores_from_keytool_and_openssl_work_end_to_end(
    cluster: Cluster, java_stores: dict[str, Path]
) -> None:
    """A client configured as a Java client is (PKCS12 keystore and truststore, their
    passwords) produces and reads over mutual TLS, as the principal of its certificate."""
    pkcs12: dict[str, Any] = {
        "security.protocol": "SSL",
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(java_stores["client"]),
        "ssl.keystore.password": "store-secret",
        "ssl.truststore.type": "PKCS12",
        "ssl.truststore.location": str(java_stores["trust"]),
        "ssl.truststore.password": "changeit",
    }
    topic = new_topic(cluster)
    with Producer({**pkcs12, "bootstrap_servers": cluster.bootstrap, "acks": "all"}) as pr:
        offset = pr.send(topic, b"from a PKCS12 keystore", partition=0).result().offset
    read = read_to_end(
        cluster.bootstrap, [TopicPartition(topic, 0)], isolation_level="read_uncommitted", **pkcs12
    )
    assert {r.offset: r.value for r in read.records}[offset] == b"from a PKCS12 keystore"


@pytest.mark.unit
def test_a_broker_serves_tls_from_pkcs12_stores(
    env: SecurityEnv, java_stores: dict[str, Path]
) -> None:
    from replication.security.config import SecurityConfig
    from replication.security.tls import server_context

    server = server_context(
        SecurityConfig(
            ssl_keystore_type="PKCS12",
            ssl_keystore_location=str(java_stores["broker"]),
            ssl_keystore_password="store-secret",
            ssl_truststore_type="PKCS12",
            ssl_truststore_location=str(java_stores["trust"]),
            ssl_truststore_password="changeit",
            ssl_client_auth="required",
        )
    )
    client = client_context(
        load(
            ClientConfig,
            {**env.client_config("SSL", keystore=env.client), "bootstrap.servers": "h:1"},
            {},
        )
    )
    left, right = socket.socketpair()
    with left, right:
        left.settimeout(10)
        right.settimeout(10)
        accepted: list[ssl.SSLSocket] = []

        def serve() -> None:
            conn = server.wrap_socket(right, server_side=True)
            accepted.append(conn)
            conn.sendall(conn.recv(5))

        import threading

        thread = threading.Thread(target=serve)
        thread.start()
        with client.wrap_socket(left, server_hostname="localhost") as tls:
            tls.sendall(b"hello")
            assert tls.recv(5) == b"hello"
            thread.join(10)
            # the broker's certificate came from its PKCS12 store; the client's chains to the
            # CA that the keytool truststore holds
            assert "broker" in str((tls.getpeercert() or {})["subject"])
            with accepted[0] as served:
                assert "alice" in str((served.getpeercert() or {})["subject"])


@pytest.mark.unit
def test_jks_and_mistaken_stores_are_refused_saying_what_to_do(
    env: SecurityEnv, java_stores: dict[str, Path], tmp_path: Path
) -> None:
    from logstore.errors import ConfigError
    from replication.security.config import SecurityConfig
    from replication.security.tls import server_context

    def client(**settings: str) -> ssl.SSLContext:
        return client_context(
            load(
                ClientConfig,
                {"security.protocol": "SSL", "bootstrap.servers": "h:1", **settings},
                {},
            )
        )

    jks = str(java_stores["jks"])
    # a JKS store, said to be JKS or PKCS12: the keytool command that converts it
    for kind in ("JKS", "PKCS12"):
        with pytest.raises(ConfigError, match="keytool -importkeystore") as caught:
            client(**{"ssl.keystore.type": kind, "ssl.keystore.location": jks,
                      "ssl.keystore.password": "store-secret"})  # fmt: skip
        assert "PKCS12" in str(caught.value)
    with pytest.raises(ConfigError, match="keytool -importkeystore"):
        server_context(SecurityConfig(ssl_keystore_type="JKS", ssl_keystore_location="x"))
    with pytest.raises(ConfigError, match="use PEM or PKCS12"):
        client(**{"ssl.truststore.type": "BCFKS", "ssl.truststore.location": str(env.ca)})
    # a wrong password names the password setting
    with pytest.raises(ConfigError, match=re.escape("ssl.keystore.password")):
        client(**{"ssl.keystore.type": "PKCS12", "ssl.keystore.password": "wrong",
                  "ssl.keystore.location": str(java_stores["client"])})  # fmt: skip
    # a PKCS12 store given as PEM: set the type
    with pytest.raises(ConfigError, match=re.escape("set ssl.truststore.type=PKCS12")):
        client(**{"ssl.truststore.location": str(java_stores["trust"])})
    with pytest.raises(ConfigError, match=re.escape("set ssl.keystore.type=PKCS12")):
        client(**{"ssl.keystore.location": str(java_stores["client"])})
    # a truststore given as the keystore: it holds no key
    with pytest.raises(ConfigError, match="holds no private key"):
        client(**{"ssl.keystore.type": "PKCS12", "ssl.keystore.password": "changeit",
                  "ssl.keystore.location": str(java_stores["trust"])})  # fmt: skip
    # a missing PEM file, or one that is not PEM: the key, the file and what it must hold
    missing, garbage = tmp_path / "none.pem", tmp_path / "garbage.pem"
    garbage.write_bytes(b"not a certificate\n")
    with pytest.raises(ConfigError, match=re.escape("no such file (PEM CA certificates)")):
        client(**{"ssl.truststore.location": str(missing)})
    with pytest.raises(ConfigError, match=re.escape("no such file (the client's PEM key")):
        client(**{"ssl.keystore.location": str(missing)})
    with pytest.raises(ConfigError, match=re.escape("not PEM CA certificates (")):
        client(**{"ssl.truststore.location": str(garbage)})
    with pytest.raises(ConfigError, match=r"ssl\.keystore\.location=.*not a PEM private key"):
        client(**{"ssl.keystore.location": str(garbage)})


@pytest.mark.unit
def test_inter_broker_connections_are_made_only_by_the_connector() -> None:
    """No inter-broker connection without the node's credentials: AsyncConnection is built
    only in security/connector.py (and BrokerConnection only by the client's Cluster)."""
    root = Path(__file__).resolve().parent.parent / "replication"
    makers: dict[str, set[str]] = {"AsyncConnection(": set(), "BrokerConnection(": set()}
    for path in root.rglob("*.py"):
        text = path.read_text()
        for call, found in makers.items():
            for line in text.splitlines():
                code = line.split("#", 1)[0]
                if call in code and "class " not in code and ">>>" not in code:
                    found.add(str(path.relative_to(root)))
    assert makers["AsyncConnection("] == {"security/connector.py"}
    assert makers["BrokerConnection("] <= {"client/cluster.py", "client/connection.py"}


def test_half_open_connections_do_not_stop_good_clients(cluster: Cluster) -> None:
    """50 sockets that never say a word hold no broker hostage: a good client produces
    meanwhile, and each one is closed at authentication.timeout.ms."""
    topic = new_topic(cluster)
    silent = [_raw(cluster) for _ in range(50)]
    try:
        produce_and_read(cluster, topic, 5)
        for sock in silent:
            _closed_by_broker(sock)
    finally:
        for sock in silent:
            sock.close()
    assert all(b.alive for b in cluster.brokers.values())


def test_graceful_stop_does_not_wait_for_silent_tls_peers(cluster: Cluster) -> None:
    """SIGTERM with a TLS client that never answers close_notify: the broker still stops
    cleanly (its TLS transports are aborted after a short wait), and comes back."""
    broker = cluster.brokers[2]
    conn = BrokerConnection(
        "127.0.0.1",
        broker.port,
        "idle",
        10_000,
        ssl_context=client_context(
            load(ClientConfig, cluster.client, {"bootstrap_servers": "x:1"})
        ),
    )
    conn.send(p.ApiKey.API_VERSIONS, 0, p.ApiVersionsRequest())  # connected, then silent
    try:
        assert broker.stop(timeout=30) == 0, broker.stderr_tail()
    finally:
        conn.close()
    broker.start()
    topic = new_topic(cluster)
    produce_and_read(cluster, topic, 3)


def test_a_sasl_client_on_a_tls_only_listener_is_told_why(
    cluster: Cluster, env: SecurityEnv
) -> None:
    settings = {
        **env.client_config("SASL_SSL", keystore=env.client),
        "bootstrap_servers": cluster.bootstrap,
        "sasl_username": "alice",
        "sasl_password": "pw",
    }
    with (
        pytest.raises(IllegalSaslStateError, match="offers no SASL on this listener"),
        Admin(settings) as admin,
    ):
        admin.list_topics()


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_over_mutual_tls(cluster: Cluster, env: SecurityEnv) -> None:
    topic = new_topic(cluster)
    base = [
        "kcat",
        "-b",
        cluster.kafka_bootstrap,
        "-X",
        "security.protocol=SSL",
        "-X",
        f"ssl.ca.location={env.ca}",
        "-X",
        f"ssl.certificate.location={env.client}",
        "-X",
        f"ssl.key.location={env.client}",
    ]
    produced = subprocess.run(
        [*base, "-P", "-t", topic, "-p", "0", "-X", "acks=all"],
        input=b"m1\nm2\n",
        timeout=60,
        capture_output=True,
    )
    assert produced.returncode == 0, produced.stderr.decode()
    consumed = subprocess.run(
        [*base, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e", "-q"],
        timeout=60,
        capture_output=True,
    )
    assert consumed.returncode == 0, consumed.stderr.decode()
    assert consumed.stdout.split() == [b"m1", b"m2"]


def test_kafka_python_over_mutual_tls(cluster: Cluster, env: SecurityEnv) -> None:
    topic = new_topic(cluster)
    producer = kafka.KafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap,
        security_protocol="SSL",
        ssl_cafile=str(env.ca),
        ssl_certfile=str(env.client),
        ssl_keyfile=str(env.client),
        acks="all",
    )
    producer.send(topic, b"kafka-python-tls", partition=0).get(timeout=30)
    producer.close()
    read = read_to_end(
        cluster.bootstrap,
        [TopicPartition(topic, 0)],
        isolation_level="read_uncommitted",
        **cluster.client,
    )
    assert [r.value for r in read.records] == [b"kafka-python-tls"]
