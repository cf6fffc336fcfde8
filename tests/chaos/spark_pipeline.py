"""The Spark pipeline under a seeded fault schedule: ``format("replog")`` in -> a transform ->
the exactly-once sink out, in a Spark driver process of its own, against 3 real brokers.

    python -m tests.chaos.spark_pipeline --seed 1 --schedules 3 --faults 8

Each schedule starts a fresh cluster (a controller and 3 brokers, tests/cluster.py), topics
``in`` and ``out`` (3 partitions, RF 3, min.insync.replicas 2) and ``--records`` of input, then
the driver (:mod:`tests.chaos.spark_driver`), while a producer adds 40 records a second until
the faults end.
Faults, in a seeded order (every kind once, shuffled, before any repeats), each once the sink
has committed a batch since the last one, at a seeded moment (half of them while a sink
transaction holds data, i.e. mid-batch):

- ``driver_kill``: SIGKILL the driver's process group (the Python driver, its JVM and Spark's
  Python workers), then start it again on its checkpoint;
- ``worker_kill``: SIGKILL Spark's Python workers of the driver (the Python processes below
  its JVM, by parent pid): one, those of one kind (task workers, the streaming source or sink
  runner, a planner), or all;
- ``output_leader_kill``: SIGKILL the leader of a partition of ``out``, restart it at once or
  after the broker session timeout;
- ``coordinator_kill``: SIGKILL the transaction coordinator's broker, restart it likewise.

Then every broker is up again and the producer stops; once the sink has committed the batch
reaching the input's end, the output is read read_committed and compared with the input
(read back from ``in``): every input record must appear in the output exactly once, transformed
(``lost``, ``duplicated``), nothing else may (``unexpected``), and every record the producer
was told was acked must be in the input (``input_lost``). One JSON line per schedule, then a
summary; exit status 0 only if no schedule found an anomaly.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replication.client import Admin, NewTopic, Producer, TopicPartition
from replication.errors import ReplogError
from tests.chaos.spark_driver import transformed
from tests.cluster import FAST_FAILOVER, Cluster
from tests.readback import read_to_end

FAULT_KINDS = ("driver_kill", "worker_kill", "output_leader_kill", "coordinator_kill")
IN, OUT, PARTITIONS = "in", "out", 3
TOPIC_CONFIGS = {"min.insync.replicas": "2"}
#: the brokers' session timeout: a broker restarted "later" stays down longer than it
SESSION_TIMEOUT_S = int(FAST_FAILOVER["broker.session.timeout.ms"]) / 1000
#: a transaction a killed driver left open aborts within this (the sink's producers' setting)
TRANSACTION_TIMEOUT_MS = 15_000
#: how long the pipeline may take to commit a batch after a fault, and to reach the input's end
PROGRESS_TIMEOUT_S = 240.0
#: the input producer's settings (idempotent, as every replog producer by default)
PRODUCER: dict[str, Any] = {
    "acks": "all",
    "linger_ms": 5,
    "delivery_timeout_ms": 60_000,
    "max_block_ms": 10_000,
}
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = 5


def plan(seed: int, faults: int) -> list[str]:
    """The kinds of a schedule's faults: every kind once in a seeded order, then seeded draws."""
    rng = random.Random(seed)
    kinds = list(FAULT_KINDS)
    rng.shuffle(kinds)
    return [*kinds, *(rng.choice(FAULT_KINDS) for _ in range(len(kinds), faults))][:faults]


# --- the driver -------------------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc (parent pid is field 4 of /proc/<pid>/stat)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return []
    return [part for part in raw.split("\0") if part]


@dataclass(frozen=True)
class PythonWorker:
    pid: int
    #: the module it serves: pyspark.worker (tasks), ...python_streaming_source_runner, ...
    kind: str


class Driver:
    """The Spark driver (tests/chaos/spark_driver.py) as a process group of its own."""

    def __init__(self, bootstrap: str, data_dir: Path, sink_id: str) -> None:
        self.args = [
            *("--bootstrap", bootstrap, "--source", IN, "--sink", OUT, "--sink-id", sink_id),
            *("--checkpoint", str(data_dir / "checkpoint")),
            *("--transaction-timeout-ms", str(TRANSACTION_TIMEOUT_MS)),
        ]
        self.log_path = data_dir / "driver.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.spark_driver", *self.args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                start_new_session=True,
            )
        self.starts += 1

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the driver, its JVM and every process below them (Spark's daemons lead
        process groups of their own), and wait until none of them is left."""
        if self.proc is None:
            return
        victims = [self.proc.pid, *_descendants(self.proc.pid)]
        for pid in victims:
            _sigkill(pid)
        self.proc.wait(30)
        deadline = time.monotonic() + 30
        while any(_running(pid) for pid in victims):
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes of the driver outlived SIGKILL: {victims}")
            time.sleep(0.05)

    def python_workers(self) -> list[PythonWorker]:
        """Spark's Python workers below the driver's JVM: the processes a daemon forked, and the
        Python processes the JVM runs itself (the streaming source runner); not the daemons."""
        if self.proc is None:
            return []
        children = _children()
        workers: list[PythonWorker] = []
        for jvm in children.get(self.proc.pid, []):
            for child in children.get(jvm, []):
                cmd = _cmdline(child)
                if "-m" not in cmd:
                    continue
                module = cmd[cmd.index("-m") + 1]
                if module == "pyspark.daemon":  # its forks serve the module it names last
                    workers += [PythonWorker(w, cmd[-1]) for w in children.get(child, [])]
                else:
                    workers.append(PythonWorker(child, module))
        return workers

    def events(self) -> list[dict[str, Any]]:
        """The JSON lines the driver printed (its starts, query starts and failures)."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith('{"event"'):
                out.append(json.loads(line))
        return out


def _descendants(pid: int) -> list[int]:
    children, out, todo = _children(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _sigkill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# --- the input ----------------------------------------------------------------------------


class InputProducer(threading.Thread):
    """Produces ``in-<seed>-<n>`` values (acks=all, idempotent), round robin over the
    partitions: :meth:`produce` a number at once, and as a thread ``chunk`` every
    ``interval_s`` until stopped, so that the pipeline has news after every fault. Records
    which were acked and which failed (those may or may not be in the log)."""

    def __init__(
        self, bootstrap: str, seed: int, *, chunk: int = 20, interval_s: float = 0.5
    ) -> None:
        super().__init__(name="input-producer", daemon=True)
        self.bootstrap, self.seed = bootstrap, seed
        self.chunk, self.interval_s = chunk, interval_s
        self.sent = 0
        self.acked: set[str] = set()
        self.failed: set[str] = set()
        #: why a producer became unusable (the run's sends stopped there)
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def value(self, n: int) -> str:
        return f"in-{self.seed}-{n:07d}"

    def produce(self, count: int) -> None:
        """Send ``count`` values and wait for every answer."""
        with Producer(bootstrap_servers=self.bootstrap, **PRODUCER) as producer:
            futures = [self._send(producer) for _ in range(count)]
            for future in futures:
                future.exception()

    def _send(self, producer: Producer) -> Future[Any]:
        value, self.sent = self.value(self.sent), self.sent + 1
        future = producer.send(IN, value.encode(), partition=self.sent % PARTITIONS)
        future.add_done_callback(lambda f: self._answered(value, f))
        return future

    def _answered(self, value: str, future: Future[Any]) -> None:
        with self.lock:
            (self.failed if future.exception() is not None else self.acked).add(value)

    def run(self) -> None:
        with Producer(bootstrap_servers=self.bootstrap, **PRODUCER) as producer:
            while not self.stopping.is_set():
                try:
                    for _ in range(self.chunk):
                        self._send(producer)
                except ReplogError as err:  # the producer is unusable: the input ends here
                    self.errors.append(f"{type(err).__name__}: {err}")
                    return
                self.stopping.wait(self.interval_s)
            producer.flush(timeout=60)

    def stop(self) -> None:
        self.stopping.set()
        self.join(90)


# --- the faults ---------------------------------------------------------------------------


class Nemesis:
    """Applies a schedule's faults to the cluster and the driver."""

    def __init__(self, cluster: Cluster, driver: Driver, rng: random.Random) -> None:
        self.cluster, self.driver, self.rng = cluster, driver, rng

    def apply(self, kind: str, admin: Admin) -> dict[str, Any]:
        if kind == "driver_kill":
            self.driver.kill()
            self.driver.start()
            return {}
        if kind == "worker_kill":
            return self._worker_kill()
        if kind == "output_leader_kill":
            partition = self.rng.randrange(PARTITIONS)
            leader = admin.describe_topic(OUT).partitions[partition].leader
            return {"partition": partition, **self._kill_restart(leader)}
        if kind == "coordinator_kill":
            return self._kill_restart(admin.transaction_coordinator())
        raise ValueError(f"unknown fault kind {kind!r}; one of {FAULT_KINDS}")

    def _worker_kill(self) -> dict[str, Any]:
        workers = self.driver.python_workers()
        if not workers:
            return {"killed": []}
        how = self.rng.choice(("one", "kind", "all"))
        if how == "one":
            victims = [self.rng.choice(workers)]
        elif how == "kind":
            kind = self.rng.choice(sorted({w.kind for w in workers}))
            victims = [w for w in workers if w.kind == kind]
        else:
            victims = workers
        for worker in victims:
            _sigkill(worker.pid)
        return {"how": how, "killed": sorted(w.kind.rsplit(".", 1)[-1] for w in victims)}

    def _kill_restart(self, broker_id: int) -> dict[str, Any]:
        if broker_id not in self.cluster.brokers:  # no leader at the moment: any broker
            broker_id = self.rng.choice(sorted(self.cluster.brokers))
        broker = self.cluster.brokers[broker_id]
        later = self.rng.random() < 0.5
        broker.kill()
        if later:  # down for longer than its session: the controller moves its leaderships
            time.sleep(SESSION_TIMEOUT_S + self.rng.uniform(0.5, 2.0))
        _restart(broker)
        return {"broker": broker_id, "restart": "later" if later else "now"}


def _restart(broker: Any) -> None:
    try:
        broker.start()
    except RuntimeError:  # its port was taken while it was down: a fresh one
        broker.port = 0
        broker.start()


# --- one schedule -------------------------------------------------------------------------


@dataclass
class Progress:
    """What the sink has committed (its last batch id), asked of the coordinator."""

    admin: Admin
    sink_id: str
    checkpoint: Path
    seen: int = -1

    def last_batch(self) -> int:
        try:
            batch = self.admin.last_committed_batch(self.sink_id, timeout_ms=5000)
        except ReplogError:  # the coordinator is moving: no news
            return self.seen
        self.seen = max(self.seen, batch)
        return self.seen

    def wait_beyond(self, batch: int, timeout: float) -> float | None:
        """Wait until the sink commits a batch after ``batch``: when it saw that (monotonic
        clock), or None if not within ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.last_batch() <= batch:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)
        return time.monotonic()

    def end_offsets(self, batch: int) -> dict[int, int]:
        """The source's end offsets of micro-batch ``batch`` (the checkpoint's offset log)."""
        lines = (self.checkpoint / "offsets" / str(batch)).read_text().splitlines()
        return {int(p): int(o) for p, o in json.loads(lines[2])[IN].items()}

    def mid_batch(self, timeout: float) -> bool:
        """Wait until a task transaction of the sink holds data (a batch is being written)."""
        prefix = f"replog-sink/{self.sink_id}/"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                listed = self.admin.list_transactions(["Ongoing"])
            except ReplogError:
                listed = []
            if any(t.transactional_id.startswith(prefix) and t.partitions for t in listed):
                return True
            time.sleep(0.05)
        return False


@dataclass
class Outcome:
    faults: list[dict[str, Any]] = field(default_factory=list)
    anomalies: dict[str, list[str]] = field(default_factory=dict)
    records_in: int = 0
    records_out: int = 0
    batches: int = 0


def run_schedule(
    seed: int, faults: int, workdir: Path, *, records: int = 2000, keep: bool = False
) -> dict[str, Any]:
    """Run one schedule in ``workdir/seed-<seed>`` (removed if it passed, unless ``keep``) and
    return its result: the line ``python -m tests.chaos.spark_pipeline`` prints."""
    began = time.monotonic()
    rng = random.Random(seed)
    data_dir = workdir / f"seed-{seed}"
    shutil.rmtree(data_dir, ignore_errors=True)
    cluster = Cluster(data_dir, 3)
    sink_id = f"chaos-{seed}"
    outcome = Outcome()
    driver: Driver | None = None
    producer: InputProducer | None = None
    try:
        cluster.start()
        with Admin(bootstrap_servers=cluster.bootstrap) as admin:
            admin.create_topics([NewTopic(t, PARTITIONS, 3, TOPIC_CONFIGS) for t in (IN, OUT)])
            producer = InputProducer(cluster.bootstrap, seed)
            producer.produce(records)
            driver = Driver(cluster.bootstrap, data_dir, sink_id)
            driver.start()
            producer.start()
            progress = Progress(admin, sink_id, data_dir / "checkpoint")
            try:
                _faults(plan(seed, faults), Nemesis(cluster, driver, rng), progress, outcome, began)
                producer.stop()
                _finish(cluster, driver, producer, progress, outcome)
            finally:
                outcome.batches = progress.seen + 1
    finally:
        if producer is not None and producer.is_alive():
            producer.stop()
        if driver is not None:
            driver.kill()
        cluster.stop()
    events = driver.events() if driver is not None else []
    result = {
        "seed": seed,
        "faults": outcome.faults,
        "records_in": outcome.records_in,
        "acked": len(producer.acked) if producer else 0,
        "failed_sends": len(producer.failed) if producer else 0,
        "producer_errors": producer.errors if producer else [],
        "records_out": outcome.records_out,
        "batches": outcome.batches,
        "driver_starts": driver.starts if driver else 0,
        "query_failures": sum(e["event"] == "query_failed" for e in events),
        "anomalies": {k: len(v) for k, v in outcome.anomalies.items()},
        "examples": {k: v[:EXAMPLES] for k, v in outcome.anomalies.items() if v},
        "elapsed_s": round(time.monotonic() - began, 1),
    }
    result["ok"] = outcome.records_in > 0 and not any(result["anomalies"].values())
    if result["ok"] and not keep:
        shutil.rmtree(data_dir, ignore_errors=True)
    else:
        result["workdir"] = str(data_dir)
    return result


def _faults(
    kinds: list[str], nemesis: Nemesis, progress: Progress, outcome: Outcome, began: float
) -> None:
    """Each fault once the sink has committed a batch since the previous one began; the time
    from a fault's start to that commit is its ``recovered_s``."""
    last, started = -1, time.monotonic()
    for kind in [*kinds, None]:
        seen = progress.wait_beyond(last, PROGRESS_TIMEOUT_S)
        if outcome.faults:
            outcome.faults[-1]["recovered_s"] = seen and round(seen - started, 2)
        if seen is None:
            outcome.anomalies.setdefault("stalled", []).append(
                f"no batch committed within {PROGRESS_TIMEOUT_S}s after batch {last}"
            )
            return
        if kind is None:
            return
        mid = nemesis.rng.random() < 0.5 and progress.mid_batch(timeout=30)
        if not mid:
            time.sleep(nemesis.rng.uniform(0, 1.5))
        last, started = progress.last_batch(), time.monotonic()
        at = round(started - began, 1)
        detail = nemesis.apply(kind, progress.admin)
        outcome.faults.append({"kind": kind, "at_s": at, "mid_batch": mid, **detail})


def _finish(
    cluster: Cluster, driver: Driver, producer: InputProducer, progress: Progress, outcome: Outcome
) -> None:
    """Heal, let the pipeline reach the input's end, stop it and compare output with input."""
    for broker in cluster.brokers.values():
        if not broker.alive:
            _restart(broker)
    if not driver.alive:
        status = driver.proc.returncode if driver.proc else None
        outcome.anomalies.setdefault("driver_exited", []).append(f"exit status {status}")
        driver.start()
    tps = [TopicPartition(IN, p) for p in range(PARTITIONS)]
    inputs = read_to_end(cluster.bootstrap, tps, timeout=120)
    ends = {tp.partition: end for tp, end in inputs.ends.items()}
    deadline = time.monotonic() + PROGRESS_TIMEOUT_S
    while not _covers(progress, ends):
        if time.monotonic() > deadline:
            outcome.anomalies.setdefault("stalled", []).append(
                f"the sink did not reach the input's end {ends} within {PROGRESS_TIMEOUT_S}s"
            )
            break
        time.sleep(0.5)
    driver.kill()
    out_tps = [TopicPartition(OUT, p) for p in range(PARTITIONS)]
    unsettled = _wait_settled(progress.admin, out_tps, TRANSACTION_TIMEOUT_MS / 1000 + 60)
    if unsettled:
        outcome.anomalies.setdefault("hanging_transaction", []).append(unsettled)
    output = read_to_end(cluster.bootstrap, out_tps, timeout=120).records
    compare(
        [r.value or b"" for r in inputs.records],
        [r.value or b"" for r in output],
        producer.acked,
        outcome,
    )


def _covers(progress: Progress, ends: dict[int, int]) -> bool:
    batch = progress.last_batch()
    if batch < 0:
        return False
    reached = progress.end_offsets(batch)
    return all(reached.get(p, 0) >= end for p, end in ends.items())


def _wait_settled(admin: Admin, tps: list[TopicPartition], timeout: float) -> str:
    """Wait until no transaction is open on ``tps`` (last stable offset = high watermark);
    what was still open at the deadline, or ''."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        try:
            lso, hw = (
                admin.list_offsets(dict.fromkeys(tps, "latest"), isolation_level=level)
                for level in ("read_committed", "read_uncommitted")
            )
        except ReplogError as err:
            state = str(err)
        else:
            if lso == hw:
                return ""
            state = f"last stable offsets {lso} below high watermarks {hw}"
        time.sleep(0.5)
    return state


def compare(inputs: list[bytes], outputs: list[bytes], acked: set[str], outcome: Outcome) -> None:
    """The verdict: every input record in the output exactly once, transformed; nothing else;
    every acked input record in the input."""
    given = Counter(v.decode() for v in inputs)
    expected = Counter({transformed(v): n for v, n in given.items()})
    found = Counter(v.decode() for v in outputs)
    outcome.records_in, outcome.records_out = sum(given.values()), sum(found.values())
    outcome.anomalies.update(
        {
            "lost": sorted((expected - found).elements()),
            "duplicated": sorted(v for v in (found - expected).elements() if v in expected),
            "unexpected": sorted(v for v in found if v not in expected),
            "input_lost": sorted(acked - set(given)),
            "input_duplicated": sorted(v for v, n in given.items() if n > 1),
        }
    )


# --- the command ----------------------------------------------------------------------------


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    kinds = Counter(f["kind"] for r in results for f in r.get("faults", []))
    anomalies: Counter[str] = Counter()
    for result in results:
        anomalies.update(result.get("anomalies", {}))
    recovered = [
        f["recovered_s"] for r in results for f in r.get("faults", []) if f.get("recovered_s")
    ]
    return {
        "summary": True,
        "schedules": len(results),
        "failed_schedules": [r["seed"] for r in results if not r["ok"]],
        "faults": dict(sorted(kinds.items())),
        "records_in": sum(r.get("records_in", 0) for r in results),
        "records_out": sum(r.get("records_out", 0) for r in results),
        "batches": sum(r.get("batches", 0) for r in results),
        "driver_starts": sum(r.get("driver_starts", 0) for r in results),
        "query_failures": sum(r.get("query_failures", 0) for r in results),
        "anomalies": dict(anomalies),
        "max_recovered_s": max(recovered, default=None),
        "ok": all(r["ok"] for r in results),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos.spark_pipeline", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the first schedule")
    parser.add_argument("--schedules", type=int, default=1, help="how many schedules (seeds)")
    parser.add_argument("--faults", type=int, default=8, help="faults per schedule")
    parser.add_argument("--records", type=int, default=2000, help="input produced beforehand")
    parser.add_argument("--workdir", type=Path, default=None, help="where schedules keep data")
    parser.add_argument("--keep", action="store_true", help="keep the data of passed schedules")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("replication").setLevel(logging.ERROR)  # clients retry loudly under faults
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="replog-spark-chaos-"))
    results = []
    for seed in range(args.seed, args.seed + args.schedules):
        results.append(_schedule(seed, args, workdir))
        print(json.dumps(results[-1]), flush=True)
    print(json.dumps(summary := summarize(results)), flush=True)
    return 0 if summary["ok"] else 1


def _schedule(seed: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    try:
        return run_schedule(seed, args.faults, workdir, records=args.records, keep=args.keep)
    except Exception as err:  # a harness failure: reported, and the run goes on
        where = str(workdir / f"seed-{seed}")
        failure = f"{type(err).__name__}: {err}"
        return {
            "seed": seed,
            "ok": False,
            "error": failure,
            "workdir": where,
            "traceback": traceback.format_exc(limit=8),
        }


if __name__ == "__main__":
    sys.exit(main())
