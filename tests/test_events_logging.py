"""Operational events (replication.events) and the log formats (replication.log_format), in
process: the text line and the JSON object carry every field, the levels, and the controller's
state-change log driven by a real Controller on memory storage (a topic created, a broker
fenced, an ISR shrunk and expanded through AlterPartition, an unclean election), and the
fencing a broker sees (a request's old leader epoch, a fenced transactional producer)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from logstore.errors import ConfigError
from logstore.log import Log
from logstore.storage import Storage
from replication import events
from replication.broker.partition import Partition, TopicPolicy
from replication.config import load_broker_config
from replication.controller.controller import Controller
from replication.controller.state_change import log_state_changes
from replication.coordinator.transaction import TransactionCoordinator, TransactionMetadata
from replication.errors import FencedLeaderEpochError, ProducerFencedError
from replication.log_format import TEXT_FORMAT, JsonFormatter, configure_logging
from replication.metadata.image import MetadataImage, PartitionState, TopicInfo
from replication.metadata.store import MetadataStore
from tests.helpers import register_live

pytestmark = pytest.mark.unit

SESSION_MS = 3_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


class Capture(logging.Handler):
    """The records logged on a logger, and each formatted as text and as JSON."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def events(self, name: str) -> list[dict[str, object]]:
        """The JSON objects of the ``name`` events captured, in order."""
        docs = [json.loads(JsonFormatter().format(r)) for r in self.records]
        return [d for d in docs if d.get("event") == name]


@pytest.fixture
def captured() -> Iterator[Capture]:
    handler = Capture()
    root = logging.getLogger("replication")
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield handler
    root.removeHandler(handler)
    root.setLevel(level)


def test_an_event_is_one_text_line_with_its_name_and_fields(captured: Capture) -> None:
    log = logging.getLogger("replication.test")
    events.event(
        log,
        events.ISR_SHRINK,
        topic="events",
        partition=0,
        old_isr=(0, 1, 2),
        new_isr=[0, 1],
        leader_epoch=3,
        reason="lag 31000 ms",
        rack=None,
    )
    (record,) = captured.records
    text = logging.Formatter(TEXT_FORMAT).format(record)
    assert "\n" not in text
    assert text.endswith(
        "replication.test: isr_shrink topic=events partition=0 old_isr=[0,1,2] new_isr=[0,1] "
        'leader_epoch=3 reason="lag 31000 ms" rack=null'
    )
    assert record.levelno == logging.WARNING  # a shrinking ISR is worth a look
    assert record.event == "isr_shrink"  # type: ignore[attr-defined]
    assert record.partition == 0  # type: ignore[attr-defined]


def test_events_worth_a_look_log_at_warning_the_others_at_info(captured: Capture) -> None:
    log = logging.getLogger("replication.test")
    for name in events.EVENTS:
        events.event(log, name, topic="t")
    levels = {getattr(r, "event"): r.levelno for r in captured.records}  # noqa: B009
    assert set(levels) == set(events.EVENTS)
    assert {n for n, level in levels.items() if level == logging.WARNING} == set(
        events.WARNING_EVENTS
    )
    assert levels[events.LEADER_CHANGE] == levels[events.ISR_EXPAND] == logging.INFO


def test_a_json_line_is_one_object_with_the_event_fields_as_keys(captured: Capture) -> None:
    log = logging.getLogger("replication.test")
    events.event(
        log, events.LEADER_CHANGE, topic="a b", partition=2, old_leader=-1, new_leader=1, isr={1}
    )
    line = JsonFormatter().format(captured.records[0])
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["level"] == "INFO"
    assert doc["logger"] == "replication.test"
    assert doc["time"].endswith("+00:00")
    assert doc["message"].startswith('leader_change topic="a b" partition=2')
    assert doc["event"] == "leader_change"
    assert (doc["topic"], doc["partition"], doc["old_leader"], doc["new_leader"]) == (
        "a b",
        2,
        -1,
        1,
    )
    assert doc["isr"] == [1]


def test_a_plain_line_and_a_traceback_are_json_too(captured: Capture) -> None:
    log = logging.getLogger("replication.test")
    log.info("flushed %d objects", 3)
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        log.exception("maintenance failed")
    plain, failed = (json.loads(JsonFormatter().format(r)) for r in captured.records)
    assert plain["message"] == "flushed 3 objects"
    assert "event" not in plain
    assert failed["level"] == "ERROR"
    assert "ValueError: boom" in failed["exc_info"]


def test_a_field_may_not_take_a_log_record_attribute_name() -> None:
    with pytest.raises(ValueError, match="LogRecord attributes"):
        events.event(logging.getLogger("replication.test"), events.LEADER_CHANGE, name="x")


def test_config_changes_are_one_event_per_key_that_changed(captured: Capture) -> None:
    log = logging.getLogger("replication.test")
    old = {"retention.ms": "1000", "cleanup.policy": "delete", "segment.bytes": "1024"}
    new = {"retention.ms": "2000", "cleanup.policy": "delete", "max.message.bytes": "10"}
    events.log_config_changes(log, "topic", "events", old, new)
    changes = captured.events(events.CONFIG_CHANGE)
    assert [(c["key"], c["old_value"], c["new_value"]) for c in changes] == [
        ("max.message.bytes", None, "10"),
        ("retention.ms", "1000", "2000"),
        ("segment.bytes", "1024", None),
    ]
    assert all((c["resource"], c["resource_name"]) == ("topic", "events") for c in changes)


# --- the log formats: logging.format and --log-format ---------------------------------------


def test_logging_format_is_a_config_key_and_refuses_other_values() -> None:
    assert load_broker_config(None, {}).logging_format == "text"
    assert load_broker_config(None, {"logging.format": "json"}).logging_format == "json"
    with pytest.raises(ConfigError, match=r"logging.format='xml': use text .* or json"):
        configure_logging("INFO", "xml")


def test_json_format_makes_every_line_on_stderr_an_object() -> None:
    program = (
        "import logging\n"
        "from replication import events\n"
        "from replication.log_format import configure_logging\n"
        "configure_logging('INFO', 'json')\n"
        "log = logging.getLogger('replication.x')\n"
        "log.info('plain %s', 'line')\n"
        "events.event(log, events.BROKER_FENCED, broker_id=2, broker_epoch=7)\n"
        "log.debug('not shown')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    docs = [json.loads(line) for line in done.stderr.splitlines()]
    assert [d["message"] for d in docs] == [
        "plain line",
        "broker_fenced broker_id=2 broker_epoch=7",
    ]
    assert (docs[1]["level"], docs[1]["broker_id"], docs[1]["broker_epoch"]) == ("WARNING", 2, 7)


def test_the_start_commands_take_log_format() -> None:
    for role in ("broker", "controller"):
        out = subprocess.run(
            [sys.executable, "-m", "replication.tools.cli", role, "start", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert out.returncode == 0, out.stderr
        assert "--log-format" in out.stdout, role


# --- the controller's state-change log -------------------------------------------------------


def controller(clock: Clock) -> Controller:
    store = MetadataStore(Storage.from_url(f"memory://events-{uuid.uuid4().hex}/meta"))
    c = Controller(store, 100, "127.0.0.1", 9000, session_timeout_ms=SESSION_MS, time_ms=clock)
    c.activate()
    for b in range(3):
        register_live(c, b, "127.0.0.1", 9100 + b, None, f"a{b}")
    return c


def test_a_new_topic_logs_a_leader_change_per_partition(captured: Capture) -> None:
    c = controller(Clock())
    assert [e["broker_id"] for e in captured.events(events.BROKER_REGISTERED)] == [0, 1, 2]
    assert captured.events(events.CONTROLLER_ACTIVE)[0]["controller_id"] == 100
    c.create_topic("t", 2, 3)
    changes = captured.events(events.LEADER_CHANGE)
    assert [(e["topic"], e["partition"], e["old_leader"]) for e in changes] == [
        ("t", 0, -1),
        ("t", 1, -1),
    ]
    for change, state in zip(changes, c.image.topic("t").partitions, strict=True):  # type: ignore[union-attr]
        assert change["new_leader"] == state.leader
        assert change["leader_epoch"] == state.leader_epoch
        assert change["partition_epoch"] == state.partition_epoch
        assert change["isr"] == list(state.isr)
        assert change["logger"] == "replication.state_change"


def test_isr_shrink_and_expand_through_alter_partition(captured: Capture) -> None:
    c = controller(Clock())
    c.create_topic("t", 1, 3)
    state = c.image.topic("t").partitions[0]  # type: ignore[union-attr]
    follower = next(r for r in state.replicas if r != state.leader)
    smaller = tuple(r for r in state.isr if r != follower)
    shrunk = c.alter_partition(
        state.leader, "t", 0, state.leader_epoch, state.partition_epoch, smaller
    )
    c.alter_partition(state.leader, "t", 0, shrunk.leader_epoch, shrunk.partition_epoch, state.isr)
    (shrink,) = captured.events(events.ISR_SHRINK)
    assert shrink["level"] == "WARNING"
    assert (shrink["topic"], shrink["partition"], shrink["leader"]) == ("t", 0, state.leader)
    assert shrink["old_isr"] == list(state.isr)
    assert shrink["new_isr"] == list(smaller)
    assert shrink["replicas_moved"] == [follower]
    assert shrink["leader_epoch"] == state.leader_epoch
    assert shrink["partition_epoch"] == state.partition_epoch + 1
    (expand,) = captured.events(events.ISR_EXPAND)
    assert expand["level"] == "INFO"
    assert expand["new_isr"] == list(state.isr)
    assert expand["replicas_moved"] == [follower]
    assert expand["partition_epoch"] == state.partition_epoch + 2
    assert len(captured.events(events.LEADER_CHANGE)) == 1  # only the topic's creation


def test_a_fenced_broker_logs_its_epoch_and_the_leader_change_it_caused(
    captured: Capture,
) -> None:
    clock = Clock()
    c = controller(clock)
    c.create_topic("t", 1, 3)
    state = c.image.topic("t").partitions[0]  # type: ignore[union-attr]
    epoch = c.image.broker(state.leader).epoch  # type: ignore[union-attr]
    clock.now += SESSION_MS + 1
    for b in range(3):
        if b != state.leader:
            c.heartbeat(b, c.image.broker(b).epoch, c.image.version)  # type: ignore[union-attr]
    assert c.check_sessions() == [state.leader]
    (fenced,) = captured.events(events.BROKER_FENCED)
    assert (fenced["broker_id"], fenced["broker_epoch"]) == (state.leader, epoch)
    assert fenced["reason"] == f"no heartbeat for {SESSION_MS} ms"
    moved = captured.events(events.LEADER_CHANGE)[-1]
    assert (moved["old_leader"], moved["leader_epoch"]) == (state.leader, state.leader_epoch + 1)
    assert moved["new_leader"] != state.leader
    (shrink,) = captured.events(events.ISR_SHRINK)
    assert shrink["replicas_moved"] == [state.leader]
    c.heartbeat(state.leader, epoch, c.image.version)
    back = captured.events(events.BROKER_UNFENCED)[-1]
    assert (back["broker_id"], back["broker_epoch"]) == (state.leader, epoch)


def test_state_changes_name_unclean_elections_and_config_changes(captured: Capture) -> None:
    c = controller(Clock())
    c.create_topic("t", 1, 3, [("retention.ms", "1000")])
    old = c.image
    topic = old.topic("t")
    assert topic is not None
    state = topic.partitions[0]
    outside = next(r for r in state.replicas if r != state.leader)
    unclean = replace(
        state,
        isr=(outside,),
        leader=outside,
        leader_epoch=state.leader_epoch + 1,
        partition_epoch=state.partition_epoch + 1,
    )
    lost = replace(state, isr=(state.leader,))
    new = old.next().with_topic(
        replace(topic, partitions=(unclean,), configs=(("retention.ms", "2000"),))
    )
    log_state_changes(replace(old, topics=(replace(topic, partitions=(lost,)),)), new)
    (election,) = captured.events(events.UNCLEAN_LEADER_ELECTION)
    assert (election["new_leader"], election["old_isr"]) == (outside, [state.leader])
    assert election["leader_epoch"] == state.leader_epoch + 1
    (config,) = captured.events(events.CONFIG_CHANGE)
    assert (config["key"], config["old_value"], config["new_value"]) == (
        "retention.ms",
        "1000",
        "2000",
    )


def test_a_changed_replica_set_is_a_reassignment_step(captured: Capture) -> None:
    c = controller(Clock())
    c.create_topic("t", 1, 2)
    state = c.image.topic("t").partitions[0]  # type: ignore[union-attr]
    spare = next(b for b in range(3) if b not in state.replicas)
    moved = replace(
        state, replicas=(*state.replicas, spare), partition_epoch=state.partition_epoch + 1
    )
    c.update_partition("t", 0, moved)
    (step,) = captured.events(events.REASSIGNMENT_STEP)
    assert (step["topic"], step["partition"], step["leader"]) == ("t", 0, state.leader)
    assert step["old_replicas"] == list(state.replicas)
    assert step["new_replicas"] == [*state.replicas, spare]
    assert step["partition_epoch"] == state.partition_epoch + 1
    assert not captured.events(events.ISR_EXPAND)  # the ISR did not change


def test_unchanged_topics_log_nothing(captured: Capture) -> None:
    topic = TopicInfo("t", "id", ())
    image = MetadataImage(version=1, topics=(topic,))
    log_state_changes(image, image.next())
    assert captured.records == []


def test_text_format_via_configure_logging_writes_the_fields() -> None:
    program = (
        "import logging\n"
        "from replication import events\n"
        "from replication.log_format import configure_logging\n"
        "configure_logging('INFO', 'text')\n"
        "events.event(logging.getLogger('replication.x'), events.ISR_EXPAND, topic='t', "
        "partition=1, new_isr=[0, 1], leader_epoch=4, partition_epoch=9)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    (line,) = done.stderr.splitlines()
    assert line.endswith(
        " INFO replication.x: isr_expand topic=t partition=1 new_isr=[0,1] leader_epoch=4 "
        "partition_epoch=9"
    )


# --- fencing seen by a broker: a stale leader epoch, a fenced producer -------------------------


def test_a_request_with_an_old_leader_epoch_is_a_fenced_leader_epoch_event(
    captured: Capture,
) -> None:
    plog = Log.open(Storage.from_url(f"memory://events-{uuid.uuid4().hex}/t/0"))
    partition = Partition("t", 0, plog, 0, TopicPolicy(), PartitionState((0, 1), (0, 1), 0, 4, 9))
    partition.check_leader_epoch(4, require_leader=True)
    with pytest.raises(FencedLeaderEpochError):
        partition.check_leader_epoch(3, require_leader=True)
    (fenced,) = captured.events(events.FENCED_LEADER_EPOCH)
    assert (fenced["topic"], fenced["partition"], fenced["broker_id"]) == ("t", 0, 0)
    assert (fenced["request_leader_epoch"], fenced["leader_epoch"]) == (3, 4)
    assert fenced["level"] == "WARNING"


def test_a_fenced_producer_is_a_producer_fenced_event(captured: Capture) -> None:
    async def never(*_: object) -> Any:
        raise AssertionError("not called")

    coordinator = TransactionCoordinator(0, 900_000, MetadataImage, never, never, never)
    coordinator.active = True
    coordinator.txns["tx"] = TransactionMetadata("tx", 5, 3, 60_000)
    with pytest.raises(ProducerFencedError):
        asyncio.run(coordinator.add_partitions("tx", 5, 2, []))
    (fenced,) = captured.events(events.PRODUCER_FENCED)
    assert (fenced["transactional_id"], fenced["producer_id"]) == ("tx", 5)
    assert (fenced["producer_epoch"], fenced["current_producer_epoch"]) == (2, 3)
