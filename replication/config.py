"""Broker configuration: Kafka's key names, TOML files in conf/ or a Kafka
``server.properties``, ``--set key=value`` overrides.

Topic-level log settings (segment.bytes, retention.ms, ...) given to a broker are the defaults of
every topic it hosts; a topic's own configs (``topics create --config``) override them.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from jproperties import Properties, PropertyError

from logstore.config import LogConfig, keys_of, parse
from logstore.config import key as k
from logstore.errors import ConfigError
from logstore.tail_cache import DEFAULT_TOTAL_BYTES as DEFAULT_TAIL_CACHE_TOTAL_BYTES
from replication.security.config import SecurityConfig

log = logging.getLogger(__name__)

#: Listener names: replog's own protocol, and Kafka's (for Kafka clients and tools).
LISTENER_NAMES = ("REPLOG", "KAFKA")


@dataclass(frozen=True)
class BrokerConfig:
    broker_id: int = field(default=0, metadata=k("broker.id", "this node's id", minimum=0))
    process_roles: str = field(
        default="broker,controller",
        metadata=k("process.roles", "broker, controller, or both (a controller candidate)"),
    )
    listeners: str = field(
        default="127.0.0.1:9092",
        metadata=k(
            "listeners",
            "where to listen: REPLOG://HOST:PORT (replog's protocol; REPLOG:// optional) and "
            "optionally KAFKA://HOST:PORT (Kafka's protocol, for Kafka clients)",
        ),
    )
    advertised_listeners: str = field(
        default="",
        metadata=k(
            "advertised.listeners",
            "addresses clients and peers are told to use, by listener name as in listeners "
            "(default: listeners)",
        ),
    )
    log_dir: str = field(
        default="file:///tmp/replog-logs",
        metadata=k(
            "log.dir", "storage root URL of this broker's replica logs (file://, s3://, memory://)"
        ),
    )
    metadata_log_dir: str = field(
        default="",
        metadata=k(
            "metadata.log.dir",
            "storage root URL of the cluster metadata (default: <log.dir>/__cluster_metadata)",
        ),
    )
    storage_endpoint_url: str = field(
        default="",
        metadata=k("storage.endpoint.url", "S3 endpoint URL (MinIO, moto); empty: AWS default"),
    )
    broker_rack: str = field(
        default="", metadata=k("broker.rack", "rack of this broker (rack-aware placement)")
    )
    num_partitions: int = field(
        default=1, metadata=k("num.partitions", "default partitions of a new topic", minimum=1)
    )
    default_replication_factor: int = field(
        default=1,
        metadata=k(
            "default.replication.factor", "default replication factor of a new topic", minimum=1
        ),
    )
    min_insync_replicas: int = field(
        default=1, metadata=k("min.insync.replicas", "ISR size acks=all needs", minimum=1)
    )
    auto_create_topics_enable: bool = field(
        default=False,
        metadata=k("auto.create.topics.enable", "create unknown topics on first produce/metadata"),
    )
    socket_request_max_bytes: int = field(
        default=100 * 1024 * 1024,
        metadata=k("socket.request.max.bytes", "largest request frame accepted", minimum=64),
    )
    request_timeout_ms: int = field(
        default=30_000,
        metadata=k("request.timeout.ms", "longest an acks=all produce waits", minimum=1),
    )
    log_flush_interval_ms: int = field(
        default=-1,
        metadata=k(
            "log.flush.interval.ms",
            "group commit: least time between two flush starts (an append to an idle log is "
            "flushed at once; appends during a flush join the next; over the broker WAL, "
            "between two WAL objects of the broker: an append to an idle broker is written at "
            "once); -1: per storage kind, 0 for local files and memory, 250 for object stores",
            minimum=-1,
        ),
    )
    log_wal_enable: bool = field(
        default=True,
        metadata=k(
            "log.wal.enable",
            "write every partition's batches through one per-broker write-ahead object per "
            "flush (_replog/wal/), compacted later, so the object-store request rate does not "
            "grow with the partition count (the default); false: the per-partition layout, one "
            "segment object per partition per flush (a log dir once written through the WAL "
            "refuses it)",
        ),
    )
    log_wal_journal_enable: bool = field(
        default=True,
        metadata=k(
            "log.wal.journal.enable",
            "on local files, write WAL objects up to 4 MiB into pre-written journal "
            "files under the log dir's .replog-journal/ with one fdatasync, instead of a new "
            "file each (temp, fsync, rename, directory fsync): no file-system journal commit "
            "per flush, which is most of an acks=all send's latency on one disk; readers see "
            "them as objects either way; object stores ignore it",
        ),
    )
    wal_compaction_window_bytes: int = field(
        # per storage kind (replica_manager.compaction_window_bytes): the smaller the window,
        # the shorter each round's burst of reads, CRC walks and big write, which is what the
        # foreground writes of acks=all wait behind; on object stores each packed object is
        # also a PUT
        default=-1,
        metadata=k(
            "wal.compaction.window.bytes",
            "over the WAL: compact the oldest L0 objects into one packed object once this many "
            "bytes of them are live (also the most one compaction round reads into memory); "
            "-1: per storage kind, 16 MiB for local files and memory, 64 MiB for object stores",
            minimum=-1,
        ),
    )
    log_cleaner_enable: bool = field(
        default=True,
        metadata=k(
            "log.cleaner.enable",
            "run the log cleaner on this broker's replicas of compacted topics (leaders and "
            "followers alike: each replica cleans its own store)",
        ),
    )
    log_cleaner_threads: int = field(
        default=1,
        metadata=k("log.cleaner.threads", "logs cleaned at the same time", minimum=1),
    )
    log_cleaner_backoff_ms: int = field(
        default=15_000,
        metadata=k(
            "log.cleaner.backoff.ms",
            "how long the cleaner sleeps when no log needs cleaning (looking costs no "
            "storage request)",
            minimum=1,
        ),
    )
    log_cleaner_dedupe_buffer_size: int = field(
        default=128 * 1024 * 1024,
        metadata=k(
            "log.cleaner.dedupe.buffer.size",
            "the most dirty bytes one cleaner round takes (bounds its offset map and the "
            "bytes it reads into memory)",
            minimum=1,
        ),
    )
    log_cleaner_io_max_bytes_per_second: float = field(
        default=1.7976931348623157e308,
        metadata=k(
            "log.cleaner.io.max.bytes.per.second",
            "the cleaner's read plus write rate (a faster round is followed by a pause)",
            minimum=1,
        ),
    )
    wal_compaction_l0_max_age_ms: int = field(
        default=60_000,
        metadata=k(
            "wal.compaction.l0.max.age.ms",
            "over the WAL: compact L0 objects once the oldest is this old, however few bytes "
            "they hold (bounds how many small objects a slow broker keeps)",
            minimum=1,
        ),
    )
    log_tail_cache_total_bytes: int = field(
        default=DEFAULT_TAIL_CACHE_TOTAL_BYTES,
        metadata=k(
            "log.tail.cache.total.bytes",
            "recently written object bytes kept in memory over every partition of the broker "
            "(each partition also keeps at most its log.tail.cache.bytes)",
            minimum=0,
        ),
    )
    log_retention_check_interval_ms: int = field(
        default=300_000,
        metadata=k(
            "log.retention.check.interval.ms", "how often retention and merges run", minimum=1
        ),
    )
    log_checkpoint_interval_ms: int = field(
        default=5_000,
        metadata=k(
            "log.checkpoint.interval.ms",
            "how often HW and recovery checkpoints are written",
            minimum=1,
        ),
    )
    replica_lag_time_max_ms: int = field(
        default=30_000,
        metadata=k(
            "replica.lag.time.max.ms",
            "a follower not caught up for this long leaves the ISR",
            minimum=1,
        ),
    )
    replica_fetch_max_bytes: int = field(
        default=1024 * 1024,
        metadata=k(
            "replica.fetch.max.bytes", "bytes per partition a follower fetch asks for", minimum=1
        ),
    )
    replica_fetch_response_max_bytes: int = field(
        default=10 * 1024 * 1024,
        metadata=k(
            "replica.fetch.response.max.bytes",
            "bytes a follower fetch response may hold",
            minimum=1,
        ),
    )
    replica_fetch_min_bytes: int = field(
        default=1,
        metadata=k("replica.fetch.min.bytes", "bytes a follower fetch waits for", minimum=1),
    )
    replica_fetch_wait_max_ms: int = field(
        default=500,
        metadata=k(
            "replica.fetch.wait.max.ms", "longest a follower fetch waits on the leader", minimum=0
        ),
    )
    replica_fetch_backoff_ms: int = field(
        default=1_000,
        metadata=k(
            "replica.fetch.backoff.ms",
            "pause after a follower fetch error (a metadata disagreement with the leader: "
            "50 ms, doubling per refusal in a row up to this)",
            minimum=0,
        ),
    )
    num_replica_fetchers: int = field(
        default=1,
        metadata=k("num.replica.fetchers", "fetcher threads per source broker", minimum=1),
    )
    max_incremental_fetch_session_cache_slots: int = field(
        default=1000,
        metadata=k(
            "max.incremental.fetch.session.cache.slots", "fetch sessions a broker keeps", minimum=0
        ),
    )
    follower_replication_throttled_rate: int = field(
        default=0,
        metadata=k(
            "follower.replication.throttled.rate",
            "bytes/s a replica catching up in a reassignment fetches at (0: no limit; a "
            "reassignment's own --throttle takes precedence)",
            minimum=0,
        ),
    )
    auto_leader_rebalance_enable: bool = field(
        default=True,
        metadata=k(
            "auto.leader.rebalance.enable",
            "the controller moves leadership back to preferred replicas periodically",
        ),
    )
    leader_imbalance_check_interval_seconds: int = field(
        default=300,
        metadata=k(
            "leader.imbalance.check.interval.seconds",
            "how often the controller checks leader imbalance",
            minimum=1,
        ),
    )
    leader_imbalance_per_broker_percentage: int = field(
        default=10,
        metadata=k(
            "leader.imbalance.per.broker.percentage",
            "a broker leading fewer of its preferred partitions than this share triggers a "
            "rebalance (percent not led)",
            minimum=0,
        ),
    )
    unclean_leader_election_enable: bool = field(
        default=False,
        metadata=k(
            "unclean.leader.election.enable", "allow a leader from outside the ISR (may lose data)"
        ),
    )
    broker_heartbeat_interval_ms: int = field(
        default=500,
        metadata=k(
            "broker.heartbeat.interval.ms",
            "how often a broker heartbeats the controller",
            minimum=1,
        ),
    )
    broker_session_timeout_ms: int = field(
        default=3_000,
        metadata=k("broker.session.timeout.ms", "a broker silent this long is fenced", minimum=1),
    )
    shutdown_timeout_ms: int = field(
        default=15_000,
        metadata=k(
            "shutdown.timeout.ms",
            "longest a graceful shutdown (SIGTERM) may take before the process exits anyway",
            minimum=1,
        ),
    )
    logging_format: str = field(
        default="text",
        metadata=k(
            "logging.format",
            "how the process logs on stderr: text (lines for people) or json (one JSON object "
            "per line, events' fields as keys); replog's key, Kafka has none",
        ),
    )
    transaction_timeout_ms: int = field(
        default=60_000,
        metadata=k(
            "transaction.timeout.ms", "an open transaction older than this is aborted", minimum=1
        ),
    )
    transaction_max_timeout_ms: int = field(
        default=900_000,
        metadata=k(
            "transaction.max.timeout.ms",
            "largest transaction timeout a producer may ask",
            minimum=1,
        ),
    )
    transactional_id_expiration_ms: int = field(
        default=604_800_000,
        metadata=k(
            "transactional.id.expiration.ms",
            "a transactional id whose transaction is complete and untouched this long is "
            "removed from __transaction_state; its next producer starts with a new producer id",
            minimum=1,
        ),
    )
    transaction_remove_expired_transaction_cleanup_interval_ms: int = field(
        default=3_600_000,
        metadata=k(
            "transaction.remove.expired.transaction.cleanup.interval.ms",
            "how often the transaction coordinator removes expired transactional ids",
            minimum=1,
        ),
    )
    producer_id_expiration_ms: int = field(
        default=86_400_000,
        metadata=k(
            "producer.id.expiration.ms",
            "a producer id with no open transaction on a partition and no batch there for this "
            "long is removed from the partition's producer state; its next batch must start at "
            "sequence 0 (an idempotent producer resets on UNKNOWN_PRODUCER_ID)",
            minimum=1,
        ),
    )
    producer_id_expiration_check_interval_ms: int = field(
        default=600_000,
        metadata=k(
            "producer.id.expiration.check.interval.ms",
            "how often every partition removes its expired producer ids",
            minimum=1,
        ),
    )
    offsets_topic_num_partitions: int = field(
        default=10,
        metadata=k(
            "offsets.topic.num.partitions",
            "partitions of __consumer_offsets (fixed once the topic exists); Kafka's default is "
            "50, replog's 10: every partition is a log of objects on storage",
            minimum=1,
        ),
    )
    offsets_topic_replication_factor: int = field(
        default=3,
        metadata=k(
            "offsets.topic.replication.factor",
            "replication factor of __consumer_offsets (at most the live brokers when created)",
            minimum=1,
        ),
    )
    offsets_retention_minutes: int = field(
        default=10_080,
        metadata=k(
            "offsets.retention.minutes",
            "an empty group's committed offsets are deleted after this long",
            minimum=1,
        ),
    )
    group_initial_rebalance_delay_ms: int = field(
        default=3_000,
        metadata=k(
            "group.initial.rebalance.delay.ms",
            "how long a new group waits for more members before its first assignment",
            minimum=0,
        ),
    )
    group_min_session_timeout_ms: int = field(
        default=6_000,
        metadata=k(
            "group.min.session.timeout.ms",
            "smallest session.timeout.ms a member may ask",
            minimum=1,
        ),
    )
    group_max_session_timeout_ms: int = field(
        default=1_800_000,
        metadata=k(
            "group.max.session.timeout.ms", "largest session.timeout.ms a member may ask", minimum=1
        ),
    )
    group_max_size: int = field(
        default=1_000_000,
        metadata=k("group.max.size", "most members a consumer group may have", minimum=1),
    )
    group_consumer_session_timeout_ms: int = field(
        default=45_000,
        metadata=k(
            "group.consumer.session.timeout.ms",
            "a member of a consumer-protocol group (KIP-848) that sends no heartbeat for this "
            "long leaves it",
            minimum=1,
        ),
    )
    group_consumer_heartbeat_interval_ms: int = field(
        default=5_000,
        metadata=k(
            "group.consumer.heartbeat.interval.ms",
            "how often a member of a consumer-protocol group (KIP-848) heartbeats",
            minimum=1,
        ),
    )
    metrics_port: int = field(
        default=-1,
        metadata=k(
            "metrics.port",
            "port of the Prometheus endpoint (http://HOST:PORT/metrics); -1: none, 0: any free "
            "port (printed at start)",
            minimum=-1,
        ),
    )
    metrics_host: str = field(
        default="",
        metadata=k(
            "metrics.host",
            "address the Prometheus endpoint listens on (default: the REPLOG listener's host)",
        ),
    )
    log: LogConfig = field(default_factory=LogConfig)
    #: TLS, SASL and authorization keys (replication/security/config.py)
    security: SecurityConfig = field(default_factory=SecurityConfig)

    @property
    def roles(self) -> frozenset[str]:
        roles = frozenset(r.strip() for r in self.process_roles.split(",") if r.strip())
        if not roles or roles - {"broker", "controller"}:
            raise ConfigError(
                f"config process.roles={self.process_roles!r}: use broker, controller, or "
                "broker,controller"
            )
        return roles

    @staticmethod
    def _endpoints(key: str, text: str) -> dict[str, tuple[str, int]]:
        """``NAME://HOST:PORT`` entries by listener name. An entry without a name, or named
        PLAINTEXT, is replog's own listener (REPLOG); KAFKA is the Kafka protocol listener."""
        endpoints: dict[str, tuple[str, int]] = {}
        for entry in (e.strip() for e in text.split(",")):
            if not entry:
                continue
            name, sep, address = entry.partition("://")
            if not sep:
                name, address = "REPLOG", entry
            name = name.upper()
            if name == "PLAINTEXT":
                name = "REPLOG"
            host, _, port = address.rpartition(":")
            if name not in LISTENER_NAMES or not port.isdigit() or name in endpoints:
                raise ConfigError(
                    f"config {key}={text!r}: expected comma-separated NAME://HOST:PORT with "
                    f"NAME one of {', '.join(LISTENER_NAMES)}, each at most once "
                    '(e.g. "REPLOG://0.0.0.0:9092,KAFKA://0.0.0.0:9093")'
                )
            endpoints[name] = (host or "127.0.0.1", int(port))
        if key == "listeners" and "REPLOG" not in endpoints:
            raise ConfigError(
                f"config listeners={text!r}: a REPLOG://HOST:PORT listener is required "
                "(brokers, controllers and replog's clients speak through it)"
            )
        return endpoints

    @property
    def host_port(self) -> tuple[str, int]:
        """The address of replog's own listener."""
        return self._endpoints("listeners", self.listeners)["REPLOG"]

    @property
    def kafka_host_port(self) -> tuple[str, int] | None:
        """The address of the Kafka protocol listener, if one is configured."""
        return self._endpoints("listeners", self.listeners).get("KAFKA")

    @property
    def advertised_host_port(self) -> tuple[str, int] | None:
        """The address to register for replog's listener, if it differs from the listener."""
        return self._endpoints("advertised.listeners", self.advertised_listeners).get("REPLOG")

    @property
    def advertised_kafka_host_port(self) -> tuple[str, int] | None:
        """The address Kafka clients are told to use, if it differs from the listener."""
        return self._endpoints("advertised.listeners", self.advertised_listeners).get("KAFKA")

    @property
    def metrics_host_port(self) -> tuple[str, int] | None:
        """Where the Prometheus endpoint listens, or None if ``metrics.port`` is -1."""
        if self.metrics_port < 0:
            return None
        if self.metrics_port > 65535:
            raise ConfigError(
                f"config metrics.port={self.metrics_port}: a TCP port is at most 65535; use -1 "
                "for no metrics endpoint, 0 for any free port"
            )
        host = self.metrics_host.strip() or self.host_port[0]
        if any(c in host for c in "/ ") or host.count(":") == 1:
            raise ConfigError(
                f"config metrics.host={self.metrics_host!r}: expected a host name or address "
                "without port or scheme (e.g. 0.0.0.0); the port is metrics.port"
            )
        return host, self.metrics_port

    @property
    def metadata_root(self) -> str:
        return self.metadata_log_dir or self.log_dir.rstrip("/") + "/__cluster_metadata"

    def storage_options(self, url: str) -> dict[str, Any]:
        """fsspec options for a storage URL (the S3 endpoint applies to s3:// URLs only)."""
        if self.storage_endpoint_url and url.startswith(("s3://", "s3a://")):
            return {"endpoint_url": self.storage_endpoint_url}
        return {}


def parse_overrides(pairs: Sequence[str]) -> dict[str, str]:
    """``["key=value", ...]`` from --set flags into a mapping (refusing malformed pairs)."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--set {pair!r}: expected key=value, e.g. --set broker.id=1")
        out[name.strip()] = value.strip()
    return out


#: Kafka's broker names (``server.properties``) of settings replog has under another name: the
#: topic-level name a broker takes as every topic's default, or replog's own.
KAFKA_BROKER_ALIASES: Final = {
    "node.id": "broker.id",
    "log.dirs": "log.dir",
    "log.segment.bytes": "segment.bytes",
    "log.roll.ms": "segment.ms",
    "log.retention.ms": "retention.ms",
    "log.retention.bytes": "retention.bytes",
    "message.max.bytes": "max.message.bytes",
    "log.cleanup.policy": "cleanup.policy",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
    "log.cleaner.max.compaction.lag.ms": "max.compaction.lag.ms",
    "log.message.timestamp.type": "message.timestamp.type",
}
#: The same in other units, by (replog's name, ms per unit). As in Kafka, the finest unit
#: given wins: log.retention.ms over log.retention.minutes over log.retention.hours.
KAFKA_BROKER_UNIT_ALIASES: Final = {
    "log.retention.minutes": ("retention.ms", 60_000),
    "log.retention.hours": ("retention.ms", 3_600_000),
    "log.roll.hours": ("segment.ms", 3_600_000),
}
#: Settings of Kafka's shipped server.properties that mean nothing to replog: its network
#: and I/O threads and socket buffers (replog's nodes run one event loop), the KRaft quorum's
#: wiring (replog's controllers coordinate through the metadata store under
#: metadata.log.dir), and internal topics replog does not keep in a replicated topic. A ported
#: file starts with these ignored and named in one warning; any other unknown key is refused.
KAFKA_ONLY_BROKER_SETTINGS: Final = frozenset(
    {
        "num.network.threads",
        "num.io.threads",
        "socket.send.buffer.bytes",
        "socket.receive.buffer.bytes",
        "num.recovery.threads.per.data.dir",
        "controller.quorum.voters",
        "controller.quorum.bootstrap.servers",
        "controller.listener.names",
        "inter.broker.listener.name",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
        "log.flush.interval.messages",
    }
)


def read_properties(path: str | Path, what: str) -> dict[str, str]:
    """A Java properties file (``key=value`` or ``key: value``, ``#``/``!`` comments, ``\\``
    continuations) as a mapping; ConfigError names ``what`` (the flag or file role) and the
    file when it cannot be read."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise ConfigError(f"{what} {path}: cannot read it ({err.strerror})") from None
    properties = Properties()
    try:
        properties.load(data, "utf-8")
    except (PropertyError, UnicodeDecodeError) as err:
        raise ConfigError(
            f"{what} {path}: not a properties file of key=value lines ({err})"
        ) from None
    return {str(key): str(value.data) for key, value in properties.items()}


def load_broker_config(
    path: str | Path | Sequence[str | Path] | None,
    overrides: Mapping[str, Any] = (),  # type: ignore[assignment]
) -> BrokerConfig:
    """Read config files and apply overrides; a later file's keys win. A ``.properties`` file
    is a Java properties file, as Kafka's ``server.properties``; any other is TOML (flat
    Kafka keys, dotted keys quoted). Kafka's broker names are taken for replog's
    (:data:`KAFKA_BROKER_ALIASES`)."""
    values: dict[str, Any] = {}
    paths = [] if path is None else [path] if isinstance(path, str | Path) else list(path)
    for path in paths:
        if str(path).endswith(".properties"):
            if not Path(path).exists():
                raise ConfigError(f"config file {path} does not exist")
            values.update(read_properties(path, "config file"))
            continue
        try:
            with open(path, "rb") as f:
                values.update(_flatten(tomllib.load(f)))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"config file {path} is not valid TOML: {err}") from err
    values.update(dict(overrides))
    return broker_config_from(values)


def _kafka_names(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with Kafka's broker names turned into replog's, and Kafka-only settings
    dropped (named in one warning). Two names of one setting with different values are
    refused, naming both."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}  # replog's name -> the name it was given as
    ignored = sorted(name for name in values if name in KAFKA_ONLY_BROKER_SETTINGS)
    units = sorted(
        (name for name in values if name in KAFKA_BROKER_UNIT_ALIASES),
        key=lambda name: KAFKA_BROKER_UNIT_ALIASES[name][1],  # the finest first
    )
    for name, value in values.items():
        if name in KAFKA_ONLY_BROKER_SETTINGS or name in KAFKA_BROKER_UNIT_ALIASES:
            continue
        target = KAFKA_BROKER_ALIASES.get(name, name)
        if name == "log.dirs":
            value = _one_log_dir(str(value))
        if target in out and str(out[target]) != str(value):
            raise ConfigError(
                f"config {name}={value!r} and {given[target]}={out[target]!r} name the same "
                f"setting ({target}) with different values: give one of them"
            )
        out[target] = value
        given[target] = name
    for name in units:
        target, per_unit = KAFKA_BROKER_UNIT_ALIASES[name]
        if target in out:
            continue  # a finer unit was given (as Kafka: ms over minutes over hours)
        try:
            out[target] = int(str(values[name]).strip()) * per_unit
        except ValueError:
            raise ConfigError(f"config {name}={values[name]!r}: expected a whole number") from None
        given[target] = name
    if ignored:
        log.warning("ignored Kafka settings that mean nothing to replog: %s", ", ".join(ignored))
    return out


def _one_log_dir(value: str) -> str:
    dirs = [d.strip() for d in value.split(",") if d.strip()]
    if len(dirs) != 1:
        raise ConfigError(
            f"config log.dirs={value!r}: replog keeps a broker's replica logs in one storage "
            "root; give one directory or URL (log.dir)"
        )
    return dirs[0]


def broker_config_from(values: Mapping[str, Any]) -> BrokerConfig:
    values = _kafka_names(values)
    log_keys = set(keys_of(LogConfig))
    security_keys = set(keys_of(SecurityConfig))
    log_values = {name: v for name, v in values.items() if name in log_keys}
    security_values = {name: v for name, v in values.items() if name in security_keys}
    broker_values = {name: v for name, v in values.items() if name not in log_keys | security_keys}
    log_config = parse(LogConfig, log_values)
    security = parse(SecurityConfig, security_values)
    config = parse(BrokerConfig, broker_values)
    return BrokerConfig(**{**config.__dict__, "log": log_config, "security": security})


def _flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """TOML tables flatten into dotted keys: ``[replica] lag.time.max.ms = 1`` works too."""
    out: dict[str, Any] = {}
    for name, value in doc.items():
        full = f"{prefix}{name}"
        if isinstance(value, dict):
            out.update(_flatten(value, full + "."))
        else:
            out[full] = value
    return out
