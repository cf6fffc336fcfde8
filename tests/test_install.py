"""What an install gives a user: Spark finds `format("replog")` from any directory, and a
broker-only machine runs the cluster without pyspark."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

# Spark's own lookup (pyspark/sql/worker/lookup_data_sources.py): every top-level module named
# pyspark_* that pkgutil.iter_modules() sees, and its DefaultSource.
_SPARK_LOOKUP = """
from importlib import import_module
from pkgutil import iter_modules
from pyspark.sql.datasource import DataSource
found = {}
for info in iter_modules():
    if info.name.startswith("pyspark_"):
        mod = import_module(info.name)
        if hasattr(mod, "DefaultSource") and issubclass(mod.DefaultSource, DataSource):
            found[mod.DefaultSource.name()] = info.name
print(found.get("replog"))
"""

# A machine without pyspark: importing it fails, as it would there.
_NO_PYSPARK = "import sys; sys.modules['pyspark'] = None\n"


def _clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH: what the install provides, not the checkout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if os.environ.get("PYTHONPATH"):  # a worktree run: keep its code first
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_spark_finds_the_replog_source_from_any_directory(tmp_path: Path) -> None:
    done = _python(_SPARK_LOOKUP, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pyspark_replog", (
        "Spark's lookup does not see pyspark_replog from outside the checkout; an editable "
        "install must put the project on sys.path (a .pth path entry), not an import hook"
    )


def test_the_cluster_and_its_cli_need_no_pyspark(tmp_path: Path) -> None:
    walk = _NO_PYSPARK + (
        "import importlib, pkgutil, logstore, replication\n"
        "for package in (logstore, replication):\n"
        "    for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "print('ok')\n"
    )
    done = _python(walk, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_demo_without_pyspark_says_to_install_the_spark_extra(tmp_path: Path) -> None:
    demo = _NO_PYSPARK + (
        "from replication.tools.cli import main\n"
        "main(['demo', '--records', '10'])\n"
    )
    done = _python(demo, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "pyspark is not installed" in done.stderr
    assert "replog[spark]" in done.stderr
