"""A consumer-group member as a process of its own, for fault tests (SIGKILL, SIGSTOP):

    python -m tests.group_member --bootstrap H:P --group G --topic T --out FILE

It appends every record it gets to FILE ("partition offset value time" lines, time.time() of
receipt; flushed) *before*
committing it (at least once), commits after every poll, and writes "commit refused: ..." to
FILE when the group refuses a commit (a rebalance took its partitions). SIGTERM closes it.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from types import FrameType

from replication.client import Consumer
from replication.errors import CommitFailedError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    args = parser.parse_args(argv)
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    consumer = Consumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=300,
        max_poll_interval_ms=30_000,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        request_timeout_ms=5_000,
    )
    with open(args.out, "a", buffering=1) as out:
        consumer.subscribe([args.topic])
        while not stopping:
            records = consumer.poll(timeout_ms=200)
            now = time.time()
            for r in records:
                out.write(f"{r.partition} {r.offset} {(r.value or b'').decode()} {now:.4f}\n")
            out.flush()
            if records:
                try:
                    consumer.commit()
                except CommitFailedError as err:
                    out.write(f"commit refused: {err}\n")
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
