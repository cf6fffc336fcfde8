"""SASL as pure state machines, bytes in and bytes out: the broker's side
(:class:`SaslServer`) and a client's (:class:`SaslClient`), for SCRAM-SHA-256/512 (through
``scramp``: the risk in SCRAM is its message parsing, not its arithmetic) and PLAIN.

They know nothing of sockets or Kafka frames; the socket server and the connections carry
their tokens in SaslHandshake/SaslAuthenticate. Both fail with
:class:`~replication.errors.SaslAuthenticationFailedError` (never anything else), whose message
names the mechanism and never a secret. The server checks PLAIN against the same SCRAM
credentials (one credential store; no password in any config), and refuses PLAIN where
passwords would cross the network in the clear (SASL_PLAINTEXT) unless
sasl.plain.insecure.enable says so.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from scramp import ScramClient, ScramMechanism

from logstore.errors import ConfigError
from replication.errors import SaslAuthenticationFailedError
from replication.security.principal import KafkaPrincipal
from replication.security.scram import MECHANISMS, ScramCredential, fake_credential

__all__ = [
    "PLAIN",
    "SUPPORTED_MECHANISMS",
    "CredentialLookup",
    "Login",
    "SaslClient",
    "SaslServer",
    "parse_jaas_config",
]

PLAIN: Final = "PLAIN"
SUPPORTED_MECHANISMS: Final = (*MECHANISMS, PLAIN)
#: ``(user, mechanism) -> credential``, None for an unknown user (the metadata image's
#: ``scram_credential``)
CredentialLookup = Callable[[str, str], ScramCredential | None]


def failed(mechanism: str) -> SaslAuthenticationFailedError:
    """Kafka's message for a bad password or unknown user (the same for both: no user
    enumeration)."""
    return SaslAuthenticationFailedError(
        "Authentication failed during authentication due to invalid credentials with SASL "
        f"mechanism {mechanism}"
    )


def plain_allowed(mechanism: str, protocol: str, insecure_enable: bool) -> bool:
    """PLAIN sends the password itself: only over TLS, unless sasl.plain.insecure.enable."""
    return mechanism != PLAIN or protocol == "SASL_SSL" or insecure_enable


def enabled_mechanisms(text: str) -> list[str]:
    """sasl.enabled.mechanisms, checked."""
    names = [m.strip().upper() for m in text.split(",") if m.strip()]
    unknown = [m for m in names if m not in SUPPORTED_MECHANISMS]
    if unknown or not names:
        raise ConfigError(
            f"config sasl.enabled.mechanisms={text!r}: use some of "
            f"{', '.join(SUPPORTED_MECHANISMS)}, comma-separated"
        )
    return names


# --- the server ---------------------------------------------------------------------------------


class SaslServer:
    """One connection's authentication, broker side.

    ``handshake(mechanism)`` picks the mechanism (False: not enabled); then ``step(token)``
    takes each client token and returns the answer, until ``complete`` (``principal`` is
    then who logged in). Every failure is SaslAuthenticationFailedError."""

    def __init__(
        self,
        mechanisms: Sequence[str],
        lookup: CredentialLookup,
        *,
        secret: bytes | None = None,
    ) -> None:
        self.mechanisms = list(mechanisms)
        self.lookup = lookup
        #: keys the fake salts of unknown users (as Kafka's ScramSaslServer)
        self._secret = secret or os.urandom(32)
        self.mechanism: str | None = None
        self.principal: KafkaPrincipal | None = None
        self.complete = False
        self._user: str | None = None
        self._scram: object | None = None
        self._rounds = 0

    def handshake(self, mechanism: str) -> bool:
        if mechanism not in self.mechanisms:
            return False
        self.mechanism = mechanism
        return True

    def step(self, token: bytes) -> bytes:
        mechanism = self.mechanism
        token = bytes(token)
        if mechanism is None or self.complete:
            raise SaslAuthenticationFailedError(
                "SaslAuthenticate before SaslHandshake, or after authentication completed"
            )
        try:
            if mechanism == PLAIN:
                return self._plain(token)
            return self._scram_step(mechanism, token)
        except SaslAuthenticationFailedError:
            raise
        except Exception as err:  # scramp's ScramException, bad UTF-8, anything: refuse
            raise failed(mechanism) from err

    def _plain(self, token: bytes) -> bytes:
        parts = token.decode("utf-8").split("\0")
        if len(parts) != 3 or not parts[1]:
            raise failed(PLAIN)
        authzid, user, password = parts
        if authzid and authzid != user:
            raise failed(PLAIN)
        for mechanism in MECHANISMS:
            cred = self.lookup(user, mechanism)
            if cred is None:
                continue
            _, stored_key, _, _ = ScramMechanism(mechanism).make_auth_info(
                password, iteration_count=cred.iterations, salt=cred.salt
            )
            if hmac.compare_digest(stored_key, cred.stored_key):
                self._done(user)
                return b""
            raise failed(PLAIN)
        # an unknown user costs the same work as a wrong password: timing does not tell
        fake = fake_credential(self._secret, user, "SCRAM-SHA-256")
        ScramMechanism(fake.mechanism).make_auth_info(
            password, iteration_count=fake.iterations, salt=fake.salt
        )
        raise failed(PLAIN)

    def _scram_step(self, mechanism: str, token: bytes) -> bytes:
        self._rounds += 1
        text = token.decode("utf-8")
        if self._rounds == 1:
            if re.search(r",tokenauth=", text):
                raise SaslAuthenticationFailedError(
                    "delegation tokens (tokenauth) are not supported by replog"
                )
            server = ScramMechanism(mechanism).make_server(self._auth_info(mechanism))
            self._scram = server
            server.set_client_first(text)
            return str(server.get_server_first()).encode()
        if self._rounds == 2:
            first: Any = self._scram
            assert first is not None
            if self._user is None or self.lookup(self._user, mechanism) is None:
                raise failed(mechanism)
            nonce = _attribute(text, "r")
            server_nonce = _attribute(str(first.server_first), "r")
            if server_nonce and nonce != server_nonce and nonce.endswith(server_nonce):
                out = _lenient_server_final(first, mechanism, text)
            else:
                first.set_client_final(text)
                out = str(first.get_server_final()).encode()
            self._done(self._user)
            return out
        raise failed(mechanism)

    def _auth_info(self, mechanism: str) -> Callable[[str], tuple[bytes, bytes, bytes, int]]:
        def auth_fn(user: str) -> tuple[bytes, bytes, bytes, int]:
            self._user = user
            cred = self.lookup(user, mechanism)
            # an unknown user gets a salt that looks like a real one and is the same every
            # time, and keys no proof matches: the answer does not tell who exists
            return (cred or fake_credential(self._secret, user, mechanism)).auth_info()

        return auth_fn

    def _done(self, user: str) -> None:
        self.complete = True
        self.principal = KafkaPrincipal("User", user)


def _attribute(message: str, name: str) -> str:
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if sep and key == name:
            return value
    return ""


def _lenient_server_final(server: Any, mechanism: str, client_final: str) -> bytes:
    """Check a client-final message whose nonce ends with, rather than equals, the server's,
    and answer it. librdkafka before 2.x (kcat 1.7) sends its own nonce again in front, and
    Kafka's ScramSaslServer accepts that (``nonce().endsWith(...)``), so replog must too;
    scramp checks equality, so this one case is verified here (RFC 5802 section 3, with the
    message exactly as the client signed it)."""
    digest = _HASHES[mechanism]
    without_proof, sep, proof_b64 = client_final.rpartition(",p=")
    if not sep or _attribute(without_proof, "c") != "biws":
        raise failed(mechanism)
    auth_message = f"{server.client_first_bare},{server.server_first},{without_proof}".encode()
    signature = hmac.new(server.stored_key, auth_message, digest).digest()
    proof = base64.b64decode(proof_b64, validate=True)
    if len(proof) != len(signature):
        raise failed(mechanism)
    client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
    if not hmac.compare_digest(digest(client_key).digest(), server.stored_key):
        raise failed(mechanism)
    server_signature = hmac.new(server.server_key, auth_message, digest).digest()
    return b"v=" + base64.b64encode(server_signature)


_HASHES: Final = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}


# --- the client ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Login:
    """A user name and password (the password never in a repr)."""

    username: str
    password: str = ""

    def __repr__(self) -> str:
        return f"Login(username={self.username!r}, password=<redacted>)"


class SaslClient:
    """One connection's login, client side: ``first()`` is the first token, then
    ``step(server_token)`` the next (None when nothing more is to be sent); ``complete`` once
    the server's last message checked out (SCRAM authenticates the server too)."""

    def __init__(self, mechanism: str, login: Login) -> None:
        mechanism = mechanism.strip().upper()
        if mechanism not in SUPPORTED_MECHANISMS:
            raise ConfigError(
                f"config sasl.mechanism={mechanism!r}: use one of {', '.join(SUPPORTED_MECHANISMS)}"
            )
        self.mechanism = mechanism
        self.login = login
        self.complete = False
        self._scram: ScramClient | None = None
        self._rounds = 0

    def first(self) -> bytes:
        if self.mechanism == PLAIN:
            return f"\0{self.login.username}\0{self.login.password}".encode()
        self._scram = ScramClient([self.mechanism], self.login.username, self.login.password)
        return str(self._scram.get_client_first()).encode()

    def step(self, server_token: bytes) -> bytes | None:
        """The answer to the server's token; SaslAuthenticationFailedError if the server's
        messages do not check out (a server that does not know the password)."""
        self._rounds += 1
        server_token = bytes(server_token)  # a decoder may hand a memoryview
        if self.mechanism == PLAIN or self._scram is None:
            self.complete = True
            return None
        try:
            if self._rounds == 1:
                self._scram.set_server_first(server_token.decode("utf-8"))
                return str(self._scram.get_client_final()).encode()
            self._scram.set_server_final(server_token.decode("utf-8"))
        except Exception as err:
            raise SaslAuthenticationFailedError(
                f"the broker's {self.mechanism} answer did not check out ({type(err).__name__})"
                "; is it the broker you meant?"
            ) from err
        self.complete = True
        return None


# --- sasl.jaas.config -----------------------------------------------------------------------------

_JAAS: Final = re.compile(
    r"^\s*(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)\s*"
    r"(?P<options>.*?)\s*;\s*$",
    re.DOTALL,
)
_OPTION: Final = re.compile(
    r'\s*(?P<key>[\w.\-]+)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s";]+))'
)
_MODULES: Final = {
    "org.apache.kafka.common.security.scram.ScramLoginModule": "SCRAM",
    "org.apache.kafka.common.security.plain.PlainLoginModule": PLAIN,
}


def parse_jaas_config(text: str, key: str = "sasl.jaas.config") -> tuple[str, Login]:
    """(``SCRAM`` or ``PLAIN``, the login) of a JAAS line such as
    ``org.apache.kafka.common.security.scram.ScramLoginModule required username="u"
    password="p";``. ConfigError, never echoing the text (it holds a password)."""
    m = _JAAS.match(text)
    if m is None:
        raise ConfigError(
            f'config {key}: expected \'<LoginModule> required username="..." '
            'password="...";\' (the value is not shown: it holds a password)'
        )
    kind = _MODULES.get(m.group("module"))
    if kind is None:
        raise ConfigError(
            f"config {key}: login module {m.group('module')!r} is not supported; use "
            + " or ".join(_MODULES)
        )
    options: dict[str, str] = {}
    rest = m.group("options")
    pos = 0
    while pos < len(rest):
        o = _OPTION.match(rest, pos)
        if o is None:
            raise ConfigError(
                f'config {key}: options must be key="value" pairs (the value is not shown: '
                "it holds a password)"
            )
        value = o.group("quoted")
        value = re.sub(r"\\(.)", r"\1", value) if value is not None else o.group("bare")
        options[o.group("key")] = value
        pos = o.end()
        while pos < len(rest) and rest[pos].isspace():
            pos += 1
    if not options.get("username") or "password" not in options:
        raise ConfigError(f'config {key}: give both username="..." and password="..."')
    return kind, Login(options["username"], options["password"])


def client_login(jaas_config: str, username: str, password: str) -> Login:
    """A client's login from sasl.jaas.config or sasl.username/sasl.password (not both)."""
    if jaas_config and (username or password):
        raise ConfigError(
            "config sasl.jaas.config and sasl.username/sasl.password are both set: give one"
        )
    if jaas_config:
        return parse_jaas_config(jaas_config)[1]
    if not username:
        raise ConfigError(
            "config security.protocol is SASL_PLAINTEXT or SASL_SSL but no login is given: "
            'set sasl.jaas.config (ScramLoginModule required username="..." password="...";) '
            "or sasl.username and sasl.password"
        )
    return Login(username, password)
