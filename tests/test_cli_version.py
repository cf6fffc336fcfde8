"""`replog --version`: the installed distribution's version, as `replog <version>`."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from replication.tools import cli

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent


def test_version_prints_the_installed_version_and_exits_0() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "replication.tools.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"replog {importlib.metadata.version('replog')}\n"
    assert done.stderr == ""


def test_the_installed_version_is_pyproject_s() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert importlib.metadata.version("replog") == project["version"]


def test_version_without_package_metadata_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert "replog is not installed" in err
    assert "pip install -e ." in err


def test_the_cli_starts_without_importing_a_broker() -> None:
    """`replog --help` and every client command start without the node's import (the broker,
    its APIs and their schemas): only the commands that run a node or a local cluster load it."""
    probe = (
        "import sys, replication.tools.cli; "
        "print(sorted(m for m in sys.modules if m.startswith(('replication.server', "
        "'replication.broker', 'replication.controller'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
