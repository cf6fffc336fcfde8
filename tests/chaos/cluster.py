"""The cluster a chaos schedule runs against: 2 controllers and 3 brokers, each broker behind
its own proxy and on a log storage the harness can break.

- Controllers 100 (active first) and 101 (standby) are ``process.roles=controller`` processes
  sharing one metadata root; killing the active one makes the standby take over.
- Broker ``i`` advertises its :class:`~tests.proxy.TcpProxy`, so clients and the other
  brokers' fetchers reach it only through the proxy (``net_cut`` and ``net_stall`` act there).
  Each start listens on a port the kernel picks and points the proxy at it: a port chosen
  beforehand, or kept across a kill, can be taken meanwhile by another test's process.
  Brokers are ``process.roles=broker``: never controllers.
- Brokers run through :mod:`tests.chaos.launcher`, so :meth:`ChaosCluster.set_storage_faults`
  makes a broker's own log storage fail, stall or tear writes.
- With ``disk_mb``, each broker's log storage is on a tmpfs of its own
  (:class:`~tests.chaos.disks.TmpfsDisk`), which ``disk_full`` fills.
- With ``fake_clocks``, every node runs under libfaketime (:class:`~tests.chaos.clocks.FakeClock`),
  whose wall clock ``clock_jump`` steps.
- Controllers run through the launcher too (no storage faults there).
- With ``kafka``, each broker also has a Kafka listener behind a proxy of its own
  (:attr:`ChaosCluster.kafka_proxies`, :attr:`ChaosCluster.kafka_bootstrap`), which
  ``net_cut`` and ``net_stall`` act on with the broker's other proxy.

Every wait has a deadline; nothing here decides what is an anomaly (see
:mod:`tests.chaos.checker`), it only reports what it could not do.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from logstore.batch import iter_batches
from logstore.errors import ReplogError
from logstore.log import open_replica_log
from logstore.reader import SegmentReader
from logstore.storage import Storage
from replication.client import Admin, TopicPartition
from replication.client.describe import describe_topic_status
from replication.metadata.store import MetadataStore
from tests.chaos.clocks import FakeClock
from tests.chaos.disks import TmpfsDisk
from tests.chaos.history import StoredBatch
from tests.chaos.launcher import CONTROL_ENV, write_control
from tests.chaos.netns import NetworkLab
from tests.cluster import FAST_FAILOVER, BrokerProcess
from tests.proxy import TcpProxy

REPO_ROOT = Path(__file__).resolve().parents[2]
CONTROLLER_IDS = (100, 101)
#: Broker timings: FAST_FAILOVER with a 3 s session, so that 1.5-2 s pauses stay well inside it.
SESSION_TIMEOUT_S = 3.0
BROKER_SETTINGS = {
    **FAST_FAILOVER,
    "broker.session.timeout.ms": str(int(SESSION_TIMEOUT_S * 1000)),
    "default.replication.factor": "3",
    "transaction.timeout.ms": "10000",
    # Group commit every 100 ms (default 5): a leader that dies then has an unflushed tail its
    # followers have already fetched: the window in which a leader's failover could lose acked
    # records if the high watermark ran ahead of the followers' durable ends.
    "log.flush.interval.ms": "100",
}


def _free_subnet() -> int:
    """A second octet for a lab's 10.<n>.0.0/24 that no route of this host uses yet."""
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    free = [n for n in range(100, 250) if f"10.{n}." not in routes]
    if not free:
        raise RuntimeError("no free 10.<n>.0.0/24 for a chaos network")
    return random.choice(free)


class LaunchedBroker(BrokerProcess):
    """A node started through :mod:`tests.chaos.launcher` (faulty log storage). With a
    ``proxy`` (what clients reach) each start takes a fresh port and points the proxy at it;
    without one the port is kept across restarts, as for any BrokerProcess. ``kafka_proxy``:
    the same for its Kafka listener. ``host``: the address it listens on; ``exec_prefix``:
    what runs it (in a network namespace)."""

    def __init__(
        self,
        *args: Any,
        proxy: TcpProxy | None = None,
        kafka_proxy: TcpProxy | None = None,
        host: str = "127.0.0.1",
        exec_prefix: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, kafka=kafka_proxy is not None, **kwargs)
        self.proxy = proxy
        self.kafka_proxy = kafka_proxy
        self.host = host
        self.exec_prefix = list(exec_prefix)

    def start(self) -> LaunchedBroker:
        if self.proxy is None:
            super().start()
            return self
        self.port = 0  # a fresh port: the last one may have been taken while this was down
        self.kafka_port = 0
        super().start()
        self.proxy.target = (self.host, self.port)
        if self.kafka_proxy is not None:
            self.kafka_proxy.target = (self.host, self.kafka_port)
        return self

    def command(self) -> list[str]:
        cmd = super().command()  # [python, "-m", "replication.tools.cli", role, "start", ...]
        args = [
            a.replace("REPLOG://127.0.0.1:", f"REPLOG://{self.host}:").replace(
                "KAFKA://127.0.0.1:", f"KAFKA://{self.host}:"
            )
            if a.startswith("listeners=")
            else a
            for a in cmd[3:]
        ]
        return [*self.exec_prefix, cmd[0], "-m", "tests.chaos.launcher", *args]


class ChaosCluster:
    """Processes, proxies and storage controls of one schedule's cluster."""

    def __init__(
        self,
        data_dir: Path,
        brokers: int = 3,
        *,
        wal: bool = True,
        disk_mb: int | None = None,
        fake_clocks: bool = False,
        netns: bool = False,
        kafka: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir)
        names = [f"controller-{i}" for i in CONTROLLER_IDS] + [
            f"broker-{i}" for i in range(brokers)
        ]
        #: with ``netns``: every node in a network namespace of its own, behind a proxy, so
        #: ``net_partition`` and ``controller_isolated`` drop packets between them
        self.lab = NetworkLab(f"rc{uuid.uuid4().hex[:4]}", names, _free_subnet()) if netns else None
        #: with ``fake_clocks``: every node's wall clock, which ``clock_jump`` steps
        self.clocks: dict[str, FakeClock] = {}
        #: with ``netns``: each controller's proxy (brokers reach the controllers through it)
        self.controller_proxies: dict[int, TcpProxy] = {}
        self.controllers: dict[int, LaunchedBroker] = {}
        self.proxies: dict[int, TcpProxy] = {}
        #: with ``kafka``: each broker's Kafka listener's proxy
        self.kafka_proxies: dict[int, TcpProxy] = {}
        self.brokers: dict[int, LaunchedBroker] = {}
        #: with ``disk_mb``: each broker's log storage is on its own tmpfs of that size,
        #: mounted by :meth:`start` and unmounted by :meth:`close` (``disk_full`` fills it)
        self.disks: dict[int, TmpfsDisk] = {}
        self.paused: set[str] = set()
        self.storage_seq = 0
        try:
            self._make(brokers, wal, disk_mb, fake_clocks, kafka)
        except BaseException:
            self.close()
            raise

    def _make(
        self, brokers: int, wal: bool, disk_mb: int | None, fake_clocks: bool, kafka: bool
    ) -> None:
        self.metadata_root = (self.data_dir / "metadata").as_uri()
        #: brokers write through the broker WAL (log.wal.enable, the default); False: the
        #: per-partition layout
        self.wal = wal
        common = {
            **BROKER_SETTINGS,
            "metadata.log.dir": self.metadata_root,
            "log.wal.enable": str(wal).lower(),
            # On a disk of its own, each WAL flush is a new file, which a full disk refuses
            # (ENOSPC mid-flush); the journal writes flushes into space it took beforehand.
            **({"log.wal.journal.enable": "false"} if disk_mb is not None else {}),
            # Under a stepped clock, retention runs often enough to act within a step.
            **({"log.retention.check.interval.ms": "500"} if fake_clocks else {}),
        }
        python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        if fake_clocks:
            self.clocks = {
                name: FakeClock(self.data_dir / name / "faketime")
                for name in [f"controller-{i}" for i in CONTROLLER_IDS]
                + [f"broker-{i}" for i in range(brokers)]
            }
        if self.lab is not None:
            self.lab.create()
        for i in CONTROLLER_IDS:
            name = f"controller-{i}"
            proxy = self._proxy(name) if self.lab is not None else None
            if proxy is not None:
                self.controller_proxies[i] = proxy
            self.controllers[i] = LaunchedBroker(
                self.data_dir / name,
                broker_id=i,
                role="controller",
                overrides={**common, **({"advertised.listeners": proxy.address} if proxy else {})},
                env={"PYTHONPATH": python_path, **self._clock_env(name)},
                proxy=proxy,
                **self._network(name),
            )
        for i in range(brokers):
            # The target is set by each start of the broker (LaunchedBroker.start).
            proxy = self._proxy(f"broker-{i}")
            self.proxies[i] = proxy
            advertised = proxy.address
            if kafka:
                self.kafka_proxies[i] = self._proxy(f"broker-{i}")
                advertised += f",KAFKA://{self.kafka_proxies[i].address}"
            broker_dir = self.data_dir / f"broker-{i}"
            control = broker_dir / "storage-control.json"
            if disk_mb is not None:
                self.disks[i] = TmpfsDisk(broker_dir / "disk", disk_mb)
            broker = LaunchedBroker(
                broker_dir,
                broker_id=i,
                log_dir=self.disks[i].log_root.as_uri() if i in self.disks else None,
                overrides={
                    **common,
                    "process.roles": "broker",
                    "advertised.listeners": advertised,
                },
                env={
                    CONTROL_ENV: str(control),
                    "PYTHONPATH": python_path,
                    **self._clock_env(f"broker-{i}"),
                },
                proxy=proxy,
                kafka_proxy=self.kafka_proxies.get(i),
                **self._network(f"broker-{i}"),
            )
            write_control(control, broker.log_dir, 0, [])
            self.brokers[i] = broker

    def _proxy(self, name: str) -> TcpProxy:
        """A started proxy for node ``name`` (on the lab's bridge with ``netns``)."""
        if self.lab is None:
            return TcpProxy("127.0.0.1", 0, record=False).start()
        proxy = TcpProxy(self.lab.bridge_ip, 0, record=False, listen_host=self.lab.bridge_ip)
        self.lab.proxy_ports[name].add(proxy.start().port)
        return proxy

    def _network(self, name: str) -> dict[str, Any]:
        if self.lab is None:
            return {}
        return {"host": self.lab.ip(name), "exec_prefix": self.lab.exec_prefix(name)}

    def _clock_env(self, name: str) -> dict[str, str]:
        clock = self.clocks.get(name)
        return clock.env() if clock is not None else {}

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """Every broker's proxy: the only way clients reach the brokers."""
        return ",".join(p.address for p in self.proxies.values())

    @property
    def kafka_bootstrap(self) -> str:
        """Every broker's Kafka listener's proxy (a cluster made with ``kafka``)."""
        assert self.kafka_proxies, "this cluster has no Kafka listeners"
        return ",".join(p.address for p in self.kafka_proxies.values())

    def broker_proxies(self, broker: int) -> list[TcpProxy]:
        """The proxies in front of a broker: replog's listener's, and its Kafka listener's."""
        return [self.proxies[broker], *([self.kafka_proxies[broker]] if self.kafka_proxies else [])]

    def processes(self) -> dict[str, BrokerProcess]:
        return {
            **{f"controller-{i}": c for i, c in self.controllers.items()},
            **{f"broker-{i}": b for i, b in self.brokers.items()},
        }

    def start(self) -> ChaosCluster:
        for disk in self.disks.values():
            disk.mount()
        for controller in self.controllers.values():  # in order: the first one is active
            controller.start()
        with ThreadPoolExecutor(len(self.brokers)) as pool:
            for future in [pool.submit(b.start) for b in self.brokers.values()]:
                future.result()
        return self

    def pause(self, name: str) -> None:
        self.processes()[name].pause()
        self.paused.add(name)

    def resume(self, name: str) -> None:
        self.processes()[name].resume()
        self.paused.discard(name)

    def set_storage_faults(self, broker: int, faults: list[dict[str, Any]]) -> None:
        """Arm ``faults`` (see :mod:`tests.chaos.launcher`) on the broker's log storage."""
        self.storage_seq += 1
        proc = self.brokers[broker]
        control = Path(proc.env[CONTROL_ENV]) if proc.env else None
        assert control is not None
        write_control(control, proc.log_dir, self.storage_seq, faults)

    def wipe_store(self, broker: int) -> int:
        """Empty a (stopped) broker's log storage root, as a replaced disk would be: every
        replica, checkpoint and meta.properties goes. Returns how many files were removed."""
        assert not self.brokers[broker].alive, "wipe the store of a stopped broker only"
        root = Path(url2pathname(urlparse(self.brokers[broker].log_dir).path))
        files = sum(1 for p in root.rglob("*") if p.is_file()) if root.exists() else 0
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
        return files

    def heal(self) -> list[str]:
        """Resume every paused process, reopen every proxy, heal every storage and start every
        process that is down. Returns what could not be started (with its stderr tail)."""
        for name in sorted(self.paused):
            self.resume(name)
        for proxy in [*self.proxies.values(), *self.kafka_proxies.values()]:
            proxy.unblock()
            proxy.resume()
        for broker in self.brokers:
            self.set_storage_faults(broker, [])
        for disk in self.disks.values():
            disk.free()
        for clock in self.clocks.values():
            if clock.offset_s:
                clock.step_to(0)
        if self.lab is not None:
            self.lab.heal()
        failed: list[str] = []
        for name, proc in self.processes().items():
            if proc.alive:
                continue
            try:
                proc.start()
            except RuntimeError as err:
                failed.append(f"{name} did not start: {err}")
        return failed

    def active_controller(self) -> int | None:
        """The id of the controller holding the newest claim in the metadata store."""
        with Storage.from_url(self.metadata_root) as storage:
            claim = MetadataStore(storage).latest_claim()
        return None if claim is None else claim.controller_id

    def stop_all(self, limit_s: float) -> dict[str, float | None]:
        """SIGTERM every process (brokers first, all at once, then the controllers) and time
        each one's exit; one still running after ``limit_s`` is SIGKILLed and gets None, and so
        does one that exits with a failure (a node whose graceful shutdown overran
        shutdown.timeout.ms exits with status 1)."""

        def stop(proc: BrokerProcess) -> float | None:
            if not proc.alive or proc.proc is None:
                return 0.0
            start = time.monotonic()
            proc.proc.send_signal(signal.SIGTERM)
            try:
                proc.proc.wait(limit_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                return None
            if proc.proc.returncode != 0:
                return None
            return round(time.monotonic() - start, 2)

        out: dict[str, float | None] = {}
        for group in ("broker", "controller"):
            procs = {n: p for n, p in self.processes().items() if n.startswith(group)}
            with ThreadPoolExecutor(len(procs)) as pool:
                out.update(zip(procs, pool.map(stop, procs.values()), strict=True))
        return out

    def close(self) -> None:
        """Kill whatever still runs, stop the proxies, unmount the disks and remove the clock
        files (always safe to call)."""
        for name in sorted(self.paused):
            self.resume(name)
        for proc in self.processes().values():
            if proc.alive:
                proc.kill()
        for proxy in [
            *self.proxies.values(),
            *self.kafka_proxies.values(),
            *self.controller_proxies.values(),
        ]:
            proxy.stop()
        for disk in self.disks.values():
            disk.unmount()
        if self.lab is not None:
            self.lab.remove()
        for clock in self.clocks.values():
            clock.remove()

    # --- state ----------------------------------------------------------------------------

    def wait_registered(self, admin: Admin, deadline: float) -> None:
        """Wait until every broker is registered (in the metadata); RuntimeError at the
        deadline."""
        registered: set[int] = set()
        while time.monotonic() < deadline:
            try:
                registered = {b.node_id for b in admin.describe_cluster().brokers}
            except ReplogError:
                registered = set()
            if registered >= set(self.brokers):
                return
            time.sleep(0.1)
        raise RuntimeError(f"only brokers {sorted(registered)} registered by the deadline")

    @staticmethod
    def replica_sets(admin: Admin, topics: list[str]) -> dict[tuple[str, int], list[int]]:
        """The brokers holding a replica of each partition of ``topics``, per the metadata."""
        return {
            (topic, p.partition): sorted(p.replicas)
            for topic in topics
            for p in admin.describe_topic(topic).partitions
        }

    def wait_caught_up(self, admin: Admin, topics: list[str], deadline: float) -> list[str]:
        """Wait until every partition of ``topics`` has a leader, a full ISR, every replica
        at the leader's LEO with all of it durable and the HW there too, and (with
        read_committed) no open transaction. Returns what was still wrong at the deadline."""
        problems: list[str] = ["not checked yet"]
        while time.monotonic() < deadline:
            problems = []
            for topic in topics:
                problems += self._lagging(admin, topic)
            if not problems:
                return []
            time.sleep(0.25)
        return problems

    @staticmethod
    def _lagging(admin: Admin, topic: str) -> list[str]:
        try:
            status = describe_topic_status(admin, topic, timeout_ms=3000)
            tps = [TopicPartition(topic, p.partition) for p in status.partitions]
            lso = admin.list_offsets(
                dict.fromkeys(tps, "latest"), isolation_level="read_committed", timeout_ms=3000
            )
        except ReplogError as err:
            return [f"{topic}: {err}"]
        problems: list[str] = []
        for p in status.partitions:
            name = f"{topic}-{p.partition}"
            if p.leader < 0 or set(p.isr) != set(p.replicas):
                problems.append(f"{name}: leader {p.leader}, ISR {p.isr} of {p.replicas}")
                continue
            ends = {
                (r.log.log_end_offset, r.log.durable_end_offset, r.log.high_watermark)
                if r.log is not None
                else r.error
                for r in p.replica_states
            }
            if ends != {(p.log_end_offset,) * 3}:
                problems.append(f"{name}: replicas (LEO, durable end, HW) {sorted(map(str, ends))}")
            elif lso.get(TopicPartition(topic, p.partition)) != p.high_watermark:
                problems.append(f"{name}: a transaction is still open below HW {p.high_watermark}")
        return problems

    def replica_batches(
        self, broker: int, topic: str, partition: int, end: int
    ) -> list[StoredBatch] | str:
        """The batches a broker's replica stores below ``end``, read from its storage (no
        recovery, no write), or why they could not be read."""
        try:
            with Storage.from_url(self.brokers[broker].log_dir, fsync=False) as root:
                if self.wal:
                    # segments and WAL chunks, by the recovery walk, changing nothing
                    plog = open_replica_log(root, topic, partition, read_only=True)
                    found = []
                    offset = plog.log_start_offset
                    while offset < end:
                        batches = list(
                            iter_batches(plog.read(offset, 1 << 20, max_offset=end), validate=True)
                        )
                        if not batches:
                            break
                        found.extend(batches)
                        offset = batches[-1].next_offset
                else:
                    reader = SegmentReader(root.child(f"{topic}/{partition}"))
                    found = list(reader.batches(0, end))
                return [
                    StoredBatch(b.base_offset, b.last_offset, b.partition_leader_epoch, b.crc)
                    for b in found
                ]
        except ReplogError as err:
            return f"{type(err).__name__}: {err}"
