"""The metadata store: what one metadata change costs the active controller as the cluster
grows, beside the limit of writing the same bytes once.

For 100, 1,000 and 10,000 partitions (one topic, replication factor 3, three brokers), on
local files (a temp directory, fsync on, as a controller writes): the controller commits
``--changes`` ISR changes (Controller.alter_partition, each a new metadata version: the delta
from the version before written put-if-absent, the fencing check, a full snapshot at least
every 100 versions, a prune every 100 versions). Reported per change: the controller's time
(p50, p99), the bytes of the version object (p50) and the bytes written per change with the
snapshots counted in; a broker's time to catch up one version (read_latest from the image it
holds, p50) and a new reader's (from the newest snapshot); the full image's size and its
serialization time (MetadataImage.to_bytes); and the limit, measured in the same run on the
same storage: one put_if_absent of the full image's bytes (p50, p99).

Prints one JSON line per size.

    python benchmarks/metadata_store.py [--changes 200] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from logstore.storage import Storage
from replication.controller.controller import Controller
from replication.metadata.image import MetadataImage
from replication.metadata.store import MetadataStore

SIZES = (100, 1_000, 10_000)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


class MeasuredStore(MetadataStore):
    """Counts the bytes of the snapshots written."""

    snapshot_bytes = 0

    def write_snapshot(self, image: MetadataImage) -> int:
        size = super().write_snapshot(image)
        self.snapshot_bytes += size
        return size


def run(partitions: int, changes: int, root: Path) -> dict[str, object]:
    url = f"file://{root}/cluster-{partitions}"
    store = MeasuredStore(Storage.from_url(url))
    controller = Controller(store, 0, "127.0.0.1", 9000)
    controller.activate()
    for broker in range(3):
        info = controller.register_broker(broker, "127.0.0.1", 9100 + broker, None, f"b{broker}")
        controller.heartbeat(broker, info.epoch, controller.image.version)  # unfenced
    controller.create_topic("events", partitions, 3)
    broker = MetadataStore(Storage.from_url(url))
    held = broker.read_latest()
    store.snapshot_bytes = 0
    change_s: list[float] = []
    version_bytes: list[int] = []
    catch_up_s: list[float] = []
    for change in range(changes):
        info = controller.image.topic("events")
        assert info is not None
        index = change % partitions
        state = info.partitions[index]
        isr = state.replicas if len(state.isr) < 3 else state.replicas[:2]
        start = time.perf_counter()
        controller.alter_partition(
            state.leader, "events", index, state.leader_epoch, state.partition_epoch, isr
        )
        change_s.append(time.perf_counter() - start)
        version_bytes.append(store.last_write_bytes)
        start = time.perf_counter()
        held = broker.read_latest(held)
        catch_up_s.append(time.perf_counter() - start)
        assert held == controller.image
    image = controller.image
    start = time.perf_counter()
    assert MetadataStore(Storage.from_url(url)).read_latest() == image
    new_reader_s = time.perf_counter() - start
    serialize_s = []
    for _ in range(min(changes, 50)):
        start = time.perf_counter()
        data = image.to_bytes()
        serialize_s.append(time.perf_counter() - start)
    # the limit: the same bytes, one put_if_absent each, to the same storage
    raw = Storage.from_url(f"file://{root}/raw-{partitions}")
    put_s = []
    for i in range(changes):
        start = time.perf_counter()
        raw.put_if_absent(f"metadata/{i:020d}.json", data)
        put_s.append(time.perf_counter() - start)
    return {
        "benchmark": "metadata_store",
        "partitions": partitions,
        "changes": changes,
        "version_object_bytes_p50": statistics.median(version_bytes),
        "bytes_written_per_change": round((sum(version_bytes) + store.snapshot_bytes) / changes),
        "image_bytes": len(data),
        "controller_change_ms_p50": ms(statistics.median(change_s)),
        "controller_change_ms_p99": ms(percentile(change_s, 0.99)),
        "image_to_bytes_ms_p50": ms(statistics.median(serialize_s)),
        "broker_catch_up_one_version_ms_p50": ms(statistics.median(catch_up_s)),
        "new_reader_ms": ms(new_reader_s),
        "limit_put_if_absent_ms_p50": ms(statistics.median(put_s)),
        "limit_put_if_absent_ms_p99": ms(percentile(put_s, 0.99)),
        "storage": "local files, fsync",
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "machine": f"{platform.machine()}, python {platform.python_version()}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=200, help="ISR changes per size")
    parser.add_argument("--dir", help="where to write (default: a temp directory)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for partitions in SIZES:
            print(json.dumps(run(partitions, args.changes, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
