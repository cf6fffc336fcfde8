"""The Docker demo's producer: ``--num-records`` records ``event-000001``... into a topic, each
once, even if the service is restarted.

    python docker/produce_events.py --bootstrap-server broker-0:9092 --topic events \
        --num-records 1000 [--command-config /secrets/client.properties]

It sends in one transaction (transactional.id ``replog-demo-producer-<topic>``): a restarted
run first fences the previous one (aborting whatever it left open), reads the topic's
committed records, and sends only the missing ones. So the topic ends with exactly the
records ``event-000001`` to ``event-<num-records>`` (key: the number), whatever failed before.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from replication.client import Consumer, Producer, TopicPartition
from replication.tools.cli_common import read_properties

PREFIX = "event-"


def value(number: int) -> bytes:
    return f"{PREFIX}{number:06d}".encode()


def committed_values(
    client: dict[str, str], topic: str, partitions: list[int], timeout: float
) -> set[bytes]:
    """The values of ``topic``'s committed records (read_committed, up to the LSO)."""
    seen: set[bytes] = set()
    with Consumer(
        {
            **client,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    ) as consumer:
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise SystemExit(f"reading {topic} to its end took over {timeout}s: retry")
            for record in consumer.poll(timeout_ms=500):
                if record.value is not None:
                    seen.add(record.value)
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap-server", default="127.0.0.1:9092")
    parser.add_argument("--topic", default="events")
    parser.add_argument("--num-records", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=120, help="seconds per step")
    parser.add_argument(
        "--command-config",
        type=Path,
        help="client settings of a secured cluster (client.properties: security.protocol, ssl.*, "
        "sasl.*)",
    )
    args = parser.parse_args()
    if args.num_records < 1:
        parser.error(f"--num-records must be at least 1, got {args.num_records}")
    client = read_properties(args.command_config) if args.command_config else {}
    client = {**client, "bootstrap.servers": args.bootstrap_server}
    with Producer(
        {
            **client,
            "transactional.id": f"replog-demo-producer-{args.topic}",
            "acks": "all",
            "max.block.ms": int(args.timeout * 1000),
        }
    ) as producer:
        producer.init_transactions()  # fences a previous run; its open transaction aborts
        partitions = producer.partitions_for(args.topic)
        there = committed_values(client, args.topic, partitions, args.timeout)
        missing = [n for n in range(1, args.num_records + 1) if value(n) not in there]
        if missing:
            producer.begin_transaction()
            for number in missing:
                producer.send(args.topic, value(number), key=str(number).encode())
            producer.commit_transaction()
    print(
        f"{args.topic}: records {PREFIX}000001 to {value(args.num_records).decode()} committed "
        f"({len(missing)} sent now, {args.num_records - len(missing)} were there)",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
