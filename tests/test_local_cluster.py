"""`replog cluster up|status|down` as a user runs them (real processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import wait_until
from tests.wire import RawConnection, create_topic, partition_state

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
    finally:
        down = replog("cluster", "down", "--data", data)
    assert "stopped 4 processes" in down.stdout
    missing = replog("cluster", "status", "--data", data, check=False)
    assert missing.returncode == 1
    assert "replog cluster up" in missing.stderr
    assert "Traceback" not in missing.stderr
