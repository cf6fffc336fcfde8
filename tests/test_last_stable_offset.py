"""The last stable offset of a partition leader, as Kafka's: the first offset of the oldest
transaction that is open, or that ended with a marker the HW has not passed yet; else the HW.

Unit tier on a real Partition over a real Log (local files, one replica, so the HW is the
durable LEO): a transaction whose COMMIT marker is appended but not yet durable holds the LSO
at its first offset, as it stays open on any replica that lacks the marker.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.batch import Record, build
from logstore.config import LogConfig
from logstore.log import Log
from logstore.storage import Storage
from replication.broker.partition import Partition, TopicPolicy
from replication.metadata.image import PartitionState

pytestmark = pytest.mark.unit

LEADER = PartitionState((0,), (0,), 0, 1, 0)
TXN, OTHER = 7, 8


def _txn_batch(pid: int, seq: int, n: int) -> bytes:
    records = [Record(None, b"v%d" % i, 1_000) for i in range(n)]
    return build(
        records, producer_id=pid, producer_epoch=0, base_sequence=seq, is_transactional=True
    )


def _durable(partition: Partition) -> int:
    partition.log.flush()
    partition.maybe_increment_high_watermark()
    return partition.log.high_watermark


def test_an_ended_transaction_stays_unstable_until_the_hw_passes_its_marker(
    tmp_path: Path,
) -> None:
    plog = Log.open(Storage.from_url(f"file://{tmp_path}/events/0", fsync=False), LogConfig())
    partition = Partition("events", 0, plog, 0, TopicPolicy(), LEADER)
    partition.append_as_leader(build([Record(None, b"plain", 1_000)] * 2), acks=1)  # 0..1
    partition.append_as_leader(_txn_batch(TXN, 0, 3), acks=1)  # 2..4
    assert _durable(partition) == 5
    assert partition.last_stable_offset == 2, "open: the LSO is its first offset"

    info = partition.append_marker(TXN, 0, commit=True, coordinator_epoch=0)  # at 5
    assert info.first_offset == 5
    assert partition.log.high_watermark == 5
    assert partition.last_stable_offset == 2, "ended, but the HW has not passed its marker"

    partition.append_as_leader(_txn_batch(OTHER, 0, 2), acks=1)  # 6..7, open
    assert _durable(partition) == 8
    assert partition.last_stable_offset == 6, "the marker is below the HW: the next open one"

    partition.append_marker(OTHER, 0, commit=False, coordinator_epoch=0)  # at 8
    assert partition.last_stable_offset == 6
    assert _durable(partition) == 9
    assert partition.last_stable_offset == 9, "nothing unstable: the HW"
