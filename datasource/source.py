"""The Spark data source "replog": ``format("replog")`` for batch and streaming reads.

The reading side lives in :mod:`datasource.batch` and :mod:`datasource.stream`; a writer
(``writer()`` / ``streamWriter()``) joins them here.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from datasource.batch import ReplogBatchReader
from datasource.errors import InvalidOptionError
from datasource.options import parse_source_options
from datasource.schema import spark_schema
from datasource.stream import ReplogStreamReader

__all__ = ["ReplogDataSource"]


class ReplogDataSource(DataSource):
    """Spark's ``format("replog")``: read replog topics as Spark's Kafka source reads Kafka.

    Options are the Kafka source's without the ``kafka.`` prefix (see
    :mod:`datasource.options`); the schema is the Kafka source's (see :mod:`datasource.schema`).
    Executors read segment objects straight from the replicas' storage, or through the
    brokers when they cannot reach it (``read.mode``).

    Examples
    --------
    >>> events = (spark.read.format("replog")  # doctest: +SKIP
    ...           .option("bootstrap.servers", "127.0.0.1:9092")
    ...           .option("subscribe", "events")
    ...           .load())
    >>> query = (spark.readStream.format("replog")  # doctest: +SKIP
    ...          .option("bootstrap.servers", "127.0.0.1:9092")
    ...          .option("subscribe", "events")
    ...          .option("startingOffsets", "earliest")
    ...          .load()
    ...          .writeStream.format("parquet")
    ...          .option("path", "/data/events")
    ...          .option("checkpointLocation", "/data/events-checkpoint")
    ...          .start())
    """

    @classmethod
    def name(cls) -> str:
        return "replog"

    def schema(self) -> StructType:
        value = self.options.get("includeheaders", "false")
        if str(value).strip().lower() not in ("true", "false"):
            raise InvalidOptionError("includeHeaders", str(value), "true or false")
        return spark_schema(str(value).strip().lower() == "true")

    def reader(self, schema: StructType) -> DataSourceReader:
        return ReplogBatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return ReplogStreamReader(parse_source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """``df.write.format("replog")``: all rows visible at once, or none."""
        from datasource.sink import ReplogBatchWriter

        return ReplogBatchWriter(schema, self.options, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """``df.writeStream.format("replog")``: every micro-batch exactly once."""
        from datasource.sink import ReplogStreamWriter

        return ReplogStreamWriter(schema, self.options, overwrite)
