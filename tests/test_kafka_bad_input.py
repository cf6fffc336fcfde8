"""The Kafka listener under bad input: a fuzz of Kafka-protocol frames of every API and version
it serves, and the cases named on their own.

The contract (replication/server/socket_server.py): a malformed frame, an API or version not
served, or a frame over ``socket.request.max.bytes`` closes that one connection (ApiVersions at
an unknown version gets UNSUPPORTED_VERSION at v0 instead, as Kafka answers); a valid request
is answered with its correlation id, or closes its own connection; the broker lives on and
every other connection keeps being served. Every test speaks raw frames to a real broker
process, one shared by the module (kio's schemas write the requests and read the answers), so
no client library hides what the broker does.

The fuzz: for each (API, version) in ``SERVED_VERSIONS``, hypothesis draws valid requests of
kio's request class (fields that would only make the broker wait, such as Fetch's max wait, are
kept short) and mutates each: truncations, bit flips, length prefixes that lie, random bytes
after a valid header, an API or version not served, trailing bytes, garbage. Each frame goes on
a fresh connection, followed by an ApiVersions "sentinel" and the end of the stream. What the
broker must answer is worked out from the bytes sent, frame by frame as the listener reads them
(:func:`expected_answers`): the answers must be exactly those, in order, each with its
correlation id and readable as its version's response, up to where the connection closes; a
long-lived bystander connection must answer ApiVersions after every frame; the broker must log
no handler crash. REPLOG_FUZZ_SEED and REPLOG_KAFKA_FUZZ_EXAMPLES vary and lengthen a run.

What the fuzz found is pinned down by the last tests of the module, one minimal case each.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import itertools
import os
import socket
import struct
import sys
import types
import typing
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_request_schema
from kio.schema.types import GroupId, TopicName, TransactionalId
from kio.serial import entity_reader, entity_writer

from replication.errors import CorruptFrameError, UnsupportedVersionError
from replication.kafka.wire import SERVED_VERSIONS, decode_request, response_class
from replication.protocol.api import ApiKey
from tests.cluster import BrokerProcess
from tests.helpers import unique_name, wait_until

pytestmark = pytest.mark.cluster

NONE = 0
CORRUPT_MESSAGE = 2
UNSUPPORTED_VERSION = 35

#: socket.request.max.bytes of the broker under test: small, so a frame over it is cheap to send
MAX_REQUEST_BYTES: Final = 1 << 16
#: how long one exchange may go without a byte from the broker before it counts as a hang
READ_TIMEOUT_S: Final = 10.0
#: REPLOG_FUZZ_SEED=<int> varies a run (the default is fixed: every run sends the same frames)
FUZZ_SEED: Final = int(os.environ.get("REPLOG_FUZZ_SEED", "0x4BAFCA"), 0)
#: hypothesis examples per (API, version) (REPLOG_KAFKA_FUZZ_EXAMPLES=<n> for a longer run);
#: each sends one valid frame and MUTATIONS mutants of it
EXAMPLES_PER_VERSION: Final = int(os.environ.get("REPLOG_KAFKA_FUZZ_EXAMPLES", "3"))
MUTATIONS: Final = 4
#: topics, groups and transactional ids the drawn requests name (besides random text)
FUZZ_TOPIC: Final = "fz-data"
FUZZ_NAMES: Final = (FUZZ_TOPIC, "fz-other")
FUZZ_GROUP: Final = "fz-group"
FUZZ_TXN: Final = "fz-txn"
SENTINEL_ID: Final = 0x5E5E_5E5E
#: APIs this listener does not serve (inter-broker, KRaft, newer ones) and keys Kafka has not
NOT_SERVED: Final = (4, 5, 6, 7, 17, 52, 57, 68, 1000, 32767, -1, -32768)

_I32 = struct.Struct(">i")
_PAIRS: Final[list[tuple[int, int]]] = [
    (int(api_key), version)
    for api_key, (low, high) in SERVED_VERSIONS.items()
    for version in range(low, high + 1)
]


# --- Kafka frames with kio --------------------------------------------------------------------


def request_class(api_key: int, version: int) -> Any:
    """kio's request class of an API version (typed loosely: its fields differ per class)."""
    return load_request_schema(api_key, version)


def schema_module(cls: type) -> Any:
    """The module of a kio class, where the classes of its nested entities are."""
    return sys.modules[cls.__module__]


def encode_request(body: Any, correlation_id: int, client_id: str | None = "bad-input") -> bytes:
    """The frame (length prefix included) of a kio request entity."""
    cls = type(body)
    header_cls: Any = cls.__header_schema__
    out = io.BytesIO()
    entity_writer(header_cls)(
        out,
        header_cls(
            request_api_key=cls.__api_key__,
            request_api_version=cls.__version__,
            correlation_id=correlation_id,
            client_id=client_id,
        ),
    )
    entity_writer(cls)(out, body)
    data = out.getvalue()
    return _I32.pack(len(data)) + data


def header_size(api_key: int, version: int, client_id: str | None) -> int:
    """Bytes of a request header (after the length prefix)."""
    cls: Any = request_class(api_key, version).__header_schema__
    out = io.BytesIO()
    entity_writer(cls)(
        out,
        cls(
            request_api_key=api_key,
            request_api_version=version,
            correlation_id=0,
            client_id=client_id,
        ),
    )
    return len(out.getvalue())


def decode_response(frame: bytes, api_key: int, version: int) -> tuple[int, Any]:
    """(correlation id, body) of a response frame (without its length prefix); the whole frame
    must be one response of that version, nothing missing and nothing after it."""
    cls: Any = response_class(api_key, version)  # the listener's reader (kafka/schemas.py)
    header, offset = entity_reader(cls.__header_schema__)(frame, 0)
    body, size = entity_reader(cls)(frame, offset)  # kio's readers return the bytes they read
    rest = len(frame) - offset - size
    assert rest == 0, f"{rest} bytes after a {cls.__name__} v{version}"
    return header.correlation_id, body


def read_request(frame: bytes) -> Any:
    """The body of a request frame (without its length prefix), read with kio's readers."""
    api_key, version = struct.unpack_from(">hh", frame)
    cls = request_class(api_key, version)
    _, offset = entity_reader(cls.__header_schema__)(frame, 0)
    body, _ = entity_reader(cls)(frame, offset)
    return body


def api_versions_request(version: int = 3) -> Any:
    cls = request_class(ApiKey.API_VERSIONS, version)
    if version >= 3:
        return cls(client_software_name="bad-input", client_software_version="1")
    return cls()


class KafkaConnection:
    """A raw connection to a Kafka listener."""

    def __init__(self, address: tuple[str, int], timeout: float = READ_TIMEOUT_S) -> None:
        self.sock = socket.create_connection(address, timeout=timeout)
        self._ids = itertools.count(1)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> KafkaConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_frame(self) -> bytes:
        (size,) = _I32.unpack(self._recv_exactly(4))
        return self._recv_exactly(size)

    def _recv_exactly(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(n)
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def request(self, body: Any) -> Any:
        """Send a kio request entity and return the response's body."""
        correlation_id = next(self._ids)
        self.send(encode_request(body, correlation_id))
        cls = type(body)
        answered_id, response = decode_response(self.recv_frame(), cls.__api_key__, cls.__version__)
        assert answered_id == correlation_id
        return response

    def is_closed_by_peer(self) -> bool:
        """True once the broker has closed this connection (EOF or reset)."""
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True


class StderrWatch:
    """The broker's stderr, read on from where the last look stopped."""

    CRASH_MARKERS: Final = ("bug:", "Traceback", "Unhandled exception", "exception was never")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def new_text(self) -> str:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        return data.decode(errors="replace")

    def crashes(self) -> list[str]:
        return [
            line
            for line in self.new_text().splitlines()
            if any(marker in line for marker in self.CRASH_MARKERS)
        ]


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(
        tmp_path_factory.mktemp("kafka-bad-input"),
        kafka=True,
        overrides={
            "socket.request.max.bytes": str(MAX_REQUEST_BYTES),
            # a drawn JoinGroup of a new group is answered at once, not after 3 s
            "group.initial.rebalance.delay.ms": "0",
            "offsets.topic.num.partitions": "1",
        },
    )
    broker.start()
    try:
        with KafkaConnection(("127.0.0.1", broker.kafka_port)) as conn:
            for name in FUZZ_NAMES:
                create_topic(conn, name, partitions=2)
        yield broker
        assert broker.alive, f"the broker died, {why_it_died(broker)}"
        assert broker.stop() == 0, broker.stderr_tail()
    finally:
        broker.kill()


@pytest.fixture(scope="module")
def kafka_address(kafka_broker: BrokerProcess) -> tuple[str, int]:
    return ("127.0.0.1", kafka_broker.kafka_port)


@pytest.fixture(scope="module")
def bystander(kafka_address: tuple[str, int]) -> Iterator[KafkaConnection]:
    """A well-behaved connection opened before any bad input, kept open all along."""
    with KafkaConnection(kafka_address) as conn:
        assert conn.request(api_versions_request()).error_code == NONE
        yield conn


@pytest.fixture(scope="module")
def stderr(kafka_broker: BrokerProcess) -> StderrWatch:
    return StderrWatch(kafka_broker.stderr_path)


def create_topic(conn: KafkaConnection, name: str, partitions: int = 1) -> None:
    cls = request_class(ApiKey.CREATE_TOPICS, 7)
    mod = schema_module(cls)
    body = cls(
        topics=(
            mod.CreatableTopic(
                name=name,
                num_partitions=partitions,
                replication_factor=1,
                assignments=(),
                configs=(),
            ),
        ),
        timeout=datetime.timedelta(seconds=10),
        validate_only=False,
    )
    [result] = conn.request(body).topics
    assert result.error_code == NONE, result


def why_it_died(broker: BrokerProcess) -> str:
    """The exit status of a dead broker, and what it said of why (a native crash prints a
    backtrace of a hundred lines after one line that matters)."""
    log = broker.stderr_path.read_text(errors="replace").splitlines()
    said = [line for line in log if any(m in line for m in _DEATH_MARKERS)] or log[-10:]
    status = broker.proc.returncode if broker.proc is not None else None
    return f"exit status {status}:\n" + "\n".join(said[:5])


_DEATH_MARKERS: Final = ("memory allocation of", "panicked at", "Fatal Python error", "Killed")


def check_unharmed_alive(broker: BrokerProcess, bystander: KafkaConnection, what: str) -> None:
    """The broker is alive and the bystander connection is still served."""
    try:
        response = bystander.request(api_versions_request())
    except OSError as err:
        wait_until(lambda: not broker.alive, timeout=10, message="the broker to be gone")
        raise AssertionError(f"the broker died after {what}\n{why_it_died(broker)}") from err
    assert broker.alive, f"the broker died after {what}\n{why_it_died(broker)}"
    assert response.error_code == NONE, f"after {what}: {response}"


def check_unharmed(
    broker: BrokerProcess, bystander: KafkaConnection, stderr: StderrWatch, what: str
) -> None:
    """The broker is alive, the bystander connection is still served, and the broker logged no
    crash of a request handler."""
    check_unharmed_alive(broker, bystander, what)
    crashes = stderr.crashes()
    assert not crashes, f"the broker logged a crash after {what}:\n" + "\n".join(crashes)


# --- valid requests, drawn by hypothesis ----------------------------------------------------------


def _millis(low: int, high: int) -> st.SearchStrategy[datetime.timedelta]:
    return st.integers(low, high).map(lambda ms: datetime.timedelta(milliseconds=ms))


def _kafka_batch(values: list[bytes], key: bytes | None, headers: bool) -> bytes:
    """A RecordBatch v2 as kafka-python's producer builds it (uncompressed)."""
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    for i, value in enumerate(values):
        record_headers = [("h", b"1")] if headers else []
        assert builder.append(i, 1_700_000_000_000 + i, key, value, record_headers) is not None
    return bytes(builder.build())


def _flip(data: bytes, at: int, bit: int) -> bytes:
    out = bytearray(data)
    out[at % len(out)] ^= 1 << bit
    return bytes(out)


_BATCHES = st.builds(
    _kafka_batch,
    st.lists(st.binary(max_size=16), min_size=1, max_size=3),
    st.none() | st.binary(max_size=8),
    st.booleans(),
)
#: a produce's records: a valid batch, one with a bit flipped past its CRC field (CORRUPT_MESSAGE)
#: or anywhere, random bytes, none
_RECORDS = st.one_of(
    _BATCHES,
    st.builds(_flip, _BATCHES, st.integers(21, 1 << 10), st.integers(0, 7)),
    st.builds(_flip, _BATCHES, st.integers(0, 1 << 10), st.integers(0, 7)),
    st.binary(max_size=64),
    st.none(),
)

#: fields whose values are drawn from more than their type: times kept short (a long poll or a
#: produce timeout would only make the exchange wait), counts kept small (a topic of 9,000
#: partitions is not bad input, only slow), and values that take the interesting paths
_FIELD_STRATEGIES: Final[dict[str, st.SearchStrategy[Any]]] = {
    "timeout": _millis(-1, 500),  # Produce, CreateTopics, DeleteTopics
    "max_wait": _millis(0, 100),  # Fetch
    "session_timeout": _millis(-1, 60_000),  # JoinGroup
    "rebalance_timeout": _millis(-1, 1_000),  # JoinGroup
    # OffsetCommit v2-v4: an int64 of milliseconds, but kio reads it through a timedelta in
    # microseconds, so it refuses (as malformed) what is over 2**63 microseconds
    "retention_time": _millis(-1, 2**52) | _millis(-(2**52), -1),
    "acks": st.sampled_from((0, 1, -1)) | st.integers(-(2**15), 2**15 - 1),
    "num_partitions": st.integers(-2, 3) | st.integers(10_001, 2**31 - 1),
    "replication_factor": st.integers(-2, 2) | st.integers(-(2**15), 2**15 - 1),
    "records": _RECORDS,
}
_TYPE_STRATEGIES: Final[dict[Any, st.SearchStrategy[Any]]] = {
    TopicName: st.sampled_from(FUZZ_NAMES) | st.text(max_size=24),
    GroupId: st.just(FUZZ_GROUP) | st.text(max_size=24),
    TransactionalId: st.just(FUZZ_TXN) | st.text(max_size=24),
    str: st.text(max_size=24),
    bytes: st.binary(max_size=32),
}


def _value_strategy(name: str, annotation: Any) -> st.SearchStrategy[Any]:
    if name in _FIELD_STRATEGIES:
        strategy = _FIELD_STRATEGIES[name]
        args = typing.get_args(annotation)
        if isinstance(annotation, types.UnionType) and type(None) in args and name != "records":
            strategy = st.none() | strategy
        return strategy
    if annotation in _TYPE_STRATEGIES:
        return _TYPE_STRATEGIES[annotation]
    if isinstance(annotation, types.UnionType):
        return st.one_of(*(_value_strategy(name, a) for a in typing.get_args(annotation)))
    if annotation is type(None):
        return st.none()
    if typing.get_origin(annotation) is tuple:
        element = typing.get_args(annotation)[0]
        return st.lists(_value_strategy(name, element), max_size=3).map(tuple)
    if dataclasses.is_dataclass(annotation):
        return entities(annotation)  # type: ignore[arg-type]
    return st.from_type(annotation)


def entities(cls: type) -> st.SearchStrategy[Any]:
    """Valid instances of a kio entity class, every field drawn (tagged fields too)."""
    hints = typing.get_type_hints(cls)
    return st.builds(
        cls,
        **{f.name: _value_strategy(f.name, hints[f.name]) for f in dataclasses.fields(cls)},
    )


_CORRELATION_IDS = st.integers(-(2**31), 2**31 - 1).filter(lambda c: c != SENTINEL_ID)
_CLIENT_IDS = st.none() | st.text(max_size=16)


# --- what the listener must answer ---------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """An answer the listener owes, in order: to a request, or UNSUPPORTED_VERSION (at v0) to
    ApiVersions of a version not served."""

    api_key: int
    version: int
    correlation_id: int
    unsupported: bool = False


@dataclass
class Expectation:
    #: the answers owed, in order (a handler may close the connection instead of answering)
    answers: list[Expected]
    #: frames the listener reads before the stream ends or a frame closes the connection
    frames: int
    #: why the connection ends: "eof" (the stream ended, maybe inside a frame) or a bad frame
    ending: str
    #: the first answer owed to a Fetch that may wait a second or more (a mutant's max wait):
    #: the broker may still be holding it when the read times out (a long poll, not a hang)
    long_poll_at: int | None = None


def expected_answers(stream: bytes) -> Expectation:
    """What the listener must answer to ``stream`` followed by the end of the stream, read as
    it reads frames: an int32 length (negative or over socket.request.max.bytes: close), that
    many bytes (not there: end of stream), decoded as ``decode_request`` decodes them."""
    answers: list[Expected] = []
    pos = frames = 0
    long_poll_at: int | None = None

    def ending(why: str) -> Expectation:
        return Expectation(answers, frames, why, long_poll_at)

    while True:
        if len(stream) - pos < 4:
            return ending("eof")
        (size,) = _I32.unpack_from(stream, pos)
        if size < 0:
            return ending(f"negative length {size}")
        if size > MAX_REQUEST_BYTES:
            return ending(f"length {size} over the limit")
        if pos + 4 + size > len(stream):
            return ending("eof")
        frame = stream[pos + 4 : pos + 4 + size]
        pos += 4 + size
        frames += 1
        try:
            request = decode_request(frame)
        except UnsupportedVersionError as err:
            api_key, _, correlation_id = struct.unpack_from(">hhi", frame)
            if api_key != ApiKey.API_VERSIONS:
                return ending(f"not served: {err}")
            answers.append(Expected(api_key, 0, correlation_id, unsupported=True))
            continue
        except CorruptFrameError as err:
            return ending(f"malformed: {err}")
        body = request.body
        if request.api_key == ApiKey.PRODUCE and body.acks == 0:
            continue  # acks=0: no answer
        long_poll = request.api_key == ApiKey.FETCH and body.max_wait.total_seconds() >= 1
        if long_poll and long_poll_at is None:
            long_poll_at = len(answers)
        answers.append(Expected(request.api_key, request.api_version, request.correlation_id))


@dataclass
class Received:
    frames: list[bytes]
    #: "eof", "reset" or "timeout"
    ending: str
    #: bytes after the last whole response frame
    partial: bytes


def exchange(address: tuple[str, int], stream: bytes) -> Received:
    """Send ``stream`` on a new connection, end it, and read what comes back until the broker
    closes the connection or READ_TIMEOUT_S pass without a byte."""
    data = bytearray()
    with socket.create_connection(address, timeout=READ_TIMEOUT_S) as sock:
        try:
            sock.sendall(stream)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the broker closed the connection at a bad frame before all was sent
        try:
            while chunk := sock.recv(1 << 16):
                data += chunk
            ending = "eof"
        except TimeoutError:
            ending = "timeout"
        except OSError:  # reset: the broker closed the connection with bytes unread
            ending = "reset"
    frames = []
    pos = 0
    while pos + 4 <= len(data):
        (size,) = _I32.unpack_from(data, pos)
        if size < 0 or pos + 4 + size > len(data):
            break
        frames.append(bytes(data[pos + 4 : pos + 4 + size]))
        pos += 4 + size
    return Received(frames, ending, bytes(data[pos:]))


class FuzzStats:
    """What the fuzz sent and what came of it (printed at the end of the module)."""

    def __init__(self) -> None:
        self.frames: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.versions: set[tuple[int, int]] = set()
        #: the last stream sent (what killed the broker, if it died)
        self.last_sent = ""

    def __repr__(self) -> str:
        return "FuzzStats(...)"

    def summary(self) -> str:
        return (
            f"{sum(self.frames.values())} frames over {len(self.versions)} API versions; "
            f"by kind {dict(sorted(self.frames.items()))}; "
            f"outcomes {dict(sorted(self.outcomes.items()))}"
        )


@pytest.fixture(scope="module")
def fuzz_stats() -> Iterator[FuzzStats]:
    stats = FuzzStats()
    yield stats
    print(f"\nKafka frame fuzz: {stats.summary()}")


def check_answers(stream: bytes, received: Received, what: str, stats: FuzzStats) -> None:
    """Every answer the listener owed to ``stream`` came, in order, readable, and nothing else;
    a valid request may close its connection instead of being answered."""
    expected = expected_answers(stream)
    context = (
        f"{what}\nstream ({len(stream)} bytes): {stream.hex()}\nexpected {expected}\n"
        f"received {len(received.frames)} frames, then {received.ending}"
        f" ({len(received.partial)} stray bytes)"
    )
    assert len(received.frames) <= len(expected.answers), f"answers nobody asked for: {context}"
    for got, owed in zip(received.frames, expected.answers, strict=False):
        try:
            correlation_id, body = decode_response(got, owed.api_key, owed.version)
        except Exception as err:
            raise AssertionError(f"an unreadable answer ({err!r}): {got.hex()}\n{context}") from err
        assert correlation_id == owed.correlation_id, f"wrong correlation id: {context}"
        if owed.unsupported:
            assert body.error_code == UNSUPPORTED_VERSION, context
    unanswered = len(expected.answers) - len(received.frames)
    if received.ending == "timeout":
        assert expected.long_poll_at is not None, f"no answer nor close (a hang): {context}"
        assert len(received.frames) >= expected.long_poll_at, context
        stats.outcomes["long poll"] += 1
    else:
        # (a reset may cut an answer short: the broker closed with bytes of ours unread)
        assert not received.partial or received.ending == "reset", f"a partial answer: {context}"
        if unanswered:
            stats.outcomes["closed after a valid request"] += 1
        elif expected.ending == "eof":
            stats.outcomes["all answered"] += 1
        else:
            stats.outcomes["closed at a bad frame"] += 1


# --- mutations ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """A valid request frame, and where its parts are."""

    data: bytes  # length prefix included
    api_key: int
    version: int
    header_end: int  # offset of the body in ``data``

    def regions(self) -> list[tuple[int, int]]:
        """[start, end) of the length prefix, the fixed header (key, version, correlation id),
        the rest of the header (client id, tagged fields), the body."""
        parts = [(0, 4), (4, 12), (12, self.header_end), (self.header_end, len(self.data))]
        return [(a, b) for a, b in parts if a < b]


def _prefixed(payload: bytes) -> bytes:
    return _I32.pack(len(payload)) + payload


def _position(draw: st.DrawFn, frame: Frame, skip_prefix: bool) -> int:
    """A position inside one kind of place of the frame (prefix, header, client id, body)."""
    regions = [r for r in frame.regions() if not (skip_prefix and r == (0, 4))]
    start, end = draw(st.sampled_from(regions))
    return draw(st.integers(start, end - 1))


MUTATION_KINDS: Final = (
    "truncated stream",
    "truncated frame",
    "bit flips",
    "interesting bytes",
    "length lie",
    "random body after a valid header",
    "api not served",
    "version not served",
    "trailing bytes",
    "garbage",
)


@st.composite
def mutants(draw: st.DrawFn, frame: Frame, kind: str) -> tuple[bytes, bool]:
    """(bytes, whether a sentinel follows) of one mutation of a valid frame."""
    data, size = frame.data, len(frame.data) - 4
    sentinel = True
    if kind == "truncated stream":  # the length prefix promises bytes that never come
        out = data[: _position(draw, frame, skip_prefix=False)]
        sentinel = draw(st.booleans())
    elif kind == "truncated frame":  # a whole frame, cut short inside some part
        out = _prefixed(data[4 : _position(draw, frame, skip_prefix=True)])
    elif kind == "bit flips":
        body = bytearray(data[4:])
        for _ in range(draw(st.integers(1, 4))):
            bit = draw(st.integers(0, len(body) * 8 - 1))
            body[bit // 8] ^= 1 << (bit % 8)
        out = _prefixed(bytes(body))
    elif kind == "interesting bytes":  # 0, -1, min, max of an int8/16/32 over what was there
        at = _position(draw, frame, skip_prefix=True)
        width = draw(st.sampled_from((1, 2, 4)))
        value = draw(st.sampled_from((0, 1, 2**31 - 1, -(2**31), -1, 0x80, 0x7F)))
        body = bytearray(data)
        body[at : at + width] = (value % (1 << (8 * width))).to_bytes(width, "big")
        out = _prefixed(bytes(body[4 : len(data)]))
    elif kind == "length lie":
        lie = draw(
            st.sampled_from(
                (
                    size - 1,
                    size + 1,
                    -1,
                    -(2**31),
                    2**31 - 1,
                    0,
                    MAX_REQUEST_BYTES,
                    MAX_REQUEST_BYTES + 1,
                )
            )
            | st.integers(0, size - 1)
            | st.integers(size + 1, size + 64)
        )
        out = _I32.pack(lie) + data[4:]
        sentinel = draw(st.booleans())
    elif kind == "random body after a valid header":
        out = _prefixed(data[4 : frame.header_end] + draw(st.binary(max_size=64)))
    elif kind == "api not served":
        api_key = draw(st.sampled_from(NOT_SERVED))
        out = _prefixed(struct.pack(">h", api_key) + data[6:])
    elif kind == "version not served":
        low, high = SERVED_VERSIONS[ApiKey(frame.api_key)]
        version = draw(st.sampled_from((low - 1, high + 1, 99, -1, 2**15 - 1, -(2**15))))
        out = _prefixed(data[4:6] + struct.pack(">h", version) + data[8:])
    elif kind == "trailing bytes":  # ignored, as Kafka's broker ignores them
        out = _prefixed(data[4:] + draw(st.binary(min_size=1, max_size=16)))
    else:  # garbage: no request at all, with a true length, a random one, or none
        noise = draw(st.binary(max_size=64))
        out = draw(
            st.sampled_from(
                (
                    _prefixed(noise),
                    _I32.pack(draw(st.integers(-(2**31), 2**31 - 1))) + noise,
                    b"GET / HTTP/1.1\r\n\r\n" + noise,
                    noise,
                )
            )
        )
        sentinel = draw(st.booleans())
    return out, sentinel


def _sentinel() -> bytes:
    return encode_request(api_versions_request(0), SENTINEL_ID)


# --- the fuzz -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("api_key", "version"),
    _PAIRS,
    ids=[f"{ApiKey(k).name}-v{v}" for k, v in _PAIRS],
)
@seed(FUZZ_SEED)
@settings(
    max_examples=EXAMPLES_PER_VERSION,
    database=None,
    deadline=None,
    phases=(Phase.explicit, Phase.generate),  # no shrinking against a live broker: bounded
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data())
def test_fuzzed_frames_close_only_their_connection(
    kafka_broker: BrokerProcess,
    kafka_address: tuple[str, int],
    bystander: KafkaConnection,
    stderr: StderrWatch,
    fuzz_stats: FuzzStats,
    api_key: int,
    version: int,
    data: st.DataObject,
) -> None:
    """A valid request of this API version, drawn, and MUTATIONS mutants of it, each on a new
    connection: the answers owed and no others, no hang, no harm to the broker or the
    bystander, no crash logged."""
    cls = request_class(api_key, version)
    body = data.draw(entities(cls), label="body")
    correlation_id = data.draw(_CORRELATION_IDS, label="correlation_id")
    client_id = data.draw(_CLIENT_IDS, label="client_id")
    frame = Frame(
        encode_request(body, correlation_id, client_id),
        api_key,
        version,
        4 + header_size(api_key, version, client_id),
    )
    assert read_request(frame.data[4:]) == body  # kio reads back what it wrote
    streams = [("valid", frame.data + _sentinel(), f"valid {cls.__name__} v{version}: {body!r}")]
    # the kinds of mutation take turns, from a place of their cycle that differs between API
    # versions (hypothesis's first example draws the simplest values: rotation 0)
    rotation = _PAIRS.index((api_key, version)) + data.draw(
        st.integers(0, len(MUTATION_KINDS) - 1), label="rotation"
    )
    for i in range(MUTATIONS):
        kind = MUTATION_KINDS[(rotation * MUTATIONS + i) % len(MUTATION_KINDS)]
        stream, sentinel = data.draw(mutants(frame, kind), label=kind)
        streams.append(
            (
                kind,
                stream + (_sentinel() if sentinel else b""),
                f"{kind} of {cls.__name__} v{version}",
            )
        )

    # everything is drawn before anything is sent: what hypothesis draws never depends on
    # what the broker did
    assert kafka_broker.alive, f"the broker died earlier: {fuzz_stats.last_sent}"
    fuzz_stats.versions.add((api_key, version))
    for kind, stream, what in streams:
        fuzz_stats.frames[kind] += 1
        fuzz_stats.last_sent = f"{what}\nstream: {stream.hex()}"
        received = exchange(kafka_address, stream)
        # the broker first: the answers are worked out with the reader the broker used, and a
        # frame that kills one (test_a_huge_compact_array_length_...) would kill the other
        check_unharmed(kafka_broker, bystander, stderr, fuzz_stats.last_sent)
        check_answers(stream, received, what, fuzz_stats)


# --- the cases named on their own ---------------------------------------------------------------


def _produce_request(version: int, topic: str, partitions: dict[int, bytes]) -> Any:
    cls = request_class(ApiKey.PRODUCE, version)
    mod = schema_module(cls)
    return cls(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            mod.TopicProduceData(
                name=topic,
                partition_data=tuple(
                    mod.PartitionProduceData(index=index, records=records)
                    for index, records in partitions.items()
                ),
            ),
        ),
    )


def _produced(response: Any) -> dict[int, tuple[int, int]]:
    """{partition: (error code, base offset)} of a produce response's only topic."""
    [topic] = response.responses
    return {p.index: (p.error_code, p.base_offset) for p in topic.partition_responses}


@pytest.mark.parametrize("version", [3, 8, 11])
def test_produce_with_a_bad_crc_gets_corrupt_message(
    kafka_broker: BrokerProcess,
    kafka_address: tuple[str, int],
    bystander: KafkaConnection,
    stderr: StderrWatch,
    version: int,
) -> None:
    topic = unique_name("crc")
    good = _kafka_batch([b"one", b"two"], b"k", headers=True)
    bad = _flip(good, len(good) - 3, 0)  # a value byte: the CRC-32C no longer matches
    with KafkaConnection(kafka_address) as conn:
        create_topic(conn, topic, partitions=2)
        assert _produced(conn.request(_produce_request(version, topic, {0: good}))) == {
            0: (NONE, 0)
        }
        # the corrupt batch is refused on its partition; the other partition's is appended
        response = conn.request(_produce_request(version, topic, {0: bad, 1: good}))
        assert _produced(response) == {0: (CORRUPT_MESSAGE, -1), 1: (NONE, 0)}
        if version >= 8:
            [part, _] = response.responses[0].partition_responses
            assert part.error_message, "the error says what was wrong"
        # the same connection is still served, and nothing of the corrupt batch was appended
        assert _produced(conn.request(_produce_request(version, topic, {0: good}))) == {
            0: (NONE, 2)
        }
    check_unharmed(kafka_broker, bystander, stderr, "a produce with a bad CRC")


@pytest.mark.parametrize("version", [4, 99, 2**15 - 1, -1])
def test_api_versions_of_an_unknown_version_gets_unsupported_version_at_v0(
    kafka_broker: BrokerProcess,
    kafka_address: tuple[str, int],
    bystander: KafkaConnection,
    stderr: StderrWatch,
    version: int,
) -> None:
    with KafkaConnection(kafka_address) as conn:
        # the body of an unknown version cannot be read, and is not needed
        conn.send(_prefixed(struct.pack(">hhih", ApiKey.API_VERSIONS, version, 77, -1) + b"\xde"))
        correlation_id, response = decode_response(conn.recv_frame(), ApiKey.API_VERSIONS, 0)
        assert correlation_id == 77
        assert response.error_code == UNSUPPORTED_VERSION
        advertised = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
        assert advertised == {int(k): v for k, v in SERVED_VERSIONS.items()}
        # the client retries with a version it was told of, on the same connection
        for retry in (0, 3):
            assert conn.request(api_versions_request(retry)).error_code == NONE
    check_unharmed(kafka_broker, bystander, stderr, f"ApiVersions v{version}")


def _logged(broker: BrokerProcess, text: str) -> None:
    wait_until(
        lambda: text in broker.stderr_path.read_text(),
        timeout=10,
        message=f"the broker to log {text!r}",
    )


def _update_features_frame(correlation_id: int) -> bytes:
    """UpdateFeatures v0 (API key 57): a well-formed request of an API the listener does not
    serve."""
    cls = request_class(57, 0)
    body = cls(timeout=datetime.timedelta(seconds=1), feature_updates=())
    return encode_request(body, correlation_id)


@pytest.mark.parametrize("api_key", [57, 1000, 4, -1])
def test_an_api_not_served_closes_only_that_connection(
    kafka_broker: BrokerProcess,
    kafka_address: tuple[str, int],
    bystander: KafkaConnection,
    stderr: StderrWatch,
    api_key: int,
) -> None:
    if api_key == 57:
        frame = _update_features_frame(5)
    else:
        frame = _prefixed(struct.pack(">hhih", api_key, 0, 5, -1) + b"\x00" * 8)
    with KafkaConnection(kafka_address) as bad, KafkaConnection(kafka_address) as other:
        # a request pipelined before it is answered; then that connection closes
        bad.send(encode_request(api_versions_request(0), 4) + frame)
        correlation_id, response = decode_response(bad.recv_frame(), ApiKey.API_VERSIONS, 0)
        assert (correlation_id, response.error_code) == (4, NONE)
        assert bad.is_closed_by_peer(), f"API key {api_key} was answered, not refused"
        _logged(kafka_broker, f"API key {api_key} is not served")
        # a connection opened before it, and the long-lived one, are still served
        assert other.request(api_versions_request()).error_code == NONE
    check_unharmed(kafka_broker, bystander, stderr, f"API key {api_key}")


def test_a_frame_over_socket_request_max_bytes_closes_only_that_connection(
    kafka_broker: BrokerProcess,
    kafka_address: tuple[str, int],
    bystander: KafkaConnection,
    stderr: StderrWatch,
) -> None:
    limit = MAX_REQUEST_BYTES
    cls = request_class(ApiKey.API_VERSIONS, 3)

    def padded(name_size: int) -> bytes:
        body = cls(client_software_name="n" * name_size, client_software_version="1")
        return encode_request(body, 9)

    # a frame of exactly the limit is served: ApiVersions v3, its client name padded (the
    # name's compact length is a 3-byte varint for every size tried here)
    name_size = limit - (len(padded(limit // 2)) - 4 - limit // 2)
    at_limit = padded(name_size)
    assert len(at_limit) - 4 == limit
    with KafkaConnection(kafka_address) as conn:
        conn.send(at_limit)
        correlation_id, response = decode_response(conn.recv_frame(), ApiKey.API_VERSIONS, 3)
        assert (correlation_id, response.error_code) == (9, NONE)
    # one byte more is refused from its length prefix alone
    with KafkaConnection(kafka_address) as conn:
        over = padded(name_size + 1)
        assert len(over) - 4 == limit + 1
        try:
            conn.send(over)
        except (ConnectionResetError, BrokenPipeError):
            pass  # closed before all was sent: refused all the same
        assert conn.is_closed_by_peer(), "a frame over the limit was read"
    _logged(kafka_broker, f"frame of {limit + 1} bytes exceeds the limit of {limit} bytes")
    check_unharmed(kafka_broker, bystander, stderr, "a frame over socket.request.max.bytes")


def test_find_coordinator_v0_is_answered(
    kafka_broker: BrokerProcess,
    kafka_address: tuple[str, int],
    bystander: KafkaConnection,
    stderr: StderrWatch,
) -> None:
    """FindCoordinator v0 (served: SERVED_VERSIONS says v0 to v4) of a group is answered with
    the group's coordinator, on a connection that stays open. Found by the fuzz: v0 has no
    key_type field (v1 added it; v0 always means a group), and the handler reads one."""
    stderr.new_text()  # what earlier tests logged is not this test's
    frame = encode_request(request_class(ApiKey.FIND_COORDINATOR, 0)(key=FUZZ_GROUP), 21)
    with KafkaConnection(kafka_address) as conn:
        conn.send(frame)
        try:
            answer: bytes | None = conn.recv_frame()
        except ConnectionError:
            answer = None
        assert answer is not None, (
            f"FindCoordinator v0 (frame {frame.hex()}) closed the connection, no answer; the "
            "broker logged:\n" + stderr.new_text()
        )
        correlation_id, response = decode_response(answer, ApiKey.FIND_COORDINATOR, 0)
        assert (correlation_id, response.error_code) == (21, NONE), response
        assert (response.host, response.port) == kafka_address
        assert conn.request(api_versions_request()).error_code == NONE
    check_unharmed(kafka_broker, bystander, stderr, "FindCoordinator v0")


def _zero(annotation: Any) -> Any:
    """The simplest value of a field of a kio entity: 0, "", empty, null if it may be."""
    if isinstance(annotation, types.UnionType):
        return None
    if typing.get_origin(annotation) is tuple:
        return ()
    if dataclasses.is_dataclass(annotation):
        hints = typing.get_type_hints(annotation)
        return annotation(  # type: ignore[operator]
            **{f.name: _zero(hints[f.name]) for f in dataclasses.fields(annotation)}
        )
    for kind, value in ((bool, False), (str, ""), (bytes, b""), (int, 0)):
        if issubclass(annotation, kind):
            return value
    if issubclass(annotation, datetime.timedelta):
        return datetime.timedelta(0)
    assert issubclass(annotation, uuid.UUID), annotation
    return uuid.UUID(int=0)


def _null_array_frames() -> list[tuple[str, bytes]]:
    """For every top-level array of every request served that Kafka's schema says is not
    nullable, the simplest request with that array null (length -1, or compact length 0).

    The array's length is found by writing the request with the array empty and with one
    element: the first byte that differs is the last byte of the length."""
    out = []
    for api_key, version in _PAIRS:
        cls = request_class(api_key, version)
        hints = typing.get_type_hints(cls)
        empty = _zero(cls)
        base = encode_request(empty, 13, None)
        for f in dataclasses.fields(cls):
            annotation = hints[f.name]
            if typing.get_origin(annotation) is not tuple or "tag" in f.metadata:
                continue  # not an array, or a nullable one, or a tagged field
            element = _zero(typing.get_args(annotation)[0])
            one = encode_request(dataclasses.replace(empty, **{f.name: (element,)}), 13, None)
            at = next(i for i in range(4, len(base)) if base[i] != one[i])  # after the prefix
            if cls.__flexible__:  # compact length: n + 1, as an unsigned varint; null is 0
                assert base[at] == 1
                null = base[:at] + b"\x00" + base[at + 1 :]  # same size: the prefix holds
            else:  # int32 length; null is -1
                assert base[at - 3 : at + 1] == bytes(4)
                null = base[: at - 3] + _I32.pack(-1) + base[at + 1 :]
            out.append((f"{ApiKey(api_key).name} v{version} {f.name}", null))
    return out


def test_a_null_array_where_none_is_allowed_crashes_no_handler(
    kafka_broker: BrokerProcess,
    kafka_address: tuple[str, int],
    bystander: KafkaConnection,
    stderr: StderrWatch,
) -> None:
    """A request whose non-nullable array is null is malformed (Kafka's parser refuses it):
    it closes its connection, or is answered, without crashing a request handler.

    Found by the fuzz: kio's reader returns None for such an array instead of refusing it, and
    the handlers iterate over it (TypeError: 'NoneType' object is not iterable), which the
    socket server logs as "bug: Kafka PRODUCE v3 request ... failed" with a traceback."""
    stderr.new_text()  # what earlier tests logged is not this test's
    crashed = []
    cases = _null_array_frames()
    for what, frame in cases:
        received = exchange(kafka_address, frame)
        assert received.ending != "timeout", f"{what}: no answer nor close: {frame.hex()}"
        check_unharmed_alive(kafka_broker, bystander, what)
        if stderr.crashes():
            crashed.append(f"{what}: {frame.hex()}")
    assert len(cases) > 80  # every top-level array of every version served
    assert not crashed, f"{len(crashed)} of {len(cases)} crashed a handler:\n" + "\n".join(crashed)


@pytest.mark.parametrize("version", [10, 11, 12])
def test_metadata_naming_a_topic_by_id_crashes_no_handler(
    kafka_broker: BrokerProcess,
    kafka_address: tuple[str, int],
    bystander: KafkaConnection,
    stderr: StderrWatch,
    version: int,
) -> None:
    """Metadata v10 and later name a topic by name or by id (name null): a valid request, to
    be answered (v10 and v11 cannot carry topic ids: an error for that topic, or the
    connection closed, as for any request the listener refuses), never a handler's crash.

    Found by the fuzz: at v10 and v11 the answer echoes the null name into a response field
    that is not nullable at those versions, and writing it fails (TypeError: Unexpectedly
    received None value): "bug: Kafka METADATA v11 request ... failed"."""
    stderr.new_text()
    cls = request_class(ApiKey.METADATA, version)
    mod = schema_module(cls)
    extra = {"include_cluster_authorized_operations": False} if version < 11 else {}
    body = cls(
        topics=(mod.MetadataRequestTopic(topic_id=uuid.UUID(int=7), name=None),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
        **extra,
    )
    frame = encode_request(body, 17)
    received = exchange(kafka_address, frame)
    assert received.ending != "timeout", f"no answer nor close: {frame.hex()}"
    crashes = stderr.crashes()
    assert not crashes, f"Metadata v{version} {frame.hex()} crashed a handler:\n" + "\n".join(
        crashes
    )
    for answer in received.frames:
        assert decode_response(answer, ApiKey.METADATA, version)[0] == 17
    check_unharmed(kafka_broker, bystander, stderr, f"Metadata v{version} by topic id")


def test_a_huge_compact_array_length_closes_only_that_connection(tmp_path: Path) -> None:
    """A compact array (flexible versions) whose length claims 2**35 - 2 elements, in a frame
    of 20 bytes, is malformed: that connection closes, and the broker lives on.

    Found by the fuzz: kio's native reader allocates room for the claimed count before it
    reads any element (8 bytes each: 256 GiB here); the allocation fails and Rust aborts the
    whole process ("memory allocation of 274877906928 bytes failed", SIGABRT). Any flexible
    request will do (DeleteTopics v4 here), and any count whose room the kernel refuses (2**32
    already, on this 24 GB machine; a kernel that overcommits always, vm.overcommit_memory=1,
    would grant it and hide the bug). Its own broker, as it may die."""
    broker = BrokerProcess(tmp_path / "broker", kafka=True)
    broker.start()
    try:
        address = ("127.0.0.1", broker.kafka_port)
        with KafkaConnection(address) as other:
            assert other.request(api_versions_request()).error_code == NONE
            # DeleteTopics v4: header v2 (key 20, version 4, correlation id 31, null client id,
            # no tagged fields), then the topic names' compact length, an unsigned varint of
            # 2**35 - 1 (the largest kio reads): 2**35 - 2 names
            frame = struct.pack(">hhih", 20, 4, 31, -1) + b"\x00" + b"\xff\xff\xff\xff\x7f"
            assert len(_prefixed(frame)) == 20
            received = exchange(address, _prefixed(frame))
            assert (received.frames, received.ending) in (([], "eof"), ([], "reset"))
            try:
                answer = other.request(api_versions_request())
            except OSError as err:
                wait_until(lambda: not broker.alive, timeout=10, message="the broker gone")
                raise AssertionError(
                    f"the broker died on the frame {_prefixed(frame).hex()}, {why_it_died(broker)}"
                ) from err
            assert answer.error_code == NONE
        assert broker.alive
    finally:
        broker.kill()
