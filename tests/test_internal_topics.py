"""Internal topics (__consumer_offsets, __transaction_state) get their replication factor from
the controller's view of the cluster, not from the asking broker's metadata, which can lag a
registration: sized from a broker that had seen 2 of 3 brokers, the offsets topic got 2
replicas with min ISR 2 and stopped taking group writes at the first broker failure."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from logstore.storage import Storage
from replication import protocol as p
from replication.broker.replica_manager import ReplicaManager
from replication.config import broker_config_from
from replication.controller.controller import Controller
from replication.coordinator.group_metadata_manager import OFFSETS_TOPIC
from replication.errors import InvalidReplicationFactorError
from replication.metadata.store import MetadataStore
from replication.server.apis import KafkaApis
from replication.server.controller_apis import ControllerApis

pytestmark = pytest.mark.unit


class Active:
    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.active = True


def controller_with(registered: int, live: int) -> tuple[Controller, ControllerApis]:
    root = f"memory://internal-topics-{uuid.uuid4().hex}"
    now = [0]
    store = MetadataStore(Storage.from_url(f"{root}/meta"))
    controller = Controller(store, 100, "127.0.0.1", 1, time_ms=lambda: now[0])
    controller.activate()
    epochs = [
        controller.register_broker(i, "127.0.0.1", 9000 + i, None, f"i{i}").epoch
        for i in range(registered)
    ]
    now[0] += controller.session_timeout_ms + 1  # the brokers from ``live`` on stop heartbeating
    for broker_id in range(live):
        controller.heartbeat(broker_id, epochs[broker_id], controller.image.version)
    controller.check_sessions()
    assert len([b for b in controller.image.brokers if not b.fenced]) == live
    config = broker_config_from({"broker.id": 0, "log.dir": f"{root}/logs"})
    return controller, ControllerApis(config, Active(controller))


def create(apis: ControllerApis, replication_factor: int = 3) -> p.CreatableTopicResult:
    """What a broker's FindCoordinator does on first use: KafkaApis.create_internal_topic with
    the configured replication factor, forwarded to the controller, from a broker whose own
    metadata has no broker registered yet (it lags the controller's)."""
    config = apis.config
    broker = KafkaApis(config, ReplicaManager(config, Storage.from_url(config.log_dir)), apis, None)
    assert broker.image.brokers == ()
    asyncio.run(broker.create_internal_topic(OFFSETS_TOPIC, 3, replication_factor))
    return ask(apis)  # asked again: the answer says why it is not there


def ask(apis: ControllerApis, **configs: str) -> p.CreatableTopicResult:
    """CreateTopics of the offsets topic sent to the controller, with ``configs``."""
    topic = p.CreatableTopic(
        name=OFFSETS_TOPIC,
        num_partitions=3,
        replication_factor=3,
        configs=[p.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()],
    )
    request = p.CreateTopicsRequest(topics=[topic])
    (result,) = asyncio.run(apis.create_topics(apis.service.controller, request)).topics
    return result


def replicas_and_min_isr(controller: Controller) -> tuple[set[int], str]:
    topic = controller.image.topic(OFFSETS_TOPIC)
    assert topic is not None
    return {len(s.replicas) for s in topic.partitions}, dict(topic.configs)["min.insync.replicas"]


def test_the_controller_sizes_an_internal_topic_by_the_brokers_it_has_registered() -> None:
    controller, apis = controller_with(registered=3, live=3)
    create(apis)
    assert replicas_and_min_isr(controller) == ({3}, "2")


def test_an_internal_topic_asked_with_a_lower_min_isr_gets_2() -> None:
    controller, apis = controller_with(registered=3, live=3)
    assert ask(apis, **{"min.insync.replicas": "1"}).error_code == 0
    assert replicas_and_min_isr(controller) == ({3}, "2")


def test_a_small_cluster_gets_as_many_replicas_as_it_has_brokers() -> None:
    controller, apis = controller_with(registered=1, live=1)
    create(apis)
    assert replicas_and_min_isr(controller) == ({1}, "1")


def test_it_is_not_created_while_a_registered_broker_is_down() -> None:
    controller, apis = controller_with(registered=3, live=2)
    result = create(apis)
    assert result.error_code == InvalidReplicationFactorError.code
    assert "2 live broker" in (result.error_message or "")
    assert controller.image.topic(OFFSETS_TOPIC) is None
