"""The partition log on S3 over HTTP (moto): the ``s3`` tier of tests/test_log.py."""

from __future__ import annotations

import pytest

from logstore.log import Log
from logstore.storage import Storage
from tests.conftest import S3Location
from tests.readback import log_values as values
from tests.test_log import batch_of

pytestmark = pytest.mark.s3


def test_log_on_s3(s3_url: S3Location) -> None:
    storage = Storage.from_url(s3_url.url, **s3_url.storage_options).child("topic/0")
    log = Log.open(storage)
    for i in range(3):
        log.append(batch_of(f"v{i}".encode()), leader_epoch=0)
        log.flush()
    log.merge_segments()
    log.close()
    assert values(Log.open(storage)) == [(i, f"v{i}".encode()) for i in range(3)]
