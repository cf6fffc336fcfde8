"""Spark: the "replog" Python data source (reader and exactly-once writer).

``format("replog")`` finds :class:`~datasource.source.ReplogDataSource` through the top-level
``pyspark_replog`` module; ``spark.dataSource.register(ReplogDataSource)`` works too.
"""

from logstore._distribution import check_installation

check_installation()
