"""The tail cache: one bound over every log of a broker (log.tail.cache.total.bytes) beside each
log's own (log.tail.cache.bytes), least recently used first, and nothing kept for a log that is
closed, deleted or gone."""

from __future__ import annotations

import gc
import uuid

import pytest

from logstore.batch import Record, build
from logstore.config import LogConfig
from logstore.log import Log
from logstore.storage import Storage
from logstore.tail_cache import TailCache
from replication.config import broker_config_from
from tests.readback import log_values

pytestmark = pytest.mark.unit

KIB = 1024


def open_logs(cache: TailCache, count: int, per_log: int) -> list[Log]:
    root = Storage.from_url(f"memory://test-tail-cache-{uuid.uuid4().hex}")
    config = LogConfig(tail_cache_bytes=per_log)
    return [Log.open(root.child(f"t/{i}"), config, tail_cache=cache) for i in range(count)]


def write(log: Log, batches: int, value: bytes) -> list[tuple[int, bytes]]:
    written = []
    for _ in range(batches):
        offset = log.append(build([Record(None, value, 1000)]), leader_epoch=0).first_offset
        log.flush()
        written.append((offset, value))
    return written


def test_entries_evicted_per_owner_and_in_total_least_recent_first() -> None:
    cache = TailCache(total_bytes=10)
    a, b = cache.owner(), cache.owner()
    cache.put(a, "1", b"aaaa", limit_bytes=6, checked=True)
    cache.put(a, "2", b"aaa", limit_bytes=6)  # a holds 7 > 6: its oldest goes
    assert (cache.get(a, "1"), cache.get(a, "2")) == (None, b"aaa")
    cache.put(b, "1", b"bbbbb", limit_bytes=6, checked=True)
    assert cache.size_bytes == 8
    assert cache.get(a, "2") == b"aaa"  # now b's entry is the least recently used
    cache.put(a, "3", b"cc", limit_bytes=6)  # 10: within the total
    cache.put(a, "4", b"d", limit_bytes=6)  # 11 > 10: b's entry goes, not a's
    assert cache.get(b, "1") is None
    assert [cache.get(a, n) for n in "234"] == [b"aaa", b"cc", b"d"]
    assert cache.size_bytes == 6
    assert cache.checked(a, "2") is None  # not marked checked: never served as it is
    cache.put(a, "5", b"x" * 11, limit_bytes=20)  # larger than the total: not kept
    assert cache.get(a, "5") is None
    cache.drop_owner(a)
    assert cache.size_bytes == 0


def test_many_logs_stay_within_the_total_and_read_everything() -> None:
    """Twelve logs of one broker, each allowed 64 KiB, share a 96 KiB total: the cache never
    holds more than the total, while every record stays readable (from storage once its bytes
    were evicted)."""
    cache = TailCache(total_bytes=96 * KIB)
    logs = open_logs(cache, 12, per_log=64 * KIB)
    written = {}
    for i, log in enumerate(logs):
        written[i] = write(log, 8, bytes([i]) * 4 * KIB)
        assert cache.size_bytes <= 96 * KIB
    assert cache.size_bytes > 48 * KIB  # it does keep the recent objects
    for i, log in enumerate(logs):
        assert log_values(log) == written[i]
    for log in logs:
        log.close()
    assert cache.size_bytes == 0


def test_each_log_keeps_at_most_its_own_limit() -> None:
    cache = TailCache(total_bytes=1 << 30)
    (log,) = open_logs(cache, 1, per_log=16 * KIB)
    written = write(log, 10, b"v" * 4 * KIB)
    assert 0 < cache.size_bytes <= 16 * KIB
    assert log_values(log) == written


def test_a_deleted_or_collected_log_leaves_nothing_cached() -> None:
    cache = TailCache(total_bytes=1 << 30)
    deleted, dropped = open_logs(cache, 2, per_log=1 << 20)
    write(dropped, 3, b"g" * KIB)
    kept = cache.size_bytes
    write(deleted, 3, b"d" * KIB)
    assert cache.size_bytes > kept > 0
    deleted.delete()
    assert cache.size_bytes == kept
    del dropped
    gc.collect()
    assert cache.size_bytes == 0


def test_the_broker_bound_is_a_broker_config() -> None:
    assert broker_config_from({}).log_tail_cache_total_bytes == 128 * 1024 * 1024
    config = broker_config_from({"log.tail.cache.total.bytes": "1048576"})
    assert config.log_tail_cache_total_bytes == 1 << 20
