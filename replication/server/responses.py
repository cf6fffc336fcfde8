"""What request handlers put on the wire for an error: its code and its message."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from logstore.errors import ReplogError
from replication import protocol as p

Handler = Callable[[p.RequestHeader, Any], Awaitable[Any]]


def error_code(err: ReplogError | None) -> int:
    if err is None:
        return 0
    return err.code if err.code is not None else -1


#: error messages go back on the wire; one that echoes a huge input is cut to this
MAX_ERROR_MESSAGE = 1000


def error_message(err: ReplogError | None) -> str | None:
    if err is None:
        return None
    text = str(err)
    return text if len(text) <= MAX_ERROR_MESSAGE else text[: MAX_ERROR_MESSAGE - 3] + "..."
