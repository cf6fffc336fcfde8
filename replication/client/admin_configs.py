"""The admin client's config calls (Kafka's describeConfigs, alterConfigs,
incrementalAlterConfigs, describeClientQuotas, alterClientQuotas): described by a broker (a
broker's own configs by that broker) and changed through the controller, which keeps them in
the cluster metadata."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal

from replication.client.admin_base import _error
from replication.client.admin_cluster import ClusterCalls
from replication.client.types import ConfigEntry
from replication.errors import BrokerNotAvailableError
from replication.metadata.image import QuotaEntity
from replication.protocol import (
    BROKER_RESOURCE,
    CONFIG_OP_DELETE,
    CONFIG_OP_SET,
    TOPIC_RESOURCE,
    AlterableConfig,
    AlterConfigsRequest,
    AlterConfigsResource,
    AlterConfigsResourceResponse,
    ApiKey,
    DescribeConfigsRequest,
    DescribeConfigsResource,
    DescribeConfigsResponse,
    DescribeConfigsResult,
    IncrementalAlterableConfig,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResource,
)
from replication.protocol import quotas as pq

#: The resources whose configs :meth:`Admin.describe_configs` and the alter calls take
#: (Kafka's ConfigResource.Type TOPIC and BROKER).
ConfigResourceType = Literal["topic", "broker"]
_RESOURCE_TYPES: Final = {"topic": TOPIC_RESOURCE, "broker": BROKER_RESOURCE}
#: Kafka's names of DescribeConfigs' config sources.
_CONFIG_SOURCES: Final = {
    1: "DYNAMIC_TOPIC_CONFIG",
    2: "DYNAMIC_BROKER_CONFIG",
    3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG",
    5: "DEFAULT_CONFIG",
}


def _resource_type(resource_type: str) -> int:
    code = _RESOURCE_TYPES.get(resource_type)
    if code is None:
        raise ValueError(f"config resource type {resource_type!r}: use 'topic' or 'broker'")
    return code


def _resource_text(resource_type: str, name: str) -> str:
    if resource_type == "broker" and not name:
        return "the default broker configs"
    return f"{resource_type} {name!r} configs"


class ConfigCalls(ClusterCalls):
    """Describe and alter topic and broker configs."""

    # --- configs ------------------------------------------------------------------------------

    def describe_configs(
        self,
        resource_type: ConfigResourceType,
        name: str,
        keys: Iterable[str] | None = None,
    ) -> dict[str, ConfigEntry]:
        """The configs of a topic, of a broker (``name`` its id; asked of that broker), or the
        cluster-wide dynamic broker defaults (``"broker"``, ``""``): key -> :class:`ConfigEntry`
        (value, Kafka's config source, whether it can be altered). ``keys`` limits the answer.

        Examples
        --------
        >>> admin.describe_configs("topic", "events")["retention.ms"].source  # doctest: +SKIP
        'DYNAMIC_TOPIC_CONFIG'
        """
        rtype = _resource_type(resource_type)
        what = _resource_text(resource_type, name)
        request = DescribeConfigsRequest(
            resources=[
                DescribeConfigsResource(
                    resource_type=rtype,
                    resource_name=name,
                    configuration_keys=None if keys is None else list(keys),
                )
            ]
        )
        self._check_open()
        cluster = self._cluster

        if rtype == BROKER_RESOURCE and name:  # a broker's own configs: ask that broker
            live = [b.node_id for b in self.describe_cluster().brokers]
            if not name.isdigit() or int(name) not in live:
                raise BrokerNotAvailableError(
                    f"cannot describe configs of broker {name!r}: no such live broker "
                    f"(live: {live})"
                )

        def send() -> DescribeConfigsResult:
            if not cluster.bootstrapped:
                cluster.refresh()
            if rtype == BROKER_RESOURCE and name:
                conn = cluster.connection(int(name))
                response: DescribeConfigsResponse = conn.send(
                    ApiKey.DESCRIBE_CONFIGS, conn.max_version(ApiKey.DESCRIBE_CONFIGS, 0), request
                )
            else:
                response = cluster.any_connection_send(
                    ApiKey.DESCRIBE_CONFIGS, lambda version: request, 0
                )
            return response.results[0]

        result = self._retrying(f"describing configs of {what}", send)
        if result.error_code:
            raise _error(result.error_code, result.error_message, f"cannot describe {what}")
        return {
            c.name: ConfigEntry(
                name=c.name,
                value=c.value,
                source=_CONFIG_SOURCES.get(c.config_source, "UNKNOWN"),
                read_only=c.read_only,
                is_sensitive=c.is_sensitive,
            )
            for c in result.configs
        }

    def alter_configs(
        self,
        resource_type: ConfigResourceType,
        name: str,
        configs: Mapping[str, str],
        *,
        validate_only: bool = False,
    ) -> None:
        """Replace the dynamic configs of a topic or broker (``""``: the cluster-wide default)
        with ``configs`` (Kafka's legacy AlterConfigs: keys not given go back to their
        defaults). Prefer :meth:`incremental_alter_configs`. ConfigError names a bad key."""
        request = AlterConfigsRequest(
            resources=[
                AlterConfigsResource(
                    resource_type=_resource_type(resource_type),
                    resource_name=name,
                    configs=[AlterableConfig(name=k, value=str(v)) for k, v in configs.items()],
                )
            ],
            validate_only=validate_only,
        )
        self._alter(ApiKey.ALTER_CONFIGS, request, _resource_text(resource_type, name))

    def incremental_alter_configs(
        self,
        resource_type: ConfigResourceType,
        name: str,
        *,
        set_configs: Mapping[str, str] | None = None,
        delete_configs: Iterable[str] = (),
        validate_only: bool = False,
    ) -> None:
        """Set and delete dynamic configs of a topic or broker (``""``: the cluster-wide
        default), leaving the others as they are (Kafka's IncrementalAlterConfigs). Applied
        without a restart; a deleted key falls back to the next source (broker dynamic, static,
        default). ConfigError names a bad key or value, or a key that needs a restart.

        Examples
        --------
        >>> admin.incremental_alter_configs(  # doctest: +SKIP
        ...     "topic", "events", set_configs={"retention.ms": "3600000"}
        ... )
        """
        ops = [
            IncrementalAlterableConfig(name=k, config_operation=CONFIG_OP_SET, value=str(v))
            for k, v in (set_configs or {}).items()
        ] + [
            IncrementalAlterableConfig(name=k, config_operation=CONFIG_OP_DELETE)
            for k in delete_configs
        ]
        request = IncrementalAlterConfigsRequest(
            resources=[
                IncrementalAlterConfigsResource(
                    resource_type=_resource_type(resource_type), resource_name=name, configs=ops
                )
            ],
            validate_only=validate_only,
        )
        self._alter(ApiKey.INCREMENTAL_ALTER_CONFIGS, request, _resource_text(resource_type, name))

    def _alter(self, api_key: int, request: Any, what: str) -> None:
        response = self._controller_call(
            api_key,
            request,
            f"altering configs of {what}",
            codes=lambda r: [x.error_code for x in r.responses],
        )
        result: AlterConfigsResourceResponse
        (result,) = response.responses
        if result.error_code:
            raise _error(result.error_code, result.error_message, f"cannot alter {what}")

    # --- client quotas ------------------------------------------------------------------------

    def describe_client_quotas(
        self, entity: Mapping[str, str | None] | None = None, *, strict: bool = False
    ) -> dict[QuotaEntity, dict[str, float]]:
        """The client quotas of the entities that match ``entity`` (entity type -> name, None
        for the default entity: ``{"user": "alice"}`` matches alice and each of her clients;
        none given: every entity), as entity -> {key: value}. An entity is its (type, name)
        pairs sorted by type. ``strict``: only entities of exactly the types given.

        Examples
        --------
        >>> admin.describe_client_quotas({"user": "alice"})  # doctest: +SKIP
        {(('user', 'alice'),): {'producer_byte_rate': 1048576.0}}
        """
        request = pq.DescribeClientQuotasRequest(
            components=[
                pq.ComponentData(
                    entity_type=kind,
                    match_type=pq.MATCH_DEFAULT if name is None else pq.MATCH_EXACT,
                    match=name,
                )
                for kind, name in (entity or {}).items()
            ],
            strict=strict,
        )

        def send() -> pq.DescribeClientQuotasResponse:
            response: pq.DescribeClientQuotasResponse = self._any_broker(
                ApiKey.DESCRIBE_CLIENT_QUOTAS, request
            )
            return response

        response = self._retrying("describing client quotas", send)
        if response.error_code:
            raise _error(
                response.error_code, response.error_message, "cannot describe client quotas"
            )
        return {
            tuple(sorted((e.entity_type, e.entity_name) for e in entry.entity)): {
                v.key: v.value for v in entry.values
            }
            for entry in response.entries
        }

    def alter_client_quotas(
        self,
        entity: Mapping[str, str | None],
        *,
        set_quotas: Mapping[str, float] | None = None,
        remove: Iterable[str] = (),
        validate_only: bool = False,
    ) -> None:
        """Set and remove the client quotas of one entity (entity type -> name, None for the
        default entity), e.g. ``{"user": "alice", "client-id": None}``: alice's clients
        without a quota of their own. Keys: producer_byte_rate, consumer_byte_rate (bytes/s
        per broker), request_percentage. InvalidRequestError names a bad entity, key or value.

        Examples
        --------
        >>> admin.alter_client_quotas(  # doctest: +SKIP
        ...     {"user": "alice"}, set_quotas={"producer_byte_rate": 1048576}
        ... )
        """
        components = [pq.EntityData(entity_type=k, entity_name=v) for k, v in entity.items()]
        request = pq.AlterClientQuotasRequest(
            entries=[
                pq.AlterClientQuotasEntry(
                    entity=components,
                    ops=[
                        *(pq.OpData(key=k, value=float(v)) for k, v in (set_quotas or {}).items()),
                        *(pq.OpData(key=k, remove=True) for k in remove),
                    ],
                )
            ],
            validate_only=validate_only,
        )
        what = f"client quotas of {dict(entity)}"
        response = self._controller_call(
            ApiKey.ALTER_CLIENT_QUOTAS,
            request,
            f"altering {what}",
            codes=lambda r: [x.error_code for x in r.entries],
        )
        (result,) = response.entries
        if result.error_code:
            raise _error(result.error_code, result.error_message, f"cannot alter {what}")
