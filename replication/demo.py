"""``replog demo``: what replog does, end to end, on an embedded default.

Today it shows the foundation: a partition log on local files, written with group commit,
merged, recovered after a reopen, and read back into Arrow, then verified. The demo grows with
the cluster, the Spark source and the exactly-once sink.
"""

from __future__ import annotations

import tempfile
import time

import pyarrow as pa
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from logstore.batch import build, iter_batches
from logstore.config import LogConfig
from logstore.log import Log
from logstore.storage import Storage


def run_demo(*, records: int, data: str | None) -> int:
    console = Console()
    root = data or tempfile.mkdtemp(prefix="replog-demo-")
    storage = Storage.from_url(root).child("events/0")
    console.print(f"[bold]replog demo[/bold]: one partition log on [cyan]{storage.url}[/cyan]")
    log = Log.open(storage, LogConfig(segment_bytes=4 * 1024 * 1024))
    batch_size = 10_000
    start = time.perf_counter()
    now = int(time.time() * 1000)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("producing events", total=records)
        written = 0
        while written < records:
            n = min(batch_size, records - written)
            values = pa.array(
                [f"event-{i:012d}".encode() * 5 for i in range(written, written + n)], pa.binary()
            )
            table = pa.table({"value": values, "timestamp": pa.array([now] * n, pa.int64())})
            log.append(build(table), leader_epoch=0)
            log.flush()
            written += n
            progress.update(task, advance=n)
    elapsed = time.perf_counter() - start
    merges = log.merge_segments()
    log.close()
    reopened = Log.open(storage)
    seen = 0
    expected_offset = 0
    ok = True
    offset = reopened.log_start_offset
    while offset < reopened.log_end_offset:
        chunk = reopened.read(offset, 8 * 1024 * 1024)
        for batch in iter_batches(chunk):
            values = batch.to_arrow().column("value")
            for i, value in enumerate(values.to_pylist()):
                ok = (
                    ok
                    and value == f"event-{expected_offset:012d}".encode() * 5
                    and batch.base_offset + i == expected_offset
                )
                expected_offset += 1
            seen += batch.record_count
            offset = batch.next_offset
    table = Table(title="verification")
    for col in ("records in", "records read back", "objects", "merges", "write rate", "verdict"):
        table.add_column(col)
    table.add_row(
        str(records),
        str(seen),
        str(len(reopened.segments())),
        str(merges),
        f"{records / elapsed:,.0f} rec/s",
        "[green]OK[/green]" if ok and seen == records else "[red]MISMATCH[/red]",
    )
    console.print(table)
    return 0 if ok and seen == records else 1
