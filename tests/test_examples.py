"""Every example runs as `python examples/NAME.py` against a cluster from `replog cluster up`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from replication.client import TopicPartition
from replication.tools import local_cluster
from tests.helpers import read_to_end

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("examples-cluster")
    nodes = local_cluster.cluster_up(str(data), 3, 0, conf_dir=ROOT / "conf")
    try:
        yield ",".join(n.address for n in nodes if n.role == "broker")
    finally:
        local_cluster.cluster_down(str(data))


def run_example(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def quickstart(bootstrap: str) -> subprocess.CompletedProcess[str]:
    """``examples/quickstart.py`` run once (it writes 1,000 records to the topic quickstart
    and reads them back with Spark); the other examples read that topic. Each run of an
    example starts a Spark JVM, so one run instead of four saves about a minute."""
    result = run_example("quickstart", "--bootstrap-server", bootstrap)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def committed_count(bootstrap: str, topic: str) -> int:
    tps = [TopicPartition(topic, p) for p in range(3)]
    return len(read_to_end(bootstrap, tps, timeout=120).records)


def test_quickstart_then_streaming_read(
    bootstrap: str, quickstart: subprocess.CompletedProcess[str]
) -> None:
    assert "Spark read 1000 records from quickstart" in quickstart.stdout
    result = run_example("streaming_read", "--bootstrap-server", bootstrap, "--available-now")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "total 1000" in result.stdout


def test_exactly_once_pipeline_restarts_from_its_checkpoint(
    bootstrap: str, quickstart: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    args = (
        "--bootstrap-server",
        bootstrap,
        "--source",
        "quickstart",
        "--sink",
        "eo-out",
        "--checkpoint",
        str(tmp_path / "ckpt"),
        "--available-now",
    )
    for _ in range(2):  # the second run restarts from the checkpoint: nothing is written twice
        result = run_example("exactly_once_pipeline", *args)
        assert result.returncode == 0, result.stdout + result.stderr
        assert committed_count(bootstrap, "eo-out") == 1000


def test_to_parquet(
    bootstrap: str, quickstart: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    result = run_example(
        "to_parquet",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        "quickstart",
        "--path",
        str(tmp_path / "parquet"),
        "--available-now",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1000 records in Parquet" in result.stdout


def test_delta_sink(
    bootstrap: str, quickstart: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    result = run_example(
        "delta_sink",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        "quickstart",
        "--path",
        str(tmp_path / "delta"),
        "--available-now",
    )
    if result.returncode == 2:
        # no Maven here: Delta's JVM jars cannot be fetched; the example says what is missing
        reason = result.stderr.strip().splitlines()[-1]
        assert reason.startswith("Delta is not available:"), result.stderr
        pytest.skip(reason)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1000 records in" in result.stdout
