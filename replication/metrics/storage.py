"""Storage request metrics: every operation of the node's storages, bound to logstore's
:data:`~logstore.storage.StorageObserver`.

``kind`` is the operation in object-store words: ``get`` (a whole object), ``get_range``,
``put``, ``put_if_absent``, ``exists``, ``size``, ``list``, ``delete``. An error is a failed
backend operation (StorageError); a missing object on a read or a lost put-if-absent race are
answers, not errors.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from logstore.errors import ObjectExistsError, ObjectNotFoundError

#: logstore's operation names -> kinds
KINDS = {"read": "get", "read_range": "get_range", "write": "put"}
#: every kind, exported from the start (at 0), so that rates and alerts have a series
ALL_KINDS = ("get", "get_range", "put", "put_if_absent", "exists", "size", "list", "delete")

#: seconds: a local fsync'd write to a slow S3 PUT
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class StorageMetrics:
    """A StorageObserver counting into ``replog_storage_*``; thread-safe (prometheus_client's
    metrics are), as storage runs in worker threads."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._requests = Counter(
            "replog_storage_requests",
            "Object storage operations, by kind",
            ["kind"],
            registry=registry,
        )
        self._duration = Histogram(
            "replog_storage_request_duration_seconds",
            "Duration of object storage operations, by kind",
            ["kind"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self._errors = Counter(
            "replog_storage_errors",
            "Failed object storage operations (backend errors), by kind",
            ["kind"],
            registry=registry,
        )
        for kind in ALL_KINDS:
            self._requests.labels(kind)
            self._duration.labels(kind)
            self._errors.labels(kind)

    def __call__(self, op: str, seconds: float, error: BaseException | None) -> None:
        kind = KINDS.get(op, op)
        self._requests.labels(kind).inc()
        self._duration.labels(kind).observe(seconds)
        if error is not None and not isinstance(error, ObjectNotFoundError | ObjectExistsError):
            self._errors.labels(kind).inc()
