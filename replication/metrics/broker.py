"""The broker's metrics, read from its state at scrape time (a prometheus_client Collector).

Nothing here runs on the produce or fetch path: the gauges are computed from the partitions,
purgatories, fetchers and coordinators when Prometheus scrapes, and the counters are the plain
integers the hot paths keep (:class:`~replication.broker.topic_stats.BrokerTopicStats`, the
ISR change counts of the ReplicaManager, the fetch session cache's evictions).

Definitions, where replog has to choose:

- under-replicated: a partition led here whose ISR is smaller than its replica set; under
  min ISR: led here with an ISR below its ``min.insync.replicas``;
- offline replicas: replicas hosted here whose partition has no leader (Kafka counts replicas
  on failed log dirs; a replog broker has one storage root, which is up while it runs);
- max lag: the largest ``leader HW - own LEO`` of the partitions this broker follows, after
  their last fetch (as Kafka's ReplicaFetcherManager MaxLag);
- consumer group lag: exported by the broker that coordinates the group, for each committed
  partition with a replica on this broker: that replica's high watermark minus the committed
  offset (exact where this broker leads the partition; a follower's HW trails the leader's
  by at most one fetch). Partitions without a replica here are not exported by this broker
  (Kafka lag exporters ask each partition's leader for its end offset; a scrape must not
  send requests): ``replog consumer-groups describe`` shows every partition's lag.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from replication.broker.fetch_session import FetchSessionCache
from replication.broker.log_cleaner import COUNTED
from replication.broker.replica_fetcher import ReplicaFetcherManager
from replication.broker.replica_manager import ReplicaManager
from replication.coordinator.group import GroupCoordinator
from replication.coordinator.transaction import TransactionCoordinator, TxnState
from replication.metrics.snapshot import on_loop


class BrokerCollector:
    """Every ``kafka_server_*``, ``kafka_log_*``, ``kafka_coordinator_*`` and
    ``kafka_consumergroup_*`` metric of one broker."""

    def __init__(
        self,
        replica_manager: ReplicaManager,
        fetch_sessions: FetchSessionCache,
        *,
        fetchers: Callable[[], ReplicaFetcherManager | None],
        transactions: Callable[[], TransactionCoordinator | None],
        groups: Callable[[], GroupCoordinator | None],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.replica_manager = replica_manager
        self.fetch_sessions = fetch_sessions
        self.fetchers = fetchers
        self.transactions = transactions
        self.groups = groups
        self.loop = loop

    def collect(self) -> Iterable[Metric]:
        return on_loop(self.loop, self.read)

    def read(self) -> list[Metric]:
        """The metric families, as of now (on the event loop)."""
        return [
            *self._replica_manager(),
            *self._log_writes(),
            *self._topics(),
            *self._logs(),
            *self._purgatories(),
            self._max_lag(),
            *self._fetch_sessions(),
            self._transactions(),
            self._group_lag(),
        ]

    def _replica_manager(self) -> list[Metric]:
        rm = self.replica_manager
        partitions = list(rm.partitions.values())
        leaders = [p for p in partitions if p.is_leader]
        prefix = "kafka_server_replicamanager_"
        return [
            _gauge(
                prefix + "underreplicatedpartitions",
                "Partitions led here whose ISR is smaller than their replica set",
                sum(1 for p in leaders if len(p.state.isr) < len(p.state.replicas)),
            ),
            _gauge(
                prefix + "underminisrpartitioncount",
                "Partitions led here whose ISR is below min.insync.replicas",
                sum(1 for p in leaders if len(p.state.isr) < p.policy.min_insync_replicas),
            ),
            _gauge(
                prefix + "offlinereplicacount",
                "Replicas hosted here whose partition has no leader",
                sum(1 for p in partitions if p.state.leader < 0),
            ),
            _gauge(prefix + "leadercount", "Partitions led by this broker", len(leaders)),
            _gauge(prefix + "partitioncount", "Replicas hosted by this broker", len(partitions)),
            _counter(prefix + "isrshrinks", "ISR shrinks of partitions led here", rm.isr_shrinks),
            _counter(
                prefix + "isrexpands", "ISR expansions of partitions led here", rm.isr_expands
            ),
        ]

    def _log_writes(self) -> list[Metric]:
        """Group commit and the broker WAL (as Kafka's LogFlushStats and log cleaner
        metrics): objects written, compaction rounds, checkpoints, where fetches were read."""
        rm = self.replica_manager
        prefix = "replog_log_"
        metrics = [
            _counter(
                prefix + "flushes",
                "Flushes that wrote something: a WAL object each over the broker WAL, else a "
                "round of one segment object per dirty partition",
                rm.flushes,
            ),
            _counter(
                prefix + "fetch_memory_reads",
                "Fetched partitions served from memory (unflushed or tail-cached batches)",
                rm.memory_reads,
            ),
            _counter(
                prefix + "fetch_storage_reads",
                "Fetches whose rest was read from storage in a worker thread",
                rm.storage_reads,
            ),
        ]
        metrics += self._log_cleaner()
        writer = rm.wal_writer
        if writer is None:
            return metrics
        stats = writer.stats
        wal = "replog_wal_"
        return [
            *metrics,
            _counter(
                wal + "objects_written", "WAL objects written (fence objects too)", stats.objects
            ),
            _counter(wal + "bytes_written", "Bytes of WAL objects written", stats.bytes),
            _counter(
                wal + "write_failures",
                "WAL writes that failed (each is retried with the same name and bytes)",
                stats.failures,
            ),
            _counter(wal + "compactions", "WAL compaction rounds done", rm.compactions),
            _gauge(
                wal + "l0_live_bytes",
                "Bytes of live L0 WAL objects not compacted yet (the compaction backlog: it "
                "stays under the broker's trigger, 1 to 2 x wal.compaction.window.bytes by its "
                "phase, while compaction keeps up)",
                0 if rm.compactor is None else rm.compactor.index.l0_live_bytes(),
            ),
            _counter(
                wal + "broker_checkpoints",
                "Broker checkpoints (every partition's HW in one object) written",
                rm.broker_checkpoints,
            ),
        ]

    def _log_cleaner(self) -> list[Metric]:
        """The log cleaner's work (Kafka's LogCleaner and LogCleanerManager metrics)."""
        totals = self.replica_manager.cleaner_totals
        counts = totals.counts
        counted = {
            "rounds": "Log cleaner rounds committed",
            "failures": "Log cleaner rounds that failed",
            **{
                name: f"{name.replace('_', ' ').capitalize()} by the log cleaner"
                for name in COUNTED
            },
        }
        return [
            *(_counter(f"replog_log_cleaner_{n}", doc, counts[n]) for n, doc in counted.items()),
            _gauge(
                "kafka_log_logcleanermanager_maxdirtypercent",
                "The highest share of a compacted log not yet cleaned, in percent, at the "
                "cleaner's last look",
                100 * totals.max_dirty_ratio,
            ),
            _gauge(
                "kafka_log_logcleaner_cleanerrecopypercent",
                "Bytes written / bytes read of the last cleaner round, in percent",
                100 * totals.last_recopy_ratio,
            ),
        ]

    def _topics(self) -> list[Metric]:
        prefix = "kafka_server_brokertopicmetrics_"
        families = {
            "messages_in": CounterMetricFamily(
                prefix + "messagesin", "Records appended as leader, by topic", labels=["topic"]
            ),
            "bytes_in": CounterMetricFamily(
                prefix + "bytesin", "Bytes appended as leader, by topic", labels=["topic"]
            ),
            "messages_out": CounterMetricFamily(
                prefix + "messagesout", "Records sent to consumers, by topic", labels=["topic"]
            ),
            "bytes_out": CounterMetricFamily(
                prefix + "bytesout", "Bytes sent to consumers, by topic", labels=["topic"]
            ),
            "replication_bytes_out": CounterMetricFamily(
                prefix + "replicationbytesout",
                "Bytes sent to followers, by topic",
                labels=["topic"],
            ),
        }
        for topic, stats in self.replica_manager.topic_stats.items():
            for attribute, family in families.items():
                family.add_metric([topic], getattr(stats, attribute))
        return list(families.values())

    def _logs(self) -> list[Metric]:
        prefix = "kafka_log_log_"
        labels = ["topic", "partition"]
        leo = GaugeMetricFamily(prefix + "logendoffset", "Log end offset", labels=labels)
        hw = GaugeMetricFamily(prefix + "highwatermark", "High watermark", labels=labels)
        size = GaugeMetricFamily(
            prefix + "size",
            "Bytes of the replica's log (segment objects and unflushed)",
            labels=labels,
        )
        for key, partition in list(self.replica_manager.partitions.items()):
            values = [key.topic, str(key.partition)]
            plog = partition.log
            leo.add_metric(values, plog.log_end_offset)
            hw.add_metric(values, plog.high_watermark)
            size.add_metric(values, plog.size_in_bytes)
        return [leo, hw, size]

    def _purgatories(self) -> list[Metric]:
        rm = self.replica_manager
        family = GaugeMetricFamily(
            "kafka_server_delayedoperationpurgatory_purgatorysize",
            "Requests waiting in a purgatory (acks=all produces, long-polled fetches)",
            labels=["delayedoperation"],
        )
        family.add_metric(["Produce"], len(rm.produce_purgatory))
        family.add_metric(["Fetch"], len(rm.fetch_purgatory))
        return [family]

    def _max_lag(self) -> Metric:
        fetchers = self.fetchers()
        return _gauge(
            "kafka_server_replicafetchermanager_maxlag",
            "Largest lag in records of a partition this broker follows (leader HW - own LEO)",
            fetchers.max_lag() if fetchers is not None else 0,
        )

    def _fetch_sessions(self) -> list[Metric]:
        prefix = "kafka_server_fetchsessioncache_"
        return [
            _gauge(
                prefix + "numincrementalfetchsessions",
                "Incremental fetch sessions cached",
                len(self.fetch_sessions),
            ),
            _counter(
                prefix + "incrementalfetchsessionevictions",
                "Fetch sessions evicted to make room for new ones",
                self.fetch_sessions.evictions,
            ),
        ]

    def _transactions(self) -> Metric:
        family = GaugeMetricFamily(
            "kafka_coordinator_transaction_transactions",
            "Transactional ids coordinated here, by state",
            labels=["state"],
        )
        coordinator = self.transactions()
        txns = (
            list(coordinator.txns.values())
            if coordinator is not None and coordinator.active
            else []
        )
        for state in TxnState:
            family.add_metric([state.value], sum(1 for m in txns if m.state is state))
        return family

    def _group_lag(self) -> Metric:
        family = GaugeMetricFamily(
            "kafka_consumergroup_lag",
            "Records between a group's committed offset and the partition's high watermark",
            labels=["group", "topic", "partition"],
        )
        coordinator = self.groups()
        if coordinator is None:
            return family
        partitions = self.replica_manager.partitions
        for state in list(coordinator.partitions.values()):
            if not state.loaded:
                continue
            for group_id, group in list(state.groups.items()):
                for tp, committed in list(group.offsets.items()):
                    partition = partitions.get(tp)
                    if partition is None:
                        continue
                    lag = max(0, partition.high_watermark - committed.offset)
                    family.add_metric([group_id, tp.topic, str(tp.partition)], lag)
        return family


def _gauge(name: str, documentation: str, value: float) -> Metric:
    return GaugeMetricFamily(name, documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> Metric:
    return CounterMetricFamily(name, documentation, value=value)
