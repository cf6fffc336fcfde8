"""The source's options, parsed once into a frozen :class:`SourceOptions`.

Names are the Kafka source's, without the ``kafka.`` prefix. Spark hands options over with
lower-cased names and string values (``maxOffsetsPerTrigger`` arrives as
``maxoffsetspertrigger``); names are matched without regard to case, and every error names the
option as documented, the value given and what is allowed (:class:`InvalidOptionError`).

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
==================================  =============================================  =================

Precedence as in Kafka: startingTimestamp over startingOffsetsByTimestamp over
startingOffsets (and the same for the ending options).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
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
from replication.client.config import parse_bootstrap
from replication.client.types import TopicPartition

__all__ = [
    "Assign",
    "ReadMode",
    "SourceOptions",
    "Subscribe",
    "SubscribePattern",
    "Subscription",
    "parse_duration_ms",
    "parse_source_options",
]

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
)
_CANONICAL: Final = {name.lower(): name for name in KNOWN_OPTIONS}
STORAGE_PREFIX: Final = "storage."
#: Options Spark itself may add to a read; they mean nothing to the source.
_SPARK_OPTIONS: Final = frozenset({"path"})

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
    storage_options: tuple[tuple[str, Any], ...] = field(default=())
    fetch_offset_num_retries: int = 3
    fetch_offset_retry_interval_ms: int = 10
    poll_timeout_ms: int = 120_000

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
    """The raw options by documented name, consumed as they are parsed."""

    def __init__(self, raw: Mapping[str, str]) -> None:
        self.values: dict[str, str] = {}
        self.storage: dict[str, Any] = {}
        unknown: list[str] = []
        for key, value in raw.items():
            lower = key.lower()
            if lower.startswith(STORAGE_PREFIX) and len(lower) > len(STORAGE_PREFIX):
                self.storage[key[len(STORAGE_PREFIX) :]] = _storage_value(value)
            elif lower in _CANONICAL:
                self.values[_CANONICAL[lower]] = str(value)
            elif lower.startswith("kafka.") and lower[len("kafka.") :] in _CANONICAL:
                name = _CANONICAL[lower[len("kafka.") :]]
                raise InvalidOptionError(
                    key, value, name, "replog's options drop the kafka. prefix"
                )
            elif lower not in _SPARK_OPTIONS:
                unknown.append(key)
        if unknown:
            raise InvalidOptionError(
                unknown[0],
                str(raw[unknown[0]]),
                "one of " + ", ".join(KNOWN_OPTIONS) + ", or storage.<fsspec option>",
                "unknown option",
            )

    def get(self, name: str) -> str | None:
        return self.values.get(name)

    def choice(self, name: str, allowed: tuple[str, ...], default: str) -> str:
        value = self.values.get(name)
        if value is None:
            return default
        text = value.strip().lower()
        if text not in allowed:
            raise InvalidOptionError(name, value, " or ".join(allowed))
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
            raise InvalidOptionError(name, value, f"an integer >= {minimum}")
        return number

    def json(self, name: str, example: str) -> Any:
        value = self.values[name]
        try:
            return json.loads(value)
        except ValueError as err:
            raise InvalidOptionError(name, value, f"JSON like {example}", str(err)) from None


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


def parse_source_options(raw: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Parse a read's options (as Spark hands them over); InvalidOptionError names a bad one."""
    opts = _Options(raw)
    servers = opts.get("bootstrap.servers")
    if servers is None:
        raise InvalidOptionError("bootstrap.servers", None, "host:port[,host:port] of brokers")
    try:
        parse_bootstrap(servers)
    except ConfigError as err:
        raise InvalidOptionError(
            "bootstrap.servers", servers, "host:port[,host:port] of brokers", str(err)
        ) from None
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
        storage_options=tuple(sorted(opts.storage.items())),
        fetch_offset_num_retries=3 if retries is None else retries,
        fetch_offset_retry_interval_ms=10 if interval is None else interval,
        poll_timeout_ms=120_000 if poll is None else poll,
    )
