"""What security costs: acks=all RF=3 produce and a consumer's read over SASL_SSL beside the
same workloads over PLAINTEXT, in the same run, on the same machine.

Starts a 3-broker local cluster (`replog cluster up`, local files) twice: plaintext, then
`--secure` (every listener SASL_SSL with SCRAM-SHA-512, TLS between the brokers too, ACLs on
with the admin as super user). On each: a topic of 3 partitions, RF=3, min.insync.replicas=2;
``replog perf produce`` in records mode (Producer.send per record, latency per record) and in
arrow mode (send_arrow, latency per batch), then ``replog perf consume`` of everything from the
beginning. Prints one JSON line: records/s and p50/p99 per run and side, and the ratios
secure / plaintext.

    python benchmarks/security.py [--records 300000] [--arrow-records 1500000]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replication.client import Admin, NewTopic
from replication.tools import local_cluster
from replication.tools.perf import consume_perf, produce_perf
from replication.tools.secure_cluster import existing

VALUE_BYTES = 100


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def run_side(data: Path, *, secure: bool, records: int, arrow_records: int) -> dict[str, Any]:
    nodes = local_cluster.cluster_up(str(data), 3, 0, secure=secure)
    try:
        bootstrap = ",".join(n.address for n in nodes if n.role == "broker")
        secured = existing(data) if secure else None
        client: dict[str, Any] = secured.client_config() if secured is not None else {}
        with Admin({**client, "bootstrap.servers": bootstrap}) as admin:
            admin.create_topics(
                [
                    NewTopic("bench-records", 3, 3, {"min.insync.replicas": "2"}),
                    NewTopic("bench-arrow", 3, 3, {"min.insync.replicas": "2"}),
                ]
            )
        # warm up (connections, sessions, the followers' first fetches) off the clock
        produce_perf(
            bootstrap, "bench-records", 2_000, VALUE_BYTES, acks="all", client_props=client
        )
        out: dict[str, Any] = {}
        for mode, topic, count in (
            ("records", "bench-records", records),
            ("arrow", "bench-arrow", arrow_records),
        ):
            result = produce_perf(
                bootstrap,
                topic,
                count,
                VALUE_BYTES,
                mode=mode,  # type: ignore[arg-type]
                acks="all",
                client_props=client,
            )
            out[f"produce_{mode}"] = {
                "records_per_s": round(result.records_per_s),
                "latency": result.latency,
                "p50_ms": round(result.latency_p50_ms, 2),
                "p99_ms": round(result.latency_p99_ms, 2),
            }
        read = consume_perf(bootstrap, "bench-arrow", arrow_records, client_props=client)
        if not read.complete:
            raise RuntimeError(f"the consumer read {read.records} of {arrow_records} records")
        out["consume"] = {"records_per_s": round(read.records_per_s), "complete": read.complete}
        return out
    finally:
        local_cluster.stop_nodes(nodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=300_000, help="records-mode produce")
    parser.add_argument("--arrow-records", type=int, default=1_500_000, help="arrow mode")
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    logging.getLogger("replication").setLevel(logging.ERROR)
    work = Path(tempfile.mkdtemp(prefix="replog-bench-security-", dir=args.dir))
    started = time.perf_counter()
    out: dict[str, Any] = {
        "benchmark": "security",
        "machine": machine(),
        "load_average_at_start": round(os.getloadavg()[0], 2),
        "brokers": 3,
        "replication_factor": 3,
        "acks": "all",
        "value_bytes": VALUE_BYTES,
        "secure": "SASL_SSL, SCRAM-SHA-512, TLS between brokers, ACLs on",
    }
    try:
        sides = {
            "plaintext": run_side(
                work / "plain", secure=False, records=args.records, arrow_records=args.arrow_records
            ),
            "sasl_ssl": run_side(
                work / "secure", secure=True, records=args.records, arrow_records=args.arrow_records
            ),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out.update(sides)
    plain, secure = sides["plaintext"], sides["sasl_ssl"]
    out["ratio_secure_to_plaintext"] = {
        "produce_records_per_s": round(
            secure["produce_records"]["records_per_s"] / plain["produce_records"]["records_per_s"],
            3,
        ),
        "produce_records_p99": round(
            secure["produce_records"]["p99_ms"] / plain["produce_records"]["p99_ms"], 3
        ),
        "produce_arrow_per_s": round(
            secure["produce_arrow"]["records_per_s"] / plain["produce_arrow"]["records_per_s"], 3
        ),
        "produce_arrow_p99": round(
            secure["produce_arrow"]["p99_ms"] / plain["produce_arrow"]["p99_ms"], 3
        ),
        "consume_per_s": round(
            secure["consume"]["records_per_s"] / plain["consume"]["records_per_s"], 3
        ),
    }
    out["elapsed_s"] = round(time.perf_counter() - started, 1)
    out["load_average_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
