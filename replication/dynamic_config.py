"""Dynamic configuration, as Kafka's DynamicBrokerConfig and ConfigAdminManager: which keys
AlterConfigs and IncrementalAlterConfigs may change, how their operations apply, how they are
validated (with the same messages as a broker's config file at start), and the broker config
in force once the dynamic values in the metadata image are laid over a broker's static one.

Where a value comes from, most specific first (Kafka's order):

    topic override (DYNAMIC_TOPIC_CONFIG)          topic keys only, TopicInfo.configs
    this broker's dynamic config (DYNAMIC_BROKER_CONFIG)        image.broker_configs["<id>"]
    the cluster-wide dynamic default (DYNAMIC_DEFAULT_BROKER_CONFIG)   image.broker_configs[""]
    the broker's config file or --set (STATIC_BROKER_CONFIG)
    replog's default (DEFAULT_CONFIG)

Only keys whose new value is applied live are dynamic: the topic-level defaults (the log
settings and the replication policy). Every other broker key needs a restart and is refused,
as Kafka refuses it ("Cannot update these configs dynamically").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

from logstore.config import LogConfig, keys_of, parse, to_mapping
from logstore.errors import ConfigError
from replication.config import BrokerConfig, broker_config_from
from replication.errors import InvalidRequestError
from replication.metadata.image import DEFAULT_BROKER_ENTITY, MetadataImage

log = logging.getLogger(__name__)

#: IncrementalAlterConfigs operations (Kafka's AlterConfigOp.OpType).
SET: Final = 0
DELETE: Final = 1
APPEND: Final = 2
SUBTRACT: Final = 3
_OP_NAMES: Final = {SET: "SET", DELETE: "DELETE", APPEND: "APPEND", SUBTRACT: "SUBTRACT"}

#: Topic-level keys beyond the log's own: the replication policy of a topic (BrokerConfig
#: field names), whose broker values are every topic's defaults.
TOPIC_POLICY_KEYS: Final = {
    "min.insync.replicas": "min_insync_replicas",
    "unclean.leader.election.enable": "unclean_leader_election_enable",
}
#: Every key a topic may override.
TOPIC_KEYS: Final = frozenset(keys_of(LogConfig)) | frozenset(TOPIC_POLICY_KEYS)
#: Broker keys applied without a restart: every topic-level default (each broker reconfigures
#: the logs it hosts when it applies the metadata that changed them; the controller reads
#: unclean.leader.election.enable at each election).
DYNAMIC_BROKER_KEYS: Final = TOPIC_KEYS
#: Every broker key (static or dynamic).
BROKER_KEYS: Final = frozenset(keys_of(BrokerConfig)) | frozenset(keys_of(LogConfig))


def validate_topic_configs(configs: Sequence[tuple[str, str]]) -> None:
    """Refuse unknown topic keys and bad values, naming the key (at creation and alteration)."""
    for name, _ in configs:
        if name not in TOPIC_KEYS:
            allowed = ", ".join(sorted(TOPIC_KEYS))
            raise ConfigError(f"unknown topic config {name!r}; topic configs are: {allowed}")
    parse(LogConfig, {k: v for k, v in configs if k in keys_of(LogConfig)})
    parse(BrokerConfig, {k: v for k, v in configs if k in TOPIC_POLICY_KEYS})


def validate_broker_configs(configs: Mapping[str, str]) -> None:
    """Refuse unknown broker keys, keys that need a restart, and bad values, naming the key."""
    for name in configs:
        if name not in BROKER_KEYS:
            raise ConfigError(
                f"unknown broker config {name!r}; dynamic broker configs are: "
                f"{', '.join(sorted(DYNAMIC_BROKER_KEYS))}"
            )
    static = sorted(set(configs) - DYNAMIC_BROKER_KEYS)
    if static:
        raise ConfigError(
            f"Cannot update these configs dynamically: {', '.join(static)}: they need a "
            "restart; set them in the broker's config file or with --set. Dynamic broker "
            f"configs are: {', '.join(sorted(DYNAMIC_BROKER_KEYS))}"
        )
    broker_config_from(configs)


def broker_entity(name: str) -> str:
    """The entity of a BROKER config resource: a broker id, or "" for the cluster default."""
    if name == DEFAULT_BROKER_ENTITY:
        return name
    if not name.isdigit():
        raise InvalidRequestError(
            f"broker config resource {name!r}: name a broker id (e.g. 1), or the empty name "
            "for the cluster-wide default (--entity-default)"
        )
    return str(int(name))


def apply_config_ops(
    current: Mapping[str, str],
    ops: Sequence[tuple[int, str, str | None]],
    *,
    replace_all: bool,
) -> dict[str, str]:
    """The configs after ``ops`` (operation, key, value): AlterConfigs (``replace_all``: the
    given keys become the whole set, every op a SET) or IncrementalAlterConfigs."""
    seen: set[str] = set()
    for _, name, _ in ops:
        if name in seen:
            raise InvalidRequestError(f"config {name!r} is named twice in one resource")
        seen.add(name)
    out = {} if replace_all else dict(current)
    for op, name, value in ops:
        if op == SET:
            if value is None:
                raise InvalidRequestError(f"config {name!r}: a null value cannot be set")
            out[name] = value
        elif op == DELETE:
            out.pop(name, None)
        elif op in (APPEND, SUBTRACT):
            raise InvalidRequestError(
                f"config {name!r}: {_OP_NAMES[op]} applies to list-typed configs and replog has "
                "none; use SET"
            )
        else:
            raise InvalidRequestError(
                f"config {name!r}: unknown operation {op}; use 0 (SET), 1 (DELETE), 2 (APPEND) "
                "or 3 (SUBTRACT)"
            )
    return out


def dynamic_broker_overrides(image: MetadataImage, broker_id: int) -> dict[str, str]:
    """The dynamic values in force on broker ``broker_id``: its own over the cluster default."""
    return {
        **image.broker_config_map(DEFAULT_BROKER_ENTITY),
        **image.broker_config_map(str(broker_id)),
    }


def effective_broker_config(static: BrokerConfig, image: MetadataImage) -> BrokerConfig:
    """``static`` with the dynamic broker configs of ``image`` laid over it."""
    overrides = dynamic_broker_overrides(image, static.broker_id)
    if not overrides:
        return static
    values: dict[str, Any] = {
        **to_mapping(static),
        **to_mapping(static.log),
        **to_mapping(static.security),
        **overrides,
    }
    try:
        return broker_config_from(values)
    except ConfigError as err:  # validated by the controller; a newer replog's key, say
        log.warning("dynamic broker configs not applied (%s): keeping the static ones", err)
        return static


def topic_defaults(config: BrokerConfig) -> dict[str, Any]:
    """Every topic-level key with the broker's value for it (the default of every topic)."""
    defaults = to_mapping(config.log)
    for key, attr in TOPIC_POLICY_KEYS.items():
        defaults[key] = getattr(config, attr)
    return defaults
