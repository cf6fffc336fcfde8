"""``replog configs``: describe and change topic and broker configs without a restart, as
Kafka's kafka-configs.sh.

    replog configs describe --entity-type topics --entity-name events          # its overrides
    replog configs describe --entity-type topics --entity-name events --all    # every key
    replog configs alter --entity-type topics --entity-name events \\
        --add-config retention.ms=3600000,segment.bytes=16777216
    replog configs alter --entity-type topics --entity-name events --delete-config retention.ms
    replog configs alter --entity-type brokers --entity-default --add-config retention.ms=86400000
    replog configs alter --entity-type brokers --entity-name 1 --add-config min.insync.replicas=2
    replog configs describe --entity-type brokers --entity-name 1 --all

Changes go through the controller into the cluster metadata (IncrementalAlterConfigs), so they
survive restarts and controller failover, and every broker applies them as it applies that
metadata. The CLI registers :data:`configs_app` under ``configs``; errors are one line on
stderr and exit status 1, as every replog command.
"""

from __future__ import annotations

import json
from typing import Annotated, Final, Literal

import typer

from logstore.errors import ConfigError
from replication.tools.cli_common import BootstrapOption, CommandConfigOption, admin_client

__all__ = ["configs_app"]

configs_app = typer.Typer(
    no_args_is_help=True,
    help="Describe and change topic and broker configs live (as kafka-configs).",
)

#: --entity-type values, as kafka-configs takes them, and the Admin resource type of each.
ResourceKind = Literal["topic", "broker"]
_ENTITY_TYPES: Final[dict[str, ResourceKind]] = {"topics": "topic", "brokers": "broker"}
#: The dynamic sources: what `describe` shows without --all (as kafka-configs).
_DYNAMIC_SOURCES: Final = frozenset(
    {"DYNAMIC_TOPIC_CONFIG", "DYNAMIC_BROKER_CONFIG", "DYNAMIC_DEFAULT_BROKER_CONFIG"}
)

EntityTypeOption = Annotated[
    str, typer.Option("--entity-type", help="topics or brokers", show_default=False)
]
EntityNameOption = Annotated[
    str | None,
    typer.Option("--entity-name", help="the topic's name, or the broker's id", show_default=False),
]
EntityDefaultOption = Annotated[
    bool,
    typer.Option(
        "--entity-default", help="the cluster-wide default of every broker (--entity-type brokers)"
    ),
]


def _entity(entity_type: str, name: str | None, default: bool) -> tuple[ResourceKind, str, str]:
    """(Admin resource type, resource name, text for messages) from the entity flags."""
    resource = _ENTITY_TYPES.get(entity_type)
    if resource is None:
        raise ConfigError(
            f"--entity-type {entity_type!r}: use {' or '.join(_ENTITY_TYPES)} "
            "(e.g. --entity-type topics --entity-name events)"
        )
    if default:
        if resource != "broker":
            raise ConfigError("--entity-default applies to --entity-type brokers only")
        if name is not None:
            raise ConfigError("give --entity-name or --entity-default, not both")
        return resource, "", "default broker"
    if not name:
        raise ConfigError(
            f"--entity-type {entity_type} needs --entity-name"
            + (" (a broker id) or --entity-default" if resource == "broker" else " (the topic)")
        )
    if resource == "broker" and not name.isdigit():
        raise ConfigError(f"--entity-name {name!r}: a broker is named by its id, e.g. 1")
    return resource, name, f"{resource} {name}"


def parse_add_config(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` (kafka-configs' --add-config) into a mapping, refusing malformed pairs."""
    out: dict[str, str] = {}
    for pair in (p.strip() for p in text.split(",")):
        if not pair:
            continue
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise ConfigError(
                f"--add-config {text!r}: expected key=value pairs separated by commas, e.g. "
                "retention.ms=3600000,segment.bytes=16777216"
            )
        if name.strip() in out:
            raise ConfigError(f"--add-config names {name.strip()!r} twice")
        out[name.strip()] = value.strip()
    return out


@configs_app.command("describe")
def describe(
    entity_type: EntityTypeOption,
    entity_name: EntityNameOption = None,
    entity_default: EntityDefaultOption = False,
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
    all_configs: Annotated[
        bool, typer.Option("--all", help="every key, not only the dynamic ones")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """The dynamic configs of a topic or broker (every config with --all), with each value's
    source (DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG,
    STATIC_BROKER_CONFIG, DEFAULT_CONFIG) and whether it can be altered live."""
    resource, name, what = _entity(entity_type, entity_name, entity_default)
    with admin_client(bootstrap, command_config) as admin:
        entries = admin.describe_configs(resource, name)
    shown = [
        e
        for e in sorted(entries.values(), key=lambda e: e.name)
        if all_configs or e.source in _DYNAMIC_SOURCES
    ]
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {
                        "name": e.name,
                        "value": e.value,
                        "source": e.source,
                        "read_only": e.read_only,
                        "sensitive": e.is_sensitive,
                    }
                    for e in shown
                ]
            )
        )
        return
    typer.echo(f"{'All' if all_configs else 'Dynamic'} configs for {what} are:")
    for e in shown:
        value = "null" if e.value is None else e.value
        typer.echo(
            f"  {e.name}={value} source={e.source} "
            f"read_only={str(e.read_only).lower()} sensitive={str(e.is_sensitive).lower()}"
        )


@configs_app.command("alter")
def alter(
    entity_type: EntityTypeOption,
    entity_name: EntityNameOption = None,
    entity_default: EntityDefaultOption = False,
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
    add_config: Annotated[
        str | None,
        typer.Option(
            "--add-config", help="key=value pairs to set, comma separated", show_default=False
        ),
    ] = None,
    delete_config: Annotated[
        str | None,
        typer.Option(
            "--delete-config",
            help="keys to remove (back to the broker's value or the default), comma separated",
            show_default=False,
        ),
    ] = None,
    validate_only: Annotated[
        bool, typer.Option("--dry-run", help="validate only: change nothing")
    ] = False,
) -> None:
    """Set (--add-config) and remove (--delete-config) dynamic configs of a topic or broker;
    applied by every broker without a restart. Keys that need a restart are refused."""
    resource, name, what = _entity(entity_type, entity_name, entity_default)
    to_set = parse_add_config(add_config or "")
    to_delete = [k.strip() for k in (delete_config or "").split(",") if k.strip()]
    if not to_set and not to_delete:
        raise ConfigError("nothing to change: give --add-config k=v and/or --delete-config k")
    both = sorted(set(to_set) & set(to_delete))
    if both:
        raise ConfigError(f"{', '.join(both)}: both added and deleted; give each key once")
    with admin_client(bootstrap, command_config) as admin:
        admin.incremental_alter_configs(
            resource,
            name,
            set_configs=to_set,
            delete_configs=to_delete,
            validate_only=validate_only,
        )
    verb = "Validated" if validate_only else "Completed updating"
    if resource == "broker" and not name:
        typer.echo(f"{verb} default config for brokers in the cluster.")
    else:
        typer.echo(f"{verb} config for {what}.")
