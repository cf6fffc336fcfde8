"""Replication on three brokers: acks=all throughput and latency, failover, catch-up, sessions.

Starts a controller and three brokers as processes on local files (tests/cluster.Cluster, with
its short failover timings: broker.session.timeout.ms=2000, replica.lag.time.max.ms=3000,
replica.fetch.wait.max.ms=200) and measures, with 100-byte values and one producer in this
process (replication.tools.perf.produce_perf):

- throughput: RF=3, min.insync.replicas=2, acks=all, records mode (Producer.send per record,
  latency per record) and arrow mode (send_arrow, latency per batch), beside RF=1 acks=1 on
  the same cluster with the same partition count (no replication: the single-broker path);
- latency at half the max rate: the same acks=all runs throttled (--throughput) to half
  the rate each mode reached, p50/p99;
- leader failover: a producer sends numbered records (acks=all) at a steady rate; the
  partition leader is SIGKILLed; reported: time from the kill to the first acknowledgement
  of a record sent after it, the longest gap between acknowledgements, and acked loss (every
  acknowledged record is read back; must be 0);
- follower catch-up: a follower is stopped, records are produced (acks=1), the follower is
  restarted; reported: MB/s of log (encoded batch bytes) it fetched, from its ready line
  to its LEO reaching the leader's, both read with DescribeLogDirs;
- fetch-session request bytes: a second, two-broker cluster whose broker 0 is reached by its
  peer only through tests/proxy.TcpProxy; broker 0 leads 1,000 partitions that broker 1
  follows in one fetch session; records go to 10 of them; reported: the full fetch request's
  size on the wire and the largest incremental request's (naming the active partitions).

Prints one JSON line. Goals (the replication issue): >= 200,000 records/s acks=all RF=3,
p99 <= 50 ms at half that rate, incremental fetch request <= 5% of a full one, acked loss 0.

    python benchmarks/replication.py [--records 600000] [--arrow-records 3000000] ...
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import platform
import shutil
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from logstore.batch import Record, build
from replication import protocol as p
from replication.client import Admin, Consumer, Producer, RecordMetadata, TopicPartition
from replication.client.describe import describe_topic_waiting
from replication.tools.perf import ProducePerfResult, produce_perf
from tests.cluster import FAST_FAILOVER, BrokerProcess, Cluster, wait_until
from tests.proxy import RecordedRequest, TcpProxy
from tests.wire import RawConnection

GOALS = {
    "acks_all_rf3_records_per_s": 200_000,
    "p99_ms_at_half_rate": 50,
    "incremental_fetch_request_ratio": 0.05,
    "acked_loss": 0,
}
VALUE_BYTES = 100


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def load_average() -> float:
    """The 1-minute load average: other work on the machine skews every figure here."""
    return round(os.getloadavg()[0], 2)


def cpu_seconds(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def create(admin: Admin, topic: str, partitions: int, rf: int, **configs: str) -> None:
    admin.create_topic(topic, partitions, rf, configs)
    wait_until(
        lambda: all(
            x.leader >= 0 and len(x.isr) == rf
            for x in describe_topic_waiting(admin, topic, 30_000).partitions
        ),
        timeout=60,
        message=f"every partition of {topic} has a leader and a full ISR",
    )


def brief(r: ProducePerfResult, cpu: dict[str, float] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "records": r.records,
        "records_per_s": round(r.records_per_s),
        "mb_per_s": r.mb_per_s,
        "latency": r.latency,
        "latency_p50_ms": r.latency_p50_ms,
        "latency_p99_ms": r.latency_p99_ms,
        "latency_max_ms": r.latency_max_ms,
        "errors": r.errors,
    }
    if r.target_records_per_s > 0:
        out["target_records_per_s"] = round(r.target_records_per_s)
    return {**out, **(cpu or {})}


# --- throughput and latency ---------------------------------------------------------------------


def throughput(cluster: Cluster, admin: Admin, args: argparse.Namespace) -> dict[str, Any]:
    bootstrap = cluster.bootstrap
    pids = [b.pid for b in cluster.brokers.values()]
    create(admin, "rf3", args.partitions, 3, **{"min.insync.replicas": "2"})
    create(admin, "rf1", args.partitions, 1)
    create(admin, "warmup", args.partitions, 3, **{"min.insync.replicas": "2"})
    produce_perf(bootstrap, "warmup", 50_000, VALUE_BYTES, acks="all")
    produce_perf(bootstrap, "warmup", 100_000, VALUE_BYTES, acks="all", mode="arrow")

    def run(topic: str, acks: str, mode: str, n: int, rate: float = -1) -> dict[str, Any]:
        before_brokers, before_client = cpu_seconds(pids), time.process_time()
        result = produce_perf(
            bootstrap,
            topic,
            n,
            VALUE_BYTES,
            acks=acks,
            mode=mode,
            throughput=rate,  # type: ignore[arg-type]
        )
        return brief(
            result,
            {
                "brokers_cpu_s": round(cpu_seconds(pids) - before_brokers, 2),
                "client_cpu_s": round(time.process_time() - before_client, 2),
                "elapsed_s": result.elapsed_s,
            },
        )

    out: dict[str, Any] = {"partitions": args.partitions}
    out["rf3_acks_all_records"] = run("rf3", "all", "records", args.records)
    out["rf3_acks_all_arrow"] = run("rf3", "all", "arrow", args.arrow_records)
    out["rf1_acks_1_records"] = run("rf1", "1", "records", args.records)
    out["rf1_acks_1_arrow"] = run("rf1", "1", "arrow", args.arrow_records)
    for mode in ("records", "arrow"):
        rate = out[f"rf3_acks_all_{mode}"]["records_per_s"] / 2
        n = max(10_000, int(rate * args.half_rate_seconds))
        out[f"rf3_acks_all_{mode}_half_rate"] = run("rf3", "all", mode, n, rate)
    return out


# --- leader failover ----------------------------------------------------------------------------


def failover(cluster: Cluster, admin: Admin, args: argparse.Namespace) -> dict[str, Any]:
    topic = "failover"
    create(admin, topic, 1, 3, **{"min.insync.replicas": "2"})
    leader = describe_topic_waiting(admin, topic, 30_000).partitions[0].leader
    sent_at: dict[int, float] = {}
    acked: dict[int, float] = {}
    failed: dict[int, str] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def on_ack(seq: int, future: Future[RecordMetadata]) -> None:
        now = time.perf_counter()
        error = future.exception()
        with lock:
            if error is None:
                acked[seq] = now
            else:
                failed[seq] = str(error)

    producer = Producer(bootstrap_servers=cluster.bootstrap, acks="all", linger_ms=1)
    producer.partitions_for(topic)

    def load() -> None:
        interval = 1 / args.failover_rate
        start = time.perf_counter()
        seq = 0
        while not stop.is_set():
            now = time.perf_counter()
            sent_at[seq] = now
            future = producer.send(topic, f"{seq}".encode())
            future.add_done_callback(lambda f, seq=seq: on_ack(seq, f))
            seq += 1
            ahead = start + seq * interval - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)

    thread = threading.Thread(target=load, name="failover-load")
    thread.start()
    try:
        wait_until(lambda: len(acked) >= args.failover_rate, timeout=30, message="steady acks")
        killed_at = time.perf_counter()
        cluster.brokers[leader].kill()
        (new_leader, elected_at) = wait_until(
            lambda: (
                (x := describe_topic_waiting(admin, topic, 30_000).partitions[0].leader)
                not in (-1, leader)
                and (x, time.perf_counter())
            ),
            timeout=30,
            interval=0.02,
            message="a new leader in the metadata",
        )
        wait_until(
            lambda: any(s >= killed_at for s in _acked_sends(acked, sent_at, lock)),
            timeout=60,
            interval=0.005,
            message="an acknowledgement of a record sent after the kill",
        )
        time.sleep(1)  # keep producing on the new leader a little
    finally:
        stop.set()
        thread.join()
        producer.flush()
        producer.close()
    with lock:
        after = [acked[s] for s in acked if sent_at[s] >= killed_at]
        ack_times = sorted(acked.values())
    first_ack_after = min(after) - killed_at
    gaps = [b - a for a, b in itertools.pairwise(ack_times)]
    values = read_back(cluster.bootstrap, topic)
    read = {int(v) for v in values}
    lost = sorted(set(acked) - read)
    cluster.brokers[leader].start()  # back for the next measurement
    return {
        "killed_leader": leader,
        "new_leader": new_leader,
        "producer_rate_records_per_s": args.failover_rate,
        "kill_to_new_leader_in_metadata_s": round(elected_at - killed_at, 3),
        "kill_to_next_acked_produce_s": round(first_ack_after, 3),
        "longest_ack_gap_s": round(max(gaps), 3),
        "acked": len(acked),
        "failed_sends": len(failed),
        "read_back": len(values),
        "duplicates": len(values) - len(read),
        "acked_lost": len(lost),
        "broker_session_timeout_ms": int(FAST_FAILOVER["broker.session.timeout.ms"]),
        "producer_retry_backoff_max_ms": 1000,
    }


def _acked_sends(
    acked: dict[int, float], sent_at: dict[int, float], lock: threading.Lock
) -> list[float]:
    with lock:
        return [sent_at[s] for s in acked]


def read_back(bootstrap: str, topic: str) -> list[bytes]:
    """Every value of partition 0 of ``topic`` below its high watermark."""
    tp = TopicPartition(topic, 0)
    out: list[bytes] = []
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        while consumer.position(tp) < end:
            for fetched in consumer.poll_arrow(timeout_ms=1000):
                out.extend(fetched.batch.column(2).to_pylist())
    return out


# --- follower catch-up --------------------------------------------------------------------------


def catch_up(cluster: Cluster, admin: Admin, args: argparse.Namespace) -> dict[str, Any]:
    topic = "catchup"
    tp = TopicPartition(topic, 0)
    create(admin, topic, 1, 3, **{"min.insync.replicas": "2"})
    part = describe_topic_waiting(admin, topic, 30_000).partitions[0]
    leader = part.leader
    follower = next(b for b in part.replicas if b != leader)

    def log_of(broker: int) -> Any:
        answer = admin.describe_log_dirs([tp], brokers=[broker])[broker]
        if isinstance(answer, Exception) or tp not in answer:
            return None
        return answer[tp]

    before = wait_until(lambda: log_of(follower), timeout=30, message="the follower's log")
    cluster.brokers[follower].stop()
    records = int(args.catchup_mb * 1e6 / VALUE_BYTES)
    produce_perf(cluster.bootstrap, topic, records, VALUE_BYTES, acks="1", mode="arrow")
    target = log_of(leader)
    started = time.perf_counter()
    cluster.brokers[follower].start()
    ready = time.perf_counter()
    wait_until(
        lambda: (x := log_of(follower)) is not None and x.log_end_offset >= target.log_end_offset,
        timeout=300,
        interval=0.02,
        message="the follower caught up",
    )
    seconds = time.perf_counter() - ready
    behind_bytes = target.size_bytes - before.size_bytes
    behind_records = target.log_end_offset - before.log_end_offset
    return {
        "follower": follower,
        "records_behind": behind_records,
        "mb_behind": round(behind_bytes / 1e6, 1),
        "restart_to_ready_s": round(ready - started, 2),
        "ready_to_caught_up_s": round(seconds, 2),
        "catch_up_mb_per_s": round(behind_bytes / seconds / 1e6, 1),
        "catch_up_records_per_s": round(behind_records / seconds),
        "replica_fetch_max_bytes": 1_048_576,
    }


# --- fetch-session request bytes ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fetch_sessions(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Broker 1 follows broker 0's partitions through a proxy that records its Fetch requests."""
    common = {**FAST_FAILOVER, "metadata.log.dir": (work / "metadata").as_uri()}
    controller = BrokerProcess(
        work / "controller", broker_id=100, role="controller", overrides=common
    )
    port = free_port()
    proxy = TcpProxy("127.0.0.1", port).start()
    leader = BrokerProcess(
        work / "broker-0",
        broker_id=0,
        port=port,
        overrides={
            **common,
            "listeners": f"127.0.0.1:{port}",
            "advertised.listeners": proxy.address,
        },
    )
    follower = BrokerProcess(work / "broker-1", broker_id=1, overrides=common)
    procs = [controller, leader, follower]
    try:
        controller.start()
        both = threading.Thread(target=follower.start)
        both.start()  # a broker prints its ready line once registered: start both at once
        leader.start()
        both.join()
        topic = "sessions"
        total = 2 * args.session_partitions  # leaders alternate: broker 0 leads half
        with Admin(bootstrap_servers=follower.bootstrap) as admin:
            create(admin, topic, total, 2)
            led = [
                x.partition
                for x in describe_topic_waiting(admin, topic, 30_000).partitions
                if x.leader == 0
            ]
        session = {(topic, i) for i in led}
        wait_until(
            lambda: quiet_session(proxy, session),
            timeout=60,
            message="the follower's session covers broker 0's partitions and is quiet",
        )
        # Brokers open new replicas in the background, so the session's first full fetch
        # named only the partitions open by then and incrementals added the rest. A new
        # connection makes the follower start a new session, whose full fetch names them all
        # (what Kafka's follower sends after a reconnect): the request measured below.
        proxy.cut_all()
        full = wait_until(
            lambda: settled_full_fetch(proxy, session),
            timeout=60,
            message="a full fetch naming all of broker 0's partitions, then a quiet session",
        )
        mark = len(proxy.requests)
        active = led[: args.session_active]
        with RawConnection(leader.bootstrap) as conn:  # straight to broker 0, not via the proxy
            for round_ in range(args.session_rounds):
                # One request to the ten: the follower gets them in one response and names
                # all ten (new fetch offsets) in its next incremental request.
                batch = build([Record(None, b"x" * VALUE_BYTES, 1_000 + round_)])
                resp = conn.request(
                    p.ApiKey.PRODUCE,
                    p.ProduceRequest(
                        acks=-1,
                        timeout_ms=30_000,
                        topic_data=[
                            p.ProduceRequestTopic(
                                name=topic,
                                partition_data=[
                                    p.ProduceRequestPartition(index=i, records=batch)
                                    for i in active
                                ],
                            )
                        ],
                    ),
                )
                codes = {x.error_code for t in resp.responses for x in t.partition_responses}
                assert codes == {0}, resp
        active_names = {(topic, i) for i in active}
        wait_until(
            lambda: set().union(*(names(r) for r in follower_fetches(proxy, mark))) >= active_names,
            timeout=30,
            message="incremental fetches naming the active partitions",
        )
        reqs = follower_fetches(proxy)
        session_id = next(r.body.session_id for r in reqs if r.seq > full.seq)
        incrementals = [r for r in reqs if r.seq > full.seq and r.body.session_id == session_id]
        assert all(r.body.session_epoch > 0 for r in incrementals), "the session was reset"
        named = [(len(names(r)), r.size) for r in incrementals]
        active_sizes = [size for count, size in named if count]
        idle_sizes = [size for count, size in named if not count]
        biggest = max(active_sizes)
        return {
            "session_partitions": len(session),
            "active_partitions": len(active),
            "full_request_bytes": full.size,
            "incremental_request_bytes_max": biggest,
            "incremental_request_bytes_idle": min(idle_sizes) if idle_sizes else None,
            "most_partitions_named_in_an_incremental": max(count for count, _ in named),
            "incremental_requests": len(incrementals),
            "incremental_to_full_ratio": round(biggest / full.size, 4),
        }
    finally:
        for proc in procs:
            if proc.alive:
                proc.kill()
        proxy.stop()


def follower_fetches(proxy: TcpProxy, since: int = 0) -> list[RecordedRequest]:
    return [
        r
        for r in proxy.requests[since:]
        if r.api_key == p.ApiKey.FETCH and r.decoded and r.body.replica_id >= 0
    ]


def names(request: RecordedRequest) -> set[tuple[str, int]]:
    return {(t.topic, x.partition) for t in request.body.topics for x in t.partitions}


def quiet_session(proxy: TcpProxy, session: set[tuple[str, int]]) -> RecordedRequest | None:
    """The follower's last full fetch once it and the incrementals since named all of
    ``session`` and the last three incrementals named nothing (established and quiet)."""
    reqs = follower_fetches(proxy)
    fulls = [r for r in reqs if r.body.session_epoch == 0]
    if not fulls:
        return None
    full = fulls[-1]
    after = [r for r in reqs if r.seq > full.seq]
    covered = names(full).union(*(names(r) for r in after)) if after else names(full)
    if not covered >= session or len(after) < 3 or any(names(r) for r in after[-3:]):
        return None
    return full


def settled_full_fetch(proxy: TcpProxy, session: set[tuple[str, int]]) -> RecordedRequest | None:
    """:func:`quiet_session`'s full fetch if it named all of ``session`` by itself."""
    full = quiet_session(proxy, session)
    return full if full is not None and names(full) >= session else None


# --- main -----------------------------------------------------------------------------------

SECTIONS = ("throughput", "failover", "catch_up", "fetch_session")


def goals_met(out: dict[str, Any]) -> dict[str, Any]:
    met: dict[str, Any] = {}
    t = out.get("throughput")
    if t is not None:
        met["acks_all_rf3_records_per_s"] = {
            mode: t[f"rf3_acks_all_{mode}"]["records_per_s"] >= GOALS["acks_all_rf3_records_per_s"]
            for mode in ("records", "arrow")
        }
        met["p99_ms_at_half_rate"] = {
            mode: t[f"rf3_acks_all_{mode}_half_rate"]["latency_p99_ms"]
            <= GOALS["p99_ms_at_half_rate"]
            for mode in ("records", "arrow")
        }
    if "fetch_session" in out:
        met["incremental_fetch_request_ratio"] = (
            out["fetch_session"]["incremental_to_full_ratio"]
            <= GOALS["incremental_fetch_request_ratio"]
        )
    if "failover" in out:
        met["acked_loss"] = out["failover"]["acked_lost"] == 0
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=600_000, help="records-mode runs")
    parser.add_argument("--arrow-records", type=int, default=3_000_000, help="arrow-mode runs")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--half-rate-seconds", type=float, default=6)
    parser.add_argument("--failover-rate", type=int, default=2_000, help="records/s")
    parser.add_argument("--catchup-mb", type=float, default=100, help="MB of values")
    parser.add_argument("--session-partitions", type=int, default=1_000)
    parser.add_argument("--session-active", type=int, default=10)
    parser.add_argument("--session-rounds", type=int, default=20)
    parser.add_argument("--dir", default=None)
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"sections to run: {','.join(SECTIONS)}"
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    if not only <= set(SECTIONS):
        parser.error(f"--only: unknown sections {sorted(only - set(SECTIONS))}")
    logging.getLogger("replication").setLevel(logging.ERROR)  # retries during the failover

    work = Path(tempfile.mkdtemp(prefix="replog-bench-replication-", dir=args.dir))
    out: dict[str, Any] = {
        "benchmark": "replication",
        "machine": machine(),
        "load_average_at_start": load_average(),
        "brokers": 3,
        "storage": "local files",
        "value_bytes": VALUE_BYTES,
    }
    started = time.perf_counter()
    cluster = Cluster(work / "cluster", brokers=3)
    try:
        if only & {"throughput", "failover", "catch_up"}:
            cluster.start()
            with Admin(bootstrap_servers=cluster.bootstrap) as admin:
                if "throughput" in only:
                    out["throughput"] = throughput(cluster, admin, args)
                if "failover" in only:
                    out["failover"] = failover(cluster, admin, args)
            if "catch_up" in only:
                with Admin(bootstrap_servers=cluster.bootstrap) as admin:
                    out["catch_up"] = catch_up(cluster, admin, args)
    finally:
        cluster.stop()
    try:
        if "fetch_session" in only:
            out["fetch_session"] = fetch_sessions(work / "sessions", args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["goals"] = GOALS
    out["goals_met"] = goals_met(out)
    out["elapsed_s"] = round(time.perf_counter() - started, 1)
    out["load_average_at_end"] = load_average()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
