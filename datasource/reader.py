"""Reading one input partition on an executor: segment objects directly, or through the brokers.

:func:`read_partition` is all an executor runs. It has nothing but the
:class:`~datasource.partitions.OffsetRangePartition` and yields pyarrow record batches of the
declared schema.

Which way it reads (``read.mode``):

- ``direct``: from the objects on the storage of a replica that holds the range (the
  planner lists the replicas leader first, with the extents the first one's broker described:
  segment objects and byte ranges of write-ahead-log chunks). Every batch is CRC-checked;
  read_committed drops the records of the aborted transactions the planner put in the
  partition, and markers. An extent whose object is gone meanwhile (compacted, then deleted
  after ``file.delete.delay.ms``) is asked of the replica's broker again (DescribeLogObjects,
  once per place), and the read goes on from there; another replica's extents are asked of
  its broker the same way (its segment objects are listed if it does not know the API).
- ``broker``: through the brokers, with replog's :class:`~replication.client.Consumer`.
- ``auto`` (default): direct; if no replica's storage can be read from here (unreachable,
  no credentials, objects missing), through the brokers. A direct read that fails after
  yielding records resumes through the brokers where it stopped, so nothing is read twice.

Data loss (offsets removed by retention while the query ran): with failOnDataLoss the task
fails with :class:`~datasource.errors.DataLossError`; without, it logs the skipped offsets and
goes on from the first offset still there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from datasource.errors import DataLossError, ReadTimeoutError
from datasource.options import CLIENT_SETTINGS
from datasource.partitions import OffsetRangePartition, ReplicaLocation, extents_problem
from datasource.schema import to_spark_batch
from logstore.errors import OffsetOutOfRangeError
from logstore.reader import Located, ObjectExtent, RangeRetainedError, SegmentReader
from replication.client import Admin, Consumer, TopicPartition
from replication.client.admin import LogObjects
from replication.errors import ReplogError, UnsupportedVersionError

__all__ = ["read_partition"]

log = logging.getLogger(__name__)

#: Fewer rows than this per Arrow batch and Spark's per-batch costs dominate: small log
#: batches are concatenated up to it before they are handed over.
COALESCE_ROWS: Final = 8192

# The consumer settings of broker reads: large fetches, no offset reset (a missing offset is
# data loss, decided here).
_CONSUMER: Final = {
    "client.id": "replog-spark-reader",
    "auto.offset.reset": "none",
    "fetch.max.bytes": 64 * 1024 * 1024,
    "max.partition.fetch.bytes": 16 * 1024 * 1024,
    "fetch.max.wait.ms": 500,
}
_POLL_MS: Final = 500

#: (records or None, the offset the read has reached)
Chunk = tuple[pa.RecordBatch | None, int]


def read_partition(partition: OffsetRangePartition) -> Iterator[pa.RecordBatch]:
    """The records of ``partition`` as Arrow batches of the source's schema."""
    return _RangeRead(partition).batches()


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith(("file://", "local://"))


class _RangeRead:
    def __init__(self, partition: OffsetRangePartition) -> None:
        self.p = partition
        self.tp = TopicPartition(partition.topic, partition.partition)
        #: everything below this offset has been handed to Spark
        self.position = partition.start
        #: asks brokers where their replicas hold the range, opened on first need
        self._admin: Admin | None = None

    def __repr__(self) -> str:
        return f"{self.tp} [{self.p.start}, {self.p.end})"

    def batches(self) -> Iterator[pa.RecordBatch]:
        try:
            yield from self._batches()
        finally:
            admin, self._admin = self._admin, None
            if admin is not None:
                admin.close()

    def _batches(self) -> Iterator[pa.RecordBatch]:
        settings = self.p.settings
        if settings.mode != "broker":
            failure: ReplogError | None = None
            for replica in self.p.replicas:
                failure = None
                while failure is None:
                    try:
                        yield from self._coalesced(self._direct(replica))
                        return
                    except RangeRetainedError as err:
                        if settings.mode != "direct":
                            failure = err  # the brokers know best whether this is data loss
                        else:
                            self._lost(self.position, err.first_available, str(err))
                            if self.position >= self.p.end:
                                return
                    except ReplogError as err:
                        failure = err
                if self.position > self.p.start:
                    break  # resume through the brokers: they know where the read stopped
            if settings.mode == "direct":
                if failure is not None:
                    raise failure
                raise ReplogError(
                    f"read.mode=direct, but no in-sync replica's storage holds offsets "
                    f"[{self.p.start}, {self.p.end}) of {self.tp}; use read.mode=auto to read "
                    "through the brokers"
                )
            if failure is not None:
                log.warning(
                    "reading %r from storage failed (%s); reading offsets from %d through the "
                    "brokers",
                    self,
                    failure,
                    self.position,
                )
        yield from self._coalesced(self._through_brokers())

    # --- handing batches to Spark -----------------------------------------------------------

    def _coalesced(self, chunks: Iterator[Chunk]) -> Iterator[pa.RecordBatch]:
        """Spark batches of at least COALESCE_ROWS rows (but the last). ``position`` follows
        what was handed over; if ``chunks`` fails, what it gave is handed over first, so the
        caller resumes exactly where it stopped."""
        pending: list[pa.RecordBatch] = []
        rows = 0
        reached = self.position
        try:
            for records, next_offset in chunks:
                reached = next_offset
                if records is not None and records.num_rows:
                    pending.append(records)
                    rows += records.num_rows
                if rows >= COALESCE_ROWS:
                    yield self._to_spark(pending)
                    pending, rows = [], 0
                if not pending:
                    self.position = reached
        except ReplogError:
            if pending:
                yield self._to_spark(pending)
            self.position = reached
            raise
        if pending:
            yield self._to_spark(pending)
        self.position = reached

    def _to_spark(self, records: list[pa.RecordBatch]) -> pa.RecordBatch:
        data = records[0] if len(records) == 1 else pa.concat_batches(records)
        return to_spark_batch(data, self.p.topic, self.p.partition, self.p.settings.include_headers)

    # --- direct -------------------------------------------------------------------------------

    def _direct(self, replica: ReplicaLocation) -> Iterator[Chunk]:
        settings = self.p.settings
        options = {} if _is_local(replica.log_dir) else dict(settings.storage_options)
        hint = self.p.objects
        described = bool(hint) and isinstance(hint[0], ObjectExtent)
        objects: Sequence[Located] | None = None
        if replica == self.p.replicas[0] and hint:
            objects = hint  # where the planner learned the first replica holds the range
        elif described:
            # The cluster describes log objects: ask this replica's broker for its own (its
            # chunks are in WAL objects no listing of the partition finds).
            objects = self._describe(replica, self.position)

        def rediscover(at: int) -> tuple[ObjectExtent, ...] | None:
            return self._describe(replica, at) if described else None

        with SegmentReader.open(replica.log_dir, self.p.topic, self.p.partition, **options) as r:
            for chunk in r.read(
                self.position,
                self.p.end,
                objects=objects,
                read_committed=settings.read_committed,
                aborted_transactions=self.p.aborted,
                rediscover=rediscover,
            ):
                yield chunk.records, chunk.next_offset

    def _describe(self, replica: ReplicaLocation, start: int) -> tuple[ObjectExtent, ...] | None:
        """Where ``replica`` holds ``[start, end)`` now, asked of its broker (DescribeLogObjects:
        no storage request); None if it cannot say (an older broker, an error, or extents
        that do not cover the range: the caller lists, or fails over). RangeRetainedError if
        the log starts after ``start`` now."""
        try:
            if self._admin is None:
                settings = self.p.settings
                self._admin = Admin(
                    {
                        "client.id": _CONSUMER["client.id"],
                        **{k: v for k, v in settings.consumer_settings if k in CLIENT_SETTINGS},
                        **dict(settings.client_security),
                        "bootstrap.servers": settings.bootstrap_servers,
                    }
                )
            found = self._admin.describe_log_objects(
                replica.broker_id, {self.tp: (start, self.p.end)}
            ).get(self.tp)
        except UnsupportedVersionError:
            return None
        except ReplogError as err:
            log.info("asking broker %d where %r is failed: %s", replica.broker_id, self, err)
            return None
        if not isinstance(found, LogObjects):
            log.info("broker %d did not describe %r: %s", replica.broker_id, self, found)
            return None
        if found.log_start_offset > start:
            # Removed by retention since planning: data loss, decided by the caller, as when
            # a listing starts past the offset.
            raise RangeRetainedError(
                f"{replica.log_dir}: offsets [{start}, {min(found.log_start_offset, self.p.end)})"
                f" of {self.tp} are gone: broker {replica.broker_id}'s log now starts at "
                f"{found.log_start_offset} (removed by retention)",
                first_available=found.log_start_offset,
            )
        problem = (
            f"are on {found.log_dir}, not {replica.log_dir}"
            if found.log_dir != replica.log_dir
            else extents_problem(found.extents, start, self.p.end)
        )
        if problem is not None:
            log.info("broker %d's extents of %r %s", replica.broker_id, self, problem)
            return None
        return found.extents

    # --- through the brokers ------------------------------------------------------------------

    def _through_brokers(self) -> Iterator[Chunk]:
        settings = self.p.settings
        end = self.p.end
        consumer = Consumer(
            {
                **_CONSUMER,
                **dict(settings.consumer_settings),
                **dict(settings.client_security),
                "bootstrap.servers": settings.bootstrap_servers,
                "isolation.level": "read_committed"
                if settings.read_committed
                else "read_uncommitted",
            }
        )
        try:
            consumer.assign([self.tp])
            consumer.seek(self.tp, self.position)
            progress_at = time.monotonic()
            position = self.position
            while position < end:
                try:
                    fetched = consumer.poll_arrow(timeout_ms=_POLL_MS)
                except OffsetOutOfRangeError as err:
                    first = consumer.beginning_offsets([self.tp])[self.tp]
                    self._lost(position, first, str(err))
                    position = max(self.position, position)
                    if position >= end:
                        return
                    consumer.seek(self.tp, position)
                    continue
                for item in fetched:
                    records = item.batch
                    last = records.column(0)[-1].as_py()
                    if last >= end:
                        records = records.filter(pc.less(records.column(0), end))
                    yield records, min(last + 1, end)
                reached = consumer.position(self.tp)
                if reached > position:
                    position = reached
                    progress_at = time.monotonic()
                    yield None, min(position, end)
                elif time.monotonic() - progress_at > settings.poll_timeout_ms / 1000:
                    raise ReadTimeoutError(
                        f"reading {self} through the brokers made no progress at offset "
                        f"{position} for {settings.poll_timeout_ms} ms "
                        "(kafkaConsumer.pollTimeoutMs); is the partition's leader up?"
                    )
        finally:
            consumer.close()

    # --- data loss ----------------------------------------------------------------------------

    def _lost(self, at: int, first_available: int | None, why: str) -> None:
        """Offsets from ``at`` are gone: fail, or skip to ``first_available`` (``position``)."""
        resume = self.p.end if first_available is None else min(first_available, self.p.end)
        if resume <= at:
            # The log does not start after ``at``: it was recreated or truncated below it.
            resume = self.p.end
        what = f"offsets [{at}, {resume}) of {self.tp} are gone ({why})"
        if self.p.settings.fail_on_data_loss:
            raise DataLossError(what)
        log.warning("%s; skipping them (failOnDataLoss=false)", what)
        self.position = resume
