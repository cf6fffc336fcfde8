"""What the CLI says when it is pointed at the wrong place: one line naming the flag to fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


def replog(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replication.tools.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("command", ["status", "down"])
def test_cluster_commands_without_a_cluster_name_the_data_flag(
    tmp_path: Path, command: str
) -> None:
    elsewhere = replog("cluster", command, "--data", str(tmp_path / "other"), cwd=tmp_path)
    assert elsewhere.returncode == 1
    assert f"no cluster was started with --data file://{tmp_path}/other" in elsewhere.stderr
    assert "giving the same --data" in elsewhere.stderr
    default = replog("cluster", command, cwd=tmp_path)
    assert default.returncode == 1
    assert "--data" in default.stderr
    assert "default: replog-data" in default.stderr
