"""logstore.reader.AbortedTxnRange crosses the driver/executor boundary inside input partitions."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from datasource.partitions import OffsetRangePartition, ReadSettings
from logstore.reader import AbortedTxnRange

pytestmark = pytest.mark.unit


def test_aborted_txn_range_pickles_small_inside_an_input_partition() -> None:
    settings = ReadSettings(
        "127.0.0.1:9092", read_committed=True, include_headers=False, mode="auto"
    )
    ranges = tuple(AbortedTxnRange(producer_id=1000 + i, first_offset=10 * i) for i in range(100))
    partition = OffsetRangePartition("t", 0, 0, 1000, settings, aborted=ranges)
    data = pickle.dumps(partition)
    again = pickle.loads(data)
    assert again == partition
    assert again.aborted[3] == AbortedTxnRange(1003, 30) == (1003, 30)
    assert type(again.aborted[3]) is AbortedTxnRange
    # the class is named once per pickle: each range costs a few bytes beyond a plain pair
    pairs: Any = tuple((r.producer_id, r.first_offset) for r in ranges)  # plain tuples
    plain = pickle.dumps(OffsetRangePartition("t", 0, 0, 1000, settings, aborted=pairs))
    assert len(data) - len(plain) < 100 + 4 * len(ranges)
