"""Replica placement (Kafka's StripedReplicaPlacer): which brokers hold the replicas of new
partitions, striped round-robin over the brokers and alternated by rack when every broker
names one."""

from __future__ import annotations

import random
from collections.abc import Sequence

from replication.metadata.image import BrokerInfo


def assign_replicas(
    brokers: Sequence[BrokerInfo],
    partitions: int,
    replication_factor: int,
    *,
    seed: int | None = None,
) -> list[list[int]]:
    """Kafka's rack-unaware assignment: round-robin leaders, followers shifted per round.

    With racks on every broker, brokers are first interleaved by rack (Kafka's
    rack-alternated list) so that consecutive replicas land on different racks.
    """
    ids = [b.broker_id for b in sorted(brokers, key=lambda b: b.broker_id)]
    if all(b.rack for b in brokers) and len({b.rack for b in brokers}) > 1:
        ids = _rack_alternated(brokers)
    n = len(ids)
    rng = random.Random(seed)
    start = rng.randrange(n)
    shift = rng.randrange(n)
    out: list[list[int]] = []
    for p in range(partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start) % n
        replicas = [ids[first]]
        for j in range(replication_factor - 1):
            replicas.append(ids[(first + 1 + (shift + j) % (n - 1)) % n])
        out.append(replicas)
    return out


def _rack_alternated(brokers: Sequence[BrokerInfo]) -> list[int]:
    by_rack: dict[str, list[int]] = {}
    for b in sorted(brokers, key=lambda b: b.broker_id):
        by_rack.setdefault(b.rack or "", []).append(b.broker_id)
    racks = sorted(by_rack)
    out: list[int] = []
    i = 0
    while len(out) < len(brokers):
        rack = by_rack[racks[i % len(racks)]]
        if rack:
            out.append(rack.pop(0))
        i += 1
    return out
