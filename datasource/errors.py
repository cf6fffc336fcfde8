"""The errors the Spark data source raises itself (everything else comes from the client)."""

from __future__ import annotations

from typing import Any, Final

from logstore.errors import ConfigError, ReplogError

__all__ = ["DataLossError", "InvalidOptionError", "ReadTimeoutError", "is_secret_option"]


#: Words in an option's name that say its value is a secret (sasl.jaas.config,
#: ssl.key.password, sasl.password, storage.secret, storage.token, ...).
_SECRET_WORDS: Final = ("password", "jaas", "secret", "token", "credential")


def is_secret_option(option: str) -> bool:
    """Whether an option's value must never be printed (in errors, logs or reprs): a
    password, a JAAS login, or a storage credential (s3fs' key, secret, token)."""
    lower = option.lower()
    return lower == "storage.key" or any(word in lower for word in _SECRET_WORDS)


class InvalidOptionError(ConfigError):
    """A data source option is unknown, malformed, or conflicts with another option.

    ``option`` is the option's name as documented (``startingOffsets``, not the lower-cased
    ``startingoffsets`` Spark hands over), ``value`` what was given (None if the option was
    missing), ``allowed`` what would be accepted.
    """

    def __init__(self, option: str, value: str | None, allowed: str, reason: str = "") -> None:
        self.option = option
        self.value = value
        self.allowed = allowed
        shown = "<redacted>" if is_secret_option(option) else repr(value)
        given = " is missing" if value is None else f"={shown} is not valid"
        because = f": {reason}" if reason else ""
        self.reason = reason
        super().__init__(f"option {option}{given}{because}; expected {allowed}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.option, self.value, self.allowed, self.reason))


class DataLossError(ReplogError):
    """Offsets the query should read are gone (retention removed them, or the topic was
    deleted and recreated), so some records were never read."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(
            f"{what}. Some data may have been lost. The query fails because failOnDataLoss is "
            "true; if losing these records is acceptable, set the option failOnDataLoss to false "
            "and the query skips them with a warning naming the skipped offsets."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.what,))


class ReadTimeoutError(ReplogError):
    """Reading an offset range through the brokers made no progress in time."""

    retriable = True
