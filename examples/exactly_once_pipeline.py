"""Exactly-once pipeline: replog in -> transform -> replog out, restartable from its checkpoint.

    python examples/exactly_once_pipeline.py --source quickstart --sink quickstart-upper \
        --checkpoint /tmp/replog-eo-checkpoint [--available-now]

Each micro-batch's rows are written in transactions that the driver commits as one sink batch,
so a restart from the checkpoint (or a replayed batch) never writes a row twice.
"""

from __future__ import annotations

import argparse

from _spark import local_spark

from replication.client import Admin, NewTopic


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092")
    parser.add_argument("--source", default="quickstart")
    parser.add_argument("--sink", default="quickstart-upper")
    parser.add_argument("--checkpoint", default="/tmp/replog-exactly-once-checkpoint")
    parser.add_argument("--available-now", action="store_true", help="process the backlog, stop")
    args = parser.parse_args()

    with Admin(bootstrap_servers=args.bootstrap_server) as admin:
        if args.sink not in admin.list_topics():
            admin.create_topics([NewTopic(args.sink, 3, -1)])
    spark = local_spark("replog-exactly-once")
    writer = (
        spark.readStream.format("replog")
        .option("bootstrap.servers", args.bootstrap_server)
        .option("subscribe", args.source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "1000")
        .load()
        .selectExpr("key", "upper(CAST(value AS STRING)) AS value")
        .writeStream.format("replog")
        .option("bootstrap.servers", args.bootstrap_server)
        .option("topic", args.sink)
        .option("checkpointLocation", args.checkpoint)
    )
    query = (writer.trigger(availableNow=True) if args.available_now else writer).start()
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    print(f"committed micro-batches up to {query.lastProgress and query.lastProgress['batchId']}")
    spark.stop()
    return 0 if query.exception() is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
