"""The broker's security configuration, with Kafka's key names (parsed with the rest of the
broker config: ``BrokerConfig.security``).

Certificates and keys are PEM files (Python's ssl reads PEM; JKS and PKCS12 stores are
refused, naming the openssl command that converts them). Everything defaults to off: every
listener PLAINTEXT, no authorizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from logstore.config import key as k
from logstore.errors import ConfigError

__all__ = ["SECURITY_PROTOCOLS", "SecurityConfig"]

#: Kafka's security protocols, with their wire ids (BrokerRegistration's listeners carry them).
SECURITY_PROTOCOLS: Final = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}


@dataclass(frozen=True)
class SecurityConfig:
    listener_security_protocol_map: str = field(
        default="REPLOG:PLAINTEXT,KAFKA:PLAINTEXT",
        metadata=k(
            "listener.security.protocol.map",
            "security protocol of each listener: NAME:PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL, "
            "comma-separated (REPLOG also carries inter-broker and controller traffic)",
        ),
    )
    # --- TLS -------------------------------------------------------------------------------
    ssl_keystore_location: str = field(
        default="",
        metadata=k(
            "ssl.keystore.location",
            "this node's private key and certificate chain (SSL, SASL_SSL): a PEM file or a "
            "PKCS12 store (ssl.keystore.type)",
        ),
    )
    ssl_keystore_type: str = field(
        default="PEM", metadata=k("ssl.keystore.type", "format of the keystore: PEM or PKCS12")
    )
    ssl_keystore_password: str = field(
        default="",
        repr=False,
        metadata=k(
            "ssl.keystore.password",
            "password of a PKCS12 keystore (empty: ssl.key.password)",
            secret=True,
        ),
    )
    ssl_key_password: str = field(
        default="",
        repr=False,
        metadata=k("ssl.key.password", "password of the private key, if encrypted", secret=True),
    )
    ssl_truststore_location: str = field(
        default="",
        metadata=k(
            "ssl.truststore.location",
            "the CA certificates to trust (peers' and clients' certificates), a PEM file or a "
            "PKCS12 store (ssl.truststore.type); empty: the system's CAs",
        ),
    )
    ssl_truststore_type: str = field(
        default="PEM",
        metadata=k("ssl.truststore.type", "format of the truststore: PEM or PKCS12"),
    )
    ssl_truststore_password: str = field(
        default="",
        repr=False,
        metadata=k("ssl.truststore.password", "password of a PKCS12 truststore", secret=True),
    )
    ssl_client_auth: str = field(
        default="none",
        metadata=k(
            "ssl.client.auth",
            "client certificates on TLS listeners: required, requested or none",
        ),
    )
    ssl_endpoint_identification_algorithm: str = field(
        default="https",
        metadata=k(
            "ssl.endpoint.identification.algorithm",
            "https: check that a peer broker's certificate names its host; empty: do not",
        ),
    )
    ssl_enabled_protocols: str = field(
        default="TLSv1.2,TLSv1.3",
        metadata=k("ssl.enabled.protocols", "TLS versions to accept, comma-separated"),
    )
    ssl_principal_mapping_rules: str = field(
        default="DEFAULT",
        metadata=k(
            "ssl.principal.mapping.rules",
            "rules mapping a client certificate's distinguished name to a user name (KIP-371: "
            "RULE:pattern/replacement/[LU], DEFAULT: the whole name)",
        ),
    )
    # --- SASL ------------------------------------------------------------------------------
    sasl_enabled_mechanisms: str = field(
        default="SCRAM-SHA-256,SCRAM-SHA-512",
        metadata=k(
            "sasl.enabled.mechanisms",
            "SASL mechanisms SASL listeners accept: SCRAM-SHA-256, SCRAM-SHA-512, PLAIN",
        ),
    )
    sasl_mechanism_inter_broker_protocol: str = field(
        default="SCRAM-SHA-512",
        metadata=k(
            "sasl.mechanism.inter.broker.protocol",
            "SASL mechanism this node logs in to other nodes with (followers, the controller)",
        ),
    )
    sasl_jaas_config: str = field(
        default="",
        repr=False,
        metadata=k(
            "sasl.jaas.config",
            "this node's own login to other nodes: "
            'ScramLoginModule required username="broker" password="...";',
            secret=True,
        ),
    )
    sasl_plain_insecure_enable: bool = field(
        default=False,
        metadata=k(
            "sasl.plain.insecure.enable",
            "accept SASL PLAIN on SASL_PLAINTEXT listeners, where the password crosses the "
            "network in the clear (replog only; off: PLAIN only over TLS)",
        ),
    )
    sasl_server_max_receive_size: int = field(
        default=524_288,
        metadata=k(
            "sasl.server.max.receive.size",
            "largest SASL token accepted before authentication (bytes)",
            minimum=1,
        ),
    )
    authentication_timeout_ms: int = field(
        default=10_000,
        metadata=k(
            "authentication.timeout.ms",
            "time a new connection has to finish its TLS handshake and SASL authentication "
            "(replog only)",
            minimum=1,
        ),
    )
    # --- authorization ---------------------------------------------------------------------
    authorizer_class_name: str = field(
        default="",
        metadata=k(
            "authorizer.class.name",
            "the authorizer: org.apache.kafka.metadata.authorizer.StandardAuthorizer (ACLs in "
            "the cluster metadata), or empty for none (everything allowed)",
        ),
    )
    super_users: str = field(
        default="",
        metadata=k(
            "super.users",
            "principals allowed everything, semicolon-separated (User:admin;User:broker)",
        ),
    )
    allow_everyone_if_no_acl_found: bool = field(
        default=False,
        metadata=k(
            "allow.everyone.if.no.acl.found",
            "allow an operation on a resource no ACL names (default: deny)",
        ),
    )

    def listener_protocols(self) -> dict[str, str]:
        """Security protocol by listener name (upper case); a listener not named is
        PLAINTEXT."""
        out: dict[str, str] = {}
        text = self.listener_security_protocol_map
        for entry in (e.strip() for e in text.split(",")):
            if not entry:
                continue
            name, sep, protocol = entry.partition(":")
            protocol = protocol.strip().upper()
            if not sep or protocol not in SECURITY_PROTOCOLS:
                raise ConfigError(
                    f"config listener.security.protocol.map={text!r}: expected comma-separated "
                    f"NAME:PROTOCOL with PROTOCOL one of {', '.join(SECURITY_PROTOCOLS)} "
                    '(e.g. "REPLOG:SASL_SSL,KAFKA:SASL_SSL")'
                )
            out[name.strip().upper()] = protocol
        return out

    def protocol(self, listener: str) -> str:
        """The security protocol of ``listener`` (REPLOG, KAFKA)."""
        return self.listener_protocols().get(listener.upper(), "PLAINTEXT")
