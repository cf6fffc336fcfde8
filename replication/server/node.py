"""A replog node: a broker, a controller candidate, or both (``process.roles``).

``replog broker start`` and ``replog controller start`` run :func:`run_node`. A broker opens
its replica logs on its own storage root, registers with the active controller (found through
the metadata store) and heartbeats; a controller candidate stands by until the active
controller is lost. SIGTERM or SIGINT shut a node down gracefully: stop accepting requests,
flush and checkpoint every log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from typing import Any

from logstore.errors import ConfigError, ReplogError
from logstore.storage import Storage
from replication import protocol as p
from replication.broker import meta_properties
from replication.broker.lifecycle import BrokerLifecycle
from replication.broker.partition import Partition
from replication.broker.quota_manager import QuotaManagers
from replication.broker.replica_fetcher import ReplicaFetcherManager
from replication.broker.replica_manager import ReplicaManager
from replication.common import TopicPartition
from replication.config import BrokerConfig
from replication.controller.service import ControllerService
from replication.coordinator.group import GroupCoordinator
from replication.coordinator.group_metadata import GroupConfig
from replication.coordinator.group_metadata_manager import OFFSETS_TOPIC
from replication.coordinator.transaction import TRANSACTION_TOPIC, TransactionCoordinator
from replication.errors import (
    ClusterAuthorizationFailedError,
    CoordinatorLoadInProgressError,
    NotCoordinatorError,
    raise_for_code,
)
from replication.kafka.apis import KAFKA_LISTENER, KafkaProtocolApis
from replication.log_format import configure_logging
from replication.metadata.store import MetadataStore
from replication.metrics.broker import BrokerCollector
from replication.metrics.controller import ControllerCollector, metadata_write_histogram
from replication.metrics.endpoint import MetricsEndpoint
from replication.metrics.quotas import QuotaCollector
from replication.security.authorizer import authorizer_from
from replication.security.connector import broker_connector
from replication.security.sasl import (
    CredentialLookup,
    SaslServer,
    enabled_mechanisms,
    plain_allowed,
)
from replication.security.scram import ScramCredential
from replication.security.tls import PrincipalMapper, server_context
from replication.server.apis import KafkaApis
from replication.server.controller_apis import ControllerApis
from replication.server.gc_policy import GcPolicy
from replication.server.group_apis import GroupApis
from replication.server.malloc_policy import apply_malloc_policy
from replication.server.socket_server import ListenerSecurity, ReplogChannel, SocketServer

log = logging.getLogger(__name__)

READY_LINE = "replog {role} {broker_id} listening on {host}:{port}"
#: printed before READY_LINE by a broker with a Kafka listener (not starting with READY_LINE's
#: "replog ", so that whoever waits for READY_LINE does not take this line for it)
KAFKA_READY_LINE = "Kafka listener of broker {broker_id} on {host}:{port}"
#: printed before READY_LINE by a node with a metrics endpoint (metrics.port >= 0), for the
#: same reason not starting with "replog "
METRICS_READY_LINE = "metrics of {role} {broker_id} on {host}:{port}"


GROUP_TICK_BACKSTOP_S = 1.0
"""While any group has members, the group ticker also wakes this often (see _tick_groups)."""


def listener_security(
    config: BrokerConfig, listener: str, lookup: CredentialLookup
) -> ListenerSecurity:
    """How ``listener`` authenticates connections, from the security keys (a bad keystore,
    rule or mechanism fails here, at startup, naming its key). ``lookup`` finds a user's
    SCRAM credential (SASL listeners)."""
    sec = config.security
    protocol = sec.protocol(listener)
    tls = server_context(sec) if protocol in ("SSL", "SASL_SSL") else None
    sasl: Callable[[], SaslServer] | None = None
    if protocol.startswith("SASL_"):
        mechanisms = [
            m
            for m in enabled_mechanisms(sec.sasl_enabled_mechanisms)
            if plain_allowed(m, protocol, sec.sasl_plain_insecure_enable)
        ]
        if not mechanisms:
            raise ConfigError(
                f"config sasl.enabled.mechanisms={sec.sasl_enabled_mechanisms!r}: PLAIN is the "
                f"only one, and listener {listener} is SASL_PLAINTEXT (passwords in the clear); "
                "enable a SCRAM mechanism, use SASL_SSL, or set sasl.plain.insecure.enable=true"
            )
        secret = os.urandom(32)  # one per process: an unknown user's fake salt stays the same

        def sasl() -> SaslServer:
            return SaslServer(mechanisms, lookup, secret=secret)

    return ListenerSecurity(
        listener=listener,
        protocol=protocol,
        tls=tls,
        mapper=PrincipalMapper(sec.ssl_principal_mapping_rules),
        authentication_timeout_ms=sec.authentication_timeout_ms,
        sasl=sasl,
        sasl_max_receive_size=sec.sasl_server_max_receive_size,
    )


class Node:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        #: the one way this node connects to other nodes, with its credentials
        self.connect = broker_connector(config)
        roles = config.roles
        #: the Prometheus endpoint (metrics.port >= 0), or None
        self.metrics: MetricsEndpoint | None = None
        metrics_address = config.metrics_host_port
        if metrics_address is not None:
            self.metrics_host, self.metrics_port = metrics_address
            self.metrics = MetricsEndpoint()
        observer = self.metrics.storage if self.metrics is not None else None
        metadata_storage = Storage.from_url(
            config.metadata_root, **config.storage_options(config.metadata_root)
        )
        metadata_storage.observer = observer
        self.metadata_store = MetadataStore(metadata_storage)
        self.host, self.port = config.host_port
        self.replica_manager: ReplicaManager | None = None
        self.controller_service: ControllerService | None = None
        self.lifecycle: BrokerLifecycle | None = None
        self.fetchers: ReplicaFetcherManager | None = None
        self.coordinator: TransactionCoordinator | None = None
        self.group_coordinator: GroupCoordinator | None = None
        self._txn_timeouts: asyncio.Task[None] | None = None
        self._txn_expiry: asyncio.Task[None] | None = None
        self._group_ticks: asyncio.Task[None] | None = None
        if "broker" in roles:
            storage = Storage.from_url(config.log_dir, **config.storage_options(config.log_dir))
            storage.observer = observer
            self.replica_manager = ReplicaManager(config, storage)
        if "controller" in roles:
            self.controller_service = ControllerService(
                config, self.metadata_store, self.host, self.port, connect=self.connect
            )
        controller_apis = (
            ControllerApis(config, self.controller_service)
            if self.controller_service is not None
            else None
        )
        self.apis = KafkaApis(config, self.replica_manager, controller_apis, None)
        # authorizer.class.name: ACLs from this node's metadata, asked at every request
        authorizer = authorizer_from(config.security, lambda: self.apis.image.acls)
        self.apis.authorizer = lambda: authorizer
        requests = self.metrics.requests if self.metrics is not None else None
        #: client quotas, from this node's metadata (a broker's; shared by its listeners)
        self.quotas = (
            QuotaManagers(lambda: self.apis.image.client_quotas)
            if self.replica_manager is not None
            else None
        )
        replog_security = listener_security(config, "REPLOG", self.scram_credential)
        self.server = SocketServer(
            ReplogChannel(self.apis, sasl=replog_security.sasl is not None),
            self.host,
            self.port,
            config.socket_request_max_bytes,
            request_metrics=requests,
            security=replog_security,
            quotas=self.quotas,
        )
        #: the Kafka protocol listener, on brokers whose listeners name one
        self.kafka_server: SocketServer | None = None
        kafka = config.kafka_host_port
        if kafka is not None and self.replica_manager is not None:
            self.kafka_host, self.kafka_port = kafka
            kafka_security = listener_security(config, KAFKA_LISTENER, self.scram_credential)
            self.kafka_server = SocketServer(
                KafkaProtocolApis(self.apis, sasl=kafka_security.sasl is not None),
                *kafka,
                config.socket_request_max_bytes,
                request_metrics=requests,
                security=kafka_security,
                quotas=self.quotas,
            )

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        """A user's SCRAM credential, from this node's metadata."""
        return self.apis.image.scram_credential(user, mechanism)

    @property
    def role(self) -> str:
        return "broker" if self.replica_manager is not None else "controller"

    async def start(self) -> None:
        if self.metrics is not None:
            self._start_metrics(self.metrics)
        self.port = await self.server.start()
        if self.controller_service is not None:
            # the claim tells brokers where the controller is: its advertised address
            controller = self.controller_service.controller
            controller.host, controller.port = self.config.advertised_host_port or (
                self.host,
                self.port,
            )
            self.controller_service.start()
        rm = self.replica_manager
        if rm is None:
            return
        await asyncio.to_thread(rm.check_storage_layout)
        # meta.properties: this log.dir's cluster and node, checked before anything registers
        meta = await asyncio.to_thread(meta_properties.read, rm.storage)
        if meta is not None:
            meta_properties.check(meta, "", self.config.broker_id, rm.storage)
        advertised = self.config.advertised_host_port or (self.host, self.port)
        endpoints: tuple[tuple[str, str, int], ...] = ()
        if self.kafka_server is not None:
            self.kafka_port = await self.kafka_server.start()
            host, port = self.config.advertised_kafka_host_port or (
                self.kafka_host,
                self.kafka_port,
            )
            endpoints = ((KAFKA_LISTENER, host, port),)
        self.lifecycle = BrokerLifecycle(
            self.config,
            self.metadata_store,
            rm.apply_image,
            lambda: rm.image.version,
            rm.registered,
            *advertised,
            connect=self.connect,
        )
        self.lifecycle.endpoints = endpoints
        self.lifecycle.cluster_id = meta.cluster_id if meta is not None else ""
        self.apis.lifecycle = self.lifecycle
        self.fetchers = ReplicaFetcherManager(
            self.config, rm, lambda: rm.image, connect=self.connect
        )
        rm.fetchers = self.fetchers
        lifecycle = self.lifecycle

        async def send_alter_partition(request: p.AlterPartitionRequest) -> Any:
            return await lifecycle.controller_request(p.ApiKey.ALTER_PARTITION, request)

        rm.send_alter_partition = send_alter_partition
        rm.catch_up_metadata = lifecycle.catch_up
        self.coordinator = self._transaction_coordinator(rm, lifecycle)
        self.apis.coordinator = self.coordinator
        self.group_coordinator = self._group_coordinator(rm)
        self.apis.serve_groups(
            GroupApis(
                self.config,
                self.group_coordinator,
                lambda: rm.image,
                self.apis.create_internal_topic,
            )
        )
        # Answer Metadata from what is on storage right away; partition roles wait for this
        # process's registration (ReplicaManager.apply_image).
        await lifecycle.refresh_metadata()
        if meta is not None:  # the cluster's metadata on storage: another cluster's?
            meta_properties.check(meta, rm.image.cluster_id, self.config.broker_id, rm.storage)
        lifecycle.start()
        rm.start()
        await lifecycle.registered.wait()
        if lifecycle.fatal is not None:  # the controller refused this log.dir's cluster id
            await lifecycle.refresh_metadata()
            if meta is not None:
                meta_properties.check(meta, rm.image.cluster_id, self.config.broker_id, rm.storage)
            raise lifecycle.fatal
        if meta is None and rm.image.cluster_id:  # this log.dir's first start: it joins
            meta = await asyncio.to_thread(
                meta_properties.write,
                rm.storage,
                meta_properties.MetaProperties(rm.image.cluster_id, self.config.broker_id),
            )
            meta_properties.check(meta, rm.image.cluster_id, self.config.broker_id, rm.storage)
        # As Kafka's broker loads its logs before it reports itself started: the replicas the
        # metadata gives this broker open (in the background: it heartbeats meanwhile) before
        # it says it is ready. A replica whose open keeps failing does not hold that back
        # for ever: once every replica was tried, the broker starts and names those it retries.
        if not await rm.wait_for_opens(tried_once=True):
            failing = rm.failing_opens()
            log.error(
                "broker %d starts with %d replica(s) failing to open, retried in the "
                "background (their partitions are unavailable here meanwhile): %s",
                self.config.broker_id,
                len(failing),
                ", ".join(
                    f"{k.topic}-{k.partition} ({n} failures)" for k, n in sorted(failing.items())
                ),
            )

    def _start_metrics(self, metrics: MetricsEndpoint) -> None:
        """Register this node's collectors and serve them (the metrics.port 0 case learns
        its port here)."""
        loop = asyncio.get_running_loop()
        if self.controller_service is not None:
            metrics.registry.register(ControllerCollector(self.controller_service, loop))
            self.metadata_store.on_write = metadata_write_histogram(metrics.registry).observe
        if self.replica_manager is not None:
            metrics.registry.register(
                BrokerCollector(
                    self.replica_manager,
                    self.apis.fetch_sessions,
                    fetchers=lambda: self.fetchers,
                    transactions=lambda: self.coordinator,
                    groups=lambda: self.group_coordinator,
                    loop=loop,
                )
            )
        if self.quotas is not None:
            metrics.registry.register(QuotaCollector(self.quotas, loop))
        self.metrics_port = metrics.start(self.metrics_host, self.metrics_port)

    def _transaction_coordinator(
        self, rm: ReplicaManager, lifecycle: BrokerLifecycle
    ) -> TransactionCoordinator:
        config = self.config

        async def append(records: bytes) -> int:
            results = await rm.append_records(
                -1, config.request_timeout_ms, [(TRANSACTION_TOPIC, 0, records)]
            )
            result = results[TopicPartition(TRANSACTION_TOPIC, 0)]
            if result.error is not None:
                raise NotCoordinatorError(f"the transaction log refused a write: {result.error}")
            return result.base_offset

        async def allocate() -> range:
            response = await lifecycle.controller_request(
                p.ApiKey.ALLOCATE_PRODUCER_IDS,
                p.AllocateProducerIdsRequest(
                    broker_id=config.broker_id, broker_epoch=lifecycle.broker_epoch
                ),
            )
            if response.error_code == ClusterAuthorizationFailedError.code:
                # this broker's own login lacks ClusterAction: not the client's fault, so the
                # client is told to retry (as Kafka's RPCProducerIdManager does), not that it
                # is unauthorized
                log.error(
                    "broker %d: the controller refused to allocate producer ids: this "
                    "broker's principal needs ClusterAction on the cluster",
                    config.broker_id,
                )
                raise CoordinatorLoadInProgressError("producer ids are not available yet")
            raise_for_code(response.error_code, "producer id allocation failed")
            start = response.producer_id_start
            return range(start, start + response.producer_id_len)

        coordinator = TransactionCoordinator(
            config.broker_id,
            config.transaction_max_timeout_ms,
            lambda: rm.image,
            append,
            self.apis.write_own_txn_markers,
            allocate,
            transactional_id_expiration_ms=config.transactional_id_expiration_ms,
            connect=self.connect,
        )

        def on_role_change(partition: Partition) -> None:
            if partition.key != (TRANSACTION_TOPIC, 0):
                return
            if partition.is_leader:
                asyncio.get_running_loop().create_task(coordinator.load(partition))
            else:
                coordinator.unload()

        rm.on_role_change.append(on_role_change)
        self._txn_timeouts = asyncio.get_running_loop().create_task(
            self._abort_timed_out(coordinator)
        )
        self._txn_expiry = asyncio.get_running_loop().create_task(
            self._remove_expired_transactional_ids(
                coordinator, config.transaction_remove_expired_transaction_cleanup_interval_ms
            )
        )
        return coordinator

    def _group_coordinator(self, rm: ReplicaManager) -> GroupCoordinator:
        config = self.config

        async def append(index: int, records: bytes) -> int:
            results = await rm.append_records(
                -1, config.request_timeout_ms, [(OFFSETS_TOPIC, index, records)]
            )
            result = results[TopicPartition(OFFSETS_TOPIC, index)]
            if result.error is not None:
                raise result.error
            return result.base_offset

        coordinator = GroupCoordinator(
            config.broker_id,
            GroupConfig(
                num_partitions=config.offsets_topic_num_partitions,
                min_session_timeout_ms=config.group_min_session_timeout_ms,
                max_session_timeout_ms=config.group_max_session_timeout_ms,
                initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
                max_size=config.group_max_size,
                offsets_retention_ms=config.offsets_retention_minutes * 60_000,
                consumer_session_timeout_ms=config.group_consumer_session_timeout_ms,
                consumer_heartbeat_interval_ms=config.group_consumer_heartbeat_interval_ms,
            ),
            lambda: rm.image,
            append,
        )

        def on_role_change(partition: Partition) -> None:
            if partition.topic != OFFSETS_TOPIC:
                return
            if partition.is_leader:
                asyncio.get_running_loop().create_task(coordinator.load(partition))
            else:
                coordinator.unload(partition.index)

        rm.on_role_change.append(on_role_change)
        self._group_ticks = asyncio.get_running_loop().create_task(self._tick_groups(coordinator))
        return coordinator

    @staticmethod
    async def _tick_groups(coordinator: GroupCoordinator) -> None:
        """Run the coordinator's timed work at its next deadline (a session running out, a
        rebalance's delay or timeout, offsets expiring), or when a join/sync/leave/load may
        have moved one earlier; never a fixed-rate poll, so an idle broker with no groups
        sleeps. While groups have members a backstop wake-up every second also runs, for a
        waiter that ended without passing through the coordinator's locks."""
        last_tick = -1
        while True:
            coordinator.changed.clear()
            deadline = coordinator.next_deadline_ms(after=last_tick)
            timeout: float | None = None
            if deadline is not None:
                timeout = max(0.0, (deadline - coordinator.now_ms()) / 1000)
            if coordinator.busy():
                backstop = GROUP_TICK_BACKSTOP_S
                timeout = backstop if timeout is None else min(timeout, backstop)
            if timeout is None or timeout > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(coordinator.changed.wait(), timeout)
            else:
                await asyncio.sleep(0)  # never hold the event loop, whatever the deadlines
            try:
                last_tick = await coordinator.tick()
            except ReplogError as err:
                last_tick = coordinator.now_ms()
                log.warning("group coordinator: %s", err)

    @staticmethod
    async def _abort_timed_out(coordinator: TransactionCoordinator) -> None:
        while True:
            await asyncio.sleep(1)
            try:
                await coordinator.abort_timed_out()
            except ReplogError as err:
                log.warning("aborting timed-out transactions failed: %s", err)

    @staticmethod
    async def _remove_expired_transactional_ids(
        coordinator: TransactionCoordinator, interval_ms: int
    ) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await coordinator.remove_expired_transactional_ids()
            except ReplogError as err:
                log.warning("removing expired transactional ids failed: %s", err)

    async def stop(self) -> None:
        for task in (self._txn_timeouts, self._txn_expiry, self._group_ticks):
            if task is not None:
                task.cancel()
        if self.group_coordinator is not None:
            await self.group_coordinator.stop()
            for index in list(self.group_coordinator.partitions):
                self.group_coordinator.unload(index)
        if self.coordinator is not None:
            await self.coordinator.stop()
        if self.kafka_server is not None:
            await self.kafka_server.stop()
        await self.server.stop()
        if self.lifecycle is not None:
            await self.lifecycle.stop()
        if self.fetchers is not None:
            await self.fetchers.shutdown()
        if self.replica_manager is not None:
            await self.replica_manager.shutdown()
        if self.controller_service is not None:
            await self.controller_service.stop()
        if self.metrics is not None:
            self.metrics.stop()


async def _serve(config: BrokerConfig) -> None:
    node = Node(config)
    await node.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    gc_policy = GcPolicy(loop)  # full collections scan what survived since, not the heap
    gc_policy.start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if node.metrics is not None:
        print(
            METRICS_READY_LINE.format(
                role=node.role,
                broker_id=config.broker_id,
                host=node.metrics_host,
                port=node.metrics_port,
            ),
            flush=True,
        )
    if node.kafka_server is not None:
        print(
            KAFKA_READY_LINE.format(
                broker_id=config.broker_id, host=node.kafka_host, port=node.kafka_port
            ),
            flush=True,
        )
    print(
        READY_LINE.format(
            role=node.role, broker_id=config.broker_id, host=node.host, port=node.port
        ),
        flush=True,
    )
    await stop.wait()
    log.info("shutting down: flushing and checkpointing every log")
    gc_policy.stop()
    try:
        async with asyncio.timeout(config.shutdown_timeout_ms / 1000):
            await node.stop()
    except TimeoutError:
        _exit_stuck(node, config)
    log.info("%s %d stopped", node.role, config.broker_id)


def _exit_stuck(node: Node, config: BrokerConfig) -> None:
    """The graceful shutdown overran shutdown.timeout.ms: say what still runs, and exit.

    Exiting now is a crash as far as the logs know: everything acknowledged is in segment
    objects already, and recovery at the next start rebuilds the rest. Not SystemExit:
    asyncio.run would wait again for the tasks and threads that hang.
    """
    stuck = [t.get_name() for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    log.error(
        "%s %d: shutdown did not finish within shutdown.timeout.ms=%d (still running: %s); "
        "exiting anyway, the next start recovers the logs",
        node.role,
        config.broker_id,
        config.shutdown_timeout_ms,
        ", ".join(sorted(stuck)) or "nothing",
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(1)


def run_node(config: BrokerConfig, *, log_level: str = "INFO") -> None:
    configure_logging(log_level, config.logging_format)
    apply_malloc_policy()  # freed large buffers go back to the system, not the heap
    asyncio.run(_serve(config))
