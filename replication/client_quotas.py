"""Client quotas in the cluster metadata, as Kafka's ClientQuotaControlManager and its default
quota callback: the entities and keys AlterClientQuotas may set, how its operations apply, which
entities DescribeClientQuotas matches, and which quota applies to a request.

An entity is a user, a client id, or a user's client id, each named or the default entity
(Kafka's ``<default>``, a name of None here). The quota of a request from ``user`` with
``client-id`` is the first of these that sets the key (Kafka's precedence order)::

    /config/users/<user>/clients/<client-id>
    /config/users/<user>/clients/<default>
    /config/users/<user>
    /config/users/<default>/clients/<client-id>
    /config/users/<default>/clients/<default>
    /config/users/<default>
    /config/clients/<client-id>
    /config/clients/<default>

The entity that matched also says who shares the quota (Kafka's metric tags): a user quota
is shared by all that user's clients, a client-id quota by all users of that client id, and
a default entity stands for each user or client id on its own.

    >>> quotas = (((("user", None),), (("producer_byte_rate", 1000.0),)),)
    >>> resolve(quotas, "producer_byte_rate", "alice", "app")
    QuotaMatch(bound=1000.0, user='alice', client_id='')
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from replication.errors import InvalidRequestError
from replication.metadata.image import QuotaEntity
from replication.protocol.quotas import MATCH_DEFAULT, MATCH_EXACT, MATCH_SPECIFIED

USER: Final = "user"
CLIENT_ID: Final = "client-id"
#: the byte rates (bytes/s of one user or client id on one broker) and the share of request
#: handling time (100 = one request handler's whole time), Kafka's QuotaConfigs
PRODUCER_BYTE_RATE: Final = "producer_byte_rate"
CONSUMER_BYTE_RATE: Final = "consumer_byte_rate"
REQUEST_PERCENTAGE: Final = "request_percentage"
#: the keys of each entity type, and whether a key's value must be a whole number
QUOTA_KEYS: Final = {PRODUCER_BYTE_RATE: True, CONSUMER_BYTE_RATE: True, REQUEST_PERCENTAGE: False}

Quotas = tuple[tuple[QuotaEntity, tuple[tuple[str, float], ...]], ...]


@dataclass(frozen=True, slots=True)
class QuotaMatch:
    """The quota that applies to a request, and who shares it (Kafka's metric tags: the user
    and client id of the quota's sensor, "" where the quota is not per that type)."""

    bound: float
    user: str
    client_id: str


def entity_of(components: Sequence[tuple[str, str | None]]) -> QuotaEntity:
    """A valid entity of AlterClientQuotas (user, client-id, or both once each), else
    InvalidRequestError naming what is wrong."""
    kinds = [kind for kind, _ in components]
    if not kinds:
        raise InvalidRequestError("a client quota entity needs a user, a client-id or both")
    for kind in kinds:
        if kind not in (USER, CLIENT_ID):
            hint = " (IP quotas are not served)" if kind == "ip" else ""
            raise InvalidRequestError(
                f"unknown quota entity type {kind!r}{hint}: use {USER!r} and/or {CLIENT_ID!r}"
            )
    if len(set(kinds)) != len(kinds):
        raise InvalidRequestError(f"quota entity type named twice in {components!r}")
    for kind, name in components:
        if name == "":
            raise InvalidRequestError(
                f"an empty {kind} name: name one, or the default entity (--entity-default)"
            )
    return tuple(sorted(components))


def apply_quota_ops(
    current: dict[str, float], ops: Sequence[tuple[str, float, bool]]
) -> dict[str, float]:
    """The quotas after ``ops`` (key, value, remove), validated as Kafka does: known keys,
    positive values, whole numbers for byte rates, each key once."""
    out = dict(current)
    seen: set[str] = set()
    for key, value, remove in ops:
        if key in seen:
            raise InvalidRequestError(f"quota {key!r} is named twice in one entity")
        seen.add(key)
        if key not in QUOTA_KEYS:
            raise InvalidRequestError(
                f"unknown quota {key!r}: client quotas are {', '.join(sorted(QUOTA_KEYS))}"
            )
        if remove:
            out.pop(key, None)
            continue
        if not math.isfinite(value) or value <= 0:
            raise InvalidRequestError(f"quota {key}={value}: give a positive value")
        if QUOTA_KEYS[key] and abs(value - round(value)) > 1e-4:
            raise InvalidRequestError(f"quota {key}={value}: give a whole number of bytes/s")
        out[key] = float(round(value)) if QUOTA_KEYS[key] else float(value)
    return out


def describe_matches(
    entity: QuotaEntity, components: Sequence[tuple[str, int, str | None]], strict: bool
) -> bool:
    """Does ``entity`` match DescribeClientQuotas' filter (entity type, match type, match)?"""
    names = dict(entity)
    for kind, match_type, match in components:
        if kind not in names:
            return False
        name = names[kind]
        if match_type == MATCH_EXACT and name != match:
            return False
        if match_type == MATCH_DEFAULT and name is not None:
            return False
        if match_type == MATCH_SPECIFIED and name is None:
            return False
    return not strict or set(names) == {kind for kind, _, _ in components}


def validate_filter(components: Sequence[tuple[str, int, str | None]]) -> None:
    for kind, match_type, match in components:
        if kind not in (USER, CLIENT_ID):
            raise InvalidRequestError(
                f"unknown quota entity type {kind!r}: use {USER!r} and/or {CLIENT_ID!r}"
            )
        if match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED):
            raise InvalidRequestError(
                f"match type {match_type} of {kind}: use 0 (exact), 1 (default) or 2 (specified)"
            )
        if match_type == MATCH_EXACT and match is None:
            raise InvalidRequestError(f"an exact match of {kind} needs a name")
    kinds = [kind for kind, _, _ in components]
    if len(set(kinds)) != len(kinds):
        raise InvalidRequestError("each entity type may be filtered once")


QuotaIndex = dict[QuotaEntity, dict[str, float]]


def quota_index(quotas: Quotas) -> QuotaIndex:
    """The quotas by entity (what :func:`resolve` looks entities up in)."""
    return {entity: dict(values) for entity, values in quotas}


def resolve(
    quotas: Quotas | QuotaIndex, key: str, user: str, client_id: str
) -> QuotaMatch | None:
    """The quota ``key`` of a request from ``user`` with ``client_id`` (Kafka's precedence
    order, see the module's docstring), or None if no entity sets it. ``quotas``: an image's,
    or their :func:`quota_index` (built once per image by a caller that resolves often)."""
    if not quotas:
        return None
    by_entity = quotas if isinstance(quotas, dict) else quota_index(quotas)
    candidates: list[tuple[QuotaEntity, str, str]] = [
        (((CLIENT_ID, client_id), (USER, user)), user, client_id),
        (((CLIENT_ID, None), (USER, user)), user, client_id),
        (((USER, user),), user, ""),
        (((CLIENT_ID, client_id), (USER, None)), user, client_id),
        (((CLIENT_ID, None), (USER, None)), user, client_id),
        (((USER, None),), user, ""),
        (((CLIENT_ID, client_id),), "", client_id),
        (((CLIENT_ID, None),), "", client_id),
    ]
    for entity, tag_user, tag_client in candidates:
        value = by_entity.get(entity, {}).get(key)
        if value is not None:
            return QuotaMatch(value, tag_user, tag_client)
    return None


def entity_path(entity: QuotaEntity) -> str:
    """Kafka's name of an entity: ``users/alice/clients/<default>``."""
    names = dict(entity)
    parts = []
    if USER in names:
        parts.append(f"users/{names[USER] if names[USER] is not None else '<default>'}")
    if CLIENT_ID in names:
        client = names[CLIENT_ID]
        parts.append(f"clients/{client if client is not None else '<default>'}")
    return "/".join(parts)
