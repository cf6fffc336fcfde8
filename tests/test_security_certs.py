"""The throwaway CA of `replog cluster up --secure`: what it issues is trusted by Python's ssl
for the hosts it names, and refused when expired, for another host, or from another CA."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from pathlib import Path

import pytest

from replication.security.certs import CertificateAuthority, Issued

pytestmark = pytest.mark.unit


def handshake(server: Issued, ca: CertificateAuthority, trust: Path, host: str, tmp: Path) -> None:
    """One TLS handshake over a socket pair: the server presents ``server`` (chained to
    ``ca``), the client trusts ``trust`` and checks the name ``host``. Raises on refusal."""
    keystore = server.write_keystore(tmp / "server.pem", ca.certificate_pem)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(keystore)
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(trust)
    a, b = socket.socketpair()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            with server_ctx.wrap_socket(a, server_side=True) as s:
                s.recv(1)
        except (ssl.SSLError, OSError) as err:
            errors.append(err)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client_ctx.wrap_socket(b, server_hostname=host) as c:
            c.sendall(b"x")
    finally:
        b.close()
        thread.join(timeout=10)


def test_a_certificate_for_the_hosts_it_names_is_trusted(tmp_path: Path) -> None:
    ca = CertificateAuthority()
    trust = ca.write_truststore(tmp_path / "ca.pem")
    issued = ca.issue("broker-0", ("127.0.0.1", "localhost"))
    handshake(issued, ca, trust, "127.0.0.1", tmp_path)
    handshake(issued, ca, trust, "localhost", tmp_path)
    assert oct((tmp_path / "server.pem").stat().st_mode & 0o777) == "0o600"


def test_expired_other_host_or_other_ca_are_refused(tmp_path: Path) -> None:
    ca = CertificateAuthority()
    trust = ca.write_truststore(tmp_path / "ca.pem")
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
    expired = ca.issue("old", ("127.0.0.1",), days=1, not_before=long_ago)
    with pytest.raises(ssl.SSLCertVerificationError, match="expired"):
        handshake(expired, ca, trust, "127.0.0.1", tmp_path)
    other_host = ca.issue("elsewhere", ("10.9.9.9",))
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        handshake(other_host, ca, trust, "127.0.0.1", tmp_path)
    stranger = CertificateAuthority("another CA")
    with pytest.raises(
        ssl.SSLCertVerificationError, match="self-signed certificate in certificate chain"
    ):
        handshake(stranger.issue("b", ("127.0.0.1",)), stranger, trust, "127.0.0.1", tmp_path)
