"""The replog sink: exactly-once streaming writes and atomic batch writes.

Spark's Kafka sink is at-least-once: a replayed micro-batch writes its rows again. Here every
task writes its rows inside its own transaction and hands the transaction to the driver in its
commit message instead of committing it. The driver's ``commit(messages, batchId)`` asks the
transaction coordinator, in ONE atomic step, to commit all of them as batch ``batchId`` of this
sink — or, if that batch of this sink is already committed (Spark is replaying it after a
failure between our commit and its own), to abort them. ``abort()`` aborts them. Nothing of an
uncommitted batch is ever visible to read_committed readers.

* A task's transactional id is ``replog-sink/<sink>/<task partition>``: a retried or
  speculative attempt of the same task initialises the same id, which bumps the producer
  epoch and fences (and aborts) the earlier attempt; so does the task of a replayed batch,
  aborting what a crashed run left open. The id leaves out the batch on purpose: micro-batches
  run one after another and the driver commits batch N before batch N+1 starts, so reusing
  the id is safe, and the coordinator keeps one id per task of a sink instead of one per task
  of every batch ever written (it does not expire idle ids yet).
* The sink's identity is option ``sink.id`` or the streaming query's id (stable across restarts
  from the same checkpoint; tasks read it from the ``sql.streaming.queryId`` local property).
* ``commit()`` runs in a fresh Python worker with a re-created writer: it relies only on the
  commit messages (which carry the sink id and the transactions) and the options.
* Batch writes (``df.write``) are one "batch 0" of a sink id made for that write: all rows or
  none. ``mode("overwrite")`` is refused: a log is append-only. Spark itself refuses the
  default save mode (ErrorIfExists) for every Python data source, so ``.mode("append")`` is
  needed (Spark's Kafka sink takes the default too).
* Output modes, as Spark's Kafka sink: append, and complete (every micro-batch writes its whole
  result table, once, in that batch's transactions). Spark refuses update for Python data
  sources ("does not support Update mode"): it has no hook for a Python writer to take it.
* Columns (:func:`check_schema`): as Spark's Kafka sink, plus ``timestamp`` (the record's
  timestamp; null or absent: the time of the write). Option ``topic`` overrides a ``topic``
  column, as in Kafka's sink.
* A topic that does not exist fails the write in seconds, naming it (Kafka's producer would
  wait max.block.ms, a minute, per task attempt): option ``topic`` is checked when the writer
  is made on the driver, a ``topic`` column's topics when a task first meets them.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from datasource.options import SinkOptions, parse_sink_options
from logstore.errors import ConfigError, ReplogError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

try:
    from pyspark.sql.datasource import (
        DataSourceArrowWriter,
        DataSourceStreamArrowWriter,
        WriterCommitMessage,
    )
except ImportError as err:  # pragma: no cover - pyspark is a dependency of this module
    raise ImportError(
        "datasource.sink needs pyspark >= 4.2 (Arrow writers): pip install 'replog[spark]'"
    ) from err


class SinkError(ReplogError, ValueError):
    """A write to replog cannot be done as asked (bad columns or save mode; a bad option is an
    :class:`~datasource.errors.InvalidOptionError`)."""


#: A task hands the producer its whole partition at once, so bigger batches than the client's
#: defaults (1 MiB, 5 ms): at most one batch per partition is in flight and acks=all waits for
#: the followers, so each round trip should carry more; the brokers also spend less per row on
#: fewer, larger batches (measured: 2 tasks x 500k rows, RF=3, ~430k -> ~600k rows/s).
BULK_PRODUCER_DEFAULTS = {"batch.size": str(4 * 1024 * 1024), "linger.ms": "20"}

#: How long a write waits for a topic it does not find to appear (a topic created a moment
#: ago reaches every broker's metadata well within it) before it fails naming the topic;
#: option max.block.ms, if given, instead.
TOPIC_WAIT_MS = 10_000


@dataclass(frozen=True)
class ReplogCommitMessage(WriterCommitMessage):
    """What a task tells the driver: the transaction holding its rows (None if it wrote none)."""

    sink_id: str
    batch_id: int
    transaction: Any  # replication.client TransactionHandle, or None
    rows: int = 0


# --- columns ------------------------------------------------------------------------------------


def check_schema(schema: StructType, options: SinkOptions) -> None:
    """Columns as Spark's Kafka sink: value (required), key, topic, partition, headers; and
    timestamp (the record's timestamp)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        StringType,
        StructType,
        TimestampType,
    )

    fields = {f.name.lower(): f.dataType for f in schema.fields}
    if "value" not in fields:
        raise SinkError(
            f"the DataFrame has no 'value' column (columns: {', '.join(schema.fieldNames())}); "
            "select one, e.g. df.selectExpr('CAST(x AS STRING) AS value')"
        )
    text = (BinaryType, StringType)
    for name in ("value", "key"):
        if name in fields and not isinstance(fields[name], text):
            raise SinkError(
                f"column '{name}' has type {fields[name].simpleString()}; it must be binary or "
                "string"
            )
    if "topic" in fields and not isinstance(fields["topic"], StringType):
        raise SinkError(
            f"column 'topic' has type {fields['topic'].simpleString()}; it must be string"
        )
    if "partition" in fields and not isinstance(fields["partition"], IntegerType):
        raise SinkError(
            f"column 'partition' has type {fields['partition'].simpleString()}; it must be int"
        )
    if "timestamp" in fields and not isinstance(fields["timestamp"], TimestampType):
        raise SinkError(
            f"column 'timestamp' has type {fields['timestamp'].simpleString()}; it must be "
            "timestamp, e.g. CAST(x AS TIMESTAMP) or timestamp_millis(ms)"
        )
    if "headers" in fields:
        headers = fields["headers"]
        ok = (
            isinstance(headers, ArrayType)
            and isinstance(headers.elementType, StructType)
            and [f.name for f in headers.elementType.fields] == ["key", "value"]
        )
        if not ok:
            raise SinkError(
                f"column 'headers' has type {headers.simpleString()}; it must be "
                "array<struct<key:string,value:binary>>"
            )
    if "topic" not in fields and options.topic is None:
        raise SinkError(
            "no topic: set option topic (.option('topic', 'name')) or add a 'topic' column"
        )


def _tables_by_topic(
    batch: pa.RecordBatch, default_topic: str | None
) -> Iterator[tuple[str, pa.Table]]:
    """The batch's rows by topic: all to option ``topic`` if it is set (it overrides a
    ``topic`` column, as in Kafka's sink), else by the ``topic`` column."""
    table = pa.Table.from_batches([batch])
    names = {n.lower(): n for n in table.column_names}
    columns = {
        k: table.column(names[k])
        for k in ("value", "key", "timestamp", "partition", "headers")
        if k in names
    }
    data = pa.table(columns)
    if default_topic is not None:
        yield default_topic, data
        return
    topics = table.column(names["topic"])
    if topics.null_count:
        raise SinkError("a row has a null 'topic' and option topic is not set")
    for topic in pc.unique(topics).to_pylist():
        yield topic, data.filter(pc.equal(topics, topic))


class TopicCheck:
    """Fails in seconds, naming the topic, when a topic to write to does not exist.

    A producer told of an unknown topic waits max.block.ms (a minute) for it to appear, so a
    misspelt topic would fail each task attempt only after a minute. This asks with a producer
    of its own (so a broker with auto.create.topics.enable still creates the topic, as on a
    first produce) that waits :data:`TOPIC_WAIT_MS`.
    """

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.known: set[str] = set()
        self._producer: Any = None

    def check(self, topic: str) -> None:
        """Return once ``topic`` exists; UnknownTopicOrPartitionError naming it if it does not.

        Only a topic found missing, or one the principal may not see (an
        AuthorizationError: an ACL is missing, which no retry mends), fails: when the brokers
        cannot be asked right now (a failover), the check passes with a warning and the
        producer waits and retries as it always does, so the check fails nothing that worked
        without it.
        """
        from replication.errors import AuthorizationError, UnknownTopicOrPartitionError

        if topic in self.known:
            return
        try:
            self._check(topic)
        except (UnknownTopicOrPartitionError, AuthorizationError):
            raise
        except ReplogError as err:
            log.warning("could not check that topic %r exists: %s", topic, err)
        self.known.add(topic)

    def _check(self, topic: str) -> None:
        if self._producer is None:
            from replication.client import Producer

            wait = self.options.producer.get("max.block.ms", str(TOPIC_WAIT_MS))
            self._producer = Producer(
                {
                    **self.options.client_config(),
                    "max.block.ms": wait,
                    "enable.idempotence": "false",
                }
            )
        self._producer.partitions_for(topic)

    def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.close()

    def __enter__(self) -> TopicCheck:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_topic_option(options: SinkOptions) -> None:
    """On the driver, when the writer is made: option ``topic`` must exist.

    Spark makes the writer again for every micro-batch and for every commit (see
    :meth:`TopicCheck.check` for what fails it).
    """
    if options.topic is None:
        return
    with TopicCheck(options) as topics:
        topics.check(options.topic)


# --- the task side ---------------------------------------------------------------------------


def write_transaction(
    options: SinkOptions, sink_id: str, batch_id: int, task: int, batches: Iterator[pa.RecordBatch]
) -> ReplogCommitMessage:
    """Write one task's rows inside its own transaction; return it, uncommitted."""
    from replication.client import Admin, Producer

    transactional_id = f"replog-sink/{sink_id}/{task}"
    with Admin(options.client_config()) as admin:
        if admin.last_committed_batch(sink_id) >= batch_id:
            # Spark replays a batch this sink already committed: nothing to write again
            for _ in batches:
                pass
            return ReplogCommitMessage(sink_id, batch_id, None, 0)
    producer = Producer(
        {
            **BULK_PRODUCER_DEFAULTS,
            **options.producer,
            **options.client_config(),
            "transactional.id": transactional_id,
            "acks": "all",
        }
    )
    rows = 0
    # option topic was checked on the driver; a topic column's topics are checked here
    topics = TopicCheck(options)
    try:
        producer.init_transactions()  # fences an earlier attempt of this task
        producer.begin_transaction()
        for batch in batches:
            for topic, table in _tables_by_topic(batch, options.topic):
                if options.topic is None:
                    topics.check(topic)
                producer.send_arrow(topic, table)
                rows += table.num_rows
        producer.flush()
        handle = producer.transaction_handle()
    except BaseException:
        try:
            producer.abort_transaction()
        finally:
            producer.close()
            topics.close()
        raise
    producer.close()  # leaves the transaction open: the driver commits or aborts it
    topics.close()
    return ReplogCommitMessage(sink_id, batch_id, handle, rows)


def _task_context() -> Any:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise SinkError("the replog writer runs inside Spark tasks only")
    return context


def _handles(messages: list[Any]) -> list[Any]:
    return [m.transaction for m in messages if isinstance(m, ReplogCommitMessage) and m.transaction]


# --- streaming -----------------------------------------------------------------------------------


class ReplogStreamWriter(DataSourceStreamArrowWriter):
    """Exactly-once micro-batches (see the module docstring)."""

    def __init__(self, schema: StructType, options: Mapping[str, str], overwrite: bool) -> None:
        # overwrite is outputMode("complete"): as Kafka's sink, each micro-batch writes its
        # whole result table (exactly once, like any batch); a log cannot be truncated
        self.options = parse_sink_options(options)
        check_schema(schema, self.options)
        check_topic_option(self.options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ReplogCommitMessage:
        context = _task_context()
        batch = context.getLocalProperty("streaming.sql.batchId")
        if batch is None:
            # without it every task would look like a replay of a committed batch
            raise SinkError(
                "Spark did not tell this task its micro-batch (local property "
                "streaming.sql.batchId is missing); the exactly-once sink cannot write"
            )
        batch_id = int(batch)
        sink_id = self.options.sink_id or context.getLocalProperty("sql.streaming.queryId")
        if not sink_id:
            raise SinkError("cannot tell which streaming query writes: set option sink.id")
        return write_transaction(self.options, sink_id, batch_id, context.partitionId(), iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        from replication.client import Admin

        sinks = {m.sink_id for m in messages if isinstance(m, ReplogCommitMessage)}
        if not sinks:
            return  # no task ran (an empty micro-batch)
        if len(sinks) > 1:
            raise SinkError(f"one micro-batch was written under several sink ids: {sorted(sinks)}")
        sink_id, handles, started = sinks.pop(), _handles(messages), time.perf_counter()
        with Admin(self.options.client_config()) as admin:
            result = admin.commit_sink_batch(sink_id, batchId, handles)
        log.info(
            "%s batch %d of sink %s (%d transactions) in %.1f ms",
            "committed" if result.committed else "replayed, aborted",
            batchId,
            sink_id,
            len(handles),
            (time.perf_counter() - started) * 1000,
        )

    def abort(self, messages: list[Any], batchId: int) -> None:
        from replication.client import Admin

        handles = _handles(messages)
        sinks = {m.sink_id for m in messages if isinstance(m, ReplogCommitMessage)}
        if not handles or not sinks:
            return
        with Admin(self.options.client_config()) as admin:
            admin.abort_sink_batch(sinks.pop(), batchId, handles)


# --- batch writes ---------------------------------------------------------------------------------


class ReplogBatchWriter(DataSourceArrowWriter):
    """``df.write``: all rows become visible at once, or none."""

    def __init__(self, schema: StructType, options: Mapping[str, str], overwrite: bool) -> None:
        if overwrite:
            raise SinkError(
                "replog is append-only: mode('overwrite') cannot replace a log; use "
                "mode('append') (Spark refuses the default mode, errorifexists, for Python data "
                "sources)"
            )
        self.options = parse_sink_options(options)
        check_schema(schema, self.options)
        check_topic_option(self.options)
        # made on the driver and shipped to every task: one id for this whole write
        self.write_id = self.options.sink_id or f"write-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ReplogCommitMessage:
        context = _task_context()
        return write_transaction(self.options, self.write_id, 0, context.partitionId(), iterator)

    def commit(self, messages: list[Any]) -> None:
        from replication.client import Admin

        sinks = {m.sink_id for m in messages if isinstance(m, ReplogCommitMessage)}
        if not sinks:
            return
        with Admin(self.options.client_config()) as admin:
            result = admin.commit_sink_batch(sinks.pop(), 0, _handles(messages))
        if not result.committed:
            raise SinkError(
                f"this write's id was already committed (sink.id={self.options.sink_id!r}); "
                "nothing was written twice. Use a new sink.id for a new batch write"
            )

    def abort(self, messages: list[Any]) -> None:
        from replication.client import Admin

        handles = _handles(messages)
        sinks = {m.sink_id for m in messages if isinstance(m, ReplogCommitMessage)}
        if not handles or not sinks:
            return
        with Admin(self.options.client_config()) as admin:
            admin.abort_sink_batch(sinks.pop(), 0, handles)


__all__ = [
    "ConfigError",
    "ReplogBatchWriter",
    "ReplogCommitMessage",
    "ReplogStreamWriter",
    "SinkError",
    "SinkOptions",
    "TopicCheck",
    "check_schema",
]
