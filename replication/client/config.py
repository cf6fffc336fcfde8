"""Client configuration: Kafka's key names, parsed once into frozen dataclasses.

Every client takes its settings as a mapping with Kafka's names, as keyword arguments with
dots written as underscores (``bootstrap_servers=...``, as kafka-python), or both::

    Producer({"bootstrap.servers": "127.0.0.1:9092", "linger.ms": 10})
    Producer(bootstrap_servers="127.0.0.1:9092", acks="1")

Unknown keys and bad values raise :class:`ConfigError` naming the key and what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from logstore.config import key, parse
from logstore.errors import ConfigError

__all__ = [
    "AdminConfig",
    "ConsumerConfig",
    "ProducerConfig",
    "load",
    "parse_bootstrap",
]

C = TypeVar("C", bound="ClientConfig")

_INT32_MAX = 2**31 - 1
#: Kafka's limit on requests in flight for the idempotent producer.
_MAX_IDEMPOTENT_IN_FLIGHT = 5


def _as_int(value: Any) -> int | None:
    """``value`` as an int if it is one (or a string of one), else None (parse reports it)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def parse_bootstrap(servers: str) -> list[tuple[str, int]]:
    """``"host:port[,host:port]"`` (``PLAINTEXT://`` and ``[ipv6]`` allowed) as (host, port)s."""
    out: list[tuple[str, int]] = []
    for raw in servers.split(","):
        item = raw.strip()
        if not item:
            continue
        if "://" in item:
            item = item.split("://", 1)[1]
        host, sep, port_text = item.rpartition(":")
        if not sep or not host:
            raise ConfigError(
                f"config bootstrap.servers={servers!r}: {raw.strip()!r} is not host:port"
            )
        host = host.strip("[]")
        try:
            port = int(port_text)
        except ValueError:
            port = -1
        if not 0 < port < 65536:
            raise ConfigError(
                f"config bootstrap.servers={servers!r}: bad port in {raw.strip()!r} "
                "(expected host:port with a port from 1 to 65535)"
            )
        out.append((host, port))
    if not out:
        raise ConfigError(
            "config bootstrap.servers is required: a comma-separated list of host:port, "
            "e.g. bootstrap.servers=127.0.0.1:9092"
        )
    return out


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    text = value.strip().lower()
    if text not in allowed:
        raise ConfigError(f"config {name}={value!r}: expected one of {', '.join(allowed)}")
    return text


@dataclass(frozen=True)
class ClientConfig:
    """Settings every client shares."""

    bootstrap_servers: str = field(
        default="",
        metadata=key("bootstrap.servers", "host:port[,host:port] of brokers to start from"),
    )
    client_id: str = field(
        default="replog-client", metadata=key("client.id", "name sent with every request")
    )
    request_timeout_ms: int = field(
        default=30_000,
        metadata=key("request.timeout.ms", "longest wait for one response", minimum=1),
    )
    socket_connection_setup_timeout_ms: int = field(
        default=10_000,
        metadata=key(
            "socket.connection.setup.timeout.ms", "longest wait to connect to a broker", minimum=1
        ),
    )
    retry_backoff_ms: int = field(
        default=100,
        metadata=key("retry.backoff.ms", "first wait before retrying a request", minimum=0),
    )
    retry_backoff_max_ms: int = field(
        default=1000,
        metadata=key(
            "retry.backoff.max.ms", "longest wait between retries (exponential backoff)", minimum=0
        ),
    )
    metadata_max_age_ms: int = field(
        default=300_000,
        metadata=key("metadata.max.age.ms", "refresh metadata at least this often", minimum=0),
    )
    metrics_sample_window_ms: int = field(
        default=30_000,
        metadata=key(
            "metrics.sample.window.ms", "time window of one sample of metrics()", minimum=1
        ),
    )
    metrics_num_samples: int = field(
        default=2,
        metadata=key(
            "metrics.num.samples",
            "samples kept for the rates, averages and maxima of metrics()",
            minimum=1,
        ),
    )

    # --- security (Kafka's client names; see docs/security.md) --------------------------------
    security_protocol: str = field(
        default="PLAINTEXT",
        metadata=key(
            "security.protocol",
            "how to reach the brokers: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
        ),
    )
    ssl_truststore_location: str = field(
        default="",
        metadata=key(
            "ssl.truststore.location",
            "the CA certificates that signed the brokers', a PEM file or a PKCS12 store "
            "(ssl.truststore.type); empty: the system's",
        ),
    )
    ssl_truststore_type: str = field(
        default="PEM",
        metadata=key("ssl.truststore.type", "format of the truststore: PEM or PKCS12"),
    )
    ssl_truststore_password: str = field(
        default="",
        repr=False,
        metadata=key("ssl.truststore.password", "password of a PKCS12 truststore", secret=True),
    )
    ssl_keystore_location: str = field(
        default="",
        metadata=key(
            "ssl.keystore.location",
            "this client's private key and certificate (mutual TLS): a PEM file or a PKCS12 "
            "store (ssl.keystore.type)",
        ),
    )
    ssl_keystore_type: str = field(
        default="PEM",
        metadata=key("ssl.keystore.type", "format of the keystore: PEM or PKCS12"),
    )
    ssl_keystore_password: str = field(
        default="",
        repr=False,
        metadata=key(
            "ssl.keystore.password",
            "password of a PKCS12 keystore (empty: ssl.key.password)",
            secret=True,
        ),
    )
    ssl_key_password: str = field(
        default="",
        repr=False,
        metadata=key("ssl.key.password", "password of the private key, if any", secret=True),
    )
    ssl_endpoint_identification_algorithm: str = field(
        default="https",
        metadata=key(
            "ssl.endpoint.identification.algorithm",
            "https: check that the broker's certificate names its host; empty: do not",
        ),
    )
    sasl_mechanism: str = field(
        default="SCRAM-SHA-512",
        metadata=key("sasl.mechanism", "SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN"),
    )
    sasl_jaas_config: str = field(
        default="",
        repr=False,
        metadata=key(
            "sasl.jaas.config",
            'the login: ScramLoginModule required username="alice" password="...";',
            secret=True,
        ),
    )
    sasl_username: str = field(
        default="",
        metadata=key("sasl.username", "the user name (instead of sasl.jaas.config)"),
    )
    sasl_password: str = field(
        default="",
        repr=False,
        metadata=key("sasl.password", "the password (instead of sasl.jaas.config)", secret=True),
    )
    sasl_plain_insecure_enable: bool = field(
        default=False,
        metadata=key(
            "sasl.plain.insecure.enable",
            "send a PLAIN password over SASL_PLAINTEXT, in the clear (replog only; off: "
            "PLAIN only over SASL_SSL)",
        ),
    )

    def __post_init__(self) -> None:
        parse_bootstrap(self.bootstrap_servers)

    @property
    def bootstrap(self) -> list[tuple[str, int]]:
        return parse_bootstrap(self.bootstrap_servers)

    @classmethod
    def _prepare(cls, values: dict[str, Any]) -> None:
        """Normalise values that have aliases before type conversion (e.g. acks=all)."""


@dataclass(frozen=True)
class ProducerConfig(ClientConfig):
    """Producer settings (Kafka's names and, where they fit, defaults).

    ``batch.size`` is larger than Kafka's 16 KiB: batches are Arrow IPC streams, so a large
    batch costs little more to build than a small one and is far cheaper per record to send.
    At most one batch per partition is in flight whatever
    ``max.in.flight.requests.per.connection`` says (it opens that many connections per broker,
    each carrying one request), so retries never reorder a partition; the idempotent producer
    allows up to 5, as Kafka's.

    ``enable.idempotence`` is on by default (Kafka 3+): every batch carries the producer id,
    epoch and a per-partition sequence number, so a retried batch is appended once. As in
    Kafka, when it is not set and acks is not all, retries is 0 or more than 5 requests may be
    in flight, idempotence is turned off instead of refusing the settings; set explicitly, those
    combinations are refused. ``transactional.id`` makes the producer transactional (and
    idempotent).
    """

    client_id: str = field(
        default="replog-producer", metadata=key("client.id", "name sent with every request")
    )
    acks: int = field(
        default=-1,
        metadata=key("acks", "all (-1): every in-sync replica; 1: the leader; 0: no response"),
    )
    linger_ms: int = field(
        default=5, metadata=key("linger.ms", "wait this long for more records", minimum=0)
    )
    batch_size: int = field(
        default=1024 * 1024,
        metadata=key("batch.size", "bytes of records per partition batch", minimum=1),
    )
    compression_type: str = field(
        default="none", metadata=key("compression.type", "none, lz4 or zstd")
    )
    retries: int = field(
        default=_INT32_MAX,
        metadata=key("retries", "retries of a batch after retriable errors", minimum=0),
    )
    delivery_timeout_ms: int = field(
        default=120_000,
        metadata=key(
            "delivery.timeout.ms", "upper bound on the time to report success or failure", minimum=1
        ),
    )
    max_request_size: int = field(
        default=10 * 1024 * 1024,
        metadata=key("max.request.size", "largest produce request (and record)", minimum=1),
    )
    max_in_flight_requests_per_connection: int = field(
        default=1,
        metadata=key(
            "max.in.flight.requests.per.connection",
            "produce requests in flight per broker",
            minimum=1,
        ),
    )
    buffer_memory: int = field(
        default=32 * 1024 * 1024,
        metadata=key("buffer.memory", "bytes of unsent records before send() blocks", minimum=1),
    )
    max_block_ms: int = field(
        default=60_000,
        metadata=key(
            "max.block.ms",
            "longest send() blocks for metadata or buffer space, and longest transaction calls",
            minimum=0,
        ),
    )
    enable_idempotence: bool = field(
        default=True,
        metadata=key(
            "enable.idempotence", "producer id and sequence numbers: a retry is appended once"
        ),
    )
    transactional_id: str | None = field(
        default=None,
        metadata=key("transactional.id", "make the producer transactional under this id"),
    )
    transaction_timeout_ms: int = field(
        default=60_000,
        metadata=key(
            "transaction.timeout.ms",
            "the coordinator aborts a transaction open longer than this",
            minimum=1,
        ),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.acks not in (-1, 0, 1):
            raise ConfigError(f"config acks={self.acks!r}: expected all, -1, 0 or 1")
        if self.transactional_id == "":
            object.__setattr__(self, "transactional_id", None)
        if self.transactional_id is not None and not self.enable_idempotence:
            raise ConfigError(
                f"config transactional.id={self.transactional_id!r} needs enable.idempotence="
                "true (a transactional producer is idempotent); remove enable.idempotence=false"
            )
        if self.enable_idempotence:
            if self.acks != -1:
                raise ConfigError(
                    f"config acks={self.acks}: the idempotent producer needs acks=all; set "
                    "acks=all or enable.idempotence=false"
                )
            if self.retries == 0:
                raise ConfigError(
                    "config retries=0: the idempotent producer needs retries > 0; raise retries "
                    "or set enable.idempotence=false"
                )
            if self.max_in_flight_requests_per_connection > _MAX_IDEMPOTENT_IN_FLIGHT:
                raise ConfigError(
                    "config max.in.flight.requests.per.connection="
                    f"{self.max_in_flight_requests_per_connection}: the idempotent producer "
                    f"allows at most {_MAX_IDEMPOTENT_IN_FLIGHT}"
                )
        if self.compression_type.strip().lower() in ("gzip", "snappy"):
            raise ConfigError(
                f"config compression.type={self.compression_type!r}: gzip and snappy are not "
                "supported (Arrow IPC payloads carry only none, lz4 or zstd)"
            )
        object.__setattr__(
            self,
            "compression_type",
            _choice("compression.type", self.compression_type, ("none", "lz4", "zstd")),
        )
        if self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms:
            raise ConfigError(
                f"config delivery.timeout.ms={self.delivery_timeout_ms}: must be at least "
                f"linger.ms + request.timeout.ms = {self.linger_ms + self.request_timeout_ms}"
            )

    @classmethod
    def _prepare(cls, values: dict[str, Any]) -> None:
        acks = values.get("acks")
        if isinstance(acks, str) and acks.strip().lower() == "all":
            values["acks"] = -1
        elif isinstance(acks, str):
            try:
                values["acks"] = int(acks)
            except ValueError:
                raise ConfigError(f"config acks={acks!r}: expected all, -1, 0 or 1") from None
        if "enable.idempotence" not in values and values.get("transactional.id") in (None, ""):
            # Kafka (KAFKA-13598): idempotence by default, unless settings that conflict with
            # it were given; then it is off rather than an error.
            values["enable.idempotence"] = not (
                values.get("acks", -1) in (0, 1)
                or _as_int(values.get("retries")) == 0
                or (_as_int(values.get("max.in.flight.requests.per.connection")) or 1)
                > _MAX_IDEMPOTENT_IN_FLIGHT
            )


#: partition.assignment.strategy names (replication.client.assignors.ASSIGNORS)
_ASSIGNORS = ("range", "roundrobin", "cooperative-sticky")


@dataclass(frozen=True)
class ConsumerConfig(ClientConfig):
    """Consumer settings (Kafka's names and defaults). With ``group.id``, subscribe() joins a
    consumer group; without it, the consumer uses assign() and commits nothing by itself."""

    client_id: str = field(
        default="replog-consumer", metadata=key("client.id", "name sent with every request")
    )
    isolation_level: str = field(
        default="read_uncommitted",
        metadata=key("isolation.level", "read_uncommitted or read_committed"),
    )
    fetch_min_bytes: int = field(
        default=1,
        metadata=key("fetch.min.bytes", "the broker waits for this many bytes", minimum=0),
    )
    fetch_max_wait_ms: int = field(
        default=500,
        metadata=key("fetch.max.wait.ms", "...or this long, whichever comes first", minimum=0),
    )
    fetch_max_bytes: int = field(
        default=50 * 1024 * 1024,
        metadata=key("fetch.max.bytes", "bytes per fetch response", minimum=1),
    )
    max_partition_fetch_bytes: int = field(
        default=1024 * 1024,
        metadata=key("max.partition.fetch.bytes", "bytes per partition per fetch", minimum=1),
    )
    auto_offset_reset: str = field(
        default="latest",
        metadata=key(
            "auto.offset.reset", "where to start without a valid position: earliest, latest, none"
        ),
    )
    max_poll_records: int = field(
        default=500,
        metadata=key("max.poll.records", "most records one poll() returns", minimum=1),
    )
    default_api_timeout_ms: int = field(
        default=60_000,
        metadata=key(
            "default.api.timeout.ms", "timeout of blocking calls such as end_offsets", minimum=0
        ),
    )
    group_id: str | None = field(
        default=None, metadata=key("group.id", "the consumer group (needed by subscribe())")
    )
    group_instance_id: str | None = field(
        default=None,
        metadata=key(
            "group.instance.id", "a static member's id: restarting, it keeps its partitions"
        ),
    )
    session_timeout_ms: int = field(
        default=45_000,
        metadata=key("session.timeout.ms", "a member silent this long leaves the group", minimum=1),
    )
    heartbeat_interval_ms: int = field(
        default=3_000,
        metadata=key("heartbeat.interval.ms", "how often a member heartbeats", minimum=1),
    )
    max_poll_interval_ms: int = field(
        default=300_000,
        metadata=key(
            "max.poll.interval.ms",
            "a member that does not poll() for this long leaves the group",
            minimum=1,
        ),
    )
    enable_auto_commit: bool = field(
        default=True,
        metadata=key("enable.auto.commit", "commit positions in the background (with group.id)"),
    )
    auto_commit_interval_ms: int = field(
        default=5_000,
        metadata=key("auto.commit.interval.ms", "how often positions are committed", minimum=0),
    )
    partition_assignment_strategy: str = field(
        default="range,cooperative-sticky",
        metadata=key(
            "partition.assignment.strategy",
            "assignors in order of preference: range, roundrobin, cooperative-sticky",
        ),
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        strategies = [s.strip() for s in self.partition_assignment_strategy.split(",")]
        unknown = [s for s in strategies if s not in _ASSIGNORS]
        if unknown or not strategies:
            raise ConfigError(
                f"config partition.assignment.strategy={self.partition_assignment_strategy!r}: "
                f"use a comma list of {', '.join(_ASSIGNORS)}"
            )
        if self.group_id == "":
            raise ConfigError("config group.id: give a non-empty group id, or leave it unset")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ConfigError(
                f"config heartbeat.interval.ms={self.heartbeat_interval_ms} must be below "
                f"session.timeout.ms={self.session_timeout_ms}"
            )
        object.__setattr__(
            self,
            "isolation_level",
            _choice(
                "isolation.level", self.isolation_level, ("read_uncommitted", "read_committed")
            ),
        )
        object.__setattr__(
            self,
            "auto_offset_reset",
            _choice("auto.offset.reset", self.auto_offset_reset, ("earliest", "latest", "none")),
        )
        if self.fetch_max_bytes > _INT32_MAX or self.max_partition_fetch_bytes > _INT32_MAX:
            raise ConfigError("config fetch.max.bytes / max.partition.fetch.bytes: at most 2^31-1")

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"

    @property
    def assignment_strategies(self) -> list[str]:
        return [s.strip() for s in self.partition_assignment_strategy.split(",")]


@dataclass(frozen=True)
class AdminConfig(ClientConfig):
    """Admin client settings (Kafka's names and defaults)."""

    client_id: str = field(
        default="replog-admin", metadata=key("client.id", "name sent with every request")
    )
    default_api_timeout_ms: int = field(
        default=60_000,
        metadata=key("default.api.timeout.ms", "timeout of each admin call", minimum=0),
    )


def _kafka_name(name: str) -> str:
    """``bootstrap_servers`` -> ``bootstrap.servers``; dotted names are kept."""
    return name if "." in name else name.replace("_", ".")


def load(cls: type[C], config: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> C:
    """Parse ``config`` and ``kwargs`` (which win) into ``cls``; ConfigError names bad keys."""
    values: dict[str, Any] = {}
    for source in (config or {}), kwargs:
        for name, value in source.items():
            values[_kafka_name(str(name))] = value
    servers = values.get("bootstrap.servers")
    if isinstance(servers, list | tuple):
        values["bootstrap.servers"] = ",".join(str(s) for s in servers)
    cls._prepare(values)
    return parse(cls, values)
