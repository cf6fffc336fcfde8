"""The handlers of the client quota APIs. AlterClientQuotas changes the cluster's metadata: the
active controller answers it (brokers forward it there, as the other admin changes);
DescribeClientQuotas is answered by any node from its metadata image."""

from __future__ import annotations

import asyncio
from typing import Any

from logstore.errors import ReplogError
from replication.client_quotas import describe_matches, validate_filter
from replication.controller.controller import Controller
from replication.errors import NotControllerError
from replication.metadata.image import MetadataImage, QuotaEntity
from replication.protocol import quotas as pq
from replication.server.responses import error_code, error_message

__all__ = ["alter_client_quotas", "describe_client_quotas", "not_controller_alter_quotas"]


def _entity(entity: QuotaEntity) -> list[pq.EntityData]:
    return [pq.EntityData(entity_type=kind, entity_name=name) for kind, name in entity]


def _components(entry: pq.AlterClientQuotasEntry) -> list[tuple[str, str | None]]:
    return [(e.entity_type, e.entity_name) for e in entry.entity]


async def alter_client_quotas(
    controller: Controller, body: pq.AlterClientQuotasRequest
) -> pq.AlterClientQuotasResponse:
    """Set and remove quotas, one result per entry (the entity as it was sent)."""
    entries = [
        (_components(entry), [(op.key, op.value, op.remove) for op in entry.ops])
        for entry in body.entries
    ]
    try:
        outcomes = await asyncio.to_thread(
            controller.alter_client_quotas, entries, validate_only=body.validate_only
        )
    except ReplogError as err:
        outcomes = [err] * len(entries)
    return pq.AlterClientQuotasResponse(
        entries=[
            pq.AlterClientQuotasResult(
                error_code=error_code(failure) if failure else 0,
                error_message=error_message(failure) if failure else None,
                entity=list(entry.entity),
            )
            for entry, failure in zip(body.entries, outcomes, strict=True)
        ]
    )


def not_controller_alter_quotas(body: pq.AlterClientQuotasRequest) -> Any:
    return pq.AlterClientQuotasResponse(
        entries=[
            pq.AlterClientQuotasResult(
                error_code=NotControllerError.code,
                error_message="this controller is a standby; send it to the active controller",
                entity=list(entry.entity),
            )
            for entry in body.entries
        ]
    )


def describe_client_quotas(
    image: MetadataImage, body: pq.DescribeClientQuotasRequest
) -> pq.DescribeClientQuotasResponse:
    """The quotas of every entity the filter matches (INVALID_REQUEST for a bad filter)."""
    components = [(c.entity_type, c.match_type, c.match) for c in body.components]
    try:
        validate_filter(components)
    except ReplogError as err:
        return pq.DescribeClientQuotasResponse(
            error_code=error_code(err), error_message=error_message(err)
        )
    return pq.DescribeClientQuotasResponse(
        entries=[
            pq.DescribeClientQuotasEntry(
                entity=_entity(entity),
                values=[pq.ValueData(key=k, value=v) for k, v in values],
            )
            for entity, values in image.client_quotas
            if describe_matches(entity, components, body.strict)
        ]
    )
