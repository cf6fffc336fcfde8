"""replog's client library: a synchronous Producer, Consumer and Admin with Kafka's semantics.

Usable inside Spark tasks: every call blocks and returns (background threads do the
sending); nothing asyncio leaks out. Settings use Kafka's names::

    from replication.client import Producer, Consumer, Admin, TopicPartition

    with Admin(bootstrap_servers="127.0.0.1:9092") as admin:
        admin.create_topic("events", num_partitions=3)
    with Producer(bootstrap_servers="127.0.0.1:9092") as producer:
        producer.send("events", b"hello", key=b"k").result()
    with Consumer(bootstrap_servers="127.0.0.1:9092", auto_offset_reset="earliest") as c:
        c.assign([TopicPartition("events", 0)])
        records = c.poll(timeout_ms=1000)
"""

from replication.client.admin import Admin, OffsetSpec
from replication.client.config import AdminConfig, ConsumerConfig, ProducerConfig
from replication.client.consumer import Consumer
from replication.client.errors import (
    ClientClosedError,
    DeliveryTimeoutError,
    NoOffsetForPartitionError,
    PartitionNotAssignedError,
)
from replication.client.producer import Producer
from replication.client.types import (
    FETCH_SCHEMA,
    BatchMetadata,
    BrokerInfo,
    ClusterDescription,
    ConsumerRecord,
    FetchedBatch,
    NewTopic,
    OffsetAndTimestamp,
    PartitionInfo,
    RecordMetadata,
    TopicDescription,
    TopicPartition,
)

__all__ = [
    "FETCH_SCHEMA",
    "Admin",
    "AdminConfig",
    "BatchMetadata",
    "BrokerInfo",
    "ClientClosedError",
    "ClusterDescription",
    "Consumer",
    "ConsumerConfig",
    "ConsumerRecord",
    "DeliveryTimeoutError",
    "FetchedBatch",
    "NewTopic",
    "NoOffsetForPartitionError",
    "OffsetAndTimestamp",
    "OffsetSpec",
    "PartitionInfo",
    "PartitionNotAssignedError",
    "Producer",
    "ProducerConfig",
    "RecordMetadata",
    "TopicDescription",
    "TopicPartition",
]
