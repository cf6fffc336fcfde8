"""One blocking TCP connection to one broker, safe to share between threads.

A :class:`BrokerConnection` connects lazily on the first request, checks the broker's API
versions (ApiVersions) right after connecting, and then carries one request at a time: a lock
serialises callers, so a response always belongs to the request just sent (the correlation id
is checked anyway). Any failure closes the socket; the next request reconnects.

Failures become errors of the one tree:

- the broker cannot be reached (refused, no route, connect timeout): BrokerUnreachableError
- the connection broke mid-request: NetworkError (retriable; the outcome is unknown)
- no response within the timeout: RequestTimedOutError (retriable; the outcome is unknown)
- the broker does not speak the API version: UnsupportedVersionError
- garbage on the wire: CorruptFrameError

Error codes inside a response are left to the callers that own their meaning, except a
client quota's ``throttle_time_ms`` (KIP-219): after a response that carries one, the next
request to that broker waits it out, as the broker does not read the connection meanwhile.
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from replication.errors import (
    BrokerUnreachableError,
    CorruptFrameError,
    FrameTooLargeError,
    IllegalSaslStateError,
    InvalidFrameLengthError,
    NetworkError,
    RequestTimedOutError,
    SslAuthenticationError,
    UnsupportedVersionError,
    raise_for_code,
)
from replication.protocol import (
    SUPPORTED_VERSIONS,
    ApiKey,
    ApiVersionsRequest,
    ApiVersionsResponse,
    RequestHeader,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
    decode_response,
    encode_request,
)
from replication.security.tls import ssl_reason

if TYPE_CHECKING:
    from replication.security.sasl import SaslClient

__all__ = ["BrokerConnection"]

log = logging.getLogger(__name__)

_SIZE: Final = struct.Struct(">i")
_UNSUPPORTED_VERSION: Final = UnsupportedVersionError.code
_INT32_MAX: Final = 2**31 - 1
#: Default bound on a response frame; fetch responses are bounded by fetch.max.bytes anyway.
DEFAULT_MAX_RESPONSE_BYTES: Final = 1024 * 1024 * 1024


def _api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"API {api_key}"


class BrokerConnection:
    """A blocking, thread-safe connection to the broker at ``host:port``.

    Examples
    --------
    >>> conn = BrokerConnection("127.0.0.1", 9092, "me", 30_000)  # doctest: +SKIP
    >>> conn.send(ApiKey.METADATA, 1, MetadataRequest(topics=None))  # doctest: +SKIP
    MetadataResponse(...)
    """

    def __init__(
        self,
        host: str,
        port: int,
        client_id: str,
        request_timeout_ms: int,
        *,
        connect_timeout_ms: int = 10_000,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        ssl_context: ssl.SSLContext | None = None,
        sasl: Callable[[], SaslClient] | None = None,
    ) -> None:
        #: a fresh SASL login per connection (SASL_PLAINTEXT, SASL_SSL), or None
        self.sasl = sasl
        #: TLS (security.protocol SSL, SASL_SSL): the broker's certificate is checked
        #: against ``host``
        self.ssl_context = ssl_context
        self.host = host
        self.port = port
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        self.max_response_bytes = max_response_bytes
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._next_correlation_id = 0
        self._closed = False
        #: api key -> (min, max) version the broker speaks; filled on connect.
        self.api_versions: dict[int, tuple[int, int]] = {}
        #: a client quota's throttle (KIP-219): no request before this time.monotonic()
        self._throttled_until = 0.0
        #: the throttle times the broker asked for, in all (ms), and how many requests waited
        self.throttle_time_ms_total = 0
        self.throttled_requests = 0
        self._closing = threading.Event()

    def __repr__(self) -> str:
        state = "connected" if self._sock is not None else "idle"
        return f"BrokerConnection({self.host}:{self.port}, {state})"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connected(self) -> bool:
        return self._sock is not None

    # --- public API ---------------------------------------------------------------------------

    def send(
        self,
        api_key: int,
        version: int,
        request_body: object,
        *,
        timeout_ms: int | None = None,
        expect_response: bool = True,
    ) -> Any:
        """Send one request and return the decoded response body.

        ``timeout_ms`` (default request.timeout.ms) bounds the wait for the response; a Fetch
        that long-polls should pass request.timeout.ms + max_wait_ms. With
        ``expect_response=False`` (Produce with acks=0) nothing is read and None is returned.
        """
        timeout_s = (self.request_timeout_ms if timeout_ms is None else timeout_ms) / 1000
        delay = self._throttled_until - time.monotonic()
        if delay > 0:
            self.throttled_requests += 1
            self._closing.wait(delay)
        with self._lock:
            if self._closed:
                raise NetworkError(f"connection to broker {self.address} was closed by the client")
            sock = self._connect()
            self.check_version(api_key, version)
            response = self._round_trip(
                sock, api_key, version, request_body, timeout_s, expect_response
            )
            throttle_ms = getattr(response, "throttle_time_ms", 0)
            if throttle_ms > 0:
                self.throttle_time_ms_total += throttle_ms
                self._throttled_until = time.monotonic() + throttle_ms / 1000
            return response

    def max_version(self, api_key: int, wanted: int | None = None) -> int:
        """The highest version of ``api_key`` both sides speak, at most ``wanted``.

        Connects first if needed (the broker's versions come with the connection).
        """
        ours_min, ours_max = SUPPORTED_VERSIONS[ApiKey(api_key)]
        if wanted is not None:
            ours_max = min(ours_max, wanted)
        with self._lock:
            self._connect()
            theirs = self.api_versions.get(api_key)
        if theirs is None:
            raise UnsupportedVersionError(
                f"broker {self.address} does not support {_api_name(api_key)}; "
                "upgrade the broker or use a client that does not need it"
            )
        version = min(ours_max, theirs[1])
        if version < max(ours_min, theirs[0]):
            raise UnsupportedVersionError(
                f"broker {self.address} speaks {_api_name(api_key)} versions "
                f"{theirs[0]}-{theirs[1]}, this client speaks {ours_min}-{ours_max}: "
                "upgrade the older side"
            )
        return version

    def check_version(self, api_key: int, version: int) -> None:
        """UnsupportedVersionError unless the (connected) broker speaks ``version`` of the API."""
        if not self.api_versions:
            return  # not connected yet, or the broker is ApiVersions-less: let it answer
        theirs = self.api_versions.get(api_key)
        if theirs is None:
            raise UnsupportedVersionError(
                f"broker {self.address} does not support {_api_name(api_key)}; "
                "upgrade the broker or use a client that does not need it"
            )
        if not theirs[0] <= version <= theirs[1]:
            raise UnsupportedVersionError(
                f"broker {self.address} speaks {_api_name(api_key)} versions "
                f"{theirs[0]}-{theirs[1]}, not {version}: upgrade the older side"
            )

    def close(self) -> None:
        """Close the socket; the connection cannot be used afterwards."""
        self._closing.set()
        with self._lock:
            self._closed = True
            self._disconnect()

    def disconnect(self) -> None:
        """Close the socket; the next request reconnects."""
        with self._lock:
            self._disconnect()

    # --- internals (called with the lock held) -----------------------------------------------

    def _disconnect(self) -> None:
        sock, self._sock = self._sock, None
        self.api_versions = {}
        if sock is not None:
            try:
                sock.close()
            except OSError as err:
                log.debug("closing connection to %s: %s", self.address, err)

    def _connect(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        try:
            sock = socket.create_connection(
                (self.host, self.port), timeout=self.connect_timeout_ms / 1000
            )
        except TimeoutError as err:
            raise BrokerUnreachableError(
                self.host, self.port, f"no connection within {self.connect_timeout_ms} ms"
            ) from err
        except OSError as err:
            raise BrokerUnreachableError(self.host, self.port, err.strerror or str(err)) from err
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if self.ssl_context is not None:
            sock = self._wrap(sock, self.ssl_context)
        self._sock = sock
        try:
            self._negotiate(sock)
            if self.sasl is not None:
                self._login(sock, self.sasl())
        except BaseException:
            self._disconnect()
            raise
        log.debug("connected to broker %s", self.address)
        return sock

    def _wrap(self, sock: socket.socket, context: ssl.SSLContext) -> socket.socket:
        """The TLS handshake (within the connect timeout); SslAuthenticationError, which is
        not retried, names the broker and what failed."""
        try:
            return context.wrap_socket(sock, server_hostname=self.host)
        except ssl.SSLError as err:
            sock.close()
            raise SslAuthenticationError(
                f"TLS handshake with broker {self.address} failed: {ssl_reason(err)}; check "
                "ssl.truststore.location (the CA that signed the broker's certificate), the "
                "certificates' dates and names, and that the listener speaks TLS "
                "(security.protocol)"
            ) from err
        except TimeoutError as err:
            sock.close()
            raise BrokerUnreachableError(
                self.host, self.port, f"no TLS handshake within {self.connect_timeout_ms} ms"
            ) from err
        except OSError as err:
            sock.close()
            raise SslAuthenticationError(
                f"TLS handshake with broker {self.address} failed: {err.strerror or err}; "
                "the broker closed the connection (does the listener speak TLS? is a client "
                "certificate required: ssl.keystore.location?)"
            ) from err

    def _login(self, sock: socket.socket, client: SaslClient) -> None:
        """SaslHandshake v1, then SaslAuthenticate rounds (Kafka's order, after ApiVersions).

        The broker's refusal is raised with its message (SaslAuthenticationFailedError,
        UnsupportedSaslMechanismError, ...), none of them retried: a password does not become
        right by trying again."""
        timeout_s = self.request_timeout_ms / 1000
        if self.api_versions and ApiKey.SASL_HANDSHAKE not in self.api_versions:
            raise IllegalSaslStateError(
                f"broker {self.address} offers no SASL on this listener (this client logs in "
                f"with {client.mechanism}): check security.protocol against the listener's "
                "protocol (the broker's listener.security.protocol.map)"
            )
        self.check_version(ApiKey.SASL_HANDSHAKE, 1)
        handshake: SaslHandshakeResponse = self._round_trip(
            sock,
            ApiKey.SASL_HANDSHAKE,
            1,
            SaslHandshakeRequest(mechanism=client.mechanism),
            timeout_s,
            True,
        )
        if handshake.error_code:
            raise_for_code(
                handshake.error_code,
                f"broker {self.address} refused SASL mechanism {client.mechanism}; it enables "
                f"{', '.join(handshake.mechanisms) or 'none'} (sasl.mechanism)",
            )
        theirs = self.api_versions.get(ApiKey.SASL_AUTHENTICATE, (0, 0))
        version = min(theirs[1], SUPPORTED_VERSIONS[ApiKey.SASL_AUTHENTICATE][1])
        token: bytes | None = client.first()
        while token is not None:
            answer: SaslAuthenticateResponse = self._round_trip(
                sock,
                ApiKey.SASL_AUTHENTICATE,
                version,
                SaslAuthenticateRequest(auth_bytes=token),
                timeout_s,
                True,
            )
            if answer.error_code:
                # the user logging in is named (the client's own setting, never the
                # password): a job with several logins shows which one was refused
                reason = answer.error_message or "SASL authentication failed"
                raise_for_code(
                    answer.error_code,
                    f"broker {self.address}: {reason} (SASL authentication as "
                    f"User:{client.login.username})",
                )
            token = client.step(answer.auth_bytes)

    def _negotiate(self, sock: socket.socket) -> None:
        """ApiVersions: learn the broker's versions (retrying at its version if it asks)."""
        timeout_s = self.request_timeout_ms / 1000
        version = SUPPORTED_VERSIONS[ApiKey.API_VERSIONS][1]
        response: ApiVersionsResponse = self._round_trip(
            sock, ApiKey.API_VERSIONS, version, ApiVersionsRequest(), timeout_s, True
        )
        if response.error_code == _UNSUPPORTED_VERSION:
            # As Kafka's clients: the broker lists the ApiVersions versions it speaks; retry.
            theirs = {k.api_key: k.max_version for k in response.api_keys}
            retry = min(theirs.get(ApiKey.API_VERSIONS, 0), version)
            if retry == version:
                raise UnsupportedVersionError(
                    f"broker {self.address} refused ApiVersions v{version} without naming a "
                    "version it speaks; upgrade the older side"
                )
            response = self._round_trip(
                sock, ApiKey.API_VERSIONS, retry, ApiVersionsRequest(), timeout_s, True
            )
        if response.error_code:
            try:
                raise_for_code(response.error_code)
            except UnsupportedVersionError as err:
                raise UnsupportedVersionError(
                    f"broker {self.address} does not speak this client's ApiVersions; "
                    "upgrade the older side"
                ) from err
        self.api_versions = {
            int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys
        }

    def _round_trip(
        self,
        sock: socket.socket,
        api_key: int,
        version: int,
        body: object,
        timeout_s: float,
        expect_response: bool,
    ) -> Any:
        self._next_correlation_id = (self._next_correlation_id + 1) & _INT32_MAX
        correlation_id = self._next_correlation_id
        header = RequestHeader(
            api_key=api_key,
            api_version=version,
            correlation_id=correlation_id,
            client_id=self.client_id,
        )
        frame = encode_request(header, body)  # encoding errors leave the connection intact
        name = _api_name(api_key)
        deadline = time.monotonic() + timeout_s
        try:
            sock.settimeout(timeout_s)
            sock.sendall(frame)
            if not expect_response:
                return None
            (size,) = _SIZE.unpack(self._recv_exactly(sock, 4, deadline))
            if size < 0:
                raise InvalidFrameLengthError(
                    f"broker {self.address} sent a frame of negative length {size}"
                )
            if size > self.max_response_bytes:
                raise FrameTooLargeError(
                    f"broker {self.address} sent a {name} response of {size} bytes, over the "
                    f"limit of {self.max_response_bytes}; lower fetch.max.bytes"
                )
            payload = self._recv_exactly(sock, size, deadline)
            got, response = decode_response(payload, api_key, version)
            self._check_correlation_id(got, correlation_id, name)
            return response
        except TimeoutError as err:
            self._disconnect()
            raise RequestTimedOutError(
                f"no {name} response from broker {self.address} within "
                f"{timeout_s * 1000:.0f} ms (request.timeout.ms); the connection was closed and "
                "the outcome of the request is unknown"
            ) from err
        except CorruptFrameError:
            self._disconnect()
            raise
        except OSError as err:
            self._disconnect()
            raise NetworkError(
                f"connection to broker {self.address} failed during a {name} request: "
                f"{err.strerror or err}; the outcome of the request is unknown"
            ) from err

    def _check_correlation_id(self, got: int, expected: int, name: str) -> None:
        if got != expected:
            raise CorruptFrameError(
                f"broker {self.address} answered correlation id {got} to {name} request {expected}"
            )

    @staticmethod
    def _recv_exactly(sock: socket.socket, n: int, deadline: float) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("timed out")
            sock.settimeout(remaining)
            chunk = sock.recv_into(view[got:], n - got)
            if chunk == 0:
                raise ConnectionResetError(
                    0, "the broker closed the connection" + (" mid-frame" if got else "")
                )
            got += chunk
        view.release()
        return buf
