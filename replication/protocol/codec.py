"""The codec of replog's wire protocol: wire types, message declarations, and one generic
encoder/decoder per (message class, version), compiled once and cached.

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
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import struct
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias, TypeVar, dataclass_transform

from replication.errors import CorruptFrameError, InvalidFieldError, UnsupportedVersionError

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


def _sized_decoder(what: str, prefix: struct.Struct, *, nullable: bool, text: bool) -> Decoder:
    """The decoder of a length-prefixed value (``prefix``: int16 for strings, int32 for bytes;
    -1 is null when ``nullable``): UTF-8 text when ``text``, else a memoryview slice."""
    unpack_from = prefix.unpack_from
    width = prefix.size

    def decode(buf: memoryview, pos: int) -> tuple[Any, int]:
        try:
            (n,) = unpack_from(buf, pos)
        except struct.error as err:
            raise _truncated(f"the length of {what}", width, buf, pos) from err
        pos += width
        if n < 0:
            if n == -1 and nullable:
                return None, pos
            raise CorruptFrameError(f"{what} has invalid length {n} at offset {pos - width}")
        end = pos + n
        if end > len(buf):
            raise _truncated(what, n, buf, pos)
        if not text:
            return buf[pos:end], end
        try:
            return str(buf[pos:end], "utf-8"), end
        except UnicodeDecodeError as err:
            raise CorruptFrameError(f"{what} at offset {pos} is not UTF-8: {err}") from err

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
        return _sized_decoder(what, _I16, nullable=self.nullable, text=True)


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
        return _sized_decoder(what, _I32, nullable=self.nullable, text=False)


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


def array_field(of: WireType | type) -> Any:
    """An array field defaulting to empty: ``xs: list[X] = array_field(X)``, short for
    ``field(default_factory=list, metadata=wire(Array(X)))``."""
    return field(default_factory=list, metadata=wire(Array(of)))


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
