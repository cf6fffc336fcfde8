"""The client commands of `replog` as a user runs them: real processes, a real 3-broker cluster.

Every command runs as ``python -m replication.tools.cli ...`` in a subprocess, so what is checked is
what a user sees: stdout, one line on stderr for any mistake (never a traceback), the exit
status. One cluster (a controller and three brokers) serves the module; tests use their own
topic names.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from replication.tools import perf
from tests.cluster import Cluster
from tests.helpers import free_port, unique_name, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = Cluster(tmp_path_factory.mktemp("cli-cluster"), brokers=3)
    try:
        started.start()
        yield started
    finally:
        started.stop()


def replog(
    *args: str, input: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replication.tools.cli", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}{result.stdout}"
    return result


def assert_one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> str:
    """Exit 1, nothing on stdout, one line on stderr that starts with 'error:', no traceback."""
    err = result.stderr
    assert result.returncode == 1, f"exit {result.returncode}: {err}{result.stdout}"
    assert "Traceback" not in err, err
    assert result.stdout == "", result.stdout
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def run_all(
    cases: list[tuple[tuple[str, ...], str | None, tuple[str, ...]]],
) -> list[tuple[subprocess.CompletedProcess[str], tuple[str, ...]]]:
    """Run the commands at once (each is a process mostly waiting), in order of ``cases``."""
    with ThreadPoolExecutor(max_workers=6) as pool:
        futures = [pool.submit(replog, *argv, input=stdin) for argv, stdin, _ in cases]
        return [(f.result(), words) for f, (_, _, words) in zip(futures, cases, strict=True)]


# --- the round trip -------------------------------------------------------------------------


def test_topics_produce_consume_describe_delete(cluster: Cluster) -> None:
    bs = ("--bootstrap-server", cluster.bootstrap)
    topic = unique_name("cli")
    created = ok(
        replog(
            "topics", "create", topic,
            "--partitions", "3", "--replication-factor", "3",
            "--config", "min.insync.replicas=2", "--config", "retention.ms=3600000",
            *bs,
        )
    )  # fmt: skip
    assert created.stdout.strip() == f"Created topic {topic}."
    assert topic in ok(replog("topics", "list", *bs)).stdout.split()
    # --if-not-exists makes a second create a no-op; without it, the error names the way out
    ok(replog("topics", "create", topic, "--partitions", "3", "--if-not-exists", *bs))
    assert_one_line_error(
        replog("topics", "create", topic, "--partitions", "3", *bs), "already exists"
    )

    lines = [f"user-{i % 7}:event {i}" for i in range(60)]
    produced = replog(
        "produce", topic, "--key-separator", ":", "--acks", "all", *bs,
        input="\n".join(lines) + "\n",
    )  # fmt: skip
    ok(produced)
    assert produced.stdout == ""
    assert produced.stderr == ""

    # Read-only commands, run at once: keys and values, values only, a capped and an idle run.
    consumed, values, two, idle = (
        ok(result)
        for result, _ in run_all(
            [
                (("consume", topic, "--from-beginning", "--max-messages", "60",
                  "--property", "print.key=true", "--property", "key.separator=:", *bs),
                 None, ()),
                (("consume", topic, "--from-beginning", "--max-messages", "60", *bs), None, ()),
                (("consume", topic, "--from-beginning", "--max-messages", "2", *bs), None, ()),
                (("consume", topic, "--timeout-ms", "300", *bs), None, ()),
            ]
        )
    )  # fmt: skip
    assert sorted(consumed.stdout.splitlines()) == sorted(lines)
    assert consumed.stderr.strip() == "Processed a total of 60 messages"
    # Values only by default; per key, in the order produced (one key, one partition).
    got = values.stdout.splitlines()
    assert sorted(got) == sorted(line.split(":", 1)[1] for line in lines)
    for key in range(7):
        of_key = [v for v in got if int(v.split()[1]) % 7 == key]
        assert of_key == sorted(of_key, key=lambda v: int(v.split()[1]))
    # --max-messages caps the output; --timeout-ms ends a run that has nothing new.
    assert len(two.stdout.splitlines()) == 2
    assert idle.stdout == ""
    assert idle.stderr.strip() == "Processed a total of 0 messages"

    # --group (as kafka-console-consumer's): a first run from the beginning prints 25 and
    # commits the offsets after them; the next run of the group prints the other 35; after one
    # more record, a third prints just that one. Each record once over the three runs.
    group = unique_name("cli-group")
    as_group = ("consume", topic, "--group", group, "--property", "print.key=true",
                "--property", "key.separator=:", "--timeout-ms", "60000", *bs)  # fmt: skip
    first = ok(replog(*as_group, "--from-beginning", "--max-messages", "25"))
    rest = ok(replog(*as_group, "--max-messages", "35"))
    ok(replog("produce", topic, "--key-separator", ":", *bs, input="user-late:late\n"))
    late = ok(replog(*as_group, "--max-messages", "1"))
    assert len(first.stdout.splitlines()) == 25
    assert sorted(first.stdout.splitlines() + rest.stdout.splitlines()) == sorted(lines)
    assert late.stdout == "user-late:late\n"
    assert_one_line_error(
        replog("consume", topic, "--group", group, "--partition", "0", *bs),
        "--group",
        "--partition",
    )

    # describe --json: the metadata, and every replica's own LEO and lag, from its broker
    def described() -> dict[str, Any] | None:
        doc = json.loads(ok(replog("topics", "describe", topic, "--json", *bs)).stdout)
        parts = doc["partitions"]
        settled = all(
            r["lag"] == 0 and r["log_end_offset"] == p["high_watermark"]
            for p in parts
            for r in p["replica_states"]
        )
        return doc if settled else None

    doc = wait_until(described, timeout=20, message="every replica caught up")
    assert doc["topic"] == topic
    assert (doc["partition_count"], doc["replication_factor"]) == (3, 3)
    assert doc["is_internal"] is False
    assert [p["partition"] for p in doc["partitions"]] == [0, 1, 2]
    assert sum(p["high_watermark"] for p in doc["partitions"]) == 61  # the 60, and "late"
    for p in doc["partitions"]:
        assert sorted(p["replicas"]) == [0, 1, 2]
        assert sorted(p["isr"]) == [0, 1, 2]
        assert p["leader"] in p["replicas"]
        assert p["leader_epoch"] >= 0
        assert p["offline_replicas"] == []
        assert p["under_replicated"] is False
        assert p["log_start_offset"] == 0
        assert p["log_end_offset"] == p["high_watermark"]
        states = p["replica_states"]
        assert [r["broker"] for r in states] == p["replicas"]
        assert [r["broker"] for r in states if r["is_leader"]] == [p["leader"]]
        for r in states:
            assert r["in_isr"] is True
            assert r["error"] is None
            assert r["log_end_offset"] == r["durable_end_offset"] == p["high_watermark"]
            assert r["lag"] == 0
            assert r["log_start_offset"] == 0
            assert r["size_bytes"] > 0 or p["high_watermark"] == 0
            assert r["leader_epoch"] == p["leader_epoch"]

    # with no name, every topic; the trouble filters keep none of a healthy topic's partitions
    every = json.loads(ok(replog("topics", "describe", "--json", *bs)).stdout)
    [ours] = [d for d in every if d["topic"] == topic]
    assert (ours["partition_count"], ours["min_insync_replicas"]) == (3, 2)
    for flag in ("--under-replicated-partitions", "--under-min-isr-partitions",
                 "--unavailable-partitions"):  # fmt: skip
        troubled = json.loads(ok(replog("topics", "describe", flag, "--json", *bs)).stdout)
        assert topic not in [d["topic"] for d in troubled], flag

    table = ok(replog("topics", "describe", topic, *bs)).stdout
    assert f"topic {topic}: 3 partitions, replication factor 3" in table
    assert "min.insync.replicas 2" in table
    assert "leader" in table
    assert "LEO" in table
    assert "lag" in table

    deleted = ok(replog("topics", "delete", topic, *bs))
    assert deleted.stdout.strip() == f"Deleted topic {topic}."
    wait_until(
        lambda: topic not in ok(replog("topics", "list", *bs)).stdout.split(),
        timeout=20,
        message="the topic is gone",
    )
    ok(replog("topics", "delete", topic, "--if-exists", *bs))


def test_topics_alter_adds_partitions(cluster: Cluster) -> None:
    """`topics alter --partitions` (kafka-topics --alter --partitions): the topic grows, every
    new partition gets a leader; a count that does not grow is one line naming the range."""
    bs = ("--bootstrap-server", cluster.bootstrap)
    topic = unique_name("alter")
    ok(replog("topics", "create", topic, "--partitions", "2", "--replication-factor", "3", *bs))
    altered = ok(replog("topics", "alter", topic, "--partitions", "4", *bs))
    assert altered.stdout.strip() == f"Topic {topic} now has 4 partitions."

    def described() -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(
            ok(replog("topics", "describe", topic, "--json", *bs)).stdout
        )
        return doc

    wait_until(
        lambda: (
            described()["partition_count"] == 4
            and all(p["leader"] >= 0 for p in described()["partitions"])
        ),
        timeout=60,
        message=f"{topic}'s 4 partitions, each with a leader",
    )
    assert described()["replication_factor"] == 3
    assert_one_line_error(
        replog("topics", "alter", topic, "--partitions", "3", *bs),
        "has 4 partitions",
        "between 5 and",
    )


def test_describe_shows_a_lost_replica(cluster_factory: object) -> None:
    """A dead broker's replicas show no offsets and say why; the rest still show."""
    small = cluster_factory(brokers=2)  # type: ignore[operator]
    bs = ("--bootstrap-server", small.bootstrap)
    topic = unique_name("cli")
    ok(replog("topics", "create", topic, "--partitions", "2", "--replication-factor", "2", *bs))
    ok(replog("produce", topic, *bs, input="a\nb\nc\n"))
    small.brokers[1].kill()
    doc = json.loads(ok(replog("topics", "describe", topic, "--json", *bs)).stdout)
    for p in doc["partitions"]:
        lost = next(r for r in p["replica_states"] if r["broker"] == 1)
        assert lost["log_end_offset"] is None
        assert lost["lag"] is None
        assert "broker" in lost["error"]
        kept = next(r for r in p["replica_states"] if r["broker"] == 0)
        assert kept["log_end_offset"] is not None
        assert kept["error"] is None

    # Once the ISR has shrunk to broker 0, both partitions are under-replicated, at
    # min.insync.replicas (1), not under it, and still led.
    def troubled(flag: str) -> list[int]:
        found = json.loads(ok(replog("topics", "describe", flag, "--json", *bs)).stdout)
        return [p["partition"] for d in found if d["topic"] == topic for p in d["partitions"]]

    wait_until(
        lambda: troubled("--under-replicated-partitions") == [0, 1],
        timeout=30,
        message="both partitions under-replicated",
    )
    assert troubled("--at-min-isr-partitions") == [0, 1]
    assert troubled("--under-min-isr-partitions") == []
    assert troubled("--unavailable-partitions") == []
    table = ok(replog("topics", "describe", "--under-replicated-partitions", *bs)).stdout
    assert f"topic {topic}: 2 partitions" in table


# --- mistakes: one line, exit 1 ---------------------------------------------------------------

#: (argv, stdin, words the error line must hold); {known}: an existing 2-partition topic,
#: {new}: a fresh name.
MISTAKES: list[tuple[tuple[str, ...], str | None, tuple[str, ...]]] = [
    (("topics", "describe", "no-such-topic"), None, ("no-such-topic", "does not exist")),
    (("topics", "delete", "no-such-topic"), None, ("no-such-topic", "does not exist")),
    (("produce", "no-such-topic"), "x\n", ("no-such-topic", "does not exist")),
    (("consume", "no-such-topic"), None, ("no-such-topic", "does not exist")),
    (("perf", "produce", "--topic", "no-such-topic", "--num-records", "1",
      "--record-size", "1"), None, ("no-such-topic",)),
    (("perf", "consume", "--topic", "no-such-topic", "--messages", "1"), None,
     ("no-such-topic",)),
    (("topics", "create", "{new}", "--partitions", "0"), None, ("partitions", "0")),
    (("topics", "create", "{new}", "--partitions", "-3"), None, ("partitions",)),
    (("topics", "create", "{new}", "--partitions", "abc"), None, ("--partitions",)),
    (("topics", "create", "{new}", "--replication-factor", "9"), None,
     ("replication factor 9",)),
    (("topics", "create", "{new}", "--config", "no.such.key=1"), None,
     ("no.such.key", "retention.ms")),
    (("topics", "create", "{new}", "--config", "retention.ms=soon"), None, ("retention.ms",)),
    (("topics", "create", "{new}", "--config", "cleanup.policy=compacted"), None,
     ("cleanup.policy='compacted'", "compact,delete")),
    (("topics", "create", "{new}", "--config", "retention.ms"), None,
     ("--config", "key=value")),
    (("topics", "create", "{known}"), None, ("already exists",)),
    (("produce", "{known}", "--acks", "2"), "x\n", ("acks",)),
    (("produce", "{known}", "--partition", "5"), "x\n", ("--partition 5", "0..1")),
    (("produce", "{known}", "--key-separator", ":"), "k:v\nno separator\n",
     ("line 2", "':'")),
    (("produce", "{known}", "--producer-property", "no.such=1"), "x\n", ("no.such",)),
    (("consume", "{known}", "--isolation-level", "dirty"), None, ("isolation.level",)),
    (("consume", "{known}", "--offset", "3"), None, ("--partition",)),
    (("consume", "{known}", "--property", "print.colour=true"), None, ("print.colour",)),
    (("perf", "produce", "--topic", "{known}", "--num-records", "10", "--record-size", "10",
      "--mode", "columns"), None, ("--mode",)),
    (("perf", "produce", "--topic", "{known}", "--num-records", "0", "--record-size", "10"),
     None, ("--num-records",)),
    (("topics", "frobnicate"), None, ("frobnicate",)),
]  # fmt: skip


def test_mistakes_are_one_line_and_exit_1(cluster: Cluster) -> None:
    bs = ("--bootstrap-server", cluster.bootstrap)
    known = unique_name("known")
    ok(replog("topics", "create", known, "--partitions", "2", *bs))
    cases = [
        (
            tuple(a.format(known=known, new=unique_name("new")) for a in argv) + bs,
            stdin,
            words,
        )
        for argv, stdin, words in MISTAKES
    ]
    failures = []
    for (result, words), (argv, _, _) in zip(run_all(cases), cases, strict=True):
        try:
            assert_one_line_error(result, *words)
        except AssertionError as err:
            failures.append(f"replog {' '.join(argv)}: {err}")
    assert not failures, "\n".join(failures)


UNREACHABLE = [
    ("topics", "list"),
    ("topics", "create", "t", "--partitions", "1"),
    ("topics", "describe", "t"),
    ("topics", "delete", "t"),
    ("produce", "t"),
    ("consume", "t"),
    ("perf", "produce", "--topic", "t", "--num-records", "1", "--record-size", "1"),
    ("perf", "consume", "--topic", "t", "--messages", "1"),
]


def test_unreachable_bootstrap_server_is_one_line_naming_the_address() -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    results = run_all(
        [
            ((*argv, "--bootstrap-server", address), "x\n", (address, "--bootstrap-server"))
            for argv in UNREACHABLE
        ]
    )
    for result, words in results:
        assert_one_line_error(result, *words)
    # a malformed address is refused before any connection
    assert_one_line_error(replog("topics", "list", "--bootstrap-server", "localhost"), "host:port")


# --- perf -------------------------------------------------------------------------------------


PRODUCE_FIELDS = {
    "mode", "topic", "acks", "records", "record_size", "bytes", "elapsed_s", "records_per_s",
    "mb_per_s", "latency", "latency_sample_every", "latency_samples", "latency_avg_ms",
    "latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "latency_max_ms",
    "target_records_per_s", "errors", "first_error",
}  # fmt: skip


class FakeClock:
    """perf's ``time`` module: a clock that moves only when the throttler sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.mark.unit
def test_perf_throttler_holds_sends_to_the_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(perf, "time", clock)
    throttle = perf._Throttler(5000, clock.now)
    for sent in range(1, 1001):  # sends that take no time
        throttle(sent)
        # never more than a millisecond ahead of 5000 records/s
        assert sent / 5000 - (clock.now - 100.0) <= 0.001
    assert clock.now - 100.0 == pytest.approx(0.2, abs=0.001)  # 1000 records at 5000/s
    assert all(s > 0.001 for s in clock.sleeps)  # no sleep shorter than it is worth


@pytest.mark.unit
def test_perf_throttler_unthrottled_never_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(perf, "time", clock)
    throttle = perf._Throttler(-1, clock.now)
    for sent in range(1, 1001):
        throttle(sent)
    assert clock.sleeps == []


def test_perf_produce_and_consume_json(cluster: Cluster) -> None:
    bs = ("--bootstrap-server", cluster.bootstrap)
    topic = unique_name("perf")
    ok(replog("topics", "create", topic, "--partitions", "2", "--replication-factor", "3", *bs))
    runs = [
        ("records", ("--num-records", "3000", "--acks", "all")),
        ("arrow", ("--num-records", "5000", "--acks", "1", "--arrow-batch-records", "1000")),
        ("records", ("--num-records", "1000", "--acks", "1", "--throughput", "5000")),
    ]
    for mode, extra in runs:
        out = ok(
            replog(
                "perf", "produce", "--topic", topic, "--record-size", "100", "--mode", mode,
                "--json", *extra, *bs,
            )
        )  # fmt: skip
        (line,) = out.stdout.splitlines()
        result = json.loads(line)
        assert set(result) == PRODUCE_FIELDS
        assert result["mode"] == mode
        assert result["errors"] == 0
        assert result["bytes"] == result["records"] * 100
        assert result["records_per_s"] > 0
        assert result["mb_per_s"] > 0
        assert result["latency"] == ("record" if mode == "records" else "batch")
        assert result["latency_samples"] > 0
        assert (
            0
            < result["latency_p50_ms"]
            <= result["latency_p95_ms"]
            <= result["latency_p99_ms"]
            <= result["latency_max_ms"]
        )
    throttled = result
    assert throttled["target_records_per_s"] == 5000  # the throttle: test_perf_throttler_*
    assert throttled["records"] == 1000

    out = ok(replog("perf", "consume", "--topic", topic, "--messages", "9000", "--json", *bs))
    (line,) = out.stdout.splitlines()
    consumed = json.loads(line)
    assert set(consumed) == {
        "topic", "records", "bytes", "elapsed_s", "records_per_s", "mb_per_s", "complete",
    }  # fmt: skip
    assert consumed["records"] == 9000
    assert consumed["complete"] is True
    assert consumed["bytes"] == 9000 * 100
    assert consumed["records_per_s"] > 0
    assert consumed["mb_per_s"] > 0

    # Human output: the Kafka-style summary line, saying what the latency measures.
    human = ok(
        replog(
            "perf", "produce", "--topic", topic, "--num-records", "100", "--record-size", "10",
            *bs,
        )
    )  # fmt: skip
    assert "records/sec" in human.stdout
    assert "per record, send() to ack" in human.stdout


# --- Ctrl-C -----------------------------------------------------------------------------------


def test_consume_runs_until_ctrl_c(cluster: Cluster) -> None:
    bs = ("--bootstrap-server", cluster.bootstrap)
    topic = unique_name("ctrl-c")
    ok(replog("topics", "create", topic, "--partitions", "1", *bs))
    ok(replog("produce", topic, *bs, input="first\n"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "replication.tools.cli", "consume", topic, "--from-beginning", *bs],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as from a terminal: a runner started in the background (or some CI runners) ignores
        # SIGINT, and an ignored SIGINT is inherited; Python handles it only if it is default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(30)
        assert got == ["first\n"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
        stderr = proc.stderr.read()
        assert "Traceback" not in stderr, stderr
        assert stderr.strip() == "Processed a total of 1 messages"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_help_lists_the_client_commands() -> None:
    """`replog` alone shows the help, with the client commands, and exits 2 (as click)."""
    result = replog()
    assert result.returncode == 2
    for command in ("topics", "produce", "consume", "perf"):
        assert command in result.stdout + result.stderr
    # a Kafka user finds each Kafka tool's counterpart by the tool's name
    shown = " ".join((result.stdout + result.stderr).split())
    for tool in (
        "kafka-topics", "kafka-console-producer", "kafka-console-consumer",
        "kafka-consumer-groups", "kafka-configs", "kafka-acls", "kafka-transactions",
        "kafka-delete-records", "kafka-reassign-partitions", "kafka-leader-election",
        "kafka-dump-log", "kafka-producer-perf-test", "kafka-consumer-perf-test",
    ):  # fmt: skip
        assert tool in shown.replace("│ ", "").replace(" │", ""), tool


# --- --command-config ------------------------------------------------------------------------


def test_command_config_reaches_the_clients_of_every_command(
    cluster: Cluster, tmp_path: Any
) -> None:
    """A properties file (Kafka's tools' --command-config) is read by every client command:
    a good one works, and a key no client knows fails each command naming that key (so no
    command ignores the file)."""
    topic = unique_name("cc")
    good = tmp_path / "client.properties"
    good.write_text(
        "# a Kafka tools' properties file\n"
        "! comments either way\n"
        "client.id = replog-cli-test\n"
        "request.timeout.ms: 20000\n"
        "security.protocol=PLAIN\\\n"
        "  TEXT\n"
    )
    bad = tmp_path / "bad.properties"
    bad.write_text("no.such.client.key=1\n")
    bs = ("--bootstrap-server", cluster.bootstrap)
    ok(replog("topics", "create", topic, "--partitions", "1", *bs, "--command-config", str(good)))
    commands: list[tuple[tuple[str, ...], str | None]] = [
        (("topics", "list"), None),
        (("topics", "describe", topic), None),
        (("produce", topic), "a\nb\n"),
        (("consume", topic, "--from-beginning", "--max-messages", "1"), None),
        (("perf", "produce", "--topic", topic, "--num-records", "5", "--record-size", "8"), None),
        (("configs", "describe", "--entity-type", "topics", "--entity-name", topic), None),
        (("consumer-groups", "list"), None),
        (("transactions", "list"), None),
        (("users", "list"), None),
        (("records", "delete", "--topic", topic, "--partition", "0", "--offset", "1"), None),
        (("partitions", "elect-leaders", "--election-type", "preferred", "--topic", topic), None),
    ]
    for config, expect_ok in ((good, True), (bad, False)):
        no_words: tuple[str, ...] = ()
        cases = [
            ((*argv, *bs, "--command-config", str(config)), stdin, no_words)
            for argv, stdin in commands
        ]
        for (result, _), (argv, _, _) in zip(run_all(cases), cases, strict=True):
            if expect_ok:
                assert result.returncode == 0, (argv, result.stderr)
            else:
                assert_one_line_error(result, "no.such.client.key")
    missing = replog("topics", "list", *bs, "--command-config", str(tmp_path / "none"))
    assert_one_line_error(missing, "--command-config", "cannot read it")
