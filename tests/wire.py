"""A raw protocol connection for broker tests (no client library in the way)."""

from __future__ import annotations

import itertools
import socket
import struct
import uuid
from typing import Any

from logstore.batch import Record, iter_batches
from replication import protocol as p


class RawConnection:
    def __init__(self, bootstrap: str, timeout: float = 30) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self._ids = itertools.count(1)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_frame(self) -> bytes:
        size = struct.unpack(">i", self._recv_exactly(4))[0]
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

    def request(self, api_key: p.ApiKey, body: Any, version: int | None = None) -> Any:
        version = p.SUPPORTED_VERSIONS[api_key][1] if version is None else version
        header = p.RequestHeader(
            api_key=api_key, api_version=version, correlation_id=next(self._ids), client_id="test"
        )
        self.send_raw(p.encode_request(header, body))
        if api_key == p.ApiKey.PRODUCE and body.acks == 0:
            return None
        correlation_id, response = p.decode_response(self.recv_frame(), api_key, version)
        assert correlation_id == header.correlation_id
        return response

    def is_closed_by_peer(self) -> bool:
        """True once the broker has closed this connection (EOF)."""
        self.sock.settimeout(10)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True


def create_topic(
    conn: RawConnection, name: str, partitions: int = 1, rf: int = 1, **configs: str
) -> Any:
    return conn.request(
        p.ApiKey.CREATE_TOPICS,
        p.CreateTopicsRequest(
            topics=[
                p.CreatableTopic(
                    name=name,
                    num_partitions=partitions,
                    replication_factor=rf,
                    configs=[p.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()],
                )
            ]
        ),
    )


def register_broker(
    conn: RawConnection,
    broker_id: int,
    listener: p.BrokerRegistrationListener,
    cluster_id: str = "",
) -> Any:
    """BrokerRegistration of a new incarnation of ``broker_id`` (the test speaks for it)."""
    return conn.request(
        p.ApiKey.BROKER_REGISTRATION,
        p.BrokerRegistrationRequest(
            broker_id=broker_id,
            cluster_id=cluster_id,
            incarnation_id=uuid.uuid4(),
            listeners=[listener],
        ),
    )


def produce(conn: RawConnection, topic: str, partition: int, records: bytes, acks: int = -1) -> Any:
    return conn.request(
        p.ApiKey.PRODUCE,
        p.ProduceRequest(
            acks=acks,
            timeout_ms=30000,
            topic_data=[
                p.ProduceRequestTopic(
                    name=topic,
                    partition_data=[p.ProduceRequestPartition(index=partition, records=records)],
                )
            ],
        ),
    )


def fetch(
    conn: RawConnection,
    topic: str,
    partition: int,
    offset: int,
    *,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    max_bytes: int = 1 << 20,
    isolation_level: int = 0,
) -> Any:
    return conn.request(
        p.ApiKey.FETCH,
        p.FetchRequest(
            replica_id=-1,
            max_wait_ms=max_wait_ms,
            min_bytes=min_bytes,
            max_bytes=max_bytes,
            isolation_level=isolation_level,
            topics=[
                p.FetchRequestTopic(
                    topic=topic,
                    partitions=[
                        p.FetchRequestPartition(
                            partition=partition, fetch_offset=offset, partition_max_bytes=max_bytes
                        )
                    ],
                )
            ],
        ),
    )


def read_records(conn: RawConnection, topic: str, partition: int = 0) -> list[Record]:
    """Every record below the high watermark, fetched from offset 0: each batch's CRC checked,
    each batch starting where the one before ended."""
    out: list[Record] = []
    offset = 0
    while True:
        [t] = fetch(conn, topic, partition, offset).responses
        [part] = t.partitions
        assert part.error_code == 0, part
        if offset >= part.high_watermark:
            return out
        batches = list(iter_batches(part.records or b"", validate=True))
        assert batches, f"no batch at offset {offset} below the high watermark"
        for batch in batches:
            assert batch.base_offset == offset, f"batch at {batch.base_offset}, expected {offset}"
            out.extend(batch.records())
            offset = batch.next_offset


def metadata(conn: RawConnection, topics: list[str] | None = None) -> Any:
    return conn.request(
        p.ApiKey.METADATA,
        p.MetadataRequest(
            topics=None if topics is None else [p.MetadataRequestTopic(name=t) for t in topics]
        ),
    )


def partition_state(bootstrap: str, topic: str, partition: int = 0) -> Any:
    """The MetadataResponsePartition of one partition, asked of any reachable broker."""
    last: Exception | None = None
    for address in bootstrap.split(","):
        try:
            with RawConnection(address, timeout=5) as conn:
                for t in metadata(conn, [topic]).topics:
                    if t.name == topic and t.error_code == 0:
                        return t.partitions[partition]
        except OSError as err:
            last = err
    raise ConnectionError(f"no broker in {bootstrap} answered metadata for {topic}: {last}")


def broker_address(bootstrap: str, broker_id: int) -> str:
    for address in bootstrap.split(","):
        try:
            with RawConnection(address, timeout=5) as conn:
                for b in metadata(conn, []).brokers:
                    if b.node_id == broker_id:
                        return f"{b.host}:{b.port}"
        except OSError:
            continue
    raise ConnectionError(f"broker {broker_id} is not in the metadata of {bootstrap}")
