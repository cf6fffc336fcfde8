"""The admin client's cluster calls: the cluster's id, controller and live brokers (Kafka's
describeCluster), and removing a broker's registration (unregisterBroker)."""

from __future__ import annotations

from replication.client.admin_base import AdminBase, _error
from replication.client.types import BrokerInfo, ClusterDescription
from replication.protocol import ApiKey, UnregisterBrokerRequest, UnregisterBrokerResponse


class ClusterCalls(AdminBase):
    """Describe the cluster and unregister brokers."""

    # --- cluster -----------------------------------------------------------------------------

    def describe_cluster(self) -> ClusterDescription:
        """Cluster id, controller and live brokers."""
        response = self._metadata([])
        return ClusterDescription(
            cluster_id=response.cluster_id,
            controller_id=response.controller_id,
            brokers=tuple(
                BrokerInfo(b.node_id, b.host, b.port, b.rack)
                for b in sorted(response.brokers, key=lambda b: b.node_id)
            ),
        )

    def unregister_broker(self, broker_id: int) -> None:
        """Remove a broker's registration (Kafka's unregisterBroker). Refused while the broker
        holds replicas: move them off first (:func:`~replication.client.reassignments.
        plan_decommission`). A broker process still running registers again, empty."""
        request = UnregisterBrokerRequest(broker_id=broker_id)

        response: UnregisterBrokerResponse = self._controller_call(
            ApiKey.UNREGISTER_BROKER,
            request,
            f"unregistering broker {broker_id}",
        )
        if response.error_code:
            raise _error(
                response.error_code, response.error_message, f"cannot unregister broker {broker_id}"
            )
        self._cluster.request_update()
