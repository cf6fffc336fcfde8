"""``python -m tests.chaos``: run seeded chaos schedules; one JSON line each, then a summary.

    python -m tests.chaos --seed 1 --schedules 100            # every fault class, ~25 s each
    python -m tests.chaos --seed 7 --schedules 3 --classes crash_restart_while_paused
    python -m tests.chaos --seed 1 --schedules 8 --no-wal     # the per-partition layout
    python -m tests.chaos --seed 1 --schedules 5 --workload kafka  # confluent-kafka clients

Exit status 0 if no schedule found an anomaly, 1 otherwise (2 for bad arguments).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from tests.chaos.checker import ANOMALY_KINDS
from tests.chaos.nemesis import FAULT_CLASSES
from tests.chaos.runner import WORKLOADS, run_schedule


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=1, help="seed of the first schedule")
    parser.add_argument("--schedules", type=int, default=1, help="how many schedules (seeds)")
    parser.add_argument(
        "--classes",
        default=",".join(FAULT_CLASSES),
        help=f"comma-separated fault classes (default: all of {', '.join(FAULT_CLASSES)})",
    )
    parser.add_argument(
        "--duration", type=float, default=25.0, help="seconds of faults per schedule"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="where clusters keep data")
    parser.add_argument(
        "--wal",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="brokers write through the broker WAL (log.wal.enable, the default); --no-wal: "
        "the per-partition layout (log.wal.enable=false)",
    )
    parser.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="replog",
        help="the clients of the workloads: replog's own (the default), confluent-kafka's "
        "through the brokers' Kafka listeners, or a mix of both",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the data of schedules that passed too"
    )
    args = parser.parse_args(argv)
    args.classes = [c.strip() for c in args.classes.split(",") if c.strip()]
    unknown = sorted(set(args.classes) - set(FAULT_CLASSES))
    if unknown or not args.classes:
        parser.error(f"unknown fault classes {unknown}; choose from {', '.join(FAULT_CLASSES)}")
    return args


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over schedules: faults by class, acked records, anomalies, and the longest time
    without an ack per fault class."""
    faults: Counter[str] = Counter()
    anomalies: Counter[str] = Counter(dict.fromkeys(ANOMALY_KINDS, 0))
    no_ack: dict[str, float] = {}
    for result in results:
        faults.update(f["class"] for f in result.get("faults", []))
        anomalies.update(result.get("anomalies", {}))
        for fault_class, seconds in result.get("max_no_ack_s", {}).items():
            no_ack[fault_class] = max(no_ack.get(fault_class, 0.0), seconds)
    return {
        "summary": True,
        "schedules": len(results),
        "failed_schedules": [r["seed"] for r in results if not r["ok"]],
        "faults": dict(sorted(faults.items())),
        "faults_total": sum(faults.values()),
        "acked": sum(r.get("acked", 0) for r in results),
        "transactions": sum(sum(r.get("transactions", {}).values()) for r in results),
        "anomalies": dict(anomalies),
        "anomalies_total": sum(anomalies.values()),
        "max_no_ack_s": dict(sorted(no_ack.items())),
        "max_sigterm_s": max(
            (s for r in results for s in r.get("sigterm_s", {}).values() if s is not None),
            default=0.0,
        ),
        "ok": all(r["ok"] for r in results),
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("replication").setLevel(logging.ERROR)  # clients retry loudly under faults
    logging.getLogger("tests.chaos.librdkafka").setLevel(logging.CRITICAL)  # so does librdkafka
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="replog-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for seed in range(args.seed, args.seed + args.schedules):
        try:
            result = run_schedule(
                seed,
                args.classes,
                args.duration,
                workdir,
                keep=args.keep,
                wal=args.wal,
                workload=args.workload,
            )
        except Exception as err:  # a harness failure: reported, and the run goes on
            result = {
                "seed": seed,
                "error": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc(limit=8),
                "workdir": str(workdir / f"seed-{seed}"),
                "ok": False,
            }
        results.append(result)
        print(json.dumps(result), flush=True)
    summary = summarize(results)
    print(json.dumps(summary), flush=True)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
