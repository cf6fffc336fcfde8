"""SCRAM credentials (RFC 5802, RFC 7677) as Kafka stores them: never the password, only the
salt, the iteration count and the keys derived from it (StoredKey, ServerKey)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

__all__ = ["MECHANISMS", "ScramCredential"]

#: The SCRAM mechanisms, by SASL name, with their Kafka wire codes (AlterUserScramCredentials).
MECHANISMS: Final = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """A user's credential for one mechanism; the secret parts never show in a repr."""

    user: str
    mechanism: str
    iterations: int
    salt: bytes = field(repr=False)
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)
