"""What request handlers put on the wire for an error: its code and its message, and an
answer per entry of a request where an entry fails alone (:func:`answer_each`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from logstore.errors import ReplogError
from replication import protocol as p

Handler = Callable[[p.RequestHeader, Any], Awaitable[Any]]

#: an entry of a request (E) and its answer (A)
E = TypeVar("E")
A = TypeVar("A")


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


async def answer_each(
    entries: Iterable[E],
    answer: Callable[[E], Awaitable[A]],
    failed: Callable[[E, ReplogError], A],
) -> list[A]:
    """``answer(entry)`` for each entry, in order; ``failed(entry, error)`` where it raised a
    ReplogError (the others go on)."""
    out = []
    for entry in entries:
        try:
            out.append(await answer(entry))
        except ReplogError as err:
            out.append(failed(entry, err))
    return out
