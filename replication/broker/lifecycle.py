"""The broker's side of the controller relationship, as Kafka's BrokerLifecycleManager.

Finds the active controller through the metadata store's newest claim, registers (getting a
broker epoch; the controller holds a new registration fenced until a heartbeat reports the
metadata version that holds it), heartbeats every ``broker.heartbeat.interval.ms``, and
applies each newer metadata version the heartbeat names, read straight from the metadata store
(the deltas after the version it holds). Responses from a controller whose epoch is older
than one already seen are ignored (a deposed controller).

A broker also reads the store between heartbeats when a peer shows it newer metadata
(:meth:`BrokerLifecycle.catch_up`): a follower fetching a partition this broker has not learned
yet, a client producing to one. Kafka's brokers tail the metadata log with a long poll and
learn a new topic or leader within milliseconds of each other; here the heartbeat names new
versions, so brokers would learn them up to ``broker.heartbeat.interval.ms`` apart, and a
follower that learned first would be refused and back off ``replica.fetch.backoff.ms`` (the
first acks=all records to a new topic waited 0.5-1.3 s for it).
Controller requests other brokers receive (CreateTopics, AlterPartition...) are forwarded here.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import Any

from logstore.errors import ReplogError
from replication import protocol as p
from replication.config import BrokerConfig
from replication.errors import (
    AuthorizationError,
    BrokerUnreachableError,
    InconsistentClusterIdError,
    NotControllerError,
    StaleBrokerEpochError,
    for_code,
)
from replication.metadata.image import MetadataImage
from replication.metadata.store import ControllerClaim, MetadataStore
from replication.protocol.rpc import AsyncConnection
from replication.security.config import SECURITY_PROTOCOLS
from replication.security.connector import Connector, broker_connector

log = logging.getLogger(__name__)

#: the least spacing of two catch-up reads of the metadata store (each a store read: a LIST
#: and the new deltas' GETs on S3), however many requests name metadata this broker lacks. A
#: read that finds nothing new (requests naming a partition that does not exist, say) doubles
#: it, up to broker.heartbeat.interval.ms: bogus requests cost at most what heartbeats cost.
CATCH_UP_MIN_INTERVAL_S = 0.1


class BrokerLifecycle:
    def __init__(
        self,
        config: BrokerConfig,
        store: MetadataStore,
        apply_image: Callable[[MetadataImage], None],
        current_version: Callable[[], int],
        on_registered: Callable[[int], None],
        host: str,
        port: int,
        *,
        connect: Connector | None = None,
    ) -> None:
        self.config = config
        #: how this broker reaches the controller (with its credentials)
        self._connect = connect or broker_connector(config)
        self.store = store
        self.apply_image = apply_image
        self.current_version = current_version
        self.on_registered = on_registered
        self.host = host
        self.port = port
        self.broker_epoch = -1
        #: whether the controller holds this broker fenced (registered, not caught up yet,
        #: or its session expired): no leadership, no ISR membership
        self.fenced = True
        self.highest_controller_epoch = 0
        self._claim: ControllerClaim | None = None
        self._conn: AsyncConnection | None = None
        self._task: asyncio.Task[None] | None = None
        #: set once registered and unfenced (the broker is started, as Kafka's broker waits
        #: for its first unfencing), or with :attr:`fatal`
        self.registered = asyncio.Event()
        #: the cluster id of this broker's log.dir (its meta.properties; "" on a new log.dir),
        #: sent in its registration for the controller to check
        self.cluster_id = ""
        #: why this broker may not join the cluster at all (the controller refused its log.dir's
        #: cluster id); set with ``registered``, the loop ends
        self.fatal: InconsistentClusterIdError | None = None
        self.incarnation = uuid.uuid4()
        #: the broker's other listeners to register: (name, advertised host, port)
        self.endpoints: tuple[tuple[str, str, int], ...] = ()
        #: the newest metadata image read from the store
        self._image: MetadataImage | None = None
        #: the catch-up read in flight (:meth:`catch_up`), and when the last one started
        self._catch_up: asyncio.Task[None] | None = None
        self._catch_up_at = float("-inf")
        #: the spacing the next catch-up read keeps from the last one (see
        #: CATCH_UP_MIN_INTERVAL_S)
        self.catch_up_spacing_s = CATCH_UP_MIN_INTERVAL_S
        #: catch-up reads started, for tests and metrics
        self.catch_ups = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="lifecycle")

    async def stop(self) -> None:
        for task in (self._task, self._catch_up):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._conn is not None:
            await self._conn.close()

    async def refresh_metadata(self) -> None:
        """Read and apply the newest valid metadata version now."""
        # from the image read last, only the deltas after it (if it is on the valid chain)
        image = await asyncio.to_thread(self.store.read_latest, self._image)
        if self._image is None or image.version >= self._image.version:
            self._image = image  # a heartbeat's read and a catch-up may overlap
        if image.version > self.current_version():
            self.apply_image(image)

    def catch_up(self) -> None:
        """A request named metadata this broker has not applied (a partition it does not know,
        a leader epoch newer than its own): read the store now instead of at the heartbeat
        that would name the new version. One read at a time, at most one per
        :attr:`catch_up_spacing_s` (see :data:`CATCH_UP_MIN_INTERVAL_S`). Before registration
        the registration's own read does it."""
        if self.broker_epoch < 0 or (self._catch_up is not None and not self._catch_up.done()):
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._catch_up_at < self.catch_up_spacing_s:
            return
        self._catch_up_at = loop.time()
        self.catch_ups += 1
        self._catch_up = loop.create_task(self._catch_up_read(), name="metadata-catch-up")

    async def _catch_up_read(self) -> None:
        before = self.current_version()
        try:
            await self.refresh_metadata()
        except ReplogError as err:  # the heartbeat's read will do it
            log.info("broker %d: metadata catch-up read failed: %s", self.config.broker_id, err)
        if self.current_version() > before:
            self.catch_up_spacing_s = CATCH_UP_MIN_INTERVAL_S
        else:
            self.catch_up_spacing_s = min(
                2 * self.catch_up_spacing_s,
                max(self.config.broker_heartbeat_interval_ms / 1000, CATCH_UP_MIN_INTERVAL_S),
            )

    async def controller_request(self, api_key: p.ApiKey, body: Any) -> Any:
        """Send a request to the active controller, finding it again if it moved."""
        last: ReplogError | None = None
        for _ in range(20):
            conn = await self._controller_connection()
            if conn is None:
                await asyncio.sleep(self.config.broker_heartbeat_interval_ms / 1000)
                continue
            try:
                response = await conn.request(api_key, body)
            except BrokerUnreachableError as err:
                last = err
                self._forget_controller()
                continue
            if getattr(response, "error_code", 0) == NotControllerError.code:
                last = NotControllerError()
                self._forget_controller()
                await asyncio.sleep(self.config.broker_heartbeat_interval_ms / 1000)
                continue
            return response
        raise last or NotControllerError("no active controller found")

    async def _controller_connection(self) -> AsyncConnection | None:
        if self._conn is None:
            claim = await asyncio.to_thread(self.store.latest_claim)
            if claim is None:
                return None
            self._claim = claim
            self._conn = self._connect(
                claim.host,
                claim.port,
                client_id=f"broker-{self.config.broker_id}",
                timeout_ms=self.config.broker_session_timeout_ms,
            )
        return self._conn

    def _forget_controller(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            asyncio.get_running_loop().create_task(conn.close())

    async def _run(self) -> None:
        interval = self.config.broker_heartbeat_interval_ms / 1000
        while True:
            try:
                if self.broker_epoch < 0:
                    await self._register()
                else:
                    await self._heartbeat()
            except StaleBrokerEpochError as err:
                log.warning("broker %d: %s", self.config.broker_id, err)
                self.broker_epoch = -1
                continue
            except InconsistentClusterIdError as err:
                self.fatal = err
                self.registered.set()
                return
            except AuthorizationError as err:
                # the controller answered: this node's principal lacks ClusterAction
                log.warning("broker %d: %s", self.config.broker_id, err)
            except ReplogError as err:
                log.warning("broker %d: controller unreachable: %s", self.config.broker_id, err)
            await asyncio.sleep(interval)

    def _protocol_id(self, listener: str) -> int:
        """Kafka's wire id of the listener's security protocol (PLAINTEXT 0 ... SASL_SSL 3)."""
        return SECURITY_PROTOCOLS[self.config.security.protocol(listener)]

    async def _register(self) -> None:
        response = await self.controller_request(
            p.ApiKey.BROKER_REGISTRATION,
            p.BrokerRegistrationRequest(
                broker_id=self.config.broker_id,
                cluster_id=self.cluster_id,
                incarnation_id=self.incarnation,
                listeners=[
                    p.BrokerRegistrationListener(
                        name="REPLOG",
                        host=self.host,
                        port=self.port,
                        security_protocol=self._protocol_id("REPLOG"),
                    ),
                    *(
                        p.BrokerRegistrationListener(
                            name=name,
                            host=host,
                            port=port,
                            security_protocol=self._protocol_id(name),
                        )
                        for name, host, port in self.endpoints
                    ),
                ],
                rack=self.config.broker_rack or None,
            ),
        )
        _raise(response.error_code, "broker registration")
        self.broker_epoch = response.broker_epoch
        self.fenced = True
        self.on_registered(self.broker_epoch)
        log.info(
            "broker %d registered with broker epoch %d, fenced until it has caught up with "
            "the metadata",
            self.config.broker_id,
            self.broker_epoch,
        )
        # the metadata that holds the registration, then at once the heartbeat that reports
        # it: the controller unfences a broker that caught up (KRaft's registration)
        await self.refresh_metadata()
        await self._heartbeat()

    async def _heartbeat(self) -> None:
        response = await self.controller_request(
            p.ApiKey.BROKER_HEARTBEAT,
            p.BrokerHeartbeatRequest(
                broker_id=self.config.broker_id,
                broker_epoch=self.broker_epoch,
                current_metadata_offset=self.current_version(),
            ),
        )
        if response.controller_epoch < self.highest_controller_epoch:
            self._forget_controller()  # a deposed controller answered
            return
        self.highest_controller_epoch = response.controller_epoch
        _raise(response.error_code, "heartbeat")
        self.fenced = response.is_fenced
        if response.metadata_version > self.current_version():
            await self.refresh_metadata()
        if self.fenced:
            log.info(
                "broker %d (epoch %d) is fenced: it has applied metadata version %d, the "
                "controller is at %d",
                self.config.broker_id,
                self.broker_epoch,
                self.current_version(),
                response.metadata_version,
            )
        elif not self.registered.is_set():
            log.info("broker %d is unfenced", self.config.broker_id)
            self.registered.set()


def _raise(code: int, what: str) -> None:
    cls = for_code(code)
    if cls is not None:
        raise cls(
            f"{what} refused by the controller: {cls.__doc__ and ' '.join(cls.__doc__.split())}"
        )
