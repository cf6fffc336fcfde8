"""Shared fixtures: a real S3 endpoint over HTTP (moto's server on 127.0.0.1).

``s3_endpoint`` (session) starts one ``ThreadedMotoServer`` on a free port and sets dummy AWS
credentials in the environment, so broker subprocesses inherit them. ``s3_url`` (function)
resets moto and creates a fresh bucket, and returns an :class:`S3Location`::

    @pytest.mark.s3
    def test_something(s3_url: S3Location) -> None:
        storage = Storage.from_url(s3_url.url, **s3_url.storage_options)

Both are plain fixtures, usable from any test module; mark S3 tests ``pytest.mark.s3``.

Every test carries at least one tier marker (:data:`TIERS`, declared in pyproject.toml), so
each tier runs alone (``-m unit``) and no test falls between them: collection fails, naming
the test, when one has none (:func:`pytest_collection_modifyitems`).
"""

from __future__ import annotations

import logging
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from logstore.storage import Storage

#: The tier markers (pyproject.toml's ``markers``): every test carries at least one.
TIERS = ("unit", "s3", "cluster", "spark", "chaos", "docker")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects anything
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Fail collection when a test carries none of the tier markers; put every test in an
    xdist group (see :func:`xdist_group`), the Spark group's first."""
    untiered = [item.nodeid for item in items if not any(item.get_closest_marker(t) for t in TIERS)]
    spark_modules = {module(item) for item in items if "spark" in getattr(item, "fixturenames", ())}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group(item, spark_modules)))
    # the Spark group is the longest unit of work (one worker runs all of it): first, so the
    # other worker runs everything else meanwhile instead of waiting for it at the end
    items.sort(key=lambda item: module(item) not in spark_modules)
    if untiered:
        shown = "\n  ".join(untiered[:20])
        more = f"\n  ... and {len(untiered) - 20} more" if len(untiered) > 20 else ""
        raise pytest.UsageError(
            f"{len(untiered)} test(s) carry no tier marker (one of {', '.join(TIERS)}); mark the"
            f" module (pytestmark = pytest.mark.unit), the class or the test:\n  {shown}{more}"
        )


def module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def xdist_group(item: pytest.Item, spark_modules: set[str]) -> str:
    """The pytest-xdist worker group of a test (pyproject.toml runs ``-n 2 --dist loadgroup``):
    every module with a test on the run's SparkSession (the ``spark`` fixture) in one group, so
    the run starts one (it is slow to start and holds a JVM), and every other test with the
    rest of its module, so a module-scoped fixture (a shared broker or cluster) starts once.
    Spark tests that start their own Spark in a subprocess (the examples, the demo) are not in
    that group: the other worker may run them while this one runs the session's tests."""
    if module(item) in spark_modules:
        return "spark"
    return module(item)


@dataclass(frozen=True)
class S3Location:
    """A fresh, empty bucket on the test S3 endpoint."""

    #: ``s3://<bucket>/root``: the root URL to hand to ``Storage.from_url``.
    url: str
    #: fsspec/s3fs options reaching the endpoint: ``Storage.from_url(url, **storage_options)``.
    storage_options: Mapping[str, Any] = field(repr=False)
    #: The bucket's name.
    bucket: str
    #: ``http://127.0.0.1:<port>``.
    endpoint_url: str

    def sub(self, name: str) -> str:
        """Another root URL in the same bucket, e.g. one per broker: ``s3://<bucket>/<name>``."""
        return f"s3://{self.bucket}/{name}"


_DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    # Never read the developer's ~/.aws, never ask an EC2 metadata service.
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture(scope="module", autouse=True)
def _memory_store_per_module() -> Iterator[None]:
    """Each test module's in-memory objects go when it ends.

    fsspec's memory filesystem is one dict per process, and listing it (``find``) scans every
    key in it: objects that earlier modules left behind made the in-memory tests that come
    later on the same xdist worker many times slower (the replication model: 18 s alone, 405 s
    after 1,180 other tests; 50,000 leftover keys are enough to make it take over 10 min)."""
    from fsspec.implementations.memory import MemoryFileSystem

    from logstore.storage import _MEMORY_LOCK

    keys, dirs = set(MemoryFileSystem.store), set(MemoryFileSystem.pseudo_dirs)
    yield
    with _MEMORY_LOCK:
        for key in [k for k in MemoryFileSystem.store if k not in keys]:
            del MemoryFileSystem.store[key]
        MemoryFileSystem.pseudo_dirs[:] = [d for d in MemoryFileSystem.pseudo_dirs if d in dirs]


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The URL of a moto S3 server on 127.0.0.1, for the whole session."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request
    with pytest.MonkeyPatch.context() as mp:
        for name, value in _DUMMY_AWS_ENV.items():
            mp.setenv(name, value)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


@pytest.fixture(scope="session")
def _s3_admin(s3_endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")


@pytest.fixture
def s3_url(s3_endpoint: str, _s3_admin: Any) -> S3Location:
    """A fresh bucket on an empty moto (reset before each test); see :class:`S3Location`."""
    request = urllib.request.Request(f"{s3_endpoint}/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()
    bucket = f"replog-{uuid.uuid4().hex[:12]}"
    _s3_admin.create_bucket(Bucket=bucket)
    options = {"endpoint_url": s3_endpoint, "key": "testing", "secret": "testing"}
    return S3Location(f"s3://{bucket}/root", options, bucket, s3_endpoint)


# Real broker processes (tests/cluster.py): `broker` (module-shared) and `broker_factory`.
from tests.cluster import broker, broker_factory, cluster_factory  # noqa: E402, F401
from tests.spark_session import spark  # noqa: E402, F401

#: the storage kinds a test of a broker root runs on: memory and local files (unit tier), moto's
#: S3 server (s3 tier); see :func:`open_broker_root`
BROKER_ROOT_KINDS = [
    pytest.param("memory", marks=pytest.mark.unit),
    pytest.param("local", marks=pytest.mark.unit),
    pytest.param("s3", marks=pytest.mark.s3),
]


def memory_broker_root(prefix: str) -> Storage:
    """A fresh broker root in memory (a unique bucket named after ``prefix``)."""
    return Storage.from_url(f"memory://{prefix}-{uuid.uuid4().hex}/broker-0")


def open_broker_root(
    request: pytest.FixtureRequest, tmp_path: Path, prefix: str
) -> Iterator[Storage]:
    """A broker root of the kind ``request.param`` names (one of BROKER_ROOT_KINDS), for a
    fixture parametrized over them."""
    if request.param == "memory":
        yield memory_broker_root(prefix)
    elif request.param == "local":
        yield Storage.from_url(str(tmp_path / "broker-0"))
    else:
        s3: S3Location = request.getfixturevalue("s3_url")
        with Storage.from_url(s3.url, **s3.storage_options) as storage:
            yield storage
