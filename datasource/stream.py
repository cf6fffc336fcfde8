"""Streaming reads: offsets, admission control and micro-batch planning on the driver.

Spark keeps one :class:`ReplogStreamReader` in a long-lived Python worker on the driver for
initialOffset / latestOffset / partitions / commit, and pickles another copy (made when the
query was planned) to executors for read(). So read() uses nothing but its input partition, and
the clients the driver side opens are dropped from pickles.

Admission control, as Spark's Kafka source:

- ``maxOffsetsPerTrigger``: :class:`ReadMaxRows`, split across partitions by backlog
  (:func:`~datasource.offsets.rate_limit`).
- ``minOffsetsPerTrigger``: :class:`ReadMinRows`; a micro-batch waits until that many records
  are there or ``maxTriggerDelay`` has passed since the last one (the clock starts with the
  first latestOffset call). ``maxOffsetsPerTrigger`` still caps the batch.
- ``ReadAllAvailable`` (Trigger.Once) reads everything, whatever the options say.
- ``Trigger.AvailableNow``: the latest offsets when the query starts bound every batch, and
  maxOffsetsPerTrigger still splits them; minOffsetsPerTrigger is ignored (it would wait for
  records that the trigger promises not to read).

latestOffset never passes the high watermark (the LSO with read_committed). New partitions and,
with subscribePattern, new topics join at the next micro-batch, from their earliest offset.

Lag: Spark's Kafka source reports minOffsetsBehindLatest, maxOffsetsBehindLatest and
avgOffsetsBehindLatest in its progress's ``metrics``. Spark asks a source for those through the
JVM interface ReportsSourceMetrics, which Spark's Python stream readers
(PythonMicroBatchStream, pyspark 4.2) do not implement and for which the Python API has no
hook, so a Python source's ``metrics`` stay empty. reportLatestOffset does reach the progress
(``latestOffset`` beside ``endOffset``), and :func:`offsets_behind_latest` computes Kafka's three
numbers from them.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from datasource.offsets import SourceOffset, rate_limit
from datasource.options import SourceOptions
from datasource.partitions import OffsetRangePartition
from datasource.planner import Planner
from datasource.reader import read_partition
from replication.client import TopicPartition
from replication.errors import ReplogError

__all__ = ["ReplogStreamReader", "offsets_behind_latest"]

log = logging.getLogger(__name__)

Offsets = dict[TopicPartition, int]


class ReplogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming reader of ``spark.readStream.format("replog")``.

    Examples
    --------
    >>> df = (spark.readStream.format("replog")  # doctest: +SKIP
    ...       .option("bootstrap.servers", "127.0.0.1:9092")
    ...       .option("subscribe", "events")
    ...       .option("maxOffsetsPerTrigger", 100000)
    ...       .load())
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._planner: Planner | None = None
        self._initial: dict[str, Any] | None = None
        #: Trigger.AvailableNow: the latest offsets when the query started
        self._available_now: Offsets | None = None
        #: the latest offsets seen by the last latestOffset (for the query's progress)
        self._latest: Offsets | None = None
        self._last_trigger: float | None = None
        #: the offsets last committed to commitOffsetsToGroup
        self._group_committed: Offsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the options only: no clients, no driver-side state.
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    @property
    def planner(self) -> Planner:
        if self._planner is None:
            self._planner = Planner(self.options)
        return self._planner

    # --- offsets ------------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        # Spark may ask twice; "latest" must not move between the two answers.
        if self._initial is None:
            planner = self.planner
            tps = planner.view.topic_partitions()
            starting = planner.resolve(self.options.starting, tps, option="startingOffsets")
            self._initial = SourceOffset(starting).to_json()
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        view = self.planner.view
        self._available_now = view.latest(view.topic_partitions())
        log.info("Trigger.AvailableNow reads up to %s", SourceOffset(self._available_now).to_json())

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None if self._latest is None else SourceOffset(self._latest).to_json()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = SourceOffset.from_json(start).offsets
        # Spark plans the next batch once the one ending at ``start`` completed (and asks
        # once more after the last batch of Trigger.AvailableNow): ``start`` is done.
        self._commit_to_group(begin)
        view = self.planner.view
        if self._available_now is not None:
            latest = dict(self._available_now)
        else:
            latest = view.latest(view.topic_partitions())
            self._hold_back_lagging_leaders(begin, latest)
        self._latest = latest
        # New partitions start from their earliest offset (and count in the limits from there).
        new = [tp for tp in latest if tp not in begin]
        base = {**view.earliest(new), **begin}
        if isinstance(limit, ReadMinRows):
            # Under AvailableNow the minimum might never be met: only the maximum applies.
            if self._available_now is None and self._delay(limit.min_rows, base, latest):
                return start
            maximum = self.options.max_offsets_per_trigger
            limit = ReadAllAvailable() if maximum is None else ReadMaxRows(maximum)
        if isinstance(limit, ReadMaxRows):
            return SourceOffset(rate_limit(base, latest, limit.max_rows)).to_json()
        return SourceOffset(latest).to_json()

    def _hold_back_lagging_leaders(
        self, begin: Mapping[TopicPartition, int], latest: Offsets
    ) -> None:
        """A leader elected moments ago may report a high watermark below the one its
        predecessor had (followers learn the HW a fetch later). If its log still reaches the
        start, that is no data loss: wait for the HW instead of going backwards."""
        behind = [tp for tp, end in latest.items() if tp in begin and end < begin[tp]]
        if not behind:
            return
        logs = self.planner.view.replica_logs(behind)
        for tp in behind:
            leader_end = max(
                (r.log_end_offset for r in logs.get(tp, []) if r.is_leader), default=-1
            )
            if leader_end >= begin[tp]:
                log.info(
                    "%s: the high watermark (%d) is behind the last batch's end (%d) after a "
                    "leader change; waiting for it",
                    tp,
                    latest[tp],
                    begin[tp],
                )
                latest[tp] = begin[tp]

    def _delay(self, min_rows: int, base: Offsets, latest: Offsets) -> bool:
        """Kafka's delayBatch: hold the batch back while fewer than ``min_rows`` records are
        there and maxTriggerDelay has not passed since the last batch."""
        now = time.monotonic()
        if self._last_trigger is None:
            self._last_trigger = now
        if (now - self._last_trigger) * 1000 >= self.options.max_trigger_delay_ms:
            self._last_trigger = now
            return False
        available = sum(max(end - base.get(tp, end), 0) for tp, end in latest.items())
        if available < min_rows:
            return True
        self._last_trigger = now
        return False

    # --- micro-batches --------------------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin = SourceOffset.from_json(start).offsets
        until = SourceOffset.from_json(end).offsets
        return list(self.planner.plan(begin, until))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRangePartition):
            return iter(())
        return read_partition(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark finished the micro-batch ending at ``end``. With ``commitOffsetsToGroup``,
        commit those offsets to that consumer group, so `replog consumer-groups describe` and
        lag tools see the query's progress (Spark's Kafka source cannot: SPARK-27549). The
        checkpoint stays the source of truth: a failed commit is logged, never fatal.

        Spark calls this for a batch only when it plans the next one, so the end of the last
        batch is committed by :meth:`latestOffset`, which Spark calls after every batch."""
        self._commit_to_group(SourceOffset.from_json(end).offsets)

    def _commit_to_group(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit the end of a completed micro-batch to ``commitOffsetsToGroup`` (once)."""
        group = self.options.commit_group
        if group is None or not offsets or offsets == self._group_committed:
            return
        try:
            self.planner.view.commit_group_offsets(group, offsets)
        except ReplogError as err:
            log.warning("committing offsets to group %r failed (the query goes on): %s", group, err)
            return
        self._group_committed = dict(offsets)

    def stop(self) -> None:
        planner, self._planner = self._planner, None
        if planner is not None:
            planner.close()


def offsets_behind_latest(source: Any) -> dict[str, str]:
    """Kafka's lag metrics of one micro-batch, from the query progress's source entry.

    ``source`` is ``query.lastProgress["sources"][i]`` (or the progress event's source, in a
    StreamingQueryListener); the answer is what Spark's Kafka source puts in its ``metrics``::

        {"minOffsetsBehindLatest": "0", "maxOffsetsBehindLatest": "120",
         "avgOffsetsBehindLatest": "40.0"}

    per partition, the latest offset the source saw minus the batch's end offset (a partition
    the batch did not reach counts from 0, as in Kafka). Empty when the progress has no latest
    offset (a batch planned before the source first saw the topic).

    Examples
    --------
    >>> lag = offsets_behind_latest(query.lastProgress["sources"][0])  # doctest: +SKIP
    """

    def offsets(name: str) -> dict[TopicPartition, int]:
        value = source[name]
        if value is None:
            return {}
        return dict(
            SourceOffset.from_json(json.loads(value) if isinstance(value, str) else value).offsets
        )

    latest, end = offsets("latestOffset"), offsets("endOffset")
    behind = [offset - end.get(tp, 0) for tp, offset in latest.items()]
    if not behind:
        return {}
    return {
        "minOffsetsBehindLatest": str(min(behind)),
        "maxOffsetsBehindLatest": str(max(behind)),
        "avgOffsetsBehindLatest": str(sum(behind) / len(behind)),
    }
