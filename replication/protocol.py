"""replog's wire protocol: frames, headers, and the request/response messages of every API.

Framing (as Kafka's)::

    request  = length:int32  api_key:int16 api_version:int16 correlation_id:int32
               client_id:nullable_string  body
    response = length:int32  correlation_id:int32  body

``length`` counts the bytes after itself. All integers are big-endian.

Messages are frozen, keyword-only dataclasses declared with :func:`message`; every field names
its wire type in its metadata (``field(metadata=wire(INT32))``) and may name the first (and
last) version that carries it, like ``"versions": "1+"`` in Kafka's message JSON. One generic
codec (:func:`_codec`) turns a (class, version) into an encoder and a decoder, compiled once
and cached: consecutive fixed-width fields become one ``struct.Struct``, arrays of fixed-width
numbers are packed with one format, nested messages reuse their own compiled codec.

The encoding is Kafka's classic (non-flexible) one: int16-length strings, int32-length bytes
and arrays, -1 for null. There are no compact types and no tagged fields; a field Kafka sends
as a tagged field (Fetch's ``diverging_epoch``, ``current_leader``) is a plain field here. API
keys are Kafka's; API versions are replog's own, starting at 0: the messages carry the
semantics of Kafka's current versions (Fetch as v12+ with diverging epochs and sessions), not
Kafka's byte layout of them. Records are opaque bytes (replog record batches).

Decoding never copies bytes fields: they come back as ``memoryview`` slices of the frame
(which they keep alive). Malformed input raises :class:`CorruptFrameError` (or
:class:`UnsupportedVersionError` for an unknown API or version) naming what was wrong; counts
and lengths are checked against the bytes left before anything is allocated.

Example::

    >>> header = RequestHeader(api_key=ApiKey.API_VERSIONS, api_version=0,
    ...                        correlation_id=7, client_id="cli")
    >>> frame = encode_request(header, ApiVersionsRequest())
    >>> decode_request(frame[4:])[0].correlation_id
    7
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import operator
import struct
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Final, TypeAlias, TypeVar, dataclass_transform

from replication.errors import (
    CorruptFrameError,
    FrameTooLargeError,
    InvalidFieldError,
    InvalidFrameLengthError,
    UnsupportedVersionError,
)

#: What bytes fields accept when encoding; decoding yields memoryview slices of the frame.
Bytes: TypeAlias = bytes | bytearray | memoryview
#: Encoded pieces, joined once at the end (bytes, or 1-D memoryviews of unsigned bytes).
Parts: TypeAlias = list[bytes | bytearray | memoryview]
Encoder: TypeAlias = Callable[[Any, Parts], None]
Decoder: TypeAlias = Callable[[memoryview, int], tuple[Any, int]]

_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")
_NULL16: Final = _I16.pack(-1)
_NULL32: Final = _I32.pack(-1)
_INT16_MAX: Final = 2**15 - 1
_INT32_MAX: Final = 2**31 - 1

#: ListOffsets timestamps with a special meaning (Kafka's ListOffsetsRequest constants).
LATEST_TIMESTAMP: Final = -1
EARLIEST_TIMESTAMP: Final = -2

#: Fetch/ListOffsets isolation levels, and the replica id of a consumer (not a broker).
READ_UNCOMMITTED: Final = 0
READ_COMMITTED: Final = 1
CONSUMER_REPLICA_ID: Final = -1


# --- errors with context ------------------------------------------------------------------------


def _truncated(what: str, need: int, buf: memoryview, pos: int) -> CorruptFrameError:
    left = max(len(buf) - pos, 0)
    return CorruptFrameError(
        f"frame ends inside {what}: needs {need} bytes at offset {pos}, {left} left"
    )


def _bad_value(what: str, value: object, err: BaseException) -> InvalidFieldError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return InvalidFieldError(f"cannot encode {what} = {shown}: {err}")


# --- wire types -----------------------------------------------------------------------------------


class WireType:
    """How one field travels: a primitive, a string, bytes, an array or a nested message."""

    #: The field's struct format character if it is fixed width, else "".
    fmt: str = ""
    #: The fewest bytes any value of this type takes on the wire (guards array counts).
    min_size: int = 0

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name

    def encoder(self, version: int, what: str) -> Encoder:
        """Append the encoding of one value to ``parts``."""
        raise NotImplementedError

    def decoder(self, version: int, what: str) -> Decoder:
        """Read one value at ``pos``; return it and the position after it."""
        raise NotImplementedError

    def min_size_at(self, version: int) -> int:
        """:attr:`min_size`, for types whose size depends on the version (nested messages)."""
        return self.min_size


class Primitive(WireType):
    """A fixed-width number or bool, packed with one struct format character."""

    def __init__(self, name: str, fmt: str) -> None:
        super().__init__(name)
        self.fmt = fmt
        self.struct = struct.Struct(">" + fmt)
        self.min_size = self.struct.size

    def encoder(self, version: int, what: str) -> Encoder:
        pack = self.struct.pack

        def encode(value: Any, parts: Parts) -> None:
            try:
                parts.append(pack(value))
            except struct.error as err:
                raise _bad_value(f"{what} ({self.name})", value, err) from err

        return encode

    def decoder(self, version: int, what: str) -> Decoder:
        unpack_from = self.struct.unpack_from
        size = self.min_size

        def decode(buf: memoryview, pos: int) -> tuple[Any, int]:
            try:
                return unpack_from(buf, pos)[0], pos + size
            except struct.error as err:
                raise _truncated(f"{what} ({self.name})", size, buf, pos) from err

        return decode


class String(WireType):
    """UTF-8 text with an int16 length; -1 means null when ``nullable``."""

    min_size = 2

    def __init__(self, name: str, *, nullable: bool) -> None:
        super().__init__(name)
        self.nullable = nullable

    def encoder(self, version: int, what: str) -> Encoder:
        nullable = self.nullable
        pack = _I16.pack

        def encode(value: Any, parts: Parts) -> None:
            if value is None:
                if not nullable:
                    raise _bad_value(what, value, TypeError("this string is not nullable"))
                parts.append(_NULL16)
                return
            try:
                data = value.encode("utf-8")
            except (AttributeError, UnicodeEncodeError) as err:
                raise _bad_value(what, value, err) from err
            if len(data) > _INT16_MAX:
                raise _bad_value(what, value, ValueError(f"{len(data)} bytes > {_INT16_MAX}"))
            parts.append(pack(len(data)) + data)

        return encode

    def decoder(self, version: int, what: str) -> Decoder:
        nullable = self.nullable
        unpack_from = _I16.unpack_from

        def decode(buf: memoryview, pos: int) -> tuple[Any, int]:
            try:
                (n,) = unpack_from(buf, pos)
            except struct.error as err:
                raise _truncated(f"the length of {what}", 2, buf, pos) from err
            pos += 2
            if n < 0:
                if n == -1 and nullable:
                    return None, pos
                raise CorruptFrameError(f"{what} has invalid length {n} at offset {pos - 2}")
            end = pos + n
            if end > len(buf):
                raise _truncated(what, n, buf, pos)
            try:
                return str(buf[pos:end], "utf-8"), end
            except UnicodeDecodeError as err:
                raise CorruptFrameError(f"{what} at offset {pos} is not UTF-8: {err}") from err

        return decode


def _byte_view(value: Any) -> memoryview:
    """A 1-D unsigned-byte view of any buffer, so len() counts bytes."""
    view = memoryview(value)
    if view.ndim == 1 and view.itemsize == 1 and view.format == "B":
        return view
    try:
        return view.cast("B")
    except TypeError:  # not C-contiguous
        return memoryview(view.tobytes())


class BytesType(WireType):
    """Opaque bytes with an int32 length; -1 means null when ``nullable``.

    Decoding returns a memoryview slice of the frame (no copy).
    """

    min_size = 4

    def __init__(self, name: str, *, nullable: bool) -> None:
        super().__init__(name)
        self.nullable = nullable

    def encoder(self, version: int, what: str) -> Encoder:
        nullable = self.nullable
        pack = _I32.pack

        def encode(value: Any, parts: Parts) -> None:
            if type(value) is not bytes:
                if value is None:
                    if not nullable:
                        raise _bad_value(what, value, TypeError("these bytes are not nullable"))
                    parts.append(_NULL32)
                    return
                try:
                    value = _byte_view(value)
                except TypeError as err:
                    raise _bad_value(what, value, err) from err
            n = len(value)
            if n > _INT32_MAX:
                raise _bad_value(what, value, ValueError(f"{n} bytes > {_INT32_MAX}"))
            parts.append(pack(n))
            parts.append(value)

        return encode

    def decoder(self, version: int, what: str) -> Decoder:
        nullable = self.nullable
        unpack_from = _I32.unpack_from

        def decode(buf: memoryview, pos: int) -> tuple[Any, int]:
            try:
                (n,) = unpack_from(buf, pos)
            except struct.error as err:
                raise _truncated(f"the length of {what}", 4, buf, pos) from err
            pos += 4
            if n < 0:
                if n == -1 and nullable:
                    return None, pos
                raise CorruptFrameError(f"{what} has invalid length {n} at offset {pos - 4}")
            end = pos + n
            if end > len(buf):
                raise _truncated(what, n, buf, pos)
            return buf[pos:end], end

        return decode


class UuidType(WireType):
    """A UUID as 16 bytes (Kafka's ``uuid``), decoded to :class:`uuid.UUID`."""

    min_size = 16

    def encoder(self, version: int, what: str) -> Encoder:
        def encode(value: Any, parts: Parts) -> None:
            try:
                parts.append(value.bytes)
            except AttributeError as err:
                raise _bad_value(what, value, err) from err

        return encode

    def decoder(self, version: int, what: str) -> Decoder:
        def decode(buf: memoryview, pos: int) -> tuple[Any, int]:
            end = pos + 16
            if end > len(buf):
                raise _truncated(what, 16, buf, pos)
            return uuid.UUID(bytes=bytes(buf[pos:end])), end

        return decode


class Array(WireType):
    """A list of ``element`` with an int32 count; -1 means null when ``nullable``.

    ``element`` is a wire type or a :func:`message` class (a nested struct).
    """

    min_size = 4

    def __init__(self, element: WireType | type, *, nullable: bool = False) -> None:
        self.element = _as_wire_type(element)
        prefix = "nullable array" if nullable else "array"
        super().__init__(f"{prefix}[{self.element.name}]")
        self.nullable = nullable

    def encoder(self, version: int, what: str) -> Encoder:
        nullable = self.nullable
        pack = _I32.pack
        fmt = self.element.fmt
        if fmt:

            def encode_fixed(value: Any, parts: Parts) -> None:
                if value is None:
                    if not nullable:
                        raise _bad_value(what, value, TypeError("this array is not nullable"))
                    parts.append(_NULL32)
                    return
                try:
                    n = len(value)
                    parts.append(struct.pack(f">i{n}{fmt}", n, *value))
                except (struct.error, TypeError) as err:
                    raise _bad_value(f"{what} ({self.name})", value, err) from err

            return encode_fixed

        encode_element = self.element.encoder(version, f"{what}[]")

        def encode(value: Any, parts: Parts) -> None:
            if value is None:
                if not nullable:
                    raise _bad_value(what, value, TypeError("this array is not nullable"))
                parts.append(_NULL32)
                return
            try:
                parts.append(pack(len(value)))
            except (TypeError, struct.error) as err:
                raise _bad_value(what, value, err) from err
            for item in value:
                encode_element(item, parts)

        return encode

    def decoder(self, version: int, what: str) -> Decoder:
        nullable = self.nullable
        unpack_from = _I32.unpack_from
        element = self.element
        fmt = element.fmt
        # An element of zero bytes (an empty struct) still counts as one, so a count can never
        # ask for more elements than there are bytes left.
        min_size = max(element.min_size_at(version), 1)
        decode_element = element.decoder(version, f"{what}[]")

        def decode(buf: memoryview, pos: int) -> tuple[Any, int]:
            try:
                (n,) = unpack_from(buf, pos)
            except struct.error as err:
                raise _truncated(f"the count of {what}", 4, buf, pos) from err
            pos += 4
            if n < 0:
                if n == -1 and nullable:
                    return None, pos
                raise CorruptFrameError(f"{what} has invalid count {n} at offset {pos - 4}")
            left = len(buf) - pos
            if n * min_size > left:
                raise CorruptFrameError(
                    f"{what} claims {n} elements at offset {pos - 4}, which need at least "
                    f"{n * min_size} bytes, but only {left} are left"
                )
            if fmt:
                items = list(struct.unpack_from(f">{n}{fmt}", buf, pos))
                return items, pos + n * min_size
            items = []
            append = items.append
            for _ in range(n):
                item, pos = decode_element(buf, pos)
                append(item)
            return items, pos

        return decode


class Struct(WireType):
    """A nested :func:`message` class, encoded field by field at the enclosing version."""

    def __init__(self, cls: type) -> None:
        if not getattr(cls, "__replog_message__", False):
            raise TypeError(f"{cls.__name__} is not declared with @message")
        super().__init__(cls.__name__)
        self.cls = cls

    def min_size_at(self, version: int) -> int:
        return _codec(self.cls, version).min_size

    def encoder(self, version: int, what: str) -> Encoder:
        return _codec(self.cls, version).encode

    def decoder(self, version: int, what: str) -> Decoder:
        return _codec(self.cls, version).decode


def _as_wire_type(t: WireType | type) -> WireType:
    if isinstance(t, WireType):
        return t
    return Struct(t)


INT8: Final = Primitive("int8", "b")
INT16: Final = Primitive("int16", "h")
INT32: Final = Primitive("int32", "i")
INT64: Final = Primitive("int64", "q")
BOOL: Final = Primitive("bool", "?")
FLOAT64: Final = Primitive("float64", "d")
STRING: Final = String("string", nullable=False)
NULLABLE_STRING: Final = String("nullable string", nullable=True)
BYTES: Final = BytesType("bytes", nullable=False)
NULLABLE_BYTES: Final = BytesType("nullable bytes", nullable=True)
UUID: Final = UuidType("uuid")


# --- field declarations -----------------------------------------------------------------------

_WIRE_KEY: Final = "replog.wire"


@dataclass(frozen=True)
class FieldSpec:
    """A field's wire type and the versions that carry it (``since`` to ``until``, inclusive).

    A field absent from a version decodes to its default. Encoding a non-default value at a
    version without the field raises UnsupportedVersionError, unless ``ignorable`` (then the
    value is silently dropped, as Kafka's ``"ignorable": true``).
    """

    type: WireType
    since: int = 0
    until: int | None = None
    ignorable: bool = False

    def present_in(self, version: int) -> bool:
        return self.since <= version and (self.until is None or version <= self.until)


def wire(
    type_: WireType | type,
    *,
    since: int = 0,
    until: int | None = None,
    ignorable: bool = False,
) -> dict[str, FieldSpec]:
    """Field metadata naming the wire type: ``x: int = field(metadata=wire(INT32, since=1))``."""
    return {_WIRE_KEY: FieldSpec(_as_wire_type(type_), since, until, ignorable)}


_T = TypeVar("_T")


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(field,))
def message(cls: type[_T]) -> type[_T]:
    """Declare a wire message: a frozen, keyword-only dataclass whose fields all carry wire()."""
    dc = dataclass(frozen=True, kw_only=True)(cls)
    for f in dataclasses.fields(dc):  # type: ignore[arg-type]
        spec = f.metadata.get(_WIRE_KEY)
        if not isinstance(spec, FieldSpec):
            raise TypeError(
                f"{cls.__name__}.{f.name} has no wire type: use field(metadata=wire(...))"
            )
        has_default = (
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        )
        if (spec.since > 0 or spec.until is not None) and not has_default:
            raise TypeError(
                f"{cls.__name__}.{f.name} is absent from some versions, so it needs a default"
            )
    dc.__replog_message__ = True  # type: ignore[attr-defined]
    return dc


def wire_fields(cls: type) -> tuple[tuple[str, FieldSpec], ...]:
    """The (name, FieldSpec) of each field of a message class, in wire order."""
    return tuple((f.name, f.metadata[_WIRE_KEY]) for f in dataclasses.fields(cls))


def _field_default(cls: type, name: str) -> Any:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


# --- the codec --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Codec:
    encode: Encoder
    decode: Decoder
    min_size: int


EncodeStep: TypeAlias = Callable[[Any, Parts], None]
DecodeStep: TypeAlias = Callable[[memoryview, int, list[Any]], int]


def _run_steps(
    cls: type, names: tuple[str, ...], types: tuple[WireType, ...]
) -> tuple[EncodeStep, DecodeStep]:
    """One struct.Struct for a run of consecutive fixed-width fields."""
    st = struct.Struct(">" + "".join(t.fmt for t in types))
    size = st.size
    pack, unpack_from = st.pack, st.unpack_from
    get = operator.attrgetter(*names)
    single = len(names) == 1

    def explain_encode(obj: Any, err: BaseException) -> InvalidFieldError:
        for name, t in zip(names, types, strict=True):
            value = getattr(obj, name, None)
            try:
                struct.pack(">" + t.fmt, value)
            except struct.error as field_err:
                return _bad_value(f"{cls.__name__}.{name} ({t.name})", value, field_err)
        return _bad_value(f"{cls.__name__}", obj, err)

    def encode(obj: Any, parts: Parts) -> None:
        try:
            parts.append(pack(get(obj)) if single else pack(*get(obj)))
        except (struct.error, AttributeError) as err:
            raise explain_encode(obj, err) from err

    def explain_decode(buf: memoryview, pos: int) -> CorruptFrameError:
        for name, t in zip(names, types, strict=True):
            if pos + t.min_size > len(buf):
                return _truncated(f"{cls.__name__}.{name} ({t.name})", t.min_size, buf, pos)
            pos += t.min_size
        raise AssertionError("unreachable: struct.error with enough bytes")

    def decode(buf: memoryview, pos: int, out: list[Any]) -> int:
        try:
            out.extend(unpack_from(buf, pos))
        except struct.error as err:
            raise explain_decode(buf, pos) from err
        return pos + size

    return encode, decode


def _field_steps(
    cls: type, name: str, spec: FieldSpec, version: int
) -> tuple[EncodeStep, DecodeStep]:
    what = f"{cls.__name__}.{name}"
    encode_value = spec.type.encoder(version, what)
    decode_value = spec.type.decoder(version, what)
    get = operator.attrgetter(name)

    def encode(obj: Any, parts: Parts) -> None:
        try:
            value = get(obj)
        except AttributeError as err:
            raise _bad_value(what, obj, err) from err
        encode_value(value, parts)

    def decode(buf: memoryview, pos: int, out: list[Any]) -> int:
        value, pos = decode_value(buf, pos)
        out.append(value)
        return pos

    return encode, decode


def _absent_check(cls: type, name: str, spec: FieldSpec, version: int) -> EncodeStep:
    """Refuse to drop a non-default value of a field this version does not carry."""
    default = _field_default(cls, name)
    get = operator.attrgetter(name)
    until = "" if spec.until is None else f" to {spec.until}"

    def check(obj: Any, parts: Parts) -> None:
        value = get(obj)
        if value != default:
            raise UnsupportedVersionError(
                f"{cls.__name__}.{name} exists in versions {spec.since}{until} only; "
                f"cannot send {value!r} at version {version} (use a newer version or the "
                f"default {default!r})"
            )

    return check


_CODECS: dict[tuple[type, int], _Codec] = {}


def _codec(cls: type, version: int) -> _Codec:
    """The encoder and decoder of ``cls`` at ``version``, compiled once per pair."""
    codec = _CODECS.get((cls, version))
    if codec is None:
        codec = _CODECS[cls, version] = _compile(cls, version)
    return codec


def _compile(cls: type, version: int) -> _Codec:
    fields = wire_fields(cls)
    present = [(name, spec) for name, spec in fields if spec.present_in(version)]
    names = tuple(name for name, _ in present)
    encode_steps: list[EncodeStep] = []
    decode_steps: list[DecodeStep] = []
    run: list[tuple[str, WireType]] = []

    def flush_run() -> None:
        if run:
            enc, dec = _run_steps(cls, tuple(n for n, _ in run), tuple(t for _, t in run))
            encode_steps.append(enc)
            decode_steps.append(dec)
            run.clear()

    for name, spec in present:
        if spec.type.fmt:
            run.append((name, spec.type))
            continue
        flush_run()
        enc, dec = _field_steps(cls, name, spec, version)
        encode_steps.append(enc)
        decode_steps.append(dec)
    flush_run()
    for name, spec in fields:
        if not spec.present_in(version) and not spec.ignorable:
            encode_steps.insert(0, _absent_check(cls, name, spec, version))

    min_size = sum(spec.type.min_size_at(version) for _, spec in present)

    def encode(obj: Any, parts: Parts) -> None:
        if type(obj) is not cls:
            raise _bad_value(f"a {cls.__name__}", obj, TypeError(f"got {type(obj).__name__}"))
        for step in encode_steps:
            step(obj, parts)

    build = _builder(cls, version, names)

    def decode(buf: memoryview, pos: int) -> tuple[Any, int]:
        out: list[Any] = []
        for step in decode_steps:
            pos = step(buf, pos, out)
        return build(out), pos

    if names and all(spec.type.fmt for _, spec in present):
        fmt = ">" + "".join(spec.type.fmt for _, spec in present)
        return _Codec(encode, _fixed_decoder(fmt, build, decode_steps[0]), min_size)
    return _Codec(encode, decode, min_size)


def _builder(cls: type, version: int, names: tuple[str, ...]) -> Callable[[Sequence[Any]], Any]:
    """Make an instance from decoded values in wire order, without calling __init__.

    Filling ``__dict__`` directly is what pickle and copy do; it is three times faster than
    the frozen dataclass's __init__ (one ``object.__setattr__`` per field), which matters for
    fetch responses with thousands of partitions. The values came from the schema, so there
    is nothing for __init__ to check. Fields absent from ``version`` get their defaults.
    """
    new = object.__new__
    absent: list[tuple[str, Callable[[], Any]]] = []
    for f in dataclasses.fields(cls):
        if not f.metadata[_WIRE_KEY].present_in(version):
            if f.default_factory is not dataclasses.MISSING:
                absent.append((f.name, f.default_factory))
            else:
                absent.append((f.name, functools.partial(_identity, f.default)))

    def build(values: Sequence[Any]) -> Any:
        obj: Any = new(cls)
        attrs = obj.__dict__
        attrs.update(zip(names, values, strict=True))
        for name, make in absent:
            attrs[name] = make()
        return obj

    return build


def _identity(value: _T) -> _T:
    return value


def _fixed_decoder(fmt: str, build: Callable[[Sequence[Any]], Any], step: DecodeStep) -> Decoder:
    """A message whose fields are all fixed width: one unpack, no step loop."""
    st = struct.Struct(fmt)
    unpack_from, size = st.unpack_from, st.size

    def decode(buf: memoryview, pos: int) -> tuple[Any, int]:
        try:
            values = unpack_from(buf, pos)
        except struct.error:
            step(buf, pos, [])  # raises CorruptFrameError naming the field
            raise
        return build(values), pos + size

    return decode


def encode_message(obj: object, version: int) -> bytes:
    """The encoding of one message at ``version`` (no framing, no header)."""
    parts: Parts = []
    _codec(type(obj), version).encode(obj, parts)
    return b"".join(parts)


def decode_message(cls: type[_T], version: int, data: Bytes) -> _T:
    """Decode exactly one ``cls`` at ``version`` from ``data``; trailing bytes are an error."""
    buf = _view(data)
    obj = _decode_to_end(_codec(cls, version).decode, buf, 0, lambda: f"{cls.__name__} v{version}")
    return obj  # type: ignore[no-any-return]


def _view(data: Bytes) -> memoryview:
    try:
        return _byte_view(data)
    except TypeError as err:
        raise TypeError(f"expected bytes or a buffer, got {type(data).__name__}") from err


def _decode_to_end(decode: Decoder, buf: memoryview, pos: int, what: Callable[[], str]) -> Any:
    """Decode one value that must end exactly at the end of ``buf``.

    ``what`` names the value for error messages; it is only called on error.
    """
    try:
        value, pos = decode(buf, pos)
    except CorruptFrameError as err:
        raise CorruptFrameError(f"corrupt {what()}: {err}") from err
    except (struct.error, IndexError, ValueError, OverflowError) as err:
        # A safety net: every decoder checks its input, so this would be a bug in one.
        raise CorruptFrameError(f"corrupt {what()}: {type(err).__name__}: {err}") from err
    if pos != len(buf):
        raise CorruptFrameError(
            f"corrupt {what()}: {len(buf) - pos} trailing bytes after the body "
            f"(it ends at offset {pos} of {len(buf)})"
        )
    return value


# --- API keys -----------------------------------------------------------------------------------


class ApiKey(IntEnum):
    """Kafka's API keys, for the APIs replog speaks."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    LEADER_AND_ISR = 4
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    ALTER_PARTITION = 56
    BROKER_REGISTRATION = 62
    BROKER_HEARTBEAT = 63
    DESCRIBE_LOG_DIRS = 35
    FIND_COORDINATOR = 10
    LIST_TRANSACTIONS = 66
    ALLOCATE_PRODUCER_IDS = 67
    #: replog: commit a set of transactions as batch N of a sink, atomically (Spark sink)
    COMMIT_SINK_BATCH = 1001
    #: replog: the last batch of a sink that was committed
    DESCRIBE_SINK = 1002


# --- headers ------------------------------------------------------------------------------------


@message
class RequestHeader:
    """Kafka's request header v1 (no tagged fields)."""

    api_key: int = field(metadata=wire(INT16))
    api_version: int = field(metadata=wire(INT16))
    correlation_id: int = field(metadata=wire(INT32))
    client_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


# --- ApiVersions (18) ----------------------------------------------------------------------------


@message
class ApiVersionsRequest:
    """Which APIs and versions does the broker speak? (v1 adds the client's software.)"""

    client_software_name: str = field(default="", metadata=wire(STRING, since=1, ignorable=True))
    client_software_version: str = field(default="", metadata=wire(STRING, since=1, ignorable=True))


@message
class ApiVersionsResponseKey:
    api_key: int = field(metadata=wire(INT16))
    min_version: int = field(metadata=wire(INT16))
    max_version: int = field(metadata=wire(INT16))


@message
class ApiVersionsResponse:
    """The broker's versions. With UNSUPPORTED_VERSION it answers at v0, as Kafka does."""

    error_code: int = field(default=0, metadata=wire(INT16))
    api_keys: list[ApiVersionsResponseKey] = field(
        default_factory=list, metadata=wire(Array(ApiVersionsResponseKey))
    )
    throttle_time_ms: int = field(default=0, metadata=wire(INT32, since=1, ignorable=True))


# --- Metadata (3) -----------------------------------------------------------------------------


@message
class MetadataRequestTopic:
    name: str = field(metadata=wire(STRING))


@message
class MetadataRequest:
    """Brokers, controller and partition leaders; ``topics=None`` asks for every topic."""

    topics: list[MetadataRequestTopic] | None = field(
        default=None, metadata=wire(Array(MetadataRequestTopic, nullable=True))
    )
    allow_auto_topic_creation: bool = field(default=False, metadata=wire(BOOL, since=1))


@message
class MetadataResponseBroker:
    node_id: int = field(metadata=wire(INT32))
    host: str = field(metadata=wire(STRING))
    port: int = field(metadata=wire(INT32))
    rack: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class MetadataResponsePartition:
    error_code: int = field(default=0, metadata=wire(INT16))
    partition_index: int = field(metadata=wire(INT32))
    leader_id: int = field(metadata=wire(INT32))
    leader_epoch: int = field(default=-1, metadata=wire(INT32))
    replica_nodes: list[int] = field(default_factory=list, metadata=wire(Array(INT32)))
    isr_nodes: list[int] = field(default_factory=list, metadata=wire(Array(INT32)))
    offline_replicas: list[int] = field(default_factory=list, metadata=wire(Array(INT32)))


@message
class MetadataResponseTopic:
    error_code: int = field(default=0, metadata=wire(INT16))
    name: str = field(metadata=wire(STRING))
    is_internal: bool = field(default=False, metadata=wire(BOOL))
    partitions: list[MetadataResponsePartition] = field(
        default_factory=list, metadata=wire(Array(MetadataResponsePartition))
    )


@message
class MetadataResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    brokers: list[MetadataResponseBroker] = field(
        default_factory=list, metadata=wire(Array(MetadataResponseBroker))
    )
    cluster_id: str | None = field(
        default=None, metadata=wire(NULLABLE_STRING, since=1, ignorable=True)
    )
    controller_id: int = field(default=-1, metadata=wire(INT32))
    topics: list[MetadataResponseTopic] = field(
        default_factory=list, metadata=wire(Array(MetadataResponseTopic))
    )


# --- CreateTopics (19) ----------------------------------------------------------------------------


@message
class CreatableReplicaAssignment:
    partition_index: int = field(metadata=wire(INT32))
    broker_ids: list[int] = field(default_factory=list, metadata=wire(Array(INT32)))


@message
class CreatableTopicConfig:
    name: str = field(metadata=wire(STRING))
    value: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class CreatableTopic:
    """A topic to create; -1 partitions / replication factor take the broker's defaults."""

    name: str = field(metadata=wire(STRING))
    num_partitions: int = field(default=-1, metadata=wire(INT32))
    replication_factor: int = field(default=-1, metadata=wire(INT16))
    assignments: list[CreatableReplicaAssignment] = field(
        default_factory=list, metadata=wire(Array(CreatableReplicaAssignment))
    )
    configs: list[CreatableTopicConfig] = field(
        default_factory=list, metadata=wire(Array(CreatableTopicConfig))
    )


@message
class CreateTopicsRequest:
    topics: list[CreatableTopic] = field(default_factory=list, metadata=wire(Array(CreatableTopic)))
    timeout_ms: int = field(default=60000, metadata=wire(INT32))
    validate_only: bool = field(default=False, metadata=wire(BOOL, since=1))


@message
class CreatableTopicResult:
    name: str = field(metadata=wire(STRING))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    num_partitions: int = field(default=-1, metadata=wire(INT32))
    replication_factor: int = field(default=-1, metadata=wire(INT16))


@message
class CreateTopicsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    topics: list[CreatableTopicResult] = field(
        default_factory=list, metadata=wire(Array(CreatableTopicResult))
    )


# --- DeleteTopics (20) ----------------------------------------------------------------------------


@message
class DeleteTopicsRequest:
    topic_names: list[str] = field(default_factory=list, metadata=wire(Array(STRING)))
    timeout_ms: int = field(default=60000, metadata=wire(INT32))


@message
class DeletableTopicResult:
    name: str = field(metadata=wire(STRING))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class DeleteTopicsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    responses: list[DeletableTopicResult] = field(
        default_factory=list, metadata=wire(Array(DeletableTopicResult))
    )


# --- Produce (0) --------------------------------------------------------------------------------


@message
class ProduceRequestPartition:
    index: int = field(metadata=wire(INT32))
    records: Bytes | None = field(default=None, repr=False, metadata=wire(NULLABLE_BYTES))


@message
class ProduceRequestTopic:
    name: str = field(metadata=wire(STRING))
    partition_data: list[ProduceRequestPartition] = field(
        default_factory=list, metadata=wire(Array(ProduceRequestPartition))
    )


@message
class ProduceRequest:
    """Append record batches. acks: 0 (no response), 1 (leader), -1 (all in-sync replicas)."""

    transactional_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    acks: int = field(default=-1, metadata=wire(INT16))
    timeout_ms: int = field(default=30000, metadata=wire(INT32))
    topic_data: list[ProduceRequestTopic] = field(
        default_factory=list, metadata=wire(Array(ProduceRequestTopic))
    )


@message
class BatchIndexAndErrorMessage:
    """Which batch of the partition's records was refused, and why."""

    batch_index: int = field(metadata=wire(INT32))
    batch_index_error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class ProduceResponsePartition:
    index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    base_offset: int = field(default=-1, metadata=wire(INT64))
    log_append_time_ms: int = field(default=-1, metadata=wire(INT64))
    log_start_offset: int = field(default=-1, metadata=wire(INT64))
    record_errors: list[BatchIndexAndErrorMessage] = field(
        default_factory=list, metadata=wire(Array(BatchIndexAndErrorMessage))
    )
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class ProduceResponseTopic:
    name: str = field(metadata=wire(STRING))
    partition_responses: list[ProduceResponsePartition] = field(
        default_factory=list, metadata=wire(Array(ProduceResponsePartition))
    )


@message
class ProduceResponse:
    responses: list[ProduceResponseTopic] = field(
        default_factory=list, metadata=wire(Array(ProduceResponseTopic))
    )
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))


# --- Fetch (1) ------------------------------------------------------------------------------------


@message
class FetchRequestPartition:
    partition: int = field(metadata=wire(INT32))
    current_leader_epoch: int = field(default=-1, metadata=wire(INT32))
    fetch_offset: int = field(metadata=wire(INT64))
    last_fetched_epoch: int = field(default=-1, metadata=wire(INT32))
    log_start_offset: int = field(default=-1, metadata=wire(INT64))
    partition_max_bytes: int = field(metadata=wire(INT32))


@message
class FetchRequestTopic:
    topic: str = field(metadata=wire(STRING))
    partitions: list[FetchRequestPartition] = field(
        default_factory=list, metadata=wire(Array(FetchRequestPartition))
    )


@message
class ForgottenTopic:
    """Partitions an incremental fetch drops from its session."""

    topic: str = field(metadata=wire(STRING))
    partitions: list[int] = field(default_factory=list, metadata=wire(Array(INT32)))


@message
class FetchRequest:
    """Fetch records (a consumer has replica_id -1; a follower its broker id).

    Sessions as KIP-227: session_id 0 and session_epoch 0 open a session (full fetch);
    session_epoch -1 is a full fetch without a session; later requests name the session and
    the next epoch, and list only changed partitions (and forgotten ones).
    """

    replica_id: int = field(default=CONSUMER_REPLICA_ID, metadata=wire(INT32))
    max_wait_ms: int = field(default=500, metadata=wire(INT32))
    min_bytes: int = field(default=1, metadata=wire(INT32))
    max_bytes: int = field(default=52428800, metadata=wire(INT32))
    isolation_level: int = field(default=READ_UNCOMMITTED, metadata=wire(INT8))
    session_id: int = field(default=0, metadata=wire(INT32))
    session_epoch: int = field(default=-1, metadata=wire(INT32))
    topics: list[FetchRequestTopic] = field(
        default_factory=list, metadata=wire(Array(FetchRequestTopic))
    )
    forgotten_topics_data: list[ForgottenTopic] = field(
        default_factory=list, metadata=wire(Array(ForgottenTopic))
    )
    rack_id: str = field(default="", metadata=wire(STRING))


@message
class EpochEndOffset:
    """Where the leader's log diverges from the follower's (-1, -1: it does not)."""

    epoch: int = field(default=-1, metadata=wire(INT32))
    end_offset: int = field(default=-1, metadata=wire(INT64))


@message
class LeaderIdAndEpoch:
    """The current leader, when the fetch went to a broker that is not it (-1, -1: unknown)."""

    leader_id: int = field(default=-1, metadata=wire(INT32))
    leader_epoch: int = field(default=-1, metadata=wire(INT32))


@message
class AbortedTransaction:
    producer_id: int = field(metadata=wire(INT64))
    first_offset: int = field(metadata=wire(INT64))


_NO_DIVERGENCE: Final = EpochEndOffset()
_NO_LEADER: Final = LeaderIdAndEpoch()


@message
class FetchResponsePartition:
    partition_index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    high_watermark: int = field(default=-1, metadata=wire(INT64))
    last_stable_offset: int = field(default=-1, metadata=wire(INT64))
    log_start_offset: int = field(default=-1, metadata=wire(INT64))
    diverging_epoch: EpochEndOffset = field(
        default=_NO_DIVERGENCE, metadata=wire(Struct(EpochEndOffset))
    )
    current_leader: LeaderIdAndEpoch = field(
        default=_NO_LEADER, metadata=wire(Struct(LeaderIdAndEpoch))
    )
    aborted_transactions: list[AbortedTransaction] | None = field(
        default=None, metadata=wire(Array(AbortedTransaction, nullable=True))
    )
    preferred_read_replica: int = field(default=-1, metadata=wire(INT32))
    records: Bytes | None = field(default=None, repr=False, metadata=wire(NULLABLE_BYTES))


@message
class FetchResponseTopic:
    topic: str = field(metadata=wire(STRING))
    partitions: list[FetchResponsePartition] = field(
        default_factory=list, metadata=wire(Array(FetchResponsePartition))
    )


@message
class FetchResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    session_id: int = field(default=0, metadata=wire(INT32))
    responses: list[FetchResponseTopic] = field(
        default_factory=list, metadata=wire(Array(FetchResponseTopic))
    )


# --- ListOffsets (2) ----------------------------------------------------------------------------


@message
class ListOffsetsRequestPartition:
    """timestamp: LATEST_TIMESTAMP (-1), EARLIEST_TIMESTAMP (-2), or a time in ms."""

    partition_index: int = field(metadata=wire(INT32))
    current_leader_epoch: int = field(default=-1, metadata=wire(INT32))
    timestamp: int = field(metadata=wire(INT64))


@message
class ListOffsetsRequestTopic:
    name: str = field(metadata=wire(STRING))
    partitions: list[ListOffsetsRequestPartition] = field(
        default_factory=list, metadata=wire(Array(ListOffsetsRequestPartition))
    )


@message
class ListOffsetsRequest:
    replica_id: int = field(default=CONSUMER_REPLICA_ID, metadata=wire(INT32))
    isolation_level: int = field(default=READ_UNCOMMITTED, metadata=wire(INT8))
    topics: list[ListOffsetsRequestTopic] = field(
        default_factory=list, metadata=wire(Array(ListOffsetsRequestTopic))
    )


@message
class ListOffsetsResponsePartition:
    partition_index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    timestamp: int = field(default=-1, metadata=wire(INT64))
    offset: int = field(default=-1, metadata=wire(INT64))
    leader_epoch: int = field(default=-1, metadata=wire(INT32))


@message
class ListOffsetsResponseTopic:
    name: str = field(metadata=wire(STRING))
    partitions: list[ListOffsetsResponsePartition] = field(
        default_factory=list, metadata=wire(Array(ListOffsetsResponsePartition))
    )


@message
class ListOffsetsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    topics: list[ListOffsetsResponseTopic] = field(
        default_factory=list, metadata=wire(Array(ListOffsetsResponseTopic))
    )


# --- OffsetForLeaderEpoch (23) --------------------------------------------------------------------


@message
class OffsetForLeaderPartition:
    partition: int = field(metadata=wire(INT32))
    current_leader_epoch: int = field(default=-1, metadata=wire(INT32))
    leader_epoch: int = field(metadata=wire(INT32))


@message
class OffsetForLeaderTopic:
    topic: str = field(metadata=wire(STRING))
    partitions: list[OffsetForLeaderPartition] = field(
        default_factory=list, metadata=wire(Array(OffsetForLeaderPartition))
    )


@message
class OffsetsForLeaderEpochRequest:
    """For each partition, the end offset of ``leader_epoch`` on the leader (KIP-101/279)."""

    replica_id: int = field(default=CONSUMER_REPLICA_ID, metadata=wire(INT32))
    topics: list[OffsetForLeaderTopic] = field(
        default_factory=list, metadata=wire(Array(OffsetForLeaderTopic))
    )


@message
class OffsetForLeaderPartitionResult:
    """Kafka's ``EpochEndOffset`` of this API: the largest epoch <= the one asked, its end."""

    error_code: int = field(default=0, metadata=wire(INT16))
    partition: int = field(metadata=wire(INT32))
    leader_epoch: int = field(default=-1, metadata=wire(INT32))
    end_offset: int = field(default=-1, metadata=wire(INT64))


@message
class OffsetForLeaderTopicResult:
    topic: str = field(metadata=wire(STRING))
    partitions: list[OffsetForLeaderPartitionResult] = field(
        default_factory=list, metadata=wire(Array(OffsetForLeaderPartitionResult))
    )


@message
class OffsetsForLeaderEpochResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    topics: list[OffsetForLeaderTopicResult] = field(
        default_factory=list, metadata=wire(Array(OffsetForLeaderTopicResult))
    )


# --- transactions: InitProducerId (22), AddPartitionsToTxn (24), EndTxn (26) ----------------------


@message
class InitProducerIdRequest:
    """Get a producer id and epoch (-1/-1 for a new one; the current pair to bump the epoch)."""

    transactional_id: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    transaction_timeout_ms: int = field(default=60000, metadata=wire(INT32))
    producer_id: int = field(default=-1, metadata=wire(INT64))
    producer_epoch: int = field(default=-1, metadata=wire(INT16))


@message
class InitProducerIdResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    producer_id: int = field(default=-1, metadata=wire(INT64))
    producer_epoch: int = field(default=-1, metadata=wire(INT16))


@message
class AddPartitionsToTxnTopic:
    name: str = field(metadata=wire(STRING))
    partitions: list[int] = field(default_factory=list, metadata=wire(Array(INT32)))


@message
class AddPartitionsToTxnRequest:
    transactional_id: str = field(metadata=wire(STRING))
    producer_id: int = field(metadata=wire(INT64))
    producer_epoch: int = field(metadata=wire(INT16))
    topics: list[AddPartitionsToTxnTopic] = field(
        default_factory=list, metadata=wire(Array(AddPartitionsToTxnTopic))
    )


@message
class AddPartitionsToTxnPartitionResult:
    partition_index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))


@message
class AddPartitionsToTxnTopicResult:
    name: str = field(metadata=wire(STRING))
    results: list[AddPartitionsToTxnPartitionResult] = field(
        default_factory=list, metadata=wire(Array(AddPartitionsToTxnPartitionResult))
    )


@message
class AddPartitionsToTxnResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    results: list[AddPartitionsToTxnTopicResult] = field(
        default_factory=list, metadata=wire(Array(AddPartitionsToTxnTopicResult))
    )


@message
class EndTxnRequest:
    transactional_id: str = field(metadata=wire(STRING))
    producer_id: int = field(metadata=wire(INT64))
    producer_epoch: int = field(metadata=wire(INT16))
    committed: bool = field(metadata=wire(BOOL))


@message
class EndTxnResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))


# --- WriteTxnMarkers (27) -------------------------------------------------------------------------


@message
class WritableTxnMarkerTopic:
    name: str = field(metadata=wire(STRING))
    partition_indexes: list[int] = field(default_factory=list, metadata=wire(Array(INT32)))


@message
class WritableTxnMarker:
    """A COMMIT (transaction_result true) or ABORT marker to write for one producer."""

    producer_id: int = field(metadata=wire(INT64))
    producer_epoch: int = field(metadata=wire(INT16))
    transaction_result: bool = field(metadata=wire(BOOL))
    topics: list[WritableTxnMarkerTopic] = field(
        default_factory=list, metadata=wire(Array(WritableTxnMarkerTopic))
    )
    coordinator_epoch: int = field(metadata=wire(INT32))


@message
class WriteTxnMarkersRequest:
    markers: list[WritableTxnMarker] = field(
        default_factory=list, metadata=wire(Array(WritableTxnMarker))
    )


@message
class WritableTxnMarkerPartitionResult:
    partition_index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))


@message
class WritableTxnMarkerTopicResult:
    name: str = field(metadata=wire(STRING))
    partitions: list[WritableTxnMarkerPartitionResult] = field(
        default_factory=list, metadata=wire(Array(WritableTxnMarkerPartitionResult))
    )


@message
class WritableTxnMarkerResult:
    producer_id: int = field(metadata=wire(INT64))
    topics: list[WritableTxnMarkerTopicResult] = field(
        default_factory=list, metadata=wire(Array(WritableTxnMarkerTopicResult))
    )


@message
class WriteTxnMarkersResponse:
    markers: list[WritableTxnMarkerResult] = field(
        default_factory=list, metadata=wire(Array(WritableTxnMarkerResult))
    )


# --- controller to broker: LeaderAndIsr (4) -------------------------------------------------------


@message
class LeaderAndIsrPartitionState:
    partition_index: int = field(metadata=wire(INT32))
    controller_epoch: int = field(metadata=wire(INT32))
    leader: int = field(metadata=wire(INT32))
    leader_epoch: int = field(metadata=wire(INT32))
    isr: list[int] = field(default_factory=list, metadata=wire(Array(INT32)))
    partition_epoch: int = field(metadata=wire(INT32))
    replicas: list[int] = field(default_factory=list, metadata=wire(Array(INT32)))
    adding_replicas: list[int] = field(default_factory=list, metadata=wire(Array(INT32)))
    removing_replicas: list[int] = field(default_factory=list, metadata=wire(Array(INT32)))
    is_new: bool = field(default=False, metadata=wire(BOOL))


@message
class LeaderAndIsrTopicState:
    topic_name: str = field(metadata=wire(STRING))
    partition_states: list[LeaderAndIsrPartitionState] = field(
        default_factory=list, metadata=wire(Array(LeaderAndIsrPartitionState))
    )


@message
class LeaderAndIsrLiveLeader:
    broker_id: int = field(metadata=wire(INT32))
    host_name: str = field(metadata=wire(STRING))
    port: int = field(metadata=wire(INT32))


@message
class LeaderAndIsrRequest:
    """The controller tells a broker which partitions it leads or follows, at which epochs."""

    controller_id: int = field(metadata=wire(INT32))
    controller_epoch: int = field(metadata=wire(INT32))
    broker_epoch: int = field(default=-1, metadata=wire(INT64))
    topic_states: list[LeaderAndIsrTopicState] = field(
        default_factory=list, metadata=wire(Array(LeaderAndIsrTopicState))
    )
    live_leaders: list[LeaderAndIsrLiveLeader] = field(
        default_factory=list, metadata=wire(Array(LeaderAndIsrLiveLeader))
    )


@message
class LeaderAndIsrPartitionError:
    partition_index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))


@message
class LeaderAndIsrTopicError:
    topic_name: str = field(metadata=wire(STRING))
    partition_errors: list[LeaderAndIsrPartitionError] = field(
        default_factory=list, metadata=wire(Array(LeaderAndIsrPartitionError))
    )


@message
class LeaderAndIsrResponse:
    error_code: int = field(default=0, metadata=wire(INT16))
    topics: list[LeaderAndIsrTopicError] = field(
        default_factory=list, metadata=wire(Array(LeaderAndIsrTopicError))
    )


# --- broker to controller: AlterPartition (56) ----------------------------------------------------


@message
class AlterPartitionRequestPartition:
    partition_index: int = field(metadata=wire(INT32))
    leader_epoch: int = field(metadata=wire(INT32))
    new_isr: list[int] = field(default_factory=list, metadata=wire(Array(INT32)))
    leader_recovery_state: int = field(default=0, metadata=wire(INT8))
    partition_epoch: int = field(metadata=wire(INT32))


@message
class AlterPartitionRequestTopic:
    topic_name: str = field(metadata=wire(STRING))
    partitions: list[AlterPartitionRequestPartition] = field(
        default_factory=list, metadata=wire(Array(AlterPartitionRequestPartition))
    )


@message
class AlterPartitionRequest:
    """A leader asks the controller to commit an ISR change (checked against partition_epoch)."""

    broker_id: int = field(metadata=wire(INT32))
    broker_epoch: int = field(default=-1, metadata=wire(INT64))
    topics: list[AlterPartitionRequestTopic] = field(
        default_factory=list, metadata=wire(Array(AlterPartitionRequestTopic))
    )


@message
class AlterPartitionResponsePartition:
    partition_index: int = field(metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    leader_id: int = field(default=-1, metadata=wire(INT32))
    leader_epoch: int = field(default=-1, metadata=wire(INT32))
    isr: list[int] = field(default_factory=list, metadata=wire(Array(INT32)))
    leader_recovery_state: int = field(default=0, metadata=wire(INT8))
    partition_epoch: int = field(default=-1, metadata=wire(INT32))


@message
class AlterPartitionResponseTopic:
    topic_name: str = field(metadata=wire(STRING))
    partitions: list[AlterPartitionResponsePartition] = field(
        default_factory=list, metadata=wire(Array(AlterPartitionResponsePartition))
    )


@message
class AlterPartitionResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    topics: list[AlterPartitionResponseTopic] = field(
        default_factory=list, metadata=wire(Array(AlterPartitionResponseTopic))
    )


# --- broker lifecycle: BrokerRegistration (62), BrokerHeartbeat (63) ------------------------------


@message
class BrokerRegistrationListener:
    name: str = field(metadata=wire(STRING))
    host: str = field(metadata=wire(STRING))
    port: int = field(metadata=wire(INT32))
    security_protocol: int = field(default=0, metadata=wire(INT16))


@message
class BrokerRegistrationRequest:
    broker_id: int = field(metadata=wire(INT32))
    cluster_id: str = field(metadata=wire(STRING))
    incarnation_id: uuid.UUID = field(metadata=wire(UUID))
    listeners: list[BrokerRegistrationListener] = field(
        default_factory=list, metadata=wire(Array(BrokerRegistrationListener))
    )
    rack: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class BrokerRegistrationResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    broker_epoch: int = field(default=-1, metadata=wire(INT64))


@message
class BrokerHeartbeatRequest:
    broker_id: int = field(metadata=wire(INT32))
    broker_epoch: int = field(metadata=wire(INT64))
    current_metadata_offset: int = field(default=-1, metadata=wire(INT64))
    want_fence: bool = field(default=False, metadata=wire(BOOL))
    want_shut_down: bool = field(default=False, metadata=wire(BOOL))


@message
class BrokerHeartbeatResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    is_caught_up: bool = field(default=False, metadata=wire(BOOL))
    is_fenced: bool = field(default=True, metadata=wire(BOOL))
    should_shut_down: bool = field(default=False, metadata=wire(BOOL))
    #: replog: the newest metadata version; the broker reads it from the metadata store
    metadata_version: int = field(default=-1, metadata=wire(INT64))
    #: replog: the epoch of the controller answering (brokers ignore stale controllers)
    controller_epoch: int = field(default=-1, metadata=wire(INT32))


# --- DescribeLogDirs (35): each replica's offsets, for `replog topics describe` ------------------


@message
class DescribableLogDirTopic:
    topic: str = field(metadata=wire(STRING))
    partitions: list[int] = field(default_factory=list, metadata=wire(Array(INT32)))


@message
class DescribeLogDirsRequest:
    """The replicas this broker holds; ``topics=None`` asks for all of them."""

    topics: list[DescribableLogDirTopic] | None = field(
        default=None, metadata=wire(Array(DescribableLogDirTopic, nullable=True))
    )


@message
class DescribeLogDirsPartition:
    partition_index: int = field(metadata=wire(INT32))
    partition_size: int = field(default=0, metadata=wire(INT64))
    #: replog: how far this replica's LEO is behind its leader's (0 on the leader)
    offset_lag: int = field(default=0, metadata=wire(INT64))
    is_future_key: bool = field(default=False, metadata=wire(BOOL))
    log_start_offset: int = field(default=-1, metadata=wire(INT64))
    log_end_offset: int = field(default=-1, metadata=wire(INT64))
    durable_end_offset: int = field(default=-1, metadata=wire(INT64))
    high_watermark: int = field(default=-1, metadata=wire(INT64))
    leader_epoch: int = field(default=-1, metadata=wire(INT32))
    is_leader: bool = field(default=False, metadata=wire(BOOL))


@message
class DescribeLogDirsTopic:
    name: str = field(metadata=wire(STRING))
    partitions: list[DescribeLogDirsPartition] = field(
        default_factory=list, metadata=wire(Array(DescribeLogDirsPartition))
    )


@message
class DescribeLogDirsResult:
    error_code: int = field(default=0, metadata=wire(INT16))
    log_dir: str = field(default="", metadata=wire(STRING))
    topics: list[DescribeLogDirsTopic] = field(
        default_factory=list, metadata=wire(Array(DescribeLogDirsTopic))
    )


@message
class DescribeLogDirsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    results: list[DescribeLogDirsResult] = field(
        default_factory=list, metadata=wire(Array(DescribeLogDirsResult))
    )


# --- FindCoordinator (10), AllocateProducerIds (67) ----------------------------------------------


@message
class FindCoordinatorRequest:
    key: str = field(metadata=wire(STRING))
    #: 0: consumer group, 1: transaction (replog has transaction coordinators only)
    key_type: int = field(default=1, metadata=wire(INT8))


@message
class FindCoordinatorResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    node_id: int = field(default=-1, metadata=wire(INT32))
    host: str = field(default="", metadata=wire(STRING))
    port: int = field(default=-1, metadata=wire(INT32))


@message
class AllocateProducerIdsRequest:
    broker_id: int = field(metadata=wire(INT32))
    broker_epoch: int = field(default=-1, metadata=wire(INT64))


@message
class AllocateProducerIdsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    producer_id_start: int = field(default=-1, metadata=wire(INT64))
    producer_id_len: int = field(default=0, metadata=wire(INT32))


# --- ListTransactions (66) ------------------------------------------------------------------------


@message
class TransactionPartition:
    topic: str = field(metadata=wire(STRING))
    partition: int = field(metadata=wire(INT32))


@message
class TransactionListing:
    transactional_id: str = field(metadata=wire(STRING))
    producer_id: int = field(metadata=wire(INT64))
    producer_epoch: int = field(default=-1, metadata=wire(INT16))
    transaction_state: str = field(default="", metadata=wire(STRING))
    transaction_timeout_ms: int = field(default=0, metadata=wire(INT32))
    transaction_start_time_ms: int = field(default=-1, metadata=wire(INT64))
    partitions: list[TransactionPartition] = field(
        default_factory=list, metadata=wire(Array(TransactionPartition))
    )


@message
class ListTransactionsRequest:
    #: states to list (empty: all)
    state_filters: list[str] = field(default_factory=list, metadata=wire(Array(STRING)))


@message
class ListTransactionsResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    transactions: list[TransactionListing] = field(
        default_factory=list, metadata=wire(Array(TransactionListing))
    )


# --- replog: CommitSinkBatch (1001), DescribeSink (1002) ------------------------------------------


@message
class SinkTransaction:
    transactional_id: str = field(metadata=wire(STRING))
    producer_id: int = field(metadata=wire(INT64))
    producer_epoch: int = field(metadata=wire(INT16))


@message
class CommitSinkBatchRequest:
    """Commit these transactions as batch ``batch_id`` of sink ``sink_id`` in one atomic step,
    unless that batch of the sink is already committed: then abort them."""

    sink_id: str = field(metadata=wire(STRING))
    batch_id: int = field(metadata=wire(INT64))
    transactions: list[SinkTransaction] = field(
        default_factory=list, metadata=wire(Array(SinkTransaction))
    )
    #: abort the transactions instead (the sink's abort())
    abort: bool = field(default=False, metadata=wire(BOOL))


@message
class CommitSinkBatchResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    #: True if this call committed the batch; False if it aborted (a replay, or abort=True)
    committed: bool = field(default=False, metadata=wire(BOOL))
    last_committed_batch: int = field(default=-1, metadata=wire(INT64))


@message
class DescribeSinkRequest:
    sink_id: str = field(metadata=wire(STRING))


@message
class DescribeSinkResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    last_committed_batch: int = field(default=-1, metadata=wire(INT64))


# --- the API table ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Api:
    request: type
    response: type
    min_version: int
    max_version: int


_APIS: Final[Mapping[ApiKey, _Api]] = {
    ApiKey.PRODUCE: _Api(ProduceRequest, ProduceResponse, 0, 0),
    ApiKey.FETCH: _Api(FetchRequest, FetchResponse, 0, 0),
    ApiKey.LIST_OFFSETS: _Api(ListOffsetsRequest, ListOffsetsResponse, 0, 0),
    ApiKey.METADATA: _Api(MetadataRequest, MetadataResponse, 0, 1),
    ApiKey.LEADER_AND_ISR: _Api(LeaderAndIsrRequest, LeaderAndIsrResponse, 0, 0),
    ApiKey.API_VERSIONS: _Api(ApiVersionsRequest, ApiVersionsResponse, 0, 1),
    ApiKey.CREATE_TOPICS: _Api(CreateTopicsRequest, CreateTopicsResponse, 0, 1),
    ApiKey.DELETE_TOPICS: _Api(DeleteTopicsRequest, DeleteTopicsResponse, 0, 0),
    ApiKey.INIT_PRODUCER_ID: _Api(InitProducerIdRequest, InitProducerIdResponse, 0, 0),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: _Api(
        OffsetsForLeaderEpochRequest, OffsetsForLeaderEpochResponse, 0, 0
    ),
    ApiKey.ADD_PARTITIONS_TO_TXN: _Api(AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, 0, 0),
    ApiKey.END_TXN: _Api(EndTxnRequest, EndTxnResponse, 0, 0),
    ApiKey.WRITE_TXN_MARKERS: _Api(WriteTxnMarkersRequest, WriteTxnMarkersResponse, 0, 0),
    ApiKey.ALTER_PARTITION: _Api(AlterPartitionRequest, AlterPartitionResponse, 0, 0),
    ApiKey.BROKER_REGISTRATION: _Api(BrokerRegistrationRequest, BrokerRegistrationResponse, 0, 0),
    ApiKey.BROKER_HEARTBEAT: _Api(BrokerHeartbeatRequest, BrokerHeartbeatResponse, 0, 0),
    ApiKey.DESCRIBE_LOG_DIRS: _Api(DescribeLogDirsRequest, DescribeLogDirsResponse, 0, 0),
    ApiKey.FIND_COORDINATOR: _Api(FindCoordinatorRequest, FindCoordinatorResponse, 0, 0),
    ApiKey.LIST_TRANSACTIONS: _Api(ListTransactionsRequest, ListTransactionsResponse, 0, 0),
    ApiKey.ALLOCATE_PRODUCER_IDS: _Api(
        AllocateProducerIdsRequest, AllocateProducerIdsResponse, 0, 0
    ),
    ApiKey.COMMIT_SINK_BATCH: _Api(CommitSinkBatchRequest, CommitSinkBatchResponse, 0, 0),
    ApiKey.DESCRIBE_SINK: _Api(DescribeSinkRequest, DescribeSinkResponse, 0, 0),
}

#: The (min, max) version replog speaks for each API.
SUPPORTED_VERSIONS: Final[Mapping[ApiKey, tuple[int, int]]] = {
    key: (api.min_version, api.max_version) for key, api in _APIS.items()
}


def _api(api_key: int, version: int) -> _Api:
    try:
        key = ApiKey(api_key)
    except ValueError:
        raise UnsupportedVersionError(f"unknown API key {api_key}") from None
    api = _APIS[key]
    if not api.min_version <= version <= api.max_version:
        raise UnsupportedVersionError(
            f"{key.name} version {version} is not supported "
            f"(replog speaks versions {api.min_version} to {api.max_version})"
        )
    return api


def request_class(api_key: int, version: int) -> type:
    """The request message class of ``api_key`` at ``version`` (UnsupportedVersionError if none)."""
    return _api(api_key, version).request


def response_class(api_key: int, version: int) -> type:
    """The response message class of ``api_key`` at ``version``."""
    return _api(api_key, version).response


# --- frames ---------------------------------------------------------------------------------------

_REQUEST_HEADER_CODEC: Final = _codec(RequestHeader, 0)


def _frame(parts: Parts) -> Parts:
    """Fill in parts[0], the length prefix, from the sizes of the rest."""
    size = sum(map(len, parts))
    if size > _INT32_MAX:
        raise InvalidFieldError(f"frame of {size} bytes exceeds the int32 length limit")
    parts[0] = _I32.pack(size)
    return parts


def _encode_body(cls: type, body: object, version: int, parts: Parts) -> None:
    if type(body) is not cls:
        raise TypeError(f"expected a {cls.__name__}, got {type(body).__name__}")
    _codec(cls, version).encode(body, parts)


def encode_request(header: RequestHeader, body: object) -> bytes:
    """The frame (length prefix included) of a request."""
    api = _api(header.api_key, header.api_version)
    parts: Parts = [b""]
    _REQUEST_HEADER_CODEC.encode(header, parts)
    _encode_body(api.request, body, header.api_version, parts)
    return b"".join(_frame(parts))


def encode_response_parts(
    correlation_id: int, api_key: int, api_version: int, body: object
) -> Parts:
    """A response frame as buffers, for ``writer.writelines`` without joining (no record copy)."""
    api = _api(api_key, api_version)
    parts: Parts = [b""]
    try:
        parts.append(_I32.pack(correlation_id))
    except struct.error as err:
        raise _bad_value("correlation_id", correlation_id, err) from err
    _encode_body(api.response, body, api_version, parts)
    return _frame(parts)


def encode_response(correlation_id: int, api_key: int, api_version: int, body: object) -> bytes:
    """The frame (length prefix included) of a response."""
    return b"".join(encode_response_parts(correlation_id, api_key, api_version, body))


_REQUEST_HEADER_FIXED: Final = struct.Struct(">hhi")  # api_key, api_version, correlation_id
_CLIENT_ID_DECODER: Final = NULLABLE_STRING.decoder(0, "RequestHeader.client_id")


def decode_request_header(frame: Bytes) -> tuple[RequestHeader, int]:
    """The header of a request frame (bytes after the length prefix) and where its body starts.

    The API key and version are not checked here, so a broker can still answer an
    ApiVersions request of an unknown version (with UNSUPPORTED_VERSION at v0). A known API
    key comes back as an :class:`ApiKey`.
    """
    buf = _view(frame)
    try:
        api_key, api_version, correlation_id = _REQUEST_HEADER_FIXED.unpack_from(buf, 0)
        client_id, pos = _CLIENT_ID_DECODER(buf, 8)
    except struct.error as err:
        raise CorruptFrameError(
            f"corrupt request header: {len(buf)} bytes, too short for a request header"
        ) from err
    except CorruptFrameError as err:
        raise CorruptFrameError(f"corrupt request header: {err}") from err
    header = RequestHeader(
        api_key=ApiKey(api_key) if api_key in _APIS else api_key,
        api_version=api_version,
        correlation_id=correlation_id,
        client_id=client_id,
    )
    return header, pos


def decode_request(frame: Bytes) -> tuple[RequestHeader, Any]:
    """Decode a request frame (the bytes after the length prefix) into (header, body).

    Raises CorruptFrameError for malformed bytes and UnsupportedVersionError for an API key or
    version replog does not speak.
    """
    buf = _view(frame)
    header, pos = decode_request_header(buf)
    api = _api(header.api_key, header.api_version)

    def what() -> str:
        return (
            f"{ApiKey(header.api_key).name} request v{header.api_version} "
            f"(correlation id {header.correlation_id})"
        )

    body = _decode_to_end(_codec(api.request, header.api_version).decode, buf, pos, what)
    return header, body


def decode_response(frame: Bytes, api_key: int, api_version: int) -> tuple[int, Any]:
    """Decode a response frame (the bytes after the length prefix) into (correlation id, body).

    An ApiVersions response that does not parse at ``api_version`` is parsed at v0, since a
    broker answers an unsupported ApiVersions version at v0 (as Kafka's clients do).
    """
    buf = _view(frame)
    api = _api(api_key, api_version)
    name = ApiKey(api_key).name
    if len(buf) < 4:
        raise CorruptFrameError(
            f"corrupt {name} response v{api_version}: {len(buf)} bytes, "
            "too short for a correlation id"
        )
    (correlation_id,) = _I32.unpack_from(buf, 0)

    def what() -> str:
        return f"{name} response v{api_version} (correlation id {correlation_id})"

    try:
        body = _decode_to_end(_codec(api.response, api_version).decode, buf, 4, what)
    except CorruptFrameError:
        if api_key != ApiKey.API_VERSIONS or api_version == 0:
            raise
        body = _decode_to_end(_codec(api.response, 0).decode, buf, 4, what)
    return correlation_id, body


async def read_frame(reader: asyncio.StreamReader, max_bytes: int) -> bytes:
    """Read one frame and return the bytes after its length prefix.

    Raises InvalidFrameLengthError for a negative length and FrameTooLargeError for one over
    ``max_bytes`` (both CorruptFrameError: close the connection, since the stream cannot be
    resynchronised). At end of stream, raises asyncio.IncompleteReadError (an EOFError) from
    ``readexactly``; its ``partial`` is empty when the peer closed between frames.
    """
    prefix = await reader.readexactly(4)
    (size,) = _I32.unpack(prefix)
    if size < 0:
        raise InvalidFrameLengthError(
            f"frame length {size} is negative; the peer is not speaking the replog protocol"
        )
    if size > max_bytes:
        raise FrameTooLargeError(
            f"frame of {size} bytes exceeds the limit of {max_bytes} bytes "
            f"(prefix {prefix.hex()}, {prefix!r}); raise the limit "
            "(socket.request.max.bytes on a broker) or check that the peer speaks the replog "
            "protocol: a TLS or HTTP client looks like a huge frame"
        )
    return await reader.readexactly(size)
