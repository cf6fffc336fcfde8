"""``replog cluster up --secure`` and ``replog security init`` (the Docker demo's
``secrets-init`` service, docker-compose.secure.yml): what a secured cluster needs, made once
(:func:`init_secrets`) and kept in a secrets directory (owner-only; ``<run dir>/secrets`` for a
local cluster, the ``secrets`` volume's ``/secrets`` in Docker):

- a throwaway CA and one certificate for the nodes (127.0.0.1 and localhost; in Docker also
  the service names), PEM;
- two SCRAM users with random passwords: ``broker`` (the nodes' own login to each other and
  to the controller) and ``admin`` (for the operator), both super users; they are written
  into the cluster metadata before any node starts (as Kafka's ``kafka-storage format
  --add-scram``), since no broker can register before its own user exists;
- the nodes' settings: every listener SASL_SSL, SCRAM-SHA-512 between nodes, Kafka's
  StandardAuthorizer (ACLs on, deny by default), ``super.users=User:broker;User:admin``;
- ``client.properties``: the admin's client settings, for ``--command-config`` and for any
  Kafka client (librdkafka and the Java client read the same keys).

Starting again on the same data directory reuses them (the users are already in the
metadata). Not for production: the CA's key and the passwords lie on local disk.
"""

from __future__ import annotations

import json
import secrets
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from logstore.errors import ConfigError
from logstore.storage import Storage
from replication.controller.acl_control import bootstrap_credentials
from replication.metadata.store import MetadataStore
from replication.security.certs import CertificateAuthority
from replication.security.scram import new_credential

__all__ = [
    "LOCAL_HOSTS",
    "MetadataInUseError",
    "SecureCluster",
    "existing",
    "init_secrets",
    "prepare",
]

#: the SCRAM mechanism of the local cluster's users (Kafka's strongest)
MECHANISM = "SCRAM-SHA-512"
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
USERS = ("broker", "admin")


def jaas(user: str, password: str) -> str:
    """The sasl.jaas.config of a SCRAM login (Kafka's ScramLoginModule)."""
    return (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}";'
    )


@dataclass(frozen=True)
class SecureCluster:
    """The secrets directory of a secured local cluster and what its nodes and clients use."""

    secrets_dir: Path

    @property
    def truststore(self) -> Path:
        return self.secrets_dir / "ca.pem"

    @property
    def keystore(self) -> Path:
        return self.secrets_dir / "node.pem"

    @property
    def node_conf(self) -> Path:
        """The nodes' security settings as a TOML file (owner-only: it holds their password),
        given to every node with --conf."""
        return self.secrets_dir / "node.toml"

    @property
    def client_properties(self) -> Path:
        return self.secrets_dir / "client.properties"

    def password(self, user: str) -> str:
        return (self.secrets_dir / f"{user}.password").read_text().strip()

    def node_overrides(self) -> dict[str, str]:
        """The security settings of every node of the cluster."""
        return {
            "listener.security.protocol.map": "REPLOG:SASL_SSL,KAFKA:SASL_SSL",
            "ssl.keystore.location": str(self.keystore),
            "ssl.truststore.location": str(self.truststore),
            "sasl.enabled.mechanisms": "SCRAM-SHA-512,SCRAM-SHA-256",
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            "sasl.jaas.config": jaas("broker", self.password("broker")),
            "authorizer.class.name": STANDARD_AUTHORIZER,
            "super.users": "User:broker;User:admin",
        }

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context trusting the cluster's CA (for `replog cluster status`)."""
        return ssl.create_default_context(cafile=str(self.truststore))

    def client_config(self) -> dict[str, str]:
        """The admin's client settings (what client.properties holds)."""
        return {
            "security.protocol": "SASL_SSL",
            "ssl.truststore.location": str(self.truststore),
            "sasl.mechanism": MECHANISM,
            "sasl.jaas.config": jaas("admin", self.password("admin")),
        }


def _write_secret(path: Path, data: bytes) -> None:
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)


def existing(run_dir: Path) -> SecureCluster | None:
    """The secured cluster of ``run_dir``, if it was started with --secure."""
    cluster = SecureCluster(run_dir / "secrets")
    return cluster if cluster.client_properties.exists() else None


class MetadataInUseError(ConfigError):
    """The metadata to secure belongs to a cluster that already ran without the secrets."""


#: what the certificate of a local cluster's nodes names (clients reach them on 127.0.0.1)
LOCAL_HOSTS = ("127.0.0.1", "localhost")


def prepare(run_dir: Path, metadata_root: str) -> SecureCluster:
    """The secured cluster of ``run_dir`` (made on first use: CA, certificate, users in the
    metadata at ``metadata_root``, client.properties), for ``replog cluster up --secure``."""
    try:
        return init_secrets(run_dir / "secrets", metadata_root)
    except MetadataInUseError:
        raise ConfigError(
            f"--secure: the cluster on {run_dir} was first started without --secure, so its "
            "nodes have no users to log in with; start it without --secure, or use a new --data"
        ) from None


def init_secrets(
    secrets_dir: Path,
    metadata_root: str,
    *,
    hosts: tuple[str, ...] = LOCAL_HOSTS,
    storage_options: Mapping[str, Any] | None = None,
) -> SecureCluster:
    """Make what a secured cluster needs in ``secrets_dir`` (owner-only), once: a throwaway CA,
    one node certificate naming ``hosts``, the users broker and admin with random passwords
    written into the metadata at ``metadata_root`` before any node starts, node.toml and
    client.properties. ``replog cluster up --secure`` and ``replog security init`` (the Docker
    demo's secrets-init service) both come here, so the two clusters are secured alike.

    Idempotent: a directory that already holds client.properties (written last) is kept as it
    is, so a restarted init job changes nothing. ConfigError if the metadata's cluster already
    ran without these users (its nodes could never log in to each other)."""
    cluster = SecureCluster(secrets_dir)
    if cluster.client_properties.exists():
        return cluster
    store = MetadataStore(Storage.from_url(metadata_root, **(storage_options or {})))
    if store.latest_claim() is not None:
        raise MetadataInUseError(
            f"metadata {metadata_root} belongs to a cluster that has already run without "
            f"these secrets ({secrets_dir} has no client.properties), so its nodes have no "
            "users to log in with: secure a new cluster (an empty metadata.log.dir), or add "
            "users to the running one with `replog users add`"
        )
    cluster.secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    cluster.secrets_dir.chmod(0o700)
    ca = CertificateAuthority("replog local cluster CA")
    ca.write_truststore(cluster.truststore)
    ca.write_key(cluster.secrets_dir / "ca-key.pem")
    ca.issue("replog-node", hosts).write_keystore(cluster.keystore, ca.certificate_pem)
    for user in USERS:
        _write_secret(cluster.secrets_dir / f"{user}.password", secrets.token_urlsafe(18).encode())
    bootstrap_credentials(
        store, [new_credential(user, MECHANISM, cluster.password(user)) for user in USERS]
    )
    node_lines = [
        "# the security settings of every node of this cluster (replog cluster up --secure, "
        "replog security init)",
        *(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in cluster.node_overrides().items()),
    ]
    _write_secret(cluster.node_conf, ("\n".join(node_lines) + "\n").encode())
    lines = [
        "# the admin's client settings for this cluster (replog ... --command-config)",
        *(f"{k}={v}" for k, v in cluster.client_config().items()),
    ]
    _write_secret(cluster.client_properties, ("\n".join(lines) + "\n").encode())
    return cluster
