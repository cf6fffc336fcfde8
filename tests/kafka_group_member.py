"""A confluent-kafka consumer in a group, as a process of its own (for SIGKILL tests).

    python -m tests.kafka_group_member BOOTSTRAP GROUP TOPIC

Prints one JSON line per event to stdout: ``{"assigned": [partitions]}`` after each
rebalance, ``{"record": [partition, offset, value]}`` per record, then commits it
synchronously and prints ``{"committed": value}``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import confluent_kafka


def main() -> None:
    bootstrap, group, topic = sys.argv[1:4]

    def emit(event: dict[str, Any]) -> None:
        print(json.dumps(event), flush=True)

    def on_assign(consumer: confluent_kafka.Consumer, partitions: list[Any]) -> None:
        # the eager protocol: an assignment replaces the whole previous one
        emit({"assigned": sorted(p.partition for p in partitions)})

    def on_revoke(consumer: confluent_kafka.Consumer, partitions: list[Any]) -> None:
        emit({"assigned": []})

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "partition.assignment.strategy": "range",
        }
    )
    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    while True:
        message = consumer.poll(0.2)
        if message is None:
            continue
        if message.error() is not None:
            emit({"error": str(message.error())})
            continue
        raw = message.value()
        value = raw.decode() if raw is not None else None
        emit({"record": [message.partition(), message.offset(), value]})
        consumer.commit(message=message, asynchronous=False)
        emit({"committed": value})


if __name__ == "__main__":
    main()
