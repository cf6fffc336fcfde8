"""A real TCP proxy on 127.0.0.1 for fault and wire tests (threads and sockets, no mocks).

    proxy = TcpProxy("127.0.0.1", broker_port).start()
    ... point a client (or a broker's advertised.listeners) at 127.0.0.1:{proxy.port} ...
    proxy.requests          # every request frame seen, client -> server, in arrival order
    proxy.drop_next_response(ApiKey.FETCH)   # the next Fetch response is lost
    proxy.cut_all()         # close every current connection (new ones are still accepted)
    proxy.block()           # cut every connection and close new ones at once, until unblock()
    proxy.pause()           # hold every frame both ways (a stalled network), until resume()
    proxy.stop()

The proxy speaks just enough of the wire protocol to cut it into frames: a 4-byte big-endian
length, then that many bytes. Each request frame is recorded (raw bytes, plus the header and
body when :func:`replication.protocol.decode_request` accepts them) before it is forwarded;
each response frame is matched to its request by correlation id, so a response can be dropped
by the API of its request. A stream that stops looking like frames (a negative or huge length)
is forwarded byte for byte from then on, so malformed-input tests can go through it too.

Every thread is a daemon, every socket has a timeout, and :meth:`TcpProxy.stop` joins them.
"""

from __future__ import annotations

import itertools
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from logstore.errors import ReplogError
from replication import protocol as p

__all__ = ["RecordedRequest", "RecordedResponse", "TcpProxy"]

#: A length prefix above this is not a frame: forward the rest of the stream unparsed.
MAX_FRAME_BYTES = 512 * 1024 * 1024
#: How often blocked socket calls wake up to look at the proxy's state.
POLL_S = 0.2
_I32 = struct.Struct(">i")
_HEADER = struct.Struct(">hhi")  # api_key, api_version, correlation_id


@dataclass(frozen=True)
class RecordedRequest:
    """One request frame as it went from a client to the server."""

    #: Which proxied connection carried it (1, 2, ... in accept order).
    conn_id: int
    #: Position in :attr:`TcpProxy.requests`.
    seq: int
    api_key: int
    api_version: int
    correlation_id: int
    #: Bytes on the wire, length prefix included.
    size: int
    #: The frame after the length prefix, as received.
    raw: bytes = field(repr=False)
    #: ``decode_request(raw)``'s header and body, or None when the frame does not decode.
    header: p.RequestHeader | None = field(default=None, repr=False)
    body: Any = field(default=None, repr=False)
    time: float = 0.0

    @property
    def decoded(self) -> bool:
        return self.body is not None


@dataclass(frozen=True)
class RecordedResponse:
    """One response frame as it came back from the server (forwarded or dropped)."""

    conn_id: int
    #: The API key and version of the request it answers (-1 if no request had its id).
    api_key: int
    api_version: int
    correlation_id: int
    size: int
    raw: bytes = field(repr=False)
    #: True if the proxy closed the connection instead of forwarding it.
    dropped: bool = False
    time: float = 0.0

    def decode(self) -> Any:
        """The response body (``decode_response``)."""
        return p.decode_response(self.raw, self.api_key, self.api_version)[1]


class _Closed(Exception):
    """The connection was closed (by a peer, by the proxy, or by stop())."""


class _Connection:
    """A client socket and its upstream socket, pumped by two threads."""

    def __init__(self, conn_id: int, client: socket.socket, server: socket.socket) -> None:
        self.id = conn_id
        self.client = client
        self.server = server
        self.closed = threading.Event()
        #: correlation id -> (api key, api version) of requests not yet answered
        self.pending: dict[int, tuple[int, int]] = {}
        self._lock = threading.Lock()
        self._pumps_left = 2
        self.threads: list[threading.Thread] = []

    def close(self) -> None:
        """Shut both sockets down (wakes up the pumps); the last pump to exit closes them."""
        self.closed.set()
        for sock in (self.client, self.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def pump_done(self) -> None:
        self.close()
        with self._lock:
            self._pumps_left -= 1
            last = self._pumps_left == 0
        if last:
            self.client.close()
            self.server.close()


class TcpProxy:
    """Forward ``listen_host``:``port`` (127.0.0.1 unless told) to ``target_host``:``target_port``,
    frame by frame."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        listen_port: int = 0,
        *,
        record: bool = True,
        listen_host: str = "127.0.0.1",
    ) -> None:
        """``record=False`` keeps no frames (:attr:`requests` and :attr:`responses` stay
        empty; armed drops still work): for long runs where only the faults matter."""
        self.target = (target_host, target_port)
        self.listen_host = listen_host
        self._record = record
        self._listen_port = listen_port
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._refusing = threading.Event()
        self._lock = threading.Lock()
        self._conn_ids = itertools.count(1)
        self._connections: dict[int, _Connection] = {}
        self._all_threads: list[threading.Thread] = []
        self._requests: list[RecordedRequest] = []
        self._responses: list[RecordedResponse] = []
        self._drop_armed: dict[int, int] = {}  # api key -> responses still to drop
        #: Connections accepted so far.
        self.accepted = 0
        #: Connections the proxy failed to open upstream (the client was closed at once).
        self.upstream_failures = 0

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> TcpProxy:
        assert self._listener is None, "already started"
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.listen_host, self._listen_port))
        listener.listen(64)
        listener.settimeout(POLL_S)
        self._listener = listener
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"proxy-accept-{self.port}", daemon=True
        )
        self._accept_thread.start()
        return self

    @property
    def port(self) -> int:
        assert self._listener is not None, "not started"
        return int(self._listener.getsockname()[1])

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.port}"

    def stop(self, timeout: float = 10) -> None:
        """Stop accepting, close every connection, join every thread."""
        self._stopped.set()
        self._forwarding.set()
        self.cut_all()
        deadline = time.monotonic() + timeout
        if self._accept_thread is not None:
            self._accept_thread.join(max(deadline - time.monotonic(), 0))
        with self._lock:
            threads = list(self._all_threads)
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0))
        if self._listener is not None:
            self._listener.close()
        alive = [t.name for t in threads if t.is_alive()]
        assert not alive, f"proxy threads still running after {timeout}s: {alive}"

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what went through ----------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request frame recorded so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def responses(self) -> list[RecordedResponse]:
        """A snapshot of every response frame seen so far (forwarded or dropped)."""
        with self._lock:
            return list(self._responses)

    @property
    def connection_count(self) -> int:
        """Connections currently open through the proxy."""
        with self._lock:
            return len(self._connections)

    # --- faults -------------------------------------------------------------------------------

    def cut_all(self) -> int:
        """Close every current connection (both sides); returns how many were cut."""
        with self._lock:
            conns = list(self._connections.values())
        for conn in conns:
            conn.close()
        return len(conns)

    def drop_next_response(self, api_key: int = p.ApiKey.FETCH) -> None:
        """Lose the next response to a request of ``api_key``: when it arrives from the server,
        close that client's connection instead of forwarding it."""
        with self._lock:
            self._drop_armed[int(api_key)] = self._drop_armed.get(int(api_key), 0) + 1

    def drop_pending(self, api_key: int = p.ApiKey.FETCH) -> int:
        """How many armed drops of ``api_key`` have not happened yet."""
        with self._lock:
            return self._drop_armed.get(int(api_key), 0)

    def block(self) -> int:
        """Cut every connection, and close each new one as soon as it is accepted, until
        :meth:`unblock` (a network partition that peers notice at once). Returns how many
        connections were cut."""
        self._refusing.set()
        return self.cut_all()

    def unblock(self) -> None:
        self._refusing.clear()

    @property
    def blocked(self) -> bool:
        return self._refusing.is_set()

    @property
    def paused(self) -> bool:
        return not self._forwarding.is_set()

    def pause(self) -> None:
        """Hold every frame (both ways) until :meth:`resume`; connections stay open."""
        self._forwarding.clear()

    def resume(self) -> None:
        self._forwarding.set()

    # --- internals ----------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._refusing.is_set():
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                self.upstream_failures += 1
                client.close()
                continue
            for sock in (client, server):
                sock.settimeout(POLL_S)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(next(self._conn_ids), client, server)
            up = threading.Thread(
                target=self._pump, args=(conn, True), name=f"proxy-{conn.id}-up", daemon=True
            )
            down = threading.Thread(
                target=self._pump, args=(conn, False), name=f"proxy-{conn.id}-down", daemon=True
            )
            conn.threads = [up, down]
            with self._lock:
                if self._stopped.is_set():
                    client.close()
                    server.close()
                    return
                self._connections[conn.id] = conn
                self._all_threads += conn.threads
                self.accepted += 1
            up.start()
            down.start()

    def _recv_exactly(self, conn: _Connection, sock: socket.socket, n: int) -> bytes:
        chunks: list[bytes] = []
        while n:
            if conn.closed.is_set():
                raise _Closed
            try:
                chunk = sock.recv(min(n, 1 << 20))
            except TimeoutError:
                continue
            except OSError as err:
                raise _Closed from err
            if not chunk:
                raise _Closed
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _send(self, conn: _Connection, sock: socket.socket, data: bytes) -> None:
        while not self._forwarding.wait(POLL_S):
            if conn.closed.is_set():
                raise _Closed
        view = memoryview(data)
        while view:
            if conn.closed.is_set():
                raise _Closed
            try:
                sent = sock.send(view)
            except TimeoutError:
                continue
            except OSError as err:
                raise _Closed from err
            view = view[sent:]

    def _pump(self, conn: _Connection, upstream: bool) -> None:
        src, dst = (conn.client, conn.server) if upstream else (conn.server, conn.client)
        try:
            framed = True
            while True:
                if not framed:
                    data = self._recv_exactly_some(conn, src)
                    self._send(conn, dst, data)
                    continue
                prefix = self._recv_exactly(conn, src, 4)
                (size,) = _I32.unpack(prefix)
                if size < 0 or size > MAX_FRAME_BYTES:
                    framed = False
                    self._send(conn, dst, prefix)
                    continue
                frame = self._recv_exactly(conn, src, size)
                if upstream:
                    self._record_request(conn, frame)
                elif self._record_response(conn, frame):
                    return  # dropped: the connection is closed instead
                self._send(conn, dst, prefix + frame)
        except _Closed:
            pass
        finally:
            conn.pump_done()
            with self._lock:
                if conn.closed.is_set():
                    self._connections.pop(conn.id, None)

    def _recv_exactly_some(self, conn: _Connection, sock: socket.socket) -> bytes:
        while True:
            if conn.closed.is_set():
                raise _Closed
            try:
                chunk = sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError as err:
                raise _Closed from err
            if not chunk:
                raise _Closed
            return chunk

    def _record_request(self, conn: _Connection, frame: bytes) -> None:
        api_key = api_version = correlation_id = -1
        if len(frame) >= _HEADER.size:
            api_key, api_version, correlation_id = _HEADER.unpack_from(frame)
        if not self._record:
            with self._lock:
                conn.pending[correlation_id] = (api_key, api_version)
            return
        header: p.RequestHeader | None = None
        body: Any = None
        try:
            header, body = p.decode_request(frame)
        except ReplogError:  # a frame the broker will refuse: recorded undecoded
            header = body = None
        with self._lock:
            conn.pending[correlation_id] = (api_key, api_version)
            self._requests.append(
                RecordedRequest(
                    conn_id=conn.id,
                    seq=len(self._requests),
                    api_key=api_key,
                    api_version=api_version,
                    correlation_id=correlation_id,
                    size=4 + len(frame),
                    raw=frame,
                    header=header,
                    body=body,
                    time=time.monotonic(),
                )
            )

    def _record_response(self, conn: _Connection, frame: bytes) -> bool:
        """Record a response frame; True if it is to be dropped (the connection is closed)."""
        correlation_id = _I32.unpack_from(frame)[0] if len(frame) >= 4 else -1
        with self._lock:
            api_key, api_version = conn.pending.pop(correlation_id, (-1, -1))
            drop = self._drop_armed.get(api_key, 0) > 0
            if drop:
                self._drop_armed[api_key] -= 1
            if self._record:
                self._responses.append(
                    RecordedResponse(
                        conn_id=conn.id,
                        api_key=api_key,
                        api_version=api_version,
                        correlation_id=correlation_id,
                        size=4 + len(frame),
                        raw=frame,
                        dropped=drop,
                        time=time.monotonic(),
                    )
                )
        if drop:
            conn.close()
        return drop
