"""The options of a read and of a write, parsed once into frozen :class:`SourceOptions` and
:class:`SinkOptions` by one parser.

Names are the Kafka connector's. Kafka client settings (``bootstrap.servers``,
``isolation.level``, the producer's settings) may be written with Kafka's ``kafka.`` prefix or
without it, on both sides. Spark hands options over with lower-cased names and string values
(``maxOffsetsPerTrigger`` arrives as ``maxoffsetspertrigger``); names are matched without
regard to case, an unknown option is refused with the list of known ones, and every error names
the option as written, the value given and what is allowed (:class:`InvalidOptionError`).

The source's options:

==================================  =============================================  =================
option                              values                                         default
==================================  =============================================  =================
bootstrap.servers                   host:port[,host:port]                          required
subscribe                           topic[,topic]                                  one of these
subscribePattern                    regular expression over topic names (full)     three is
assign                              JSON ``{"topic": [0, 1]}``                     required
startingOffsets                     earliest, latest, JSON ``{"t": {"0": 42}}``    streaming: latest
                                    (-2 earliest, -1 latest)                       batch: earliest
startingOffsetsByTimestamp          JSON ``{"t": {"0": <ms>}}``                    none
startingTimestamp                   ms since the epoch                             none
startingOffsetsByTimestampStrategy  error, latest                                  error
endingOffsets (batch)               latest, JSON (-1 latest)                       latest
endingOffsetsByTimestamp (batch)    JSON ``{"t": {"0": <ms>}}``                    none
endingTimestamp (batch)             ms since the epoch                             none
maxOffsetsPerTrigger                records per micro-batch, > 0                   none
minOffsetsPerTrigger                records per micro-batch, > 0                   none
maxTriggerDelay                     duration: 500ms, 30s, 15m, 1h                  15m
minPartitions                       Spark partitions, > 0                          none
maxRecordsPerPartition              records per Spark partition, > 0               none
failOnDataLoss                      true, false                                    true
includeHeaders                      true, false                                    false
isolation.level                     read_committed, read_uncommitted               read_committed
read.mode                           auto, direct, broker                           auto
storage.<name>                      fsspec's <name>, e.g. storage.endpoint_url,    none
                                    storage.key, storage.secret (not for file://)
fetchOffset.numRetries              retries of offset lookups, >= 0                3
fetchOffset.retryIntervalMs         ms between them, >= 0                          10
kafkaConsumer.pollTimeoutMs         ms a broker read may make no progress, > 0     120000
commitOffsetsToGroup (streaming)    a consumer group id: each finished micro-batch  none
                                    commits its end offsets to it (lag tools see
                                    the query; the checkpoint stays the truth)
security.protocol, ssl.*, sasl.*    the clients' security settings                 PLAINTEXT
                                    (SECURITY_OPTIONS; docs/security.md)
kafka.<consumer setting>            handed to the clients (SOURCE_CONSUMER_SETTINGS:  the clients'
                                    client.id, fetch.max.bytes, request.timeout.ms,
                                    ...); Kafka's other consumer settings ignored
                                    and logged; Spark's refused ones and unknown
                                    names refused
kafka.group.id, groupIdPrefix       accepted, as Spark's connector accepts them; the  none
                                    reads join no group (see _GROUP_NAMING)
==================================  =============================================  =================

Precedence as in Kafka: startingTimestamp over startingOffsetsByTimestamp over
startingOffsets (and the same for the ending options).

The sink's options:

=====================  ==========================================================  ==========
option                 values                                                      default
=====================  ==========================================================  ==========
bootstrap.servers      host:port[,host:port]                                       required
topic                  the topic of every row (overrides a ``topic`` column)       none
sink.id                the sink's identity for exactly-once commits                query id
<producer setting>     a Producer setting (linger.ms, batch.size,                  client's
                       compression.type, max.block.ms, ...); also as
                       ``kafka.<name>`` or ``producer.<name>``; acks only ``all``
security.protocol,     the clients' security settings, as the source's             PLAINTEXT
ssl.*, sasl.*
=====================  ==========================================================  ==========

Secret values (passwords, sasl.jaas.config, storage credentials) are never printed: options
reprs leave them out and an error about such an option names it without its value.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Final, Literal

from datasource.errors import InvalidOptionError
from datasource.offsets import (
    EARLIEST,
    LATEST,
    EarliestOffsets,
    GlobalTimestamp,
    LatestOffsets,
    OffsetSpec,
    SpecificOffsets,
    SpecificTimestamps,
    TimestampStrategy,
    parse_partition_map,
)
from logstore.errors import ConfigError
from replication.client.config import (
    ClientConfig,
    ConsumerConfig,
    ProducerConfig,
    load,
    parse_bootstrap,
)
from replication.client.types import TopicPartition

__all__ = [
    "Assign",
    "ReadMode",
    "SinkOptions",
    "SourceOptions",
    "Subscribe",
    "SubscribePattern",
    "Subscription",
    "check_source_options",
    "parse_duration_ms",
    "parse_sink_options",
    "parse_source_options",
]

#: The clients' security settings (security.protocol, ssl.*, sasl.*): options of the source and
#: of the sink, also as ``kafka.<name>``; they reach every client of the query (the driver's
#: and the executors'), and secret ones (passwords, sasl.jaas.config) are never printed.
SECURITY_OPTIONS: Final = tuple(
    sorted(
        f.metadata["key"]
        for f in fields(ClientConfig)
        if f.metadata.get("key", "").startswith(("security.", "ssl.", "sasl."))
    )
)

log = logging.getLogger(__name__)

ReadMode = Literal["auto", "direct", "broker"]
IsolationLevel = Literal["read_committed", "read_uncommitted"]

#: Every option the source knows, as documented; Spark's lower-cased names map back to these.
KNOWN_OPTIONS: Final = (
    "bootstrap.servers",
    "subscribe",
    "subscribePattern",
    "assign",
    "startingOffsets",
    "startingOffsetsByTimestamp",
    "startingTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingOffsets",
    "endingOffsetsByTimestamp",
    "endingTimestamp",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "minPartitions",
    "maxRecordsPerPartition",
    "failOnDataLoss",
    "includeHeaders",
    "isolation.level",
    "read.mode",
    "fetchOffset.numRetries",
    "fetchOffset.retryIntervalMs",
    "kafkaConsumer.pollTimeoutMs",
    "commitOffsetsToGroup",
    "groupIdPrefix",
    *SECURITY_OPTIONS,
)
STORAGE_PREFIX: Final = "storage."
#: Kafka's prefix of the settings it hands to its clients (``kafka.bootstrap.servers``).
KAFKA_PREFIX: Final = "kafka."
#: The source's options that are Kafka client settings: also accepted with ``kafka.``.
SOURCE_CLIENT_OPTIONS: Final = frozenset(
    {"bootstrap.servers", "isolation.level", *SECURITY_OPTIONS}
)
#: Kafka consumer settings a read hands to its clients when given as ``kafka.<name>``, as Spark's
#: Kafka connector hands its ``kafka.*`` options to its consumers: the connection's and the
#: fetch's. The consumers of reads through the brokers get them all; the driver's and the
#: executors' admin clients get those every client has (CLIENT_SETTINGS).
SOURCE_CONSUMER_SETTINGS: Final = (
    "client.id",
    "request.timeout.ms",
    "socket.connection.setup.timeout.ms",
    "retry.backoff.ms",
    "retry.backoff.max.ms",
    "metadata.max.age.ms",
    "fetch.min.bytes",
    "fetch.max.wait.ms",
    "fetch.max.bytes",
    "max.partition.fetch.bytes",
    "max.poll.records",
)
#: Of SOURCE_CONSUMER_SETTINGS, those of every client (the admin clients' too).
CLIENT_SETTINGS: Final = frozenset(
    f.metadata["key"] for f in fields(ClientConfig) if "key" in f.metadata
) & frozenset(SOURCE_CONSUMER_SETTINGS)
#: Consumer settings Spark's Kafka connector refuses, refused here for the same reasons.
REFUSED_CONSUMER_SETTINGS: Final = {
    "auto.offset.reset": "startingOffsets says where a new query starts (earliest, latest or "
    "JSON offsets), and its checkpoint where it resumes",
    "enable.auto.commit": "the query's checkpoint keeps its progress; commitOffsetsToGroup "
    "also commits it to a consumer group for lag tools",
    "key.deserializer": "keys are read as bytes (binary column); deserialize them with "
    "DataFrame operations",
    "value.deserializer": "values are read as bytes (binary column); deserialize them with "
    "DataFrame operations",
    "interceptor.classes": "the records read are the rows as they are; no interceptor runs",
}
#: The settings of Kafka's Java consumer (Kafka 4.x: ConsumerConfig, CommonClientConfigs, the
#: SSL and SASL configs) that replog's clients do not have: ignored with a warning when given
#: as ``kafka.<name>``, as Kafka's consumer ignores what it does not use. Any other
#: ``kafka.<name>`` is no Kafka setting (a typo, most often) and is refused by name.
KAFKA_ONLY_CONSUMER_SETTINGS: Final = frozenset(
    {
        "allow.auto.create.topics",
        "auto.commit.interval.ms",
        "auto.include.jmx.reporter",
        "check.crcs",
        "client.dns.lookup",
        "client.rack",
        "connections.max.idle.ms",
        "default.api.timeout.ms",
        "enable.metrics.push",
        "exclude.internal.topics",
        "group.instance.id",
        "group.protocol",
        "group.remote.assignor",
        "heartbeat.interval.ms",
        "max.poll.interval.ms",
        "metadata.recovery.rebootstrap.trigger.ms",
        "metadata.recovery.strategy",
        "metric.reporters",
        "metrics.num.samples",
        "metrics.recording.level",
        "metrics.sample.window.ms",
        "partition.assignment.strategy",
        "receive.buffer.bytes",
        "reconnect.backoff.max.ms",
        "reconnect.backoff.ms",
        "security.providers",
        "send.buffer.bytes",
        "session.timeout.ms",
        "socket.connection.setup.timeout.max.ms",
        "ssl.cipher.suites",
        "ssl.enabled.protocols",
        "ssl.engine.factory.class",
        "ssl.keymanager.algorithm",
        "ssl.keystore.certificate.chain",
        "ssl.keystore.key",
        "ssl.protocol",
        "ssl.provider",
        "ssl.secure.random.implementation",
        "ssl.trustmanager.algorithm",
        "ssl.truststore.certificates",
        "sasl.client.callback.handler.class",
        "sasl.login.callback.handler.class",
        "sasl.login.class",
        "sasl.login.connect.timeout.ms",
        "sasl.login.read.timeout.ms",
        "sasl.login.refresh.buffer.seconds",
        "sasl.login.refresh.min.period.seconds",
        "sasl.login.refresh.window.factor",
        "sasl.login.refresh.window.jitter",
        "sasl.login.retry.backoff.max.ms",
        "sasl.login.retry.backoff.ms",
    }
)
#: Families of Kafka's SASL settings for mechanisms replog has not (GSSAPI, OAUTHBEARER).
KAFKA_ONLY_CONSUMER_PREFIXES: Final = ("sasl.kerberos.", "sasl.oauthbearer.")
#: Accepted so that a job written for Spark's Kafka connector runs unchanged, and meaning what
#: they mean there for reads: nothing a broker sees. Spark's connector names the consumer group
#: of its consumers with them but assigns partitions and never commits; replog's reads join no
#: group either (commitOffsetsToGroup is what makes a group's lag show the query).
_GROUP_NAMING: Final = ("group.id",)

#: Options Spark itself may add to a read or a write; they mean nothing to replog.
_SPARK_OPTIONS: Final = frozenset({"path", "checkpointlocation", "queryname"})

_DURATION_UNITS: Final = {
    "us": 0.001,
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}
_DURATION: Final = re.compile(r"\s*(\d+)\s*([a-z]*)\s*")


# --- subscriptions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Subscribe:
    """A fixed list of topics; partitions added later join at the next micro-batch."""

    topics: tuple[str, ...]

    def matches(self, topic: str) -> bool:
        return topic in self.topics


@dataclass(frozen=True)
class SubscribePattern:
    """Every topic whose whole name matches ``pattern``; new topics join as they appear."""

    pattern: str

    def matches(self, topic: str) -> bool:
        return re.fullmatch(self.pattern, topic) is not None


@dataclass(frozen=True)
class Assign:
    """Exactly these partitions."""

    partitions: tuple[TopicPartition, ...]

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(tp.topic for tp in self.partitions))


Subscription = Subscribe | SubscribePattern | Assign


# --- the options ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceOptions:
    """Every option of a read, parsed and checked (see the module's table)."""

    bootstrap_servers: str
    subscription: Subscription
    starting: OffsetSpec
    #: None for streaming queries (they have no end)
    ending: OffsetSpec | None
    streaming: bool
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    isolation_level: IsolationLevel = "read_committed"
    read_mode: ReadMode = "auto"
    #: fsspec's options (credentials among them: never printed)
    storage_options: tuple[tuple[str, Any], ...] = field(default=(), repr=False)
    #: the clients' security settings by Kafka name (SECURITY_OPTIONS; never printed)
    client_security: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    #: ``kafka.<name>`` consumer settings handed to the clients (SOURCE_CONSUMER_SETTINGS)
    consumer_settings: tuple[tuple[str, str], ...] = ()
    #: ``kafka.<name>`` settings given that replog's clients do not have: ignored, as a Kafka
    #: consumer ignores (and logs) a setting it does not know
    ignored_kafka_settings: tuple[str, ...] = ()
    fetch_offset_num_retries: int = 3
    fetch_offset_retry_interval_ms: int = 10
    poll_timeout_ms: int = 120_000
    #: commitOffsetsToGroup: the group each finished micro-batch commits its end offsets to
    commit_group: str | None = None

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"


def parse_duration_ms(option: str, text: str) -> int:
    """Spark's time strings (``500ms``, ``30s``, ``15m``, ``1h``, ``2d``; a bare number is ms)."""
    match = _DURATION.fullmatch(text.lower())
    unit = match.group(2) if match else None
    if match is None or unit is None or (unit and unit not in _DURATION_UNITS):
        raise InvalidOptionError(
            option, text, "a duration such as 500ms, 30s, 15m, 1h or 2d (a bare number is ms)"
        )
    return int(int(match.group(1)) * _DURATION_UNITS[unit or "ms"])


class _Options:
    """The raw options by documented name, consumed as they are parsed.

    ``known`` are the documented names; those in ``client`` may also carry Kafka's ``kafka.``
    prefix. ``prefixes`` maps a prefix (``storage.``) to the dict that collects the options
    under it by their name after the prefix. Anything else is refused with the known names.
    """

    def __init__(
        self,
        raw: Mapping[str, str],
        known: tuple[str, ...],
        *,
        client: frozenset[str] = frozenset(),
        prefixes: tuple[str, ...] = (),
        described: str = "",
        other_kafka: bool = False,
    ) -> None:
        canonical = {name.lower(): name for name in known}
        self.values: dict[str, str] = {}
        #: with ``other_kafka``: the ``kafka.<name>`` options that are not documented names,
        #: by ``<name>`` (lower-cased), for the caller to pass through, refuse or ignore
        self.kafka: dict[str, str] = {}
        #: the name each option was given under (``kafka.bootstrap.servers``), for errors
        self.given: dict[str, str] = {}
        self.prefixed: dict[str, dict[str, str]] = {prefix: {} for prefix in prefixes}
        unknown: list[str] = []
        for key, value in raw.items():
            lower = key.lower()
            bare = lower[len(KAFKA_PREFIX) :] if lower.startswith(KAFKA_PREFIX) else None
            prefix = next(
                (x for x in prefixes if lower.startswith(x) and len(lower) > len(x)), None
            )
            if lower in canonical or (bare in canonical and canonical[bare] in client):
                name = canonical[lower if lower in canonical else bare]  # type: ignore[index]
                if name in self.values:
                    raise InvalidOptionError(
                        key, str(value), f"{name} once", f"{self.given[name]} is given as well"
                    )
                self.values[name] = str(value)
                self.given[name] = key
            elif prefix is not None:
                self.prefixed[prefix][key[len(prefix) :]] = str(value)
            elif other_kafka and bare and bare not in canonical:  # not a source option
                self.kafka[bare] = str(value)
            elif lower not in _SPARK_OPTIONS:
                unknown.append(key)
        if unknown:
            prefixed = "".join(f", {x}<name>" for x in prefixes)
            raise InvalidOptionError(
                unknown[0],
                str(raw[unknown[0]]),
                "one of " + ", ".join(known) + prefixed + described,
                "unknown option",
            )

    def label(self, name: str) -> str:
        """The option's name as the user wrote it (with kafka. if given so)."""
        given = self.given.get(name)
        return name if given is None or not given.lower().startswith(KAFKA_PREFIX) else given

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    def choice(self, name: str, allowed: tuple[str, ...], default: str) -> str:
        value = self.values.get(name)
        if value is None:
            return default
        text = value.strip().lower()
        if text not in allowed:
            raise InvalidOptionError(self.label(name), value, " or ".join(allowed))
        return text

    def boolean(self, name: str, default: bool) -> bool:
        return self.choice(name, ("true", "false"), str(default).lower()) == "true"

    def integer(self, name: str, *, minimum: int) -> int | None:
        value = self.values.get(name)
        if value is None:
            return None
        try:
            number = int(value.strip())
        except ValueError:
            number = None
        if number is None or number < minimum:
            raise InvalidOptionError(self.label(name), value, f"an integer >= {minimum}")
        return number

    def json(self, name: str, example: str) -> Any:
        value = self.values[name]
        try:
            return json.loads(value)
        except ValueError as err:
            raise InvalidOptionError(
                self.label(name), value, f"JSON like {example}", str(err)
            ) from None


def _storage_value(value: Any) -> Any:
    """fsspec wants booleans and dicts where Spark gives strings: decode those two."""
    text = str(value)
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def _subscription(opts: _Options) -> Subscription:
    given = [n for n in ("subscribe", "subscribePattern", "assign") if opts.get(n) is not None]
    if len(given) != 1:
        allowed = 'exactly one of subscribe, subscribePattern or assign ({"topic": [0, 1]})'
        if not given:
            raise InvalidOptionError("subscribe", None, allowed)
        raise InvalidOptionError(
            given[1], opts.get(given[1]), allowed, f"{given[0]} is given as well"
        )
    name = given[0]
    value = opts.values[name]
    if name == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise InvalidOptionError(name, value, "a comma-separated list of topic names")
        return Subscribe(topics)
    if name == "subscribePattern":
        try:
            re.compile(value)
        except re.error as err:
            raise InvalidOptionError(name, value, "a regular expression", str(err)) from None
        return SubscribePattern(value)
    doc = opts.json(name, '{"topic": [0, 1]}')
    partitions: list[TopicPartition] = []
    if isinstance(doc, dict) and doc:
        for topic, indexes in doc.items():
            if not isinstance(indexes, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indexes
            ):
                raise InvalidOptionError(
                    name, value, '{"topic": [0, 1]}', f"topic {topic!r} needs a list of partitions"
                )
            partitions.extend(TopicPartition(topic, i) for i in indexes)
    if not partitions:
        raise InvalidOptionError(name, value, '{"topic": [0, 1]} naming at least one partition')
    return Assign(tuple(dict.fromkeys(partitions)))


def _partition_map(
    opts: _Options, name: str, *, minimum: int, example: str
) -> dict[TopicPartition, int]:
    doc = opts.json(name, example)
    try:
        return parse_partition_map(doc, name, minimum=minimum)
    except ValueError as err:
        raise InvalidOptionError(
            name, opts.values[name], f"JSON like {example}", str(err)
        ) from None


def _offsets_spec(
    opts: _Options,
    prefix: Literal["starting", "ending"],
    *,
    streaming: bool,
    strategy: TimestampStrategy,
) -> OffsetSpec | None:
    timestamp_name = f"{prefix}Timestamp"
    by_timestamp_name = f"{prefix}OffsetsByTimestamp"
    offsets_name = f"{prefix}Offsets"
    if opts.get(timestamp_name) is not None:
        ts = opts.integer(timestamp_name, minimum=0)
        assert ts is not None
        return GlobalTimestamp(ts, strategy)
    if opts.get(by_timestamp_name) is not None:
        stamps = _partition_map(
            opts, by_timestamp_name, minimum=0, example='{"t": {"0": 1700000000000}}'
        )
        return SpecificTimestamps(stamps, strategy)
    value = opts.get(offsets_name)
    if value is None:
        return None
    word = value.strip().lower()
    if prefix == "starting":
        allowed = 'earliest, latest, or JSON like {"t": {"0": 42}} (-2 earliest, -1 latest)'
        if word == "earliest":
            return EarliestOffsets()
        if word == "latest":
            if not streaming:
                raise InvalidOptionError(
                    offsets_name, value, "earliest or JSON", "a batch query cannot start at latest"
                )
            return LatestOffsets()
        if word.startswith("{"):
            offsets = _partition_map(
                opts, offsets_name, minimum=EARLIEST, example='{"t": {"0": 42}}'
            )
            bad = [tp for tp, o in offsets.items() if o == LATEST and not streaming]
            if bad:
                raise InvalidOptionError(
                    offsets_name,
                    value,
                    "offsets >= 0 or -2 (earliest)",
                    f"a batch query cannot start {bad[0].topic}-{bad[0].partition} at latest (-1)",
                )
            return SpecificOffsets(offsets)
        raise InvalidOptionError(offsets_name, value, allowed)
    allowed = 'latest, or JSON like {"t": {"0": 42}} (-1 latest)'
    if word == "latest":
        return LatestOffsets()
    if word.startswith("{"):
        offsets = _partition_map(opts, offsets_name, minimum=EARLIEST, example='{"t": {"0": 42}}')
        bad = [tp for tp, o in offsets.items() if o == EARLIEST]
        if bad:
            raise InvalidOptionError(
                offsets_name,
                value,
                "offsets >= 0 or -1 (latest)",
                f"a query cannot end {bad[0].topic}-{bad[0].partition} at earliest (-2)",
            )
        return SpecificOffsets(offsets)
    raise InvalidOptionError(offsets_name, value, allowed)


def _bootstrap_servers(opts: _Options) -> str:
    servers = opts.get("bootstrap.servers")
    if servers is None:
        raise InvalidOptionError("bootstrap.servers", None, "host:port[,host:port] of brokers")
    try:
        parse_bootstrap(servers)
    except ConfigError as err:
        raise InvalidOptionError(
            opts.label("bootstrap.servers"), servers, "host:port[,host:port] of brokers", str(err)
        ) from None
    return servers


def parse_source_options(raw: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Parse a read's options (as Spark hands them over); InvalidOptionError names a bad one."""
    opts = _Options(
        raw,
        KNOWN_OPTIONS,
        client=SOURCE_CLIENT_OPTIONS,
        prefixes=(STORAGE_PREFIX,),
        described=" (fsspec options); bootstrap.servers, isolation.level and the security "
        "settings also as kafka.<name>, and Kafka consumer settings as kafka.<name>",
        other_kafka=True,
    )
    servers = _bootstrap_servers(opts)
    security = _client_security(opts, servers)
    consumer, ignored = _consumer_settings(opts, servers)
    prefix = opts.get("groupIdPrefix")
    if prefix is not None and not prefix.strip():
        raise InvalidOptionError("groupIdPrefix", prefix, "a non-empty prefix of group ids")
    subscription = _subscription(opts)
    strategy = opts.choice("startingOffsetsByTimestampStrategy", ("error", "latest"), "error")
    starting = _offsets_spec(
        opts,
        "starting",
        streaming=streaming,
        strategy=strategy,  # type: ignore[arg-type]
    )
    if starting is None:
        starting = LatestOffsets() if streaming else EarliestOffsets()
    ending: OffsetSpec | None = None
    commit_group = opts.get("commitOffsetsToGroup")
    if commit_group is not None and (not streaming or not commit_group.strip()):
        raise InvalidOptionError(
            "commitOffsetsToGroup",
            commit_group,
            "a consumer group id, on a streaming read (a batch read has no progress to commit)",
        )
    if streaming:
        for name in ("endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp"):
            if opts.get(name) is not None:
                raise InvalidOptionError(
                    name, opts.get(name), "no value", "streaming queries have no end (batch only)"
                )
    else:
        ending = _offsets_spec(opts, "ending", streaming=False, strategy="latest")
        if ending is None:
            ending = LatestOffsets()
    max_per_trigger = opts.integer("maxOffsetsPerTrigger", minimum=1)
    min_per_trigger = opts.integer("minOffsetsPerTrigger", minimum=1)
    if (
        max_per_trigger is not None
        and min_per_trigger is not None
        and min_per_trigger > max_per_trigger
    ):
        raise InvalidOptionError(
            "minOffsetsPerTrigger",
            opts.get("minOffsetsPerTrigger"),
            f"at most maxOffsetsPerTrigger ({max_per_trigger})",
        )
    delay = opts.get("maxTriggerDelay")
    delay_ms = 15 * 60 * 1000 if delay is None else parse_duration_ms("maxTriggerDelay", delay)
    isolation = opts.choice(
        "isolation.level", ("read_committed", "read_uncommitted"), "read_committed"
    )
    mode = opts.choice("read.mode", ("auto", "direct", "broker"), "auto")
    retries = opts.integer("fetchOffset.numRetries", minimum=0)
    interval = opts.integer("fetchOffset.retryIntervalMs", minimum=0)
    poll = opts.integer("kafkaConsumer.pollTimeoutMs", minimum=1)
    return SourceOptions(
        bootstrap_servers=servers,
        subscription=subscription,
        starting=starting,
        ending=ending,
        streaming=streaming,
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=delay_ms,
        min_partitions=opts.integer("minPartitions", minimum=1),
        max_records_per_partition=opts.integer("maxRecordsPerPartition", minimum=1),
        fail_on_data_loss=opts.boolean("failOnDataLoss", True),
        include_headers=opts.boolean("includeHeaders", False),
        isolation_level=isolation,  # type: ignore[arg-type]
        read_mode=mode,  # type: ignore[arg-type]
        storage_options=tuple(
            sorted((k, _storage_value(v)) for k, v in opts.prefixed[STORAGE_PREFIX].items())
        ),
        fetch_offset_num_retries=3 if retries is None else retries,
        fetch_offset_retry_interval_ms=10 if interval is None else interval,
        poll_timeout_ms=120_000 if poll is None else poll,
        commit_group=commit_group,
        client_security=security,
        consumer_settings=consumer,
        ignored_kafka_settings=ignored,
    )


def _consumer_settings(
    opts: _Options, servers: str
) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """The ``kafka.<name>`` consumer settings to hand to the clients, checked as a consumer
    would, and the names of those ignored; Spark's refused ones are refused."""
    consumer: dict[str, str] = {}
    ignored: list[str] = []
    for name, value in sorted(opts.kafka.items()):
        given = KAFKA_PREFIX + name
        if name in REFUSED_CONSUMER_SETTINGS:
            raise InvalidOptionError(
                given, value, "no value", "not supported: " + REFUSED_CONSUMER_SETTINGS[name]
            )
        if name in _GROUP_NAMING:
            if not value.strip():
                raise InvalidOptionError(given, value, "a consumer group id")
            continue
        if name in KAFKA_ONLY_CONSUMER_SETTINGS or name.startswith(KAFKA_ONLY_CONSUMER_PREFIXES):
            ignored.append(given)
            continue
        if name not in SOURCE_CONSUMER_SETTINGS:
            raise InvalidOptionError(
                given,
                value,
                "a source option, or a Kafka consumer setting as kafka.<name>: kafka."
                + ", kafka.".join(SOURCE_CONSUMER_SETTINGS),
                "unknown option (not a setting of Kafka's consumer either)",
            )
        try:
            load(ConsumerConfig, {name: value, "bootstrap.servers": servers}, {})
        except ConfigError as err:
            raise InvalidOptionError(given, value, "a valid consumer setting", str(err)) from None
        consumer[name] = value
    if ignored:
        log.warning(
            "ignored: %s (replog's reads hand only these Kafka consumer settings to their "
            "clients: %s)",
            ", ".join(ignored),
            ", ".join(SOURCE_CONSUMER_SETTINGS),
        )
    return tuple(consumer.items()), tuple(ignored)


def _client_security(opts: _Options, servers: str) -> tuple[tuple[str, str], ...]:
    """The security settings given (SECURITY_OPTIONS), checked as a client would."""
    security = {name: opts.values[name] for name in SECURITY_OPTIONS if name in opts.values}
    for name, value in security.items():
        try:
            load(ClientConfig, {name: value, "bootstrap.servers": servers}, {})
        except ConfigError as err:
            raise InvalidOptionError(
                opts.label(name), value, "a valid client security setting", str(err)
            ) from None
    return tuple(sorted(security.items()))


def check_source_options(raw: Mapping[str, str]) -> None:
    """Refuse options that fit neither a batch nor a streaming read (for ``load()``).

    Spark calls the data source's ``schema()`` at ``load()``, before it is known whether the
    DataFrame will be read as a batch or a stream; an option that only one of the two refuses
    (``endingOffsets`` on a stream, ``startingOffsets=latest`` on a batch) is refused when the
    reader is made (at the first action, or when the query starts).
    """
    try:
        parse_source_options(raw, streaming=True)
    except InvalidOptionError:
        parse_source_options(raw, streaming=False)


# --- the sink ------------------------------------------------------------------------------------

#: Producer settings the sink decides itself: exactly-once writes need them as they are.
_SINK_OWNED: Final = frozenset(
    {"transactional.id", "enable.idempotence", "bootstrap.servers", *SECURITY_OPTIONS}
)
#: The Producer's settings a sink may be given (``linger.ms``, ``batch.size``, ...).
PRODUCER_OPTIONS: Final = tuple(
    sorted(
        f.metadata["key"]
        for f in fields(ProducerConfig)
        if "key" in f.metadata and f.metadata["key"] not in _SINK_OWNED
    )
)
SINK_OPTIONS: Final = (
    "bootstrap.servers",
    "topic",
    "sink.id",
    *PRODUCER_OPTIONS,
    *SECURITY_OPTIONS,
)
#: Kept from replog's first sink: ``producer.<name>`` is ``<name>``.
PRODUCER_PREFIX: Final = "producer."


@dataclass(frozen=True)
class SinkOptions:
    """Every option of a write, parsed and checked (see the module's table)."""

    bootstrap_servers: str
    #: the topic of every row; overrides a ``topic`` column, as in Kafka's sink
    topic: str | None = None
    #: the sink's identity for exactly-once commits (default: the streaming query's id)
    sink_id: str | None = None
    #: Producer settings by Kafka name (acks is always all)
    producer: Mapping[str, str] = field(default_factory=dict)
    #: the clients' security settings by Kafka name (SECURITY_OPTIONS; never printed): the
    #: producers' and the admin clients' of the sink
    client_security: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def client_config(self) -> dict[str, str]:
        """What every client of the sink is given: the brokers and the security settings."""
        return {"bootstrap.servers": self.bootstrap_servers, **dict(self.client_security)}


def parse_sink_options(raw: Mapping[str, str]) -> SinkOptions:
    """Parse a write's options (as Spark hands them over); InvalidOptionError names a bad one."""
    opts = _Options(
        raw,
        SINK_OPTIONS,
        client=frozenset({"bootstrap.servers", *PRODUCER_OPTIONS, *SECURITY_OPTIONS}),
        prefixes=(PRODUCER_PREFIX,),
        described=" (producer and security settings also as kafka.<name>)",
    )
    servers = _bootstrap_servers(opts)
    security = _client_security(opts, servers)
    producer = {name: opts.values[name] for name in PRODUCER_OPTIONS if name in opts.values}
    for key, value in opts.prefixed[PRODUCER_PREFIX].items():
        name = key.lower()
        if name not in PRODUCER_OPTIONS:
            raise InvalidOptionError(
                PRODUCER_PREFIX + key,
                value,
                "producer.<one of " + ", ".join(PRODUCER_OPTIONS) + ">",
                "unknown producer setting",
            )
        if name in producer:
            raise InvalidOptionError(
                PRODUCER_PREFIX + key, value, f"{name} once", f"{name} is given as well"
            )
        producer[name] = value
    acks = producer.get("acks")
    if acks is not None and acks.strip().lower() not in ("all", "-1"):
        raise InvalidOptionError(
            opts.label("acks"), acks, "all", "the exactly-once sink always writes with acks=all"
        )
    for name, value in producer.items():
        try:
            load(ProducerConfig, {name: value, "bootstrap.servers": servers}, {})
        except ConfigError as err:
            given = opts.label(name) if name in opts.values else PRODUCER_PREFIX + name
            raise InvalidOptionError(given, value, "a valid producer setting", str(err)) from None
    topic = opts.get("topic")
    if topic is not None and not topic.strip():
        raise InvalidOptionError("topic", topic, "a topic name")
    return SinkOptions(
        bootstrap_servers=servers,
        topic=topic,
        sink_id=opts.get("sink.id") or None,
        producer=producer,
        client_security=security,
    )
