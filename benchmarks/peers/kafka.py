"""The measured peer: an Apache Kafka 4.4.0 KRaft cluster on 127.0.0.1, as plain JVM processes.

Why Kafka: replog has Kafka's semantics and speaks its protocol, so users judge it against
exactly this. The jars come from Maven Central through tests/maven.py (``maven.classpath
("kafka")``: kafka_2.13, kafka-tools and their dependencies); nothing is installed by hand.

The topology is replog's own in tests.cluster.Cluster: one dedicated KRaft controller
(``process.roles=controller``, a static ``controller.quorum.voters`` of one) and N brokers
(``process.roles=broker``), so a SIGKILL of a broker never takes the controller with it, on
both sides. Each node is one ``java -cp ... kafka.Kafka server.properties`` process with a small
heap (controller -Xmx256m, brokers -Xmx512m -Xms256m) and its ``log.dirs`` under the directory
given (the same disk as replog's data in a benchmark). Storage is formatted first with
``kafka.tools.StorageTool format`` (the ``kafka-storage`` script's main class), one JVM per node
run side by side, with a cluster id made as Kafka's ``Uuid.randomUuid`` makes one.

    with KafkaCluster(tmp / "kafka", brokers=3) as kafka:
        Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all"})
        kafka.kill(kafka.broker_ids[0])   # SIGKILL, for failover
        kafka.pids                        # the brokers' pids, for CPU accounting

Logging: the broker's slf4j binding here is reload4j (slf4j-api 1.7 with slf4j-reload4j, as
Kafka's own scripts ship), so a small ``log4j.properties`` at WARN goes to
``-Dlog4j.configuration``; a log4j2 file at WARN goes to ``-Dlog4j2.configurationFile`` as
well, for the classes that log through log4j2 directly. Each node's stdout and stderr go to
``<node>/server.log``; :meth:`KafkaCluster.log_tail` reads it.

Durability (:data:`HONESTY_NOTE`, to print with every figure): Kafka's acks=all answers once
every ISR member has *fetched* the batch into its page cache; it does not fsync per write by
default (``log.flush.interval.messages`` is Long.MAX_VALUE: the OS flushes, Kafka relies on
replication). replog's acks=all answers once every ISR member has written the batch to its
store with fsync. ``KafkaCluster(flush_every_message=True)`` sets
``log.flush.interval.messages=1`` (an fsync per append on every replica), the nearest Kafka
setting to replog's contract.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests import maven

HONESTY_NOTE = (
    "Kafka's acks=all answers once every ISR member has fetched the batch (page cache); by"
    " default it never fsyncs per write (log.flush.interval.messages=Long.MAX_VALUE, the OS"
    " flushes). replog's acks=all answers once every ISR member has written the batch to its"
    " store with fsync. The kafka_flush_every_message row sets log.flush.interval.messages=1"
    " (fsync per append on every replica). Same machine, same disk, same clients, same run."
)

#: the heaps: small, since everything shares a 2-core machine with other work
CONTROLLER_HEAP = ["-Xmx256m", "-Xms128m"]
BROKER_HEAP = ["-Xmx512m", "-Xms256m"]
#: Kafka's scripts' JVM flags (kafka-run-class.sh), less the GC log
JVM_FLAGS = [
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
]
START_TIMEOUT_S = 120
FORMAT_TIMEOUT_S = 120
CONTROLLER_ID = 100

_LOG4J = """log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaRaftServer=INFO
"""
_LOG4J2 = """Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
"""


class KafkaUnavailableError(RuntimeError):
    """Java or the Kafka jars are missing, or a node did not start (the message says which)."""


def java() -> str:
    """The ``java`` binary (JAVA_HOME's, else PATH's), or :class:`KafkaUnavailableError`."""
    home = os.environ.get("JAVA_HOME")
    candidate = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not candidate or not os.access(candidate, os.X_OK):
        raise KafkaUnavailableError(
            "java is not installed: Apache Kafka runs on a JVM"
            " (apt-get install openjdk-17-jre-headless, or set JAVA_HOME)"
        )
    return candidate


def kafka_classpath() -> str:
    """Kafka's jars as a ``-cp`` value, fetched with mvn the first time."""
    try:
        return maven.classpath("kafka")
    except maven.MavenUnavailableError as e:
        raise KafkaUnavailableError(f"Apache Kafka's jars are not available: {e}") from e


def random_uuid() -> str:
    """A Kafka Uuid string (url-safe base64 of 16 bytes, no padding), as ``kafka-storage
    random-uuid`` prints; like Kafka's, never one that starts with '-' (it reads as an option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc/<pid>/stat utime + stime)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class KafkaNode:
    """One Kafka process: the controller or a broker, its properties, directory and log."""

    def __init__(self, node_id: int, work: Path, properties: dict[str, str], heap: list[str]):
        self.node_id = node_id
        self.work = work
        self.properties = properties
        self.heap = heap
        self.proc: subprocess.Popen[bytes] | None = None
        #: ``-cp``: set by the cluster at start (fetching the jars may take minutes)
        self.classpath = ""
        #: how many times this node was started (its log says "Kafka Server started" as often)
        self.starts = 0
        self.config_path = work / "server.properties"
        self.log_path = work / "server.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"node {self.node_id} was never started"
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def write_config(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(
            "".join(f"{key}={value}\n" for key, value in self.properties.items())
        )

    def jvm(self, main: str, *args: str, flags: list[str] | None = None) -> list[str]:
        """``java`` with ``flags`` (default: this node's heap and Kafka's server flags)."""
        logging = [
            f"-Dlog4j.configuration=file:{self.work.parent / 'log4j.properties'}",
            f"-Dlog4j2.configurationFile={self.work.parent / 'log4j2.yaml'}",
            f"-Dkafka.logs.dir={self.work / 'logs'}",
        ]
        jvm_flags = [*self.heap, *JVM_FLAGS] if flags is None else flags
        return [java(), *jvm_flags, *logging, "-cp", self.classpath, main, *args]

    def start(self) -> None:
        assert not self.alive, f"node {self.node_id} is already running"
        self.starts += 1
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.jvm("kafka.Kafka", str(self.config_path)),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def signal(self, sig: int, timeout: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    @property
    def started(self) -> bool:
        """The process's latest start has logged KafkaRaftServer's "Kafka Server started"."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return False
        return self.alive and text.count("Kafka Server started") >= self.starts


class KafkaCluster:
    """A KRaft controller and ``brokers`` Kafka brokers on 127.0.0.1 (see the module).

    Parameters
    ----------
    work : Path
        Where every node keeps its config, log and ``log.dirs`` (created if missing).
    brokers : int
        How many brokers; their ``node.id`` s are 0..brokers-1 (replog's broker ids), the
        controller's is 100.
    overrides : dict
        Broker properties over the defaults here (Kafka's names, e.g.
        ``{"broker.session.timeout.ms": "2000"}``).
    flush_every_message : bool
        ``log.flush.interval.messages=1``: every replica fsyncs each append.

    Examples
    --------
    >>> with KafkaCluster(Path(tmp), brokers=3) as kafka:  # doctest: +SKIP
    ...     admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    """

    def __init__(
        self,
        work: Path,
        brokers: int = 3,
        *,
        overrides: dict[str, str] | None = None,
        flush_every_message: bool = False,
    ) -> None:
        self.work = Path(work)
        self.cluster_id = random_uuid()
        self.flush_every_message = flush_every_message
        #: how long :meth:`start` took to format the storage and to start every node
        self.timings: dict[str, float] = {}
        controller_port = free_port()
        voters = f"{CONTROLLER_ID}@127.0.0.1:{controller_port}"
        self.controller = KafkaNode(
            CONTROLLER_ID,
            self.work / "controller",
            {
                "process.roles": "controller",
                "node.id": str(CONTROLLER_ID),
                "controller.quorum.voters": voters,
                "listeners": f"CONTROLLER://127.0.0.1:{controller_port}",
                "controller.listener.names": "CONTROLLER",
                "listener.security.protocol.map": "CONTROLLER:PLAINTEXT",
                "log.dirs": str(self.work / "controller" / "data"),
                # topic defaults are the controller's in KRaft (a broker's are ignored in 5.0)
                "default.replication.factor": str(min(3, brokers)),
                # the controller fences a broker after broker.session.timeout.ms without heartbeats
                **{k: v for k, v in (overrides or {}).items() if k.startswith("broker.")},
            },
            CONTROLLER_HEAP,
        )
        self.brokers: dict[int, KafkaNode] = {}
        for node_id in range(brokers):
            port = free_port()
            properties = {
                "process.roles": "broker",
                "node.id": str(node_id),
                "controller.quorum.voters": voters,
                "controller.listener.names": "CONTROLLER",
                "listeners": f"PLAINTEXT://127.0.0.1:{port}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
                "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                "log.dirs": str(self.work / f"broker-{node_id}" / "data"),
                # internal topics replicated as the data topics are (Kafka's defaults are
                # 3 and 2; said here so a smaller cluster still starts)
                "offsets.topic.replication.factor": str(min(3, brokers)),
                "transaction.state.log.replication.factor": str(min(3, brokers)),
                "transaction.state.log.min.isr": str(min(2, brokers)),
                "group.initial.rebalance.delay.ms": "0",
                "auto.create.topics.enable": "false",
            }
            if flush_every_message:
                properties["log.flush.interval.messages"] = "1"
            properties.update(overrides or {})
            self.brokers[node_id] = KafkaNode(
                node_id, self.work / f"broker-{node_id}", properties, BROKER_HEAP
            )

    # --- what users of the cluster read ------------------------------------------------

    @property
    def broker_ids(self) -> list[int]:
        return list(self.brokers)

    def broker_bootstrap(self, node_id: int) -> str:
        return self.brokers[node_id].properties["listeners"].split("//", 1)[1]

    @property
    def bootstrap(self) -> str:
        """``host:port,...`` of the brokers that are running."""
        return ",".join(self.broker_bootstrap(i) for i, b in self.brokers.items() if b.alive)

    @property
    def pids(self) -> list[int]:
        """The running brokers' pids (the controller's is :attr:`controller_pid`)."""
        return [b.pid for b in self.brokers.values() if b.alive]

    @property
    def controller_pid(self) -> int:
        return self.controller.pid

    def brokers_cpu_seconds(self) -> float:
        """utime + stime of the running brokers so far."""
        return sum(cpu_seconds(pid) for pid in self.pids)

    def log_tail(self, node_id: int, lines: int = 40) -> str:
        node = self.controller if node_id == CONTROLLER_ID else self.brokers[node_id]
        return node.log_tail(lines)

    # --- life cycle --------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT_S) -> KafkaCluster:
        java()
        classpath = kafka_classpath()
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "log4j.properties").write_text(_LOG4J)
        (self.work / "log4j2.yaml").write_text(_LOG4J2)
        nodes = [self.controller, *self.brokers.values()]
        for node in nodes:
            node.classpath = classpath
            node.write_config()
        began = time.monotonic()
        self._format(nodes)
        formatted = time.monotonic()
        try:
            for node in nodes:
                node.start()
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self.timings = {
            "format_s": round(formatted - began, 1),
            "start_s": round(time.monotonic() - formatted, 1),
        }
        return self

    def _format(self, nodes: list[KafkaNode]) -> None:
        """``kafka-storage format -t <cluster id> -c server.properties`` for every node, at
        once (a JVM each; static voters, so no --standalone)."""
        running = []
        for node in nodes:
            command = node.jvm(
                "kafka.tools.StorageTool",
                "format",
                "--cluster-id",
                self.cluster_id,
                "--config",
                str(node.config_path),
                "--ignore-formatted",
                # a short-lived tool: C1 only and the serial GC spend the least CPU
                flags=["-Xmx128m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"],
            )
            running.append(
                (node, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
            )
        failed = []
        for node, proc in running:
            try:
                output, _ = proc.communicate(timeout=FORMAT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                output, _ = proc.communicate()
            if proc.returncode != 0:
                failed.append(f"node {node.node_id}: {output.decode(errors='replace')[-2000:]}")
        if failed:
            raise KafkaUnavailableError("kafka-storage format failed:\n" + "\n".join(failed))

    def _wait_ready(self, timeout: float) -> None:
        """Until every broker logs that it started (KafkaRaftServer's INFO line, the one
        logger left at INFO) and the controller has registered them all (an AdminClient's
        view of the cluster lists every broker)."""
        deadline = time.monotonic() + timeout
        for node in self.brokers.values():
            while not node.started:
                self._check_alive(deadline, f"broker {node.node_id} to start")
                time.sleep(0.1)
        while len(self.registered_brokers()) < len(self.brokers):
            self._check_alive(deadline, "every broker to register with the controller")
            time.sleep(0.2)

    def _check_alive(self, deadline: float, waiting_for: str) -> None:
        for node in [self.controller, *self.brokers.values()]:
            if not node.alive:
                raise KafkaUnavailableError(
                    f"Kafka node {node.node_id} exited (code {node.proc and node.proc.returncode})"
                    f" while waiting for {waiting_for}; its log {node.log_path}:\n"
                    + node.log_tail()
                )
        if time.monotonic() > deadline:
            raise KafkaUnavailableError(
                f"timed out waiting for {waiting_for}; logs under {self.work}"
            )

    def registered_brokers(self) -> list[int]:
        """The broker ids a metadata request to the running brokers lists (confluent-kafka)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 2000})
        try:
            metadata = admin.list_topics(timeout=2)
        except KafkaException:  # not up yet: the caller polls until a deadline
            return []
        return sorted(metadata.brokers)

    def kill(self, node_id: int) -> None:
        """SIGKILL broker ``node_id``: it dies at once, with whatever it had not flushed."""
        self.brokers[node_id].signal(signal.SIGKILL)

    def restart(self, node_id: int, timeout: float = START_TIMEOUT_S) -> None:
        """Start a stopped or killed broker again on its port and data."""
        node = self.brokers[node_id]
        node.start()
        deadline = time.monotonic() + timeout
        while not node.started:
            self._check_alive(deadline, f"broker {node_id} to start again")
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM every node (brokers first, then the controller), SIGKILL what lingers."""
        for node in self.brokers.values():
            if node.alive:
                assert node.proc is not None
                node.proc.send_signal(signal.SIGTERM)
        for node in self.brokers.values():
            node.signal(signal.SIGTERM, timeout=20)
        self.controller.signal(signal.SIGTERM, timeout=20)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def describe(cluster: KafkaCluster) -> dict[str, Any]:
    """What to print beside Kafka's figures: version, topology, heaps and durability."""
    return {
        "version": maven.KAFKA_VERSION,
        "topology": f"1 KRaft controller + {len(cluster.brokers)} brokers (JVM processes)",
        "controller_heap": " ".join(CONTROLLER_HEAP),
        "broker_heap": " ".join(BROKER_HEAP),
        "log_flush_interval_messages": 1 if cluster.flush_every_message else "default (Long.MAX)",
        "honesty_note": HONESTY_NOTE,
    }
