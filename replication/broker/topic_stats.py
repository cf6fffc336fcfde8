"""Per-topic traffic counters of a broker, as Kafka's BrokerTopicStats.

The produce and fetch paths add to plain integers here (no lock, no metrics library: they run
on the broker's event loop); the Prometheus collector reads them at scrape time as the
``kafka_server_brokertopicmetrics_*_total`` counters. A topic's counters go when the topic
leaves this broker, as Kafka removes a deleted topic's metrics.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


class TopicStats:
    """What went in and out of one topic on this broker."""

    __slots__ = ("bytes_in", "bytes_out", "messages_in", "messages_out", "replication_bytes_out")

    def __init__(self) -> None:
        #: records and bytes appended as leader (producers, coordinators); retries of batches
        #: already in the log are not counted
        self.messages_in = 0
        self.bytes_in = 0
        #: records and bytes returned to consumers (not to followers)
        self.messages_out = 0
        self.bytes_out = 0
        #: bytes returned to followers
        self.replication_bytes_out = 0


class BrokerTopicStats:
    def __init__(self) -> None:
        self._topics: dict[str, TopicStats] = {}

    def topic(self, name: str) -> TopicStats:
        stats = self._topics.get(name)
        if stats is None:
            stats = self._topics[name] = TopicStats()
        return stats

    def items(self) -> Iterator[tuple[str, TopicStats]]:
        return iter(list(self._topics.items()))

    def retain(self, topics: Iterable[str]) -> None:
        """Forget the topics not in ``topics``."""
        keep = set(topics)
        for name in [t for t in self._topics if t not in keep]:
            del self._topics[name]
