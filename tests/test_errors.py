"""The wire error table: one table, beside the error classes, complete in any process."""

from __future__ import annotations

import subprocess
import sys

import pytest

import logstore.errors

pytestmark = pytest.mark.unit

# A fresh interpreter imports every module of the log and the cluster (not Spark), then checks
# that every error class with a wire code is in the table, whoever defined it.
_CHECK = """
import importlib, pkgutil
import logstore, replication
for package in (logstore, replication):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if ".tools." in info.name or info.name.endswith("__main__"):
            continue
        importlib.import_module(info.name)
from logstore.errors import ReplogError
from replication.errors import for_code
seen, pending = [], [ReplogError]
while pending:
    cls = pending.pop()
    pending.extend(cls.__subclasses__())
    code = cls.__dict__.get("code")
    if code is not None:
        seen.append(cls)
        assert for_code(code) is cls, f"{cls.__module__}.{cls.__name__} (code {code}) not in table"
print(len(seen))
"""


def test_every_coded_error_of_any_module_is_in_the_one_table() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 40


def test_the_table_is_reached_only_through_replication_errors() -> None:
    # A process that imported only logstore.errors used to get UnknownServerError for every
    # code: the lookup now lives where the wire errors are defined.
    assert not hasattr(logstore.errors, "for_code")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from replication.errors import for_code; print(for_code(6).__name__)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.strip() == "NotLeaderOrFollowerError", done.stderr
