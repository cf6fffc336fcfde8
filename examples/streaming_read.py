"""Streaming read: a Structured Streaming query over a replog topic (counts per partition).

    python examples/streaming_read.py --topic quickstart [--available-now]

Without --available-now it runs until Ctrl-C, printing each micro-batch.
"""

from __future__ import annotations

import argparse

from _spark import local_spark


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092")
    parser.add_argument("--topic", default="quickstart")
    parser.add_argument("--available-now", action="store_true", help="process the backlog, stop")
    args = parser.parse_args()

    spark = local_spark("replog-streaming-read")
    counts = (
        spark.readStream.format("replog")
        .option("bootstrap.servers", args.bootstrap_server)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "500")
        .load()
        .groupBy("partition")
        .count()
    )
    writer = counts.writeStream.outputMode("complete").format("memory").queryName("counts")
    writer = writer.trigger(availableNow=True) if args.available_now else writer
    query = writer.start()
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    rows = spark.sql("SELECT partition, `count` FROM counts ORDER BY partition").collect()
    for row in rows:
        print(f"partition {row['partition']}: {row['count']} records")
    total = sum(row["count"] for row in rows)
    print(f"total {total}")
    spark.stop()
    return 0 if total > 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
