"""Who a connection is: Kafka's ``KafkaPrincipal`` (``User:alice``) and the session of one
authenticated connection.

The socket server sets :data:`SESSION` in each connection's task once the connection is
authenticated (TLS, then SASL); request handlers run inline in that task, so they read it
without it being passed through every handler. Work a node does on its own behalf (creating
an internal topic, writing transaction markers) runs in :func:`internal_scope`.

Fail closed: with an authorizer configured, a handler that finds no session denies (and logs
it as a bug); it never falls back to the internal principal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final

__all__ = [
    "ANONYMOUS",
    "INTERNAL",
    "SESSION",
    "KafkaPrincipal",
    "Session",
    "current_session",
    "internal_scope",
]


@dataclass(frozen=True, slots=True, order=True)
class KafkaPrincipal:
    """A principal as Kafka writes it: ``User:alice`` (type ``User``, name ``alice``)."""

    principal_type: str
    name: str

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> KafkaPrincipal:
        """``User:alice`` -> KafkaPrincipal("User", "alice"); ValueError names the form."""
        kind, sep, name = text.strip().partition(":")
        if not sep or not kind or not name:
            raise ValueError(f"principal {text!r}: expected TYPE:NAME, e.g. User:alice")
        return cls(kind, name)


#: Kafka's principal of a connection nothing authenticated (PLAINTEXT, or SSL without a
#: client certificate).
ANONYMOUS: Final = KafkaPrincipal("User", "ANONYMOUS")
#: The node itself, for work no client asked for (never a connection's principal).
INTERNAL: Final = KafkaPrincipal("Internal", "replog")


@dataclass(frozen=True, slots=True)
class Session:
    """One authenticated connection: its principal, the client's address and the listener."""

    principal: KafkaPrincipal
    host: str
    listener: str = "REPLOG"

    @property
    def internal(self) -> bool:
        return self.principal == INTERNAL


#: The session of the connection whose request is being handled (None: none, which an
#: authorizer denies).
SESSION: ContextVar[Session | None] = ContextVar("replog_session", default=None)


def current_session() -> Session | None:
    return SESSION.get()


@contextlib.contextmanager
def internal_scope() -> Iterator[Session]:
    """Run the block as the node itself (the authorizer allows it everything)."""
    session = Session(INTERNAL, "localhost", "INTERNAL")
    token = SESSION.set(session)
    try:
        yield session
    finally:
        SESSION.reset(token)
