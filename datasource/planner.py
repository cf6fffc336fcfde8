"""The driver's side of a read: offsets from the options, and input partitions from offsets.

A :class:`Planner` lives in the driver's long-lived Python worker (streaming) or in a planning
worker (batch). It turns ``startingOffsets`` / ``endingOffsets`` and their timestamp variants
into offsets (:meth:`Planner.resolve`), checks offset ranges against what the logs still hold
(data loss), and plans the input partitions of ``[start, end)`` (:meth:`Planner.plan`):

1. Each partition's range is checked: offsets below the log start were removed by retention;
   an end below the start means the partition was recreated or truncated; a partition missing
   from the end is gone. Each is data loss: an error naming failOnDataLoss, or (with
   failOnDataLoss=false) a warning naming the skipped offsets.
2. Replicas that hold the range on their storage are found with DescribeLogDirs: in-sync
   replicas (or the leader) whose durable end reaches the range's end and whose log start is
   at or below its start, leader first.
3. The first such replica's broker is asked where the range is on its storage
   (DescribeLogObjects, answered from the broker's memory: segment objects and the byte ranges
   of write-ahead-log chunks; one request per broker, no storage request), and the range is
   cut at extent boundaries (and for minPartitions / maxRecordsPerPartition, see
   :func:`~datasource.partitions.split_ranges`). A broker that does not know the API (an
   older replog) or cannot answer for a partition: that replica's segment objects are listed
   instead (a LIST per partition, the way before the WAL).
4. With read_committed, each piece gets the aborted transactions from its start (a Fetch at
   read_committed returns them).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from datasource.errors import DataLossError, InvalidOptionError
from datasource.metadata import ClusterView, ReplicaLog
from datasource.offsets import (
    EARLIEST,
    LATEST,
    EarliestOffsets,
    GlobalTimestamp,
    LatestOffsets,
    OffsetSpec,
    SourceOffset,
    SpecificOffsets,
    SpecificTimestamps,
)
from datasource.options import Assign, SourceOptions
from datasource.partitions import (
    OffsetRange,
    OffsetRangePartition,
    ReadSettings,
    ReplicaLocation,
    extents_problem,
    split_ranges,
)
from logstore.reader import AbortedTxnRange, Located, SegmentReader
from replication.client import TopicPartition
from replication.client.admin import LogObjects
from replication.errors import ReplogError, UnsupportedVersionError

__all__ = ["Planner"]

log = logging.getLogger(__name__)

#: Threads a planner lists storage and asks brokers with.
_PLANNING_THREADS: Final = 8


def _is_local(url: str) -> bool:
    return "://" not in url or url.startswith(("file://", "local://"))


class Planner:
    """Resolves offsets and plans input partitions for one read (see the module doc)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.view = ClusterView(options)
        self.settings = ReadSettings(
            bootstrap_servers=options.bootstrap_servers,
            read_committed=options.read_committed,
            include_headers=options.include_headers,
            mode=options.read_mode,
            storage_options=options.storage_options,
            fail_on_data_loss=options.fail_on_data_loss,
            poll_timeout_ms=options.poll_timeout_ms,
            client_security=options.client_security,
            consumer_settings=options.consumer_settings,
        )
        self._readers: dict[tuple[str, TopicPartition], SegmentReader] = {}
        #: brokers that answered DescribeLogObjects with UNSUPPORTED_VERSION (older replog):
        #: their replicas are listed, and they are not asked again
        self._no_log_objects: set[int] = set()

    def close(self) -> None:
        readers, self._readers = self._readers, {}
        for reader in readers.values():
            reader.close()
        self.view.close()

    # --- offsets ------------------------------------------------------------------------------

    def report_data_loss(self, what: str) -> None:
        """Fail (failOnDataLoss=true) or warn that ``what`` was skipped."""
        if self.options.fail_on_data_loss:
            raise DataLossError(what)
        log.warning("%s; skipping it (failOnDataLoss=false)", what)

    def resolve(
        self, spec: OffsetSpec, tps: Iterable[TopicPartition], *, option: str
    ) -> dict[TopicPartition, int]:
        """The offsets ``spec`` (the value of ``option``) asks for, for partitions ``tps``."""
        tps = sorted(set(tps))
        view = self.view
        if isinstance(spec, EarliestOffsets):
            return view.earliest(tps)
        if isinstance(spec, LatestOffsets):
            return view.latest(tps)
        if isinstance(spec, GlobalTimestamp):
            return self._by_timestamp(dict.fromkeys(tps, spec.timestamp), spec.strategy, option)
        wanted = spec.offsets if isinstance(spec, SpecificOffsets) else spec.timestamps
        self._check_covers(wanted, tps, option)
        if isinstance(spec, SpecificTimestamps):
            return self._by_timestamp(dict(wanted), spec.strategy, option)
        earliest = view.earliest(tp for tp, o in wanted.items() if o == EARLIEST)
        latest = view.latest(tp for tp, o in wanted.items() if o == LATEST)
        return {
            tp: earliest[tp] if o == EARLIEST else latest[tp] if o == LATEST else o
            for tp, o in wanted.items()
        }

    def _check_covers(
        self, wanted: Mapping[TopicPartition, int], tps: list[TopicPartition], option: str
    ) -> None:
        """As Kafka's source: specific offsets must name exactly the partitions read."""
        missing = sorted(set(tps) - set(wanted))
        unknown = sorted(set(wanted) - set(tps))
        if not missing and not unknown:
            return
        if unknown and not isinstance(self.options.subscription, Assign):
            reason = f"{unknown[0]} is not a partition of the subscribed topics"
        elif unknown:
            reason = f"{unknown[0]} is not assigned (or does not exist)"
        else:
            reason = f"{missing[0]} is missing (name every partition read; -2 earliest, -1 latest)"
        raise InvalidOptionError(
            option, _json_of(wanted), "an offset for every partition read", reason
        )

    def _by_timestamp(
        self, stamps: dict[TopicPartition, int], strategy: str, option: str
    ) -> dict[TopicPartition, int]:
        found = self.view.list_offsets(stamps)
        none = sorted(tp for tp, offset in found.items() if offset < 0)
        if not none:
            return found
        if strategy == "error" and option.startswith("starting"):
            raise InvalidOptionError(
                option,
                str(stamps[none[0]]),
                "a timestamp at or before the last record's (or set "
                "startingOffsetsByTimestampStrategy=latest)",
                f"no record of {none[0]} has a timestamp at or after {stamps[none[0]]}",
            )
        latest = self.view.latest(none)
        return {**found, **latest}

    # --- planning -----------------------------------------------------------------------------

    def plan(
        self, start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]
    ) -> list[OffsetRangePartition]:
        """The input partitions reading ``[start, end)`` (see the module doc)."""
        for tp in sorted(set(start) - set(end)):
            self.report_data_loss(
                f"{tp} is gone (its topic was deleted?): records after offset {start[tp]} "
                "may not have been read"
            )
        tps = sorted(end)
        if not tps:
            return []
        earliest = self.view.earliest(tps)
        ranges: list[OffsetRange] = []
        for tp in tps:
            first = earliest.get(tp, 0)
            s, e = start.get(tp, first), end[tp]
            if e < s:
                self.report_data_loss(
                    f"the offsets of {tp} went back from {s} to {e} (the topic was deleted and "
                    f"recreated, or the partition truncated): offsets [{e}, {s}) changed"
                )
                continue
            if s < first:
                self.report_data_loss(
                    f"offsets [{s}, {min(first, e)}) of {tp} are gone (removed by retention)"
                )
                s = min(first, e)
            if s < e:
                ranges.append(OffsetRange(tp.topic, tp.partition, s, e))
        if not ranges:
            return []
        replicas = self._replicas(ranges)
        located = self._located(ranges, replicas)

        def listed(r: OffsetRange) -> OffsetRange:
            extents = located.get(_tp(r))
            if extents is not None:
                return OffsetRange(r.topic, r.partition, r.start, r.end, extents)
            return self._with_objects(r, replicas.get(_tp(r), ()))

        def aborted(piece: OffsetRange) -> tuple[AbortedTxnRange, ...]:
            if not replicas.get(_tp(piece)) or not self.settings.read_committed:
                return ()  # read through the brokers: the consumer asks for them itself
            return self.view.aborted_transactions(_tp(piece), piece.start)

        # A storage listing per partition the brokers could not describe, and one Fetch per
        # piece: in parallel, as on S3 each costs a round trip.
        with ThreadPoolExecutor(max_workers=_PLANNING_THREADS) as pool:
            pieces = split_ranges(
                list(pool.map(listed, ranges)),
                min_partitions=self.options.min_partitions,
                max_records=self.options.max_records_per_partition,
            )
            aborted_per_piece = list(pool.map(aborted, pieces))
        return [
            OffsetRangePartition(
                topic=piece.topic,
                partition=piece.partition,
                start=piece.start,
                end=piece.end,
                settings=self.settings,
                replicas=replicas.get(_tp(piece), ()),
                objects=piece.objects,
                aborted=dropped,
            )
            for piece, dropped in zip(pieces, aborted_per_piece, strict=True)
        ]

    def _replicas(
        self, ranges: list[OffsetRange]
    ) -> dict[TopicPartition, tuple[ReplicaLocation, ...]]:
        """Per partition, the replicas whose storage holds its whole range, leader first."""
        if self.settings.mode == "broker":
            return {}
        tps = [_tp(r) for r in ranges]
        if any(tp not in self.view.partitions for tp in tps):
            self.view.topic_partitions()
        logs = self.view.replica_logs(tps)
        out: dict[TopicPartition, tuple[ReplicaLocation, ...]] = {}
        for r in ranges:
            tp = _tp(r)
            info = self.view.partitions.get(tp)
            isr = set(info.isr) if info is not None else set()
            good = [
                replica
                for replica in logs.get(tp, [])
                if (replica.is_leader or replica.broker_id in isr)
                and replica.log_start_offset <= r.start
                and replica.durable_end_offset >= r.end
            ]
            good.sort(key=_preference)
            out[tp] = tuple(ReplicaLocation(g.broker_id, g.log_dir) for g in good)
        return out

    def _located(
        self,
        ranges: list[OffsetRange],
        replicas: Mapping[TopicPartition, tuple[ReplicaLocation, ...]],
    ) -> dict[TopicPartition, tuple[Located, ...]]:
        """Per partition, the extents holding its range on its first replica's storage, as
        that replica's broker describes them (DescribeLogObjects: one request per broker, from
        its memory; no storage request). Partitions left out are listed (``_with_objects``)."""
        by_broker: dict[int, list[OffsetRange]] = {}
        for r in ranges:
            chosen = replicas.get(_tp(r), ())
            if chosen and chosen[0].broker_id not in self._no_log_objects:
                by_broker.setdefault(chosen[0].broker_id, []).append(r)
        if not by_broker:
            return {}

        def ask(broker: int) -> dict[TopicPartition, LogObjects | ReplogError]:
            wanted: dict[TopicPartition | tuple[str, int], tuple[int, int]] = {
                _tp(r): (r.start, r.end) for r in by_broker[broker]
            }
            try:
                return self.view.admin.describe_log_objects(broker, wanted)
            except UnsupportedVersionError as err:
                log.info(
                    "broker %d does not describe log objects (%s); listing its replicas' "
                    "segment objects instead",
                    broker,
                    err,
                )
                self._no_log_objects.add(broker)
            except ReplogError as err:
                log.info("DescribeLogObjects to broker %d failed: %s; listing instead", broker, err)
            return {}

        out: dict[TopicPartition, tuple[Located, ...]] = {}
        with ThreadPoolExecutor(max_workers=min(len(by_broker), _PLANNING_THREADS)) as pool:
            answers = dict(zip(by_broker, pool.map(ask, by_broker), strict=True))
        for broker, asked in by_broker.items():
            for r in asked:
                tp = _tp(r)
                found = answers[broker].get(tp)
                if found is None:
                    continue
                if isinstance(found, ReplogError):
                    log.info(
                        "broker %d did not describe %s: %s; listing instead", broker, tp, found
                    )
                    continue
                problem = _not_covering(found, r, replicas[tp][0])
                if problem is not None:
                    log.info("broker %d's extents of %s %s; listing instead", broker, tp, problem)
                    continue
                out[tp] = found.extents
        return out

    def _with_objects(self, r: OffsetRange, replicas: tuple[ReplicaLocation, ...]) -> OffsetRange:
        """``r`` with the segment objects of its first replica that overlap it."""
        if not replicas:
            return r
        listing = self._list_objects(_tp(r), replicas[0])
        if not listing:
            return r
        bases = [o.base_offset for o in listing]
        first = max((i for i, b in enumerate(bases) if b <= r.start), default=0)
        held = tuple(o for o in listing[first:] if o.base_offset < r.end)
        return OffsetRange(r.topic, r.partition, r.start, r.end, held)

    def _list_objects(self, tp: TopicPartition, replica: ReplicaLocation) -> list[Located]:
        key = (replica.log_dir, tp)
        try:
            reader = self._readers.get(key)
            if reader is None:
                options = {} if _is_local(replica.log_dir) else dict(self.settings.storage_options)
                reader = SegmentReader.open(replica.log_dir, tp.topic, tp.partition, **options)
                self._readers[key] = reader
            return list(reader.list_objects())
        except ReplogError as err:
            if self.settings.mode == "direct":
                raise
            log.info(
                "cannot list the segment objects of %s on %s (%s); cutting its range by offsets "
                "only (executors read through the brokers if they cannot reach it either)",
                tp,
                replica.log_dir,
                err,
            )
            return []


def _not_covering(found: LogObjects, r: OffsetRange, replica: ReplicaLocation) -> str | None:
    """Why ``found`` cannot be read for ``r`` from ``replica``'s storage (None: it can)."""
    if found.log_dir != replica.log_dir:
        return f"are on {found.log_dir}, not {replica.log_dir}"
    return extents_problem(found.extents, r.start, r.end)


def _tp(r: OffsetRange) -> TopicPartition:
    return TopicPartition(r.topic, r.partition)


def _preference(replica: ReplicaLog) -> tuple[bool, int]:
    return (not replica.is_leader, replica.broker_id)


def _json_of(offsets: Mapping[TopicPartition, int]) -> str:
    return json.dumps(SourceOffset(offsets).to_json())
