"""One schedule from start to verdict: a fresh cluster, the workloads, the nemesis, the heal,
the final reads, the SIGTERMs, the replica comparison and the checker.

:func:`run_schedule` returns the schedule's result as a JSON-ready dict (the line
``python -m tests.chaos`` prints); the anomalies' examples go to ``anomalies.json`` in the
schedule's directory, beside every process's stderr.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from logstore.errors import ReplogError
from replication.client import Admin, TopicPartition
from tests.chaos.checker import SIGTERM_LIMIT_S, check, longest_without_ack
from tests.chaos.cluster import ChaosCluster
from tests.chaos.history import NO_OFFSET, FinalState, History, Retention, TimestampLookup
from tests.chaos.kafka_workload import (
    KafkaIdempotentWriter,
    KafkaTransformer,
    committed_offsets,
    kafka_workers,
)
from tests.chaos.nemesis import TRANSACTION_TOPIC, Nemesis, plan
from tests.chaos.workload import (
    IdempotentWriter,
    Reader,
    TransactionalWriter,
    Worker,
    read_all,
)
from tests.helpers import wait_until
from tests.readback import read_to_end

TOPIC = "events"
TXN_TOPIC = "txn-events"
PARTITIONS = 3
PRODUCERS = 3
TOPIC_CONFIGS = {"min.insync.replicas": "2"}
#: How long the cluster may take to get back to a full, caught-up ISR after the faults.
RECOVERY_TIMEOUT_S = 60.0
#: With clock_jump: a retention.ms shorter than a step of a node's clock (6..10 minutes), longer
#: than a schedule, so retention by a stepped clock would delete what the true one keeps; and
#: small segments, so there are whole segments for it to delete.
CLOCK_TOPIC_CONFIGS = {"retention.ms": "300000", "segment.bytes": "16384"}
#: ListOffsets by timestamp per partition with clock_jump (records evenly spread).
LOOKUPS_PER_PARTITION = 20
#: The size of each broker's disk when disk_full is among the classes: what a schedule writes
#: fits many times over.
DISK_MB = 64
#: Examples of each anomaly kind put in the JSON line (all of them go to anomalies.json).
EXAMPLES_PER_KIND = 3
#: Which clients the workloads use: replog's own, confluent-kafka's through the brokers'
#: Kafka listeners (tests.chaos.kafka_workload), or both at once.
WORKLOADS = ("replog", "kafka", "mix")


def run_schedule(
    seed: int,
    classes: Sequence[str],
    duration_s: float,
    workdir: Path,
    *,
    keep: bool = False,
    wal: bool = True,
    workload: str = "replog",
) -> dict[str, Any]:
    """Run one schedule in ``workdir/seed-<seed>``; its directory is removed if it passed
    (unless ``keep``). ``wal``: the brokers write through the broker WAL (log.wal.enable, the
    default); False: the per-partition layout. ``workload``: one of :data:`WORKLOADS`."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    began = time.monotonic()
    data_dir = workdir / f"seed-{seed}"
    if data_dir.exists():
        shutil.rmtree(data_dir)
    history = History()
    final = FinalState()
    clock_jumps = "clock_jump" in classes
    cluster = ChaosCluster(
        data_dir,
        wal=wal,
        disk_mb=DISK_MB if "disk_full" in classes else None,
        fake_clocks=clock_jumps,
        netns=bool({"net_partition", "controller_isolated"} & set(classes)),
        kafka=workload != "replog",
    )
    configs = {**TOPIC_CONFIGS, **(CLOCK_TOPIC_CONFIGS if clock_jumps else {})}
    workers: list[Worker] = []
    created = time.monotonic()  # before the topics: their age is never underestimated
    try:
        cluster.start()
        produce_end = _run_faults(
            cluster, seed, classes, duration_s, history, workers, configs, workload
        )
        _settle(
            cluster,
            workers,
            history,
            final,
            (lambda: _check_clocks(cluster, int(configs["retention.ms"]), created, final))
            if clock_jumps
            else None,
        )
    finally:
        for worker in workers:
            worker.stop()
        cluster.close()
        for worker in workers:
            worker.join(10)
    found = check(history, final)
    result = {
        **_result(seed, classes, history, final, found, produce_end, began, data_dir),
        "wal": wal,
        "workload": workload,
    }
    (data_dir / "anomalies.json").write_text(json.dumps(found, indent=1))
    if result["ok"] and not keep:
        shutil.rmtree(data_dir, ignore_errors=True)
    return result


def _run_faults(
    cluster: ChaosCluster,
    seed: int,
    classes: Sequence[str],
    duration_s: float,
    history: History,
    workers: list[Worker],
    topic_configs: dict[str, str],
    workload: str,
) -> float:
    """Topics, workloads (added to ``workers`` as they start), then the nemesis. Returns when
    the producers stopped; the readers go on."""
    tps = [TopicPartition(t, p) for t in (TOPIC, TXN_TOPIC) for p in range(PARTITIONS)]
    producers: list[Worker] = []
    readers: list[Worker] = []
    with Admin(bootstrap_servers=cluster.bootstrap, default_api_timeout_ms=30000) as admin:
        # __transaction_state gets min(3, live brokers) replicas: wait for all of them
        cluster.wait_registered(admin, time.monotonic() + RECOVERY_TIMEOUT_S)
        for topic in (TOPIC, TXN_TOPIC):
            admin.create_topic(topic, PARTITIONS, 3, topic_configs)
        if workload in ("replog", "mix"):
            producers += [
                IdempotentWriter(f"p{i}", cluster.bootstrap, TOPIC, PARTITIONS, history)
                for i in range(1, PRODUCERS + 1)
            ]
            producers.append(
                TransactionalWriter(cluster.bootstrap, TXN_TOPIC, PARTITIONS, history, seed)
            )
            readers += [
                Reader("read_uncommitted", cluster.bootstrap, tps, history),
                Reader("read_committed", cluster.bootstrap, tps, history),
            ]
        if workload in ("kafka", "mix"):
            writers, members = kafka_workers(
                cluster.kafka_bootstrap, TOPIC, TXN_TOPIC, PARTITIONS, PRODUCERS, history, seed
            )
            producers += writers
            readers += members
        for worker in producers:
            worker.init()  # a transactional id's first use creates __transaction_state
        problems = cluster.wait_caught_up(
            admin, [TOPIC, TXN_TOPIC, TRANSACTION_TOPIC], time.monotonic() + RECOVERY_TIMEOUT_S
        )
        if problems:
            raise RuntimeError(f"the fresh cluster never got a full ISR: {problems}")
    for worker in producers + readers:
        workers.append(worker)
        worker.start()
    nemesis = Nemesis(cluster, TOPIC, PARTITIONS, history)
    try:
        _wait_for_acks(
            history,
            {w.name for w in producers if isinstance(w, IdempotentWriter | KafkaIdempotentWriter)},
            transaction=any(isinstance(w, KafkaTransformer) for w in producers),
        )
        nemesis.run(plan(seed, classes, count=int(duration_s) + 1), duration_s)
    finally:
        nemesis.close()
    return stop_producers(producers)


def stop_producers(producers: Sequence[Worker]) -> float:
    """Stop ``producers`` and wait for each (RuntimeError after 60 s); returns when they were
    told to stop."""
    for worker in producers:
        worker.stop()
    produce_end = time.monotonic()
    for worker in producers:
        if not worker.join(60):
            raise RuntimeError(f"workload {worker.name} did not stop within 60 s")
    return produce_end


def _wait_for_acks(
    history: History, producers: set[str], *, transaction: bool = False, timeout_s: float = 30.0
) -> None:
    """Until every producer had an ack on the healthy cluster (and, with ``transaction``, a
    transaction ended; AssertionError after ``timeout_s``): the faults start on a cluster that
    works."""
    wait_until(
        lambda: (
            producers <= {ack.producer for ack in history.acks}
            and (not transaction or bool(history.transactions))
        ),
        timeout=timeout_s,
        interval=0.05,
        message=f"an ack for each of {sorted(producers)} on a healthy cluster"
        + (", and a transaction" if transaction else ""),
    )


def _settle(
    cluster: ChaosCluster,
    workers: list[Worker],
    history: History,
    final: FinalState,
    after_read: Callable[[], None] | None = None,
) -> None:
    """Heal, wait for a caught-up ISR, read every log in full (then call ``after_read``, if
    they could be read), SIGTERM everything, read every replica's stored batches. Fills
    ``final``."""
    final.not_recovered += cluster.heal()
    replica_sets: dict[tuple[str, int], list[int]] = {}
    tps = [TopicPartition(t, p) for t in (TOPIC, TXN_TOPIC) for p in range(PARTITIONS)]
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    with Admin(bootstrap_servers=cluster.bootstrap, default_api_timeout_ms=10000) as admin:
        final.not_recovered += cluster.wait_caught_up(
            admin, [TOPIC, TXN_TOPIC, TRANSACTION_TOPIC], deadline
        )
        final.not_recovered += _open_transactions(admin, tps, deadline + 30)
        try:
            final.uncommitted, final.high_watermarks = read_all(
                cluster.bootstrap, tps, "read_uncommitted", deadline + 30
            )
            final.committed, _ = read_all(cluster.bootstrap, tps, "read_committed", deadline + 30)
            replica_sets = cluster.replica_sets(admin, [TOPIC, TXN_TOPIC, TRANSACTION_TOPIC])
            state = TopicPartition(TRANSACTION_TOPIC, 0)
            final.high_watermarks[(TRANSACTION_TOPIC, 0)] = admin.list_offsets({state: "latest"})[
                state
            ]
        except (ReplogError, TimeoutError) as err:
            final.logs_read = False
            final.not_recovered.append(f"the final logs could not be read: {err}")
    transformer = next((w for w in workers if isinstance(w, KafkaTransformer)), None)
    if transformer is not None and final.logs_read:
        try:
            final.transformer_committed = committed_offsets(
                cluster.kafka_bootstrap, transformer.name, TOPIC, PARTITIONS, RECOVERY_TIMEOUT_S
            )
        except TimeoutError as err:
            final.not_recovered.append(f"the transformer's committed offsets are unknown: {err}")
    if after_read is not None and final.logs_read:
        after_read()
    for worker in workers:
        worker.stop()
    for worker in workers:
        worker.join(30)
    errors = [f"{w.name}: {w.error!r}" for w in workers if w.error is not None]
    if errors:
        raise RuntimeError(f"workload threads failed (a harness bug): {errors}")
    final.sigterm_s = cluster.stop_all(SIGTERM_LIMIT_S)
    for (topic, partition), hw in sorted(final.high_watermarks.items()):
        final.replicas[(topic, partition)] = {
            broker: cluster.replica_batches(broker, topic, partition, hw)
            for broker in replica_sets.get((topic, partition), sorted(cluster.brokers))
        }


def _open_transactions(admin: Admin, tps: list[TopicPartition], deadline: float) -> list[str]:
    """Wait until no transaction is open on ``tps`` (each LSO is the HW: the producers have
    stopped, and an open transaction times out), so that the final read_committed logs and
    the group offsets agree on every outcome. What is still open at ``deadline``, one line
    each."""
    while True:
        try:
            hws = admin.list_offsets(dict.fromkeys(tps, "latest"))
            lsos = admin.list_offsets(
                dict.fromkeys(tps, "latest"), isolation_level="read_committed"
            )
            still = [
                f"{tp.topic}-{tp.partition}: a transaction is still open (LSO {lsos[tp]}, "
                f"HW {hws[tp]})"
                for tp in tps
                if lsos[tp] < hws[tp]
            ]
        except ReplogError as err:
            still = [f"the LSOs could not be read: {err}"]
        if not still or time.monotonic() > deadline:
            return still
        time.sleep(0.2)


def _check_clocks(
    cluster: ChaosCluster, retention_ms: int, created: float, final: FinalState
) -> None:
    """Fill ``final.retention`` (log start offsets) and ``final.timestamp_lookups`` (each
    partition's records looked up by their timestamps), before the SIGTERMs."""
    tps = [TopicPartition(t, p) for t in (TOPIC, TXN_TOPIC) for p in range(PARTITIONS)]
    try:
        records = read_to_end(
            cluster.bootstrap, tps, isolation_level="read_uncommitted", timeout=30
        ).records
        with Admin(bootstrap_servers=cluster.bootstrap, default_api_timeout_ms=10000) as admin:
            starts = admin.list_offsets(dict.fromkeys(tps, "earliest"))
            age_s = time.monotonic() - created
            for tp in tps:
                final.retention[(tp.topic, tp.partition)] = Retention(
                    starts[tp], retention_ms, round(age_s, 1)
                )
                mine = [r for r in records if (r.topic, r.partition) == (tp.topic, tp.partition)]
                step = max(len(mine) // LOOKUPS_PER_PARTITION, 1)
                for record in mine[::step]:
                    found = admin.list_offsets({tp: record.timestamp})[tp]
                    final.timestamp_lookups.append(
                        TimestampLookup(
                            tp.topic, tp.partition, record.offset, record.timestamp, found
                        )
                    )
    except (ReplogError, TimeoutError) as err:
        final.not_recovered.append(f"the clock checks could not read the logs: {err}")


def _result(
    seed: int,
    classes: Sequence[str],
    history: History,
    final: FinalState,
    found: dict[str, list[str]],
    produce_end: float,
    began: float,
    data_dir: Path,
) -> dict[str, Any]:
    start = history.faults[0].start if history.faults else began
    outcomes = [t.outcome for t in history.transactions]
    counts = {kind: len(examples) for kind, examples in found.items()}
    return {
        "seed": seed,
        "classes": sorted(set(classes)),
        "faults": [
            {
                "class": f.fault_class,
                "at_s": round(f.start - start, 2),
                "took_s": round(f.end - f.start, 2),
                **f.detail,
            }
            for f in history.faults
        ],
        "acked": len(history.acks),
        "acked_without_offset": sum(a.offset == NO_OFFSET for a in history.acks),
        "send_failures": len(history.send_failures),
        "transactions": {o: outcomes.count(o) for o in ("committed", "aborted", "unknown")},
        "reads": len(history.reads),
        **({"timestamp_lookups": len(final.timestamp_lookups)} if final.retention else {}),
        **(
            {"log_start_offsets": sorted({r.log_start_offset for r in final.retention.values()})}
            if final.retention
            else {}
        ),
        "anomalies": counts,
        "examples": {k: v[:EXAMPLES_PER_KIND] for k, v in found.items() if v},
        "max_no_ack_s": longest_without_ack(history.acks, history.faults, produce_end),
        "sigterm_s": final.sigterm_s,
        "duration_s": round(time.monotonic() - began, 1),
        "workdir": str(data_dir),
        "ok": not any(counts.values()),
    }
