"""Makes ``format("replog")`` work with no ``spark.dataSource.register`` call: Spark imports
every top-level ``pyspark_*`` module it finds and registers its ``DefaultSource``."""

from datasource.source import ReplogDataSource

DefaultSource = ReplogDataSource
