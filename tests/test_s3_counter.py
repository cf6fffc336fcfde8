"""benchmarks/s3_counter.py: the counting moto server classifies real s3fs calls by price class.

A known sequence of s3fs calls (a put, a range get, a listing, a delete, a multi-delete, a
multipart upload) goes to a real moto server behind the counting middleware; the counts per
class must be exactly the requests those calls make. The classification table itself is
checked too, request by request, since the benchmark's dollar figures rest on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from benchmarks.s3_counter import (
    CLASSES,
    CountingMotoServer,
    classify,
    cost_usd,
    fetch_counts,
    reset_counts,
)
from tests.conftest import _DUMMY_AWS_ENV

pytestmark = pytest.mark.s3

MiB = 2**20


@pytest.fixture(scope="module")
def server() -> Iterator[CountingMotoServer]:
    with pytest.MonkeyPatch.context() as mp:
        for name, value in _DUMMY_AWS_ENV.items():
            mp.setenv(name, value)
        with CountingMotoServer() as srv:
            yield srv


@pytest.fixture
def fs(server: CountingMotoServer) -> Any:
    """A fresh s3fs client on the counting server, with an empty bucket and zeroed counts."""
    import s3fs

    fs = s3fs.S3FileSystem(
        endpoint_url=server.endpoint,
        key="testing",
        secret="testing",
        skip_instance_cache=True,
        use_listings_cache=False,
    )
    if not fs.exists("bench"):
        fs.mkdir("bench")
    for path in fs.find("bench"):
        fs.rm_file(path)
    server.reset()
    return fs


def requests(counts: dict[str, dict[str, int]]) -> dict[str, int]:
    return {c: counts[c]["requests"] for c in CLASSES}


def test_a_known_sequence_of_s3fs_calls(server: CountingMotoServer, fs: Any) -> None:
    fs.pipe_file("bench/a/one", b"x" * 1000)  # PutObject
    assert requests(server.counts()) == {"PUT": 1, "LIST": 0, "GET": 0, "DELETE": 0}
    assert server.counts()["PUT"]["bytes_in"] == 1000

    assert fs.cat_file("bench/a/one", start=10, end=110) == b"x" * 100  # ranged GetObject
    assert requests(server.counts()) == {"PUT": 1, "LIST": 0, "GET": 1, "DELETE": 0}
    assert server.counts()["GET"]["bytes_out"] == 100

    fs.pipe_file("bench/a/two", b"y" * 10)
    fs.pipe_file("bench/a/three", b"z" * 10)
    assert sorted(fs.find("bench/a")) == ["bench/a/one", "bench/a/three", "bench/a/two"]
    assert requests(server.counts()) == {"PUT": 3, "LIST": 1, "GET": 1, "DELETE": 0}

    fs.rm_file("bench/a/one")  # DeleteObject
    fs.rm(["bench/a/two", "bench/a/three"])  # DeleteObjects: POST ?delete
    assert requests(server.counts()) == {"PUT": 3, "LIST": 1, "GET": 1, "DELETE": 2}

    # Multipart: CreateMultipartUpload + 3 UploadPart + CompleteMultipartUpload, all PUT class.
    data = b"m" * (11 * MiB)
    fs.pipe_file("bench/big", data, chunksize=5 * MiB)
    counts = server.counts()
    assert requests(counts) == {"PUT": 8, "LIST": 1, "GET": 1, "DELETE": 2}
    assert counts["PUT"]["bytes_in"] >= 1000 + 20 + len(data)
    # A whole-object read: s3fs asks the size first (HeadObject), then one GetObject.
    assert fs.cat_file("bench/big") == data
    assert requests(server.counts())["GET"] == 3
    assert server.counts()["GET"]["bytes_out"] == 100 + len(data)

    # The HTTP view agrees with the in-process one, and a reset returns the old counts.
    # Every request named the bucket and was signed with the one key: their counts are the total.
    assert fetch_counts(server.endpoint) == {
        "total": server.counts(),
        "buckets": {"bench": server.counts()},
        "access_keys": {"testing": server.counts()},
    }
    old = reset_counts(server.endpoint)
    assert requests(old["total"]) == {"PUT": 8, "LIST": 1, "GET": 3, "DELETE": 2}
    assert requests(fetch_counts(server.endpoint)["total"]) == dict.fromkeys(CLASSES, 0)
    assert fetch_counts(server.endpoint)["buckets"] == {}
    assert cost_usd(old["total"]) == pytest.approx((8 + 1) * 0.005 / 1000 + 3 * 0.0004 / 1000)


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("PUT", "/b/k", "", "PUT"),  # PutObject / CopyObject
        ("PUT", "/b/k", "partNumber=1&uploadId=u", "PUT"),  # UploadPart
        ("PUT", "/b", "", "PUT"),  # CreateBucket
        ("POST", "/b/k", "uploads=", "PUT"),  # CreateMultipartUpload
        ("POST", "/b/k", "uploadId=u", "PUT"),  # CompleteMultipartUpload
        ("POST", "/b", "delete=", "DELETE"),  # DeleteObjects
        ("GET", "/b", "list-type=2&prefix=a%2F", "LIST"),  # ListObjectsV2
        ("GET", "/b", "", "LIST"),  # ListObjects
        ("GET", "/b", "prefix=a&delimiter=%2F", "LIST"),
        ("GET", "/b", "uploads=", "LIST"),  # ListMultipartUploads
        ("GET", "/", "", "LIST"),  # ListBuckets
        ("GET", "/b/k", "uploadId=u", "LIST"),  # ListParts
        ("GET", "/b", "location=", "GET"),  # GetBucketLocation: "other requests"
        ("GET", "/b/k", "", "GET"),
        ("HEAD", "/b/k", "", "GET"),
        ("HEAD", "/b", "", "GET"),
        ("DELETE", "/b/k", "", "DELETE"),
        ("DELETE", "/b/k", "uploadId=u", "DELETE"),  # AbortMultipartUpload
        ("POST", "/moto-api/reset", "", None),  # moto's own API: not counted
    ],
)
def test_classification(method: str, path: str, query: str, expected: str | None) -> None:
    assert classify(method, path, query) == expected
