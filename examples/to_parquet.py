"""replog -> Spark's Parquet file sink (a streaming query into a directory of Parquet files).

python examples/to_parquet.py --topic quickstart --path /tmp/replog-parquet [--available-now]
"""

from __future__ import annotations

import argparse

from _spark import local_spark


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092")
    parser.add_argument("--topic", default="quickstart")
    parser.add_argument("--path", default="/tmp/replog-parquet")
    parser.add_argument("--available-now", action="store_true", help="process the backlog, stop")
    args = parser.parse_args()

    spark = local_spark("replog-to-parquet")
    writer = (
        spark.readStream.format("replog")
        .option("bootstrap.servers", args.bootstrap_server)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("topic", "partition", "offset", "timestamp", "CAST(value AS STRING) AS value")
        .writeStream.format("parquet")
        .option("path", args.path)
        .option("checkpointLocation", args.path + "-checkpoint")
    )
    query = (writer.trigger(availableNow=True) if args.available_now else writer).start()
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    count = spark.read.parquet(args.path).count()
    print(f"{count} records in Parquet at {args.path}")
    spark.stop()
    return 0 if count > 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
