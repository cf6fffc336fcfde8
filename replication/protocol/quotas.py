"""Messages of client quotas: DescribeClientQuotas (48) and AlterClientQuotas (49), as Kafka's
(field names as Kafka's JSON schemas and kio's), without tagged fields.

An entity is a list of (entity type, name) components: ``user``, ``client-id`` (or both, a
user's client), a name of None meaning the default entity (Kafka's ``<default>``). Values are
float64, as Kafka sends them (byte rates are whole numbers of bytes per second).
"""

from __future__ import annotations

from dataclasses import field
from typing import Final

from replication.protocol.codec import (
    BOOL,
    FLOAT64,
    INT8,
    INT16,
    INT32,
    NULLABLE_STRING,
    STRING,
    array_field,
    message,
    wire,
)

#: DescribeClientQuotas match types (Kafka's ClientQuotaFilterComponent)
MATCH_EXACT: Final = 0
MATCH_DEFAULT: Final = 1
MATCH_SPECIFIED: Final = 2

# --- DescribeClientQuotas (48) -----------------------------------------------------------------


@message
class ComponentData:
    """One filter component: an entity type and how its name matches (exact, the default
    entity, or any specified name)."""

    entity_type: str = field(metadata=wire(STRING))
    match_type: int = field(default=MATCH_EXACT, metadata=wire(INT8))
    match: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class DescribeClientQuotasRequest:
    """The quotas of the entities matching every component; ``strict``: entities with no
    other entity types than the components name."""

    components: list[ComponentData] = array_field(ComponentData)
    strict: bool = field(default=False, metadata=wire(BOOL))


@message
class EntityData:
    entity_type: str = field(metadata=wire(STRING))
    entity_name: str | None = field(default=None, metadata=wire(NULLABLE_STRING))


@message
class ValueData:
    key: str = field(metadata=wire(STRING))
    value: float = field(metadata=wire(FLOAT64))


@message
class DescribeClientQuotasEntry:
    entity: list[EntityData] = array_field(EntityData)
    values: list[ValueData] = array_field(ValueData)


@message
class DescribeClientQuotasResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    entries: list[DescribeClientQuotasEntry] = array_field(DescribeClientQuotasEntry)


# --- AlterClientQuotas (49) --------------------------------------------------------------------


@message
class OpData:
    """Set ``key`` to ``value``, or remove it (``remove``; the value is then ignored)."""

    key: str = field(metadata=wire(STRING))
    value: float = field(default=0.0, metadata=wire(FLOAT64))
    remove: bool = field(default=False, metadata=wire(BOOL))


@message
class AlterClientQuotasEntry:
    entity: list[EntityData] = array_field(EntityData)
    ops: list[OpData] = array_field(OpData)


@message
class AlterClientQuotasRequest:
    entries: list[AlterClientQuotasEntry] = array_field(AlterClientQuotasEntry)
    validate_only: bool = field(default=False, metadata=wire(BOOL))


@message
class AlterClientQuotasResult:
    error_code: int = field(default=0, metadata=wire(INT16))
    error_message: str | None = field(default=None, metadata=wire(NULLABLE_STRING))
    entity: list[EntityData] = array_field(EntityData)


@message
class AlterClientQuotasResponse:
    throttle_time_ms: int = field(default=0, metadata=wire(INT32))
    entries: list[AlterClientQuotasResult] = array_field(AlterClientQuotasResult)
