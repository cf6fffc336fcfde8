"""TLS for listeners and connections: SSL contexts from the broker's and the clients' keys, and
the principal of a client certificate.

Keystores and truststores are PEM files or PKCS12 stores (``ssl.keystore.type`` /
``ssl.truststore.type``, as Kafka's: PKCS12 is what Java's keytool writes by default since
Java 9). Python's ``ssl`` reads PEM files only, so a PKCS12 store is opened with
``cryptography`` (``ssl.keystore.password`` / ``ssl.truststore.password``); its key reaches
OpenSSL through a private temporary file, encrypted with a one-time password, that is gone
before the context is used. A JKS store (Java's old format, which no well-kept Python library
reads) is refused with the keytool command that converts it to PKCS12.

The principal of a client certificate is its subject as RFC 4514 text (what Java's
``X500Principal.getName()`` prints, so Kafka's ``ssl.principal.mapping.rules`` carry over),
mapped by those rules (KIP-371) to ``User:<name>``.
"""

from __future__ import annotations

import os
import re
import secrets
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from logstore.errors import ConfigError
from replication.security.principal import ANONYMOUS, KafkaPrincipal

if TYPE_CHECKING:
    from replication.client.config import ClientConfig
    from replication.security.config import SecurityConfig

__all__ = [
    "PrincipalMapper",
    "broker_client_context",
    "client_context",
    "peer_principal",
    "server_context",
    "ssl_reason",
]

_TLS_VERSIONS: Final = {
    "TLSV1.2": ssl.TLSVersion.TLSv1_2,
    "TLSV1.3": ssl.TLSVersion.TLSv1_3,
}
_CLIENT_AUTH: Final = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


#: The store types replog reads (``ssl.keystore.type``, ``ssl.truststore.type``).
STORE_TYPES: Final = ("PEM", "PKCS12")
#: The first bytes of a JKS store (Java's KeyStore magic number).
_JKS_MAGIC: Final = b"\xfe\xed\xfe\xed"
#: The first bytes of a DER SEQUENCE longer than 255 bytes: a PKCS12 store (PEM is text).
_DER_SEQUENCE: Final = b"0\x82"


def _jks_error(key: str, location: str) -> ConfigError:
    return ConfigError(
        f"config {key}: {location!r} is a JKS store, which replog cannot read; convert it to "
        f"PKCS12 with `keytool -importkeystore -srckeystore {location} -srcstoretype JKS "
        f"-destkeystore store.p12 -deststoretype PKCS12`, then point the location at store.p12 "
        "with type PKCS12 (or give PEM files, type PEM)"
    )


def check_store_type(key: str, value: str) -> str:
    """``value`` of ``key`` (ssl.keystore.type, ssl.truststore.type) upper-cased, if replog
    reads that type; ConfigError saying what to do otherwise (JKS: convert to PKCS12)."""
    kind = value.strip().upper()
    if kind == "JKS":
        raise ConfigError(
            f"config {key}=JKS: replog reads PEM and PKCS12 stores, not JKS (Java's old format); "
            "convert it with `keytool -importkeystore -srckeystore store.jks -srcstoretype JKS "
            f"-destkeystore store.p12 -deststoretype PKCS12` and set {key}=PKCS12"
        )
    if kind not in STORE_TYPES:
        raise ConfigError(f"config {key}={value!r}: use PEM or PKCS12")
    return kind


def _read_store(key: str, location: str, what: str) -> bytes:
    try:
        with open(location, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ConfigError(f"config {key}={location!r}: no such file ({what})") from None
    except OSError as err:
        raise ConfigError(f"config {key}={location!r}: cannot read it ({err.strerror})") from None
    if data.startswith(_JKS_MAGIC):
        raise _jks_error(key, location)
    return data


def _open_pkcs12(
    key: str, location: str, password: str, what: str
) -> pkcs12.PKCS12KeyAndCertificates:
    data = _read_store(key, location, what)
    try:
        return pkcs12.load_pkcs12(data, password.encode() if password else None)
    except ValueError as err:
        store = "ssl.keystore.password" if "keystore" in key else "ssl.truststore.password"
        raise ConfigError(
            f"config {key}={location!r}: not a PKCS12 store, or {store} does not open it ({err})"
        ) from None


def _versions(ctx: ssl.SSLContext, enabled: str) -> None:
    names = [v.strip().upper() for v in enabled.split(",") if v.strip()]
    unknown = [n for n in names if n not in _TLS_VERSIONS]
    if unknown or not names:
        raise ConfigError(
            f"config ssl.enabled.protocols={enabled!r}: use TLSv1.2 and/or TLSv1.3, comma-separated"
        )
    chosen = sorted(_TLS_VERSIONS[n] for n in names)
    ctx.minimum_version = chosen[0]
    ctx.maximum_version = chosen[-1]


class _Stores(Protocol):
    """The keystore and truststore settings (SecurityConfig's and ClientConfig's)."""

    @property
    def ssl_keystore_location(self) -> str: ...
    @property
    def ssl_keystore_type(self) -> str: ...
    @property
    def ssl_keystore_password(self) -> str: ...
    @property
    def ssl_key_password(self) -> str: ...
    @property
    def ssl_truststore_location(self) -> str: ...
    @property
    def ssl_truststore_type(self) -> str: ...
    @property
    def ssl_truststore_password(self) -> str: ...


def _load_keystore(ctx: ssl.SSLContext, stores: _Stores, who: str) -> None:
    """``who``'s key and certificate chain into ``ctx``: a PEM file (the key opened with
    ssl.key.password) or a PKCS12 store (opened with ssl.keystore.password, else
    ssl.key.password)."""
    location, password = stores.ssl_keystore_location, stores.ssl_key_password
    if check_store_type("ssl.keystore.type", stores.ssl_keystore_type) == "PKCS12":
        _load_pkcs12_keystore(ctx, location, stores.ssl_keystore_password or password, who)
        return
    _load_pem_store(
        "keystore",
        location,
        lambda: ctx.load_cert_chain(location, password=password or None),
        f"{who}'s PEM key and certificate chain",
        "a PEM private key and certificate chain, or ssl.key.password does not open the key",
    )


def _load_pkcs12_keystore(ctx: ssl.SSLContext, location: str, password: str, who: str) -> None:
    store = _open_pkcs12(
        "ssl.keystore.location", location, password, f"{who}'s PKCS12 key and certificate"
    )
    if store.key is None or store.cert is None:
        raise ConfigError(
            f"config ssl.keystore.location={location!r}: the PKCS12 store holds no private key "
            f"and certificate ({who}'s); a store of CA certificates is a truststore "
            "(ssl.truststore.location)"
        )
    one_time = secrets.token_urlsafe(32).encode()
    pem = store.key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(one_time),
    ) + b"".join(
        c.certificate.public_bytes(serialization.Encoding.PEM)
        for c in (store.cert, *store.additional_certs)
    )
    with tempfile.TemporaryDirectory(prefix="replog-keystore-") as private:  # mode 0700
        path = os.path.join(private, "keystore.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        ctx.load_cert_chain(path, password=one_time)


def _load_truststore(ctx: ssl.SSLContext, stores: _Stores) -> None:
    """The CA certificates to trust into ``ctx``: a PEM file, a PKCS12 store (opened with
    ssl.truststore.password), or the system's when no location is given."""
    location = stores.ssl_truststore_location
    if not location:
        ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
        return
    if check_store_type("ssl.truststore.type", stores.ssl_truststore_type) == "PKCS12":
        store = _open_pkcs12(
            "ssl.truststore.location",
            location,
            stores.ssl_truststore_password,
            "PKCS12 CA certificates",
        )
        certs = [c.certificate for c in store.additional_certs]
        if store.cert is not None:
            certs.append(store.cert.certificate)
        if not certs:
            raise ConfigError(
                f"config ssl.truststore.location={location!r}: the PKCS12 store holds no "
                "certificate to trust"
            )
        ctx.load_verify_locations(
            cadata="".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certs)
        )
        return
    _load_pem_store(
        "truststore",
        location,
        lambda: ctx.load_verify_locations(cafile=location),
        "PEM CA certificates",
        "PEM CA certificates",
    )


def _load_pem_store(
    store: str, location: str, load: Callable[[], None], wanted: str, malformed: str
) -> None:
    """Run ``load`` on the PEM ``ssl.<store>.location``; a missing file, a PKCS12 store named
    as PEM, or bytes ``load`` refuses become a ConfigError naming the key."""
    key = f"ssl.{store}.location"
    try:
        load()
    except FileNotFoundError as err:
        raise ConfigError(f"config {key}={location!r}: no such file ({wanted})") from err
    except ssl.SSLError as err:
        if _read_store(key, location, "").startswith(_DER_SEQUENCE):
            raise ConfigError(
                f"config {key}={location!r}: a PKCS12 store, but "
                f"ssl.{store}.type is PEM: set ssl.{store}.type=PKCS12"
            ) from err
        raise ConfigError(
            f"config {key}={location!r}: not {malformed} ({err.reason or err})"
        ) from err


def _check_hostname(algorithm: str) -> bool:
    algorithm = algorithm.strip().lower()
    if algorithm not in ("https", ""):
        raise ConfigError(
            f"config ssl.endpoint.identification.algorithm={algorithm!r}: use https (check the "
            "peer's certificate names its host) or empty (do not)"
        )
    return algorithm == "https"


def server_context(sec: SecurityConfig) -> ssl.SSLContext:
    """The context of a TLS listener (SSL, SASL_SSL): this node's key and certificate, and the
    CAs client certificates must chain to when ssl.client.auth asks for one."""
    check_store_type("ssl.keystore.type", sec.ssl_keystore_type)
    check_store_type("ssl.truststore.type", sec.ssl_truststore_type)
    auth = sec.ssl_client_auth.strip().lower()
    if auth not in _CLIENT_AUTH:
        raise ConfigError(
            f"config ssl.client.auth={sec.ssl_client_auth!r}: use none, requested or required"
        )
    if not sec.ssl_keystore_location:
        raise ConfigError(
            "config ssl.keystore.location is empty, but a listener uses SSL or SASL_SSL "
            "(listener.security.protocol.map): give the PEM file with this node's private key "
            "and certificate chain"
        )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _versions(ctx, sec.ssl_enabled_protocols)
    _load_keystore(ctx, sec, "this node")
    if auth != "none":
        if not sec.ssl_truststore_location:
            raise ConfigError(
                f"config ssl.client.auth={auth} needs ssl.truststore.location: the PEM CA "
                "certificates client certificates must chain to"
            )
        _load_truststore(ctx, sec)
    ctx.verify_mode = _CLIENT_AUTH[auth]
    return ctx


def broker_client_context(sec: SecurityConfig) -> ssl.SSLContext:
    """The context a node connects to other nodes with (followers, the controller, transaction
    markers): it trusts the truststore and presents its own certificate (for mutual TLS)."""
    check_store_type("ssl.keystore.type", sec.ssl_keystore_type)
    check_store_type("ssl.truststore.type", sec.ssl_truststore_type)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _versions(ctx, sec.ssl_enabled_protocols)
    ctx.check_hostname = _check_hostname(sec.ssl_endpoint_identification_algorithm)
    _load_truststore(ctx, sec)
    if sec.ssl_keystore_location:
        _load_keystore(ctx, sec, "this node")
    return ctx


def client_context(config: ClientConfig) -> ssl.SSLContext:
    """The context of a client connection (security.protocol SSL or SASL_SSL)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = _check_hostname(config.ssl_endpoint_identification_algorithm)
    _load_truststore(ctx, config)
    if config.ssl_keystore_location:
        _load_keystore(ctx, config, "the client")
    return ctx


# --- the principal of a client certificate -----------------------------------------------------

_RULE: Final = re.compile(
    r"\s*(?:(DEFAULT)|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?))\s*(?:,|$)"
)


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str
    case: str

    def apply(self, name: str) -> str | None:
        if self.pattern is None:
            return name
        if self.pattern.fullmatch(name) is None:
            return None
        out = self.pattern.sub(self.replacement, name)
        return out.lower() if self.case == "L" else out.upper() if self.case == "U" else out


class PrincipalMapper:
    """Kafka's ``ssl.principal.mapping.rules`` (KIP-371): the first rule whose pattern matches
    the whole distinguished name gives the user name (``$1`` refers to a group, ``/L`` and
    ``/U`` fold the case); ``DEFAULT`` is the name itself. No rule matching fails the
    authentication, as Kafka's does."""

    def __init__(self, rules: str = "DEFAULT") -> None:
        self.text = rules
        self.rules: list[_Rule] = []
        pos = 0
        text = rules.strip()
        while pos < len(text):
            m = _RULE.match(text, pos)
            if m is None or m.end() == pos:
                raise ConfigError(
                    f"config ssl.principal.mapping.rules={rules!r}: expected DEFAULT or "
                    "RULE:pattern/replacement/[LU], comma-separated (at "
                    f"{text[pos : pos + 30]!r})"
                )
            pos = m.end()
            if m.group(1):
                self.rules.append(_Rule(None, "", ""))
                continue
            try:
                pattern = re.compile(m.group(2).replace("\\/", "/"))
            except re.error as err:
                raise ConfigError(
                    f"config ssl.principal.mapping.rules: pattern {m.group(2)!r} is not a "
                    f"regular expression ({err})"
                ) from err
            # Java's $1 is Python's \g<1>
            replacement = re.sub(r"\$(\d+)", r"\\g<\1>", m.group(3).replace("\\/", "/"))
            self.rules.append(_Rule(pattern, replacement, m.group(4)))
        if not self.rules:
            self.rules.append(_Rule(None, "", ""))

    def name(self, distinguished_name: str) -> str:
        """The user name of ``distinguished_name``; ValueError if no rule applies."""
        for rule in self.rules:
            out = rule.apply(distinguished_name)
            if out is not None:
                return out
        raise ValueError(
            f"no ssl.principal.mapping.rules rule applies to the certificate subject "
            f"{distinguished_name!r}"
        )


def ssl_reason(err: BaseException) -> str:
    """What a failed handshake says, readable: the verification message when a certificate
    was refused (``certificate has expired``), else OpenSSL's reason."""
    verify = getattr(err, "verify_message", None)
    if verify:
        return f"certificate verify failed: {verify}"
    reason = getattr(err, "reason", None)
    return str(reason or err or type(err).__name__)


def subject_name(der: bytes) -> str:
    """A certificate's subject as RFC 4514 text (``CN=alice,O=example``)."""
    return x509.load_der_x509_certificate(der).subject.rfc4514_string()


def peer_principal(ssl_object: ssl.SSLObject | None, mapper: PrincipalMapper) -> KafkaPrincipal:
    """The principal of a TLS connection: from the client's certificate, or ANONYMOUS when it
    presented none. ValueError if the mapping rules reject its name."""
    if ssl_object is None:
        return ANONYMOUS
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return ANONYMOUS
    return KafkaPrincipal("User", mapper.name(subject_name(der)))
