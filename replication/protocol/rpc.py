"""Broker-to-broker and broker-to-controller requests over asyncio streams.

One request at a time per connection (requests are serialized by a lock; responses come back
in order). A connection that fails or times out is closed; the next request reconnects.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from replication import protocol as p
from replication.errors import AuthenticationError, BrokerUnreachableError
from replication.security.tls import ssl_reason

if TYPE_CHECKING:
    from replication.security.sasl import SaslClient

MAX_RESPONSE_BYTES = 512 * 1024 * 1024


class AsyncConnection:
    """A connection to another node. With ``ssl_context`` it speaks TLS (the peer's
    certificate checked against ``host``); build it through
    :func:`replication.security.connector.broker_connector`, which gives the node's
    credentials."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str,
        timeout_ms: int = 30_000,
        ssl_context: ssl.SSLContext | None = None,
        authentication_timeout_ms: int = 10_000,
        sasl: Callable[[], SaslClient] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self.timeout_ms = timeout_ms
        self.ssl_context = ssl_context
        self.authentication_timeout_ms = authentication_timeout_ms
        #: a fresh SASL login per connection (SASL_PLAINTEXT, SASL_SSL), or None
        self.sasl = sasl
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self.bytes_sent = 0

    async def request(
        self,
        api_key: p.ApiKey,
        body: Any,
        *,
        version: int | None = None,
        timeout_ms: int | None = None,
    ) -> Any:
        """Send one request and return the decoded response body.

        Raises BrokerUnreachableError if the peer cannot be reached, the connection breaks or
        the response does not arrive within the timeout (the outcome is then unknown).
        """
        version = p.SUPPORTED_VERSIONS[api_key][1] if version is None else version
        timeout = (timeout_ms if timeout_ms is not None else self.timeout_ms) / 1000
        async with self._lock:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
                # cancellation that arrives as the response does, and a fetcher being stopped
                # would then go on fetching (a SIGTERM that never finished)
                async with asyncio.timeout(timeout):
                    return await self._round_trip(api_key, version, body)
            except AuthenticationError:
                self._close()
                raise
            except (OSError, asyncio.IncompleteReadError, TimeoutError) as err:
                self._close()
                reason = (
                    "timed out" if isinstance(err, TimeoutError) else str(err) or type(err).__name__
                )
                raise BrokerUnreachableError(self.host, self.port, reason) from err

    async def _round_trip(self, api_key: p.ApiKey, version: int, body: Any) -> Any:
        if self._writer is None:
            self._reader, self._writer = await self._open()
            if self.sasl is not None:
                try:
                    await self._login(self.sasl())
                except BaseException:
                    self._close()
                    raise
        return await self._exchange(api_key, version, body)

    async def _login(self, client: SaslClient) -> None:
        """SaslHandshake, then SaslAuthenticate rounds until the client is satisfied.

        A refusal is BrokerUnreachableError (with the broker's reason), which every
        inter-broker caller logs and retries: the other side may learn the credentials."""
        handshake = await self._exchange(
            p.ApiKey.SASL_HANDSHAKE, 1, p.SaslHandshakeRequest(mechanism=client.mechanism)
        )
        if handshake.error_code:
            raise BrokerUnreachableError(
                self.host,
                self.port,
                f"SASL mechanism {client.mechanism} refused (error {handshake.error_code}); "
                f"the listener enables {', '.join(handshake.mechanisms)}",
            )
        token: bytes | None = client.first()
        while token is not None:
            answer = await self._exchange(
                p.ApiKey.SASL_AUTHENTICATE, 1, p.SaslAuthenticateRequest(auth_bytes=token)
            )
            if answer.error_code:
                raise BrokerUnreachableError(
                    self.host,
                    self.port,
                    f"SASL authentication failed: {answer.error_message or answer.error_code}",
                )
            try:
                token = client.step(answer.auth_bytes)
            except AuthenticationError as err:
                raise BrokerUnreachableError(self.host, self.port, str(err)) from err

    async def _exchange(self, api_key: p.ApiKey, version: int, body: Any) -> Any:
        reader, writer = self._reader, self._writer  # close() may clear them meanwhile
        assert reader is not None
        assert writer is not None
        header = p.RequestHeader(
            api_key=api_key,
            api_version=version,
            correlation_id=next(self._ids),
            client_id=self.client_id,
        )
        frame = p.encode_request(header, body)
        self.bytes_sent += len(frame)
        writer.write(frame)
        await writer.drain()
        correlation_id, response = p.decode_response(
            await p.read_frame(reader, MAX_RESPONSE_BYTES), api_key, version
        )
        if correlation_id != header.correlation_id:
            raise OSError(
                f"response correlation id {correlation_id} != request {header.correlation_id}"
            )
        return response

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.ssl_context is None:
            return await asyncio.open_connection(self.host, self.port, limit=1 << 20)
        try:
            return await asyncio.open_connection(
                self.host,
                self.port,
                limit=1 << 20,
                ssl=self.ssl_context,
                server_hostname=self.host,
                ssl_handshake_timeout=self.authentication_timeout_ms / 1000,
            )
        except ssl.SSLError as err:
            # BrokerUnreachableError, which every inter-broker caller logs and retries: the
            # other node may come back with a good certificate; the reason says what failed
            raise BrokerUnreachableError(
                self.host,
                self.port,
                f"TLS handshake failed: {ssl_reason(err)} (check ssl.truststore.location, "
                "the certificates' dates and names, and that the listener speaks TLS)",
            ) from err

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def close(self) -> None:
        """Close now; a request in flight fails with BrokerUnreachableError (it is not waited
        for: a long-poll fetch could hold the connection for its whole wait)."""
        self._close()
