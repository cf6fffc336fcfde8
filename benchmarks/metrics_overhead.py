"""What Prometheus metrics cost the produce path: acks=all RF=3 with metrics on vs off.

Starts two clusters side by side, each a controller and three brokers as processes on local
files (tests/cluster.Cluster): one with ``metrics.port=0`` on every node, one without. The
same produce run (replication.tools.perf.produce_perf: records mode, 100-byte values, acks=all,
RF=3, min.insync.replicas=2) goes to each in turn, alternating off/on for ``--rounds`` rounds,
so that drift in the machine's load hits both sides alike (the order flips every round).
While a run goes to the cluster with metrics, a scraper process GETs /metrics of every node
of that cluster every ``--scrape-interval`` seconds (1 s by default, 15 times Prometheus's
usual rate); at the end the brokers' messagesin counters must add up to what was produced.

Prints one JSON line: records/s of every run both ways, their medians, and the ratio
on/off (goal: >= 0.97, metrics cost at most 3%), the brokers' CPU per record both ways
(from /proc: less noisy than the rate, which the Python client bounds), and the scrape count
and time.

    python benchmarks/metrics_overhead.py [--records 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client.parser import text_string_to_metric_families

from replication.client import Admin
from replication.client.describe import describe_topic_waiting
from replication.tools.perf import produce_perf
from tests.cluster import BrokerProcess, Cluster, wait_until

GOAL_RATIO = 0.97
VALUE_BYTES = 100
TOPIC = "bench"


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def create(admin: Admin, partitions: int) -> None:
    admin.create_topic(TOPIC, partitions, 3, {"min.insync.replicas": "2"})
    wait_until(
        lambda: all(
            x.leader >= 0 and len(x.isr) == 3
            for x in describe_topic_waiting(admin, TOPIC, 30_000).partitions
        ),
        timeout=60,
        message=f"every partition of {TOPIC} has a leader and a full ISR",
    )


def messages_in(text: str) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "kafka_server_brokertopicmetrics_messagesin_total"
        and s.labels.get("topic") == TOPIC
    )


def _scrape_loop(urls: list[str], interval: float, stop: Any, scrapes: Any, seconds: Any) -> None:
    """In a process of its own (as Prometheus is): GET every URL every ``interval`` s."""
    while not stop.wait(interval):
        for url in urls:
            started = time.perf_counter()
            with urllib.request.urlopen(url, timeout=10) as response:
                response.read()
            with scrapes.get_lock():
                scrapes.value += 1
                seconds.value += time.perf_counter() - started


class Scraper:
    """Scrapes every node's /metrics every ``interval`` seconds from another process while
    in a ``with`` block, so that the producer's process (the client is CPU-bound) does not
    pay for it."""

    def __init__(self, nodes: list[BrokerProcess], interval: float) -> None:
        self.urls = [node.metrics_url for node in nodes]
        self.interval = interval
        self._scrapes = multiprocessing.Value("i", 0)
        self._seconds = multiprocessing.Value("d", 0.0)
        self._stop = multiprocessing.Event()
        self._process: multiprocessing.Process | None = None

    @property
    def scrapes(self) -> int:
        return int(self._scrapes.value)

    @property
    def avg_ms(self) -> float:
        return round(self._seconds.value / max(self.scrapes, 1) * 1000, 1)

    def messages_in(self) -> float:
        """messagesin of the benchmark topic, summed over the brokers."""
        counted = 0.0
        for url in self.urls:
            with urllib.request.urlopen(url, timeout=10) as response:
                counted += messages_in(response.read().decode())
        return counted

    def __enter__(self) -> Scraper:
        self._stop.clear()
        self._process = multiprocessing.Process(
            target=_scrape_loop,
            args=(self.urls, self.interval, self._stop, self._scrapes, self._seconds),
            daemon=True,
        )
        self._process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._process is not None
        self._process.join(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per run")
    parser.add_argument("--rounds", type=int, default=3, help="off/on pairs of runs")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--scrape-interval", type=float, default=1.0, help="seconds")
    parser.add_argument("--dir", default=None, help="where the clusters' files go")
    args = parser.parse_args()
    logging.getLogger("replication").setLevel(logging.ERROR)

    work = Path(tempfile.mkdtemp(prefix="replog-bench-metrics-", dir=args.dir))
    started = time.perf_counter()
    out: dict[str, Any] = {
        "benchmark": "metrics_overhead",
        "machine": machine(),
        "load_average_at_start": round(os.getloadavg()[0], 2),
        "brokers": 3,
        "storage": "local files",
        "value_bytes": VALUE_BYTES,
        "acks": "all",
        "replication_factor": 3,
        "records_per_run": args.records,
        "scrape_interval_s": args.scrape_interval,
    }
    clusters = {
        "off": Cluster(work / "off", brokers=3),
        "on": Cluster(work / "on", brokers=3, metrics=True),
    }
    try:
        for cluster in clusters.values():
            cluster.start()
            with Admin(bootstrap_servers=cluster.bootstrap) as admin:
                create(admin, args.partitions)
            # warm-up: connections, producer ids, first segments
            produce_perf(cluster.bootstrap, TOPIC, 20_000, VALUE_BYTES, acks="all")
        on = clusters["on"]
        nodes = [*on.brokers.values(), on.controller]
        scraper = Scraper(nodes, args.scrape_interval)
        rates: dict[str, list[float]] = {"off": [], "on": []}
        cpu_us: dict[str, list[float]] = {"off": [], "on": []}
        produced_on = 20_000
        for round_ in range(args.rounds):
            # off first in even rounds, on first in odd ones: order effects cancel out
            for side in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
                cluster = clusters[side]
                pids = [b.pid for b in cluster.brokers.values()]
                cpu_before = cpu_seconds(pids)
                if side == "on":
                    with scraper:
                        result = produce_perf(
                            cluster.bootstrap, TOPIC, args.records, VALUE_BYTES, acks="all"
                        )
                    produced_on += args.records
                else:
                    result = produce_perf(
                        cluster.bootstrap, TOPIC, args.records, VALUE_BYTES, acks="all"
                    )
                if result.errors:
                    raise SystemExit(f"{side}: {result.errors} failed sends")
                rates[side].append(round(result.records_per_s))
                cpu_us[side].append(round((cpu_seconds(pids) - cpu_before) / args.records * 1e6, 2))
        counted = scraper.messages_in()
        if counted != produced_on:
            raise SystemExit(
                f"messagesin summed over the brokers is {counted}, {produced_on} records "
                "were produced"
            )
        off_median = statistics.median(rates["off"])
        on_median = statistics.median(rates["on"])
        out.update(
            {
                "records_per_s_off": rates["off"],
                "records_per_s_on": rates["on"],
                "median_records_per_s_off": off_median,
                "median_records_per_s_on": on_median,
                "ratio_on_off": round(on_median / off_median, 3),
                # each round's on/off pair ran back to back: the median of their ratios
                "paired_ratio_median": round(
                    statistics.median(
                        on / off for on, off in zip(rates["on"], rates["off"], strict=True)
                    ),
                    3,
                ),
                # the brokers' CPU per record: what the metrics cost them, less noisy than
                # the client-bound rate
                "broker_cpu_us_per_record_off": cpu_us["off"],
                "broker_cpu_us_per_record_on": cpu_us["on"],
                "median_broker_cpu_us_per_record_off": statistics.median(cpu_us["off"]),
                "median_broker_cpu_us_per_record_on": statistics.median(cpu_us["on"]),
                "scrapes": scraper.scrapes,
                "scrape_avg_ms": scraper.avg_ms,
                "messagesin_matches_produced": True,
                "goal_ratio_at_least": GOAL_RATIO,
                "goal_met": on_median / off_median >= GOAL_RATIO,
            }
        )
    finally:
        for cluster in clusters.values():
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    out["elapsed_s"] = round(time.perf_counter() - started, 1)
    out["load_average_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
