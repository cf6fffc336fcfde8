"""A transaction marker is written as acks=all: a leader alone below min.insync.replicas
refuses it, as Kafka's WriteTxnMarkers does, instead of acking a marker only it holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.batch import Record, build
from logstore.config import LogConfig
from logstore.log import Log
from logstore.storage import Storage
from replication.broker.partition import Partition, TopicPolicy
from replication.errors import NotEnoughReplicasError
from replication.metadata.image import PartitionState

#: replicas 0, 1, 2; leader 0 alone in the ISR
ALONE = PartitionState((0, 1, 2), (0,), 0, 1, 0)
PID = 7


def _leader(root: Path, min_insync: int) -> Partition:
    storage = Storage.from_url(f"file://{root}/txn-events/0", fsync=False)
    plog = Log.open(storage, LogConfig())
    partition = Partition("txn-events", 0, plog, 0, TopicPolicy(min_insync), ALONE)
    records = [Record(None, b"kt-%d" % i, 0) for i in range(2)]
    txn = build(records, producer_id=PID, producer_epoch=0, base_sequence=0, is_transactional=True)
    partition.append_as_leader(txn, acks=1)
    return partition


@pytest.mark.unit
def test_a_marker_below_min_insync_replicas_is_refused_and_not_appended(tmp_path: Path) -> None:
    partition = _leader(tmp_path, min_insync=2)
    end = partition.log.log_end_offset
    with pytest.raises(NotEnoughReplicasError):
        partition.append_marker(PID, 0, commit=True, coordinator_epoch=0)
    assert partition.log.log_end_offset == end
    # the transaction stays open: a retried marker, once the ISR is back, ends it
    assert partition.producer_state.producers[PID].current_txn_first_offset == 0


@pytest.mark.unit
def test_a_marker_at_min_insync_replicas_is_appended(tmp_path: Path) -> None:
    partition = _leader(tmp_path, min_insync=1)
    info = partition.append_marker(PID, 0, commit=True, coordinator_epoch=0)
    assert info.first_offset == 2
    assert partition.log.log_end_offset == 3
