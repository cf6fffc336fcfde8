"""Throwaway TLS material and SASL users for security tests, made with ``cryptography`` and
``scramp`` (no openssl subprocess): a CA, broker certificates (SAN 127.0.0.1 and localhost), a
client certificate (CN=alice), an expired one and one from a CA nobody trusts; users
``broker`` (the nodes' own login) and ``alice`` with SCRAM-SHA-256/512 credentials; plus the
broker and client settings that use them.

The users go into a cluster's metadata before it first starts (:meth:`SecurityEnv.bootstrap`,
as `replog users add --metadata-log-dir` does).

    env = SecurityEnv.create(tmp_path)
    cluster = Cluster(..., overrides=env.broker_overrides("SSL"), client=env.client_config("SSL"))
    env.bootstrap(cluster.metadata_root)
    cluster.start()
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from logstore.storage import Storage
from replication.controller.acl_control import bootstrap_credentials
from replication.metadata.store import MetadataStore
from replication.security.certs import CA_KEY_USAGE
from replication.security.scram import MECHANISMS, new_credential

#: the users every SecurityEnv knows, with their passwords
USERS = {"broker": "broker-secret-8c1f", "alice": "alice-secret-27d4"}

_DAY = datetime.timedelta(days=1)


def _name(cn: str, org: str = "replog-test") -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
        ]
    )


@dataclass(frozen=True)
class _Ca:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate


def _make_ca(cn: str) -> _Ca:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + 30 * _DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _Ca(key, cert)


def _leaf(
    ca: _Ca, cn: str, *, server: bool, expired: bool = False
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    start, end = (now - 10 * _DAY, now - 2 * _DAY) if expired else (now - _DAY, now + 30 * _DAY)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
    return key, builder.sign(ca.key, hashes.SHA256())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class SecurityEnv:
    """Paths of the PEM files (keystores hold key + certificate chain)."""

    root: Path
    ca: Path  # the trusted CA certificate (the truststore)
    broker: Path  # broker keystore
    client: Path  # client keystore, CN=alice
    expired: Path  # client keystore, expired, signed by the trusted CA
    untrusted: Path  # client keystore signed by a foreign CA
    untrusted_ca: Path
    users: dict[str, str] = field(default_factory=lambda: dict(USERS))

    @classmethod
    def create(cls, root: Path) -> SecurityEnv:
        root.mkdir(parents=True, exist_ok=True)
        ca = _make_ca("replog-test-ca")
        foreign = _make_ca("foreign-ca")

        def store(name: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> Path:
            path = root / f"{name}.pem"
            path.write_bytes(_pem_key(key) + _pem_cert(cert))
            path.chmod(0o600)
            return path

        (root / "ca.pem").write_bytes(_pem_cert(ca.cert))
        (root / "foreign-ca.pem").write_bytes(_pem_cert(foreign.cert))
        return cls(
            root=root,
            ca=root / "ca.pem",
            broker=store("broker", *_leaf(ca, "broker", server=True)),
            client=store("client", *_leaf(ca, "alice", server=False)),
            expired=store("expired", *_leaf(ca, "old", server=False, expired=True)),
            untrusted=store("untrusted", *_leaf(foreign, "mallory", server=True)),
            untrusted_ca=root / "foreign-ca.pem",
        )

    def bootstrap(self, metadata_root: str) -> None:
        """Write USERS (SCRAM-SHA-256 and -512 credentials) into the metadata of a cluster
        before it first starts (the brokers log in to each other as ``broker``)."""
        credentials = [
            new_credential(user, mechanism, password, iterations=4096)
            for user, password in self.users.items()
            for mechanism in MECHANISMS
        ]
        bootstrap_credentials(MetadataStore(Storage.from_url(metadata_root)), credentials)

    def jaas(self, user: str, password: str | None = None) -> str:
        password = self.users[user] if password is None else password
        return (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{user}" password="{password}";'
        )

    def broker_overrides(
        self, replog: str = "SSL", kafka: str | None = None, **extra: str
    ) -> dict[str, str]:
        """Broker settings: the REPLOG listener (also inter-broker and controller traffic) and
        the Kafka listener on the given protocols."""
        protocols = f"REPLOG:{replog},KAFKA:{kafka or replog}"
        sasl = {"sasl.jaas.config": self.jaas("broker")} if "SASL" in protocols else {}
        return {
            "listener.security.protocol.map": protocols,
            "ssl.keystore.location": str(self.broker),
            "ssl.truststore.location": str(self.ca),
            **sasl,
            **extra,
        }

    def client_config(
        self, protocol: str = "SSL", *, keystore: Path | None = None, **extra: str
    ) -> dict[str, Any]:
        """replog client settings (ClientConfig keys); SASL ones log in as alice with
        SCRAM-SHA-512 unless ``extra`` says otherwise."""
        out: dict[str, Any] = {
            "security.protocol": protocol,
            "ssl.truststore.location": str(self.ca),
        }
        if protocol.startswith("SASL_"):
            out |= {
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.username": "alice",
                "sasl.password": self.users["alice"],
            }
        if keystore is not None:
            out["ssl.keystore.location"] = str(keystore)
        return {**out, **extra}
