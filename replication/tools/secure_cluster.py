"""``replog cluster up --secure``: what a secured local cluster needs, made once per data
directory and kept in ``<run dir>/secrets`` (owner-only):

- a throwaway CA and one certificate for the nodes (127.0.0.1 and localhost), PEM;
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
from dataclasses import dataclass
from pathlib import Path

from logstore.errors import ConfigError
from logstore.storage import Storage
from replication.controller.controller import bootstrap_credentials
from replication.metadata.store import MetadataStore
from replication.security.certs import CertificateAuthority
from replication.security.scram import new_credential

__all__ = ["SecureCluster", "existing", "prepare"]

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


def prepare(run_dir: Path, metadata_root: str) -> SecureCluster:
    """The secured cluster of ``run_dir`` (made on first use: CA, certificate, users in the
    metadata at ``metadata_root``, client.properties)."""
    cluster = SecureCluster(run_dir / "secrets")
    if cluster.client_properties.exists():
        return cluster
    store = MetadataStore(Storage.from_url(metadata_root))
    if store.latest_claim() is not None:
        raise ConfigError(
            f"--secure: the cluster on {run_dir} was first started without --secure, so its "
            "nodes have no users to log in with; start it without --secure, or use a new --data"
        )
    cluster.secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    cluster.secrets_dir.chmod(0o700)
    ca = CertificateAuthority("replog local cluster CA")
    ca.write_truststore(cluster.truststore)
    ca.write_key(cluster.secrets_dir / "ca-key.pem")
    ca.issue("replog-node", ("127.0.0.1", "localhost")).write_keystore(
        cluster.keystore, ca.certificate_pem
    )
    for user in USERS:
        _write_secret(cluster.secrets_dir / f"{user}.password", secrets.token_urlsafe(18).encode())
    bootstrap_credentials(
        store, [new_credential(user, MECHANISM, cluster.password(user)) for user in USERS]
    )
    node_lines = [
        "# the security settings of every node of this local cluster (replog cluster up --secure)",
        *(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in cluster.node_overrides().items()),
    ]
    _write_secret(cluster.node_conf, ("\n".join(node_lines) + "\n").encode())
    lines = [
        "# the admin's client settings for this local cluster (replog ... --command-config)",
        *(f"{k}={v}" for k, v in cluster.client_config().items()),
    ]
    _write_secret(cluster.client_properties, ("\n".join(lines) + "\n").encode())
    return cluster
