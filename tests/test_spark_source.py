"""The Spark source "replog": options, offsets, planning, and batch reads with a real Spark.

Unit tests cover option parsing (every bad option names itself), offsets JSON, admission
arithmetic, range cutting and pickling. The rest runs real broker processes and the run's one
local SparkSession (``spark`` fixture): a 1,000,000-row batch read, and direct reads from local
files and from S3 over HTTP against the broker fallback. Streaming:
tests/test_spark_streaming_source.py.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

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
from datasource.schema import arrow_schema, spark_schema
from datasource.source import ReplogDataSource
from datasource.stream import ReplogStreamReader
from logstore.reader import AbortedTxnRange, ObjectExtent, SegmentObject
from replication.client import Producer, TopicPartition
from tests.cluster import BrokerProcess
from tests.conftest import S3Location
from tests.helpers import unique_name, wait_until
from tests.spark_source_helpers import (
    T0,
    assert_contiguous,
    batch_df,
    create_topic,
    options,
    produce,
    stream_df,
)

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
