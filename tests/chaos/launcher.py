"""Start a replog node whose log storage fails, stalls or tears writes when the harness says so.

    REPLOG_CHAOS_STORAGE_CONTROL=/tmp/x/storage.json \\
        python -m tests.chaos.launcher broker start --set broker.id=0 ...

The arguments are those of ``replog`` (``python -m replication.tools.cli``). When the environment
variable names a control file, :meth:`logstore.storage.Storage.from_url` is wrapped before the
node starts: the storage opened at the control file's ``root`` (the broker's ``log.dir``) is a
:class:`~tests.faulty_fs.FaultyStorage`, and every other root (the metadata store) is left as
it is. A daemon thread reads the control file every :data:`POLL_S` seconds; when its ``seq``
changes it heals every fault and arms the ones listed::

    {"root": "file:///.../logs", "seq": 3,
     "faults": [{"kind": "stall", "op": "write", "seconds": 1.5}]}

Kinds: ``fail`` (the call raises, nothing happens), ``stall`` (the call waits ``seconds``,
then happens) and ``tear`` (a write stores the first ``fraction`` of the object, then raises).
A fault stays armed until the next change of the file. The harness writes the file with
:func:`write_control` (write to a temporary name, then rename), so a read never sees half of it.

A node started under libfaketime (:mod:`tests.chaos.clocks`) sleeps on a condition variable,
where libfaketime's ``clock_nanosleep`` would fail.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from logstore.storage import Storage
from tests.chaos.clocks import TIMESTAMP_ENV, sleep_on_a_condition
from tests.faulty_fs import FaultyStorage

log = logging.getLogger(__name__)

#: The environment variable naming the control file.
CONTROL_ENV = "REPLOG_CHAOS_STORAGE_CONTROL"
#: How often the control file is read.
POLL_S = 0.05
#: "Until the next change of the control file", as a FaultyStorage count.
UNTIL_CHANGED = 10**9


def write_control(path: Path, root: str, seq: int, faults: list[dict[str, Any]]) -> None:
    """Replace the control file atomically: the node applies ``faults`` within POLL_S."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"root": root, "seq": seq, "faults": faults}))
    os.replace(tmp, path)


def apply_faults(storage: FaultyStorage, faults: list[dict[str, Any]]) -> None:
    """Heal ``storage``, then arm ``faults`` (control-file entries) until the next change."""
    storage.heal()
    for fault in faults:
        kind, op = fault["kind"], fault.get("op", "write")
        if kind == "fail":
            storage.fail(op, UNTIL_CHANGED)
        elif kind == "stall":
            storage.stall(op, float(fault["seconds"]), UNTIL_CHANGED)
        elif kind == "tear":
            storage.tear(op, UNTIL_CHANGED, fraction=float(fault.get("fraction", 0.5)))
        else:
            raise ValueError(f"unknown storage fault kind {kind!r} in the control file")


class _ControlWatcher:
    """Polls the control file and applies each new version to one FaultyStorage."""

    def __init__(self, path: Path, storage: FaultyStorage) -> None:
        self.path = path
        self.storage = storage
        self.seq: int | None = None

    def poll_once(self) -> None:
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError) as err:
            log.warning("chaos: cannot read storage control file %s: %s", self.path, err)
            return
        if doc.get("seq") != self.seq:
            self.seq = doc.get("seq")
            apply_faults(self.storage, doc.get("faults", []))
            log.warning("chaos: storage faults now %s", doc.get("faults", []))

    def run(self) -> None:
        while True:
            time.sleep(POLL_S)
            self.poll_once()


def install(control_path: Path) -> None:
    """Wrap Storage.from_url so the control file's root opens as a watched FaultyStorage."""
    root = json.loads(control_path.read_text())["root"]
    original = Storage.from_url

    def from_url(url: str, *, fsync: bool = True, **storage_options: Any) -> Storage:
        storage = original(url, fsync=fsync, **storage_options)
        if url.rstrip("/") != root.rstrip("/"):
            return storage
        faulty = FaultyStorage(storage)
        watcher = _ControlWatcher(control_path, faulty)
        watcher.poll_once()
        threading.Thread(target=watcher.run, name="chaos-storage-control", daemon=True).start()
        return faulty

    Storage.from_url = staticmethod(from_url)  # type: ignore[method-assign]


def main() -> None:
    control = os.environ.get(CONTROL_ENV)
    if control:
        install(Path(control))
    if os.environ.get(TIMESTAMP_ENV):  # under libfaketime (tests/chaos/clocks.py)
        time.sleep = sleep_on_a_condition
    from replication.tools.cli import main as replog_main

    replog_main(sys.argv[1:])


if __name__ == "__main__":
    main()
