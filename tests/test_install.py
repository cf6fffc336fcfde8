"""What an install gives a user: Spark finds `format("replog")` from any directory, a
broker-only machine runs the cluster without pyspark, and an environment where another
distribution installed a package named like one of replog's fails at import, naming it."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
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


def _python(
    code: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=_clean_env() if env is None else env,
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


# --- a package named like one of replog's, from another distribution -------------------------

CHECKOUT = Path(__file__).resolve().parent.parent
PACKAGES = ("logstore", "replication", "datasource")
_IMPORT_ALL = "import logstore, replication, datasource; print('ok')"


def _record_line(site: Path, path: Path) -> str:
    """A RECORD row as pip writes it: path, urlsafe-base64 sha256 without padding, size."""
    data = path.read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path.relative_to(site).as_posix()},sha256={digest},{len(data)}"


def _dist_info(site: Path, name: str, tops: list[str], files: list[Path]) -> None:
    """``<name>-1.0.dist-info`` in ``site``: METADATA, top_level.txt and a RECORD of
    ``files``, as a wheel's install leaves them."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("".join(f"{t}\n" for t in tops))
    rows = [_record_line(site, f) for f in files]
    rows += [f"{info.name}/METADATA,,", f"{info.name}/top_level.txt,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")


def _installed_replog(site: Path) -> Path:
    """replog laid out as ``pip install replog`` lays it out in ``site``: the packages beside
    a replog-*.dist-info whose RECORD lists each of their files."""
    for name in PACKAGES:
        shutil.copytree(CHECKOUT / name, site / name, ignore=shutil.ignore_patterns("__pycache__"))
    files = sorted(f for name in PACKAGES for f in (site / name).rglob("*") if f.is_file())
    _dist_info(site, "replog", sorted(PACKAGES), files)
    (site / "replog-1.0.dist-info").rename(site / "replog-0.1.0.dist-info")
    return site


def _site_env(*first: Path) -> dict[str, str]:
    """This environment with ``first`` ahead of everything else on sys.path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in first)
    return env


def _foreign(site: Path, *relative: str, content: str = "FOREIGN = True\n") -> list[Path]:
    """Files of another distribution written into ``site`` (over replog's, if there)."""
    out = []
    for rel in relative:
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        out.append(path)
    return out


def test_an_installed_replog_imports(tmp_path: Path) -> None:
    site = _installed_replog(tmp_path / "site")
    done = _python(_IMPORT_ALL + "; print(replication.__file__)", tmp_path, _site_env(site))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", str(site / "replication" / "__init__.py")]


def test_the_checkout_imports(tmp_path: Path) -> None:
    done = _python(_IMPORT_ALL, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_distribution_mixed_into_replogs_package_fails_the_import(tmp_path: Path) -> None:
    """pip installed another distribution's `replication` into replog's site-packages: its
    files sit among replog's."""
    site = _installed_replog(tmp_path / "site")
    files = _foreign(site, "replication/replicas.py", "replication/helpers/__init__.py")
    _dist_info(site, "replication-tools", ["replication"], files)
    for module in PACKAGES:
        done = _python(f"import {module}", tmp_path, _site_env(site))
        assert done.returncode == 1, (module, done.stdout, done.stderr)
        assert "ImportError: replog's package 'replication'" in done.stderr
        assert "'replication-tools'" in done.stderr
        assert "replication/replicas.py" in done.stderr
        assert "virtualenv of its own" in done.stderr


def test_a_distribution_that_overwrote_replogs_init_fails_the_import(tmp_path: Path) -> None:
    site = _installed_replog(tmp_path / "site")
    files = _foreign(site, "replication/__init__.py")
    _dist_info(site, "replication", ["replication"], files)
    # `import replication` runs the other distribution's __init__; replog's other packages say
    done = _python("import logstore", tmp_path, _site_env(site))
    assert done.returncode == 1, done.stderr
    assert "replog did not install (replication/__init__.py)" in done.stderr
    assert "the distribution 'replication'" in done.stderr


def test_a_distribution_earlier_on_sys_path_fails_the_import(tmp_path: Path) -> None:
    """Another distribution's `replication` in a directory before replog's (the checkout
    here, as in an editable install) would be imported instead of replog's."""
    other = tmp_path / "other-site"
    files = _foreign(other, "replication/__init__.py")
    _dist_info(other, "replication", ["replication"], files)
    for module in ("logstore", "datasource"):
        done = _python(f"import {module}", tmp_path, _site_env(other, CHECKOUT))
        assert done.returncode == 1, (module, done.stdout, done.stderr)
        assert (
            f"the top-level package 'replication' imports from {other / 'replication'} "
            "(the distribution 'replication')"
        ) in done.stderr
        assert f"take {other} off sys.path" in done.stderr


def test_a_stray_directory_named_like_a_package_fails_the_import(tmp_path: Path) -> None:
    """A `datasource` package of the user's own in the current directory."""
    _foreign(tmp_path, "datasource/__init__.py")
    done = _python("import replication", tmp_path, _site_env(CHECKOUT))
    assert done.returncode == 1, done.stderr
    assert "'datasource' imports from" in done.stderr
    assert "no installed distribution lists it" in done.stderr
