"""Messages of SASL authentication: SaslHandshake (17) and SaslAuthenticate (36), with Kafka's
field names (the Kafka listener translates kio's to these by name).

A client sends SaslHandshake (the mechanism), then SaslAuthenticate rounds carrying the
mechanism's own messages (SCRAM's client-first, client-final; PLAIN's one message) until the
broker answers with no error and no further challenge. Only ApiVersions may come before."""

from __future__ import annotations

from dataclasses import field

from replication.protocol.codec import (
    BYTES,
    INT16,
    INT64,
    NULLABLE_STRING,
    STRING,
    array_field,
    message,
    wire,
)

__all__ = [
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "SaslHandshakeRequest",
    "SaslHandshakeResponse",
]


# --- SaslHandshake (17) ------------------------------------------------------------------------


@message
class SaslHandshakeRequest:
    """The mechanism the client wants (SCRAM-SHA-256, SCRAM-SHA-512, PLAIN)."""

    mechanism: str = field(metadata=wire(STRING))


@message
class SaslHandshakeResponse:
    """UNSUPPORTED_SASL_MECHANISM unless enabled; the enabled mechanisms either way."""

    error_code: int = field(default=0, metadata=wire(INT16))
    mechanisms: list[str] = array_field(STRING)


# --- SaslAuthenticate (36) ---------------------------------------------------------------------


@message
class SaslAuthenticateRequest:
    auth_bytes: bytes = field(metadata=wire(BYTES))


@message
class SaslAuthenticateResponse:
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    auth_bytes: bytes = field(default=b"", metadata=wire(BYTES))
    session_lifetime_ms: int = field(default=0, metadata=wire(INT64, since=1))
