"""The source's schema (Spark's Kafka source's) and the Arrow batches that carry it to Spark.

==============  ===============================  ==============================================
column          Spark type                       from
==============  ===============================  ==============================================
key             binary                           the record's key (null if none)
value           binary                           the record's value (null for a tombstone)
topic           string                           the topic read
partition       int                              the partition read
offset          bigint                           the record's offset
timestamp       timestamp                        the record's timestamp (LogAppendTime: the
                                                 batch's)
timestampType   int                              0 CreateTime, 1 LogAppendTime
headers         array<struct<key: string,        only with includeHeaders=true; null when the
                value: binary>>                  record has none
==============  ===============================  ==============================================

read() yields pyarrow record batches; Spark requires their schema to equal the declared one
exactly (field names, types and nullability), which :func:`arrow_schema` is.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

__all__ = ["arrow_schema", "spark_schema", "to_spark_batch"]

_HEADER_STRUCT: Final = StructType(
    [StructField("key", StringType()), StructField("value", BinaryType())]
)

_COLUMNS: Final = (
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
)

#: Spark's Arrow form of TimestampType (microseconds, UTC) and of the headers array.
_TIMESTAMP: Final = pa.timestamp("us", tz="UTC")
_HEADERS: Final = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)
_ARROW_FIELDS: Final = (
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", _TIMESTAMP),
    pa.field("timestampType", pa.int32()),
)
_ARROW: Final = {
    False: pa.schema(list(_ARROW_FIELDS)),
    True: pa.schema([*_ARROW_FIELDS, pa.field("headers", _HEADERS)]),
}


#: Columns of one repeated value, by value: every batch of a partition takes a slice (no copy).
_CONSTANTS: dict[pa.Scalar, pa.Array] = {}


def _constant(value: pa.Scalar, rows: int) -> pa.Array:
    column = _CONSTANTS.get(value)
    if column is None or len(column) < rows:
        if len(_CONSTANTS) > 1024:
            _CONSTANTS.clear()  # an executor that read many partitions: start over
        column = pa.repeat(value, max(rows, 1 << 16))
        _CONSTANTS[value] = column
    return column.slice(0, rows)


def spark_schema(include_headers: bool) -> StructType:
    """The DataFrame schema of a read."""
    fields = list(_COLUMNS)
    if include_headers:
        fields.append(StructField("headers", ArrayType(_HEADER_STRUCT)))
    return StructType(fields)


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema Spark expects from read() for :func:`spark_schema`."""
    return _ARROW[include_headers]


def to_spark_batch(
    records: pa.RecordBatch, topic: str, partition: int, include_headers: bool
) -> pa.RecordBatch:
    """Records of one partition as a batch of :func:`arrow_schema`.

    ``records`` has the columns of :data:`logstore.reader.READ_SCHEMA` (which is also the
    client's ``FETCH_SCHEMA``): offset, key, value, timestamp (ms), timestamp_type, headers.
    No per-record Python: key and value pass through, constants are repeated, the headers
    array is re-typed without a copy.
    """
    rows = records.num_rows
    columns = [
        records.column(1),
        records.column(2),
        _constant(pa.scalar(topic, pa.string()), rows),
        _constant(pa.scalar(partition, pa.int32()), rows),
        records.column(0),
        pc.multiply(records.column(3), 1000).cast(_TIMESTAMP),
        records.column(4),
    ]
    if include_headers:
        columns.append(records.column(5).view(_HEADERS))
    return pa.RecordBatch.from_arrays(columns, schema=_ARROW[include_headers])
