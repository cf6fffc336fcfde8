"""`replog security init`: the secrets of a new secured cluster (the Docker demo's secrets-init
service; the same function as `replog cluster up --secure`), made once and kept, the users in
the metadata, the certificate naming the hosts given, and clear refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from logstore.storage import Storage
from replication.config import load_broker_config
from replication.metadata.store import ControllerClaim, MetadataStore
from replication.tools.cli_common import read_properties

pytestmark = pytest.mark.unit


def replog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replication.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_init_writes_the_secrets_once_and_the_users_into_the_metadata(tmp_path: Path) -> None:
    secrets, metadata = tmp_path / "secrets", tmp_path / "metadata"
    args = ("security", "init", "--dir", str(secrets), "--metadata-log-dir", str(metadata))
    made = replog(*args, "--host", "broker-0", "--host", "10.0.0.7")
    assert made.returncode == 0, made.stderr
    assert oct(secrets.stat().st_mode & 0o777) == "0o700"
    names = (
        x509.load_pem_x509_certificates((secrets / "node.pem").read_bytes())[0]
        .extensions.get_extension_for_class(x509.SubjectAlternativeName)
        .value
    )
    assert names.get_values_for_type(x509.DNSName) == ["broker-0"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    image = MetadataStore(Storage.from_url(str(metadata))).read_latest()
    assert {c.user for c in image.scram_credentials} == {"broker", "admin"}
    node = load_broker_config(secrets / "node.toml")
    assert node.security.protocol("REPLOG") == "SASL_SSL"
    assert Path(node.security.ssl_keystore_location) == secrets / "node.pem"
    client = read_properties(secrets / "client.properties")
    assert client["ssl.truststore.location"] == str(secrets / "ca.pem")
    passwords = [(secrets / f"{u}.password").read_text().strip() for u in ("broker", "admin")]
    assert not any(p in made.stdout + made.stderr for p in passwords)
    ca = (secrets / "ca.pem").read_bytes()
    again = replog(*args)  # a restarted init job: nothing changes
    assert again.returncode == 0, again.stderr
    assert (secrets / "ca.pem").read_bytes() == ca


def test_init_takes_the_metadata_from_the_nodes_conf(tmp_path: Path) -> None:
    conf = tmp_path / "node.toml"
    conf.write_text(f'"metadata.log.dir" = "{(tmp_path / "meta").as_uri()}"\n')
    made = replog("security", "init", "--dir", str(tmp_path / "s"), "--conf", str(conf))
    assert made.returncode == 0, made.stderr
    assert MetadataStore(Storage.from_url((tmp_path / "meta").as_uri())).read_latest().version > 0


def test_init_refuses_without_a_metadata_location(tmp_path: Path) -> None:
    refused = replog("security", "init", "--dir", str(tmp_path / "s"))
    assert refused.returncode == 1
    assert "--metadata-log-dir" in refused.stderr
    assert not (tmp_path / "s").exists()


def test_init_refuses_a_cluster_that_already_ran_unsecured(tmp_path: Path) -> None:
    metadata = tmp_path / "metadata"
    MetadataStore(Storage.from_url(str(metadata))).claim(ControllerClaim(1, 100, "127.0.0.1", 9))
    refused = replog(
        "security", "init", "--dir", str(tmp_path / "s"), "--metadata-log-dir", str(metadata)
    )
    assert refused.returncode == 1
    assert "already run without" in refused.stderr, refused.stderr
    assert not (tmp_path / "s").exists()
