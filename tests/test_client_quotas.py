"""Client quotas in the metadata (image format 8) and their rules: round trips through full
images and deltas, Kafka's precedence order, the validation of AlterClientQuotas, the matching
of DescribeClientQuotas; and the broker's meters: the throttle time a request earns, who
shares a quota, request time, the bound on meters kept, throttle_time_ms in responses."""

from __future__ import annotations

import json

import pytest

from replication import protocol as p
from replication.broker.quota_manager import (
    MAX_THROTTLE_MS,
    QuotaManagers,
    fetched_bytes,
    with_throttle_time,
)
from replication.client_quotas import (
    CONSUMER_BYTE_RATE,
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


# --- the broker's meters (ClientQuotaManager), on a clock of the test's ------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def managers(image: list[MetadataImage], clock: Clock) -> QuotaManagers:
    """The quota managers of the image ``image[0]`` (which the test may replace)."""
    return QuotaManagers(lambda: image[0].client_quotas, clock=clock)


def test_a_byte_rate_throttles_for_the_time_the_quota_takes_to_absorb_the_debt() -> None:
    clock = Clock()
    image = MetadataImage().with_client_quotas(ALICE, {PRODUCER_BYTE_RATE: 1000.0})
    produce = managers([image], clock).produce
    assert produce.record("alice", "app", 600) == 0  # within the first second's burst
    assert produce.record("alice", "app", 900) == 500  # 500 bytes over: half a second
    clock.now += 0.5
    assert produce.record("alice", "app", 0) == 0  # repaid
    # one huge request is throttled at most MAX_THROTTLE_MS
    assert produce.record("alice", "app", 10**9) == MAX_THROTTLE_MS
    # another user has no quota: never throttled, and no meter kept for it
    assert produce.record("bob", "app", 10**9) == 0
    assert [(m.user, m.client_id) for m in produce.metrics()] == [("alice", "")]


def test_who_shares_a_quota_follows_the_entity_that_set_it() -> None:
    clock = Clock()
    image = MetadataImage().with_client_quotas(ALICE, {PRODUCER_BYTE_RATE: 1000.0})
    image = image.with_client_quotas(DEFAULT_CLIENT, {PRODUCER_BYTE_RATE: 1000.0})
    current = [image]
    produce = managers(current, clock).produce
    # alice's user quota is shared by her client ids
    assert produce.record("alice", "a", 1000) == 0
    assert produce.record("alice", "b", 1000) == 1000
    # the default client-id quota stands for each client id on its own
    assert produce.record("bob", "x", 1000) == 0
    assert produce.record("carol", "y", 1000) == 0
    assert produce.record("dave", "x", 500) == 500  # client x again, whoever the user
    tags = sorted((m.user, m.client_id) for m in produce.metrics())
    assert tags == [("", "x"), ("", "y"), ("alice", "")]
    # a quota removed: the next one in the order applies at once (client a's default), and
    # with none left nothing is throttled
    current[0] = image.with_client_quotas(ALICE, {})
    assert produce.record("alice", "a", 2000) == 1000
    current[0] = current[0].with_client_quotas(DEFAULT_CLIENT, {})
    assert produce.record("alice", "a", 10**6) == 0


def test_request_percentage_meters_seconds_of_handling() -> None:
    clock = Clock()
    image = MetadataImage().with_client_quotas(DEFAULT_USER, {REQUEST_PERCENTAGE: 50.0})
    request = managers([image], clock).request
    assert request.record("alice", "app", 0.5) == 0  # half a second: the first second's burst
    assert request.record("alice", "app", 0.5) == 1000  # 0.5 s over at 0.5 s/s
    clock.now += 0.2
    (metric,) = request.metrics()
    assert metric.rate == pytest.approx(100 * 1.0 / 10)  # percent of a handler over 10 s
    assert metric.throttle_time_ms == pytest.approx(500)


def test_idle_meters_are_dropped_once_there_are_many() -> None:
    clock = Clock()
    image = MetadataImage().with_client_quotas(DEFAULT_CLIENT, {CONSUMER_BYTE_RATE: 10.0})
    fetch = managers([image], clock).fetch
    for i in range(300):
        fetch.record("u", f"client-{i}", 1)
    clock.now += 5  # every bucket full again
    fetch.record("u", "late", 1)
    assert len(list(fetch.metrics())) < 300


def test_throttle_time_goes_into_either_kind_of_response() -> None:
    response = p.FetchResponse(
        responses=[
            p.FetchResponseTopic(
                topic="t",
                partitions=[
                    p.FetchResponsePartition(partition_index=0, records=b"x" * 7),
                    p.FetchResponsePartition(partition_index=1, records=None),
                ],
            )
        ]
    )
    assert fetched_bytes(response) == 7
    assert with_throttle_time(response, 12).throttle_time_ms == 12
    kafka = {"responses": [{"topic": "t", "partitions": [{"records": b"y" * 3}]}]}
    assert fetched_bytes(kafka) == 3
    assert with_throttle_time(kafka, 5)["throttle_time_ms"] == 5
    assert with_throttle_time(p.SaslHandshakeResponse(), 5) == p.SaslHandshakeResponse()
