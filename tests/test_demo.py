"""`replog demo`, as README's first command runs it: it must verify exactly-once and exit 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.chaos]


@pytest.mark.parametrize("chaos", ["--chaos", "--no-chaos"])
def test_demo_verifies_exactly_once(tmp_path: Path, chaos: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "replication.tools.cli",
            "demo",
            "--records",
            "20000",
            "--data",
            str(tmp_path / "demo"),
            chaos,
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "OK: every record exactly once" in out
    assert "duplicates" in out
    if chaos == "--chaos":
        assert "chaos: SIGKILLed broker" in out
        assert "failover: broker" in out
    # it says why the output's offsets run ahead of its records, and where its logs are
    assert "transaction marker" in out
    assert f"the logs stay in {tmp_path / 'demo'}" in out
    assert (tmp_path / "demo" / "broker-0" / "events-enriched" / "0").is_dir()
    # the demo stops every process it started
    assert not (tmp_path / "demo" / "cluster.json").exists()
