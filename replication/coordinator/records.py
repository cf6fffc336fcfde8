"""The JSON values the coordinators keep on their internal topics (``__transaction_state``,
``__consumer_offsets``): each carries a ``format_version``, so a newer replog can read an
older one and an older replog refuses a newer one instead of misreading it."""

from __future__ import annotations

import json
from typing import Any

from logstore.errors import CorruptRecordError, KafkaStorageError

__all__ = ["versioned_json"]


def versioned_json(value: bytes, where: str, kind: str, version: int) -> dict[str, Any]:
    """The JSON object of a ``kind`` record at ``where``: CorruptRecordError if it is not
    one, KafkaStorageError if a newer replog wrote it (no ``format_version`` reads as 1)."""
    try:
        doc = json.loads(value)
    except ValueError as err:
        raise CorruptRecordError(f"{where}: {kind} record is not JSON ({err})") from err
    if not isinstance(doc, dict):
        raise CorruptRecordError(f"{where}: {kind} record is not a JSON object")
    found = doc.get("format_version", 0)
    if found not in (0, version):
        raise KafkaStorageError(
            f"{where}: {kind} record format_version {found!r} is newer than this replog reads "
            f"({version}); upgrade replog on this broker"
        )
    return doc
