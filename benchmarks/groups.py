"""Consumer groups: a group of three consumers beside a single consumer with assign(), on the
same records in the same run, and the time from a member's SIGKILL until its partitions are
consumed again.

Starts a controller and three brokers (tests.cluster.Cluster on a temp directory), creates a
topic of 6 partitions (replication factor 3, min.insync.replicas 2) and produces N 100-byte
records (acks=all). Then:

- single: one Consumer, assign() of every partition, from the beginning (perf consume), timed
  from its start;
- group: three Consumers of one group in threads of this process, subscribe(), from the
  beginning (perf consume --group --members 3), timed from subscribe() (the join included;
  the rate after the join and the first rebalance are reported too). Progress counts each
  record once (a record read again after a rebalance is work, not progress);
- failover: three member processes (tests/group_member.py, session.timeout.ms 6000,
  heartbeat.interval.ms 300) consume while records arrive at a steady rate; one is SIGKILLed;
  the time until the first record of one of its partitions reaches another member.

Prints one JSON line.

    python benchmarks/groups.py [--records 600000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replication.client import Admin, Producer
from replication.tools.perf import consume_group_perf, consume_perf
from tests.cluster import Cluster

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = 6
VALUE_BYTES = 100
SESSION_TIMEOUT_MS = 6000
CLUSTER = {"offsets.topic.num.partitions": "3", "group.initial.rebalance.delay.ms": "0"}


def fill(bootstrap: str, topic: str, records: int) -> None:
    rows = 10_000
    data = pa.table({"value": pa.array([b"x" * VALUE_BYTES] * rows, pa.binary())})
    with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=5) as producer:
        for _ in range(records // rows):
            producer.send_arrow(topic, data)
        producer.flush()


def failover(bootstrap: str, topic: str, work: Path) -> dict[str, float]:
    """Seconds from a member's SIGKILL to the first record of one of its partitions consumed
    by another member (records arrive at ~500/s, each stamped with its send time)."""
    members = []
    for i in range(3):
        with open(work / f"m{i}.stderr", "w") as stderr:
            members.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tests.group_member",
                        "--bootstrap",
                        bootstrap,
                        "--group",
                        "bench-failover",
                        "--topic",
                        topic,
                        "--out",
                        str(work / f"m{i}"),
                        "--session-timeout-ms",
                        str(SESSION_TIMEOUT_MS),
                    ],
                    cwd=ROOT,
                    stderr=stderr,
                )
            )
    stop = threading.Event()

    def feed() -> None:
        with Producer(bootstrap_servers=bootstrap, linger_ms=0) as producer:
            i = 0
            while not stop.wait(0.002):
                producer.send(topic, value=str(i).encode(), partition=i % PARTITIONS)
                i += 1

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()

    def lines(i: int) -> list[list[str]]:
        path = work / f"m{i}"
        if not path.exists():
            return []
        return [line.split() for line in path.read_text().splitlines() if line[:1].isdigit()]

    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(len(lines(i)) > 200 for i in range(3)):
            time.sleep(0.2)
        victim_partitions = {int(parts[0]) for parts in lines(0)[-50:]}
        members[0].send_signal(signal.SIGKILL)
        killed_at = time.time()
        members[0].wait()
        seen_before = {i: len(lines(i)) for i in (1, 2)}
        first_after: float | None = None
        deadline = time.monotonic() + 120
        while first_after is None and time.monotonic() < deadline:
            time.sleep(0.2)
            for i in (1, 2):
                for parts in lines(i)[seen_before[i] :]:
                    if int(parts[0]) in victim_partitions and float(parts[3]) > killed_at:
                        t = float(parts[3])
                        first_after = t if first_after is None else min(first_after, t)
        return {
            "failover_s": round((first_after or float("nan")) - killed_at, 2),
            "session_timeout_ms": SESSION_TIMEOUT_MS,
        }
    finally:
        stop.set()
        feeder.join(timeout=30)
        for m in members:
            if m.poll() is None:
                m.terminate()
                m.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=600_000)
    parser.add_argument("--dir", default=None, help="where the cluster keeps its data")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        cluster = Cluster(Path(tmp), brokers=3, overrides=CLUSTER)
        cluster.start()
        try:
            bootstrap = cluster.bootstrap
            with Admin(bootstrap_servers=bootstrap) as admin:
                admin.create_topic("bench-groups", PARTITIONS, 3, {"min.insync.replicas": "2"})
                admin.create_topic("bench-failover", PARTITIONS, 3, {"min.insync.replicas": "2"})
            fill(bootstrap, "bench-groups", args.records)
            single = consume_perf(bootstrap, "bench-groups", args.records)
            group = consume_group_perf(
                bootstrap, "bench-groups", args.records, group="bench-3", members=3
            )
            fail = failover(bootstrap, "bench-failover", Path(tmp))
        finally:
            cluster.stop()
    print(
        json.dumps(
            {
                "benchmark": "groups",
                "brokers": 3,
                "partitions": PARTITIONS,
                "records": args.records,
                "value_bytes": VALUE_BYTES,
                "single_assign_records_per_s": single.records_per_s,
                # both from the consumers' start (the group's join included), as one caller
                # of poll() sees it; the group's rate without its join too
                "group_of_3_records_per_s": group.records_per_s_with_join,
                "group_of_3_records_per_s_after_join": group.records_per_s,
                "group_first_rebalance_s": group.join_s,
                "ratio_group_to_single": round(
                    group.records_per_s_with_join / single.records_per_s, 3
                ),
                "complete": single.complete and group.complete,
                **fail,
                "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                f"Python {platform.python_version()}",
                "load_average": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
