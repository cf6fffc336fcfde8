"""Frozen configuration objects parsed once, with Kafka's key names.

A config class is a frozen dataclass whose fields carry their Kafka key in
``field(metadata={"key": "segment.bytes"})``. :func:`parse` takes a mapping of Kafka keys to
values (strings from a command line or TOML values), refuses unknown keys and bad values with a
:class:`ConfigError` naming the key, and converts each value to the field's type.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints

from logstore.errors import ConfigError

C = TypeVar("C")


def key(
    name: str,
    doc: str = "",
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    secret: bool = False,
    choices: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Field metadata: the Kafka key name, a one-line description, optional lower and upper
    bounds, whether the value is a secret (a password: never printed; give the field
    repr=False), and the values a string key may take (any, when empty)."""
    return {
        "key": name,
        "doc": doc,
        "minimum": minimum,
        "maximum": maximum,
        "secret": secret,
        "choices": choices,
    }


def keys_of(cls: type[Any]) -> dict[str, dataclasses.Field[Any]]:
    """Kafka key -> dataclass field for a config class."""
    return {f.metadata["key"]: f for f in dataclasses.fields(cls) if "key" in f.metadata}


def _convert(name: str, typ: Any, value: Any) -> Any:
    if typ is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "1", "yes"):
            return True
        if text in ("false", "0", "no"):
            return False
        raise ConfigError(f"config {name}={value!r}: expected true or false")
    if typ is int:
        if isinstance(value, bool):
            raise ConfigError(f"config {name}={value!r}: expected an integer")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"config {name}={value!r}: expected an integer") from None
    if typ is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"config {name}={value!r}: expected a number") from None
    if typ is str:
        return str(value)
    if typ == (str | None):
        return None if value is None else str(value)
    return value


def parse(cls: type[C], values: Mapping[str, Any], *, ignore: frozenset[str] = frozenset()) -> C:
    """Build ``cls`` from Kafka-named ``values``; unknown keys and bad values are refused."""
    fields = keys_of(cls)
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        if name in ignore:
            continue
        f = fields.get(name)
        if f is None:
            allowed = ", ".join(sorted(fields))
            raise ConfigError(f"unknown config key {name!r}; known keys: {allowed}")
        try:
            converted = _convert(name, hints[f.name], value)
        except ConfigError:
            if f.metadata.get("secret"):
                raise ConfigError(f"config {name}=<redacted>: not a valid value") from None
            raise
        minimum = f.metadata.get("minimum")
        if minimum is not None and converted < minimum:
            raise ConfigError(f"config {name}={value!r}: must be at least {minimum}")
        maximum = f.metadata.get("maximum")
        if maximum is not None and converted > maximum:
            raise ConfigError(f"config {name}={value!r}: must be at most {maximum}")
        choices = f.metadata.get("choices")
        if choices and converted not in choices:
            raise ConfigError(
                f"config {name}={value!r}: expected {' or '.join(choices)} ({f.metadata['doc']})"
            )
        kwargs[f.name] = converted
    return cls(**kwargs)


def to_mapping(obj: Any) -> dict[str, Any]:
    """Kafka key -> value for a config object (the inverse of :func:`parse`)."""
    return {k: getattr(obj, f.name) for k, f in keys_of(type(obj)).items()}


@dataclass(frozen=True)
class LogConfig:
    """Per-log (per-topic) settings, with Kafka's names and defaults where they fit.

    ``segment.bytes`` bounds one segment object: group-committed objects are merged up to it.
    ``segment.ms`` bounds the time span of one segment. Retention removes whole segments.
    ``cleanup.policy`` is Kafka's: with ``compact`` alone, retention.ms and retention.bytes
    delete nothing; with ``compact,delete`` they apply as under ``delete``.
    """

    segment_bytes: int = field(
        default=64 * 1024 * 1024,
        metadata=key("segment.bytes", "max bytes of one segment", minimum=1),
    )
    segment_ms: int = field(
        default=7 * 24 * 3600 * 1000,
        metadata=key("segment.ms", "max time span of one segment", minimum=1),
    )
    retention_ms: int = field(
        default=7 * 24 * 3600 * 1000,
        metadata=key(
            "retention.ms", "delete segments older than this; -1 keeps forever", minimum=-1
        ),
    )
    retention_bytes: int = field(
        default=-1,
        metadata=key(
            "retention.bytes", "delete oldest segments above this size; -1: no limit", minimum=-1
        ),
    )
    max_message_bytes: int = field(
        default=8 * 1024 * 1024 + 12,
        metadata=key("max.message.bytes", "largest record batch accepted", minimum=64),
    )
    file_delete_delay_ms: int = field(
        default=60_000,
        metadata=key(
            "file.delete.delay.ms",
            "how long a merged-away or retained-away object stays readable before deletion",
            minimum=0,
        ),
    )
    merge_min_objects: int = field(
        default=4,
        metadata=key(
            "segment.merge.min.objects",
            "merge a run of small objects once it has this many",
            minimum=2,
        ),
    )
    tail_cache_bytes: int = field(
        default=32 * 1024 * 1024,
        metadata=key(
            "log.tail.cache.bytes", "recently written object bytes kept in memory", minimum=0
        ),
    )
    # Kafka Streams names it on every internal topic it creates (CreateTime). LogAppendTime,
    # the broker stamping each batch, is not served: a batch is stored as its producer sent it.
    message_timestamp_type: str = field(
        default="CreateTime",
        metadata=key(
            "message.timestamp.type",
            "records keep their producer's timestamps; LogAppendTime is not served",
            choices=("CreateTime",),
        ),
    )
    cleanup_policy: str = field(
        default="delete",
        metadata=key(
            "cleanup.policy",
            "delete: retention removes old segments; compact: keep the latest record per key",
            choices=("delete", "compact", "compact,delete", "delete,compact"),
        ),
    )
    delete_retention_ms: int = field(
        default=24 * 3600 * 1000,
        metadata=key(
            "delete.retention.ms",
            "how long a compacted topic keeps a tombstone after the clean that first saw it",
            minimum=0,
        ),
    )
    min_cleanable_dirty_ratio: float = field(
        default=0.5,
        metadata=key(
            "min.cleanable.dirty.ratio",
            "clean a compacted log once this share of it is uncleaned",
            minimum=0,
            maximum=1,
        ),
    )
    min_compaction_lag_ms: int = field(
        default=0,
        metadata=key(
            "min.compaction.lag.ms", "records younger than this are never compacted", minimum=0
        ),
    )
    max_compaction_lag_ms: int = field(
        default=2**63 - 1,
        metadata=key(
            "max.compaction.lag.ms",
            "records older than this are compacted whatever the dirty ratio",
            minimum=1,
        ),
    )

    @property
    def compact(self) -> bool:
        """Whether the log is compacted (cleanup.policy names compact)."""
        return "compact" in self.cleanup_policy.split(",")

    @property
    def delete(self) -> bool:
        """Whether retention.ms / retention.bytes delete old segments (policy names delete)."""
        return "delete" in self.cleanup_policy.split(",")
