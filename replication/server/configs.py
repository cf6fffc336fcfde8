"""What DescribeConfigs reports: a topic's configs (its own overrides, else the broker's
defaults) and a broker's static configs, with Kafka's names and config sources.

Values of keys that hold secrets are never sent (Kafka marks them sensitive and sends null).
"""

from __future__ import annotations

from typing import Any, Final

from logstore.config import keys_of, to_mapping
from logstore.errors import ReplogError
from replication import protocol as p
from replication.config import BrokerConfig
from replication.errors import InvalidRequestError, UnknownTopicOrPartitionError
from replication.metadata.image import MetadataImage
from replication.server.responses import error_code, error_message

#: Topic-level keys beyond the log's own: the replication policy of a topic.
_TOPIC_POLICY_KEYS: Final = {
    "min.insync.replicas": "min_insync_replicas",
    "unclean.leader.election.enable": "unclean_leader_election_enable",
}
_SENSITIVE_WORDS: Final = ("password", "secret", "jaas", "key.pem", "credentials")


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _sensitive(name: str) -> bool:
    return any(word in name for word in _SENSITIVE_WORDS)


def topic_defaults(config: BrokerConfig) -> dict[str, str]:
    """Every topic-level key with the broker's default for it."""
    defaults = {k: _text(v) for k, v in to_mapping(config.log).items()}
    for key, attr in _TOPIC_POLICY_KEYS.items():
        defaults[key] = _text(getattr(config, attr))
    return defaults


def broker_configs(config: BrokerConfig) -> dict[str, str]:
    """Every broker key with this broker's value (the log defaults included)."""
    values = {k: _text(getattr(config, f.name)) for k, f in keys_of(BrokerConfig).items()}
    values.update({k: _text(v) for k, v in to_mapping(config.log).items()})
    return values


def _entries(
    values: dict[str, str], sources: dict[str, int], keys: list[str] | None
) -> list[p.DescribeConfigsResourceResult]:
    names = sorted(values) if keys is None else [k for k in keys if k in values]
    return [
        p.DescribeConfigsResourceResult(
            name=name,
            value=None if _sensitive(name) else values[name],
            is_sensitive=_sensitive(name),
            config_source=sources.get(name, p.DEFAULT_CONFIG),
            # Topic configs change with CreateTopics only for now: read-only to an Alter.
            read_only=True,
        )
        for name in names
    ]


def describe_configs(
    config: BrokerConfig, image: MetadataImage, resource: p.DescribeConfigsResource
) -> p.DescribeConfigsResult:
    """The configs of one resource (a topic or this broker), or why there are none."""
    try:
        if resource.resource_type == p.TOPIC_RESOURCE:
            topic = image.topic(resource.resource_name)
            if topic is None:
                raise UnknownTopicOrPartitionError(
                    f"topic {resource.resource_name!r} does not exist"
                )
            values = topic_defaults(config)
            overrides = topic.config_map()
            values.update(overrides)
            sources = dict.fromkeys(overrides, p.DYNAMIC_TOPIC_CONFIG)
        elif resource.resource_type == p.BROKER_RESOURCE:
            if resource.resource_name not in ("", str(config.broker_id)):
                raise InvalidRequestError(
                    f"broker {resource.resource_name!r}: ask that broker for its configs "
                    f"(this is broker {config.broker_id})"
                )
            values = broker_configs(config)
            sources = dict.fromkeys(values, p.STATIC_BROKER_CONFIG)
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
        configs=_entries(values, sources, resource.configuration_keys),
    )
