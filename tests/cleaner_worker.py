"""The log cleaner as a process, for SIGKILL tests (tests/test_log_cleaner_faults.py)::

    python -m tests.cleaner_worker --url ROOT --high-watermark HW --now NOW
        [--stall none|write:N|commit|delete]

It opens partition ``orders/0`` of the broker root ``ROOT`` as the broker does
(``open_replica_log``: over the WAL if its checkpoint says so, else standalone), sets its high
watermark and runs one clean with the configs of tests/test_log_cleaner.py. It prints, flushed:

- ``READY`` once the log is open;
- ``WRITING <name>`` as the N-th cleaned object's write begins (``write:N``: it never ends, so
  N - 1 of them are on storage);
- ``COMMITTING`` as the checkpoint write that commits the clean begins (``commit``);
- ``DELETING <name>`` as the first delete after the commit begins (``delete``);
- ``DONE <json>`` after a clean that ran to the end.

The parent kills it at the line it waits for, then checks what recovery reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from logstore.checkpoint import CHECKPOINT_NAME
from logstore.log import open_replica_log
from logstore.log_cleaner import clean_log
from logstore.segment import cleaned_object_of
from logstore.storage import Data, Storage
from tests.faulty_fs import FaultyStorage
from tests.test_log_cleaner import CONFIG


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class StallingStorage(FaultyStorage):
    """Announces the chosen write or delete of a clean, then stalls in it for good."""

    def __init__(self, inner: Storage, stall: str) -> None:
        super().__init__(inner)
        self.point = stall
        self.cleaned_writes = 0

    def _hang(self, line: str) -> None:
        emit(line)
        time.sleep(3600)

    def write(self, path: str, data: Data) -> None:
        if cleaned_object_of(path) is not None:
            self.cleaned_writes += 1
            if self.point == f"write:{self.cleaned_writes}":
                self._hang(f"WRITING {path}")
        elif path == CHECKPOINT_NAME and self.point == "commit":
            self._hang("COMMITTING")
        super().write(path, data)

    def delete(self, path: str) -> None:
        if self.point == "delete":
            self._hang(f"DELETING {path}")
        super().delete(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--high-watermark", type=int, required=True)
    parser.add_argument("--now", type=int, required=True)
    parser.add_argument("--stall", default="none")
    args = parser.parse_args(argv)
    log = open_replica_log(Storage.from_url(args.url), "orders", 0, CONFIG)
    log.storage = StallingStorage(log.storage, args.stall)
    log.update_high_watermark(args.high_watermark)
    emit("READY")
    stats = clean_log(log, now_ms=args.now)
    emit("DONE " + json.dumps(None if stats is None else dataclasses.asdict(stats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
