"""Quickstart: create a topic, produce 1,000 records, read them back with Spark (batch).

replog cluster up --brokers 3 --detach
python examples/quickstart.py [--bootstrap-server 127.0.0.1:9092]
"""

from __future__ import annotations

import argparse

from _spark import local_spark

from replication.client import Admin, NewTopic, Producer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092")
    parser.add_argument("--topic", default="quickstart")
    args = parser.parse_args()

    with Admin(bootstrap_servers=args.bootstrap_server) as admin:
        if args.topic not in admin.list_topics():
            admin.create_topics([NewTopic(args.topic, 3, 1)])
    with Producer(bootstrap_servers=args.bootstrap_server, acks="all") as producer:
        futures = [
            producer.send(args.topic, f"hello {i}".encode(), key=f"user-{i % 10}".encode())
            for i in range(1000)
        ]
        offsets = [f.result().offset for f in futures]
    print(f"produced 1000 records (last offset {max(offsets)})")

    spark = local_spark("replog-quickstart")
    df = (
        spark.read.format("replog")
        .option("bootstrap.servers", args.bootstrap_server)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    df.selectExpr("partition", "offset", "CAST(key AS STRING)", "CAST(value AS STRING)").show(5)
    count = df.count()
    print(f"Spark read {count} records from {args.topic}")
    spark.stop()
    return 0 if count >= 1000 else 1


if __name__ == "__main__":
    raise SystemExit(main())
