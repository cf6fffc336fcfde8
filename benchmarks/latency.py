"""acks=all latency on local files, with a 3-node NATS JetStream cluster as the peer.

replog: a controller and three brokers as processes on local files (tests/cluster.Cluster,
with the replication timings put back to the broker defaults: ``replica.fetch.wait.max.ms``
500, ``replica.fetch.backoff.ms`` 1000, ... since they are on the latency path; the fast
failover timings of the tests are for tests), RF=3, min.insync.replicas=2, acks=all, 100-byte
values, one producer in this process:

(a) sync: ``send(...).result()`` per record, one partition, with ``linger.ms=0`` (as NATS
    publishes at once, and as Kafka's own latency runs do) and with the default linger;
    p50/p99/p99.9 and records/s; ``first_send_ms``: the first send of each run, the first
    run's to a topic created just before (its brokers learning it; off the percentiles);
(b) max rate: ``replog perf produce`` (replication.tools.perf.produce_perf) records mode
    (per-record ``send``) and Arrow mode (``send_arrow``), unthrottled, 3 partitions: a burst
    (``--records``/``--arrow-records``, over before the first WAL compaction round), then a
    sustained run of ``--max-seconds`` at the burst's rate (compaction running, as NATS's
    window);
(c) half of each sustained max rate, throttled, for ``--half-rate-seconds`` (12: two or more
    compaction rounds per broker at that rate): p50/p99 (the goal's figure); and half of each
    burst rate (``half_burst_rate_*``, as earlier runs measured it). Each starts once no
    broker has more L0 bytes waiting than its compaction trigger (``settled``: the wait and
    ``replog_wal_l0_live_bytes`` before and after): the max-rate runs leave a backlog that
    compaction works off for tens of seconds, and the goal is the steady state at half the
    rate, not the catching up (runs before this change started at once, on that backlog);
(d) idle CPU per broker: after the traffic, a pause, then user+sys CPU of each broker process
    over a window (/proc), as a fraction of one core;
(e) the storage floor: one fsync'd 4 KiB object written by logstore's LocalStorage on the same
    disk (temp file + fsync + rename + directory fsync, what a flush does), p50/p99;
(f) the floor under a sync send (benchmarks/acks_floor.py): the same acks=all message pattern
    (client, leader, two followers, each replica's durable write on a writer thread) in four
    bare Python processes with no replog code, with a new object per durable write, a write
    into pre-written space (``fdatasync``, no metadata: what a journaled WAL object costs, the
    default on local files) and none; replog's sync p50 minus the second is replog's own share
    of it (``sync_p50_over_floor_ms``; the new-object floor also, for a run with
    ``log.wal.journal.enable=false``).

Peer in the same run (benchmarks/peers/nats.py): three nats-server processes (Debian's; found
on PATH or installed with apt-get when root, else reported as not available), a stream with
replicas=3 and file storage on the same disk, nats-py as the client: sync publishes, a bounded
max-rate window, half rate, idle CPU of the three servers. JetStream acks on a quorum and does
not fsync per message: the JSON carries that note, and whether this nats-server accepts
``sync_interval: always`` (if it does, the peer runs both ways).

Prints one JSON line with both side by side and the goal checks: sync p50 <= 2 ms,
p99 <= 10 ms, p99 at half the max rate <= 50 ms, idle broker < 1% of a core.

    python benchmarks/latency.py [--sync-records 2000] [--idle-seconds 20] [--no-nats] ...
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import acks_floor
from benchmarks.peers import nats as nats_peer
from benchmarks.produce import cpu_seconds, load_average, machine
from logstore.config import keys_of
from logstore.storage import Storage
from replication.broker.log_flush import compaction_window_bytes
from replication.client import Admin, Producer
from replication.client.describe import describe_topic_waiting
from replication.config import BrokerConfig, broker_config_from
from replication.tools.perf import ProducePerfResult, freeze_startup_heap, produce_perf
from tests.cluster import FAST_FAILOVER, Cluster, wait_until

GOALS = {"sync_p50_ms": 2.0, "sync_p99_ms": 10.0, "half_rate_p99_ms": 50.0, "idle_core": 0.01}


def broker_defaults(keys: list[str]) -> dict[str, str]:
    """The broker's own defaults for ``keys`` (replication.config), as --set strings."""
    fields = keys_of(BrokerConfig)
    missing = set(keys) - set(fields)
    if missing:
        raise SystemExit(f"latency.py: no broker config key {sorted(missing)}")
    return {key: str(fields[key].default) for key in keys}


def create(admin: Admin, topic: str, partitions: int) -> None:
    admin.create_topic(topic, partitions, 3, {"min.insync.replicas": "2"})
    wait_until(
        lambda: all(
            x.leader >= 0 and len(x.isr) == 3
            for x in describe_topic_waiting(admin, topic, 30_000).partitions
        ),
        timeout=60,
        message=f"every partition of {topic} has a leader and a full ISR",
    )


def sync_run(bootstrap: str, topic: str, args: argparse.Namespace, **config: Any) -> dict[str, Any]:
    """One producer, one record at a time: ``send(...).result()``; latency of each."""
    value = os.urandom(args.value_bytes)
    with Producer(bootstrap_servers=bootstrap, acks="all", **config) as producer:
        producer.partitions_for(topic)
        s = time.perf_counter()
        producer.send(topic, value, partition=0).result()
        # the first run's first send: to a topic created just before (brokers learning it)
        first_send_ms = round((time.perf_counter() - s) * 1000, 2)
        for _ in range(args.warmup_records):
            producer.send(topic, value, partition=0).result()
        lat: list[float] = []
        t0 = time.perf_counter()
        for _ in range(args.sync_records):
            s = time.perf_counter()
            producer.send(topic, value, partition=0).result()
            lat.append((time.perf_counter() - s) * 1000)
        elapsed = time.perf_counter() - t0
    return {
        "records": len(lat),
        "records_per_s": round(len(lat) / elapsed),
        "first_send_ms": first_send_ms,
        **nats_peer.percentiles(lat),
        "load_average": load_average(),
    }


def perf_brief(r: ProducePerfResult) -> dict[str, Any]:
    out = {
        "records": r.records,
        "records_per_s": round(r.records_per_s),
        "mb_per_s": r.mb_per_s,
        "latency": r.latency,
        "p50_ms": r.latency_p50_ms,
        "p99_ms": r.latency_p99_ms,
        "max_ms": r.latency_max_ms,
        "errors": r.errors,
        "load_average": load_average(),
    }
    if r.target_records_per_s > 0:
        out["target_records_per_s"] = round(r.target_records_per_s)
    return out


def idle_cpu(pids: list[int], wait: float, seconds: float) -> dict[str, Any]:
    """Each process's CPU over ``seconds`` after ``wait`` seconds, as a fraction of a core."""
    time.sleep(wait)  # let the traffic's after-effects (flushes, checkpoints) play out
    before = [cpu_seconds(p) for p in pids]
    t0 = time.perf_counter()
    time.sleep(seconds)
    elapsed = time.perf_counter() - t0
    per = [round((cpu_seconds(p) - b) / elapsed, 4) for p, b in zip(pids, before, strict=True)]
    return {
        "wait_s": wait,
        "window_s": round(elapsed, 1),
        "core_fraction_per_process": per,
        "max": max(per),
        "load_average": load_average(),
    }


def compaction_backlog(cluster: Cluster) -> list[int]:
    """Each broker's live L0 bytes not compacted yet (``replog_wal_l0_live_bytes``)."""
    backlog = []
    for broker in cluster.brokers.values():
        with urllib.request.urlopen(broker.metrics_url, timeout=30) as response:
            text = response.read().decode()
        backlog.extend(
            int(float(line.split()[-1]))
            for line in text.splitlines()
            if line.startswith("replog_wal_l0_live_bytes ")
        )
    return backlog


def settle(cluster: Cluster, window_bytes: int, timeout: float) -> dict[str, Any]:
    """Wait until no broker holds more live L0 bytes than compaction keeping up leaves it
    (under its trigger, (1 + phase) windows: under two): the max-rate runs leave hundreds of
    MB behind (compaction cannot keep up with them), and a half-rate run started on that
    backlog measures the catching up, not the rate. Returns the wait and the backlog before
    and after."""
    before = compaction_backlog(cluster)
    started = time.perf_counter()
    wait_until(
        lambda: max(compaction_backlog(cluster)) < 2 * window_bytes,
        timeout=timeout,
        interval=0.5,
        message="every broker's compaction backlog is under its trigger",
    )
    return {
        "waited_s": round(time.perf_counter() - started, 1),
        "l0_live_bytes_before": before,
        "l0_live_bytes_after": compaction_backlog(cluster),
    }


def storage_floor(root: Path, writes: int) -> dict[str, Any]:
    """One fsync'd 4 KiB object write through LocalStorage (what a flush writes), p50/p99."""
    storage = Storage.from_url(root.as_uri())
    data = os.urandom(4096)
    lat: list[float] = []
    for i in range(writes):
        s = time.perf_counter()
        storage.write(f"floor/{i:06d}.obj", data)
        lat.append((time.perf_counter() - s) * 1000)
    return {"writes": writes, "object_bytes": 4096, **nats_peer.percentiles(lat)}


def replog_side(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    timings = broker_defaults(list(FAST_FAILOVER))
    cluster = Cluster(
        work / "cluster", brokers=3, overrides={**timings, **args.broker_sets}, metrics=True
    )
    out: dict[str, Any] = {
        "storage": "local files (fsync)",
        "broker_timings": timings,
        "broker_overrides": args.broker_sets,
    }
    try:
        cluster.start()
        bootstrap = cluster.bootstrap
        pids = [b.pid for b in cluster.brokers.values()]
        with Admin(bootstrap_servers=bootstrap) as admin:
            create(admin, "sync", 1)
            create(admin, "rate", args.partitions)
        out["sync_linger_0"] = sync_run(bootstrap, "sync", args, linger_ms=0)
        out["sync_linger_default"] = sync_run(bootstrap, "sync", args)
        out["sync_linger_default"]["linger_ms"] = "default (5)"
        modes = {"records": args.records, "arrow": args.arrow_records}
        produce_perf(bootstrap, "rate", 20_000, args.value_bytes, acks="all")  # warm-up
        for mode, n in modes.items():
            out[f"max_rate_{mode}"] = perf_brief(
                produce_perf(bootstrap, "rate", n, args.value_bytes, acks="all", mode=mode)  # type: ignore[arg-type]
            )
            out[f"max_rate_{mode}"]["partitions"] = args.partitions
            # The burst above is over before the brokers' first compaction round (64 MiB of
            # WAL objects each); what they sustain with compaction running is the max rate the
            # half-rate goal means, measured over a window as long as NATS's.
            burst = out[f"max_rate_{mode}"]["records_per_s"]
            n = max(n, int(burst * args.max_seconds))
            out[f"sustained_rate_{mode}"] = perf_brief(
                produce_perf(bootstrap, "rate", n, args.value_bytes, acks="all", mode=mode)  # type: ignore[arg-type]
            )
        # the window in force on these brokers' local files (a --set one, or the default)
        window = compaction_window_bytes(
            broker_config_from(args.broker_sets), Storage.from_url(work.as_uri())
        )
        out["compaction_window_bytes"] = window
        for mode in modes:
            for name, of in (("half_rate", "sustained_rate"), ("half_burst_rate", "max_rate")):
                rate = out[f"{of}_{mode}"]["records_per_s"] / 2
                n = max(5_000, int(rate * args.half_rate_seconds))
                settled = settle(cluster, window, args.settle_timeout)
                out[f"{name}_{mode}"] = perf_brief(
                    produce_perf(
                        bootstrap,
                        "rate",
                        n,
                        args.value_bytes,
                        acks="all",
                        mode=mode,  # type: ignore[arg-type]
                        throughput=rate,
                    )
                )
                out[f"{name}_{mode}"]["settled"] = settled
        out["idle_cpu"] = idle_cpu(pids, args.idle_wait, args.idle_seconds)
    finally:
        cluster.stop()
    return out


def nats_side(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    binary, how = nats_peer.find_nats_server()
    if binary is None:
        return {"nats": how}
    out: dict[str, Any] = {
        "binary": binary,
        "how": how,
        "version": nats_peer.server_version(binary),
        "honesty_note": nats_peer.HONESTY_NOTE,
    }
    try:
        import nats  # noqa: F401 - nats-py, the bench extra
    except ImportError:
        out["result"] = "not available: nats-py is not installed (pip install 'replog[bench]')"
        return out
    always, answer = nats_peer.accepts_sync_always(binary)
    out["sync_interval_always_accepted"] = always
    out["sync_interval_always_check"] = answer
    out["runs"] = {}
    for sync_always in [False, True] if always else [False]:
        name = "sync_interval_always" if sync_always else "default_sync"
        cluster = nats_peer.NatsCluster(binary, work / f"nats-{name}", sync_always=sync_always)
        try:
            cluster.start()
            run = nats_peer.run_workloads(cluster.urls, args)
            run["load_average"] = load_average()
            run["idle_cpu"] = idle_cpu(cluster.pids, args.idle_wait, args.idle_seconds)
        finally:
            cluster.stop()
        out["runs"][name] = run
    return out


def checks(sync: dict[str, Any], half_p99: float, idle_max: float) -> dict[str, bool]:
    return {
        "sync_p50_ms": sync["p50_ms"] <= GOALS["sync_p50_ms"],
        "sync_p99_ms": sync["p99_ms"] <= GOALS["sync_p99_ms"],
        "half_rate_p99_ms": half_p99 <= GOALS["half_rate_p99_ms"],
        "idle_core": idle_max < GOALS["idle_core"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sync-records", type=int, default=2_000)
    parser.add_argument("--warmup-records", type=int, default=200)
    parser.add_argument("--records", type=int, default=200_000, help="max rate, records mode")
    parser.add_argument("--arrow-records", type=int, default=1_000_000, help="max rate, arrow")
    parser.add_argument("--partitions", type=int, default=3, help="for the rate runs")
    parser.add_argument("--half-rate-seconds", type=float, default=12)
    parser.add_argument(
        "--settle-timeout",
        type=float,
        default=300,
        help="the longest wait for the max-rate runs' compaction backlog before a half-rate run",
    )
    parser.add_argument(
        "--max-seconds", type=float, default=8, help="sustained max-rate window (both sides)"
    )
    parser.add_argument("--nats-window", type=int, default=256, help="outstanding publishes")
    parser.add_argument("--idle-wait", type=float, default=10)
    parser.add_argument("--idle-seconds", type=float, default=20)
    parser.add_argument("--floor-writes", type=int, default=1_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--no-nats", action="store_true", help="skip the peer")
    parser.add_argument("--dir", default=None, help="where the logs go (the disk measured)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a broker config for every broker, e.g. --set log.wal.enable=true (repeatable)",
    )
    args = parser.parse_args()
    try:
        args.broker_sets = dict(kv.split("=", 1) for kv in args.set)
    except ValueError:
        parser.error("--set takes KEY=VALUE")
    logging.getLogger("replication").setLevel(logging.ERROR)
    freeze_startup_heap()  # this process's own full collections out of its measured sends

    work = Path(tempfile.mkdtemp(prefix="replog-bench-latency-", dir=args.dir))
    out: dict[str, Any] = {
        "benchmark": "latency",
        "machine": machine(),
        "load_average_at_start": load_average(),
        "brokers": 3,
        "replication_factor": 3,
        "min_insync_replicas": 2,
        "acks": "all",
        "value_bytes": args.value_bytes,
    }
    started = time.perf_counter()
    try:
        out["storage_floor_4KiB_fsync"] = storage_floor(work / "floor", args.floor_writes)
        out["acks_floor"] = acks_floor.run(
            work / "acks_floor", args.sync_records, args.warmup_records, args.value_bytes
        )
        out["replog"] = replog_side(work / "replog", args)
        if not args.no_nats:
            out["nats"] = nats_side(work / "nats", args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    r = out["replog"]
    sync_p50 = r["sync_linger_0"]["p50_ms"]
    out["sync_p50_over_floor_ms"] = round(sync_p50 - out["acks_floor"]["prewritten"]["p50_ms"], 3)
    out["sync_p50_over_new_object_floor_ms"] = round(
        sync_p50 - out["acks_floor"]["new_object"]["p50_ms"], 3
    )
    out["goals"] = GOALS
    out["goals_met"] = {
        "replog": checks(
            r["sync_linger_0"],
            max(r["half_rate_records"]["p99_ms"], r["half_rate_arrow"]["p99_ms"]),
            r["idle_cpu"]["max"],
        )
    }
    for name, run in (out.get("nats") or {}).get("runs", {}).items():
        out["goals_met"][f"nats_{name}"] = checks(
            run["sync"], run["half_rate"]["p99_ms"], run["idle_cpu"]["max"]
        )
    out["elapsed_s"] = round(time.perf_counter() - started, 1)
    out["load_average_at_end"] = load_average()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
