"""A consume-transform-produce worker as a process, for fault tests (SIGKILL):

    python -m tests.ctp_worker --bootstrap H:P --group G --source IN --sink OUT --txn-id T

It reads IN as a member of group G (read_committed) and, per poll, in one transaction: writes
each record's value upper-cased to OUT and commits the group's offsets with
``send_offsets_to_transaction``. A restart with the same transactional id fences the previous
instance and aborts its open transaction, so OUT holds each input record exactly once.
"""

from __future__ import annotations

import argparse
import signal
import sys
from types import FrameType

from replication.client import Consumer, Producer
from replication.errors import CommitFailedError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--bootstrap", "--group", "--source", "--sink", "--txn-id"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args(argv)
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    producer = Producer(bootstrap_servers=args.bootstrap, transactional_id=args.txn_id)
    producer.init_transactions()  # fences a previous instance, aborting its transaction
    consumer = Consumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=300,
    )
    consumer.subscribe([args.source])
    while not stopping:
        records = consumer.poll(timeout_ms=200, max_records=50)
        if not records:
            continue
        producer.begin_transaction()
        for r in records:
            producer.send(args.sink, value=(r.value or b"").upper(), key=r.key)
        positions = {tp: consumer.position(tp) for tp in consumer.assignment()}
        try:
            producer.send_offsets_to_transaction(positions, consumer.group_metadata())
            producer.commit_transaction()
        except CommitFailedError as err:
            print(f"transaction aborted: {err}", file=sys.stderr, flush=True)
            producer.abort_transaction()
            # start again from the group's committed offsets
            for tp, committed in consumer.committed(consumer.assignment()).items():
                consumer.seek(tp, committed.offset if committed else 0)
    consumer.close()
    producer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
