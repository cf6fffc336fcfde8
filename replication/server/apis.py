"""Request handlers of a broker's APIs, as Kafka's KafkaApis: one method per API, protocol
objects in and out, and the one table that routes each API key to its handler. The handlers
come in families, each a mixin of its own module: the metadata and admin APIs, forwarded to
the controller (admin_apis.py), the log APIs (log_apis.py: Produce, Fetch...), the
transaction APIs (transaction_apis.py); the group APIs are :class:`GroupApis`'s, served once
the node's broker side is up (:meth:`KafkaApis.serve_groups`). On a node that is also a
controller, the controller's APIs are routed to
:class:`~replication.server.controller_apis.ControllerApis`.

Handlers turn :class:`ReplogError` into per-partition or per-topic error codes with the
error's message; nothing here touches sockets (socket_server.py) or storage (the replica
manager and the controller do).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from replication import protocol as p
from replication.broker.lifecycle import BrokerLifecycle
from replication.broker.replica_manager import ReplicaManager
from replication.config import BrokerConfig
from replication.errors import AuthorizationError, UnsupportedVersionError
from replication.protocol import quotas as pq
from replication.security.acl import AclOperation, ResourceType
from replication.server.admin_apis import AdminApis
from replication.server.controller_apis import FORWARDED_APIS, ControllerApis
from replication.server.group_apis import GroupApis
from replication.server.log_apis import LogApis
from replication.server.quota_apis import describe_client_quotas
from replication.server.responses import Handler
from replication.server.security_apis import security_handlers
from replication.server.transaction_apis import TransactionApis

__all__ = ["CLUSTER_CHECKED", "KafkaApis"]

#: APIs answered by any node whose one check is an operation on the cluster (the ACL, SCRAM
#: and client quota listings: api_acls); their handlers are wrapped by the check when this
#: node serves them
CLUSTER_CHECKED: dict[p.ApiKey, AclOperation] = {
    p.ApiKey.DESCRIBE_ACLS: AclOperation.DESCRIBE,
    p.ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: AclOperation.DESCRIBE,
    p.ApiKey.DESCRIBE_CLIENT_QUOTAS: AclOperation.DESCRIBE_CONFIGS,
}


class KafkaApis(AdminApis, LogApis, TransactionApis):
    """A broker's (or a controller-only node's) handlers of every API it serves."""

    def __init__(
        self,
        config: BrokerConfig,
        replica_manager: ReplicaManager | None,
        controller_apis: ControllerApis | None,
        lifecycle: BrokerLifecycle | None,
    ) -> None:
        super().__init__(config, replica_manager, controller_apis, lifecycle)
        self.handlers: dict[int, Handler] = {
            p.ApiKey.API_VERSIONS: self.handle_api_versions,
            p.ApiKey.METADATA: self.handle_metadata,
        }
        if replica_manager is not None:
            self.handlers.update(
                {
                    p.ApiKey.PRODUCE: self.handle_produce,
                    p.ApiKey.FETCH: self.handle_fetch,
                    p.ApiKey.LIST_OFFSETS: self.handle_list_offsets,
                    p.ApiKey.OFFSET_FOR_LEADER_EPOCH: self.handle_offsets_for_leader_epoch,
                    p.ApiKey.DESCRIBE_LOG_DIRS: self.handle_describe_log_dirs,
                    p.ApiKey.DESCRIBE_LOG_OBJECTS: self.handle_describe_log_objects,
                    p.ApiKey.DELETE_RECORDS: self.handle_delete_records,
                    p.ApiKey.DESCRIBE_CONFIGS: self.handle_describe_configs,
                    p.ApiKey.FIND_COORDINATOR: self.handle_find_coordinator,
                    p.ApiKey.INIT_PRODUCER_ID: self.handle_init_producer_id,
                    p.ApiKey.ADD_PARTITIONS_TO_TXN: self.handle_add_partitions_to_txn,
                    p.ApiKey.ADD_OFFSETS_TO_TXN: self.handle_add_offsets_to_txn,
                    p.ApiKey.END_TXN: self.handle_end_txn,
                    p.ApiKey.WRITE_TXN_MARKERS: self.handle_write_txn_markers,
                    p.ApiKey.LIST_TRANSACTIONS: self.handle_list_transactions,
                    p.ApiKey.DESCRIBE_TRANSACTIONS: self.handle_describe_transactions,
                    p.ApiKey.DESCRIBE_PRODUCERS: self.handle_describe_producers,
                    p.ApiKey.COMMIT_SINK_BATCH: self.handle_commit_sink_batch,
                    p.ApiKey.DESCRIBE_SINK: self.handle_describe_sink,
                }
            )
        for api_key in FORWARDED_APIS:
            self.handlers[api_key] = self.handle_forwarded
        self.handlers.update(security_handlers(config, lambda: self.image))
        self.handlers[p.ApiKey.DESCRIBE_CLIENT_QUOTAS] = self.handle_describe_client_quotas
        if controller_apis is not None:
            self.handlers.update(controller_apis.handlers)
        for checked, operation in CLUSTER_CHECKED.items():
            if checked in self.handlers:
                self.handlers[checked] = self._cluster_checked(
                    checked, operation, self.handlers[checked]
                )

    def _cluster_checked(self, api: p.ApiKey, operation: AclOperation, handler: Handler) -> Handler:
        """``handler`` behind a check of ``operation`` on the cluster: refused as a whole
        (CLUSTER_AUTHORIZATION_FAILED at the top level of its answer)."""

        async def checked(header: p.RequestHeader, body: Any) -> Any:
            err = self.auth.check(operation, ResourceType.CLUSTER, api=api.kafka_name)
            if err is not None:
                return _cluster_refusal(p.response_class(header.api_key, header.api_version), err)
            return await handler(header, body)

        return checked

    async def handle(self, header: p.RequestHeader, body: Any) -> Any:
        """The response body, or None when no response is sent (Produce with acks=0)."""
        handler = self.handlers.get(header.api_key)
        if handler is None:
            raise UnsupportedVersionError(
                f"API {p.ApiKey(header.api_key).name} is not served by this broker"
            )
        return await handler(header, body)

    async def handle_describe_client_quotas(
        self, header: p.RequestHeader, body: pq.DescribeClientQuotasRequest
    ) -> Any:
        return describe_client_quotas(self.image, body)

    # --- ApiVersions, groups -----------------------------------------------------------------

    async def handle_api_versions(self, header: p.RequestHeader, body: Any) -> Any:
        return p.ApiVersionsResponse(
            api_keys=[
                p.ApiVersionsResponseKey(api_key=int(k), min_version=lo, max_version=hi)
                for k, (lo, hi) in p.SUPPORTED_VERSIONS.items()
                if k in self.handlers
            ]
        )

    def serve_groups(self, group_apis: GroupApis) -> None:
        """Serve the consumer group APIs (the node calls this once its broker side is up)."""
        self.group_apis = group_apis
        group_apis.auth = self.auth
        self.handlers.update(group_apis.handlers)


def _cluster_refusal(response_class: type, err: AuthorizationError) -> Any:
    """A response refused as a whole at its top-level error code (and message, if it has
    one)."""
    names = {f.name for f in dataclasses.fields(response_class)}
    fields: dict[str, Any] = {"error_code": err.code or -1}
    if "error_message" in names:
        fields["error_message"] = str(err)
    return response_class(**fields)
