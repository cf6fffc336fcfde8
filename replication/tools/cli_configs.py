"""``replog configs``: describe and change topic and broker configs and client quotas without
a restart, as Kafka's kafka-configs.sh.

    replog configs describe --entity-type topics --entity-name events          # its overrides
    replog configs describe --entity-type topics --entity-name events --all    # every key
    replog configs alter --entity-type topics --entity-name events \\
        --add-config retention.ms=3600000,segment.bytes=16777216
    replog configs alter --entity-type topics --entity-name events --delete-config retention.ms
    replog configs alter --entity-type brokers --entity-default --add-config retention.ms=86400000
    replog configs alter --entity-type brokers --entity-name 1 --add-config min.insync.replicas=2
    replog configs describe --entity-type brokers --entity-name 1 --all
    replog configs alter --entity-type users --entity-name alice \\
        --add-config producer_byte_rate=1048576,consumer_byte_rate=2097152
    replog configs alter --user alice --client app --add-config request_percentage=50
    replog configs alter --client-defaults --add-config producer_byte_rate=10485760
    replog configs describe --entity-type users                 # every user's quotas

Changes go through the controller into the cluster metadata (IncrementalAlterConfigs,
AlterClientQuotas), so they survive restarts and controller failover, and every broker applies
them as it applies that metadata. The CLI registers :data:`configs_app` under ``configs``;
errors are one line on stderr and exit status 1, as every replog command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Final, Literal

import typer

from logstore.errors import ConfigError
from replication.client_quotas import CLIENT_ID, USER
from replication.metadata.image import QuotaEntity
from replication.tools.cli_common import BootstrapOption, CommandConfigOption, admin_client

__all__ = ["configs_app"]

configs_app = typer.Typer(
    no_args_is_help=True,
    help="Describe and change topic and broker configs and client quotas live (as kafka-configs).",
)

#: --entity-type values, as kafka-configs takes them, and the Admin resource type of each.
ResourceKind = Literal["topic", "broker"]
_ENTITY_TYPES: Final[dict[str, ResourceKind]] = {"topics": "topic", "brokers": "broker"}
#: The dynamic sources: what `describe` shows without --all (as kafka-configs).
_DYNAMIC_SOURCES: Final = frozenset(
    {"DYNAMIC_TOPIC_CONFIG", "DYNAMIC_BROKER_CONFIG", "DYNAMIC_DEFAULT_BROKER_CONFIG"}
)

#: the quota entity types, as kafka-configs takes them
_QUOTA_TYPES: Final = {"users": USER, "clients": CLIENT_ID}

EntityTypeOption = Annotated[
    str | None,
    typer.Option(
        "--entity-type", help="topics, brokers, users or clients", show_default=False
    ),
]
EntityNameOption = Annotated[
    str | None,
    typer.Option("--entity-name", help="the topic's name, or the broker's id", show_default=False),
]
EntityDefaultOption = Annotated[
    bool,
    typer.Option(
        "--entity-default",
        help="the cluster-wide default of every broker, user or client (no --entity-name)",
    ),
]
UserOption = Annotated[
    str | None,
    typer.Option("--user", help="a user's client quotas (with --client: that client's)"),
]
UserDefaultsOption = Annotated[
    bool, typer.Option("--user-defaults", help="the default user's client quotas")
]
ClientOption = Annotated[
    str | None, typer.Option("--client", help="a client id's quotas (with --user: that user's)")
]
ClientDefaultsOption = Annotated[
    bool, typer.Option("--client-defaults", help="the default client id's quotas")
]


def _quota_entity(
    entity_type: str | None,
    name: str | None,
    default: bool,
    users: tuple[str | None, bool],
    clients: tuple[str | None, bool],
) -> dict[str, str | None] | None:
    """The quota entity the flags name (entity type -> name, None for the default entity);
    {} for every entity of --entity-type users/clients without a name (describe); None
    if the flags name a topic or broker instead."""
    entity: dict[str, str | None] = {}
    for kind, (named, defaults) in ((USER, users), (CLIENT_ID, clients)):
        if named is not None and defaults:
            raise ConfigError(f"give --{'client' if kind == CLIENT_ID else 'user'} or its "
                              "--*-defaults, not both")  # fmt: skip
        if named is not None or defaults:
            entity[kind] = named
    if entity_type in _QUOTA_TYPES:
        if name is not None and default:
            raise ConfigError("give --entity-name or --entity-default, not both")
        if name is not None or default:
            entity[_QUOTA_TYPES[entity_type]] = name
        elif not entity:
            return {}
    elif entity and entity_type is not None:
        raise ConfigError(f"--user and --client name client quotas, not {entity_type}")
    return entity or None


def _quota_text(entity: QuotaEntity | dict[str, str | None]) -> str:
    """kafka-configs' words for a quota entity: ``user-principal 'alice', client-id 'app'``."""
    names = dict(entity)
    parts = []
    for kind, word in ((USER, "user-principal"), (CLIENT_ID, "client-id")):
        if kind in names:
            name = names[kind]
            parts.append(f"the default {word}" if name is None else f"{word} {name!r}")
    return ", ".join(parts)


def _entity(
    entity_type: str | None, name: str | None, default: bool
) -> tuple[ResourceKind, str, str]:
    """(Admin resource type, resource name, text for messages) from the entity flags."""
    resource = _ENTITY_TYPES.get(entity_type or "")
    if resource is None:
        raise ConfigError(
            f"--entity-type {entity_type!r}: use {', '.join([*_ENTITY_TYPES, *_QUOTA_TYPES])} "
            "(e.g. --entity-type topics --entity-name events), or --user / --client"
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
    entity_type: EntityTypeOption = None,
    entity_name: EntityNameOption = None,
    entity_default: EntityDefaultOption = False,
    user: UserOption = None,
    user_defaults: UserDefaultsOption = False,
    client: ClientOption = None,
    client_defaults: ClientDefaultsOption = False,
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
    all_configs: Annotated[
        bool, typer.Option("--all", help="every key, not only the dynamic ones")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """The dynamic configs of a topic or broker (every config with --all), with each value's
    source (DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG,
    STATIC_BROKER_CONFIG, DEFAULT_CONFIG) and whether it can be altered live; or the client
    quotas of users and client ids (--entity-type users/clients, --user, --client)."""
    quota_entity = _quota_entity(
        entity_type, entity_name, entity_default, (user, user_defaults), (client, client_defaults)
    )
    if quota_entity is not None:
        _describe_quotas(quota_entity, entity_type, bootstrap, command_config, as_json)
        return
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


def _describe_quotas(
    entity: dict[str, str | None],
    entity_type: str | None,
    bootstrap: str,
    command_config: Path | None,
    as_json: bool,
) -> None:
    """Each matching entity's quotas, one line each (as kafka-configs); --entity-type users or
    clients alone: every entity of that type (a user's clients are under users)."""
    with admin_client(bootstrap, command_config) as admin:
        found = admin.describe_client_quotas(entity, strict=bool(entity))
    if not entity:
        kind = _QUOTA_TYPES[entity_type or ""]
        found = {e: v for e, v in found.items() if kind in dict(e)}
    if as_json:
        typer.echo(
            json.dumps([{"entity": dict(e), "quotas": values} for e, values in found.items()])
        )
        return
    for e, values in found.items():
        shown = ", ".join(f"{k}={v}" for k, v in sorted(values.items()))
        typer.echo(f"Quota configs for {_quota_text(e)} are {shown}")


def _alter_quotas(
    entity: dict[str, str | None],
    to_set: dict[str, str],
    to_delete: list[str],
    bootstrap: str,
    command_config: Path | None,
    validate_only: bool,
) -> None:
    quotas: dict[str, float] = {}
    for key, value in to_set.items():
        try:
            quotas[key] = float(value)
        except ValueError:
            raise ConfigError(f"--add-config {key}={value!r}: give a number") from None
    with admin_client(bootstrap, command_config) as admin:
        admin.alter_client_quotas(
            entity, set_quotas=quotas, remove=to_delete, validate_only=validate_only
        )
    verb = "Validated" if validate_only else "Completed updating"
    typer.echo(f"{verb} client quotas for {_quota_text(entity)}.")


@configs_app.command("alter")
def alter(
    entity_type: EntityTypeOption = None,
    entity_name: EntityNameOption = None,
    entity_default: EntityDefaultOption = False,
    user: UserOption = None,
    user_defaults: UserDefaultsOption = False,
    client: ClientOption = None,
    client_defaults: ClientDefaultsOption = False,
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
    applied by every broker without a restart. Keys that need a restart are refused. Client
    quotas (producer_byte_rate, consumer_byte_rate, request_percentage) of users and client ids
    likewise (--entity-type users/clients, --user, --client)."""
    quota_entity = _quota_entity(
        entity_type, entity_name, entity_default, (user, user_defaults), (client, client_defaults)
    )
    to_set = parse_add_config(add_config or "")
    to_delete = [k.strip() for k in (delete_config or "").split(",") if k.strip()]
    if not to_set and not to_delete:
        raise ConfigError("nothing to change: give --add-config k=v and/or --delete-config k")
    both = sorted(set(to_set) & set(to_delete))
    if both:
        raise ConfigError(f"{', '.join(both)}: both added and deleted; give each key once")
    if quota_entity == {}:
        raise ConfigError(f"--entity-type {entity_type} needs --entity-name or --entity-default")
    if quota_entity is not None:
        _alter_quotas(quota_entity, to_set, to_delete, bootstrap, command_config, validate_only)
        return
    resource, name, what = _entity(entity_type, entity_name, entity_default)
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
