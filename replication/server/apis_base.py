"""What the families of a broker's request handlers share: the broker's configuration, its
authorization, its replica manager, its metadata image, its coordinators, and the shape of a
per-partition answer (:meth:`KafkaApisBase.answer_per_partition`).

:class:`~replication.server.apis.KafkaApis` is made of these families (admin_apis.py,
log_apis.py, transaction_apis.py), each a mixin over :class:`KafkaApisBase`.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Container, Iterable
from typing import TypeVar

from logstore.errors import ReplogError
from replication.broker.fetch_session import FetchSessionCache
from replication.broker.lifecycle import BrokerLifecycle
from replication.broker.replica_manager import ReplicaManager
from replication.config import BrokerConfig
from replication.coordinator.transaction import TransactionCoordinator
from replication.metadata.image import MetadataImage
from replication.security.acl import AclOperation, ResourceType
from replication.security.authorizer import Authorizer
from replication.security.checks import AuthHelper
from replication.server.controller_apis import ControllerApis
from replication.server.group_apis import GroupApis
from replication.server.responses import answer_each

__all__ = ["KafkaApisBase"]

P = TypeVar("P")
R = TypeVar("R")


class KafkaApisBase(abc.ABC):
    """The state of a broker's request handlers. A node without a broker side (a controller
    only) has no replica manager; the coordinators are set by the node once its broker side
    is up."""

    def __init__(
        self,
        config: BrokerConfig,
        replica_manager: ReplicaManager | None,
        controller_apis: ControllerApis | None,
        lifecycle: BrokerLifecycle | None,
    ) -> None:
        self.config = config
        self._replica_manager = replica_manager
        self.controller_apis = controller_apis
        self.lifecycle = lifecycle
        #: The authorizer of this node, asked at each check (None: no authorization, the
        #: default). The node replaces it once its configuration and metadata are there.
        self.authorizer: Callable[[], Authorizer | None] = lambda: None
        #: what every handler (also the group and controller handlers) checks through
        self.auth = AuthHelper(lambda: self.authorizer())
        if controller_apis is not None:
            controller_apis.auth = self.auth
        #: set by the node once its broker side is up
        self.coordinator: TransactionCoordinator | None = None
        self.group_apis: GroupApis | None = None
        self.fetch_sessions = FetchSessionCache(config.max_incremental_fetch_session_cache_slots)

    @property
    def replica_manager(self) -> ReplicaManager:
        assert self._replica_manager is not None
        return self._replica_manager

    @property
    def image(self) -> MetadataImage:
        if self._replica_manager is not None:
            return self._replica_manager.image
        assert self.controller_apis is not None
        return self.controller_apis.image

    @property
    def txn_coordinator(self) -> TransactionCoordinator:
        assert self.coordinator is not None
        return self.coordinator

    async def answer_per_partition(
        self,
        api: str,
        operation: AclOperation,
        topics: Iterable[tuple[str, Iterable[P]]],
        answer: Callable[[str, P], Awaitable[R]],
        failed: Callable[[P, ReplogError], R],
        *,
        may: Container[str] | None = None,
    ) -> list[tuple[str, list[R]]]:
        """The answers to a request of topics and their partitions, in its order:
        ``answer(topic, partition)`` for the partitions of the topics the principal may
        ``operation`` (``may``, by default the topics ``operation`` is allowed on);
        ``failed(partition, error)`` where it raised a ReplogError, and for each partition of
        a refused topic (TOPIC_AUTHORIZATION_FAILED, Kafka's answer per partition)."""
        wanted = [(topic, list(partitions)) for topic, partitions in topics]
        if may is None:
            may = self.auth.filter(operation, ResourceType.TOPIC, (t for t, _ in wanted), api=api)
        out = []
        for topic, partitions in wanted:

            async def answer_partition(partition: P, topic: str = topic) -> R:
                if topic not in may:
                    raise self.auth.error(operation, ResourceType.TOPIC, topic)
                return await answer(topic, partition)

            out.append((topic, await answer_each(partitions, answer_partition, failed)))
        return out

    @abc.abstractmethod
    async def create_internal_topic(self, name: str, partitions: int, replication: int) -> None:
        """Create an internal topic on this node's own behalf (the admin family's, which
        the transaction family and the group APIs call on first use)."""
