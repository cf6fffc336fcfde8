"""``python -m tests.chaos.soak``: one long run of mixed load and recoverable faults against a
chaos cluster (2 controllers, 3 brokers), sampled as it goes, checked at the end.

    python -m tests.chaos.soak --minutes 60                      # a fault every 3 minutes
    python -m tests.chaos.soak --minutes 1 --fault-every-s 20 --sample-every-s 5

The load: idempotent producers (acks=all) and a transactional producer, as in a chaos schedule,
read back by a read_uncommitted and a read_committed reader; a consumer group of two members
committing what they read; an idempotent producer updating a few keys of a compacted topic.
Every ``--fault-every-s`` one fault of :data:`SOAK_FAULTS` (the nemesis's classes that need no
special cluster and leave every store in place) is injected and healed. Every
``--sample-every-s`` the :mod:`~tests.chaos.sampler` records each node process and store (one
JSON line each in ``--samples``). At the end the cluster is healed, read in full and checked as
a schedule is (:func:`tests.chaos.checker.check`), and so is the compacted topic (the latest
acked record of every key is there). Then one JSON line: the schedule's result, the series'
slopes per hour over the second half of the run, and the series that grow.

Exit status 0 if nothing was found wrong and no series grows, 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from logstore.errors import ReplogError
from replication.client import Admin, Consumer, TopicPartition
from tests.chaos.checker import check
from tests.chaos.cluster import ChaosCluster
from tests.chaos.history import FinalState, History
from tests.chaos.nemesis import FAULT_CLASSES, TRANSACTION_TOPIC, Nemesis, plan
from tests.chaos.runner import (
    PARTITIONS,
    RECOVERY_TIMEOUT_S,
    TOPIC,
    TOPIC_CONFIGS,
    TXN_TOPIC,
    _result,
    _settle,
    _wait_for_acks,
    stop_producers,
)
from tests.chaos.sampler import process_stats, slopes, tree_size
from tests.chaos.workload import (
    CLIENT_SETTINGS,
    IdempotentWriter,
    Reader,
    TransactionalWriter,
    Worker,
)
from tests.readback import read_to_end

log = logging.getLogger(__name__)

#: The recoverable faults: none needs tmpfs disks, faked clocks or network namespaces, and none
#: empties a store (wipe_restart would reset a storage root's series).
SOAK_FAULTS = tuple(
    c
    for c in FAULT_CLASSES
    if c not in ("disk_full", "clock_jump", "net_partition", "controller_isolated", "wipe_restart")
)
COMPACTED_TOPIC = "soak-compacted"
#: Small segments and a low dirty ratio: the cleaner has whole segments to clean every few
#: seconds of updates.
COMPACTED_CONFIGS = {
    **TOPIC_CONFIGS,
    "cleanup.policy": "compact",
    "segment.bytes": "32768",
    "min.cleanable.dirty.ratio": "0.2",
}
COMPACTED_KEYS = 20
GROUP = "soak-group"
GROUP_MEMBERS = 2
PRODUCERS = 2
#: Seconds between two sends of each idempotent producer (lighter than a schedule's: an hour of
#: it on a shared machine).
PRODUCE_INTERVAL_S = 0.05
INTERNAL_TOPICS = ("__consumer_offsets", TRANSACTION_TOPIC)


class CompactedWriter(IdempotentWriter):
    """Updates ``COMPACTED_KEYS`` keys of the compacted topic round-robin, with an idempotent
    writer's producer; remembers the latest acked offset and value of each key (its acks are
    not in the schedule's history: the checker's rules are for logs that keep every record)."""

    def __init__(self, bootstrap: str, interval_s: float = 0.05) -> None:
        super().__init__(
            "compacted", bootstrap, COMPACTED_TOPIC, PARTITIONS, History(), interval_s=interval_s
        )
        self.latest: dict[str, tuple[int, str]] = {}
        self.acked = 0
        self.failed = 0
        self.lock = threading.Lock()

    def run(self) -> None:
        producer = self._producer()
        seq = 0
        try:
            while not self.stopping.is_set():
                key, value = f"k{seq % COMPACTED_KEYS}", f"c-{seq}"
                seq += 1
                try:
                    future = producer.send(self.topic, value.encode(), key=key.encode())
                except ReplogError as err:
                    log.info("compacted: send failed: %s", err)
                    self.failed += 1
                    self.stopping.wait(0.5)
                    continue
                future.add_done_callback(
                    lambda f, k=key, v=value: self._update(f, k, v)  # type: ignore[misc]
                )
                self.stopping.wait(self.interval_s)
            producer.flush(timeout=30)
        except ReplogError as err:
            log.info("compacted: flush at the end failed: %s", err)
        finally:
            producer.close(timeout=10)

    def _update(self, future: Any, key: str, value: str) -> None:
        if future.exception() is not None:
            self.failed += 1
            return
        offset = future.result().offset
        with self.lock:
            self.acked += 1
            if offset > self.latest.get(key, (-1, ""))[0]:
                self.latest[key] = (offset, value)


class GroupMember(Worker):
    """A member of ``GROUP`` subscribed to the events topic, committing after every poll that
    returned records."""

    def __init__(self, name: str, bootstrap: str) -> None:
        self.name = name
        super().__init__()
        self.bootstrap = bootstrap
        self.commits = 0
        self.records = 0

    def run(self) -> None:
        consumer = Consumer(
            bootstrap_servers=self.bootstrap,
            client_id=self.name,
            group_id=GROUP,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=200,
            default_api_timeout_ms=5000,
            **CLIENT_SETTINGS,
        )
        consumer.subscribe([TOPIC])
        try:
            while not self.stopping.is_set():
                try:
                    records = consumer.poll(timeout_ms=500)
                    if records:
                        consumer.commit()
                        self.commits += 1
                        self.records += len(records)
                except ReplogError as err:  # a rebalance or a fault: poll again
                    log.info("%s: %s", self.name, err)
                    self.stopping.wait(0.2)
        finally:
            consumer.close()


class Sampler(Worker):
    """Every ``interval_s``, one sample (see :mod:`tests.chaos.sampler`) written to ``out``."""

    name = "sampler"

    def __init__(self, cluster: ChaosCluster, out: IO[str], interval_s: float) -> None:
        super().__init__()
        self.cluster = cluster
        self.out = out
        self.interval_s = interval_s
        self.began = time.monotonic()
        self.samples: list[dict[str, Any]] = []

    def run(self) -> None:
        with Admin(
            bootstrap_servers=self.cluster.bootstrap,
            request_timeout_ms=3000,
            default_api_timeout_ms=4000,
        ) as admin:
            while not self.stopping.wait(self.interval_s):
                sample = self.sample(admin)
                self.samples.append(sample)
                self.out.write(json.dumps(sample) + "\n")
                self.out.flush()

    def sample(self, admin: Admin) -> dict[str, Any]:
        cluster = self.cluster
        sample: dict[str, Any] = {
            "t": round(time.monotonic() - self.began, 1),
            "nodes": {
                name: process_stats(proc.pid) if proc.alive else None
                for name, proc in cluster.processes().items()
            },
            "metadata": tree_size(cluster.metadata_root),
            "storage": {f"broker-{i}": tree_size(b.log_dir) for i, b in cluster.brokers.items()},
        }
        try:
            spans = self._spans(admin)
            sample["internal"] = {t: spans[t] for t in INTERNAL_TOPICS if t in spans}
            sample["records"] = sum(spans.values())
        except ReplogError as err:
            sample["errors"] = [f"offsets: {err}"]
        try:
            tps = [TopicPartition(COMPACTED_TOPIC, p) for p in range(PARTITIONS)]
            read = read_to_end(
                cluster.bootstrap, tps, isolation_level="read_uncommitted", timeout=10
            )
            sample["compacted"] = len(read.records)
        except (ReplogError, TimeoutError) as err:
            sample.setdefault("errors", []).append(f"compacted read: {err}")
        return sample

    @staticmethod
    def _spans(admin: Admin) -> dict[str, int]:
        """Each topic's records: log end minus log start, over its partitions."""
        out: dict[str, int] = {}
        for topic in (TOPIC, TXN_TOPIC, COMPACTED_TOPIC, *INTERNAL_TOPICS):
            tps = [
                TopicPartition(topic, p.partition) for p in admin.describe_topic(topic).partitions
            ]
            ends = admin.list_offsets(dict.fromkeys(tps, "latest"))
            starts = admin.list_offsets(dict.fromkeys(tps, "earliest"))
            out[topic] = sum(ends[tp] - starts[tp] for tp in tps)
        return out


def _start_load(cluster: ChaosCluster, seed: int, history: History, workers: list[Worker]) -> None:
    """Topics, then every workload (added to ``workers`` as they start)."""
    with Admin(bootstrap_servers=cluster.bootstrap, default_api_timeout_ms=30000) as admin:
        cluster.wait_registered(admin, time.monotonic() + RECOVERY_TIMEOUT_S)
        for topic in (TOPIC, TXN_TOPIC):
            admin.create_topic(topic, PARTITIONS, 3, TOPIC_CONFIGS)
        admin.create_topic(COMPACTED_TOPIC, PARTITIONS, 3, COMPACTED_CONFIGS)
        txn = TransactionalWriter(cluster.bootstrap, TXN_TOPIC, PARTITIONS, history, seed)
        txn.init()
    tps = [TopicPartition(t, p) for t in (TOPIC, TXN_TOPIC) for p in range(PARTITIONS)]
    load: list[Worker] = [
        *(
            IdempotentWriter(
                f"p{i}",
                cluster.bootstrap,
                TOPIC,
                PARTITIONS,
                history,
                interval_s=PRODUCE_INTERVAL_S,
            )
            for i in range(1, PRODUCERS + 1)
        ),
        txn,
        CompactedWriter(cluster.bootstrap),
        *(GroupMember(f"member-{i}", cluster.bootstrap) for i in range(GROUP_MEMBERS)),
        Reader("read_uncommitted", cluster.bootstrap, tps, history),
        Reader("read_committed", cluster.bootstrap, tps, history),
    ]
    for worker in load:
        workers.append(worker)
        worker.start()
    _wait_for_acks(history, {f"p{i}" for i in range(1, PRODUCERS + 1)})


def _inject_faults(
    cluster: ChaosCluster, seed: int, history: History, end: float, every_s: float
) -> None:
    """One planned fault every ``every_s`` (the first after ``every_s`` of health), none
    starting later than ``every_s / 2`` before ``end``; returns at ``end``."""
    nemesis = Nemesis(cluster, TOPIC, PARTITIONS, history)
    next_at = time.monotonic() + every_s
    try:
        for fault in plan(seed, SOAK_FAULTS, count=int((end - time.monotonic()) / every_s) + 1):
            if next_at > end - every_s / 2:
                break
            time.sleep(max(0.0, next_at - time.monotonic()))
            nemesis.run([dataclasses.replace(fault, gap_s=0.0)], float("inf"))
            next_at += every_s
    finally:
        nemesis.close()
    time.sleep(max(0.0, end - time.monotonic()))


def check_compacted(cluster: ChaosCluster, writer: CompactedWriter) -> list[str]:
    """compacted_latest_lost: the final compacted topic lacks a key's latest acked record (it
    must hold it at its offset, or a later record of that key)."""
    tps = [TopicPartition(COMPACTED_TOPIC, p) for p in range(PARTITIONS)]
    try:
        with Admin(bootstrap_servers=cluster.bootstrap, default_api_timeout_ms=10000) as admin:
            lagging = cluster.wait_caught_up(
                admin, [COMPACTED_TOPIC], time.monotonic() + RECOVERY_TIMEOUT_S
            )
        if lagging:
            return [f"the compacted topic never caught up: {lagging}"]
        read = read_to_end(cluster.bootstrap, tps, isolation_level="read_uncommitted", timeout=60)
    except (ReplogError, TimeoutError) as err:
        return [f"the compacted topic could not be read: {err}"]
    stored: dict[str, dict[int, str]] = {}
    for r in read.records:
        if r.key is not None and r.value is not None:
            stored.setdefault(r.key.decode(), {})[r.offset] = r.value.decode()
    found = []
    for key, (offset, value) in sorted(writer.latest.items()):
        mine = stored.get(key, {})
        if mine.get(offset, value) != value or max(mine, default=-1) < offset:
            found.append(
                f"{key}: latest acked {value}@{offset}, stored {sorted(mine.items())[-3:]}"
            )
    return found


def run_soak(
    minutes: float,
    fault_every_s: float,
    seed: int,
    workdir: Path,
    samples_path: Path,
    sample_every_s: float,
) -> dict[str, Any]:
    """The whole soak; returns its result line (see the module's docstring)."""
    began = time.monotonic()
    data_dir = workdir / f"soak-{seed}"
    history, final = History(), FinalState()
    cluster = ChaosCluster(data_dir)
    workers: list[Worker] = []
    with open(samples_path, "w") as out:
        sampler = Sampler(cluster, out, sample_every_s)
        try:
            cluster.start()
            sampler.began = time.monotonic()
            sampler.start()
            _start_load(cluster, seed, history, workers)
            _inject_faults(cluster, seed, history, sampler.began + minutes * 60, fault_every_s)
            sampler.stop()
            sampler.join(60)
            produce_end = stop_producers([w for w in workers if not isinstance(w, Reader)])
            compacted = next(w for w in workers if isinstance(w, CompactedWriter))
            compacted_lost = check_compacted(cluster, compacted)
            _settle(cluster, workers, history, final)
        finally:
            sampler.stop()
            for worker in workers:
                worker.stop()
            cluster.close()
    found = {**check(history, final), "compacted_latest_lost": compacted_lost}
    result = _result(seed, list(SOAK_FAULTS), history, final, found, produce_end, began, data_dir)
    series = slopes(sampler.samples, from_t=minutes * 60 / 2)
    members = [w for w in workers if isinstance(w, GroupMember)]
    result.update(
        {
            "soak": True,
            "minutes": minutes,
            "fault_every_s": fault_every_s,
            "samples": len(sampler.samples),
            "samples_file": str(samples_path),
            "nodes_sampled": sorted(
                {n for s in sampler.samples for n, stats in s["nodes"].items() if stats}
            ),
            "compacted": {"acked": compacted.acked, "keys": len(compacted.latest)},
            "group": {
                "commits": sum(m.commits for m in members),
                "records": sum(m.records for m in members),
            },
            "slopes": series,
            "growing": sorted(name for name, s in series.items() if s["grows"]),
        }
    )
    (data_dir / "anomalies.json").write_text(json.dumps(found, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, required=True, help="how long the load runs")
    parser.add_argument(
        "--fault-every-s", type=float, default=180.0, help="seconds between two faults"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault plan")
    parser.add_argument(
        "--sample-every-s", type=float, default=15.0, help="seconds between two samples"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="where the cluster keeps data")
    parser.add_argument(
        "--samples", type=Path, default=None, help="the samples' JSON lines (default: in workdir)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="replog-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    result = run_soak(
        args.minutes,
        args.fault_every_s,
        args.seed,
        workdir,
        args.samples or workdir / "samples.jsonl",
        args.sample_every_s,
    )
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] and not result["growing"] else 1


if __name__ == "__main__":
    sys.exit(main())
