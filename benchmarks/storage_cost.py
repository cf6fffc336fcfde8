"""Object-store request cost: S3 requests per broker by price class, per GB, and $ per TB.

Three brokers (tests/cluster.Cluster: a controller and three broker processes, metadata on
local files) keep their logs on S3: each broker ``log.dir`` is its own bucket on a *counting*
moto server (benchmarks/s3_counter.py, run as its own process so that moto does not share a
GIL with the producer). moto serves every request; the counter classifies each one by S3's
price class (PUT / LIST / GET / DELETE) and bucket, i.e. per broker = per replica store (RF=3
on three brokers: every broker holds one replica of every partition).

For each partition count (default 1, 100, 1,000): a topic with that many partitions, RF=3,
min.insync.replicas=2; one producer (acks=all, 100-byte values, records spread round-robin
over the partitions) at each target rate (default 0.2 and 1 MB/s of values: moto on a shared
2-core machine takes far less than 50 MB/s, so the rates are modest and the benchmark reports
the rate the cluster *achieved*, acked value bytes over the window). After a warm-up the counts
are zeroed, then read after the measured window; then, with the producer stopped, an idle
window. The topic is deleted before the next partition count.

Printed per partition count: requests/s per broker by class; requests per GB ingested (value
bytes acked by the cluster); idle requests/s per broker; $ per TB ingested per replica at S3
list prices (PUT/COPY/POST/LIST $0.005 per 1,000, GET/HEAD $0.0004 per 1,000, DELETE free; the
price list is in the JSON); and, from the two rates, a fit ``requests/s = a + b * MB/s`` per
class (a: time-driven flushes and checkpoints; b: size-driven) extrapolated to $ per TB at
50 MB/s. Goal checks: ``independent_of_partitions`` (PUTs per broker at the largest
partition count <= 1.2 x at one partition, same target rate; compared per GB ingested, so a
stalled cluster cannot pass) and ``usd_per_tb_at_50MBps <= 1``.

Beside moto's HTTP count, each window carries the brokers' own count of logical storage
operations (``replog_storage_requests_total{kind}`` scraped from each broker's /metrics) and
the mean duration of a put: the PUT counts agree up to s3fs's extras (a multipart upload, the
HEAD/LIST of an ``info``); the brokers' count also covers their metadata store (local files
here: its ~1 get + 1 list per second never reach moto); and the put duration is what bounds a
flush loop that waits for its PUTs.

With the broker WAL (the default) a broker writes one object per flush for all its
partitions, at most one per ``log.flush.interval.ms`` (250 ms on S3) plus compaction, whatever
the partition count. The per-partition layout (``--set log.wal.enable=false``) writes one
object per partition per flush on every replica, so at 1,000 partitions its brokers try to
issue thousands of PUT/s: moto saturates (its CPU is printed). Windows at >= 1,000 partitions
are capped (``--capped-seconds``; the JSON says so): figures at that size are what moto could
serve, a lower bound of what the code asks for.

    python benchmarks/storage_cost.py [--partitions 1,100,1000] [--rates 0.2,1]
        [--seconds 15] [--capped-seconds 8] [--idle-seconds 12]    # ~4-5 min
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import Future
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.produce import cpu_seconds, load_average, machine
from benchmarks.s3_counter import (
    CLASSES,
    PRICE_PER_1000_USD,
    READY_PREFIX,
    cost_usd,
    reset_counts,
)
from replication.client import Admin, Producer
from replication.client.describe import describe_topic_waiting
from replication.client.types import RecordMetadata
from replication.errors import (
    InvalidReplicationFactorError,
    ReplogError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from tests.cluster import Cluster, wait_until

GOALS = {"put_ratio_largest_to_one_partition_max": 1.2, "usd_per_tb_at_50MBps_max": 1.0}
TARGET_MB_PER_S = 50.0
DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    "AWS_EC2_METADATA_DISABLED": "true",
}


class CounterProcess:
    """benchmarks/s3_counter.py as a child process; its endpoint from its ready line."""

    def __init__(self, work: Path) -> None:
        self.stderr = open(work / "s3_counter.stderr", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("s3_counter.py"))],
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith(READY_PREFIX):
            self.stop()
            raise RuntimeError(f"the S3 counter did not start: {line!r} (see {self.stderr.name})")
        self.endpoint = line[len(READY_PREFIX) :].strip()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


class Load:
    """A producer thread: acks=all, ``rate`` records/s spread round-robin over the partitions;
    counts acknowledged records, so a window's achieved rate is an ack-count difference."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: int, rate: float, value_bytes: int
    ) -> None:
        self.producer = Producer(bootstrap_servers=bootstrap, acks="all")
        self.producer.partitions_for(topic)
        self.topic, self.partitions, self.rate = topic, partitions, rate
        self.value = os.urandom(value_bytes)
        self.acked = 0
        self.failed = 0
        self.sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cost-load", daemon=True)

    def _on_ack(self, future: Future[RecordMetadata]) -> None:
        with self._lock:
            if future.exception() is None:
                self.acked += 1
            else:
                self.failed += 1

    def _run(self) -> None:
        interval = 1 / self.rate
        start = time.perf_counter()
        while not self._stop.is_set():
            try:
                future = self.producer.send(
                    self.topic, self.value, partition=self.sent % self.partitions
                )
            except ReplogError:  # buffer.memory full for max.block.ms: the cluster is behind
                with self._lock:
                    self.failed += 1
            else:
                future.add_done_callback(self._on_ack)
            self.sent += 1
            ahead = start + self.sent * interval - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)

    def acked_now(self) -> int:
        with self._lock:
            return self.acked

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.producer.flush()
        self.producer.close()


def scrape(cluster: Cluster) -> list[dict[str, float]]:
    """Each broker's ``replog_storage_*`` series from its /metrics: logical storage operations
    by kind (``put``, ``get_range``, ``list``, ...) and the summed seconds per kind."""
    out = []
    for broker in cluster.brokers.values():
        with urllib.request.urlopen(broker.metrics_url, timeout=30) as response:
            text = response.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            for prefix, tag in (
                ("replog_storage_requests_total{", "n"),
                ("replog_storage_request_duration_seconds_sum{", "s"),
            ):
                if line.startswith(prefix):
                    labels, _, value = line[len(prefix) :].partition("} ")
                    kind = labels.split('kind="', 1)[1].split('"', 1)[0]
                    values[f"{tag}:{kind}"] = float(value)
        out.append(values)
    return out


def replicas_hosted(cluster: Cluster) -> list[int]:
    """Each broker's open replicas (``kafka_server_replicamanager_partitioncount``): brokers
    open new replicas in the background, after the metadata already names their leaders."""
    counts = []
    for broker in cluster.brokers.values():
        with urllib.request.urlopen(broker.metrics_url, timeout=30) as response:
            text = response.read().decode()
        counts.append(
            next(
                int(float(line.rpartition(" ")[2]))
                for line in text.splitlines()
                if line.startswith("kafka_server_replicamanager_partitioncount ")
            )
        )
    return counts


def scrape_or_none(cluster: Cluster) -> list[dict[str, float]] | None:
    try:
        return scrape(cluster)
    except OSError:
        return None  # a stalled broker: the HTTP count still stands


def logical_rates(
    before: list[dict[str, float]], after: list[dict[str, float]], seconds: float
) -> dict[str, Any]:
    """Mean over the brokers of the logical operations/s by kind (the brokers' own count, to
    set beside the HTTP count) and the mean seconds of a put (what bounds the flush rate)."""
    kinds = sorted({k[2:] for k in after[0] if k.startswith("n:")})
    pairs = list(zip(after, before, strict=True))

    def delta(key: str) -> float:
        return sum(a.get(key, 0) - b.get(key, 0) for a, b in pairs)

    ops = {kind: delta(f"n:{kind}") / len(pairs) / seconds for kind in kinds}
    puts, put_s = delta("n:put"), delta("s:put")
    return {
        "ops_per_s_per_broker": {k: round(v, 1) for k, v in ops.items() if v},
        "mean_put_ms": round(put_s / puts * 1000, 1) if puts else None,
    }


def per_broker(counts: dict[str, Any], buckets: list[str], seconds: float) -> dict[str, Any]:
    """Requests/s by class for each broker's bucket, and the mean over the brokers."""
    rows = []
    for bucket in buckets:
        mine = counts["buckets"].get(bucket) or {c: {"requests": 0} for c in CLASSES}
        rows.append({c: mine[c]["requests"] / seconds for c in CLASSES})
    mean = {c: sum(r[c] for r in rows) / len(rows) for c in CLASSES}
    return {"brokers": rows, "mean": mean}


def rounded(d: dict[str, float], digits: int = 1) -> dict[str, float]:
    return {k: round(v, digits) for k, v in d.items()}


def usd_per_s(rates: dict[str, float]) -> float:
    return sum(rates[c] * PRICE_PER_1000_USD[c] / 1000 for c in CLASSES)


def measure_window(
    counter: CounterProcess,
    cluster: Cluster,
    load: Load,
    buckets: list[str],
    seconds: float,
    value_bytes: int,
) -> dict[str, Any]:
    pids = [b.pid for b in cluster.brokers.values()]
    logical0 = scrape_or_none(cluster)
    reset_counts(counter.endpoint)
    acked0, t0 = load.acked_now(), time.perf_counter()
    cpu0 = {"brokers": cpu_seconds_of(pids), "moto": cpu_seconds(counter.pid)}
    time.sleep(seconds)  # the measured window: the producer runs meanwhile
    counts = reset_counts(counter.endpoint)
    elapsed = time.perf_counter() - t0
    acked = load.acked_now() - acked0
    logical1 = scrape_or_none(cluster)
    logical: Any = "a broker's /metrics did not answer in 30 s"
    if logical0 is not None and logical1 is not None:
        logical = logical_rates(logical0, logical1, elapsed)
    cpu = {
        "brokers_cpu_per_s": round((cpu_seconds_of(pids) - cpu0["brokers"]) / elapsed, 2),
        "moto_cpu_per_s": round((cpu_seconds(counter.pid) - cpu0["moto"]) / elapsed, 2),
    }
    ingested = acked * value_bytes
    mb_per_s = ingested / elapsed / 1e6
    rates = per_broker(counts, buckets, elapsed)
    mean = rates["mean"]
    gb = ingested / 1e9
    return {
        "target_mb_per_s": round(load.rate * value_bytes / 1e6, 3),
        "achieved_mb_per_s": round(mb_per_s, 3),
        "acked_records": acked,
        "window_s": round(elapsed, 1),
        "requests_per_s_per_broker": rounded(mean),
        "requests_per_s_by_broker": [rounded(r) for r in rates["brokers"]],
        "requests_per_gb_per_broker": (
            {c: round(mean[c] * elapsed / gb) for c in CLASSES} if gb else None
        ),
        "put_mb_per_s_per_broker": round(
            sum(
                (counts["buckets"].get(b) or {"PUT": {"bytes_in": 0}})["PUT"]["bytes_in"]
                for b in buckets
            )
            / len(buckets)
            / elapsed
            / 1e6,
            3,
        ),
        "usd_per_tb_per_replica": (
            round(usd_per_s(mean) / (mb_per_s / 1e6), 2) if mb_per_s else None
        ),
        "usd_total_window": round(cost_usd(counts["total"]), 6),
        "brokers_own_storage_metrics": logical,
        **cpu,
    }


def cpu_seconds_of(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)


def fit(windows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Least-squares ``requests/s = a + b * MB/s`` per class over the windows' achieved
    rates, and the $/TB it gives at 50 MB/s; None with fewer than two distinct rates.

    A negative slope (fewer requests at the higher rate: the flush rate is bounded by the
    storage's latency, not by the bytes) is clamped to 0, i.e. the request rate is taken as
    rate-independent (its mean), never extrapolated towards 0; the JSON says which classes
    were clamped."""
    xs = [w["achieved_mb_per_s"] for w in windows]
    if len(xs) < 2 or max(xs) - min(xs) < 0.05 * max(xs):
        return None
    if any(w["achieved_mb_per_s"] < 0.5 * w["target_mb_per_s"] for w in windows):
        return {
            "not_meaningful": "the cluster did not sustain half of a target rate: requests/s"
            " there measure a stalled cluster, not a rate"
        }
    n = len(xs)
    mx = sum(xs) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    coeffs: dict[str, dict[str, float]] = {}
    at_target: dict[str, float] = {}
    clamped = []
    for c in CLASSES:
        ys = [w["requests_per_s_per_broker"][c] for w in windows]
        my = sum(ys) / n
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
        if b < 0:
            b = 0.0
            if my > 0:
                clamped.append(c)
        a = my - b * mx
        coeffs[c] = {"a_per_s": round(a, 2), "b_per_mb": round(b, 2)}
        at_target[c] = max(0.0, a + b * TARGET_MB_PER_S)
    usd_per_tb = usd_per_s(at_target) / (TARGET_MB_PER_S / 1e6)
    return {
        "model": "requests/s per broker = a + b * MB/s (achieved rates), per class",
        "coefficients": coeffs,
        "slope_clamped_to_0": clamped,
        "requests_per_s_per_broker_at_50MBps": rounded(at_target),
        "usd_per_tb_per_replica_at_50MBps": round(usd_per_tb, 2),
        "extrapolated_from_mb_per_s": xs,
    }


def run_partitions(
    cluster: Cluster,
    admin: Admin,
    counter: CounterProcess,
    buckets: list[str],
    partitions: int,
    args: argparse.Namespace,
    *,
    last: bool,
) -> dict[str, Any]:
    topic = f"cost-{partitions}"
    pids = [b.pid for b in cluster.brokers.values()]
    started = time.perf_counter()

    def created() -> bool:
        try:
            admin.create_topic(topic, partitions, 3, {"min.insync.replicas": "2"})
        except InvalidReplicationFactorError:
            return False  # a broker busy with the previous topic's deletion missed heartbeats
        except TopicAlreadyExistsError:
            return True  # an attempt that timed out on the client went through
        except ReplogError as e:
            # Today's brokers stall for tens of seconds while they open 1,000 S3 logs: the
            # request times out on the client; try again (it may have gone through: above).
            print(f"storage_cost: creating {topic}: {e}; retrying", file=sys.stderr, flush=True)
            return False
        return True

    out: dict[str, Any] = {"partitions": partitions}
    wait_until(created, timeout=600, interval=1, message=f"{topic} created on 3 live brokers")

    def healthy() -> bool:
        try:
            parts = describe_topic_waiting(admin, topic, 60_000).partitions
        except ReplogError:
            return False
        if not all(x.leader >= 0 and len(x.isr) == 3 for x in parts):
            return False
        try:  # every broker holds a replica of every partition (RF 3 on 3 brokers), opened
            return all(n >= partitions for n in replicas_hosted(cluster))
        except OSError:
            return False

    try:
        wait_until(healthy, timeout=args.create_timeout, interval=1, message="a full ISR")
    except AssertionError:
        # A large topic may not settle in time on moto (each new replica's first checkpoint
        # and snapshot are requests too): say so and measure what the cluster does anyway.
        out["not_settled"] = (
            f"not every partition had a leader and a full ISR {args.create_timeout} s after"
            " creation; measured anyway"
        )
    out["create_s"] = round(time.perf_counter() - started, 1)
    capped = partitions >= args.cap_from_partitions
    seconds = min(args.seconds, args.capped_seconds) if capped else args.seconds
    if capped:
        out["window_capped"] = (
            f"{seconds} s windows at >= {args.cap_from_partitions} partitions: today's layout"
            " asks for thousands of PUT/s there, more than moto serves on this machine"
        )
    windows = []
    for rate_mb in args.rate_list:
        load = Load(
            cluster.bootstrap,
            topic,
            partitions,
            rate_mb * 1e6 / args.value_bytes,
            args.value_bytes,
        ).start()
        try:
            time.sleep(args.warmup)
            window = measure_window(counter, cluster, load, buckets, seconds, args.value_bytes)
            window["load_average"] = load_average()
        finally:
            load.stop()
        window["failed_sends"] = load.failed
        windows.append(window)
    out["windows"] = windows
    # Idle: the producer is stopped; let in-flight flushes end, then count.
    time.sleep(args.settle)
    reset_counts(counter.endpoint)
    t0 = time.perf_counter()
    cpu0 = cpu_seconds_of(pids)
    time.sleep(args.idle_seconds)
    counts = reset_counts(counter.endpoint)
    elapsed = time.perf_counter() - t0
    idle = per_broker(counts, buckets, elapsed)["mean"]
    out["idle"] = {
        "window_s": round(elapsed, 1),
        "requests_per_s_per_broker": rounded(idle, 2),
        "usd_per_day_per_broker": round(usd_per_s(idle) * 86_400, 2),
        "brokers_cpu_per_s": round((cpu_seconds_of(pids) - cpu0) / elapsed, 3),
    }
    out["fit"] = fit(windows)
    print(f"storage_cost: {json.dumps(out)}", file=sys.stderr, flush=True)
    if last:
        return out  # the cluster stops next: no need to wait for a deletion

    def deleted() -> bool:
        try:
            admin.delete_topic(topic)
        except UnknownTopicOrPartitionError:
            return True  # gone (an attempt that timed out on the client went through)
        except ReplogError as e:
            print(f"storage_cost: deleting {topic}: {e}; retrying", file=sys.stderr, flush=True)
            return False
        return True

    wait_until(deleted, timeout=600, interval=1, message=f"{topic} deleted")
    wait_until(
        lambda: topic not in admin.list_topics(),
        timeout=300,
        interval=1,
        message=f"{topic} gone from the metadata",
    )
    return out


def goal_checks(results: list[dict[str, Any]]) -> dict[str, Any]:
    """``independent_of_partitions``: PUT requests per GB ingested at the largest partition
    count <= 1.2 x at one partition, same (last) target rate -- per GB rather than per second
    so that a cluster that stalls at many partitions (few acks, few PUTs) cannot pass;
    ``usd_per_tb_at_50MBps``: the worst meaningful fit <= $1."""
    checks: dict[str, Any] = {}
    by_p = {r["partitions"]: r for r in results}
    if 1 in by_p and len(by_p) > 1:
        largest = max(by_p)
        one = by_p[1]["windows"][-1]
        big = by_p[largest]["windows"][-1]
        per_gb_one = (one["requests_per_gb_per_broker"] or {}).get("PUT")
        per_gb_big = (big["requests_per_gb_per_broker"] or {}).get("PUT")
        ratio = per_gb_big / per_gb_one if per_gb_one and per_gb_big else None
        checks["independent_of_partitions"] = {
            "target_mb_per_s": one["target_mb_per_s"],
            "achieved_mb_per_s": {1: one["achieved_mb_per_s"], largest: big["achieved_mb_per_s"]},
            "put_per_s_per_broker": {
                1: one["requests_per_s_per_broker"]["PUT"],
                largest: big["requests_per_s_per_broker"]["PUT"],
            },
            "put_per_gb_per_broker": {1: per_gb_one, largest: per_gb_big},
            "ratio_per_gb": round(ratio, 2) if ratio is not None else None,
            "met": ratio is not None and ratio <= GOALS["put_ratio_largest_to_one_partition_max"],
        }
    fits = {
        r["partitions"]: r["fit"]
        for r in results
        if r["fit"] is not None and "usd_per_tb_per_replica_at_50MBps" in r["fit"]
    }
    if fits:
        worst = max(f["usd_per_tb_per_replica_at_50MBps"] for f in fits.values())
        checks["usd_per_tb_at_50MBps"] = {
            "by_partitions": {p: f["usd_per_tb_per_replica_at_50MBps"] for p, f in fits.items()},
            "no_meaningful_fit_at": [
                r["partitions"] for r in results if r["partitions"] not in fits
            ],
            "worst": worst,
            "met": worst <= GOALS["usd_per_tb_at_50MBps_max"],
        }
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", default="1,100,1000", help="partition counts")
    parser.add_argument("--rates", default="0.2,1", help="target MB/s of values, one window each")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--warmup", type=float, default=5, help="seconds before each window")
    parser.add_argument("--seconds", type=float, default=15, help="measured window")
    parser.add_argument("--capped-seconds", type=float, default=8)
    parser.add_argument("--cap-from-partitions", type=int, default=1000)
    parser.add_argument("--settle", type=float, default=3, help="seconds before the idle window")
    parser.add_argument("--idle-seconds", type=float, default=12)
    parser.add_argument(
        "--create-timeout", type=float, default=300, help="seconds for a full ISR after creation"
    )
    parser.add_argument("--dir", default=None)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a broker config for every broker, e.g. --set log.wal.enable=true (repeatable)",
    )
    args = parser.parse_args()
    try:
        broker_sets = dict(kv.split("=", 1) for kv in args.set)
    except ValueError:
        parser.error("--set takes KEY=VALUE")
    try:
        partition_counts = [int(x) for x in args.partitions.split(",")]
        args.rate_list = [float(x) for x in args.rates.split(",")]
    except ValueError as e:
        parser.error(f"--partitions / --rates: comma-separated numbers expected ({e})")
    if min(partition_counts) < 1 or min(args.rate_list) <= 0:
        parser.error("--partitions must be >= 1 and --rates > 0")
    logging.getLogger("replication").setLevel(logging.ERROR)
    os.environ.update(DUMMY_AWS_ENV)  # the brokers inherit these (moto takes any key)

    work = Path(tempfile.mkdtemp(prefix="replog-bench-storage-cost-", dir=args.dir))
    out: dict[str, Any] = {
        "benchmark": "storage_cost",
        "machine": machine(),
        "load_average_at_start": load_average(),
        "brokers": 3,
        "replication_factor": 3,
        "min_insync_replicas": 2,
        "acks": "all",
        "value_bytes": args.value_bytes,
        "broker_overrides": broker_sets,
        "storage": "S3 (moto 5 server on 127.0.0.1, a bucket per broker); metadata: local files",
        "prices_usd_per_1000_requests": {
            **PRICE_PER_1000_USD,
            "source": "S3 Standard us-east-1 list prices: PUT/COPY/POST/LIST $0.005,"
            " GET/HEAD/other $0.0004, DELETE free",
        },
    }
    started = time.perf_counter()
    counter = CounterProcess(work)
    buckets = [f"replog-bench-{i}" for i in range(3)]
    cluster: Cluster | None = None
    try:
        import boto3

        s3 = boto3.client("s3", endpoint_url=counter.endpoint, region_name="us-east-1")
        for bucket in buckets:
            s3.create_bucket(Bucket=bucket)
        cluster = Cluster(
            work / "cluster",
            brokers=3,
            broker_log_dirs={i: f"s3://{b}/log" for i, b in enumerate(buckets)},
            metrics=True,  # replog_storage_requests_total: the brokers' own count, beside moto's
            overrides={
                "storage.endpoint.url": counter.endpoint,
                # Long enough that a broker whose event loop is busy opening, checkpointing or
                # deleting 1,000 S3 logs is not fenced (this benchmark measures cost, not
                # failover; with 9 s, today's code lost its brokers at 1,000 partitions).
                "broker.heartbeat.interval.ms": "2000",
                "broker.session.timeout.ms": "30000",
                **broker_sets,
            },
        )
        cluster.start()
        results = []
        with Admin(bootstrap_servers=cluster.bootstrap) as admin:
            for i, partitions in enumerate(partition_counts):
                last = i == len(partition_counts) - 1
                results.append(
                    run_partitions(cluster, admin, counter, buckets, partitions, args, last=last)
                )
        out["results"] = results
    except BaseException:
        print(f"storage_cost: failed; brokers' stderr kept in {work}", file=sys.stderr)
        raise
    else:
        shutil.rmtree(work, ignore_errors=True)
    finally:
        if cluster is not None:
            cluster.stop()
        counter.stop()
    out["goals"] = GOALS
    out["goals_met"] = goal_checks(out["results"])
    out["elapsed_s"] = round(time.perf_counter() - started, 1)
    out["load_average_at_end"] = load_average()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
