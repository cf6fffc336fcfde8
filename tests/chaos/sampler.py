"""What a soak samples while it runs, and the slope of each series at the end.

A sample (one JSON line) holds, at ``t`` seconds into the run:

- ``nodes``: per node process (controllers and brokers), its pid, RSS and its anonymous part
  (bytes), open file descriptors and threads, read from ``/proc`` (absent while the node is down);
- ``metadata``: the objects and bytes under the metadata store's root;
- ``storage``: the objects and bytes under each broker's log storage root;
- ``internal``: each internal topic's records (log end minus log start, summed over its
  partitions), and ``records``: the same over every topic;
- ``compacted``: the records a read from offset 0 of the compacted topic returns.

:func:`slopes` fits a least-squares line to each series over the second half of the run (after
warm-up) and gives its slope per hour beside its level. A node restarted by a fault starts again
from a low RSS, so a node's series are fitted per incarnation (pid) and the longest one is
reported, with the number of incarnations seen. A series ``grows`` when it has enough points
and its slope per hour is more than :data:`GROWTH_PER_HOUR` of its level. The storage roots hold
every record the checked topics keep (they have no retention), so their raw bytes grow with the
live data by design; what must stay flat is their bytes and objects per record
(``storage.<broker>.bytes_per_record``), which is what is judged.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

#: A series grows without bound when its slope per hour exceeds this share of its level.
GROWTH_PER_HOUR = 0.5
#: Fewer points than this in the fitted window: reported, never judged.
MIN_POINTS = 5


def process_stats(pid: int) -> dict[str, int] | None:
    """RSS (bytes), open file descriptors and threads of a live process; None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if "VmRSS" not in fields:  # a zombie
        return None
    return {
        "pid": pid,
        "rss_bytes": int(fields["VmRSS"].split()[0]) * 1024,
        # the heap's share of the RSS (the rest is mapped files: libraries, mostly)
        "rss_anon_bytes": int(fields.get("RssAnon", "0 kB").split()[0]) * 1024,
        "fds": fds,
        "threads": int(fields["Threads"]),
    }


def tree_size(url: str) -> dict[str, int]:
    """Objects (files) and bytes under a ``file://`` storage root."""
    root = Path(url2pathname(urlparse(url).path))
    objects = size = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                size += os.stat(os.path.join(dirpath, name)).st_size
            except OSError:  # removed meanwhile (compaction, GC)
                continue
            objects += 1
    return {"objects": objects, "bytes": size}


def flatten(sample: Mapping[str, Any]) -> dict[str, tuple[float, int | None]]:
    """A sample's series: ``{name: (value, incarnation pid or None)}``."""
    out: dict[str, tuple[float, int | None]] = {}
    for node, stats in sample.get("nodes", {}).items():
        if stats is None:
            continue
        for key in ("rss_bytes", "rss_anon_bytes", "fds", "threads"):
            if key in stats:
                out[f"{node}.{key}"] = (float(stats[key]), stats["pid"])
    for key, value in sample.get("metadata", {}).items():
        out[f"metadata.{key}"] = (float(value), None)
    records = sample.get("records")
    for broker, size in sample.get("storage", {}).items():
        for key, value in size.items():
            out[f"storage.{broker}.{key}"] = (float(value), None)
            if records:
                out[f"storage.{broker}.{key}_per_record"] = (value / records, None)
    for topic, value in sample.get("internal", {}).items():
        out[f"internal.{topic}.records"] = (float(value), None)
    if records is not None:
        out["records.total"] = (float(records), None)
    if sample.get("compacted") is not None:
        out["compacted.records"] = (float(sample["compacted"]), None)
    return out


def fit(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of ``(t, value)`` points, per second (0.0 for fewer than 2)."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var


def slopes(samples: Iterable[Mapping[str, Any]], from_t: float) -> dict[str, dict[str, Any]]:
    """Each series' slope per hour over the samples at or after ``from_t``: ``{name: {slope_per_h,
    level, points, incarnations, grows}}`` (see the module's docstring for ``grows``)."""
    runs: dict[str, dict[int | None, list[tuple[float, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for sample in samples:
        if sample["t"] < from_t:
            continue
        for name, (value, incarnation) in flatten(sample).items():
            runs[name][incarnation].append((sample["t"], value))
    out: dict[str, dict[str, Any]] = {}
    for name, by_incarnation in sorted(runs.items()):
        points = max(by_incarnation.values(), key=len)
        slope_h = fit(points) * 3600
        level = sum(v for _, v in points) / len(points)
        judged = len(points) >= MIN_POINTS and not _grows_with_data(name)
        out[name] = {
            "slope_per_h": round(slope_h, 3),
            "level": round(level, 3),
            "points": len(points),
            "incarnations": len(by_incarnation),
            "grows": judged and slope_h > GROWTH_PER_HOUR * max(abs(level), 1.0),
        }
    return out


def _grows_with_data(name: str) -> bool:
    """The raw size of a storage root, and the records of every topic: they follow the live
    data of topics without retention (judged per record instead)."""
    if name == "records.total":
        return True
    return name.startswith("storage.") and not name.endswith("_per_record")
