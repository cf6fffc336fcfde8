"""Operational events from real broker processes: a broker with ``logging.format=json`` writes
only JSON objects on stderr, among them the leader change of a topic it creates; each replica
logs the role it takes; a follower
stopped with SIGSTOP leaves the ISR and the controller's text log names the shrink (and the
expand once it runs again) with the partition, the ISRs and the epochs."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from replication.client import Admin, NewTopic, Producer
from tests.cluster import BrokerProcess, Cluster
from tests.helpers import unique_name, wait_until

pytestmark = pytest.mark.cluster


def json_lines(path: Path) -> list[dict[str, object]]:
    """Every line of a JSON log; fails naming the first line that is not a JSON object."""
    out = []
    for line in path.read_text().splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as err:
            raise AssertionError(f"not a JSON line in {path.name}: {line!r}") from err
        assert isinstance(doc, dict), line
        out.append(doc)
    return out


def text_events(path: Path, name: str) -> list[dict[str, str]]:
    """The fields of each ``name`` event in a text log (``name key=value ...``)."""
    out = []
    for line in path.read_text().splitlines():
        _, sep, fields = line.partition(f": {name} ")
        if sep:
            out.append(dict(re.findall(r"(\w+)=(\[[^\]]*\]|\"[^\"]*\"|\S+)", fields)))
    return out


def test_a_broker_with_json_logs_writes_one_object_per_line_with_event_fields(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory(overrides={"logging.format": "json"})
    topic = unique_name("json-events")
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 2, 1)])

    def leader_changes() -> list[dict[str, object]]:
        return [
            doc
            for doc in json_lines(broker.stderr_path)
            if doc.get("event") == "leader_change" and doc.get("topic") == topic
        ]

    wait_until(lambda: len(leader_changes()) == 2, timeout=60, message="2 leader changes")
    changes = leader_changes()
    assert sorted(int(c["partition"]) for c in changes) == [0, 1]  # type: ignore[call-overload]
    for change in changes:
        assert change["new_leader"] == broker.broker_id
        assert change["old_leader"] == -1
        assert change["leader_epoch"] == 0
        assert change["isr"] == [broker.broker_id]
        assert change["level"] == "INFO"
        assert change["logger"] == "replication.state_change"
        assert str(change["message"]).startswith(f"leader_change topic={topic} partition=")
    registered = [
        d for d in json_lines(broker.stderr_path) if d.get("event") == "broker_registered"
    ]
    assert registered[0]["broker_id"] == broker.broker_id
    assert int(registered[0]["broker_epoch"]) >= 1  # type: ignore[call-overload]


def test_a_stopped_follower_leaves_the_isr_and_the_controller_logs_the_shrink(
    cluster_factory: Callable[..., Cluster],
) -> None:
    # a short lag bound, a long session: the leader shrinks the ISR before the controller
    # would fence the stopped broker
    cluster = cluster_factory(
        brokers=3,
        overrides={"replica.lag.time.max.ms": "1500", "broker.session.timeout.ms": "60000"},
    )
    topic = unique_name("isr-events")
    with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, 3)])
    log = cluster.controller.stderr_path
    (created,) = wait_until(lambda: text_events(log, "leader_change"), timeout=60)
    assert created["topic"] == topic
    leader = int(created["new_leader"])
    for broker_id, proc in cluster.brokers.items():  # each replica logs the role it takes
        role = "become_leader" if broker_id == leader else "become_follower"
        (took,) = wait_until(lambda p=proc, r=role: text_events(p.stderr_path, r), timeout=60)
        assert (took["topic"], took["leader"], took["leader_epoch"]) == (topic, str(leader), "0")
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        producer.send(topic, b"before", partition=0).result(timeout=60)
    follower = next(b for b in cluster.brokers if b != leader)
    cluster.brokers[follower].pause()
    try:
        (shrink,) = wait_until(lambda: text_events(log, "isr_shrink"), timeout=60)
        assert (shrink["topic"], shrink["partition"]) == (topic, "0")
        assert shrink["leader"] == str(leader)
        assert sorted(shrink["old_isr"].strip("[]").split(",")) == ["0", "1", "2"]
        assert str(follower) not in shrink["new_isr"].strip("[]").split(",")
        assert shrink["replicas_moved"] == f"[{follower}]"
        assert shrink["leader_epoch"] == created["leader_epoch"]  # the leader did not change
        assert int(shrink["partition_epoch"]) > int(created["partition_epoch"])
        assert " WARNING replication.state_change: isr_shrink " in log.read_text()
    finally:
        cluster.brokers[follower].resume()
    (expand,) = wait_until(lambda: text_events(log, "isr_expand"), timeout=60)
    assert expand["replicas_moved"] == f"[{follower}]"
    assert int(expand["partition_epoch"]) == int(shrink["partition_epoch"]) + 1
    assert not text_events(log, "broker_fenced")  # the session outlived the pause
