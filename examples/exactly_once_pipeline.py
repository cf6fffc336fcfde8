"""Exactly-once pipeline: replog in -> transform -> replog out, restartable from its checkpoint.

    python examples/exactly_once_pipeline.py --source quickstart --sink quickstart-upper \
        --checkpoint /tmp/replog-eo-checkpoint [--available-now] \
        [--command-config secrets/client.properties]

``--command-config`` (a secured cluster's client.properties, as the replog tools take it): its
settings reach the job's clients as Kafka's ``kafka.``-prefixed options of the source and sink.

Each micro-batch's rows are written in transactions that the driver commits as one sink batch,
so a restart from the checkpoint (or a replayed batch) never writes a row twice.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _spark import local_spark

from replication.client import Admin, NewTopic
from replication.tools.cli_common import read_properties


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092")
    parser.add_argument("--source", default="quickstart")
    parser.add_argument("--sink", default="quickstart-upper")
    parser.add_argument("--checkpoint", default="/tmp/replog-exactly-once-checkpoint")
    parser.add_argument("--available-now", action="store_true", help="process the backlog, stop")
    parser.add_argument(
        "--command-config",
        type=Path,
        help="client settings of a secured cluster (client.properties: security.protocol, ssl.*, "
        "sasl.*)",
    )
    args = parser.parse_args()
    client = read_properties(args.command_config) if args.command_config else {}
    security = {f"kafka.{k}": v for k, v in client.items()}

    with Admin({**client, "bootstrap.servers": args.bootstrap_server}) as admin:
        if args.sink not in admin.list_topics():
            admin.create_topics([NewTopic(args.sink, 3, -1)])
    spark = local_spark("replog-exactly-once")
    writer = (
        spark.readStream.format("replog")
        .option("bootstrap.servers", args.bootstrap_server)
        .option("subscribe", args.source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "1000")
        .options(**security)
        .load()
        .selectExpr("key", "upper(CAST(value AS STRING)) AS value")
        .writeStream.format("replog")
        .option("bootstrap.servers", args.bootstrap_server)
        .option("topic", args.sink)
        .option("checkpointLocation", args.checkpoint)
        .options(**security)
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
