"""`replog cluster up|status|down` as a user runs them (real processes), and what
`replog cluster status` shows of a broker the controller holds fenced."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from replication import protocol as p
from replication.tools.local_cluster import cluster_status
from tests.helpers import free_port, wait_until
from tests.wire import RawConnection, create_topic, metadata, partition_state, register_broker

pytestmark = pytest.mark.cluster


def replog(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "replication.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    if check:
        assert result.returncode == 0, result.stderr + result.stdout
    return result


def test_cluster_up_status_down(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    up = replog(
        "cluster",
        "up",
        "--brokers",
        "3",
        "--data",
        data,
        "--port-base",
        "0",
        "--detach",
        "--set",
        "broker.heartbeat.interval.ms=200",
        "--set",
        "broker.session.timeout.ms=2000",
    )
    try:
        bootstrap = up.stdout.split("bootstrap servers: ")[1].split()[0]
        kafka_bootstrap = up.stdout.split("Kafka clients (kcat, confluent-kafka, ...): ")[
            1
        ].split()[0]
        status = json.loads(replog("cluster", "status", "--data", data, "--json").stdout)
        assert [n["role"] for n in status["nodes"]] == ["controller", "broker", "broker", "broker"]
        assert all(n["alive"] and n["answering"] for n in status["nodes"])
        assert status["controller"]["id"] == 1000
        assert sum(n["active_controller"] for n in status["nodes"]) == 1
        with RawConnection(bootstrap.split(",")[0]) as conn:
            assert create_topic(conn, "events", 3, 3).topics[0].error_code == 0
        wait_until(lambda: len(partition_state(bootstrap, "events").isr_nodes) == 3)
        # every broker has a Kafka listener, which Kafka's tools find
        listed = subprocess.run(
            ["kcat", "-L", "-b", kafka_bootstrap.split(",")[0], "-t", "events"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.returncode == 0, listed.stderr
        for address in kafka_bootstrap.split(","):
            assert f"at {address}" in listed.stdout
        # each broker holds its replicas on its own storage root
        for i in range(3):
            wait_until(lambda i=i: (Path(data) / f"broker-{i}" / "events" / "0").is_dir())
        # a broker killed behind the tool's back shows up as not alive
        victim = status["nodes"][2]
        os.kill(victim["pid"], signal.SIGKILL)
        wait_until(
            lambda: (
                not json.loads(replog("cluster", "status", "--data", data, "--json").stdout)[
                    "nodes"
                ][2]["alive"]
            )
        )
        human = replog("cluster", "status", "--data", data).stdout
        assert "active controller: 1000" in human
        check_a_restart_stays_fenced_until_caught_up(data, bootstrap, victim["id"])
    finally:
        down = replog("cluster", "down", "--data", data)
    assert "stopped 4 processes" in down.stdout
    missing = replog("cluster", "status", "--data", data, check=False)
    assert missing.returncode == 1
    assert "replog cluster up" in missing.stderr
    assert "Traceback" not in missing.stderr


def fenced(data: str, broker_id: int) -> bool:
    """Whether the controller holds the broker fenced, as `replog cluster status` reads it
    (the same function, in process: a CLI process takes seconds to start here, longer than
    the session of a broker the test speaks for)."""
    nodes = cluster_status(data)["nodes"]
    return bool(next(n for n in nodes if n["id"] == broker_id)["fenced"])


def listed(bootstrap: str) -> set[int]:
    """The brokers a client's Metadata names, as the first live broker answers."""
    with RawConnection(bootstrap.split(",")[0]) as conn:
        return {b.node_id for b in metadata(conn, []).brokers}


def check_a_restart_stays_fenced_until_caught_up(data: str, bootstrap: str, victim: int) -> None:
    """The killed broker's id comes back as a new incarnation (the test speaks for the
    restarted process, to choose what its heartbeats report) after the metadata moved on: the
    controller holds it fenced (`replog cluster status`, Metadata leaves it out) while its
    heartbeat reports a metadata version older than its registration's, and unfences it at
    the heartbeat that reports that version."""
    wait_until(lambda: fenced(data, victim), message="the killed broker fenced (session over)")
    with RawConnection(bootstrap.split(",")[0]) as conn:
        assert create_topic(conn, "after-the-kill", 2, 2).topics[0].error_code == 0
    behind = cluster_status(data)["metadata_version"]
    controller = cluster_status(data)["controller"]["address"]
    with RawConnection(controller) as conn:
        registered = register_broker(
            conn,
            victim,
            p.BrokerRegistrationListener(name="REPLOG", host="127.0.0.1", port=free_port()),
        )
        assert registered.error_code == 0
        registration = cluster_status(data)["metadata_version"]
        assert registration > behind

        def heartbeat(offset: int) -> Any:
            return conn.request(
                p.ApiKey.BROKER_HEARTBEAT,
                p.BrokerHeartbeatRequest(
                    broker_id=victim,
                    broker_epoch=registered.broker_epoch,
                    current_metadata_offset=offset,
                ),
            )

        stale = heartbeat(behind)
        assert stale.error_code == 0
        assert (stale.is_fenced, stale.is_caught_up) == (True, False)
        shown = json.loads(replog("cluster", "status", "--data", data, "--json").stdout)
        assert next(n for n in shown["nodes"] if n["id"] == victim)["fenced"]
        assert victim not in listed(bootstrap)
        assert fenced(data, victim)
        caught_up = heartbeat(registration)
        assert (caught_up.is_fenced, caught_up.is_caught_up) == (False, True)
        assert not fenced(data, victim)
        wait_until(  # heartbeating (caught up) meanwhile, to keep its session
            lambda: not heartbeat(registration).is_fenced and victim in listed(bootstrap),
            message="the unfenced broker listed",
        )
