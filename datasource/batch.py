"""Batch reads (``spark.read.format("replog")``): one planned offset range, read once."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from datasource.errors import InvalidOptionError
from datasource.offsets import SourceOffset
from datasource.options import SourceOptions
from datasource.partitions import OffsetRangePartition
from datasource.planner import Planner
from datasource.reader import read_partition

__all__ = ["ReplogBatchReader"]


class ReplogBatchReader(DataSourceReader):
    """The batch reader: ``[startingOffsets, endingOffsets)`` of every partition read.

    Examples
    --------
    >>> df = (spark.read.format("replog")  # doctest: +SKIP
    ...       .option("bootstrap.servers", "127.0.0.1:9092")
    ...       .option("subscribe", "events")
    ...       .option("startingOffsets", '{"events": {"0": 100, "1": -2}}')
    ...       .load())
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        # Runs once, in Spark's planning worker: offsets are fixed here for the whole read.
        planner = Planner(self.options)
        try:
            tps = planner.view.topic_partitions()
            start = planner.resolve(self.options.starting, tps, option="startingOffsets")
            assert self.options.ending is not None
            end = planner.resolve(self.options.ending, tps, option="endingOffsets")
            latest = planner.view.latest(end)
            for tp in sorted(end):
                if end[tp] < start.get(tp, end[tp]):
                    raise InvalidOptionError(
                        "endingOffsets",
                        json.dumps(SourceOffset(end).to_json()),
                        "offsets at or after the starting ones",
                        f"{tp} would end at {end[tp]}, before it starts at {start[tp]}",
                    )
                if end[tp] > latest[tp]:
                    raise InvalidOptionError(
                        "endingOffsets",
                        json.dumps(SourceOffset(end).to_json()),
                        "offsets at most the latest ones (-1 for latest)",
                        f"{tp} ends at {latest[tp]}, not {end[tp]}",
                    )
            return list(planner.plan(start, end))
        finally:
            planner.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRangePartition):
            return iter(())  # Spark plans one empty partition when there is nothing to read
        return read_partition(partition)
