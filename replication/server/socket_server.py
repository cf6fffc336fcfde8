"""The socket server: length-prefixed frames in, responses out, one connection at a time.

As Kafka's SocketServer, requests on one connection are handled in order and their responses
go back in order. Anything wrong with a connection's bytes (a malformed frame, a frame over
``socket.request.max.bytes``, an unknown API or version) closes that connection and nothing
else; a bug in a handler is logged and closes that connection too.

The server is the same for every listener; what a frame means is its
:class:`RequestChannel`'s: replog's own protocol (:class:`ReplogChannel`) or Kafka's
(:class:`replication.kafka.apis.KafkaProtocolApis`).

Security (:class:`ListenerSecurity`) happens here, in each connection's own task, before any
request is read: the TLS handshake on SSL and SASL_SSL listeners (``start_tls`` rather than
``start_server(ssl=...)``, so that a failed handshake is logged with its reason and counts
against the connection's deadline), then on SASL listeners a gate that lets through only
ApiVersions, SaslHandshake and SaslAuthenticate until the client has logged in; both within
authentication.timeout.ms. A refused connection gets one INFO line (peer, listener, reason,
never a secret) and is closed; nothing else is affected. The connection's principal then
goes into :data:`~replication.security.principal.SESSION` for its handlers (ANONYMOUS on
PLAINTEXT listeners, or with TLS and no client certificate).

Client quotas (:mod:`replication.broker.quota_manager`) are applied here too, once any is
set: each request's handling time, a Produce's bytes and a Fetch's records are recorded for
the connection's user and the request's client id, the answer carries the throttle time they
earned, and then the connection is not read for that long (KIP-219's mute).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from logstore.errors import ReplogError
from replication import protocol as p
from replication.broker.purgatory import PARKED
from replication.broker.quota_manager import (
    EXEMPT_APIS,
    FETCH_QUOTA_BYTES,
    QuotaManagers,
    fetched_bytes,
    with_throttle_time,
)
from replication.errors import (
    CorruptFrameError,
    IllegalSaslStateError,
    SaslAuthenticationFailedError,
    UnsupportedSaslMechanismError,
    UnsupportedVersionError,
)
from replication.metrics.requests import RequestMetrics
from replication.security.principal import ANONYMOUS, SESSION, KafkaPrincipal, Session
from replication.security.sasl import SaslServer
from replication.security.tls import PrincipalMapper, peer_principal, ssl_reason
from replication.server.apis import KafkaApis

log = logging.getLogger(__name__)


class RequestChannel(Protocol):
    """What a listener's frames mean: how to read a request, handle it and answer it."""

    def decode(self, frame: bytes) -> Any:
        """The request in a frame; CorruptFrameError or UnsupportedVersionError if none."""

    async def handle(self, request: Any) -> p.Parts | None:
        """The encoded response (length prefix included), or None to send none."""

    async def answer(self, request: Any) -> Any:
        """The response, not yet encoded (:meth:`encode`), or None to send none."""

    def client_id(self, request: Any) -> str:
        """The client id of the request's header ("" if none)."""

    async def unsupported(self, frame: bytes, err: UnsupportedVersionError) -> p.Parts | None:
        """The answer to a request of an API or version not served, or None to close."""

    def describe(self, request: Any) -> str:
        """The request's API, for logs."""

    def request_name(self, request: Any) -> str:
        """Kafka's name of the request's API, for metrics (``FetchFollower`` for a follower's
        Fetch)."""

    def api_key(self, request: Any) -> int:
        """The request's API key (what the SASL gate lets through before authentication)."""

    def api_version(self, request: Any) -> int:
        """The request's version (SaslHandshake v0 is followed by raw SASL tokens)."""

    def sasl_body(self, request: Any) -> Any:
        """A SaslHandshake or SaslAuthenticate request as replog's message
        (:mod:`replication.protocol.security`)."""

    def encode(self, request: Any, response: Any) -> p.Parts:
        """replog's response message to ``request``, encoded at the request's version."""


#: the APIs a SASL listener answers before authentication (with ApiVersions)
SASL_APIS: dict[int, tuple[int, int]] = {
    p.ApiKey.SASL_HANDSHAKE: p.SUPPORTED_VERSIONS[p.ApiKey.SASL_HANDSHAKE],
    p.ApiKey.SASL_AUTHENTICATE: p.SUPPORTED_VERSIONS[p.ApiKey.SASL_AUTHENTICATE],
}


class ReplogChannel:
    """replog's own protocol, handled by :class:`KafkaApis`. On a SASL listener (``sasl``)
    ApiVersions also lists SaslHandshake and SaslAuthenticate, which the socket server's
    gate answers."""

    def __init__(self, apis: KafkaApis, *, sasl: bool = False) -> None:
        self.apis = apis
        self.sasl = sasl

    def decode(self, frame: bytes) -> Any:
        return p.decode_request(frame)

    async def handle(self, request: Any) -> p.Parts | None:
        response = await self.answer(request)
        return None if response is None else self.encode(request, response)

    async def answer(self, request: Any) -> Any:
        header, body = request
        response = await self.apis.handle(header, body)
        if self.sasl and header.api_key == p.ApiKey.API_VERSIONS:
            response = dataclasses.replace(
                response,
                api_keys=[
                    *response.api_keys,
                    *(
                        p.ApiVersionsResponseKey(api_key=int(k), min_version=lo, max_version=hi)
                        for k, (lo, hi) in SASL_APIS.items()
                    ),
                ],
            )
        return response

    def client_id(self, request: Any) -> str:
        return request[0].client_id or ""

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

    def api_key(self, request: Any) -> int:
        return int(request[0].api_key)

    def api_version(self, request: Any) -> int:
        return int(request[0].api_version)

    def sasl_body(self, request: Any) -> Any:
        return request[1]

    def encode(self, request: Any, response: Any) -> p.Parts:
        header = request[0]
        return p.encode_response_parts(
            header.correlation_id, header.api_key, header.api_version, response
        )


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
    #: a fresh SASL server per connection (SASL_PLAINTEXT, SASL_SSL), or None
    sasl: Callable[[], SaslServer] | None = None
    #: largest frame accepted before authentication (sasl.server.max.receive.size)
    sasl_max_receive_size: int = 524_288


class SocketServer:
    def __init__(
        self,
        channel: RequestChannel,
        host: str,
        port: int,
        max_request_bytes: int,
        request_metrics: RequestMetrics | None = None,
        security: ListenerSecurity | None = None,
        quotas: QuotaManagers | None = None,
    ) -> None:
        self.channel = channel
        #: the broker's client quotas (None: none are enforced here, as on a controller)
        self.quotas = quotas
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
            session = await self._authenticate(reader, writer, peer)
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
        if self.security.tls is None:
            return
        try:
            async with asyncio.timeout(TLS_CLOSE_TIMEOUT_S):
                await writer.wait_closed()
        except (TimeoutError, OSError, asyncio.CancelledError):
            writer.transport.abort()

    async def _authenticate(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: object
    ) -> Session | None:
        """The TLS handshake (SSL, SASL_SSL listeners) within authentication.timeout.ms, and
        the session it gives; None (after one INFO line) if the connection is refused."""
        sec = self.security
        host = peer[0] if isinstance(peer, tuple) else str(peer)
        if sec.tls is None and sec.sasl is None:
            return Session(ANONYMOUS, host, sec.listener)
        # one deadline for the TLS handshake and SASL together
        deadline = asyncio.get_running_loop().time() + sec.authentication_timeout_ms / 1000
        principal = ANONYMOUS
        if sec.tls is not None:
            tls_principal = await self._start_tls(writer, peer, deadline)
            if tls_principal is None:
                return None
            principal = tls_principal
        if sec.sasl is not None:
            try:
                async with asyncio.timeout_at(deadline):
                    sasl_principal = await self._sasl(reader, writer, peer, sec.sasl())
            except TimeoutError:
                self._refused(
                    peer,
                    "SASL authentication not done within authentication.timeout.ms="
                    f"{sec.authentication_timeout_ms}",
                )
                return None
            if sasl_principal is None:
                return None
            principal = sasl_principal
        self.successful_authentications += 1
        if self.request_metrics is not None:
            self.request_metrics.authentication(sec.listener, True)
        log.info("Authenticated %s as %s on listener %s", peer, principal, sec.listener)
        return Session(principal, host, sec.listener)

    async def _start_tls(
        self, writer: asyncio.StreamWriter, peer: object, deadline: float
    ) -> KafkaPrincipal | None:
        sec = self.security
        assert sec.tls is not None
        try:
            async with asyncio.timeout_at(deadline):
                await writer.start_tls(sec.tls)
        except TimeoutError:
            self._refused(
                peer,
                f"SSL handshake not done within authentication.timeout.ms="
                f"{sec.authentication_timeout_ms}",
            )
            return None
        except ssl.SSLError as err:
            self._refused(peer, f"SSL handshake failed: {ssl_reason(err)}")
            return None
        except (OSError, EOFError) as err:
            self._refused(peer, f"SSL handshake failed: {err or type(err).__name__}")
            return None
        try:
            return peer_principal(writer.get_extra_info("ssl_object"), sec.mapper)
        except ValueError as err:
            self._refused(peer, str(err))
            return None

    async def _sasl(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: object,
        server: SaslServer,
    ) -> KafkaPrincipal | None:
        """The pre-authentication gate: ApiVersions, SaslHandshake and SaslAuthenticate only,
        in that order, until the server is satisfied. Anything else, any failure, closes the
        connection (after the error answer Kafka's clients expect)."""
        channel = self.channel
        limit = self.security.sasl_max_receive_size
        while True:
            try:
                frame = await p.read_frame(reader, limit)
            except asyncio.IncompleteReadError:
                self._refused(peer, "the client closed the connection during SASL authentication")
                return None
            except CorruptFrameError as err:
                self._refused(
                    peer,
                    "bad frame during SASL authentication (sasl.server.max.receive.size="
                    f"{limit}): {err}",
                )
                return None
            try:
                request = channel.decode(frame)
            except UnsupportedVersionError as err:
                parts = await channel.unsupported(frame, err)
                if parts is None:
                    self._refused(peer, f"during SASL authentication: {err}")
                    return None
                await self._write(writer, parts)
                continue
            except Exception as err:  # noqa: BLE001 - malformed: refused, never "bug:"
                self._refused(peer, f"malformed frame during SASL authentication: {err}")
                return None
            api = channel.api_key(request)
            if api == p.ApiKey.API_VERSIONS:
                parts = await channel.handle(request)
                if parts:
                    await self._write(writer, parts)
                continue
            if api == p.ApiKey.SASL_HANDSHAKE:
                if not await self._sasl_handshake(writer, peer, server, request):
                    return None
                if channel.api_version(request) == 0:
                    return await self._raw_sasl(reader, writer, peer, server)
                continue
            if api == p.ApiKey.SASL_AUTHENTICATE:
                if not await self._sasl_authenticate(writer, peer, server, request):
                    return None
                if server.complete:
                    return server.principal
                continue
            self._refused(
                peer,
                f"ILLEGAL_SASL_STATE: {channel.describe(request)} request before SASL "
                "authentication completed",
            )
            return None

    async def _sasl_handshake(
        self, writer: asyncio.StreamWriter, peer: object, server: SaslServer, request: Any
    ) -> bool:
        channel = self.channel
        mechanism = str(channel.sasl_body(request).mechanism)
        if server.mechanism is not None:
            response = p.SaslHandshakeResponse(
                error_code=IllegalSaslStateError.code, mechanisms=server.mechanisms
            )
            await self._write(writer, channel.encode(request, response))
            self._refused(peer, "ILLEGAL_SASL_STATE: a second SaslHandshake")
            return False
        ok = server.handshake(mechanism)
        code = 0 if ok else UnsupportedSaslMechanismError.code
        response = p.SaslHandshakeResponse(error_code=code, mechanisms=server.mechanisms)
        await self._write(writer, channel.encode(request, response))
        if not ok:
            self._refused(
                peer,
                f"UNSUPPORTED_SASL_MECHANISM: {mechanism[:64]!r} is not enabled "
                f"(enabled: {', '.join(server.mechanisms)})",
            )
        return ok

    async def _sasl_authenticate(
        self, writer: asyncio.StreamWriter, peer: object, server: SaslServer, request: Any
    ) -> bool:
        channel = self.channel
        if server.mechanism is None:
            response = p.SaslAuthenticateResponse(
                error_code=IllegalSaslStateError.code,
                error_message="SaslAuthenticate before SaslHandshake",
            )
            await self._write(writer, channel.encode(request, response))
            self._refused(peer, "ILLEGAL_SASL_STATE: SaslAuthenticate before SaslHandshake")
            return False
        try:
            answer = server.step(bytes(channel.sasl_body(request).auth_bytes))
        except SaslAuthenticationFailedError as err:
            response = p.SaslAuthenticateResponse(
                error_code=SaslAuthenticationFailedError.code, error_message=str(err)
            )
            await self._write(writer, channel.encode(request, response))
            self._refused(peer, str(err))
            return False
        response = p.SaslAuthenticateResponse(auth_bytes=answer)
        await self._write(writer, channel.encode(request, response))
        return True

    async def _raw_sasl(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: object,
        server: SaslServer,
    ) -> KafkaPrincipal | None:
        """After SaslHandshake v0: SASL tokens as bare length-prefixed frames (Kafka's first
        SASL wire format, which librdkafka 2.0 still uses); a failure just closes, as Kafka's
        broker does there."""
        limit = self.security.sasl_max_receive_size
        while True:
            try:
                token = await p.read_frame(reader, limit)
            except asyncio.IncompleteReadError:
                self._refused(peer, "the client closed the connection during SASL authentication")
                return None
            except CorruptFrameError as err:
                self._refused(peer, f"bad SASL token frame: {err}")
                return None
            try:
                answer = server.step(token)
            except SaslAuthenticationFailedError as err:
                self._refused(peer, str(err))
                return None
            await self._write(writer, [struct.pack(">i", len(answer)), answer])
            if server.complete:
                return server.principal

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, parts: p.Parts) -> None:
        writer.writelines(parts)
        await writer.drain()

    def _refused(self, peer: object, reason: str) -> None:
        self.failed_authentications += 1
        if self.request_metrics is not None:
            self.request_metrics.authentication(self.security.listener, False)
        log.info(
            "Failed authentication with %s on listener %s (%s)",
            peer,
            self.security.listener,
            reason,
        )

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
        throttle_ms = 0
        try:
            client = self._quota_client(request)
            if client is None:
                parts = await self.channel.handle(request)
            else:
                parts, throttle_ms = await self._answer_within_quotas(request, len(frame), *client)
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
        if throttle_ms:
            # KIP-219: answered at once, then this connection is not read for the throttle time
            await asyncio.sleep(throttle_ms / 1000)
        return True

    def _quota_client(self, request: Any) -> tuple[str, str] | None:
        """(user, client id) of a request client quotas apply to; None if none apply (no
        quota is set, or the request is a follower's or a broker's)."""
        quotas = self.quotas
        if quotas is None or not quotas.active:
            return None
        if self.channel.api_key(request) in EXEMPT_APIS:
            return None
        if self.channel.request_name(request) == "FetchFollower":
            return None
        session = SESSION.get()
        if session is None or session.internal:
            return None
        return session.principal.name, self.channel.client_id(request)

    async def _answer_within_quotas(
        self, request: Any, size: int, user: str, client_id: str
    ) -> tuple[p.Parts | None, int]:
        """The encoded answer to a request under client quotas, and the throttle time it
        earned (ms): its handling time against the request quota, a Produce's bytes against
        the producer's byte rate, a Fetch's records against the consumer's (the fetch asks
        for no more than one second of that quota)."""
        quotas = self.quotas
        assert quotas is not None
        api = self.channel.api_key(request)
        started = time.perf_counter()
        parked = [0.0]
        parked_token = PARKED.set(parked)
        limit_token = None
        if api == p.ApiKey.FETCH:
            limit = quotas.fetch.max_value_in_window(user, client_id)
            if limit is not None:
                limit_token = FETCH_QUOTA_BYTES.set(max(1, int(limit)))
        try:
            response = await self.channel.answer(request)
        finally:
            PARKED.reset(parked_token)
            if limit_token is not None:
                FETCH_QUOTA_BYTES.reset(limit_token)
        busy = max(0.0, time.perf_counter() - started - parked[0])
        throttle_ms = quotas.request.record(user, client_id, busy)
        if api == p.ApiKey.PRODUCE:
            throttle_ms = max(throttle_ms, quotas.produce.record(user, client_id, size))
        elif api == p.ApiKey.FETCH and response is not None:
            fetched = fetched_bytes(response)
            throttle_ms = max(throttle_ms, quotas.fetch.record(user, client_id, fetched))
        if response is None:
            return None, throttle_ms
        if throttle_ms:
            response = with_throttle_time(response, throttle_ms)
        return self.channel.encode(request, response), throttle_ms
