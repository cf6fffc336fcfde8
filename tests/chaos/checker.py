"""The checker: pure functions from a recorded :class:`History` and :class:`FinalState` to
anomalies. Nothing here talks to a cluster, so every rule is unit-tested on hand-made histories.

Each ``check_*`` function returns ``{kind: [example, ...]}`` (one entry per anomaly, worded for
a human); :func:`check` runs them all. The kinds, and the contract each one guards:

=================  ============================================================================
acked_lost         an acked record is absent from the final log (acks=all durability)
wrong_offset       an acked record is in the final log, but not at the offset it was acked at
                   (or, acked without an offset, in another partition)
duplicates         a value is stored twice (idempotence: a retried batch is appended once)
order              one producer's values are out of order within a partition
read_changed       a reader saw value V at offset O, and the final log has something else at O,
                   or nothing (what is below the HW never changes); or an output of the
                   consume-transform-produce loop names an input the final log does not hold
hw_backwards       a reader saw a partition's high watermark go down, or was told an offset
                   below a HW it had seen is out of range
aborted_visible    a read_committed reader, or the final read_committed log, shows a record of
                   an aborted transaction
committed_missing  a committed transaction is not wholly visible to read_committed, or one whose
                   outcome is unknown is partly visible (it must be all or nothing)
input_lost         a record of the consume-transform-produce loop's source, between where its
                   group started and the group's final committed offset, has no output in the
                   read_committed sink (exactly-once of the loop's inputs)
input_duplicated   such a record has several outputs there, or an output names an input at or
                   past the group's committed offset (the group would transform it again) or
                   before where the group started
replicas_differ    the replicas of a partition store different batches below the HW (base
                   offset, last offset, leader epoch, CRC), or one cannot be read there
corrupt_served     a reader was given a batch that failed its CRC check (only whole, CRC-valid
                   batches are served, also by a broker whose disk is full)
crashed_on_enospc  a broker whose disk filled up (disk_full) exited by itself
retention_early    retention deleted records younger than retention.ms by the true clock (a
                   partition younger than its retention.ms has a log start offset above 0)
timestamp_lookup   ListOffsets by a record's timestamp returned an offset past that record
slow_sigterm       a process took longer than the limit to exit after SIGTERM, or exited with a
                   failure (its graceful shutdown overran shutdown.timeout.ms)
not_recovered      after the heal, a process would not start or the cluster did not get back to
                   a full, caught-up ISR within the deadline, or a wiped broker did not rebuild
                   its replicas and rejoin every ISR within the fault's deadline, or a broker
                   whose disk filled up did not take writes again (rejoin every ISR) once it
                   had space
=================  ============================================================================
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from itertools import pairwise

from tests.chaos.history import (
    NO_OFFSET,
    TP,
    Ack,
    Fault,
    FinalState,
    History,
    StoredBatch,
    parse_producer_value,
    parse_transformed_value,
)

ANOMALY_KINDS = (
    "acked_lost",
    "wrong_offset",
    "duplicates",
    "order",
    "read_changed",
    "hw_backwards",
    "aborted_visible",
    "committed_missing",
    "input_lost",
    "input_duplicated",
    "replicas_differ",
    "corrupt_served",
    "crashed_on_enospc",
    "retention_early",
    "timestamp_lookup",
    "slow_sigterm",
    "not_recovered",
)

#: A graceful shutdown must end within this many seconds.
SIGTERM_LIMIT_S = 20.0

Found = dict[str, list[str]]


def _where(final: FinalState) -> dict[str, list[tuple[TP, int]]]:
    """Every value of the final read_uncommitted logs -> where it is stored."""
    where: dict[str, list[tuple[TP, int]]] = defaultdict(list)
    for tp, records in final.uncommitted.items():
        for offset, value in records.items():
            where[value].append((tp, offset))
    return where


def check_acks(acks: Iterable[Ack], final: FinalState) -> Found:
    """acked_lost and wrong_offset: each acked value is in the final log at its acked offset."""
    where = _where(final)
    found: Found = {"acked_lost": [], "wrong_offset": []}
    for ack in acks:
        tp = (ack.topic, ack.partition)
        if final.uncommitted.get(tp, {}).get(ack.offset) == ack.value:
            continue
        if ack.offset == NO_OFFSET and tp in {t for t, _ in where.get(ack.value, [])}:
            continue  # stored in its partition, which is all the client was told
        if ack.value in where:
            found["wrong_offset"].append(
                f"{ack.value} acked at {ack.topic}-{ack.partition}@{ack.offset}, stored at "
                + ", ".join(f"{t}-{p}@{o}" for (t, p), o in where[ack.value])
            )
        else:
            stored = final.uncommitted.get(tp, {}).get(ack.offset)
            found["acked_lost"].append(
                f"{ack.value} acked at {ack.topic}-{ack.partition}@{ack.offset} is gone "
                f"(the offset now holds {stored!r})"
            )
    return found


def check_duplicates(final: FinalState) -> Found:
    """duplicates: no value is stored twice, whether its send was acked, failed or unknown."""
    return {
        "duplicates": [
            f"{value} stored {len(places)} times: "
            + ", ".join(f"{t}-{p}@{o}" for (t, p), o in places)
            for value, places in _where(final).items()
            if len(places) > 1
        ]
    }


def check_order(final: FinalState) -> Found:
    """order: within a partition, each producer's values appear in the order it sent them."""
    found: list[str] = []
    for (topic, partition), records in sorted(final.uncommitted.items()):
        last: dict[str, tuple[int, int]] = {}  # producer -> (seq, offset) of its latest value
        for offset in sorted(records):
            parsed = parse_producer_value(records[offset])
            if parsed is None:
                continue
            producer, seq = parsed
            previous = last.get(producer)
            if previous is not None and seq < previous[0]:  # equal: a duplicate
                found.append(
                    f"{topic}-{partition}: {records[offset]} at offset {offset} follows "
                    f"{producer}-{previous[0]:06d} at offset {previous[1]}"
                )
            last[producer] = (seq, offset)
    return {"order": found}


def check_reads(history: History, final: FinalState) -> Found:
    """read_changed: what a reader was given stays at its offset in the final log (the
    read_committed log for the read_committed reader)."""
    found: list[str] = []
    for read in history.reads:
        logs = final.committed if read.reader == "read_committed" else final.uncommitted
        now = logs.get((read.topic, read.partition), {}).get(read.offset)
        if now != read.value:
            found.append(
                f"{read.reader} read {read.value} at {read.topic}-{read.partition}@{read.offset}; "
                f"the final log has {now!r} there"
            )
    return {"read_changed": found}


def check_high_watermarks(history: History) -> Found:
    """hw_backwards: each reader's observed HW of a partition never decreases, and no offset
    below it is ever refused as out of range."""
    found: list[str] = []
    last: dict[tuple[str, TP], int] = {}
    for hw in sorted(history.high_watermarks, key=lambda h: h.time):
        key = (hw.reader, (hw.topic, hw.partition))
        previous = last.get(key)
        if previous is not None and hw.high_watermark < previous:
            found.append(
                f"{hw.reader} saw the HW of {hw.topic}-{hw.partition} go from {previous} to "
                f"{hw.high_watermark}"
            )
        last[key] = hw.high_watermark
    found.extend(
        f"{o.reader} was refused offset {o.position} of {o.topic}-{o.partition} as out of range "
        f"(the log now ends at {o.end})"
        for o in history.out_of_range
    )
    return {"hw_backwards": found}


def check_transactions(history: History, final: FinalState) -> Found:
    """aborted_visible and committed_missing: read_committed shows a transaction whole or not
    at all; all of a committed one, none of an aborted one (during the run or at the end)."""
    visible = Counter(v for records in final.committed.values() for v in records.values())
    seen = {r.value for r in history.reads if r.reader == "read_committed"}
    found: Found = {"aborted_visible": [], "committed_missing": []}
    for txn in history.transactions:
        values = [value for _, value in txn.records]
        shown = [value for value in values if visible[value]]
        if txn.outcome == "aborted":
            leaked = sorted(set(shown) | (set(values) & seen))
            if leaked:
                found["aborted_visible"].append(
                    f"aborted transaction {txn.txn}: {', '.join(leaked)} visible to read_committed"
                )
        elif txn.outcome == "committed" and len(shown) < len(values):
            missing = sorted(set(values) - set(shown))
            found["committed_missing"].append(
                f"committed transaction {txn.txn}: {', '.join(missing)} not visible"
            )
        elif txn.outcome == "unknown" and 0 < len(shown) < len(values):
            found["committed_missing"].append(
                f"transaction {txn.txn} (outcome unknown) is partly visible: {', '.join(shown)} "
                f"of {', '.join(values)}"
            )
    return found


def check_transformer(history: History, final: FinalState) -> Found:
    """input_lost, input_duplicated (and read_changed): the read_committed outputs of the
    consume-transform-produce loop name each input of its group's range once, and nothing else.

    The range of a source partition runs from where the group started to its final committed
    offset. Aborted transactions count for nothing (their outputs are not visible), a
    transaction of unknown outcome for what is visible of it; a record with an empty value
    needs no output. Skipped if the group's committed offsets were not read."""
    found: Found = {"input_lost": [], "input_duplicated": [], "read_changed": []}
    if not final.transformer_committed:
        return found
    (source,) = {topic for topic, _ in final.transformer_committed}
    outputs: dict[TP, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for records in final.committed.values():
        for value in records.values():
            named = parse_transformed_value(value)
            if named is not None:
                outputs[(source, named[0])][named[1]].append(value)
    for tp in sorted(set(history.transformer_starts) | set(outputs)):
        name = f"{tp[0]}-{tp[1]}"
        start = history.transformer_starts.get(tp, 0)
        end = max(final.transformer_committed.get(tp, -1), start)
        log = final.committed.get(tp, {})
        made = outputs.get(tp, {})
        for offset in range(start, end):
            if log.get(offset) and not made.get(offset):
                found["input_lost"].append(
                    f"{name}@{offset} ({log[offset]}) is below the group's committed offset {end} "
                    "and no read_committed output names it"
                )
        for offset, values in sorted(made.items()):
            if not start <= offset < end:
                found["input_duplicated"].append(
                    f"{', '.join(values)} name {name}@{offset}, "
                    + (
                        f"before where the group started ({start})"
                        if offset < start
                        else f"at or past the group's committed offset {end} (read again)"
                    )
                )
            elif not log.get(offset):
                found["read_changed"].append(
                    f"{', '.join(values)} name {name}@{offset}, where the final log holds "
                    f"{log.get(offset)!r}"
                )
            elif len(values) > 1:
                found["input_duplicated"].append(
                    f"{name}@{offset} ({log[offset]}) was transformed {len(values)} times: "
                    + ", ".join(values)
                )
    return found


def _describe(batch: StoredBatch | None) -> str:
    if batch is None:
        return "nothing"
    return (
        f"[{batch.base_offset}..{batch.last_offset}] epoch {batch.leader_epoch} "
        f"crc {batch.crc:#010x}"
    )


def check_replicas(final: FinalState) -> Found:
    """replicas_differ: below the HW, every replica of a partition stores the same batches."""
    found: list[str] = []
    for tp, replicas in sorted(final.replicas.items()):
        name = f"{tp[0]}-{tp[1]}"
        errors = {b: r for b, r in replicas.items() if isinstance(r, str)}
        for broker, error in sorted(errors.items()):
            found.append(f"{name}: replica on broker {broker} unreadable below the HW: {error}")
        logs = {b: r for b, r in replicas.items() if not isinstance(r, str)}
        if len({tuple(batches) for batches in logs.values()}) <= 1:
            continue
        brokers = sorted(logs)
        length = max(len(batches) for batches in logs.values())
        i = next(
            i
            for i in range(length)
            if len({logs[b][i] if i < len(logs[b]) else None for b in brokers}) > 1
        )
        found.append(
            f"{name} (HW {final.high_watermarks.get(tp)}): replicas differ from batch {i}: "
            + "; ".join(
                f"broker {b} {_describe(logs[b][i] if i < len(logs[b]) else None)}" for b in brokers
            )
        )
    return {"replicas_differ": found}


def check_shutdowns(final: FinalState, limit_s: float = SIGTERM_LIMIT_S) -> Found:
    """slow_sigterm: every process exits by itself within ``limit_s`` of SIGTERM."""
    return {
        "slow_sigterm": [
            f"{name} {'did not shut down cleanly' if took is None else f'took {took:.1f} s'} "
            "after SIGTERM "
            f"(limit {limit_s:.0f} s)"
            for name, took in sorted(final.sigterm_s.items())
            if took is None or took > limit_s
        ]
    }


def check_faults(faults: Iterable[Fault]) -> Found:
    """not_recovered and crashed_on_enospc: what a fault's own observations show did not come
    back."""
    found: Found = {"not_recovered": [], "crashed_on_enospc": []}
    for fault in faults:
        broker = fault.detail.get("broker")
        if fault.fault_class == "disk_full" and fault.detail.get("exited"):
            found["crashed_on_enospc"].append(
                f"broker {broker} exited while its disk was full (from {fault.start:.1f})"
            )
        if fault.fault_class in ("wipe_restart", "disk_full") and fault.detail.get("not_in_isr"):
            what = "wiped" if fault.fault_class == "wipe_restart" else "out of disk space"
            found["not_recovered"].append(
                f"broker {broker} {what} at {fault.start:.1f} was not back in the ISR of "
                f"{fault.detail['not_in_isr']} by the deadline"
            )
    return found


def check_corrupt_reads(history: History) -> Found:
    """corrupt_served: no reader is ever given a batch that fails its CRC check."""
    return {
        "corrupt_served": [
            f"{c.reader} was given a corrupt batch at {c.time:.1f}: {c.error}"
            for c in history.corrupt_reads
        ]
    }


def check_clocks(final: FinalState) -> Found:
    """retention_early and timestamp_lookup: what a node's wall clock must not decide."""
    return {
        "retention_early": [
            f"{tp[0]}-{tp[1]}: log start offset {r.log_start_offset}, though the partition is "
            f"{r.age_s:.0f} s old and its retention.ms is {r.retention_ms}"
            for tp, r in sorted(final.retention.items())
            if r.log_start_offset > 0 and r.age_s * 1000 < r.retention_ms
        ],
        "timestamp_lookup": [
            f"{t.topic}-{t.partition}: ListOffsets({t.timestamp}) returned {t.found}, past "
            f"offset {t.offset}, which has that timestamp"
            for t in final.timestamp_lookups
            if t.found < 0 or t.found > t.offset
        ],
    }


def check(history: History, final: FinalState) -> Found:
    """Every check; ``{kind: examples}`` with every kind of :data:`ANOMALY_KINDS` present.
    The checks against the final logs run only if they were read in full."""
    found: Found = {kind: [] for kind in ANOMALY_KINDS}
    parts = [
        check_high_watermarks(history),
        check_replicas(final),
        check_shutdowns(final),
        {"not_recovered": list(final.not_recovered)},
        check_faults(history.faults),
        check_corrupt_reads(history),
        check_clocks(final),
    ]
    if final.logs_read:
        parts += [
            check_acks(history.acks, final),
            check_duplicates(final),
            check_order(final),
            check_reads(history, final),
            check_transactions(history, final),
            check_transformer(history, final),
        ]
    for part in parts:
        for kind, examples in part.items():
            found[kind].extend(examples)
    return found


def longest_without_ack(
    acks: Iterable[Ack], faults: Iterable[Fault], end: float
) -> dict[str, float]:
    """Per fault class, the longest time a partition went without an ack because of its faults.

    A gap between consecutive acks of a partition (or from its last ack to ``end``, when the
    producers stopped) belongs to the fault whose window holds the gap's end: a fault's window
    runs from its start to the next fault's start (or ``end``), so a slow recovery counts too,
    and the ack just before a fault does not make the previous fault's window look long.
    Partitions are measured separately: a failover stalls its own partitions only.
    """
    by_partition: dict[TP, list[float]] = defaultdict(list)
    for ack in acks:
        by_partition[(ack.topic, ack.partition)].append(ack.time)
    ordered = sorted(faults, key=lambda f: f.start)
    out: dict[str, float] = {}
    for i, fault in enumerate(ordered):
        window_end = ordered[i + 1].start if i + 1 < len(ordered) else end
        worst = 0.0
        for times in by_partition.values():
            for before, after in pairwise([*sorted(times), end]):
                if fault.start < after <= window_end:
                    worst = max(worst, after - before)
        out[fault.fault_class] = round(max(out.get(fault.fault_class, 0.0), worst), 2)
    return out
