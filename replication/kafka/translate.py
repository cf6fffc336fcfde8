"""Between Kafka's messages (kio entities, one class per API version) and replog's (one
version, Kafka's field names): one table-driven translation instead of a function per API
and version.

replog's messages carry the semantics of Kafka's current versions under Kafka's field names,
so a field is matched by name, with two rules for the ways kio spells Kafka's JSON: a
``foo_ms`` field of replog is kio's ``foo`` (a ``timedelta`` or a UTC ``datetime``), and
error codes are kio's ``ErrorCode``. Nested structs and arrays are translated field by field
with the class the other side declares for them. A field one side lacks takes the other
side's default, which is what makes one translation serve every version: an old version has
fewer fields, a new one more, each read or written as Kafka defines it.

What does not map by name (records, the Metadata brokers' Kafka addresses, FindCoordinator's
batched keys) is done by the handlers in :mod:`replication.kafka.apis`.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import typing
import uuid
from collections.abc import Callable, Mapping
from types import NoneType, UnionType
from typing import Any, Final, TypeVar

from kio.schema.errors import ErrorCode

from replication.protocol.codec import Array, Struct, wire_fields

__all__ = ["kafka_error", "to_kafka", "to_replog"]

_T = TypeVar("_T")
_MISSING: Final = object()
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_KNOWN_CODES: Final = frozenset(int(c.value) for c in ErrorCode)

#: Kafka's names (as kio spells them) for a replog field where Kafka's JSON renamed the field
#: for some versions: AddPartitionsToTxn v0-v3's fields became ``V3AndBelow...`` when v4 added
#: batches of transactions, OffsetCommit's generation id became ``GenerationIdOrMemberEpoch``.
_KAFKA_NAMES: Final[dict[str, tuple[str, ...]]] = {
    "generation_id": ("generation_id_or_member_epoch",),
    "transactional_id": ("v3_and_below_transactional_id",),
    "producer_id": ("v3_and_below_producer_id",),
    "producer_epoch": ("v3_and_below_producer_epoch",),
    "topics": ("v3_and_below_topics",),
    "results": ("results_by_topic_v3_and_below", "results_by_partition"),
    "error_code": ("partition_error_code",),
}
_REPLOG_NAMES: Final[dict[str, tuple[str, ...]]] = {
    kafka: (replog,) for replog, kafkas in _KAFKA_NAMES.items() for kafka in kafkas
}


def kafka_error(code: int) -> ErrorCode:
    """kio's ErrorCode for ``code``; a code Kafka does not define is UNKNOWN_SERVER_ERROR."""
    return ErrorCode(code if code in _KNOWN_CODES else -1)


# --- replog -> Kafka ---------------------------------------------------------------------------


def _ms(value: Any) -> int:
    if isinstance(value, datetime.timedelta):
        return int(value / datetime.timedelta(milliseconds=1))
    if isinstance(value, datetime.datetime):
        return int((value - _EPOCH) / datetime.timedelta(milliseconds=1))
    return int(value)


def _get(src: Any, name: str) -> Any:
    if isinstance(src, Mapping):
        return src.get(name, _MISSING)
    return getattr(src, name, _MISSING)


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """(the type inside ``X | None``, whether None is allowed)."""
    if isinstance(hint, UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not NoneType]
        return args[0], True
    return hint, False


def _is_entity(t: Any) -> bool:
    return isinstance(t, type) and dataclasses.is_dataclass(t)


_Convert = Callable[[Any], Any]


def _kafka_value(kafka_type: str | None, hint: Any) -> _Convert:
    """How to turn a replog value into the value of a kio field."""
    inner, _ = _unwrap(hint)
    if typing.get_origin(inner) is tuple:
        element = typing.get_args(inner)[0]
        if _is_entity(element):
            return lambda v: tuple(to_kafka(e, element) for e in v)
        convert = _scalar(kafka_type)
        return lambda v: tuple(convert(e) for e in v)
    if _is_entity(inner):
        return lambda v: to_kafka(v, inner)
    return _scalar(kafka_type)


def _scalar(kafka_type: str | None) -> _Convert:
    if kafka_type == "error_code":
        return lambda v: kafka_error(int(v))
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return lambda v: datetime.timedelta(milliseconds=int(v))
    if kafka_type == "datetime_i64":
        return lambda v: _EPOCH + datetime.timedelta(milliseconds=int(v))
    if kafka_type == "uuid":
        return lambda v: v if v is None or isinstance(v, uuid.UUID) else uuid.UUID(str(v))
    if kafka_type in ("bytes", "records"):
        return lambda v: v if v is None or isinstance(v, bytes) else bytes(v)
    return lambda v: v


def _zero(kafka_type: str | None, hint: Any) -> Any:
    """The value of a required kio field that replog has nothing for."""
    inner, nullable = _unwrap(hint)
    if typing.get_origin(inner) is tuple:
        return ()
    if _is_entity(inner):
        return to_kafka({}, inner)
    if nullable or kafka_type == "records":
        return None
    return {
        "error_code": ErrorCode.none,
        "timedelta_i32": datetime.timedelta(0),
        "timedelta_i64": datetime.timedelta(0),
        "datetime_i64": _EPOCH,
        "string": "",
        "bytes": b"",
        "bool": False,
        "uuid": uuid.UUID(int=0),
        "float64": 0.0,
    }.get(kafka_type or "", 0)


@dataclasses.dataclass(frozen=True, slots=True)
class _KafkaField:
    name: str
    sources: tuple[str, ...]
    convert: _Convert
    required: bool
    zero: Callable[[], Any]


@functools.cache
def _kafka_plan(cls: type) -> tuple[_KafkaField, ...]:
    hints = typing.get_type_hints(cls)
    plan = []
    for f in dataclasses.fields(cls):
        kafka_type = f.metadata.get("kafka_type")
        sources: tuple[str, ...] = (f.name,)
        if str(kafka_type).startswith(("time", "date")):
            sources = (f.name + "_ms", f.name)
        sources += _REPLOG_NAMES.get(f.name, ())
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        hint = hints[f.name]
        plan.append(
            _KafkaField(
                f.name,
                sources,
                _kafka_value(kafka_type, hint),
                required,
                functools.partial(_zero, kafka_type, hint),
            )
        )
    return tuple(plan)


def to_kafka(src: Any, cls: type[_T]) -> _T:
    """The kio entity ``cls`` (a message at one version) holding what ``src`` says.

    ``src`` is a replog message or a mapping of field names (for what a handler builds
    itself). Fields ``src`` lacks get ``cls``'s default, or a zero value if it has none.
    """
    values: dict[str, Any] = {}
    for f in _kafka_plan(cls):  # type: ignore[arg-type]
        for source in f.sources:
            value = _get(src, source)
            if value is not _MISSING:
                break
        if value is _MISSING:
            if f.required:
                values[f.name] = f.zero()
            continue
        values[f.name] = None if value is None else f.convert(value)
    return cls(**values)


# --- Kafka -> replog ---------------------------------------------------------------------------


def _replog_value(wire_type: Any) -> _Convert:
    if isinstance(wire_type, Array):
        element = wire_type.element
        if isinstance(element, Struct):
            target = element.cls
            return lambda v: [to_replog(e, target) for e in v]
        return lambda v: [_plain(e) for e in v]
    if isinstance(wire_type, Struct):
        target = wire_type.cls
        return lambda v: to_replog(v, target)
    return _plain


def _plain(value: Any) -> Any:
    if isinstance(value, ErrorCode):
        return int(value.value)
    if isinstance(value, datetime.timedelta | datetime.datetime):
        return _ms(value)
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class _ReplogField:
    name: str
    sources: tuple[str, ...]
    convert: _Convert


@functools.cache
def _replog_plan(cls: type) -> tuple[_ReplogField, ...]:
    plan = []
    for name, spec in wire_fields(cls):
        sources: tuple[str, ...] = (name,)
        if name.endswith("_ms"):
            sources = (name, name.removesuffix("_ms"))
        sources += _KAFKA_NAMES.get(name, ())
        plan.append(_ReplogField(name, sources, _replog_value(spec.type)))
    return tuple(plan)


def to_replog(src: Any, cls: type[_T]) -> _T:
    """The replog message ``cls`` holding what the kio entity ``src`` says; fields the
    entity's version lacks keep ``cls``'s defaults."""
    values: dict[str, Any] = {}
    for f in _replog_plan(cls):  # type: ignore[arg-type]
        for source in f.sources:
            value = _get(src, source)
            if value is not _MISSING:
                break
        if value is _MISSING:
            continue
        values[f.name] = None if value is None else f.convert(value)
    return cls(**values)
