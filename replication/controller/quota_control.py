"""Client quotas in the cluster metadata (Kafka's ClientQuotaControlManager): the controller's
writes of AlterClientQuotas, one metadata version per request."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Protocol

from replication.client_quotas import apply_quota_ops, entity_of, entity_path
from replication.errors import ReplogError
from replication.metadata.image import MetadataImage, QuotaEntity

#: the controller's log, where its metadata changes are told
log = logging.getLogger("replication.controller.controller")

#: one entry of AlterClientQuotas: the entity's components and its ops (key, value, remove)
QuotaAlteration = tuple[Sequence[tuple[str, str | None]], Sequence[tuple[str, float, bool]]]


class _MetadataWriter(Protocol):
    _lock: threading.RLock
    image: MetadataImage

    def _commit(self, image: MetadataImage, base: MetadataImage | None = None) -> MetadataImage: ...


class QuotaControlManager:
    """The controller's client quota writes, under the controller's lock."""

    def alter_client_quotas(
        self: _MetadataWriter, entries: Sequence[QuotaAlteration], *, validate_only: bool = False
    ) -> list[ReplogError | None]:
        """Apply each entry's ops to its entity (Kafka's AlterClientQuotas): one result per
        entry, None or why it was refused (InvalidRequestError); every accepted entry goes
        into one metadata version."""
        with self._lock:
            results: list[ReplogError | None] = []
            image = self.image.next()
            changed: list[tuple[QuotaEntity, dict[str, float], dict[str, float]]] = []
            for components, ops in entries:
                try:
                    entity = entity_of(components)
                    current = image.client_quota_map(entity)
                    values = apply_quota_ops(current, ops)
                except ReplogError as err:
                    results.append(err)
                    continue
                results.append(None)
                if values != current:
                    image = image.with_client_quotas(entity, values)
                    changed.append((entity, current, values))
            if changed and not validate_only:
                self._commit(image)
                for entity, before, after in changed:
                    log.info(
                        "client quotas of %s: %s (were %s)",
                        entity_path(entity),
                        after or "none",
                        before or "none",
                    )
            return results
