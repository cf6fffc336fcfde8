"""A controller candidate in a process: standby until the active controller is lost.

Election without ZooKeeper or Raft: the active controller is the holder of the newest claim in
the metadata store. A standby pings the claim's holder (ApiVersions); once it has not answered
for ``broker.session.timeout.ms``, the standby claims the epoch after that claim's with a
put-if-absent write. Only one claimant can win; the standbys that lose watch the winner (none
claims a later epoch over a controller it has not seen silent). A deposed controller cannot
write metadata (its next version already exists), so a paused controller that wakes up finds
itself stale and steps down.

The active controller also fences brokers whose heartbeats stopped and moves their leadership,
and, with auto.leader.rebalance.enable, moves leadership back to preferred replicas every
leader.imbalance.check.interval.seconds (``Controller.rebalance_leaders``).
"""

from __future__ import annotations

import asyncio
import logging
import time

from logstore.errors import ReplogError
from replication import protocol as p
from replication.config import BrokerConfig
from replication.controller.controller import Controller
from replication.errors import BrokerUnreachableError, StaleControllerEpochError
from replication.metadata.store import ControllerClaim, MetadataStore
from replication.protocol.rpc import AsyncConnection
from replication.security.connector import Connector, broker_connector

log = logging.getLogger(__name__)


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class ControllerService:
    def __init__(
        self,
        config: BrokerConfig,
        store: MetadataStore,
        host: str,
        port: int,
        *,
        connect: Connector | None = None,
    ) -> None:
        self.config = config
        #: how a standby reaches the active controller (with this node's credentials)
        self._connect = connect or broker_connector(config)
        self.store = store
        self.controller = Controller(
            store,
            config.broker_id,
            host,
            port,
            session_timeout_ms=config.broker_session_timeout_ms,
            unclean_leader_election=config.unclean_leader_election_enable,
        )
        self._claim_alive_ms = _now_ms()
        #: when a standby last read the latest claim (a LIST and a GET on the metadata store)
        self._claim_read_ms = 0
        #: whether the standby's last ping of the watched controller was answered
        self._ping_ok = False
        self._watched: ControllerClaim | None = None
        self._ping: AsyncConnection | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def active(self) -> bool:
        return self.controller.active

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="controller")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._ping is not None:
            await self._ping.close()

    async def _run(self) -> None:
        last_claim_check = 0
        last_rebalance = _now_ms()
        rebalance_ms = self.config.leader_imbalance_check_interval_seconds * 1000
        while True:
            try:
                if self.controller.active:
                    if self.controller.sessions_expired():
                        await asyncio.to_thread(self.controller.check_sessions)
                    if _now_ms() - last_claim_check > 1000:
                        last_claim_check = _now_ms()
                        await self._step_down_if_superseded()
                    if (
                        self.config.auto_leader_rebalance_enable
                        and _now_ms() - last_rebalance > rebalance_ms
                    ):
                        last_rebalance = _now_ms()
                        await asyncio.to_thread(
                            self.controller.rebalance_leaders,
                            self.config.leader_imbalance_per_broker_percentage,
                        )
                else:
                    await self._maybe_take_over()
            except StaleControllerEpochError as err:
                log.warning("controller %d steps down: %s", self.config.broker_id, err)
            except ReplogError as err:
                log.warning("controller %d: %s", self.config.broker_id, err)
            await asyncio.sleep(self.pause_s())

    def pause_s(self) -> float:
        """The loop's pause before its next pass. The active checks sessions every half
        heartbeat interval (a fenced broker's leadership moves promptly). A standby whose
        last ping was answered pings once per heartbeat interval, as a broker heartbeats:
        every node but the active is a standby by default (process.roles=broker,controller),
        and their pings are most of an idle active's work. Once a ping goes unanswered (or
        before the first) it pings every half interval again: it takes over at its first
        failed ping after broker.session.timeout.ms of silence since the last answer, so a
        dead active is still noticed at most session + half an interval after it died, as
        when every ping came at that rate."""
        half = self.config.broker_heartbeat_interval_ms / 1000 / 2
        if self.controller.active or self._watched is None or not self._ping_ok:
            return half
        return 2 * half

    async def _step_down_if_superseded(self) -> None:
        claim = await asyncio.to_thread(self.store.latest_claim)
        if claim is not None and claim.epoch > self.controller.epoch:
            self.controller.active = False
            log.warning(
                "controller %d (epoch %d) was superseded by controller %d (epoch %d)",
                self.config.broker_id,
                self.controller.epoch,
                claim.controller_id,
                claim.epoch,
            )

    async def _maybe_take_over(self) -> None:
        # While the watched controller answers, a standby rereads the claim (a LIST and a GET
        # on the metadata store, in a thread) once a second, as the active checks whether it
        # was superseded, rather than at every ping: a newer claim is only ever written by a
        # standby that saw the active silent for broker.session.timeout.ms. Once a ping has
        # gone unanswered it reads the claim every time, so it does not try to succeed a
        # controller that a newer one already replaced (that claim would fail; harmless, but
        # a lost pass).
        claim = self._watched
        if claim is None or not self._ping_ok or (_now_ms() - self._claim_read_ms >= 1000):
            claim = await asyncio.to_thread(self.store.latest_claim)
            self._claim_read_ms = _now_ms()
        if claim is None or claim.controller_id == self.config.broker_id:
            # the first controller ever, our own earlier life, or our activation that failed
            await self._activate(claim.epoch if claim else 0)
            return
        if self._watched is None or claim.epoch != self._watched.epoch:
            self._watched = claim
            self._claim_alive_ms = _now_ms()
            if self._ping is not None:
                await self._ping.close()
            self._ping = self._connect(
                claim.host, claim.port, client_id=f"controller-{self.config.broker_id}"
            )
        assert self._ping is not None
        self._ping_ok = False  # until answered, whatever the ping raises
        try:
            await self._ping.request(
                p.ApiKey.API_VERSIONS,
                p.ApiVersionsRequest(),
                timeout_ms=self.config.broker_heartbeat_interval_ms * 2,
            )
            self._claim_alive_ms = _now_ms()
            self._ping_ok = True
        except BrokerUnreachableError:
            silent = _now_ms() - self._claim_alive_ms
            if silent > self.config.broker_session_timeout_ms:
                log.warning(
                    "active controller %d (epoch %d) silent for %d ms: taking over",
                    claim.controller_id,
                    claim.epoch,
                    silent,
                )
                # only the silent controller's successor epoch: if another standby claimed it
                # first, this one lost and watches the new controller (it never deposes a
                # controller it has not seen silent)
                await self._activate(claim.epoch)

    async def _activate(self, after: int) -> None:
        try:
            await asyncio.to_thread(self.controller.activate, after)
        except StaleControllerEpochError as err:
            log.info("controller %d lost the election: %s", self.config.broker_id, err)
