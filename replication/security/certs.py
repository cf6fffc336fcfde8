"""A throwaway certificate authority for local clusters (``replog cluster up --secure``, the
Docker demo) and tests: a CA, then certificates it signs for the nodes (server and client use,
naming their hosts) and for clients (mutual TLS), as PEM files Python's ssl reads.

Not for production: the CA's key lies next to the certificates, unencrypted. A real cluster
uses its organisation's CA; the broker reads any PEM keystore and truststore
(ssl.keystore.location: key and certificate chain in one file; ssl.truststore.location).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CA_KEY_USAGE", "CertificateAuthority", "Issued"]

#: The key usage of a CA certificate: it signs certificates and CRLs.
CA_KEY_USAGE: Final = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, PEM."""

    certificate: bytes
    key: bytes

    def write_keystore(self, path: Path, chain: bytes = b"") -> Path:
        """The key, the certificate and ``chain`` (the CA's) in one PEM file (what
        ssl.keystore.location names), readable by its owner only."""
        path.write_bytes(self.key + self.certificate + chain)
        path.chmod(0o600)
        return path


class CertificateAuthority:
    """A self-signed CA (an EC P-256 key) that issues certificates."""

    def __init__(self, name: str = "replog throwaway CA", *, days: int = 365) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(CA_KEY_USAGE, critical=True)
            .sign(self._key, hashes.SHA256())
        )

    @property
    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        common_name: str,
        hosts: tuple[str, ...] = (),
        *,
        organizational_unit: str | None = None,
        days: int = 365,
        not_before: datetime.datetime | None = None,
    ) -> Issued:
        """A certificate for ``common_name``, valid for TLS servers and clients, naming
        ``hosts`` (DNS names or IP addresses) as subject alternative names. ``not_before`` and
        ``days`` make expired certificates too (for tests of refusals)."""
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organizational_unit:
            attributes.append(
                x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, organizational_unit)
            )
        start = not_before or (_now() - datetime.timedelta(minutes=5))
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if hosts:
            names: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self._key, hashes.SHA256())
        return Issued(certificate.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def write_truststore(self, path: Path) -> Path:
        """The CA's certificate (what ssl.truststore.location names)."""
        path.write_bytes(self.certificate_pem)
        return path

    def write_key(self, path: Path) -> Path:
        """The CA's own key (to issue more certificates later), owner-readable only."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(_key_pem(self._key))
        return path
