"""What every client command of the CLI shares: where the cluster is (``--bootstrap-server``)
and how to reach it (``--command-config FILE``, as Kafka's tools: a Java properties file of
client configs, e.g. security.protocol, sasl.*, ssl.*)::

    replog topics list --bootstrap-server 127.0.0.1:9092 --command-config client.properties

A command builds its clients with :func:`client_config` (or :func:`admin_client`), so a secured
cluster takes the same file for every command.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from logstore.errors import ReplogError

if TYPE_CHECKING:
    from replication.client import Admin

__all__ = [
    "DEFAULT_BOOTSTRAP",
    "BootstrapOption",
    "CommandConfigOption",
    "CommandError",
    "admin_client",
    "client_config",
    "key_values",
    "read_properties",
]

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"

BootstrapOption = Annotated[
    str,
    typer.Option(
        "--bootstrap-server",
        help="a broker's HOST:PORT to start from (a comma list works: h1:9092,h2:9092)",
    ),
]
CommandConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--command-config",
        help="a properties file of client configs (security.protocol, sasl.*, ssl.*), as "
        "Kafka's tools take",
        show_default=False,
    ),
]


class CommandError(ReplogError):
    """The command cannot do what was asked; the message says what to change."""


_EXAMPLES = {
    "--config": "retention.ms=86400000",
    "--property": "print.key=true",
    "--consumer-property": "fetch.max.wait.ms=100",
    "--consumer-props": "fetch.max.wait.ms=100",
}


def key_values(flag: str, pairs: list[str] | None) -> dict[str, str]:
    """``["key=value", ...]`` of a repeated flag into a mapping (malformed pairs refused)."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            example = _EXAMPLES.get(flag, "linger.ms=10")
            raise CommandError(f"{flag} {pair!r}: expected key=value, e.g. {flag} {example}")
        out[name.strip()] = value.strip()
    return out


def read_properties(path: Path) -> dict[str, str]:
    """A ``--command-config`` Java properties file as a mapping (ConfigError names the file
    when it cannot be read)."""
    from replication.config import read_properties as read

    return read(path, "--command-config")


def client_config(bootstrap: str, command_config: Path | None, **more: Any) -> dict[str, Any]:
    """Client configs by Kafka's names: the ``--command-config`` file's, then ``more``, with
    bootstrap.servers from ``--bootstrap-server``."""
    values: dict[str, Any] = read_properties(command_config) if command_config else {}
    values.update(more)
    values["bootstrap.servers"] = bootstrap
    return values


def admin_client(bootstrap: str, command_config: Path | None = None) -> Admin:
    from replication.client import Admin

    return Admin(client_config(bootstrap, command_config))
