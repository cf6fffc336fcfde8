"""A real S3 endpoint (moto's server) that counts the requests it serves, by price class.

S3 bills per request, and the classes differ by 12.5x (S3 Standard, us-east-1 list prices):
PUT, COPY, POST and LIST requests cost $0.005 per 1,000, GET, HEAD and every other request
$0.0004 per 1,000, DELETE (and aborting a multipart upload) nothing. moto 5 has no request
counter (its *recorder* stores every request with its base64 body: far too heavy at MB/s), so
this module starts moto the way ``moto.server.ThreadedMotoServer`` does (werkzeug
``make_server`` around ``DomainDispatcherApplication(create_backend_app)``) and wraps that WSGI
app in :class:`CountingMiddleware`, which classifies each request before handing it on. moto
still serves every request; the middleware only counts requests and bytes per class:

- ``PUT``: PutObject, UploadPart, CopyObject (a PUT on a key), CreateBucket and other bucket
  PUTs, CreateMultipartUpload (``POST ?uploads``), CompleteMultipartUpload
  (``POST ?uploadId=``), POST object uploads;
- ``LIST``: ListObjects / ListObjectsV2 (a GET on the bucket with no sub-resource or with
  ``list-type``, ``versions``, ``uploads``), ListParts (``GET key?uploadId=``), ListBuckets
  (``GET /``);
- ``GET``: GetObject (ranged or not), HeadObject, HeadBucket, and the other GETs on a bucket
  (``?location``, ``?acl``, ...);
- ``DELETE``: DeleteObject, AbortMultipartUpload, DeleteBucket, and DeleteObjects
  (``POST ?delete``: S3 does not charge for deletes).

Requests to moto's own API (``/moto-api/...``) are not counted. Only path-style addressing
(``http://127.0.0.1:<port>/<bucket>/<key>``) is understood; that is what s3fs and boto3 use
with an ``endpoint_url``.

Two ways to read the counts: in-process, :meth:`CountingMotoServer.counts` /
:meth:`CountingMotoServer.reset`; over HTTP, ``GET /_counter`` (JSON) and
``POST /_counter/reset``, answered by the middleware itself (see :func:`fetch_counts`,
:func:`reset_counts`); both give the totals and the counts per bucket and per signing access
key (a test gives the client it measures its own key, since moto accepts any). The benchmarks run
the server in its own process so that moto does not share a GIL with the clients measured::

    python benchmarks/s3_counter.py [--port 0]     # prints "s3-counter ready on http://..."
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import threading
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final
from urllib.parse import parse_qs

#: The request classes, in the order they are printed.
CLASSES: Final = ("PUT", "LIST", "GET", "DELETE")

#: S3 Standard list prices, us-east-1, USD per 1,000 requests of each class.
PRICE_PER_1000_USD: Final = {"PUT": 0.005, "LIST": 0.005, "GET": 0.0004, "DELETE": 0.0}

#: The path the middleware answers itself (counts as JSON; ``/reset`` zeroes them).
COUNTER_PATH: Final = "/_counter"
READY_PREFIX: Final = "s3-counter ready on "

#: Bucket GET sub-resources that list keys (priced as LIST); other sub-resources are GET class.
_LIST_SUBRESOURCES: Final = frozenset({"list-type", "versions", "uploads"})
#: Query parameters of a plain ListObjects that are not sub-resources.
_LIST_PARAMS: Final = frozenset(
    {
        "prefix",
        "delimiter",
        "marker",
        "max-keys",
        "encoding-type",
        "continuation-token",
        "start-after",
        "fetch-owner",
        "list-type",
        "key-marker",
        "version-id-marker",
        "upload-id-marker",
        "x-id",
    }
)


def classify(method: str, path: str, query: str) -> str | None:
    """The price class of one path-style S3 request, or None for moto's own API."""
    if path.startswith("/moto-api"):
        return None
    bucket, _, key = path.lstrip("/").partition("/")
    params = parse_qs(query, keep_blank_values=True)
    method = method.upper()
    if method == "DELETE":
        return "DELETE"
    if method == "POST":
        return "DELETE" if "delete" in params else "PUT"
    if method == "PUT":
        return "PUT"
    if method in ("GET", "HEAD"):
        if method == "GET" and not bucket:
            return "LIST"  # ListBuckets
        if method == "GET" and not key:
            if params.keys() & _LIST_SUBRESOURCES or params.keys() <= _LIST_PARAMS:
                return "LIST"
            return "GET"  # ?location, ?acl, ?versioning ...: "all other requests"
        if method == "GET" and "uploadId" in params:
            return "LIST"  # ListParts
        return "GET"
    return "GET"  # OPTIONS and the rest: "all other requests"


class RequestCounter:
    """Requests and bytes per class, in total and per bucket; safe to update from werkzeug's
    request threads. (Per bucket, because the benchmarks give each broker its own bucket: the
    per-broker figure is the per-replica-store cost.)"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = self._zero()
        self._buckets: defaultdict[str, dict[str, dict[str, int]]] = defaultdict(self._zero)
        self._access_keys: defaultdict[str, dict[str, dict[str, int]]] = defaultdict(self._zero)

    @staticmethod
    def _zero() -> dict[str, dict[str, int]]:
        return {c: {"requests": 0, "bytes_in": 0, "bytes_out": 0} for c in CLASSES}

    def add(
        self,
        cls: str,
        *,
        bucket: str = "",
        access_key: str = "",
        requests: int = 0,
        bytes_in: int = 0,
        bytes_out: int = 0,
    ) -> None:
        with self._lock:
            per_bucket, per_key = self._buckets[bucket], self._access_keys[access_key]
            for entry in (self._counts[cls], per_bucket[cls], per_key[cls]):
                entry["requests"] += requests
                entry["bytes_in"] += bytes_in
                entry["bytes_out"] += bytes_out

    def snapshot(self) -> dict[str, dict[str, int]]:
        """A copy: ``{"PUT": {"requests": n, "bytes_in": n, "bytes_out": n}, ...}``."""
        with self._lock:
            return {c: dict(v) for c, v in self._counts.items()}

    def by_bucket(self) -> dict[str, dict[str, dict[str, int]]]:
        """A copy per bucket (``""``: requests naming no bucket, e.g. ListBuckets)."""
        return self._copy(self._buckets)

    def by_access_key(self) -> dict[str, dict[str, dict[str, int]]]:
        """A copy per signing access key (``""``: unsigned requests). Tests give the client
        they measure its own key, so that a broker's background requests to the same
        endpoint are not counted against it."""
        return self._copy(self._access_keys)

    def _copy(
        self, table: dict[str, dict[str, dict[str, int]]]
    ) -> dict[str, dict[str, dict[str, int]]]:
        with self._lock:
            return {name: {c: dict(v) for c, v in x.items()} for name, x in table.items()}

    def reset(self) -> dict[str, Any]:
        """Zero the counts; returns what they were, ``{"total": ..., "buckets": ...,
        "access_keys": ...}``, taken in the same step."""
        with self._lock:
            old = {
                "total": self._counts,
                "buckets": dict(self._buckets),
                "access_keys": dict(self._access_keys),
            }
            self._counts = self._zero()
            self._buckets.clear()
            self._access_keys.clear()
            return old


#: The access key in a SigV4 (or SigV2) Authorization header or a presigned URL's query.
_ACCESS_KEY: Final = re.compile(r"(?:Credential=|X-Amz-Credential=|^AWS )([^/:,&\s]+)")


def _access_key(environ: dict[str, Any]) -> str:
    """The access key that signed a request, ``""`` when it is unsigned."""
    for source in (environ.get("HTTP_AUTHORIZATION", ""), environ.get("QUERY_STRING", "")):
        match = _ACCESS_KEY.search(source)
        if match:
            return match.group(1)
    return ""


def _request_bytes(environ: dict[str, Any]) -> int:
    """The payload bytes of a request: the decoded length of an aws-chunked body, else
    Content-Length."""
    for name in ("HTTP_X_AMZ_DECODED_CONTENT_LENGTH", "CONTENT_LENGTH"):
        value = environ.get(name)
        if value:
            try:
                return int(value)
            except ValueError:
                pass
    return 0


class CountingMiddleware:
    """WSGI middleware around moto: classify, count, pass on; answer ``/_counter`` itself."""

    def __init__(self, app: Callable[..., Iterable[bytes]], counter: RequestCounter) -> None:
        self.app = app
        self.counter = counter

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        method = environ.get("REQUEST_METHOD", "GET")
        if path == COUNTER_PATH or path == COUNTER_PATH + "/reset":
            return self._answer(path, method, start_response)
        cls = classify(method, path, environ.get("QUERY_STRING", ""))
        if cls is None:
            return self.app(environ, start_response)
        bucket = path.lstrip("/").partition("/")[0]
        key = _access_key(environ)
        self.counter.add(
            cls, bucket=bucket, access_key=key, requests=1, bytes_in=_request_bytes(environ)
        )
        return self._counted(self.app(environ, start_response), cls, bucket, key)

    def _counted(
        self, body: Iterable[bytes], cls: str, bucket: str, access_key: str
    ) -> Iterator[bytes]:
        """Pass the response on, counting each chunk before it is sent (so a client that has
        read the whole answer also sees it counted)."""
        try:
            for chunk in body:
                self.counter.add(cls, bucket=bucket, access_key=access_key, bytes_out=len(chunk))
                yield chunk
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()

    def _answer(
        self, path: str, method: str, start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        if path.endswith("/reset"):
            if method != "POST":
                start_response("405 Method Not Allowed", [("Allow", "POST")])
                return [b"POST /_counter/reset zeroes the counts\n"]
            counts: dict[str, Any] = self.counter.reset()
        else:
            counts = {
                "total": self.counter.snapshot(),
                "buckets": self.counter.by_bucket(),
                "access_keys": self.counter.by_access_key(),
            }
        body = json.dumps(counts).encode()
        start_response(
            "200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        )
        return [body]


class CountingMotoServer:
    """moto's S3 server on ``host``:``port`` (0: a free port) behind :class:`CountingMiddleware`,
    served by a werkzeug threaded server on a daemon thread (as ThreadedMotoServer does)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.counter = RequestCounter()
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> CountingMotoServer:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request
        app = CountingMiddleware(DomainDispatcherApplication(create_backend_app), self.counter)
        self._server = make_server(self.host, self.port, app, threaded=True)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="s3-counter", daemon=True
        )
        self._thread.start()
        return self

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def counts(self) -> dict[str, dict[str, int]]:
        """The totals per class (see :meth:`RequestCounter.snapshot`)."""
        return self.counter.snapshot()

    def counts_by_bucket(self) -> dict[str, dict[str, dict[str, int]]]:
        return self.counter.by_bucket()

    def counts_by_access_key(self) -> dict[str, dict[str, dict[str, int]]]:
        return self.counter.by_access_key()

    def reset(self) -> dict[str, Any]:
        """Zero the counts; ``{"total": ..., "buckets": ..., "access_keys": ...}`` as they were."""
        return self.counter.reset()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> CountingMotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def fetch_counts(endpoint: str) -> dict[str, Any]:
    """The counts of a counting server at ``endpoint`` (``http://host:port``), over HTTP:
    ``{"total": {class: {...}}, "buckets": {bucket: {class: {...}}}, "access_keys": {key:
    {class: {...}}}}``."""
    with urllib.request.urlopen(endpoint + COUNTER_PATH, timeout=30) as response:
        counts: dict[str, Any] = json.loads(response.read())
        return counts


def reset_counts(endpoint: str) -> dict[str, Any]:
    """Zero the counts of the server at ``endpoint``; returns what they were (as
    :func:`fetch_counts`)."""
    request = urllib.request.Request(endpoint + COUNTER_PATH + "/reset", method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        counts: dict[str, Any] = json.loads(response.read())
        return counts


def cost_usd(counts: dict[str, dict[str, int]]) -> float:
    """The request cost of ``counts`` at :data:`PRICE_PER_1000_USD`."""
    return sum(counts[c]["requests"] * PRICE_PER_1000_USD[c] / 1000 for c in CLASSES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    args = parser.parse_args()
    server = CountingMotoServer(args.host, args.port).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    print(f"{READY_PREFIX}{server.endpoint}", flush=True)
    done.wait()
    server.stop()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
