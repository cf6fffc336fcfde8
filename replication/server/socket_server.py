"""The socket server: length-prefixed frames in, responses out, one connection at a time.

As Kafka's SocketServer, requests on one connection are handled in order and their responses
go back in order. Anything wrong with a connection's bytes (a malformed frame, a frame over
``socket.request.max.bytes``, an unknown API or version) closes that connection and nothing
else; a bug in a handler is logged and closes that connection too.

The server is the same for every listener; what a frame means is its
:class:`RequestChannel`'s: replog's own protocol (:class:`ReplogChannel`) or Kafka's
(:class:`replication.kafka.apis.KafkaProtocolApis`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
import time
from dataclasses import dataclass
from typing import Any, Protocol

from logstore.errors import ReplogError
from replication import protocol as p
from replication.errors import CorruptFrameError, UnsupportedVersionError
from replication.metrics.requests import RequestMetrics
from replication.security.principal import ANONYMOUS, SESSION, Session
from replication.security.tls import PrincipalMapper, peer_principal, ssl_reason
from replication.server.apis import KafkaApis

log = logging.getLogger(__name__)


class RequestChannel(Protocol):
    """What a listener's frames mean: how to read a request, handle it and answer it."""

    def decode(self, frame: bytes) -> Any:
        """The request in a frame; CorruptFrameError or UnsupportedVersionError if none."""

    async def handle(self, request: Any) -> p.Parts | None:
        """The encoded response (length prefix included), or None to send none."""

    async def unsupported(self, frame: bytes, err: UnsupportedVersionError) -> p.Parts | None:
        """The answer to a request of an API or version not served, or None to close."""

    def describe(self, request: Any) -> str:
        """The request's API, for logs."""

    def request_name(self, request: Any) -> str:
        """Kafka's name of the request's API, for metrics (``FetchFollower`` for a follower's
        Fetch)."""


class ReplogChannel:
    """replog's own protocol, handled by :class:`KafkaApis`."""

    def __init__(self, apis: KafkaApis) -> None:
        self.apis = apis

    def decode(self, frame: bytes) -> Any:
        return p.decode_request(frame)

    async def handle(self, request: Any) -> p.Parts | None:
        header, body = request
        response = await self.apis.handle(header, body)
        if response is None:
            return None
        return p.encode_response_parts(
            header.correlation_id, header.api_key, header.api_version, response
        )

    async def unsupported(self, frame: bytes, err: UnsupportedVersionError) -> p.Parts | None:
        """ApiVersions of an unknown version gets UNSUPPORTED_VERSION at v0 (as Kafka); any
        other unknown API or version closes the connection."""
        try:
            header, _ = p.decode_request_header(frame)
        except CorruptFrameError:
            return None
        if header.api_key != p.ApiKey.API_VERSIONS:
            return None
        versions = dataclasses.replace(
            await self.apis.handle_api_versions(header, None),
            error_code=UnsupportedVersionError.code,
        )
        return p.encode_response_parts(header.correlation_id, p.ApiKey.API_VERSIONS, 0, versions)

    def describe(self, request: Any) -> str:
        return p.ApiKey(request[0].api_key).name

    def request_name(self, request: Any) -> str:
        header, body = request
        if header.api_key == p.ApiKey.FETCH and body.replica_id >= 0:
            return "FetchFollower"
        return p.ApiKey(header.api_key).kafka_name


#: how long closing a TLS connection waits for the peer's close_notify before aborting it (a
#: silent peer must not hold a connection task, and so stop(), for ssl_shutdown_timeout)
TLS_CLOSE_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class ListenerSecurity:
    """How a listener authenticates its connections: its name and security protocol, the TLS
    context (SSL, SASL_SSL), the mapping of client certificates to principals, and the one
    deadline for the TLS handshake and SASL authentication (authentication.timeout.ms)."""

    listener: str = "REPLOG"
    protocol: str = "PLAINTEXT"
    tls: ssl.SSLContext | None = None
    mapper: PrincipalMapper = dataclasses.field(default_factory=PrincipalMapper)
    authentication_timeout_ms: int = 10_000


class SocketServer:
    def __init__(
        self,
        channel: RequestChannel,
        host: str,
        port: int,
        max_request_bytes: int,
        request_metrics: RequestMetrics | None = None,
        security: ListenerSecurity | None = None,
    ) -> None:
        self.channel = channel
        self.security = security or ListenerSecurity()
        #: connections refused by TLS or SASL
        self.failed_authentications = 0
        self.successful_authentications = 0
        #: counts and times every handled request (None: metrics are off)
        self.request_metrics = request_metrics
        self.host = host
        self.port = port
        self.max_request_bytes = max_request_bytes
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self.connections_closed_for_errors = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=1 << 20)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        try:
            session = await self._authenticate(writer, peer)
            if session is None:
                return
            # this task's own context (start_server copied the one current at start())
            SESSION.set(session)
            while True:
                try:
                    frame = await p.read_frame(reader, self.max_request_bytes)
                except asyncio.IncompleteReadError:
                    return  # the client went away
                except CorruptFrameError as err:
                    self.connections_closed_for_errors += 1
                    log.warning("closing connection from %s: %s", peer, err)
                    return
                if not await self._handle_frame(frame, writer, peer):
                    return
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            self._connections.discard(task)
            await self._close(writer)

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        """Close; a TLS connection waits a moment for close_notify, then is aborted (a peer
        that never answers must not keep it open)."""
        writer.close()
        if writer.get_extra_info("ssl_object") is None and self.security.tls is None:
            return
        try:
            async with asyncio.timeout(TLS_CLOSE_TIMEOUT_S):
                await writer.wait_closed()
        except (TimeoutError, OSError, asyncio.CancelledError):
            writer.transport.abort()

    async def _authenticate(self, writer: asyncio.StreamWriter, peer: object) -> Session | None:
        """The TLS handshake (SSL, SASL_SSL listeners) within authentication.timeout.ms, and
        the session it gives; None (after one INFO line) if the connection is refused."""
        sec = self.security
        host = peer[0] if isinstance(peer, tuple) else str(peer)
        if sec.tls is None:
            return Session(ANONYMOUS, host, sec.listener)
        try:
            async with asyncio.timeout(sec.authentication_timeout_ms / 1000):
                await writer.start_tls(sec.tls)
        except TimeoutError:
            return self._refused(
                peer,
                f"SSL handshake not done within authentication.timeout.ms="
                f"{sec.authentication_timeout_ms}",
            )
        except ssl.SSLError as err:
            return self._refused(peer, f"SSL handshake failed: {ssl_reason(err)}")
        except (OSError, EOFError) as err:
            return self._refused(peer, f"SSL handshake failed: {err or type(err).__name__}")
        try:
            principal = peer_principal(writer.get_extra_info("ssl_object"), sec.mapper)
        except ValueError as err:
            return self._refused(peer, str(err))
        self.successful_authentications += 1
        log.info("Authenticated %s as %s on listener %s", peer, principal, sec.listener)
        return Session(principal, host, sec.listener)

    def _refused(self, peer: object, reason: str) -> Session | None:
        self.failed_authentications += 1
        log.info(
            "Failed authentication with %s on listener %s (%s)",
            peer,
            self.security.listener,
            reason,
        )
        return None

    async def _handle_frame(self, frame: bytes, writer: asyncio.StreamWriter, peer: object) -> bool:
        """Handle one request; False closes the connection."""
        try:
            request = self.channel.decode(frame)
        except UnsupportedVersionError as err:
            parts = await self.channel.unsupported(frame, err)
            if parts is None:
                self.connections_closed_for_errors += 1
                log.warning("closing connection from %s: %s", peer, err)
                return False
            writer.writelines(parts)
            await writer.drain()
            return True
        except CorruptFrameError as err:
            self.connections_closed_for_errors += 1
            log.warning("closing connection from %s: %s", peer, err)
            return False
        except Exception:
            self.connections_closed_for_errors += 1
            log.exception("bug: a frame from %s failed to decode; closing that connection", peer)
            return False
        started = time.perf_counter()
        try:
            parts = await self.channel.handle(request)
        except ReplogError as err:
            self.connections_closed_for_errors += 1
            log.warning("closing connection from %s: %s", peer, err)
            return False
        except Exception:
            self.connections_closed_for_errors += 1
            log.exception(
                "bug: %s request from %s failed; closing that connection",
                self.channel.describe(request),
                peer,
            )
            return False
        if parts:
            writer.writelines(parts)
            await writer.drain()
        if self.request_metrics is not None:
            self.request_metrics.observe(
                self.channel.request_name(request), time.perf_counter() - started
            )
        return True
