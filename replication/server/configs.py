"""What DescribeConfigs reports: a topic's configs (its own overrides, else the broker's
defaults), a broker's configs, or the cluster-wide dynamic defaults, each with Kafka's name,
config source (DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG,
STATIC_BROKER_CONFIG, DEFAULT_CONFIG) and whether AlterConfigs may change it (read_only).

A key counts as STATIC_BROKER_CONFIG when the broker's value differs from replog's default
(the config file or --set gave it); a key set to its default reads as DEFAULT_CONFIG.
Values of keys that hold secrets are never sent (Kafka marks them sensitive and sends null).
"""

from __future__ import annotations

from typing import Any, Final

from logstore.config import LogConfig, keys_of, to_mapping
from logstore.errors import ReplogError
from replication import protocol as p
from replication.config import BrokerConfig
from replication.dynamic_config import (
    DYNAMIC_BROKER_KEYS,
    effective_broker_config,
    topic_defaults,
)
from replication.errors import InvalidRequestError, UnknownTopicOrPartitionError
from replication.metadata.image import DEFAULT_BROKER_ENTITY, MetadataImage
from replication.server.responses import error_code, error_message

_SENSITIVE_WORDS: Final = ("password", "secret", "jaas", "key.pem", "credentials")
_DEFAULTS: Final = {
    **{k: getattr(BrokerConfig(), f.name) for k, f in keys_of(BrokerConfig).items()},
    **to_mapping(LogConfig()),
}


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _sensitive(name: str) -> bool:
    return any(word in name for word in _SENSITIVE_WORDS)


def broker_configs(config: BrokerConfig) -> dict[str, Any]:
    """Every broker key with this broker's value (the log defaults included)."""
    values: dict[str, Any] = {k: getattr(config, f.name) for k, f in keys_of(BrokerConfig).items()}
    values.update(to_mapping(config.log))
    return values


def _broker_sources(config: BrokerConfig, image: MetadataImage) -> dict[str, int]:
    """Where each broker key's value comes from on this broker (least specific first)."""
    sources = {
        k: p.STATIC_BROKER_CONFIG if v != _DEFAULTS.get(k) else p.DEFAULT_CONFIG
        for k, v in broker_configs(config).items()
    }
    sources.update(
        dict.fromkeys(
            image.broker_config_map(DEFAULT_BROKER_ENTITY), p.DYNAMIC_DEFAULT_BROKER_CONFIG
        )
    )
    sources.update(
        dict.fromkeys(image.broker_config_map(str(config.broker_id)), p.DYNAMIC_BROKER_CONFIG)
    )
    return sources


def _entries(
    values: dict[str, Any],
    sources: dict[str, int],
    keys: list[str] | None,
    alterable: frozenset[str],
) -> list[p.DescribeConfigsResourceResult]:
    names = sorted(values) if keys is None else [k for k in keys if k in values]
    return [
        p.DescribeConfigsResourceResult(
            name=name,
            value=None if _sensitive(name) else _text(values[name]),
            is_sensitive=_sensitive(name),
            config_source=sources.get(name, p.DEFAULT_CONFIG),
            read_only=name not in alterable,
        )
        for name in names
    ]


def describe_configs(
    config: BrokerConfig, image: MetadataImage, resource: p.DescribeConfigsResource
) -> p.DescribeConfigsResult:
    """The configs of one resource (a topic, this broker, or the cluster-wide dynamic
    defaults: broker ""), or why there are none. ``config`` is this broker's static config;
    the dynamic configs in ``image`` are laid over it."""
    current = effective_broker_config(config, image)
    try:
        if resource.resource_type == p.TOPIC_RESOURCE:
            topic = image.topic(resource.resource_name)
            if topic is None:
                raise UnknownTopicOrPartitionError(
                    f"topic {resource.resource_name!r} does not exist"
                )
            values = topic_defaults(current)
            overrides = topic.config_map()
            values.update(overrides)
            sources = _broker_sources(config, image)
            sources.update(dict.fromkeys(overrides, p.DYNAMIC_TOPIC_CONFIG))
            alterable = frozenset(values)
        elif resource.resource_type == p.BROKER_RESOURCE:
            if resource.resource_name == DEFAULT_BROKER_ENTITY:  # --entity-default
                values = dict(image.broker_config_map(DEFAULT_BROKER_ENTITY))
                sources = dict.fromkeys(values, p.DYNAMIC_DEFAULT_BROKER_CONFIG)
            elif resource.resource_name == str(config.broker_id):
                values = broker_configs(current)
                sources = _broker_sources(config, image)
            else:
                raise InvalidRequestError(
                    f"broker {resource.resource_name!r}: ask that broker for its configs "
                    f"(this is broker {config.broker_id})"
                )
            alterable = DYNAMIC_BROKER_KEYS
        else:
            raise InvalidRequestError(
                f"resource type {resource.resource_type} is not served: use 2 (topic) or 4 (broker)"
            )
    except ReplogError as err:
        return p.DescribeConfigsResult(
            error_code=error_code(err),
            error_message=error_message(err),
            resource_type=resource.resource_type,
            resource_name=resource.resource_name,
        )
    return p.DescribeConfigsResult(
        resource_type=resource.resource_type,
        resource_name=resource.resource_name,
        configs=_entries(values, sources, resource.configuration_keys, alterable),
    )
