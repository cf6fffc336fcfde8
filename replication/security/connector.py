"""The one place a node's connections to other nodes are made, with the node's credentials.

Followers, the broker lifecycle (registration, heartbeats, AlterPartition), a standby
controller's ping and the transaction coordinator's markers all connect through
:func:`broker_connector`: REPLOG's security protocol is the inter-broker protocol, so each
connection gets the TLS context (and, on SASL listeners, the login) the node's config names.
No inter-broker connection is made any other way (tests/test_security_tls.py checks).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from logstore.errors import ConfigError
from replication.protocol.rpc import AsyncConnection
from replication.security.config import SECURITY_PROTOCOLS
from replication.security.sasl import (
    PLAIN,
    SaslClient,
    client_login,
    parse_jaas_config,
    plain_allowed,
)
from replication.security.tls import broker_client_context, client_context

if TYPE_CHECKING:
    from replication.client.config import ClientConfig
    from replication.config import BrokerConfig

__all__ = [
    "Connector",
    "broker_connector",
    "broker_login",
    "client_login_factory",
    "client_ssl_context",
    "plaintext_connector",
]

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
    sasl = broker_login(config) if protocol.startswith("SASL_") else None

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
            sasl=sasl,
        )

    return connect


def broker_login(config: BrokerConfig) -> Callable[[], SaslClient]:
    """This node's SASL login to other nodes (sasl.jaas.config with
    sasl.mechanism.inter.broker.protocol); ConfigError, at startup, if it has none."""
    sec = config.security
    protocol = sec.protocol(INTER_BROKER_LISTENER)
    mechanism = sec.sasl_mechanism_inter_broker_protocol.strip().upper()
    if not sec.sasl_jaas_config:
        raise ConfigError(
            f"config sasl.jaas.config is empty, but listener.security.protocol.map makes the "
            f"REPLOG listener (inter-broker and controller traffic) {protocol}: give this node's "
            "login, e.g. org.apache.kafka.common.security.scram.ScramLoginModule required "
            'username="broker" password="...";'
        )
    kind, login = parse_jaas_config(sec.sasl_jaas_config)
    if (kind == PLAIN) != (mechanism == PLAIN):
        raise ConfigError(
            f"config sasl.mechanism.inter.broker.protocol={mechanism} does not match the login "
            f"module of sasl.jaas.config ({kind} login module)"
        )
    if not plain_allowed(mechanism, protocol, sec.sasl_plain_insecure_enable):
        raise ConfigError(
            "config sasl.mechanism.inter.broker.protocol=PLAIN on a SASL_PLAINTEXT REPLOG listener "
            "sends the password in the clear: use SASL_SSL, a SCRAM mechanism, or set "
            "sasl.plain.insecure.enable=true"
        )
    SaslClient(mechanism, login)  # checks the mechanism now
    return lambda: SaslClient(mechanism, login)


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


def client_login_factory(config: ClientConfig) -> Callable[[], SaslClient] | None:
    """A fresh SASL login per connection for SASL_PLAINTEXT and SASL_SSL clients, or None."""
    protocol = client_protocol(config)
    if not protocol.startswith("SASL_"):
        return None
    mechanism = config.sasl_mechanism.strip().upper()
    if not plain_allowed(mechanism, protocol, config.sasl_plain_insecure_enable):
        raise ConfigError(
            "config sasl.mechanism=PLAIN with security.protocol=SASL_PLAINTEXT sends the "
            "password in the clear: use SASL_SSL or a SCRAM mechanism, or set "
            "sasl.plain.insecure.enable=true"
        )
    login = client_login(config.sasl_jaas_config, config.sasl_username, config.sasl_password)
    SaslClient(mechanism, login)  # checks the mechanism now
    return lambda: SaslClient(mechanism, login)


def client_principal(config: ClientConfig) -> str:
    """Who the brokers take this client for, as a principal, for messages: ``User:<name>``
    of its SASL login, the subject of its certificate (mutual TLS), or ``User:ANONYMOUS``."""
    protocol = client_protocol(config)
    if protocol.startswith("SASL_"):
        try:
            login = client_login(
                config.sasl_jaas_config, config.sasl_username, config.sasl_password
            )
        except ConfigError:
            return "this client's SASL user"
        return f"User:{login.username}"
    if protocol == "SSL" and config.ssl_keystore_location:
        return "the principal of this client's certificate"
    return "User:ANONYMOUS"
