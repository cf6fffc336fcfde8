"""Real broker processes on 127.0.0.1 for tests: start, stop (SIGTERM), kill (SIGKILL), restart.

    broker = BrokerProcess(tmp_path / "b0")
    broker.start()
    ... Producer(bootstrap_servers=broker.bootstrap) ...
    broker.kill(); broker.start()   # same port, same storage

Fixtures: ``broker`` (one broker per test module, shared; use unique topic names) and
``broker_factory`` (fresh brokers for tests that kill or restart them).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replication.server.node import KAFKA_READY_LINE, METRICS_READY_LINE, READY_LINE
from tests.helpers import wait_until as wait_until  # re-exported: tests import it from here

START_TIMEOUT_S = 60
_READY_PREFIX = READY_LINE.split("{", 1)[0]
_KAFKA_READY_PREFIX = KAFKA_READY_LINE.split("{", 1)[0]
_METRICS_READY_PREFIX = METRICS_READY_LINE.split("{", 1)[0]


class BrokerProcess:
    def __init__(
        self,
        data_dir: Path,
        *,
        broker_id: int = 0,
        port: int = 0,
        log_dir: str | None = None,
        overrides: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        role: str = "broker",
        kafka: bool = False,
        metrics: bool = False,
        client: dict[str, str] | None = None,
    ) -> None:
        #: the client settings that reach this broker (security.protocol, ssl.*, sasl.*;
        #: tests/security_env.py): ``Producer({**broker.client, ...})``
        self.client: dict[str, Any] = dict(client or {})
        self.role = role
        #: whether the node serves Prometheus metrics (its port is kept across restarts)
        self.metrics = metrics
        self.metrics_port = 0
        #: whether the broker has a Kafka listener (its port is kept across restarts)
        self.kafka = kafka
        self.kafka_port = 0
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.broker_id = broker_id
        self.port = port
        self.log_dir = log_dir or (self.data_dir / "logs").as_uri()
        self.overrides = dict(overrides or {})
        self.env = env
        self.proc: subprocess.Popen[str] | None = None
        #: SIGSTOPped by :meth:`pause` (and not resumed): it accepts connections, as the
        #: kernel does for a stopped process, but answers nothing
        self.paused = False
        self.stderr_path = self.data_dir / "broker.stderr"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def kafka_bootstrap(self) -> str:
        assert self.kafka, "this broker has no Kafka listener"
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def metrics_url(self) -> str:
        assert self.metrics, "this node has no metrics endpoint"
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def command(self) -> list[str]:
        settings = {
            "broker.id": str(self.broker_id),
            "listeners": f"REPLOG://127.0.0.1:{self.port}"
            + (f",KAFKA://127.0.0.1:{self.kafka_port}" if self.kafka else ""),
            "log.dir": self.log_dir,
            **({"metrics.port": str(self.metrics_port)} if self.metrics else {}),
            **self.overrides,
        }
        cmd = [sys.executable, "-m", "replication.tools.cli", self.role, "start"]
        for key, value in settings.items():
            cmd += ["--set", f"{key}={value}"]
        return cmd

    def start(self) -> BrokerProcess:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        stderr = open(self.stderr_path, "a")  # noqa: SIM115 - owned by the process
        env = {**os.environ, **(self.env or {})}
        self.paused = False
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.PIPE, stderr=stderr, text=True, env=env
        )
        stderr.close()
        line = _read_line_with_timeout(self.proc, START_TIMEOUT_S)
        while line.startswith((_KAFKA_READY_PREFIX, _METRICS_READY_PREFIX)):
            port = int(line.strip().rsplit(":", 1)[1])
            if line.startswith(_KAFKA_READY_PREFIX):
                self.kafka_port = port
            else:
                self.metrics_port = port
            line = _read_line_with_timeout(self.proc, START_TIMEOUT_S)
        if not line.startswith(_READY_PREFIX):
            self.proc.kill()
            self.proc.wait()
            self._close_pipe()
            raise RuntimeError(
                f"broker {self.broker_id} did not start: {line!r}\n{self.stderr_tail()}"
            )
        self.port = int(line.strip().rsplit(":", 1)[1])
        self._close_pipe()  # the broker prints nothing after its ready line
        return self

    def _close_pipe(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def stderr_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.stderr_path.read_text().splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait: a graceful shutdown."""
        return self._signal(signal.SIGTERM, timeout)

    def kill(self) -> int:
        """SIGKILL: the process dies at once, with whatever was not flushed."""
        return self._signal(signal.SIGKILL, 30)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def _signal(self, sig: int, timeout: float) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def answering(self) -> bool:
        """Running and not paused (a paused broker would hold each request until its
        timeout)."""
        return self.alive and not self.paused


def _read_line_with_timeout(proc: subprocess.Popen[str], timeout: float) -> str:
    out: list[str] = []

    def reader() -> None:
        assert proc.stdout is not None
        out.append(proc.stdout.readline())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    thread.join(timeout)
    return out[0] if out else ""


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker shared by a test module (use unique topic names per test)."""
    proc = BrokerProcess(tmp_path_factory.mktemp("broker"))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[object]:
    """``broker_factory(**kwargs)`` starts a fresh broker; all are stopped after the test."""
    started: list[BrokerProcess] = []

    def make(**kwargs: object) -> BrokerProcess:
        proc = BrokerProcess(tmp_path / f"broker{len(started)}", **kwargs)  # type: ignore[arg-type]
        started.append(proc)
        return proc.start()

    yield make
    for proc in started:
        proc.kill()


#: timings that keep failover tests short (Kafka's defaults are tuned for production)
FAST_FAILOVER = {
    "broker.heartbeat.interval.ms": "200",
    "broker.session.timeout.ms": "2000",
    "replica.lag.time.max.ms": "3000",
    "replica.fetch.wait.max.ms": "200",
    "replica.fetch.backoff.ms": "100",
}


class Cluster:
    """A controller and N brokers as processes on 127.0.0.1, each broker on its own storage
    root, all sharing one metadata root."""

    def __init__(
        self,
        data_dir: Path,
        brokers: int = 3,
        *,
        overrides: dict[str, str] | None = None,
        broker_log_dirs: dict[int, str] | None = None,
        env: dict[str, str] | None = None,
        kafka: bool = False,
        metrics: bool = False,
        client: dict[str, str] | None = None,
    ) -> None:
        #: client settings for this cluster's listeners (security ones: tests/security_env.py)
        self.client: dict[str, Any] = dict(client or {})
        self.data_dir = Path(data_dir)
        self.metadata_root = (self.data_dir / "metadata").as_uri()
        common = {**FAST_FAILOVER, "metadata.log.dir": self.metadata_root, **(overrides or {})}
        self.controller = BrokerProcess(
            self.data_dir / "controller",
            broker_id=100,
            role="controller",
            overrides=common,
            env=env,
            metrics=metrics,
        )
        self.brokers = {
            i: BrokerProcess(
                self.data_dir / f"broker-{i}",
                broker_id=i,
                log_dir=(broker_log_dirs or {}).get(i),
                overrides=common,
                env=env,
                kafka=kafka,
                metrics=metrics,
                client=client,
            )
            for i in range(brokers)
        }

    @property
    def bootstrap(self) -> str:
        """The brokers that answer (a test that means to reach a paused one uses its own)."""
        return ",".join(b.bootstrap for b in self.brokers.values() if b.answering)

    def start(self) -> Cluster:
        self.controller.start()
        for broker in self.brokers.values():
            broker.start()
        return self

    @property
    def kafka_bootstrap(self) -> str:
        """The Kafka listeners of the brokers that answer (a cluster made with kafka=True)."""
        return ",".join(b.kafka_bootstrap for b in self.brokers.values() if b.answering)

    def broker_by_port(self, port: int) -> BrokerProcess:
        return next(b for b in self.brokers.values() if b.port == port)

    def stop(self) -> None:
        for proc in [*self.brokers.values(), self.controller]:
            if proc.alive:
                proc.kill()


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[object]:
    """``cluster_factory(brokers=3, overrides=...)`` starts a cluster; killed after the test."""
    started: list[Cluster] = []

    def make(**kwargs: object) -> Cluster:
        cluster = Cluster(tmp_path / f"cluster{len(started)}", **kwargs)  # type: ignore[arg-type]
        started.append(cluster)
        return cluster.start()

    yield make
    for cluster in started:
        cluster.stop()
