"""A consume-transform-produce worker on confluent-kafka (librdkafka), as a process of its own
for SIGKILL tests against replog's Kafka listener:

    python -m tests.kafka_ctp_worker BOOTSTRAP GROUP SOURCE SINK TRANSACTIONAL_ID [BATCH]

It reads SOURCE as a member of GROUP (read_committed) and, per batch of up to BATCH records
(default 200), in one transaction:
writes each record's value upper-cased to SINK (same partition) and commits the group's
offsets with ``send_offsets_to_transaction``, as Kafka's exactly-once examples do. A restart
with the same transactional id fences the previous instance and aborts its open transaction.
"""

from __future__ import annotations

import sys

import confluent_kafka


def main() -> None:
    bootstrap, group, source, sink, transactional_id = sys.argv[1:6]
    batch_size = int(sys.argv[6]) if len(sys.argv) > 6 else 200
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # The broker's smallest (group.min.session.timeout.ms): after each SIGKILL the
            # group waits out the dead member's session before the next one gets its
            # partitions; librdkafka's default (45 s) made that wait most of the test.
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
        }
    )
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5}
    )
    producer.init_transactions(60)  # fences a previous instance, aborting its transaction
    consumer.subscribe([source])
    while True:
        batch = consumer.consume(batch_size, 0.5)
        if not batch:
            continue
        producer.begin_transaction()
        for message in batch:
            error = message.error()
            if error is not None:
                raise confluent_kafka.KafkaException(error)
            value = message.value() or b""
            partition = message.partition()
            assert partition is not None
            producer.produce(sink, value=value.upper(), partition=partition)
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 60
        )
        producer.commit_transaction(60)


if __name__ == "__main__":
    main()
