"""SCRAM credentials (RFC 5802, RFC 7677) as Kafka stores them: never the password, only the
salt, the iteration count and the keys derived from it (StoredKey, ServerKey).

Credentials are made with scramp (``ScramMechanism.make_auth_info``), the library the SASL
server and client use too, so a password is normalized (SASLprep) the same way everywhere in
replog. Kafka's AlterUserScramCredentials carries the *salted* password instead (the client
salts: ``SaltedPassword = Hi(password, salt, iterations)``): :func:`credential_from_salted`
turns that into the stored keys, and :func:`salted_password` is what a client sends.
Passwords and salted passwords are never kept, logged or shown; the keys stay out of reprs.

Kafka's bounds hold: 4096 to 16384 iterations (fewer is too cheap to guess, more costs every
login too much), SCRAM-SHA-256 and SCRAM-SHA-512 only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass, field
from typing import Final

from scramp import ScramException, ScramMechanism
from scramp.utils import saslprep

__all__ = [
    "DEFAULT_ITERATIONS",
    "MAX_ITERATIONS",
    "MECHANISMS",
    "MIN_ITERATIONS",
    "ScramCredential",
    "credential_from_salted",
    "fake_credential",
    "mechanism_name",
    "new_credential",
    "salted_password",
]

#: The SCRAM mechanisms, by SASL name, with their Kafka wire codes (AlterUserScramCredentials).
MECHANISMS: Final = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
_HASHES: Final = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
#: Kafka's bounds on a credential's iteration count (ScramMechanism.minIterations/maxIterations)
MIN_ITERATIONS: Final = 4096
MAX_ITERATIONS: Final = 16384
#: what ``replog users add`` uses unless told
DEFAULT_ITERATIONS: Final = 8192
#: bytes of a new random salt
SALT_BYTES: Final = 32


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """A user's credential for one mechanism; the secret parts never show in a repr."""

    user: str
    mechanism: str
    iterations: int
    salt: bytes = field(repr=False)
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)

    def auth_info(self) -> tuple[bytes, bytes, bytes, int]:
        """What a scramp server's ``auth_fn`` returns: (salt, StoredKey, ServerKey,
        iterations)."""
        return self.salt, self.stored_key, self.server_key, self.iterations


def mechanism_name(code: int) -> str:
    """The SASL name of a Kafka mechanism code (1, 2); ValueError lists the known ones."""
    for name, known in MECHANISMS.items():
        if known == code:
            return name
    raise ValueError(
        f"SCRAM mechanism code {code} is unknown: use "
        + ", ".join(f"{c} ({n})" for n, c in MECHANISMS.items())
    )


def _check(user: str, mechanism: str, iterations: int) -> None:
    if mechanism not in MECHANISMS:
        raise ValueError(
            f"SCRAM mechanism {mechanism!r} is not supported: use one of {', '.join(MECHANISMS)}"
        )
    if not user:
        raise ValueError("SCRAM user name is empty: name the user")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(
            f"SCRAM iterations {iterations} for user {user!r} are outside "
            f"{MIN_ITERATIONS}..{MAX_ITERATIONS} (Kafka's bounds): use e.g. {DEFAULT_ITERATIONS}"
        )


def new_credential(
    user: str,
    mechanism: str,
    password: str,
    iterations: int = DEFAULT_ITERATIONS,
    salt: bytes | None = None,
) -> ScramCredential:
    """The credential of ``user`` for ``password`` (a new random salt unless given).

    ValueError for an unknown mechanism, an empty user or password, or an iteration count
    outside Kafka's bounds; the message never carries the password."""
    _check(user, mechanism, iterations)
    if not password:
        raise ValueError(f"SCRAM password for user {user!r} is empty")
    try:
        made_salt, stored_key, server_key, count = ScramMechanism(mechanism).make_auth_info(
            password, iteration_count=iterations, salt=salt or os.urandom(SALT_BYTES)
        )
    except ScramException as err:  # a password SASLprep refuses (control characters), a
        # salt under 12 bytes; scramp's messages name the rule, never the password
        raise ValueError(f"SCRAM credential for user {user!r} cannot be made: {err}") from None
    return ScramCredential(user, mechanism, int(count), bytes(made_salt), stored_key, server_key)


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    """``Hi(password, salt, iterations)`` (RFC 5802), what AlterUserScramCredentials carries
    in place of the password; the password is SASLprep-normalized as scramp does."""
    _check("-", mechanism, iterations)
    return hashlib.pbkdf2_hmac(_HASHES[mechanism], saslprep(password).encode(), salt, iterations)


def credential_from_salted(
    user: str, mechanism: str, iterations: int, salt: bytes, salted: bytes
) -> ScramCredential:
    """The credential an AlterUserScramCredentials upsertion makes (RFC 5802:
    ``StoredKey = H(HMAC(SaltedPassword, "Client Key"))``,
    ``ServerKey = HMAC(SaltedPassword, "Server Key")``); the salted password is not kept.

    ValueError as :func:`new_credential`, and for an empty salt or salted password."""
    _check(user, mechanism, iterations)
    digest = _HASHES[mechanism]
    if not salt:
        raise ValueError(f"SCRAM salt for user {user!r} is empty")
    if len(salted) != hashlib.new(digest).digest_size:
        raise ValueError(
            f"SCRAM salted password for user {user!r} has {len(salted)} bytes, not the "
            f"{hashlib.new(digest).digest_size} of {mechanism}"
        )
    client_key = hmac.digest(salted, b"Client Key", digest)
    stored_key = hashlib.new(digest, client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", digest)
    return ScramCredential(user, mechanism, iterations, bytes(salt), stored_key, server_key)


def fake_credential(
    server_secret: bytes, user: str, mechanism: str, iterations: int = DEFAULT_ITERATIONS
) -> ScramCredential:
    """A credential for a user that does not exist, so that the SASL server answers an unknown
    user as it answers a known one with a wrong password: a salt and keys derived from
    ``server_secret`` (random per broker process) and the name, the same at every attempt
    (a salt that changed would tell the user is unknown). No password matches it, short of
    breaking HMAC."""
    digest = _HASHES.get(mechanism, "sha256")

    def derive(label: str) -> bytes:
        return hmac.digest(server_secret, f"{label}\0{mechanism}\0{user}".encode(), digest)

    return ScramCredential(
        user,
        mechanism,
        iterations,
        derive("salt")[:SALT_BYTES],
        derive("stored-key"),
        derive("server-key"),
    )
