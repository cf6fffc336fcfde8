"""One cluster, one id: a broker's log.dir records the cluster it belongs to
(``meta.properties``, as Kafka's), and a broker started on it against another cluster's
metadata refuses to start, naming both ids and the directory, before it registers or
deletes any replica as a stray."""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.errors import ConfigError
from logstore.storage import Storage
from replication.broker import meta_properties
from replication.broker.meta_properties import MetaProperties
from replication.client.admin import Admin
from replication.errors import InconsistentClusterIdError
from replication.metadata.store import MetadataStore
from tests.cluster import BrokerProcess, Cluster
from tests.helpers import wait_until


@pytest.mark.unit
def test_meta_properties_round_trip_in_kafkas_format(tmp_path: Path) -> None:
    storage = Storage.from_url(tmp_path.as_uri())
    assert meta_properties.read(storage) is None
    meta = MetaProperties("Zx3pQ7sKT1mB8vYc2LwA9g", 4)
    assert meta_properties.write(storage, meta) == meta
    text = (tmp_path / "meta.properties").read_text()
    assert "cluster.id=Zx3pQ7sKT1mB8vYc2LwA9g\n" in text
    assert "node.id=4\n" in text
    assert "version=1\n" in text
    assert meta_properties.read(storage) == meta
    # a second writer finds the first one's: put-if-absent, never replaced
    assert meta_properties.write(storage, MetaProperties("other", 4)) == meta


@pytest.mark.unit
def test_a_mismatch_names_both_ids_and_the_directory(tmp_path: Path) -> None:
    storage = Storage.from_url(tmp_path.as_uri())
    stored = MetaProperties("cluster-a", 1)
    meta_properties.check(stored, "cluster-a", 1, storage)
    meta_properties.check(stored, "", 1, storage)  # metadata with no cluster yet: no verdict
    with pytest.raises(InconsistentClusterIdError) as wrong_cluster:
        meta_properties.check(stored, "cluster-b", 1, storage)
    message = str(wrong_cluster.value)
    assert "cluster-a" in message
    assert "cluster-b" in message
    assert tmp_path.as_uri() in message
    assert "metadata.log.dir" in message
    with pytest.raises(ConfigError, match=r"belongs to node.id 1, but this broker is node.id 2"):
        meta_properties.check(stored, "cluster-a", 2, storage)


@pytest.mark.unit
def test_an_unreadable_meta_properties_is_refused_saying_what_it_needs(tmp_path: Path) -> None:
    (tmp_path / "meta.properties").write_text("version=1\nnode.id=x\n")
    with pytest.raises(ConfigError, match=r"needs cluster.id and a numeric node.id"):
        meta_properties.read(Storage.from_url(tmp_path.as_uri()))


@pytest.mark.cluster
def test_a_broker_on_another_clusters_log_dir_refuses_to_start(tmp_path: Path) -> None:
    first = Cluster(tmp_path / "first", brokers=1).start()
    try:
        with Admin({"bootstrap_servers": first.bootstrap}) as admin:
            cluster_id = admin.describe_cluster().cluster_id
        assert cluster_id
        log_dir = first.brokers[0].log_dir
        stored = meta_properties.read(Storage.from_url(log_dir))
        assert stored == MetaProperties(cluster_id, 0)
        first.brokers[0].stop()
        # restarted on its own cluster's metadata, it starts as before
        first.brokers[0].start()
    finally:
        first.stop()

    # a second cluster on its own metadata; broker 0 started on the first one's log.dir
    second = Cluster(tmp_path / "second", brokers=0).start()
    try:
        store = MetadataStore(Storage.from_url(second.metadata_root))
        wait_until(
            lambda: bool(store.read_latest().cluster_id),
            timeout=30,
            message="the second cluster's id, minted by its controller",
        )
        assert store.read_latest().cluster_id != cluster_id
        stray = BrokerProcess(
            tmp_path / "stray",
            broker_id=0,
            log_dir=log_dir,
            overrides={"metadata.log.dir": second.metadata_root},
        )
        with pytest.raises(RuntimeError, match="did not start") as refused:
            stray.start()
        message = str(refused.value)
        assert f"belongs to cluster {cluster_id}" in message, message
        assert log_dir in message
        assert stray.proc is not None
        assert stray.proc.returncode != 0
        # nothing of the first cluster's log.dir was touched
        assert meta_properties.read(Storage.from_url(log_dir)) == MetaProperties(cluster_id, 0)
    finally:
        second.stop()
