"""The Spark driver of :mod:`tests.chaos.spark_pipeline`: one streaming query, replog in ->
transform -> replog's exactly-once sink out, on a local SparkSession of its own, restartable
from its checkpoint.

    python -m tests.chaos.spark_driver --bootstrap 127.0.0.1:9092 --source in --sink out \
        --sink-id chaos-1 --checkpoint /tmp/ckpt

The harness SIGKILLs this process (with its JVM and Spark's Python workers) and starts it
again on the same checkpoint. When the query itself fails (a Python worker it relied on was
killed, a commit failed), the driver starts it again from the checkpoint in the same session,
as a supervisor of a production query would; each start and failure is one JSON line on
stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

#: The transform: each input value, upper-cased, behind a prefix (see :func:`transformed`).
TRANSFORM = "concat('out:', upper(CAST(value AS STRING)))"
#: Spark tries a failed task this many times, as on a cluster (spark.task.maxFailures).
TASK_ATTEMPTS = 4


def transformed(value: str) -> str:
    """What the query makes of an input value (:data:`TRANSFORM`, in Python)."""
    return "out:" + value.upper()


def _event(kind: str, **fields: Any) -> None:
    print(json.dumps({"event": kind, "t": round(time.time(), 3), **fields}), flush=True)


def _start(spark: Any, args: argparse.Namespace) -> Any:
    return (
        spark.readStream.format("replog")
        .option("bootstrap.servers", args.bootstrap)
        .option("subscribe", args.source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.max_offsets))
        .load()
        .selectExpr("key", f"{TRANSFORM} AS value")
        .writeStream.format("replog")
        .option("bootstrap.servers", args.bootstrap)
        .option("topic", args.sink)
        .option("sink.id", args.sink_id)
        # a transaction a killed driver left open aborts within this, so the output's last
        # stable offset moves on
        .option("transaction.timeout.ms", str(args.transaction_timeout_ms))
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime=f"{args.trigger_ms} milliseconds")
        .start()
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.spark_driver")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--sink-id", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--max-offsets", type=int, default=500)
    parser.add_argument("--trigger-ms", type=int, default=500)
    parser.add_argument("--transaction-timeout-ms", type=int, default=15000)
    args = parser.parse_args(argv)
    from tests.spark_session import start_local_session

    spark = start_local_session("replog-chaos-spark", task_attempts=TASK_ATTEMPTS)
    _event("session")
    while True:
        query = _start(spark, args)
        _event("query_started", id=query.id)
        try:
            query.awaitTermination()
        except Exception as err:  # the query failed: start it again from its checkpoint
            _event("query_failed", error=f"{type(err).__name__}: {str(err)[:300]}")
        else:
            _event("query_stopped")
            return 0


if __name__ == "__main__":
    sys.exit(main())
