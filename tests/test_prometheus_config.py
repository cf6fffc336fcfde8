"""``replog cluster prometheus-config`` and the renderer it shares with conf/docker/prometheus:
the targets come from the state ``replog cluster up`` records (each node's metrics port), in
the Docker config's jobs; a cluster without metrics ports or without state is a clear error.
(tests/test_compose.py checks the Docker config is this renderer's output for its nodes.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from replication.tools.prometheus_config import JOBS, render

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent


def replog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replication.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def write_state(data: Path, metrics_ports: dict[tuple[str, int], int]) -> None:
    """A cluster.json as `replog cluster up` writes it (NodeProcess fields per node)."""
    data.mkdir(parents=True, exist_ok=True)
    nodes = [
        {
            "role": role,
            "node_id": node_id,
            "port": 9092 + i,
            "pid": 1,
            "log_file": str(data / f"{role}-{node_id}.log"),
            "kafka_port": 0,
            "metrics_port": port,
        }
        for i, ((role, node_id), port) in enumerate(metrics_ports.items())
    ]
    (data / "cluster.json").write_text(json.dumps({"data": data.as_uri(), "nodes": nodes}))


def test_the_config_scrapes_every_node_of_the_local_cluster(tmp_path: Path) -> None:
    data = tmp_path / "replog-data"
    write_state(
        data,
        {("controller", 1000): 9407, ("broker", 0): 9404, ("broker", 1): 9405, ("broker", 2): 9406},
    )
    rules = ROOT / "conf" / "docker" / "prometheus" / "alerts.yml"
    done = replog("cluster", "prometheus-config", "--data", str(data), "--rules", str(rules))
    assert done.returncode == 0, done.stderr
    path = data / "prometheus.yml"
    assert f"wrote {path} (4 targets)" in done.stdout
    doc = yaml.safe_load(path.read_text())
    targets = {
        job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
        for job in doc["scrape_configs"]
    }
    assert targets == {
        "replog-broker": ["127.0.0.1:9404", "127.0.0.1:9405", "127.0.0.1:9406"],
        "replog-controller": ["127.0.0.1:9407"],
    }
    assert doc["rule_files"] == [str(rules)]
    assert doc["global"]["scrape_interval"] == "15s"


def test_a_cluster_without_metrics_ports_or_without_state_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "no-metrics"
    write_state(data, {("controller", 1000): 0, ("broker", 0): 0})
    done = replog("cluster", "prometheus-config", "--data", str(data))
    assert done.returncode == 1
    assert "serves metrics" in done.stderr
    assert "--metrics-port-base" in done.stderr
    done = replog("cluster", "prometheus-config", "--data", str(tmp_path / "none"))
    assert done.returncode == 1
    assert "no cluster was started" in done.stderr
    write_state(data, {("broker", 0): 9404})
    done = replog("cluster", "prometheus-config", "--data", str(data), "--rules", "nope.yml")
    assert done.returncode == 1
    assert "nope.yml: no such file" in done.stderr


def test_render_knows_only_replogs_jobs() -> None:
    text = render({"replog-broker": ["b:1"]}, header="two\nlines")
    assert text.startswith("# two\n# lines\nglobal:\n")
    assert [j["job_name"] for j in yaml.safe_load(text)["scrape_configs"]] == ["replog-broker"]
    assert JOBS == ("replog-broker", "replog-controller")
    with pytest.raises(ValueError, match="unknown jobs"):
        render({"kafka": ["b:1"]})
