"""What Prometheus metrics cost the produce path: acks=all RF=3 with metrics on vs off.

Starts two clusters side by side, each a controller and three brokers as processes on local
files (tests/cluster.Cluster): one with ``metrics.port=0`` on every node, one without. The
same produce run (replication.tools.perf.produce_perf: records mode, 100-byte values, acks=all,
RF=3, min.insync.replicas=2) goes to each in turn, alternating off/on for ``--rounds`` rounds,
so that drift in the machine's load hits both sides alike. While a run goes to the cluster
with metrics, a scraper thread GETs /metrics of every node of that cluster every
``--scrape-interval`` seconds (1 s by default, 15 times Prometheus's usual rate) and checks
that the brokers' messagesin counters add up to what was produced.

Prints one JSON line: records/s of every run both ways, their medians, and the ratio
on/off (goal: >= 0.97, metrics cost at most 3%), with the scrape count and time.

    python benchmarks/metrics_overhead.py [--records 200000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
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


class Scraper:
    """GETs every node's /metrics every ``interval`` seconds while running."""

    def __init__(self, nodes: list[BrokerProcess], interval: float) -> None:
        self.nodes = nodes
        self.interval = interval
        self.scrapes = 0
        self.seconds = 0.0
        self.last_messages_in = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scrape_all(self) -> None:
        counted = 0.0
        for node in self.nodes:
            started = time.perf_counter()
            with urllib.request.urlopen(node.metrics_url, timeout=10) as response:
                text = response.read().decode()
            self.seconds += time.perf_counter() - started
            self.scrapes += 1
            counted += messages_in(text)
        self.last_messages_in = counted

    def __enter__(self) -> Scraper:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                self.scrape_all()

        self._stop.clear()
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(30)


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
        produced_on = 20_000
        for _ in range(args.rounds):
            for side in ("off", "on"):
                cluster = clusters[side]
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
        scraper.scrape_all()
        if scraper.last_messages_in != produced_on:
            raise SystemExit(
                f"messagesin summed over the brokers is {scraper.last_messages_in}, "
                f"{produced_on} records were produced"
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
                "scrapes": scraper.scrapes,
                "scrape_avg_ms": round(scraper.seconds / max(scraper.scrapes, 1) * 1000, 1),
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
