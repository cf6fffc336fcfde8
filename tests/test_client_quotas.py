"""Client quotas in the metadata (image format 8) and their rules: round trips through full
images and deltas, Kafka's precedence order, the validation of AlterClientQuotas, the matching
of DescribeClientQuotas."""

from __future__ import annotations

import json

import pytest

from replication.client_quotas import (
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaMatch,
    apply_quota_ops,
    describe_matches,
    entity_of,
    entity_path,
    resolve,
)
from replication.errors import InvalidRequestError
from replication.metadata.delta import MetadataDelta, decode_version, encode_delta
from replication.metadata.image import MetadataImage, QuotaEntity
from replication.protocol.quotas import MATCH_DEFAULT, MATCH_EXACT, MATCH_SPECIFIED

pytestmark = pytest.mark.unit

ALICE_APP: QuotaEntity = (("client-id", "app"), ("user", "alice"))
ALICE: QuotaEntity = (("user", "alice"),)
DEFAULT_USER: QuotaEntity = (("user", None),)
DEFAULT_CLIENT: QuotaEntity = (("client-id", None),)


def test_quotas_round_trip_through_images_and_deltas() -> None:
    base = MetadataImage(version=3, cluster_id="c")
    image = base.next().with_client_quotas(ALICE, {PRODUCER_BYTE_RATE: 1000.0})
    image = image.with_client_quotas(DEFAULT_USER, {REQUEST_PERCENTAGE: 12.5})
    assert [e for e, _ in image.client_quotas] == [DEFAULT_USER, ALICE]  # the default first
    assert json.loads(image.to_bytes())["format_version"] == 8
    assert MetadataImage.from_bytes(image.to_bytes()) == image
    delta = decode_version(encode_delta(base, image))
    assert isinstance(delta, MetadataDelta)
    assert delta.apply(base) == image
    # removing the last quota of an entity removes the entity; a plain image is format 5
    cleared = image.next().with_client_quotas(ALICE, {}).with_client_quotas(DEFAULT_USER, {})
    assert cleared.client_quotas == ()
    assert json.loads(cleared.to_bytes())["format_version"] == 5
    delta = decode_version(encode_delta(image, cleared))
    assert isinstance(delta, MetadataDelta)
    assert delta.apply(image).client_quotas == ()
    # a delta that changes no quota carries none
    assert "client_quotas" not in json.loads(encode_delta(image, image.next(next_producer_id=9)))


def test_precedence_is_kafka_s_from_user_and_client_down_to_the_default_client() -> None:
    entities = [
        (ALICE_APP, "alice", "app"),
        ((("client-id", None), ("user", "alice")), "alice", "app"),
        (ALICE, "alice", ""),
        ((("client-id", "app"), ("user", None)), "alice", "app"),
        ((("client-id", None), ("user", None)), "alice", "app"),
        (DEFAULT_USER, "alice", ""),
        ((("client-id", "app"),), "", "app"),
        (DEFAULT_CLIENT, "", "app"),
    ]
    image = MetadataImage()
    for rank, (entity, _, _) in enumerate(entities):
        image = image.with_client_quotas(entity, {PRODUCER_BYTE_RATE: float(rank + 1)})
    # the most specific wins; remove it and the next one applies
    for rank, (entity, user, client) in enumerate(entities):
        found = resolve(image.client_quotas, PRODUCER_BYTE_RATE, "alice", "app")
        assert found == QuotaMatch(float(rank + 1), user, client), entity_path(entity)
        image = image.with_client_quotas(entity, {})
    assert resolve(image.client_quotas, PRODUCER_BYTE_RATE, "alice", "app") is None
    # another user and client get only the defaults
    image = MetadataImage().with_client_quotas(ALICE, {PRODUCER_BYTE_RATE: 5.0})
    assert resolve(image.client_quotas, PRODUCER_BYTE_RATE, "bob", "app") is None
    assert resolve(image.client_quotas, REQUEST_PERCENTAGE, "alice", "app") is None


def test_alter_validation_names_what_is_wrong() -> None:
    assert entity_of([("user", "alice"), ("client-id", "app")]) == ALICE_APP
    with pytest.raises(InvalidRequestError, match="IP quotas are not served"):
        entity_of([("ip", "1.2.3.4")])
    with pytest.raises(InvalidRequestError, match="named twice"):
        entity_of([("user", "a"), ("user", "b")])
    with pytest.raises(InvalidRequestError, match="needs a user"):
        entity_of([])
    values = apply_quota_ops({}, [(PRODUCER_BYTE_RATE, 1024.0, False)])
    assert values == {PRODUCER_BYTE_RATE: 1024.0}
    assert apply_quota_ops(values, [(PRODUCER_BYTE_RATE, 0.0, True)]) == {}
    with pytest.raises(InvalidRequestError, match="whole number"):
        apply_quota_ops({}, [(PRODUCER_BYTE_RATE, 10.5, False)])
    with pytest.raises(InvalidRequestError, match="positive"):
        apply_quota_ops({}, [(REQUEST_PERCENTAGE, -1.0, False)])
    with pytest.raises(InvalidRequestError, match="unknown quota 'producer_rate'"):
        apply_quota_ops({}, [("producer_rate", 1.0, False)])


def test_describe_filters_match_exact_default_and_specified_names() -> None:
    assert describe_matches(ALICE_APP, [("user", MATCH_EXACT, "alice")], strict=False)
    assert not describe_matches(ALICE_APP, [("user", MATCH_EXACT, "alice")], strict=True)
    assert describe_matches(DEFAULT_USER, [("user", MATCH_DEFAULT, None)], strict=True)
    assert not describe_matches(DEFAULT_USER, [("user", MATCH_SPECIFIED, None)], strict=False)
    assert describe_matches(ALICE, [("user", MATCH_SPECIFIED, None)], strict=True)
    assert not describe_matches(DEFAULT_CLIENT, [("user", MATCH_SPECIFIED, None)], strict=False)
    assert describe_matches(DEFAULT_CLIENT, [], strict=False)
