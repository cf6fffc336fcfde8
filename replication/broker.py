"""The broker process: storage, replica manager, controller, request handlers, socket server.

``replog broker start --conf conf/broker.toml [--set key=value ...]`` runs :func:`run_broker`.
SIGTERM or SIGINT shut it down gracefully: stop accepting requests, flush and checkpoint every
log. After a restart every acked record is there (acks=all/1 records once flushed).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from logstore.storage import Storage
from replication.apis import KafkaApis
from replication.config import BrokerConfig
from replication.controller import Controller
from replication.metadata_store import MetadataStore
from replication.network import SocketServer
from replication.replica_manager import ReplicaManager

log = logging.getLogger(__name__)

READY_LINE = "replog broker {broker_id} listening on {host}:{port}"


class BrokerServer:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        options = config.storage_options
        self.storage = Storage.from_url(config.log_dir, **options)
        self.metadata_storage = Storage.from_url(config.metadata_root, **options)
        host, port = config.host_port
        self.host = host
        self.port = port
        self.replica_manager = ReplicaManager(config, self.storage)
        self.controller = Controller(
            MetadataStore(self.metadata_storage), config.broker_id, host, port
        )
        self.apis = KafkaApis(config, self.replica_manager, self.controller)
        self.server = SocketServer(self.apis, host, port, config.socket_request_max_bytes)

    async def start(self) -> None:
        self.port = await self.server.start()
        self.controller.port = self.port
        loop = asyncio.get_running_loop()
        rm = self.replica_manager
        self.controller.add_listener(lambda image: loop.call_soon_threadsafe(rm.apply_image, image))
        await asyncio.to_thread(self.controller.activate)
        await asyncio.to_thread(
            self.controller.register_broker,
            self.config.broker_id,
            self.host,
            self.port,
            self.config.broker_rack or None,
        )
        await self.apis.wait_for_metadata(self.controller.image.version)
        rm.start()

    async def stop(self) -> None:
        await self.server.stop()
        await self.replica_manager.shutdown()


async def _serve(config: BrokerConfig) -> None:
    broker = BrokerServer(config)
    await broker.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(
        READY_LINE.format(broker_id=config.broker_id, host=broker.host, port=broker.port),
        flush=True,
    )
    await stop.wait()
    log.info("shutting down: flushing and checkpointing every log")
    await broker.stop()
    log.info("broker %d stopped", config.broker_id)


def run_broker(config: BrokerConfig, *, log_level: str = "INFO") -> None:
    logging.basicConfig(
        level=log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    asyncio.run(_serve(config))
