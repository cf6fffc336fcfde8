"""replog -> a Delta table, exactly once, through foreachBatch with txnAppId/txnVersion.

    python examples/delta_sink.py --topic quickstart --path /tmp/replog-delta [--available-now]
        [--packages io.delta:delta-spark_2.13:4.4.0 | --jars delta-spark_2.13.jar,...]

Delta's idempotent writes skip a (txnAppId, txnVersion) pair already committed to the table,
so a micro-batch Spark replays is written once. This needs delta-spark and Delta's JVM jars:
    pip install 'replog[delta]'     # delta-spark 4.4.0
and Delta's jars on Spark's classpath: --packages (Spark's resolver fetches them from Maven)
or --jars (local jars: delta-spark_2.13, delta-storage and their dependencies). When either is
missing the example says which and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from _spark import local_spark

MISSING = 2
DELTA_CONFIGS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def delta_available(spark: Any) -> str | None:
    """None if Delta can be used; otherwise what is missing and how to get it."""
    try:
        import delta  # noqa: F401
    except ImportError:
        return "the delta-spark Python package is not installed: pip install delta-spark"
    try:
        # spark.jars are on the driver thread's context class loader, not the system one
        jvm = spark._jvm
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName("io.delta.tables.DeltaTable", True, loader)
    except Exception:  # noqa: BLE001 - py4j raises its own error type for a missing class
        return (
            "Delta's JVM jars are not on Spark's classpath: pass --packages "
            "io.delta:delta-spark_2.13:4.4.0 (Spark fetches them from Maven) or --jars with "
            "the local delta-spark_2.13 and delta-storage jars and their dependencies"
        )
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092")
    parser.add_argument("--topic", default="quickstart")
    parser.add_argument("--path", default="/tmp/replog-delta")
    parser.add_argument("--available-now", action="store_true", help="process the backlog, stop")
    parser.add_argument("--jars", help="comma-separated local jars for spark.jars (Delta's)")
    parser.add_argument("--packages", help="Maven coordinates for spark.jars.packages")
    args = parser.parse_args()

    spark = local_spark("replog-delta-sink", args.jars, args.packages, DELTA_CONFIGS)
    missing = delta_available(spark)
    if missing:
        print(f"Delta is not available: {missing}", file=sys.stderr)
        spark.stop()
        return MISSING
    app_id = "replog-delta-example"

    def write_batch(batch: Any, batch_id: int) -> None:
        (
            batch.write.format("delta")
            .option("txnAppId", app_id)
            .option("txnVersion", batch_id)
            .mode("append")
            .save(args.path)
        )

    writer = (
        spark.readStream.format("replog")
        .option("bootstrap.servers", args.bootstrap_server)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("partition", "offset", "CAST(value AS STRING) AS value")
        .writeStream.foreachBatch(write_batch)
        .option("checkpointLocation", args.path + "-checkpoint")
    )
    query = (writer.trigger(availableNow=True) if args.available_now else writer).start()
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    table = spark.read.format("delta").load(args.path)
    distinct = table.select("partition", "offset").distinct().count()
    print(f"{table.count()} records in {args.path} ({distinct} distinct offsets)")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
