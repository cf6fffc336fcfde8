"""Value types every layer of the cluster shares, as Kafka's ``org.apache.kafka.common``.

The client, the broker, the controller and the coordinators name a partition the same way, so
a key built on one side is found on the other.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["TopicPartition"]


class TopicPartition(NamedTuple):
    """A partition of a topic. A tuple, so ``("events", 0)`` compares equal to it."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"
