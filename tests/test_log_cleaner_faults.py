"""SIGKILL of a process running the log cleaner (tests/cleaner_worker.py), mid-rewrite, at its
commit and after it: recovery reads a whole log (the old one before the commit, the cleaned
one after it, never a mix) and a rerun completes the clean."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from logstore.log import Log
from logstore.log_cleaner import clean_log
from logstore.segment import cleaned_object_of
from logstore.storage import Storage
from tests.helpers import LineWorker
from tests.test_log_cleaner import CONFIG, NOW, History, check_cleaned, every_record, read_committed
from tests.test_wal_log import Node

pytestmark = pytest.mark.chaos


class Opened:
    """Partition orders/0 of a broker root, standalone or over the WAL, written with a history
    of updates, tombstones and transactions, reopened as a broker reopens it."""

    def __init__(self, tmp_path: Path, wal: bool) -> None:
        self.url = f"file://{tmp_path}/root"
        self.root = Storage.from_url(self.url)
        self.node: Node | None = Node(self.root, [("orders", 0)]) if wal else None
        log = self.open()
        history = History(random.Random(7), keys=4)
        history.write(log, 60, flush=None if self.node is None else self.node.flush)
        self.hw = log.log_end_offset
        self.before = every_record(log), read_committed(log)
        self.close(log)

    def open(self) -> Log:
        if self.node is None:
            return Log.open(self.root.child("orders/0"), CONFIG)
        self.node.config = CONFIG
        self.node.start()
        return self.node.logs[("orders", 0)]

    def close(self, log: Log) -> None:
        if self.node is None:
            log.close()
        else:
            self.node.stop()

    def reopened(self) -> Log:
        log = self.open()
        log.update_high_watermark(self.hw)
        return log

    def cleaned_objects(self) -> list[str]:
        return [i.path for i in self.root.child("orders/0").list() if cleaned_object_of(i.path)]


@pytest.mark.parametrize(
    ("wal", "stall", "signal"),
    [
        (False, "write:2", "WRITING "),
        (False, "commit", "COMMITTING"),
        (False, "delete", "DELETING "),
        (True, "write:1", "WRITING "),
        (True, "commit", "COMMITTING"),
    ],
)
def test_sigkill_mid_clean(tmp_path: Path, wal: bool, stall: str, signal: str) -> None:
    opened = Opened(tmp_path, wal)
    before_all, before = opened.before
    args = ["--url", opened.url, "--high-watermark", str(opened.hw), "--now", str(NOW)]
    worker = LineWorker("tests.cleaner_worker", [*args, "--stall", stall])
    try:
        while not worker.next_line(120).startswith(signal):
            pass
    finally:
        worker.kill()
    log = opened.reopened()
    committed = stall == "delete"
    if committed:  # the checkpoint naming the generation was written: the cleaned log
        assert log.clean_generation == 1
        assert every_record(log) != before_all
        check_cleaned(before_all, before, log)
    else:  # the old log, and recovery removed what the clean had written
        assert log.clean_generation == 0
        assert every_record(log) == before_all
        assert read_committed(log) == before
        assert not opened.cleaned_objects()
    stats = clean_log(log, now_ms=NOW)
    assert (stats is None) == committed  # a committed clean leaves nothing dirty to clean
    check_cleaned(before_all, before, log)
    view = read_committed(log)
    opened.close(log)
    assert read_committed(opened.reopened()) == view
