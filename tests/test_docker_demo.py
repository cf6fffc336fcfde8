"""The Docker demo run for real: docker-compose.yml with docker-compose.local-s3.yml (moto's S3
server in place of MinIO, no Prometheus or Grafana: no image can be pulled here) on images
built here (docker/build-images.sh: a debootstrap base when missing, the project's image, the
S3 server's), on a Docker engine (docker/start-engine.sh starts dockerd when none answers).

One test, in order: the topology comes up; the producer service's records all arrive in the
Spark job's output, each exactly once (read_committed, from the host through the brokers'
published Kafka ports, with confluent-kafka); the Spark job's executors read the brokers'
objects on S3 directly (moto's request log shows their reads from the job's container); a
broker container is SIGKILLed and records produced after it all arrive, each exactly once.
``down -v`` runs at the end whatever happens.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from tests.helpers import free_port, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parent.parent
FILES = ["-f", str(ROOT / "docker-compose.yml"), "-f", str(ROOT / "docker-compose.local-s3.yml")]
#: what the producer service sends (REPLOG_DEMO_RECORDS), then the host after the SIGKILL
RECORDS = 1000
AFTER_KILL = 500
#: from the producer's end to the last output record: the Spark job's start (a JVM and the
#: first streaming query, a minute or two on a busy 2-core machine) and a few micro-batches.
#: The demo once took 4 minutes here (its executors had no S3 credentials).
FIRST_OUTPUT_TIMEOUT = 300


def run(args: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def engine() -> Iterator[None]:
    """A Docker engine: the one running, or dockerd started here (and stopped at the end)."""
    if shutil.which("docker") is None or shutil.which("docker-compose") is None:
        pytest.skip("docker or docker-compose is not installed (CI installs Debian's docker.io)")
    answers = subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0
    if not answers and os.geteuid() != 0:
        pytest.skip("no Docker engine answers, and only root can start dockerd")
    out = run([str(ROOT / "docker" / "start-engine.sh")], timeout=120).strip()
    yield
    if out:  # started here: stop it
        pid = int(out)
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=60, message="dockerd gone")


@pytest.fixture(scope="module")
def images(engine: None) -> None:
    # a fresh machine builds everything (about 5 minutes); then Docker's layer cache
    run([str(ROOT / "docker" / "build-images.sh")], timeout=1200)


class Topology:
    def __init__(self) -> None:
        self.project = f"replogdemo{uuid.uuid4().hex[:8]}"
        self.kafka_ports = [free_port() for _ in range(3)]
        self.env = {
            **os.environ,
            "REPLOG_PUBLISH_IP": "127.0.0.1",
            "REPLOG_DEMO_RECORDS": str(RECORDS),
            # only the Kafka ports are fixed (each broker advertises its own to clients)
            **{f"REPLOG_KAFKA_PORT_{i}": str(p) for i, p in enumerate(self.kafka_ports)},
            # the others ephemeral (an empty host port)
            **{f"REPLOG_PORT_{i}": "" for i in range(3)},
            "REPLOG_CONTROLLER_PORT": "",
            "REPLOG_S3_PORT": "",
            "REPLOG_S3_CONSOLE_PORT": "",
        }

    def compose(self, *args: str, timeout: float = 300) -> str:
        return run(["docker-compose", "-p", self.project, *FILES, *args], timeout, self.env)

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service, timeout=60).strip()

    def state(self, service: str) -> dict[str, object]:
        out = run(["docker", "inspect", "-f", "{{json .State}}", self.container(service)], 60)
        state = json.loads(out)
        assert isinstance(state, dict)
        return state

    def logs(self, service: str) -> str:
        return run(["docker", "logs", self.container(service)], 60)

    def logs_all(self, service: str) -> str:
        result = subprocess.run(
            ["docker", "logs", self.container(service)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return result.stdout + result.stderr

    def bootstrap(self, brokers: list[int] | None = None) -> str:
        chosen = range(3) if brokers is None else brokers
        return ",".join(f"localhost:{self.kafka_ports[i]}" for i in chosen)


@pytest.fixture
def topology(images: None) -> Iterator[Topology]:
    topo = Topology()
    try:
        for attempt in range(3):
            try:
                topo.compose("up", "-d", timeout=600)
                break
            except AssertionError as err:
                # a chosen Kafka port taken meanwhile by another test: new ports, again
                if attempt == 2 or "already" not in str(err):
                    raise
                topo.compose("down", "-v", "--remove-orphans", timeout=300)
                topo.__init__()  # type: ignore[misc]
        yield topo
    finally:
        logs = subprocess.run(
            ["docker-compose", "-p", topo.project, *FILES, "logs", "--no-color", "--tail", "40"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
            env=topo.env,
        )
        print(logs.stdout[-20000:])  # shown if the test failed
        subprocess.run(
            ["docker-compose", "-p", topo.project, *FILES, "down", "-v", "--remove-orphans"],
            capture_output=True,
            timeout=300,
            cwd=ROOT,
            env=topo.env,
        )


def value(number: int) -> bytes:
    return f"event-{number:06d}".encode()


def read_committed(bootstrap: str, topic: str, timeout: float = 60) -> Counter[bytes]:
    """Every committed value of ``topic``, counted, up to the ends when the read starts."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        partitions = list(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in partitions
        }
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        values: Counter[bytes] = Counter()
        deadline = time.monotonic() + timeout

        def behind() -> list[int]:
            # an empty partition is read; a position before any fetch is negative
            wanted = [TopicPartition(topic, p) for p in partitions if ends[p] > 0]
            positions = consumer.position(wanted) if wanted else []
            return [tp.partition for tp in positions if tp.offset < ends[tp.partition]]

        while behind():
            assert time.monotonic() < deadline, f"{topic}: not read to {ends} in {timeout}s"
            for message in consumer.consume(1000, 0.5):
                data = message.value() if message.error() is None else None
                if data is not None:
                    values[data] += 1
        return values
    finally:
        consumer.close()


def arrived(bootstrap: str, topic: str, expected: set[bytes]) -> bool:
    try:
        return expected <= set(read_committed(bootstrap, topic))
    except KafkaException:  # a broker just killed, a topic not there yet: ask again
        return False


def test_the_pipeline_delivers_every_record_exactly_once_and_survives_a_sigkilled_broker(
    topology: Topology,
) -> None:
    # the producer service sends its records and exits with 0
    def producer_done() -> bool:
        state = topology.state("producer")
        assert state["Status"] != "exited" or state["ExitCode"] == 0, topology.logs_all("producer")
        return state["Status"] == "exited"

    wait_until(producer_done, timeout=300, interval=1, message="the producer service's exit")
    produced = time.monotonic()
    assert f"{RECORDS} sent now" in topology.logs("producer")
    bootstrap = topology.bootstrap()
    assert read_committed(bootstrap, "events") == Counter(value(n) for n in range(1, RECORDS + 1))

    # every record through the Spark job, once
    first = {value(n).upper() for n in range(1, RECORDS + 1)}
    wait_until(
        lambda: arrived(bootstrap, "events-upper", first),
        timeout=FIRST_OUTPUT_TIMEOUT,
        interval=2,
        message=f"the {RECORDS} events in events-upper",
    )
    print(
        f"{RECORDS} records through the pipeline {time.monotonic() - produced:.0f}s after the "
        "producer's end"
    )
    assert read_committed(bootstrap, "events-upper") == Counter(first)

    # the executors read the brokers' objects on S3 themselves: moto logs each request with
    # the client's address, and the Spark job's container read WAL or segment objects
    network = topology.state("spark-job")  # still running
    assert network["Status"] == "running"
    address = run(
        [
            "docker",
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            topology.container("spark-job"),
        ],
        60,
    ).strip()
    reads = [
        line
        for line in topology.logs_all("s3").splitlines()
        if line.startswith(f"{address} ")
        and re.search(r'"[^"]*GET /replog-broker-\d/data/\S+ HTTP/1.1\S*" 20[06]', line)
    ]
    assert reads, f"the Spark job ({address}) read no broker object from S3"
    assert "through the brokers" not in topology.logs_all("spark-job")

    # SIGKILL a broker; the pipeline goes on
    run(["docker", "kill", "-s", "KILL", topology.container("broker-1")], 60)
    wait_until(
        lambda: topology.state("broker-1")["Status"] == "exited",
        timeout=60,
        message="broker-1 dead",
    )
    alive = topology.bootstrap([0, 2])
    producer = Producer({"bootstrap.servers": alive, "enable.idempotence": True, "acks": "all"})
    for number in range(RECORDS + 1, RECORDS + AFTER_KILL + 1):
        producer.produce("events", value=value(number), key=str(number).encode())
    assert producer.flush(120) == 0, "records not acknowledged after the SIGKILL"
    everything = {value(n).upper() for n in range(1, RECORDS + AFTER_KILL + 1)}
    wait_until(
        lambda: arrived(alive, "events-upper", everything),
        timeout=FIRST_OUTPUT_TIMEOUT,
        interval=2,
        message="the records produced after the SIGKILL in events-upper",
    )
    assert read_committed(alive, "events-upper") == Counter(everything)
    assert topology.state("spark-job")["Status"] == "running"
