"""The security metadata (image format 7): SCRAM credentials and ACLs round trip through
full images and deltas, older formats still read (with none), a delta carries only what
changed, secrets never show in a repr, and an image without them is still written as format
5 (readable by a replog from before format 7)."""

from __future__ import annotations

import json
import uuid

import pytest

from logstore.errors import CorruptRecordError
from logstore.storage import Storage
from replication.metadata.delta import MetadataDelta, decode_version, encode_delta
from replication.metadata.image import (
    FORMAT_VERSION,
    READABLE_FORMAT_VERSIONS,
    BrokerInfo,
    MetadataImage,
    PartitionState,
    TopicInfo,
)
from replication.metadata.store import ControllerClaim, MetadataStore
from replication.security.acl import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from replication.security.scram import ScramCredential, new_credential

pytestmark = pytest.mark.unit

SALT = b"salt-of-sixteen!"


def cred(user: str, mechanism: str = "SCRAM-SHA-256", password: str = "pw") -> ScramCredential:
    return new_credential(user, mechanism, password, 4096, SALT)


def binding(name: str, op: AclOperation = AclOperation.READ, who: str = "User:alice") -> AclBinding:
    return AclBinding(
        ResourceType.TOPIC,
        name,
        PatternType.LITERAL,
        who,
        "*",
        op,
        AclPermissionType.ALLOW,
    )


def secure_image() -> MetadataImage:
    image = MetadataImage(
        version=4,
        controller_epoch=2,
        cluster_id="c",
        brokers=(BrokerInfo(0, "h", 1, None, 1, False, "inc", (("KAFKA", "h", 2),)),),
        topics=(TopicInfo("t", "id", (PartitionState((0,), (0,), 0),)),),
    )
    image = image.with_scram_credentials(
        [cred("broker", "SCRAM-SHA-512"), cred("alice"), cred("alice", "SCRAM-SHA-512")]
    )
    return image.with_acls([binding("t"), binding("a", AclOperation.WRITE), binding("t")])


def round_trip(
    base: MetadataImage, image: MetadataImage
) -> tuple[MetadataImage, dict[str, object]]:
    data = encode_delta(base, image)
    delta = decode_version(data)
    assert isinstance(delta, MetadataDelta)
    return delta.apply(base), json.loads(data)


def test_format_7_round_trips_credentials_and_acls() -> None:
    image = secure_image()
    assert [(c.user, c.mechanism) for c in image.scram_credentials] == [
        ("alice", "SCRAM-SHA-256"),
        ("alice", "SCRAM-SHA-512"),
        ("broker", "SCRAM-SHA-512"),
    ]
    assert image.acls == (binding("a", AclOperation.WRITE), binding("t"))  # sorted, deduplicated
    doc = json.loads(image.to_bytes())
    assert doc["format_version"] == 7  # no client quotas: format 8 is not needed
    assert FORMAT_VERSION == 8
    read = MetadataImage.from_bytes(image.to_bytes())
    assert read == image
    assert read.scram_credential("alice", "SCRAM-SHA-512") == cred("alice", "SCRAM-SHA-512")
    assert read.scram_credential("alice", "SCRAM-SHA-1") is None
    assert read.scram_credential("bob", "SCRAM-SHA-256") is None
    # bytes travel as base64 text
    assert doc["scram"][0][3] == "c2FsdC1vZi1zaXh0ZWVuIQ=="


def test_an_image_without_security_metadata_is_still_written_as_format_5() -> None:
    plain = MetadataImage(version=3, cluster_id="c")
    doc = json.loads(plain.to_bytes())
    assert doc["format_version"] == 5
    assert "scram" not in doc
    assert "acls" not in doc
    assert MetadataImage.from_bytes(plain.to_bytes()) == plain


def test_older_formats_still_read_with_no_security_metadata() -> None:
    image = secure_image()
    assert sorted(READABLE_FORMAT_VERSIONS) == [1, 2, 3, 4, 5, 7, 8]
    doc = json.loads(image.to_bytes())
    del doc["scram"], doc["acls"]
    for fmt in (5, 4):
        doc["format_version"] = fmt
        old = MetadataImage.from_bytes(json.dumps(doc).encode())
        assert (old.scram_credentials, old.acls) == ((), ())
        assert old.topics == image.topics
    del doc["broker_configs"]
    doc["brokers"] = [b[:7] for b in doc["brokers"]]
    doc["format_version"] = 2
    assert MetadataImage.from_bytes(json.dumps(doc).encode()).brokers[0].endpoints == ()
    doc["brokers"] = [b[:6] for b in doc["brokers"]]
    for fmt in (3, 1):
        doc["format_version"] = fmt
        old = MetadataImage.from_bytes(json.dumps(doc).encode())
        assert old.acls == ()
    # format 6 is a delta, and still decodes as one
    base = MetadataImage(version=4, controller_epoch=2)
    delta = decode_version(encode_delta(base, base.next(next_producer_id=1000)))
    assert isinstance(delta, MetadataDelta)
    assert delta.changes["format_version"] == 6
    assert delta.apply(base).acls == ()
    doc["format_version"] = 9
    with pytest.raises(CorruptRecordError, match="format_version 9 is not supported"):
        MetadataImage.from_bytes(json.dumps(doc).encode())


def test_a_delta_carries_only_the_acl_or_credential_that_changed() -> None:
    base = secure_image().with_acls([binding(f"topic-{i:03d}") for i in range(200)])
    # nothing security-related changed: no keys, and the very tuples are kept
    image, doc = round_trip(base, base.next(next_producer_id=1000))
    assert "acls" not in doc
    assert "scram" not in doc
    assert image.acls is base.acls
    assert image.scram_credentials is base.scram_credentials
    # one ACL added
    added = base.next().with_acls([*base.acls, binding("topic-100x", AclOperation.WRITE)])
    image, doc = round_trip(base, added)
    assert image == added
    assert doc["acls"] == {"add": [[2, "topic-100x", 3, "User:alice", "*", 4, 3]], "remove": []}
    assert "scram" not in doc
    assert len(json.dumps(doc)) < 600
    # one removed
    removed = added.next().with_acls(b for b in added.acls if b.resource_name != "topic-042")
    image, doc = round_trip(added, removed)
    assert image == removed
    assert doc["acls"] == {"add": [], "remove": [[2, "topic-042", 3, "User:alice", "*", 3, 3]]}
    # one credential replaced, one deleted
    changed = removed.next().with_scram_credentials(
        [cred("alice", password="new")], [("broker", "SCRAM-SHA-512")]
    )
    image, doc = round_trip(removed, changed)
    assert image == changed
    assert image.scram_credential("alice", "SCRAM-SHA-256") == cred("alice", password="new")
    assert image.scram_credential("broker", "SCRAM-SHA-512") is None
    scram = doc["scram"]
    assert isinstance(scram, dict)
    assert [f[:2] for f in scram["upsert"]] == [["alice", "SCRAM-SHA-256"]]
    assert scram["remove"] == [["broker", "SCRAM-SHA-512"]]
    assert "acls" not in doc


def test_no_secret_bytes_in_the_repr_of_an_image() -> None:
    image = secure_image()
    shown = repr(image) + str(image) + repr(image.scram_credentials)
    for c in image.scram_credentials:
        for secret in (c.salt, c.stored_key, c.server_key):
            assert repr(secret) not in shown
            assert secret.hex() not in shown
    assert "salt-of-sixteen" not in shown
    assert "User:alice" in repr(image)  # the ACLs are no secret


def test_the_store_reads_credentials_and_acls_back_from_deltas_and_snapshots() -> None:
    store = MetadataStore(Storage.from_url(f"memory://sec-{uuid.uuid4().hex}/meta"))
    store.claim(ControllerClaim(1, 100, "127.0.0.1", 9100))
    image = store.write(MetadataImage(version=1, controller_epoch=1, controller_id=100))
    base = image
    image = store.write(image.next().with_acls([binding("t")]), base)
    base = image
    image = store.write(image.next().with_scram_credentials([cred("alice")]), base)
    assert MetadataStore(store.storage).read_latest() == image
    store.write_snapshot(image)
    base = image
    image = store.write(image.next().with_acls([]), base)
    reader = MetadataStore(store.storage)
    assert reader.read_latest() == image
    assert reader.read_latest().acls == ()
    assert reader.read_latest().scram_credential("alice", "SCRAM-SHA-256") == cred("alice")
