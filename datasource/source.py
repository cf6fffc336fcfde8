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
from datasource.options import check_source_options, parse_source_options
from datasource.schema import spark_schema
from datasource.stream import ReplogStreamReader

__all__ = ["ReplogDataSource"]


class ReplogDataSource(DataSource):
    """Spark's ``format("replog")``: read replog topics as Spark's Kafka source reads Kafka.

    Options are the Kafka source's (``bootstrap.servers`` and ``isolation.level`` with or
    without Kafka's ``kafka.`` prefix; see :mod:`datasource.options`); the schema is the Kafka
    source's (see :mod:`datasource.schema`).
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
        # Spark calls this on the driver at load(), for reads only: every option is checked
        # here, so a bad one fails load() as with Spark's Kafka source (those only a batch or
        # only a stream refuses fail when the reader is made: see check_source_options)
        check_source_options(self.options)
        value = self.options.get("includeheaders", "false")
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
