"""``replog cluster up|status|down``: a controller and N brokers as processes on 127.0.0.1.

Each broker gets its own storage root under the data location (``<data>/broker-<id>``), the
cluster metadata lives in ``<data>/metadata``; the data location may be a directory or a URL
(``s3://bucket/prefix``). Process state (pids, ports, log files) is kept in a local run
directory: the data directory itself, or ``./.replog-cluster`` for a URL.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from logstore.errors import ConfigError, ReplogError
from logstore.storage import Storage
from replication import protocol as p
from replication.metadata.store import MetadataStore
from replication.server.node import KAFKA_READY_LINE, METRICS_READY_LINE, READY_LINE
from replication.tools import secure_cluster

STATE_FILE = "cluster.json"
#: processes this process started, so stop_nodes can reap them (no zombies, no warnings)
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
CONTROLLER_ID = 1000
START_TIMEOUT_S = 60


class ClusterError(ReplogError):
    """The local cluster could not be started, found or stopped."""


@dataclass(frozen=True)
class NodeProcess:
    role: str
    node_id: int
    port: int
    pid: int
    log_file: str
    #: the broker's Kafka listener (0: none)
    kafka_port: int = 0
    #: the node's Prometheus endpoint, http://127.0.0.1:PORT/metrics (0: none)
    metrics_port: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass(frozen=True)
class ClusterLayout:
    data: str
    run_dir: Path

    @classmethod
    def of(cls, data: str) -> ClusterLayout:
        if "://" in data and not data.startswith("file://"):
            return cls(data.rstrip("/"), Path(".replog-cluster").resolve())
        path = Path(data.removeprefix("file://")).resolve()
        return cls(path.as_uri(), path)

    @property
    def metadata_root(self) -> str:
        return f"{self.data}/metadata"

    def broker_root(self, broker_id: int) -> str:
        return f"{self.data}/broker-{broker_id}"

    @property
    def state_path(self) -> Path:
        return self.run_dir / STATE_FILE

    def read_state(self) -> list[NodeProcess]:
        try:
            doc = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            raise ClusterError(
                f"no cluster was started with --data {self.data} (no {self.state_path}); a "
                "cluster started with another --data is found by giving the same --data "
                "(default: replog-data, in the current directory); start one with "
                "`replog cluster up [--data DIR]`"
            ) from None
        return [NodeProcess(**n) for n in doc["nodes"]]

    def write_state(self, nodes: list[NodeProcess]) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.state_path.write_text(
            json.dumps({"data": self.data, "nodes": [asdict(n) for n in nodes]}, indent=2)
        )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie is dead
    except OSError:
        return True


def port_answers(port: int, timeout: float = 1.0, tls: ssl.SSLContext | None = None) -> bool:
    """True if an ApiVersions request on 127.0.0.1:port gets an answer (over TLS with
    ``tls``: ApiVersions is answered before SASL authentication)."""
    header = p.RequestHeader(
        api_key=p.ApiKey.API_VERSIONS, api_version=0, correlation_id=1, client_id="status"
    )
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
            sock = raw if tls is None else tls.wrap_socket(raw, server_hostname="127.0.0.1")
            with sock:
                sock.sendall(p.encode_request(header, p.ApiVersionsRequest()))
                return len(sock.recv(4)) == 4
    except OSError:
        return False


def _wait_ready(proc: subprocess.Popen[bytes], log_file: Path, what: str) -> tuple[int, int, int]:
    """(port, Kafka listener port or 0, metrics port or 0) once the node printed its ready
    line."""
    deadline = time.monotonic() + START_TIMEOUT_S
    prefix = READY_LINE.split("{", 1)[0]
    kafka_prefix = KAFKA_READY_LINE.split("{", 1)[0]
    metrics_prefix = METRICS_READY_LINE.split("{", 1)[0]
    while time.monotonic() < deadline:
        if log_file.exists():
            kafka_port = metrics_port = 0
            for line in log_file.read_text(errors="replace").splitlines():
                if line.startswith(kafka_prefix):
                    kafka_port = int(line.rsplit(":", 1)[1])
                if line.startswith(metrics_prefix):
                    metrics_port = int(line.rsplit(":", 1)[1])
                if line.startswith(prefix):
                    return int(line.rsplit(":", 1)[1]), kafka_port, metrics_port
        if proc.poll() is not None:
            tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-15:])
            raise ClusterError(f"{what} exited with status {proc.returncode}:\n{tail}")
        time.sleep(0.05)
    raise ClusterError(f"{what} did not start within {START_TIMEOUT_S}s; see {log_file}")


def start_node(
    layout: ClusterLayout,
    role: str,
    node_id: int,
    port: int,
    conf: list[Path],
    settings: dict[str, str],
) -> NodeProcess:
    """Start a node; ``conf`` are its TOML files (secrets go there, never in ``settings``,
    which are command-line arguments anyone can read in ps)."""
    log_file = layout.run_dir / f"{role}-{node_id}.log"
    cmd = [sys.executable, "-m", "replication.tools.cli", role, "start"]
    for path in conf:
        cmd += ["--conf", str(path)]
    for key, value in settings.items():
        cmd += ["--set", f"{key}={value}"]
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
    _CHILDREN[proc.pid] = proc
    port, kafka_port, metrics_port = _wait_ready(proc, log_file, f"{role} {node_id}")
    return NodeProcess(role, node_id, port, proc.pid, str(log_file), kafka_port, metrics_port)


def cluster_up(
    data: str,
    brokers: int,
    port_base: int,
    *,
    kafka_port_base: int | None = None,
    metrics_port_base: int | None = None,
    conf_dir: Path | None = None,
    overrides: dict[str, str] | None = None,
    secure: bool = False,
) -> list[NodeProcess]:
    """Start a controller and ``brokers`` brokers; returns the processes (state saved).

    Broker i listens at ``port_base + i`` (replog's protocol) and, unless
    ``kafka_port_base`` is None, at ``kafka_port_base + i`` for Kafka clients; unless
    ``metrics_port_base`` is None, broker i serves Prometheus metrics at
    ``metrics_port_base + i`` and the controller at ``metrics_port_base + brokers`` (as its
    replog port is ``port_base + brokers``). A ``port_base`` of 0 lets the OS pick a free
    port for every listener. ``secure``: every listener SASL_SSL with ACLs on
    (:mod:`replication.tools.secure_cluster`)."""
    if brokers < 1:
        raise ConfigError(f"--brokers {brokers}: a cluster needs at least one broker")
    layout = ClusterLayout.of(data)
    try:
        running = [n for n in layout.read_state() if pid_alive(n.pid)]
    except ClusterError:
        running = []
    if running:
        raise ClusterError(
            f"a cluster on --data {layout.data} is already running ({len(running)} "
            f"processes); stop it with `replog cluster down --data {layout.data}` first, or "
            "give another --data"
        )
    layout.run_dir.mkdir(parents=True, exist_ok=True)
    # a secured cluster's settings hold the nodes' password: a file of its own, not arguments
    security = (
        [secure_cluster.prepare(layout.run_dir, layout.metadata_root).node_conf] if secure else []
    )
    common = {"metadata.log.dir": layout.metadata_root, **(overrides or {})}
    nodes: list[NodeProcess] = []

    def conf(name: str) -> list[Path]:
        path = conf_dir / name if conf_dir is not None else None
        return ([path] if path is not None and path.exists() else []) + security

    def metrics(index: int) -> dict[str, str]:
        if metrics_port_base is None:
            return {}
        return {
            "metrics.port": str(metrics_port_base + index if metrics_port_base and port_base else 0)
        }

    try:
        # port_base 0: every node on a free port the OS picks
        controller_port = port_base + brokers if port_base else 0
        nodes.append(
            start_node(
                layout,
                "controller",
                CONTROLLER_ID,
                controller_port,
                conf("controller.toml"),
                {
                    **common,
                    "broker.id": str(CONTROLLER_ID),
                    "listeners": f"127.0.0.1:{controller_port}",
                    **metrics(brokers),
                },
            )
        )
        for i in range(brokers):
            port = port_base + i if port_base else 0
            listeners = f"REPLOG://127.0.0.1:{port}"
            if kafka_port_base is not None:
                kafka_port = kafka_port_base + i if kafka_port_base and port_base else 0
                listeners += f",KAFKA://127.0.0.1:{kafka_port}"
            nodes.append(
                start_node(
                    layout,
                    "broker",
                    i,
                    port,
                    conf("broker.toml"),
                    {
                        **common,
                        "broker.id": str(i),
                        "listeners": listeners,
                        "log.dir": layout.broker_root(i),
                        **metrics(i),
                    },
                )
            )
    except ClusterError:
        stop_nodes(nodes)
        raise
    finally:
        layout.write_state(nodes)
    return nodes


def stop_nodes(nodes: list[NodeProcess], timeout: float = 30) -> None:
    for node in nodes:
        if pid_alive(node.pid):
            os.kill(node.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for node in nodes:
        while pid_alive(node.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid_alive(node.pid):
            os.kill(node.pid, signal.SIGKILL)
        child = _CHILDREN.pop(node.pid, None)
        if child is not None:
            child.wait(timeout)


def cluster_down(data: str) -> list[NodeProcess]:
    layout = ClusterLayout.of(data)
    nodes = layout.read_state()
    stop_nodes(nodes)
    layout.state_path.unlink(missing_ok=True)
    return nodes


def cluster_status(data: str) -> dict[str, Any]:
    layout = ClusterLayout.of(data)
    nodes = layout.read_state()
    secured = secure_cluster.existing(layout.run_dir)
    tls = secured.ssl_context() if secured is not None else None
    store = MetadataStore(Storage.from_url(layout.metadata_root))
    claim = store.latest_claim()
    image = store.read_latest()
    fenced = {b.broker_id for b in image.brokers if b.fenced}
    rows = []
    for n in nodes:
        alive = pid_alive(n.pid)
        rows.append(
            {
                "role": n.role,
                "id": n.node_id,
                "address": n.address,
                "pid": n.pid,
                "alive": alive,
                "answering": alive and port_answers(n.port, tls=tls),
                "fenced": n.node_id in fenced,
                "active_controller": claim is not None and claim.port == n.port,
                "log_file": n.log_file,
            }
        )
    return {
        "data": layout.data,
        "controller": None
        if claim is None
        else {
            "id": claim.controller_id,
            "address": f"{claim.host}:{claim.port}",
            "epoch": claim.epoch,
        },
        "metadata_version": image.version,
        "client_properties": None if secured is None else str(secured.client_properties),
        "nodes": rows,
    }
