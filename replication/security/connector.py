"""The one place a node's connections to other nodes are made, with the node's credentials.

Followers, the broker lifecycle (registration, heartbeats, AlterPartition), a standby
controller's ping and the transaction coordinator's markers all connect through
:func:`broker_connector`: REPLOG's security protocol is the inter-broker protocol, so each
connection gets the TLS context (and, on SASL listeners, the login) the node's config names.
No inter-broker connection is made any other way (tests/test_security_tls.py checks).
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Protocol

from logstore.errors import ConfigError
from replication.protocol.rpc import AsyncConnection
from replication.security.config import SECURITY_PROTOCOLS
from replication.security.tls import broker_client_context, client_context

if TYPE_CHECKING:
    from replication.client.config import ClientConfig
    from replication.config import BrokerConfig

__all__ = ["Connector", "broker_connector", "client_ssl_context", "plaintext_connector"]

#: the listener other nodes are reached on (inter-broker and controller traffic)
INTER_BROKER_LISTENER = "REPLOG"


class Connector(Protocol):
    def __call__(
        self, host: str, port: int, *, client_id: str, timeout_ms: int = 30_000
    ) -> AsyncConnection: ...


def plaintext_connector(
    host: str, port: int, *, client_id: str, timeout_ms: int = 30_000
) -> AsyncConnection:
    """A PLAINTEXT connection (a cluster without security; tests of single components)."""
    return AsyncConnection(host, port, client_id=client_id, timeout_ms=timeout_ms)


def broker_connector(config: BrokerConfig) -> Connector:
    """How this node connects to other nodes: per the REPLOG listener's security protocol.

    The TLS context is built once (a bad keystore fails at startup, naming the key)."""
    sec = config.security
    protocol = sec.protocol(INTER_BROKER_LISTENER)
    context: ssl.SSLContext | None = None
    if protocol in ("SSL", "SASL_SSL"):
        context = broker_client_context(sec)
    if protocol == "PLAINTEXT":
        return plaintext_connector
    timeout = sec.authentication_timeout_ms

    def connect(
        host: str, port: int, *, client_id: str, timeout_ms: int = 30_000
    ) -> AsyncConnection:
        return AsyncConnection(
            host,
            port,
            client_id=client_id,
            timeout_ms=timeout_ms,
            ssl_context=context,
            authentication_timeout_ms=timeout,
        )

    return connect


def client_protocol(config: ClientConfig) -> str:
    """The client's security.protocol, checked."""
    protocol = config.security_protocol.strip().upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise ConfigError(
            f"config security.protocol={config.security_protocol!r}: use one of "
            f"{', '.join(SECURITY_PROTOCOLS)} (the broker listener's protocol)"
        )
    return protocol


def client_ssl_context(config: ClientConfig) -> ssl.SSLContext | None:
    """The TLS context of a client's connections, or None for PLAINTEXT and SASL_PLAINTEXT."""
    if client_protocol(config) in ("SSL", "SASL_SSL"):
        return client_context(config)
    return None
