"""The soak runner (``python -m tests.chaos.soak``): its slopes on hand-made samples, and a
one-minute soak with a fault against a real cluster whose output must be well formed, whose
checker must find nothing, and whose sampler must have seen every node.

The long soak is ``python -m tests.chaos.soak --minutes 60`` (docs/guarantees.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.sampler import fit, process_stats, slopes, tree_size

REPO_ROOT = Path(__file__).resolve().parents[1]
NODES = ["broker-0", "broker-1", "broker-2", "controller-100", "controller-101"]


def node_sample(t: float, pid: int, rss: int, **extra: Any) -> dict[str, Any]:
    return {
        "t": t,
        "nodes": {"broker-0": {"pid": pid, "rss_bytes": rss, "fds": 10, "threads": 5}},
        **extra,
    }


@pytest.mark.unit
def test_fit_is_the_least_squares_slope() -> None:
    assert fit([(0, 1.0), (1, 3.0), (2, 5.0)]) == pytest.approx(2.0)
    assert fit([(0, 1.0), (1, 2.0), (2, 1.0), (3, 2.0)]) == pytest.approx(0.2)
    assert fit([(5, 7.0)]) == 0.0


@pytest.mark.unit
def test_a_restart_is_fitted_per_incarnation() -> None:
    """A node restarted at a lower RSS that then stays flat has no slope; one that grows in
    its longest incarnation is flagged."""
    flat = [node_sample(t, 1, 500 << 20) for t in range(0, 300, 15)]
    flat += [node_sample(t, 2, 100 << 20) for t in range(300, 1200, 15)]
    series = slopes(flat, from_t=0)["broker-0.rss_bytes"]
    assert series["slope_per_h"] == 0.0
    assert series["incarnations"] == 2
    assert series["points"] == 60
    assert not series["grows"]
    growing = [node_sample(t, 3, (100 << 20) + t * 100_000) for t in range(0, 1200, 15)]
    series = slopes(growing, from_t=600)["broker-0.rss_bytes"]
    assert series["slope_per_h"] == pytest.approx(360e6)
    assert series["points"] == 40
    assert series["grows"]


@pytest.mark.unit
def test_storage_is_judged_per_record() -> None:
    """A storage root that grows with the records it keeps is not flagged; one whose bytes per
    record grow is."""
    samples = [
        node_sample(
            t,
            1,
            1 << 20,
            storage={"broker-0": {"objects": 10, "bytes": 1000 * t}},
            records=10 * t,
        )
        for t in range(10, 400, 15)
    ]
    series = slopes(samples, from_t=0)
    assert series["storage.broker-0.bytes"]["slope_per_h"] > 0
    assert not series["storage.broker-0.bytes"]["grows"]
    assert not series["storage.broker-0.bytes_per_record"]["grows"]
    assert series["storage.broker-0.objects_per_record"]["slope_per_h"] < 0
    for sample in samples:
        sample["records"] = 1000
    assert slopes(samples, from_t=0)["storage.broker-0.bytes_per_record"]["grows"]


@pytest.mark.unit
def test_process_stats_and_tree_size(tmp_path: Path) -> None:
    mine = process_stats(os.getpid())
    assert mine is not None
    assert mine["rss_bytes"] >= mine["rss_anon_bytes"] > 0
    assert mine["fds"] >= 3
    assert mine["threads"] >= 1
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.seg").write_bytes(b"12345")
    (tmp_path / "y").write_bytes(b"12")
    assert tree_size(tmp_path.as_uri()) == {"objects": 2, "bytes": 7}


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_a_one_minute_soak(tmp_path: Path) -> None:
    """One minute of load with one fault: the result line and every sample are well formed,
    the checker finds nothing, every node was sampled (its slopes are not judged here)."""
    samples_path = tmp_path / "samples.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.chaos.soak",
            "--minutes",
            "1",
            "--fault-every-s",
            "25",
            "--sample-every-s",
            "5",
            "--seed",
            "3",
            "--workdir",
            str(tmp_path),
            "--samples",
            str(samples_path),
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=280,
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"], result["examples"]
    assert sum(result["anomalies"].values()) == 0
    assert result["anomalies"]["compacted_latest_lost"] == 0
    assert len(result["faults"]) >= 1
    assert result["acked"] > 0
    assert result["compacted"]["keys"] == 20
    assert result["group"]["commits"] > 0
    assert result["nodes_sampled"] == NODES
    assert proc.returncode == (1 if result["growing"] else 0)
    samples = [json.loads(line) for line in samples_path.read_text().splitlines()]
    assert len(samples) == result["samples"] >= 5
    for sample in samples:
        assert sorted(sample["nodes"]) == NODES
        assert sample["metadata"]["objects"] > 0
        assert sorted(sample["storage"]) == NODES[:3]
    assert [s["t"] for s in samples] == sorted(s["t"] for s in samples)
    for node in NODES:
        for key in ("rss_bytes", "rss_anon_bytes", "fds", "threads"):
            series = result["slopes"][f"{node}.{key}"]
            assert series["points"] >= 1
            assert series["level"] > 0
            assert isinstance(series["grows"], bool)
    assert set(result["growing"]) <= set(result["slopes"])
    for topic in ("__consumer_offsets", "__transaction_state"):
        assert f"internal.{topic}.records" in result["slopes"]
