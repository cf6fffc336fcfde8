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

Producers are idempotent by default (enable.idempotence); with a transactional.id they write
transactions that read_committed consumers see whole or not at all::

    with Producer(bootstrap_servers="127.0.0.1:9092", transactional_id="orders-1") as p:
        p.init_transactions()
        p.begin_transaction()
        p.send("orders", b"order-1")
        p.commit_transaction()

Several producers' transactions (one per Spark task) commit as one batch of a sink:
each task calls ``Producer.transaction_handle()`` and the driver calls
``Admin.commit_sink_batch(sink_id, batch_id, handles)``.
"""

from replication.client.admin import Admin, OffsetSpec
from replication.client.config import AdminConfig, ConsumerConfig, ProducerConfig
from replication.client.consumer import Consumer
from replication.client.consumer_coordinator import ConsumerRebalanceListener
from replication.client.errors import (
    ClientClosedError,
    ConsumerStateError,
    DeliveryTimeoutError,
    NoOffsetForPartitionError,
    PartitionNotAssignedError,
    TransactionAbortedError,
    TransactionStateError,
)
from replication.client.producer import Producer
from replication.client.retry import RetryPolicy, call_with_retries
from replication.client.types import (
    FETCH_SCHEMA,
    BrokerInfo,
    ClusterDescription,
    ConfigEntry,
    ConsumerGroupDescription,
    ConsumerGroupMetadata,
    ConsumerRecord,
    FetchedBatch,
    HangingTransaction,
    MemberDescription,
    NewTopic,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    PartitionInfo,
    ProducerState,
    RecordBatchMetadata,
    RecordMetadata,
    ReplicaLog,
    SinkCommitResult,
    TopicDescription,
    TopicPartition,
    TransactionHandle,
    TransactionListing,
)

__all__ = [
    "FETCH_SCHEMA",
    "Admin",
    "AdminConfig",
    "BrokerInfo",
    "ClientClosedError",
    "ClusterDescription",
    "ConfigEntry",
    "Consumer",
    "ConsumerConfig",
    "ConsumerGroupDescription",
    "ConsumerGroupMetadata",
    "ConsumerRebalanceListener",
    "ConsumerRecord",
    "ConsumerStateError",
    "DeliveryTimeoutError",
    "FetchedBatch",
    "HangingTransaction",
    "MemberDescription",
    "NewTopic",
    "NoOffsetForPartitionError",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "OffsetSpec",
    "PartitionInfo",
    "PartitionNotAssignedError",
    "Producer",
    "ProducerConfig",
    "ProducerState",
    "RecordBatchMetadata",
    "RecordMetadata",
    "ReplicaLog",
    "RetryPolicy",
    "SinkCommitResult",
    "TopicDescription",
    "TopicPartition",
    "TransactionAbortedError",
    "TransactionHandle",
    "TransactionListing",
    "TransactionStateError",
    "call_with_retries",
]
