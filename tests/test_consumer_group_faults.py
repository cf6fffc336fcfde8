"""Consumer groups under real faults, with members as processes (tests/group_member.py):
a member SIGKILLed (its partitions move, nothing is skipped), a member SIGSTOPped past its
session and resumed (it rejoins; no commit of its old generation lands: committed offsets
never go back), and the group coordinator's broker SIGKILLed while members commit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from replication.client import Admin, NewTopic, Producer, TopicPartition
from replication.errors import ReplogError
from tests.cluster import BrokerProcess, Cluster, wait_until
from tests.helpers import unique_name

pytestmark = [pytest.mark.cluster, pytest.mark.chaos, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent
GROUPS = {"offsets.topic.num.partitions": "3", "group.initial.rebalance.delay.ms": "0"}


class MemberProcess:
    def __init__(self, bootstrap: str, group: str, topic: str, out: Path) -> None:
        self.out = out
        with open(out.with_suffix(".stderr"), "w") as stderr:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.group_member",
                    "--bootstrap",
                    bootstrap,
                    "--group",
                    group,
                    "--topic",
                    topic,
                    "--out",
                    str(out),
                ],
                cwd=ROOT,
                stderr=stderr,
            )

    def values(self) -> set[int]:
        if not self.out.exists():
            return set()
        # the member writes while this reads: its last line may be half written (no newline)
        lines = self.out.read_text().split("\n")[:-1]
        return {int(line.split()[2]) for line in lines if line and line[0].isdigit()}

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class OffsetWatch:
    """Reads the group's committed offsets over and over; notes any that go back."""

    def __init__(self, bootstrap: str, group: str) -> None:
        self.bootstrap, self.group = bootstrap, group
        self.highest: dict[TopicPartition, int] = {}
        self.backwards: list[tuple[TopicPartition, int, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        with Admin(bootstrap_servers=self.bootstrap, default_api_timeout_ms=5000) as admin:
            while not self.stop.wait(0.1):
                try:
                    offsets = admin.list_consumer_group_offsets(self.group, timeout_ms=5000)
                except ReplogError:
                    continue  # the coordinator is moving: ask again
                for tp, offset in offsets.items():
                    if offset < self.highest.get(tp, -1):
                        self.backwards.append((tp, self.highest[tp], offset))
                    self.highest[tp] = max(offset, self.highest.get(tp, -1))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def produce(bootstrap: str, topic: str, values: range, partitions: int) -> None:
    with Producer(bootstrap_servers=bootstrap) as producer:
        for i in values:
            producer.send(topic, value=str(i).encode(), partition=i % partitions)
        producer.flush()


def consumed(members: list[MemberProcess]) -> set[int]:
    return set().union(*(m.values() for m in members))


def wait_consumed(
    members: list[MemberProcess], count: int, partitions: int, timeout: float
) -> None:
    """Wait until the members have consumed every value below ``count``; on timeout, fail
    naming what is missing (by partition) and each member's state and last log lines."""
    try:
        wait_until(lambda: consumed(members) >= set(range(count)), timeout=timeout, message="all")
    except AssertionError as err:
        missing = sorted(set(range(count)) - consumed(members))
        by_partition = {p: sum(v % partitions == p for v in missing) for p in range(partitions)}
        lines = [f"{err}: {len(missing)} values missing, by partition {by_partition}"]
        for i, m in enumerate(members):
            tail = m.out.with_suffix(".stderr").read_text().splitlines()[-15:]
            lines.append(f"member {i} (exit code {m.proc.poll()}), last log lines:")
            lines.extend(f"  {line[:300]}" for line in tail)
        raise AssertionError("\n".join(lines)) from None


def owners(bootstrap: str, group: str) -> list[frozenset[TopicPartition]]:
    with Admin(bootstrap_servers=bootstrap) as admin:
        try:
            return [m.assignment for m in admin.describe_consumer_group(group).members]
        except ReplogError:
            return []


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "broker", overrides=GROUPS).start()
    yield proc
    proc.kill()


def test_a_sigkilled_members_partitions_move_and_nothing_is_skipped(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    topic, group = unique_name("faults"), unique_name("g")
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 6, 1)])
    members = [MemberProcess(broker.bootstrap, group, topic, tmp_path / f"m{i}") for i in range(3)]
    try:
        wait_until(lambda: len(owners(broker.bootstrap, group)) == 3, timeout=60)
        produce(broker.bootstrap, topic, range(1500), 6)
        wait_until(lambda: len(consumed(members)) >= 1000, timeout=60, message="progress")
        victim = members[0]
        victim.signal(signal.SIGKILL)
        victim.proc.wait(timeout=30)
        produce(broker.bootstrap, topic, range(1500, 3000), 6)
        # its partitions move to the others once its session expires
        wait_until(
            lambda: [len(a) for a in owners(broker.bootstrap, group)] in ([3, 3],),
            timeout=60,
            message="the survivors own all six partitions",
        )
        wait_consumed(members, 3000, 6, timeout=90)
    finally:
        for m in members:
            m.stop()


def test_a_member_paused_past_its_session_rejoins_and_no_stale_commit_lands(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    topic, group = unique_name("faults"), unique_name("g")
    with Admin(bootstrap_servers=broker.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 4, 1)])
    members = [MemberProcess(broker.bootstrap, group, topic, tmp_path / f"m{i}") for i in range(2)]
    watch = OffsetWatch(broker.bootstrap, group)
    try:
        wait_until(lambda: len(owners(broker.bootstrap, group)) == 2, timeout=60)
        produce(broker.bootstrap, topic, range(1000), 4)
        wait_until(lambda: len(consumed(members)) >= 500, timeout=60, message="progress")
        zombie = members[0]
        zombie.signal(signal.SIGSTOP)
        wait_until(
            lambda: [len(a) for a in owners(broker.bootstrap, group)] == [4],
            timeout=60,
            message="the other member takes all four partitions",
        )
        produce(broker.bootstrap, topic, range(1000, 2000), 4)
        wait_until(lambda: members[1].values() >= set(range(1000, 2000)), timeout=60)
        zombie.signal(signal.SIGCONT)
        wait_until(lambda: len(owners(broker.bootstrap, group)) == 2, timeout=60, message="rejoin")
        produce(broker.bootstrap, topic, range(2000, 2400), 4)
        wait_consumed(members, 2400, 4, timeout=60)
        wait_until(lambda: sum(watch.highest.values()) == 2400, timeout=60, message="committed")
    finally:
        watch.close()
        for m in members:
            m.stop()
    assert watch.backwards == []


def test_the_coordinators_broker_sigkilled_while_members_commit(
    cluster_factory: object, tmp_path: Path
) -> None:
    cluster: Cluster = cluster_factory(brokers=3, overrides=GROUPS)  # type: ignore[operator]
    bootstrap = cluster.bootstrap
    topic, group = unique_name("faults"), unique_name("g")
    with Admin(bootstrap_servers=bootstrap) as admin:
        # every broker registered first: __consumer_offsets gets 3 replicas, not fewer
        wait_until(lambda: len(admin.describe_cluster().brokers) == 3, timeout=60)
        admin.create_topics([NewTopic(topic, 4, 3, {"min.insync.replicas": "2"})])
    members = [MemberProcess(bootstrap, group, topic, tmp_path / f"m{i}") for i in range(2)]
    watch = OffsetWatch(bootstrap, group)
    try:
        wait_until(lambda: len(owners(bootstrap, group)) == 2, timeout=90)
        produce(bootstrap, topic, range(2000), 4)
        wait_until(lambda: len(consumed(members)) >= 800, timeout=60, message="progress")
        with Admin(bootstrap_servers=bootstrap) as admin:
            coordinator = admin.describe_consumer_group(group).coordinator
        survivors = ",".join(b.bootstrap for i, b in cluster.brokers.items() if i != coordinator)
        cluster.brokers[coordinator].kill()
        produce(survivors, topic, range(2000, 3000), 4)
        wait_consumed(members, 3000, 4, timeout=120)
        watch.bootstrap = survivors
        wait_until(lambda: sum(watch.highest.values()) == 3000, timeout=120, message="committed")
    finally:
        watch.close()
        for m in members:
            m.stop()
    assert watch.backwards == []
