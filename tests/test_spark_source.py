"""The Spark source "replog": options, offsets, planning, and real reads with a real Spark.

Unit tests cover option parsing (every bad option names itself), offsets JSON, admission
arithmetic, range cutting and pickling. The rest runs real broker processes and the run's one
local SparkSession (``spark`` fixture): a 1,000,000-row batch read, streaming with
availableNow and processing-time triggers across a restart, admission control, a leader
SIGKILLed mid-stream, direct reads from local files and from S3 over HTTP against the broker
fallback, read_committed over raw-protocol transactions, and data loss.
"""

from __future__ import annotations

import json
import logging
import pickle
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from datasource.batch import ReplogBatchReader
from datasource.errors import DataLossError, InvalidOptionError
from datasource.offsets import (
    EarliestOffsets,
    GlobalTimestamp,
    LatestOffsets,
    SourceOffset,
    SpecificOffsets,
    SpecificTimestamps,
    rate_limit,
)
from datasource.options import Assign, Subscribe, SubscribePattern, parse_source_options
from datasource.partitions import (
    OffsetRange,
    OffsetRangePartition,
    ReadSettings,
    ReplicaLocation,
    split_ranges,
)
from datasource.planner import Planner
from datasource.reader import read_partition
from datasource.schema import arrow_schema, spark_schema
from datasource.source import ReplogDataSource
from datasource.stream import ReplogStreamReader, offsets_behind_latest
from logstore.batch import Record, build
from logstore.reader import AbortedTxnRange, ObjectExtent, SegmentObject
from logstore.storage import Storage
from replication import protocol as p
from replication.client import Admin, Producer, TopicPartition
from replication.errors import UnknownTopicOrPartitionError
from tests.cluster import BrokerProcess
from tests.conftest import S3Location
from tests.helpers import unique_name, wait_until
from tests.wire import RawConnection

T0 = 1_700_000_000_000  # record timestamps of the batch test: T0 + row number


def create_topic(bootstrap: str, name: str, partitions: int, rf: int = 1, **configs: str) -> None:
    """Create a topic and wait until every broker asked knows its leaders."""
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topic(name, partitions, rf, configs)

        def led() -> bool:
            try:
                described = admin.describe_topic(name)
            except UnknownTopicOrPartitionError:
                return False  # a broker that has not seen the new metadata yet
            return all(p.leader >= 0 for p in described.partitions)

        wait_until(led, message=f"leaders of {name}")


def produce(
    bootstrap: str,
    topic: str,
    partitions: list[int],
    values: list[bytes],
    timestamps: list[int] | None = None,
) -> None:
    """Rows i goes to ``partitions[i]``; acks=all, waits for every batch."""
    columns: dict[str, Any] = {
        "value": pa.array(values, pa.binary()),
        "partition": pa.array(partitions, pa.int32()),
    }
    if timestamps is not None:
        columns["timestamp"] = pa.array(timestamps, pa.int64())
    with Producer(bootstrap_servers=bootstrap, linger_ms=20) as producer:
        for future in producer.send_arrow(topic, pa.table(columns)):
            future.result(timeout=120)


def offset_ranges(planned: list[Any]) -> list[OffsetRangePartition]:
    """The planned input partitions (pyspark's InputPartition), each an OffsetRangePartition."""
    for q in planned:
        assert isinstance(q, OffsetRangePartition), q
    return planned


def options(bootstrap: str, topic: str, **extra: str) -> dict[str, str]:
    return {"bootstrap.servers": bootstrap, "subscribe": topic, **extra}


def batch_df(spark: Any, opts: dict[str, str]) -> Any:
    return spark.read.format("replog").options(**opts).load()


def stream_df(spark: Any, opts: dict[str, str]) -> Any:
    return spark.readStream.format("replog").options(**opts).load()


def assert_contiguous(df: Any, ends: dict[int, int], starts: dict[int, int] | None = None) -> None:
    """Per partition p: offsets are exactly [starts[p], ends[p]), once each.

    Checked by count, bounds, and the sums of offsets and of their squares (a duplicate
    cannot make up for a gap in both sums at once), which is far cheaper in Spark than
    counting distinct offsets.
    """
    offset = F.col("offset")
    got = {
        r["partition"]: (r["n"], r["lo"], r["hi"], r["s1"], r["s2"])
        for r in df.groupBy("partition")
        .agg(
            F.count("*").alias("n"),
            F.min(offset).alias("lo"),
            F.max(offset).alias("hi"),
            F.sum(offset).alias("s1"),
            F.sum(offset.cast("decimal(38,0)") * offset.cast("decimal(38,0)")).alias("s2"),
        )
        .collect()
    }
    starts = starts or dict.fromkeys(ends, 0)
    want = {
        p: (
            end - starts[p],
            starts[p],
            end - 1,
            sum(range(starts[p], end)),
            sum(i * i for i in range(starts[p], end)),
        )
        for p, end in ends.items()
        if end > starts[p]
    }
    assert got == want


# --- options ------------------------------------------------------------------------------------


@pytest.mark.unit
def test_options_parse_kafka_names_as_spark_hands_them_over() -> None:
    # Spark lower-cases option names and passes every value as a string.
    opts = parse_source_options(
        {
            "bootstrap.servers": "127.0.0.1:9092,127.0.0.1:9093",
            "subscribepattern": "events-.*",
            "startingoffsets": '{"events-a": {"0": 5, "1": -2}}',
            "maxoffsetspertrigger": "1000",
            "minoffsetspertrigger": "10",
            "maxtriggerdelay": "30s",
            "minpartitions": "4",
            "maxrecordsperpartition": "500",
            "failondataloss": "false",
            "includeheaders": "TRUE",
            "isolation.level": "read_uncommitted",
            "read.mode": "broker",
            "storage.endpoint_url": "http://127.0.0.1:9000",
            "storage.anon": "false",
            "storage.config_kwargs": '{"connect_timeout": 1}',
        },
        streaming=True,
    )
    assert opts.subscription == SubscribePattern("events-.*")
    assert opts.subscription.matches("events-a")
    assert not opts.subscription.matches("xevents-a")
    assert opts.starting == SpecificOffsets(
        {TopicPartition("events-a", 0): 5, TopicPartition("events-a", 1): -2}
    )
    assert opts.ending is None
    assert (opts.max_offsets_per_trigger, opts.min_offsets_per_trigger) == (1000, 10)
    assert opts.max_trigger_delay_ms == 30_000
    assert (opts.min_partitions, opts.max_records_per_partition) == (4, 500)
    assert not opts.fail_on_data_loss
    assert opts.include_headers
    assert not opts.read_committed
    assert opts.read_mode == "broker"
    assert dict(opts.storage_options) == {
        "endpoint_url": "http://127.0.0.1:9000",
        "anon": False,
        "config_kwargs": {"connect_timeout": 1},
    }
    batch = parse_source_options(
        {
            "bootstrap.servers": "h:1",
            "assign": '{"a": [0, 2]}',
            "endingtimestamp": "1700000000000",
            "startingoffsetsbytimestamp": '{"a": {"0": 1, "2": 2}}',
            "startingoffsetsbytimestampstrategy": "latest",
        },
        streaming=False,
    )
    assert batch.subscription == Assign((TopicPartition("a", 0), TopicPartition("a", 2)))
    assert batch.starting == SpecificTimestamps(
        {TopicPartition("a", 0): 1, TopicPartition("a", 2): 2}, "latest"
    )
    assert batch.ending == GlobalTimestamp(1_700_000_000_000, "latest")
    defaults = parse_source_options(
        {"bootstrap.servers": "h:1", "subscribe": "a, b"}, streaming=True
    )
    assert defaults.subscription == Subscribe(("a", "b"))
    assert defaults.starting == LatestOffsets()
    assert defaults.read_committed
    assert defaults.read_mode == "auto"
    assert defaults.fail_on_data_loss
    assert defaults.max_trigger_delay_ms == 15 * 60 * 1000
    assert (
        parse_source_options(
            {"bootstrap.servers": "h:1", "subscribe": "a"}, streaming=False
        ).starting
        == EarliestOffsets()
    )


BAD_OPTIONS = [
    # (options beyond bootstrap.servers, streaming, the option named, a phrase of the message)
    ({"subscribe": "a", "assign": '{"a": [0]}'}, True, "assign", "exactly one of subscribe"),
    ({"subscribe": "a", "subscribepattern": "a.*"}, True, "subscribePattern", "is given as well"),
    ({}, True, "subscribe", "is missing"),
    ({"subscribe": "a", "startingoffsets": "newest"}, True, "startingOffsets", "earliest, latest"),
    ({"subscribe": "a", "startingoffsets": '{"a": {"0": 1'}, True, "startingOffsets", "JSON"),
    ({"subscribe": "a", "startingoffsets": '{"a": {"x": 1}}'}, True, "startingOffsets", "number"),
    ({"subscribe": "a", "startingoffsets": "latest"}, False, "startingOffsets", "batch query"),
    ({"subscribe": "a", "endingoffsets": "latest"}, True, "endingOffsets", "batch only"),
    ({"subscribe": "a", "endingoffsets": '{"a": {"0": -2}}'}, False, "endingOffsets", "earliest"),
    ({"subscribe": "a", "maxoffsetspertrigger": "-5"}, True, "maxOffsetsPerTrigger", ">= 1"),
    ({"subscribe": "a", "maxoffsetspertrigger": "lots"}, True, "maxOffsetsPerTrigger", ">= 1"),
    (
        {"subscribe": "a", "maxoffsetspertrigger": "5", "minoffsetspertrigger": "9"},
        True,
        "minOffsetsPerTrigger",
        "at most maxOffsetsPerTrigger",
    ),
    ({"subscribe": "a", "maxtriggerdelay": "soon"}, True, "maxTriggerDelay", "duration"),
    ({"subscribe": "a", "isolation.level": "snapshot"}, True, "isolation.level", "read_committed"),
    ({"subscribe": "a", "read.mode": "fast"}, True, "read.mode", "auto or direct or broker"),
    ({"subscribe": "a", "failondataloss": "maybe"}, True, "failOnDataLoss", "true or false"),
    ({"subscribe": "a", "assign": "[]"}, True, "assign", "exactly one"),
    ({"assign": '{"a": "0"}'}, True, "assign", "list of partitions"),
    ({"subscribepattern": "(unclosed"}, True, "subscribePattern", "regular expression"),
    # Kafka consumer settings Spark's connector refuses, refused for its reasons
    ({"subscribe": "a", "kafka.auto.offset.reset": "x"}, True, "kafka.auto.offset.reset", "start"),
    ({"subscribe": "a", "kafka.enable.auto.commit": "x"}, True, "kafka.enable.auto.commit", "chec"),
    ({"subscribe": "a", "kafka.value.deserializer": "x"}, True, "kafka.value.deserializer", "byt"),
    ({"subscribe": "a", "kafka.fetch.max.bytes": "lots"}, True, "kafka.fetch.max.bytes", "valid"),
    ({"subscribe": "a", "kafka.group.id": " "}, True, "kafka.group.id", "group id"),
    # a kafka.<name> that is no setting of Kafka's consumer either: a typo, named
    ({"subscribe": "a", "kafka.fetch.max.byte": "1"}, True, "kafka.fetch.max.byte", "unknown"),
    ({"subscribe": "a", "groupidprefix": ""}, True, "groupIdPrefix", "prefix"),
    # Kafka's kafka. prefix: client settings take it (and errors name them as written) ...
    (
        {"subscribe": "a", "kafka.isolation.level": "x"},
        True,
        "kafka.isolation.level",
        "read_committed or read_uncommitted",
    ),
    # ... once
    (
        {"subscribe": "a", "kafka.bootstrap.servers": "h:2"},
        True,
        "kafka.bootstrap.servers",
        "bootstrap.servers is given as well",
    ),
    # ... source options do not (nor do they in Kafka's source)
    (
        {"subscribe": "a", "kafka.startingoffsets": "earliest"},
        True,
        "kafka.startingoffsets",
        "one of",
    ),
]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("extra", "streaming", "option", "phrase"),
    BAD_OPTIONS,
    ids=[f"{case[2]}-{i}" for i, case in enumerate(BAD_OPTIONS)],
)
def test_bad_options_name_the_option_the_value_and_what_is_allowed(
    extra: dict[str, str], streaming: bool, option: str, phrase: str
) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        parse_source_options({"bootstrap.servers": "h:1", **extra}, streaming=streaming)
    error = caught.value
    assert error.option == option
    assert f"option {option}" in str(error)
    assert phrase in str(error)
    given = extra.get(option.lower())
    if given is not None:
        assert repr(given) in str(error)
    assert "expected" in str(error)


@pytest.mark.unit
def test_missing_or_bad_bootstrap_servers_is_named() -> None:
    with pytest.raises(InvalidOptionError, match=r"option bootstrap\.servers is missing"):
        parse_source_options({"subscribe": "a"}, streaming=True)
    with pytest.raises(InvalidOptionError, match=r"option bootstrap\.servers=.nohost."):
        parse_source_options({"bootstrap.servers": "nohost", "subscribe": "a"}, streaming=True)


# --- offsets, admission, cutting, pickling ------------------------------------------------------


@pytest.mark.unit
def test_offsets_json_round_trip_and_errors() -> None:
    doc = {"b": {"1": 7, "0": 3}, "a": {"0": 0}}
    offset = SourceOffset.from_json(doc)
    assert offset.to_json() == {"a": {"0": 0}, "b": {"0": 3, "1": 7}}
    assert SourceOffset.from_json('{"a": {"0": 0}}').offsets == {TopicPartition("a", 0): 0}
    for bad in ('{"a": {"0": -1}}', '{"a": [1]}', '{"a": {"0": "x"}}', "[1]", "{"):
        with pytest.raises(ValueError, match="offset"):
            SourceOffset.from_json(bad)


@pytest.mark.unit
def test_rate_limit_never_exceeds_the_limit_and_follows_the_backlog() -> None:
    a, b, c = (TopicPartition("t", i) for i in range(3))
    start = {a: 0, b: 100, c: 50}
    latest = {a: 1000, b: 200, c: 50}
    end = rate_limit(start, latest, 110)
    assert sum(end[tp] - start[tp] for tp in start) == 110
    assert end == {a: 100, b: 110, c: 50}  # 1000:100 backlog split 100:10
    assert rate_limit(start, latest, 5000) == latest
    # One record per partition when the limit allows it, never more than the limit.
    many = {TopicPartition("t", i): 10 for i in range(5)}
    zero = dict.fromkeys(many, 0)
    assert sum(rate_limit(zero, many, 5).values()) == 5
    assert set(rate_limit(zero, many, 5).values()) == {1}
    assert sum(rate_limit(zero, many, 3).values()) == 3


@pytest.mark.unit
def test_ranges_follow_segment_objects_and_the_partition_options() -> None:
    mib = 1024 * 1024
    objects = tuple(SegmentObject(f"{i * 1000:020d}.seg", i * 1000, 30 * mib) for i in range(6))
    r = OffsetRange("t", 0, 500, 5500, objects)
    pieces = split_ranges([r], target_bytes=64 * mib)
    # Cut at object boundaries only, about two 30 MiB objects per piece.
    assert [(q.start, q.end) for q in pieces] == [(500, 2000), (2000, 4000), (4000, 5500)]
    assert [q.objects[0].base_offset for q in pieces] == [0, 2000, 4000]
    assert pieces[0].objects == objects[:2]
    # A small tail (the newest objects, not merged yet) joins the piece before it.
    tail = (*objects[:2], SegmentObject(f"{2000:020d}.seg", 2000, mib))
    joined = split_ranges([OffsetRange("t", 0, 0, 2100, tail)], target_bytes=32 * mib)
    assert [(q.start, q.end) for q in joined] == [(0, 1000), (1000, 2100)]
    assert joined[1].objects == tail[1:]
    # maxRecordsPerPartition divides evenly (Kafka's rule).
    capped = split_ranges([OffsetRange("t", 1, 0, 1000)], max_records=300)
    assert [(q.start, q.end) for q in capped] == [(0, 250), (250, 500), (500, 750), (750, 1000)]
    # minPartitions splits in proportion to size.
    small = [OffsetRange("t", 0, 0, 300), OffsetRange("t", 1, 0, 100)]
    spread = split_ranges(small, min_partitions=4)
    assert [(q.partition, q.start, q.end) for q in spread] == [
        (0, 0, 100),
        (0, 100, 200),
        (0, 200, 300),
        (1, 0, 100),
    ]
    assert split_ranges([OffsetRange("t", 0, 7, 7)]) == []


@pytest.mark.unit
def test_every_input_partition_and_offset_type_pickles() -> None:
    settings = ReadSettings(
        "127.0.0.1:9092",
        read_committed=True,
        include_headers=True,
        mode="auto",
        storage_options=(("endpoint_url", "http://x"), ("config_kwargs", {"a": 1})),
    )
    values: list[Any] = [
        settings,
        ReplicaLocation(1, "s3://bucket/broker-1"),
        SegmentObject("00000000000000000042.seg", 42, 1024),
        OffsetRange("t", 0, 0, 10, (SegmentObject("x.seg", 0, 1),)),
        OffsetRangePartition(
            "t",
            3,
            10,
            20,
            settings,
            replicas=(ReplicaLocation(0, "file:///a"), ReplicaLocation(2, "file:///b")),
            objects=(SegmentObject("00000000000000000000.seg", 0, 99),),
            aborted=(AbortedTxnRange(7, 12), AbortedTxnRange(9, 15)),
        ),
        SourceOffset({TopicPartition("t", 0): 5}),
        EarliestOffsets(),
        LatestOffsets(),
        SpecificOffsets({TopicPartition("t", 0): -2}),
        SpecificTimestamps({TopicPartition("t", 0): T0}, "latest"),
        GlobalTimestamp(T0),
        parse_source_options(
            {"bootstrap.servers": "h:1", "subscribepattern": "t.*", "storage.key": "k"},
            streaming=True,
        ),
        DataLossError("offsets [0, 5) of t-0 are gone"),
        InvalidOptionError("read.mode", "fast", "auto, direct or broker"),
    ]
    for value in values:
        again = pickle.loads(pickle.dumps(value))
        if isinstance(value, Exception):
            assert str(again) == str(value)
        else:
            assert again == value
    # The stream reader pickles to executors without driver state.
    reader = ReplogStreamReader(values[-3])
    reader._latest = {TopicPartition("t", 0): 1}
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.options == reader.options
    assert copy._latest is None


@pytest.mark.unit
def test_arrow_schema_is_exactly_what_spark_expects() -> None:
    for headers in (False, True):
        expected = to_arrow_schema(spark_schema(headers), timezone="UTC")
        assert arrow_schema(headers).equals(expected)
    assert ReplogDataSource.name() == "replog"
    given = {"bootstrap.servers": "h:1", "subscribe": "a"}
    assert ReplogDataSource({**given, "includeheaders": "true"}).schema() == spark_schema(True)
    with pytest.raises(InvalidOptionError, match="includeHeaders"):
        ReplogDataSource({**given, "includeheaders": "yes please"}).schema()


@pytest.mark.unit
def test_kafka_prefix_names_the_same_client_settings_on_the_source() -> None:
    # As Spark's Kafka source is configured: kafka.bootstrap.servers, kafka.isolation.level.
    opts = parse_source_options(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9092",
            "subscribe": "a",
            "kafka.isolation.level": "read_uncommitted",
        },
        streaming=True,
    )
    assert opts.bootstrap_servers == "127.0.0.1:9092"
    assert not opts.read_committed
    with pytest.raises(InvalidOptionError, match=r"option kafka\.bootstrap\.servers='nohost'"):
        parse_source_options(
            {"kafka.bootstrap.servers": "nohost", "subscribe": "a"}, streaming=True
        )


@pytest.mark.unit
def test_kafka_consumer_settings_reach_the_clients_and_unknown_ones_are_ignored_by_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A job written for Spark's Kafka connector, unchanged: its group naming is accepted, its
    # consumer settings reach replog's clients, and what replog's clients lack is named.
    with caplog.at_level("WARNING", logger="datasource.options"):
        opts = parse_source_options(
            {
                "kafka.bootstrap.servers": "h:1",
                "subscribe": "a",
                "kafka.group.id": "etl",
                "groupIdPrefix": "etl-",
                "kafka.client.id": "etl-reader",
                "kafka.max.poll.records": "100",
                "kafka.Session.Timeout.ms": "10000",
                "kafka.receive.buffer.bytes": "65536",
            },
            streaming=True,
        )
    assert dict(opts.consumer_settings) == {"client.id": "etl-reader", "max.poll.records": "100"}
    assert opts.ignored_kafka_settings == ("kafka.receive.buffer.bytes", "kafka.session.timeout.ms")
    [warning] = [r.getMessage() for r in caplog.records]
    assert "kafka.receive.buffer.bytes, kafka.session.timeout.ms" in warning
    assert "max.poll.records" in warning  # what is handed on
    planner = Planner(opts)
    assert planner.settings.consumer_settings == opts.consumer_settings
    # the admin clients get the settings every client has, and keep their own defaults
    config = planner.view._config()
    assert config["client.id"] == "etl-reader"
    assert "max.poll.records" not in config


@pytest.mark.unit
def test_schema_at_load_checks_every_option_either_kind_of_read_accepts() -> None:
    # Spark calls schema() at load(), before it knows whether a batch or a stream reads.
    base = {"bootstrap.servers": "h:1", "subscribe": "a"}
    for bad, option in [
        ({"maxoffsetspertrigger": "lots"}, "maxOffsetsPerTrigger"),
        ({"subscribe": "a", "assign": '{"a": [0]}'}, "assign"),
        ({"kafka.auto.offset.reset": "earliest"}, "kafka.auto.offset.reset"),
        ({"endingoffsets": '{"a": {"0": -2}}'}, "endingOffsets"),
    ]:
        with pytest.raises(InvalidOptionError) as caught:
            ReplogDataSource({**base, **bad}).schema()
        assert caught.value.option == option
    # valid for one kind of read: the reader refuses it when made
    ReplogDataSource({**base, "endingoffsets": "latest"}).schema()
    ReplogDataSource({**base, "startingoffsets": "latest"}).schema()


# --- batch reads ------------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.cluster
def test_batch_read_of_a_million_rows_and_offset_and_time_ranges(
    spark: Any, broker: BrokerProcess
) -> None:
    topic = unique_name("spark")
    create_topic(broker.bootstrap, topic, 3)
    n = 1_000_000
    value = b"v" * 100
    produce(
        broker.bootstrap,
        topic,
        [i % 3 for i in range(n)],
        [value] * n,
        [T0 + i for i in range(n)],
    )
    ends = {p: len(range(p, n, 3)) for p in range(3)}  # row i is offset i // 3 of i % 3
    df = batch_df(spark, options(broker.bootstrap, topic))
    assert df.schema == spark_schema(False)
    assert_contiguous(df, ends)
    assert df.filter(F.col("value") != F.lit(value)).count() == 0

    # startingOffsets / endingOffsets select exactly [start, end) per partition.
    starts = {0: 10, 1: 0, 2: 333_000}
    stops = {0: 200_000, 1: ends[1], 2: 333_100}
    ranged = batch_df(
        spark,
        options(
            broker.bootstrap,
            topic,
            startingOffsets=f'{{"{topic}": {{"0": 10, "1": -2, "2": 333000}}}}',
            endingOffsets=f'{{"{topic}": {{"0": 200000, "1": -1, "2": 333100}}}}',
        ),
    )
    assert_contiguous(ranged, stops, starts)

    # Timestamps: row i has timestamp T0 + i, so time t starts at row t - T0 in every partition.
    def first_offset_at(p: int, row: int) -> int:
        return (row - p + 2) // 3  # the first offset of partition p whose row is >= row

    timed = batch_df(
        spark,
        options(
            broker.bootstrap,
            topic,
            startingTimestamp=str(T0 + 300_000),
            endingOffsetsByTimestamp=(
                f'{{"{topic}": {{"0": {T0 + 600_000}, "1": {T0 + 600_000}, '
                f'"2": {T0 + 2 * n}}}}}'  # no record that late: the end is latest
            ),
        ),
    )
    assert_contiguous(
        timed,
        {0: first_offset_at(0, 600_000), 1: first_offset_at(1, 600_000), 2: ends[2]},
        {p: first_offset_at(p, 300_000) for p in range(3)},
    )
    first = timed.orderBy("partition", "offset").first()
    assert first["timestamp"].timestamp() * 1000 >= T0 + 300_000


@pytest.mark.spark
@pytest.mark.cluster
def test_bad_option_fails_load_with_its_name(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = unique_name("spark")
    create_topic(broker.bootstrap, topic, 1)
    # at load(), as Spark's Kafka source: batch and streaming reads alike
    with pytest.raises(Exception, match="option startingOffsets='newest' is not valid"):
        batch_df(spark, options(broker.bootstrap, topic, startingOffsets="newest"))
    with pytest.raises(Exception, match="option maxOffsetsPerTrigger='lots' is not valid"):
        stream_df(spark, options(broker.bootstrap, topic, maxOffsetsPerTrigger="lots"))
    # an option only a stream refuses: load() cannot know, so the query fails when it starts
    ending = stream_df(spark, options(broker.bootstrap, topic, endingOffsets="latest"))
    query = (
        ending.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        with pytest.raises(Exception, match="option endingOffsets='latest' is not valid"):
            query.awaitTermination(120)
    finally:
        query.stop()
    # kafka.bootstrap.servers, as Kafka's source is configured
    prefixed = {"kafka.bootstrap.servers": broker.bootstrap, "subscribe": topic}
    assert batch_df(spark, prefixed).count() == 0
    # spark.dataSource.register works too (format("replog") resolves without it).
    spark.dataSource.register(ReplogDataSource)
    assert batch_df(spark, options(broker.bootstrap, topic)).count() == 0


# --- direct reads and the broker fallback ---------------------------------------------------


def _mixed_records(bootstrap: str, topic: str, n: int) -> None:
    """Keys, tombstones and headers in 2 partitions."""
    table = pa.table(
        {
            "key": pa.array([None if i % 7 == 0 else b"k%d" % i for i in range(n)], pa.binary()),
            "value": pa.array([None if i % 11 == 0 else b"v%d" % i for i in range(n)], pa.binary()),
            "partition": pa.array([i % 2 for i in range(n)], pa.int32()),
            "headers": pa.array(
                [[{"key": "h", "value": b"%d" % i}] if i % 3 == 0 else None for i in range(n)],
                pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
            ),
        }
    )
    with Producer(bootstrap_servers=bootstrap, linger_ms=2, batch_size=4096) as producer:
        for future in producer.send_arrow(topic, table):
            future.result(timeout=60)


def _all_columns(df: Any) -> list[tuple[Any, ...]]:
    # (partition, offset) first: unique, so the sort never compares None with bytes.
    return sorted(
        (
            r["partition"],
            r["offset"],
            r["topic"],
            r["key"],
            r["value"],
            r["timestampType"],
            tuple(r["headers"] or ()),
        )
        for r in df.collect()
    )


@pytest.mark.spark
@pytest.mark.cluster
def test_direct_reads_of_local_files_match_the_broker_fallback(
    spark: Any, broker: BrokerProcess
) -> None:
    topic = unique_name("spark")
    create_topic(broker.bootstrap, topic, 2)
    _mixed_records(broker.bootstrap, topic, 3000)
    opts = options(broker.bootstrap, topic, includeHeaders="true")
    direct = _all_columns(batch_df(spark, {**opts, "read.mode": "direct"}))
    # a job ported from Spark's Kafka connector, its kafka.* consumer settings as they were
    ported = {
        "kafka.group.id": "etl",
        "groupIdPrefix": "etl-",
        "kafka.client.id": "etl-reader",
        "kafka.max.partition.fetch.bytes": "4096",
        "kafka.session.timeout.ms": "10000",
    }
    brokered = _all_columns(batch_df(spark, {**opts, **ported, "read.mode": "broker"}))
    auto = _all_columns(batch_df(spark, {**opts, "minPartitions": "5"}))
    assert len(direct) == 3000
    assert direct == brokered == auto


@pytest.mark.spark
@pytest.mark.cluster
@pytest.mark.s3
def test_direct_reads_from_s3_match_the_broker_and_fall_back_when_unreachable(
    spark: Any, broker_factory: Any, s3_url: S3Location
) -> None:
    b = broker_factory(
        log_dir=s3_url.sub("broker-0"), overrides={"storage.endpoint.url": s3_url.endpoint_url}
    )
    topic = unique_name("spark")
    create_topic(b.bootstrap, topic, 2)
    _mixed_records(b.bootstrap, topic, 2000)
    storage = {f"storage.{k}": v for k, v in s3_url.storage_options.items()}
    opts = options(b.bootstrap, topic, includeHeaders="true")
    direct = _all_columns(batch_df(spark, {**opts, **storage, "read.mode": "direct"}))
    # a job ported from Spark's Kafka connector, its kafka.* consumer settings as they were
    ported = {
        "kafka.group.id": "etl",
        "groupIdPrefix": "etl-",
        "kafka.client.id": "etl-reader",
        "kafka.max.partition.fetch.bytes": "4096",
        "kafka.session.timeout.ms": "10000",
    }
    brokered = _all_columns(batch_df(spark, {**opts, **ported, "read.mode": "broker"}))
    # Executors that cannot reach the store read through the broker (auto), or fail (direct).
    unreachable = {
        "storage.endpoint_url": "http://127.0.0.1:9",
        "storage.key": "testing",
        "storage.secret": "testing",
        "storage.config_kwargs": '{"retries": {"max_attempts": 1}, "connect_timeout": 1}',
    }
    fallback = _all_columns(batch_df(spark, {**opts, **unreachable}))
    assert len(direct) == 2000
    assert direct == brokered == fallback
    with pytest.raises(Exception, match=r"127\.0\.0\.1:9\b"):
        batch_df(spark, {**opts, **unreachable, "read.mode": "direct"}).count()


# --- direct reads over the broker WAL (log.wal.enable) --------------------------------------


def _planned_extents(bootstrap: str, topic: str) -> list[ObjectExtent]:
    """The extents of a direct read of every partition of ``topic`` to its end, as the planner
    got them from the brokers; asserts planning touched no storage (its only storage access is
    listing a replica's objects, through a SegmentReader it keeps)."""
    planner = Planner(
        parse_source_options(options(bootstrap, topic, **{"read.mode": "direct"}), streaming=False)
    )
    try:
        tps = planner.view.topic_partitions()
        pieces = planner.plan(planner.view.earliest(tps), planner.view.latest(tps))
        assert planner._readers == {}  # nothing listed
    finally:
        planner.close()
    found = [o for piece in pieces for o in piece.objects]
    assert all(isinstance(o, ObjectExtent) for o in found)
    return [o for o in found if isinstance(o, ObjectExtent)]


def _levels(extents: list[ObjectExtent]) -> set[str]:
    """``seg`` for segment objects, ``L0``/``L1``... for chunks of WAL / packed objects."""
    return {"seg" if e.is_segment else e.path.split("/")[2] for e in extents}


@pytest.mark.spark
@pytest.mark.cluster
def test_direct_reads_of_wal_chunks_match_the_broker_before_and_after_compaction(
    spark: Any, cluster_factory: Any
) -> None:
    # (a) Data only in L0 WAL objects: compaction waits an hour.
    l0_only = cluster_factory(
        brokers=3,
        overrides={"log.wal.enable": "true", "wal.compaction.l0.max.age.ms": "3600000"},
    )
    topic = unique_name("spark-wal")
    create_topic(l0_only.bootstrap, topic, 2, 3)
    _mixed_records(l0_only.bootstrap, topic, 3000)
    extents = _planned_extents(l0_only.bootstrap, topic)
    assert _levels(extents) == {"L0"}
    assert all(e.path.startswith("_replog/wal/L0/") and e.position > 0 for e in extents)
    opts = options(l0_only.bootstrap, topic, includeHeaders="true")
    direct = _all_columns(batch_df(spark, {**opts, "read.mode": "direct", "minPartitions": "4"}))
    # a job ported from Spark's Kafka connector, its kafka.* consumer settings as they were
    ported = {
        "kafka.group.id": "etl",
        "groupIdPrefix": "etl-",
        "kafka.client.id": "etl-reader",
        "kafka.max.partition.fetch.bytes": "4096",
        "kafka.session.timeout.ms": "10000",
    }
    brokered = _all_columns(batch_df(spark, {**opts, **ported, "read.mode": "broker"}))
    assert len(direct) == 3000
    assert direct == brokered

    # (b) Half compacted: packed L1 chunks, then L0 chunks written after them.
    compacting = cluster_factory(
        brokers=3, overrides={"log.wal.enable": "true", "wal.compaction.l0.max.age.ms": "200"}
    )
    topic = unique_name("spark-wal")
    create_topic(compacting.bootstrap, topic, 2, 3)
    _mixed_records(compacting.bootstrap, topic, 2000)
    wait_until(
        lambda: "L0" not in _levels(_planned_extents(compacting.bootstrap, topic)),
        timeout=60,
        message="the first records compacted into packed objects",
    )
    _mixed_records(compacting.bootstrap, topic, 1000)
    opts = options(compacting.bootstrap, topic, includeHeaders="true")
    direct = _all_columns(batch_df(spark, {**opts, "read.mode": "direct"}))
    # a job ported from Spark's Kafka connector, its kafka.* consumer settings as they were
    ported = {
        "kafka.group.id": "etl",
        "groupIdPrefix": "etl-",
        "kafka.client.id": "etl-reader",
        "kafka.max.partition.fetch.bytes": "4096",
        "kafka.session.timeout.ms": "10000",
    }
    brokered = _all_columns(batch_df(spark, {**opts, **ported, "read.mode": "broker"}))
    assert len(direct) == 3000
    assert direct == brokered


# --- streaming ------------------------------------------------------------------------------


class KeepProducing:
    """A thread appending rows (values ``b"<partition>-<n>"``) to every partition until
    stopped; ``sent[p]`` counts acknowledged rows."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rows: int = 50) -> None:
        self.producer = Producer(bootstrap_servers=bootstrap, linger_ms=5)
        self.topic = topic
        self.partitions = partitions
        self.rows = rows
        self.sent = dict.fromkeys(range(partitions), 0)
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for partition in range(self.partitions):
                first = self.sent[partition]
                values = [b"%d-%d" % (partition, first + i) for i in range(self.rows)]
                table = pa.table({"value": pa.array(values, pa.binary())})
                try:
                    for future in self.producer.send_arrow(self.topic, table, partition=partition):
                        future.result(timeout=120)
                except Exception as err:
                    self.errors.append(err)
                    return
                self.sent[partition] += self.rows
            self._stop.wait(0.1)

    def __enter__(self) -> KeepProducing:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=180)
        self.producer.close()
        assert not self.errors, self.errors


def data_batches(query: Any) -> list[dict[str, Any]]:
    return [p for p in query.recentProgress if p["numInputRows"] > 0]


def assert_exactly_once(spark: Any, path: Path, sent: dict[int, int]) -> None:
    """The sink holds every row produced to each partition once, in offset order."""
    df = spark.read.parquet(str(path))
    assert_contiguous(df, sent)
    # Values were produced in order: offset n of partition p holds b"p-n".
    mismatched = df.filter(
        F.col("value") != F.encode(F.concat_ws("-", F.col("partition"), F.col("offset")), "utf-8")
    ).count()
    assert mismatched == 0


@pytest.mark.spark
@pytest.mark.cluster
def test_streaming_available_now_then_processing_time_restarts_without_duplicates_or_gaps(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = unique_name("spark")
    create_topic(broker.bootstrap, topic, 2)
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"

    def start(trigger: dict[str, Any]) -> Any:
        df = stream_df(spark, options(broker.bootstrap, topic, startingOffsets="earliest"))
        return (
            df.writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(checkpoint))
            .trigger(**trigger)
            .start()
        )

    with KeepProducing(broker.bootstrap, topic, 2) as producer:
        wait_until(lambda: min(producer.sent.values()) >= 500, message="500 rows each")
        first = start({"availableNow": True})
        first.awaitTermination(120)
        assert data_batches(first)
        query = start({"processingTime": "300 milliseconds"})
        wait_until(lambda: len(data_batches(query)) >= 3, timeout=90, message="3 batches")
        query.stop()
    sent = dict(producer.sent)
    # A restart from the checkpoint reads the rest, and nothing twice.
    last = start({"availableNow": True})
    last.awaitTermination(120)
    assert_exactly_once(spark, sink, sent)


@pytest.mark.spark
@pytest.mark.cluster
def test_max_offsets_per_trigger_bounds_every_batch(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = unique_name("spark")
    create_topic(broker.bootstrap, topic, 3)
    n = 9_000
    produce(broker.bootstrap, topic, [i % 3 if i < 6000 else 0 for i in range(n)], [b"x"] * n)
    df = stream_df(
        spark,
        options(broker.bootstrap, topic, startingOffsets="earliest", maxOffsetsPerTrigger="1000"),
    )
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    sizes = [p["numInputRows"] for p in data_batches(query)]
    assert sum(sizes) == n
    assert max(sizes) <= 1000
    assert len(sizes) == 9
    # reportLatestOffset: the progress shows how far the topic goes (the backlog).
    latest = data_batches(query)[0]["sources"][0]["latestOffset"]
    assert latest == f'{{"{topic}": {{"0": 5000, "1": 2000, "2": 2000}}}}'
    # Kafka's lag metrics, from latestOffset and endOffset (a Python source cannot put them in
    # the progress's metrics: see datasource.stream)
    lags = [offsets_behind_latest(p["sources"][0]) for p in data_batches(query)]
    first, last = lags[0], lags[-1]
    assert float(first["avgOffsetsBehindLatest"]) * 3 == n - 1000
    assert int(first["minOffsetsBehindLatest"]) <= int(first["maxOffsetsBehindLatest"])
    assert int(first["maxOffsetsBehindLatest"]) > 0
    assert last == {
        "minOffsetsBehindLatest": "0",
        "maxOffsetsBehindLatest": "0",
        "avgOffsetsBehindLatest": "0.0",
    }


@pytest.mark.spark
@pytest.mark.cluster
def test_min_offsets_per_trigger_waits_up_to_max_trigger_delay(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = unique_name("spark")
    create_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, [0] * 100, [b"x"] * 100)
    checkpoint = str(tmp_path / "checkpoint")

    def start(max_trigger_delay: str) -> Any:
        df = stream_df(
            spark,
            options(
                broker.bootstrap,
                topic,
                startingOffsets="earliest",
                minOffsetsPerTrigger="1000",
                maxTriggerDelay=max_trigger_delay,
            ),
        )
        return (
            df.writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    query = start("6s")
    try:
        wait_until(lambda: data_batches(query), timeout=60, message="the delayed batch")
        # 100 < 1000 records: the first trigger held them back (Spark reports that trigger,
        # without data); only maxTriggerDelay released them.
        assert query.recentProgress[0]["numInputRows"] == 0
        assert [p["numInputRows"] for p in data_batches(query)] == [100]
    finally:
        query.stop()
    # Enough records: the batch runs at once; a delay that cannot pass here does not hold it.
    produce(broker.bootstrap, topic, [0] * 1500, [b"x"] * 1500)
    query = start("1h")
    try:
        wait_until(lambda: data_batches(query), timeout=60, message="a full batch")
        assert [p["numInputRows"] for p in data_batches(query)] == [1500]
    finally:
        query.stop()


@pytest.mark.spark
@pytest.mark.cluster
@pytest.mark.chaos
def test_leader_sigkill_while_a_streaming_query_reads(
    spark: Any, cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(brokers=3)
    topic = unique_name("spark")
    create_topic(cluster.bootstrap, topic, 2, rf=3, **{"min.insync.replicas": "2"})
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    bootstrap = cluster.bootstrap
    df = stream_df(spark, options(bootstrap, topic, startingOffsets="earliest"))
    query = (
        df.writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        with KeepProducing(bootstrap, topic, 2, rows=20) as producer:
            wait_until(lambda: len(data_batches(query)) >= 2, timeout=120, message="2 batches")
            with Admin(bootstrap_servers=bootstrap) as admin:
                leader = admin.describe_topic(topic).partitions[0].leader
                cluster.brokers[leader].kill()
                wait_until(
                    lambda: admin.describe_topic(topic).partitions[0].leader not in (-1, leader),
                    timeout=60,
                    message="a new leader",
                )
            killed_at = sum(producer.sent.values())
            wait_until(
                lambda: sum(producer.sent.values()) >= killed_at + 400,
                timeout=60,
                message="producing after the failover",
            )
        sent = dict(producer.sent)
        survivors = cluster.bootstrap
        with Admin(bootstrap_servers=survivors) as admin:
            ends = admin.list_offsets({(topic, p): "latest" for p in range(2)})
        assert {tp.partition: end for tp, end in ends.items()} == sent

        def caught_up() -> bool:
            progress = query.lastProgress
            return bool(progress) and progress["sources"][0]["endOffset"] == (
                f'{{"{topic}": {{"0": {sent[0]}, "1": {sent[1]}}}}}'
            )

        wait_until(caught_up, timeout=120, message="the query reads everything")
    finally:
        query.stop()
    assert query.exception() is None
    assert_exactly_once(spark, sink, sent)


@pytest.mark.cluster
def test_new_topics_of_a_pattern_join_at_the_next_batch_from_their_start(
    broker: BrokerProcess,
) -> None:
    prefix = unique_name("spark")
    first, second = f"{prefix}-a", f"{prefix}-b"
    create_topic(broker.bootstrap, first, 1)
    produce(broker.bootstrap, first, [0] * 10, [b"a"] * 10)
    reader = ReplogStreamReader(
        parse_source_options(
            {"bootstrap.servers": broker.bootstrap, "subscribepattern": f"{prefix}-.*"},
            streaming=True,
        )
    )
    try:
        start = reader.initialOffset()
        assert start == {first: {"0": 10}}  # startingOffsets=latest
        create_topic(broker.bootstrap, second, 2)
        produce(broker.bootstrap, second, [0, 1] * 5, [b"b"] * 10)
        produce(broker.bootstrap, first, [0] * 3, [b"a"] * 3)
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        assert end == {first: {"0": 13}, second: {"0": 5, "1": 5}}
        assert reader.reportLatestOffset() == end
        planned = offset_ranges(reader.partitions(start, end))
        assert sorted((q.topic, q.partition, q.start, q.end) for q in planned) == [
            (first, 0, 10, 13),
            (second, 0, 0, 5),
            (second, 1, 0, 5),
        ]
        read = pa.Table.from_batches([b for q in planned for b in reader.read(q)])
        assert read.num_rows == 13
        assert read.schema.equals(arrow_schema(False))
    finally:
        reader.stop()


# --- transactions ---------------------------------------------------------------------------


class RawTransaction:
    """A transaction written with raw requests (FindCoordinator, InitProducerId,
    AddPartitionsToTxn, transactional Produce, EndTxn)."""

    def __init__(self, bootstrap: str, transactional_id: str, topic: str) -> None:
        self.conn = RawConnection(bootstrap)
        self.id = transactional_id
        self.topic = topic
        self.sequence = 0

        def ready() -> Any:
            found = self.conn.request(
                p.ApiKey.FIND_COORDINATOR, p.FindCoordinatorRequest(key=transactional_id)
            )
            if found.error_code:
                return None
            init = self.conn.request(
                p.ApiKey.INIT_PRODUCER_ID,
                p.InitProducerIdRequest(
                    transactional_id=transactional_id, transaction_timeout_ms=600_000
                ),
            )
            return None if init.error_code else init

        init = wait_until(ready, message="the transaction coordinator")
        self.pid, self.epoch = init.producer_id, init.producer_epoch
        added = self.conn.request(
            p.ApiKey.ADD_PARTITIONS_TO_TXN,
            p.AddPartitionsToTxnRequest(
                transactional_id=transactional_id,
                producer_id=self.pid,
                producer_epoch=self.epoch,
                topics=[p.AddPartitionsToTxnTopic(name=topic, partitions=[0])],
            ),
        )
        assert added.results[0].results[0].error_code == 0

    def send(self, values: list[bytes]) -> None:
        data = build(
            [Record(None, v, T0) for v in values],
            producer_id=self.pid,
            producer_epoch=self.epoch,
            base_sequence=self.sequence,
            is_transactional=True,
        )
        self.sequence += len(values)
        response = self.conn.request(
            p.ApiKey.PRODUCE,
            p.ProduceRequest(
                transactional_id=self.id,
                acks=-1,
                topic_data=[
                    p.ProduceRequestTopic(
                        name=self.topic,
                        partition_data=[p.ProduceRequestPartition(index=0, records=data)],
                    )
                ],
            ),
        )
        assert response.responses[0].partition_responses[0].error_code == 0

    def end(self, commit: bool) -> None:
        response = self.conn.request(
            p.ApiKey.END_TXN,
            p.EndTxnRequest(
                transactional_id=self.id,
                producer_id=self.pid,
                producer_epoch=self.epoch,
                committed=commit,
            ),
        )
        assert response.error_code == 0

    def close(self) -> None:
        self.conn.close()


@pytest.mark.spark
@pytest.mark.cluster
def test_read_committed_hides_aborted_and_open_transactions(
    spark: Any, broker: BrokerProcess
) -> None:
    topic = unique_name("spark")
    create_topic(broker.bootstrap, topic, 1)

    def plain(*values: bytes) -> None:
        produce(broker.bootstrap, topic, [0] * len(values), list(values))

    def txn(name: str) -> RawTransaction:
        return RawTransaction(broker.bootstrap, f"{topic}-{name}", topic)

    plain(b"p1", b"p2")
    committed, aborted, still_open = txn("committed"), txn("aborted"), txn("open")
    try:
        committed.send([b"c1", b"c2"])
        aborted.send([b"a1", b"a2", b"a3"])
        committed.send([b"c3"])
        committed.end(commit=True)
        aborted.send([b"a4"])
        aborted.end(commit=False)
        plain(b"p3")
        still_open.send([b"o1", b"o2"])
        plain(b"p4")  # after the open transaction: beyond the LSO
    finally:
        for t in (committed, aborted, still_open):
            t.close()

    def values(**extra: str) -> list[bytes]:
        df = batch_df(spark, options(broker.bootstrap, topic, **extra))
        return [r["value"] for r in df.orderBy("offset").collect()]

    visible = [b"p1", b"p2", b"c1", b"c2", b"c3", b"p3"]
    assert values() == visible  # read_committed is the default
    assert values(**{"read.mode": "direct"}) == visible
    assert values(**{"read.mode": "broker"}) == visible
    everything = [b"p1", b"p2", b"c1", b"c2", b"a1", b"a2", b"a3", b"c3", b"a4", b"p3"]
    everything += [b"o1", b"o2", b"p4"]
    for mode in ("direct", "broker"):
        assert values(**{"isolation.level": "read_uncommitted", "read.mode": mode}) == everything


# --- data loss ------------------------------------------------------------------------------

RETENTION = {"log.retention.check.interval.ms": "200"}
#: wal.compaction.window.bytes of the retention-during-a-read test over the WAL
WINDOW = 64 * 1024


def _retained_topic(bootstrap: str, expire_in_ms: int) -> str:
    """A topic whose first 100 records expire ``expire_in_ms`` from now (100 more do not)."""
    topic = unique_name("spark")
    create_topic(
        bootstrap,
        topic,
        1,
        1,
        **{"segment.bytes": "1024", "retention.ms": "600000", "file.delete.delay.ms": "0"},
    )
    now = int(time.time() * 1000)
    produce(bootstrap, topic, [0] * 100, [b"old"] * 100, [now - 600_000 + expire_in_ms] * 100)
    produce(bootstrap, topic, [0] * 100, [b"new"] * 100, [now + 3_600_000] * 100)
    return topic


def _earliest(bootstrap: str, topic: str) -> int:
    with Admin(bootstrap_servers=bootstrap) as admin:
        return admin.list_offsets({(topic, 0): "earliest"})[TopicPartition(topic, 0)]


@pytest.mark.spark
@pytest.mark.cluster
def test_offsets_removed_by_retention_fail_the_query_or_are_skipped(
    spark: Any, broker_factory: Any
) -> None:
    b = broker_factory(overrides=RETENTION)
    topic = _retained_topic(b.bootstrap, 0)
    wait_until(lambda: _earliest(b.bootstrap, topic) == 100, message="retention")
    opts = options(b.bootstrap, topic, startingOffsets=f'{{"{topic}": {{"0": 0}}}}')
    with pytest.raises(Exception, match="failOnDataLoss") as caught:
        batch_df(spark, opts).count()
    assert "offsets [0, 100)" in str(caught.value)
    assert "removed by retention" in str(caught.value)
    kept = batch_df(spark, {**opts, "failOnDataLoss": "false"})
    assert_contiguous(kept, {0: 200}, {0: 100})


@pytest.mark.cluster
@pytest.mark.parametrize("mode", ["direct", "auto"])
@pytest.mark.parametrize(
    "layout",
    [
        pytest.param({"log.wal.enable": "false"}, id="segments"),
        # Over the WAL the expired records' object goes once a compaction round has dropped
        # its dead chunk and nothing refers to it (file.delete.delay.ms=0). Compaction is held
        # off by age and made due by bytes, after retention (below): compacted earlier, the
        # expired chunk would share a packed extent with live records.
        pytest.param(
            {
                "log.wal.enable": "true",
                "wal.compaction.l0.max.age.ms": "3600000",
                "wal.compaction.window.bytes": str(WINDOW),
                "file.delete.delay.ms": "0",
            },
            id="wal",
        ),
    ],
)
def test_retention_during_a_read_fails_the_task_or_skips_with_a_warning(
    broker_factory: Any, caplog: pytest.LogCaptureFixture, mode: str, layout: dict[str, str]
) -> None:
    b = broker_factory(overrides={**RETENTION, **layout})
    topic = _retained_topic(b.bootstrap, 4_000)
    opts = parse_source_options(options(b.bootstrap, topic, **{"read.mode": mode}), streaming=False)
    (planned,) = offset_ranges(ReplogBatchReader(opts).partitions())
    assert (planned.start, planned.end) == (0, 200)
    assert planned.replicas
    expired = {
        o.path for o in planned.objects if isinstance(o, ObjectExtent) and o.base_offset < 100
    }
    assert expired, planned.objects  # the planner's extents name the objects of [0, 100)
    root = Storage.from_url(planned.replicas[0].log_dir)
    # Retention moves the log start, then the objects of the expired records are deleted
    # (segment objects: file.delete.delay.ms=0; over the WAL, see the layout above).
    wait_until(lambda: _earliest(b.bootstrap, topic) == 100, timeout=60, message="retention")
    # a record past the read's range, big enough to make the WAL's compaction due
    produce(b.bootstrap, topic, [0], [b"x" * 2 * WINDOW], [int(time.time() * 1000) + 3_600_000])
    wait_until(
        lambda: not any(root.exists(path) for path in expired),
        timeout=60,
        message=f"the objects of the expired records deleted: {sorted(expired)}",
    )
    with pytest.raises(DataLossError, match=r"offsets \[0, 100\) of .* are gone"):
        list(read_partition(planned))
    lenient = replace(planned, settings=replace(planned.settings, fail_on_data_loss=False))
    with caplog.at_level(logging.WARNING, logger="datasource.reader"):
        batches = list(read_partition(lenient))
    assert pa.Table.from_batches(batches).column("offset").to_pylist() == list(range(100, 200))
    assert "offsets [0, 100)" in caplog.text
    assert "failOnDataLoss=false" in caplog.text


@pytest.mark.cluster
def test_a_recreated_topic_is_data_loss_for_a_running_stream(
    broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    topic = unique_name("spark")
    create_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, [0] * 50, [b"x"] * 50)
    raw = options(broker.bootstrap, topic, startingOffsets="earliest")

    def reader(**extra: str) -> ReplogStreamReader:
        return ReplogStreamReader(parse_source_options({**raw, **extra}, streaming=True))

    first = reader()
    try:
        start = first.initialOffset()
        end = first.latestOffset(start, first.getDefaultReadLimit())
        assert end == {topic: {"0": 50}}
    finally:
        first.stop()
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.delete_topic(topic)
        wait_until(lambda: topic not in admin.list_topics(), message="the topic is gone")
    create_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, [0] * 10, [b"y"] * 10)
    # The query restarts from its checkpoint (end of batch 0: offset 50).
    for strict in (True, False):
        again = reader(failOnDataLoss=str(strict).lower())
        try:
            latest = again.latestOffset(end, again.getDefaultReadLimit())
            assert latest == {topic: {"0": 10}}
            if strict:
                with pytest.raises(DataLossError, match="went back from 50 to 10"):
                    again.partitions(end, latest)
            else:
                with caplog.at_level(logging.WARNING, logger="datasource.planner"):
                    assert again.partitions(end, latest) == []
                assert "went back from 50 to 10" in caplog.text
        finally:
            again.stop()


@pytest.mark.spark
@pytest.mark.cluster
def test_commit_offsets_to_group_shows_the_querys_progress_to_lag_tools(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    topic, group = unique_name("spark"), unique_name("spark-group")
    create_topic(broker.bootstrap, topic, 2)
    produce(broker.bootstrap, topic, [i % 2 for i in range(3000)], [b"x"] * 3000)
    opts = options(
        broker.bootstrap,
        topic,
        startingOffsets="earliest",
        maxOffsetsPerTrigger="1000",
        commitOffsetsToGroup=group,
    )
    query = (
        stream_df(spark, opts)
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    raw = data_batches(query)[-1]["sources"][0]["endOffset"]
    end = json.loads(raw) if isinstance(raw, str) else raw
    expected = {TopicPartition(topic, int(p)): o for p, o in end[topic].items()}
    assert expected == {TopicPartition(topic, 0): 1500, TopicPartition(topic, 1): 1500}
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        # Spark commits a batch's offsets after the batch: wait for the last one
        wait_until(lambda: admin.list_consumer_group_offsets(group) == expected, timeout=60)
    # a batch read has no progress to commit
    with pytest.raises(Exception, match="commitOffsetsToGroup"):
        batch_df(spark, {**opts, "maxOffsetsPerTrigger": "1000"}).count()
