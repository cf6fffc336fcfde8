"""replog -> a Delta table, exactly once, through foreachBatch with txnAppId/txnVersion.

    python examples/delta_sink.py --topic quickstart --path /tmp/replog-delta [--available-now]

Delta's idempotent writes skip a (txnAppId, txnVersion) pair already committed to the table,
so a micro-batch Spark replays is written once. This needs delta-spark and Delta's JVM jars:
    pip install delta-spark
and start Spark with the jars on the classpath, e.g. (fetched from Maven)
spark.jars.packages=io.delta:delta-spark_2.13:<version>, or spark.jars=<local jars>.
When either is missing the example says which and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from _spark import local_spark

MISSING = 2


def delta_available(spark: Any) -> str | None:
    """None if Delta can be used; otherwise what is missing and how to get it."""
    try:
        import delta  # noqa: F401
    except ImportError:
        return "the delta-spark Python package is not installed: pip install delta-spark"
    try:
        spark._jvm.java.lang.Class.forName("io.delta.tables.DeltaTable")
    except Exception:  # noqa: BLE001 - py4j raises its own error type for a missing class
        return (
            "Delta's JVM jars are not on Spark's classpath: set spark.jars.packages="
            "io.delta:delta-spark_2.13:<version> (needs Maven access) or spark.jars to "
            "local delta-spark and delta-storage jars"
        )
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092")
    parser.add_argument("--topic", default="quickstart")
    parser.add_argument("--path", default="/tmp/replog-delta")
    parser.add_argument("--available-now", action="store_true", help="process the backlog, stop")
    args = parser.parse_args()

    spark = local_spark("replog-delta-sink")
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
    print(f"{spark.read.format('delta').load(args.path).count()} records in {args.path}")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
