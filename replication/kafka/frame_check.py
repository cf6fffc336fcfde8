"""A pass over a Kafka request's bytes before kio decodes them: every length and count must
fit in the bytes that are left, and a field Kafka declares not nullable must not be null.

kio's native reader reserves memory for an array's count before it reads the elements, so a
20-byte frame claiming 2^35 elements aborts the process on the failed allocation; and it
reads null where Kafka's schema forbids it, which handlers do not expect. Kafka's own parser
refuses both (it checks sizes against the buffer and nullability per field). This pass does
the same on kio's schema classes, in Python, without building anything: it costs a walk over
the fields (records are skipped as one length), and a frame it accepts has sane lengths
everywhere, so kio can only fail on it by raising.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
import typing
from dataclasses import dataclass
from types import NoneType, UnionType
from typing import Any, Final

from replication.errors import CorruptFrameError

__all__ = ["check_request"]

_FIXED: Final = {
    "int8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "float64": 8,
    "uuid": 16,
}
_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")
#: request header: api key, api version, correlation id
_HEADER_FIXED: Final = 8


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    #: "fixed", "string", "bytes" or "entity"
    kind: str
    size: int
    array: bool
    nullable: bool
    entity: type | None


def _unwrap(hint: Any) -> tuple[Any, bool]:
    if isinstance(hint, UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not NoneType]
        return args[0], True
    return hint, False


@functools.cache
def _fields(cls: type) -> tuple[_Field, ...]:
    """The untagged fields of a kio entity class, in wire order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if "tag" in f.metadata:
            continue  # in the tagged-fields section, skipped by its size
        inner, nullable = _unwrap(hints[f.name])
        array = typing.get_origin(inner) is tuple
        element = _unwrap(typing.get_args(inner)[0])[0] if array else inner
        if isinstance(element, type) and dataclasses.is_dataclass(element):
            out.append(_Field(f.name, "entity", 0, array, nullable, element))
            continue
        kafka_type = f.metadata["kafka_type"]
        if kafka_type in _FIXED:
            out.append(_Field(f.name, "fixed", _FIXED[kafka_type], array, nullable, None))
        elif kafka_type == "string":
            out.append(_Field(f.name, "string", 0, array, nullable, None))
        else:  # bytes, records
            out.append(_Field(f.name, "bytes", 0, array, nullable, None))
    return tuple(out)


class _Scan:
    def __init__(self, frame: bytes, pos: int, flexible: bool, what: str) -> None:
        self.buf = frame
        self.pos = pos
        self.flexible = flexible
        self.what = what

    def fail(self, problem: str) -> CorruptFrameError:
        return CorruptFrameError(f"malformed {self.what}: {problem} (at byte {self.pos})")

    def skip(self, n: int, field: str) -> None:
        if n > len(self.buf) - self.pos:
            raise self.fail(
                f"{field} needs {n} bytes, {len(self.buf) - self.pos} are left in the frame"
            )
        self.pos += n

    def uvarint(self, field: str) -> int:
        value = shift = 0
        for _ in range(5):
            if self.pos >= len(self.buf):
                raise self.fail(f"the frame ends inside {field}")
            byte = self.buf[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        raise self.fail(f"{field} is a varint longer than 5 bytes")

    def length(self, field: str, wide: bool) -> int | None:
        """A length or count: None for null."""
        if self.flexible:
            value = self.uvarint(field)
            return None if value == 0 else value - 1
        packer = _I32 if wide else _I16
        self.skip(packer.size, field)
        (value,) = packer.unpack_from(self.buf, self.pos - packer.size)
        if value < -1:
            raise self.fail(f"{field} has length {value}")
        return None if value == -1 else int(value)

    def tagged_fields(self, field: str) -> None:
        if not self.flexible:
            return
        for _ in range(self.uvarint(f"{field}'s tagged field count")):
            self.uvarint(f"a tagged field's tag in {field}")
            self.skip(
                self.uvarint(f"a tagged field's size in {field}"), f"a tagged field of {field}"
            )

    def value(self, f: _Field, nullable: bool) -> None:
        if f.kind == "fixed":
            self.skip(f.size, f.name)
        elif f.kind == "entity":
            assert f.entity is not None
            self.entity(f.entity)
        else:
            n = self.length(f.name, wide=f.kind == "bytes")
            if n is None:
                if not nullable:
                    raise self.fail(f"{f.name} is null, which it may not be")
                return
            self.skip(n, f.name)

    def entity(self, cls: type) -> None:
        for f in _fields(cls):
            if not f.array:
                self.value(f, f.nullable)
                continue
            count = self.length(f.name, wide=True)
            if count is None:
                if not f.nullable:
                    raise self.fail(f"array {f.name} is null, which it may not be")
                continue
            left = len(self.buf) - self.pos
            if count > left:  # every element takes at least one byte
                raise self.fail(f"array {f.name} claims {count} elements in {left} bytes")
            if f.kind == "fixed":
                self.skip(count * f.size, f.name)
            else:
                for _ in range(count):
                    self.value(f, False)
        self.tagged_fields(cls.__name__)


def check_request(cls: Any, frame: bytes, what: str) -> None:
    """Raise CorruptFrameError unless ``frame`` (header and body) of the request class ``cls``
    has every length within the frame and no null where Kafka allows none."""
    flexible = bool(cls.__flexible__)
    scan = _Scan(frame, _HEADER_FIXED, False, what)
    client_id = scan.length("client_id", wide=False)  # a classic string, also in header v2
    scan.skip(client_id or 0, "client_id")
    scan.flexible = flexible
    scan.tagged_fields("the request header")
    scan.entity(cls)
