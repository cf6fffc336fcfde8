"""The chaos harness (tests/chaos): its checker on hand-made histories, its fault plumbing
(faulty storage through the launcher's control file, a blocked proxy, a tmpfs disk that fills
up, a faked clock that steps a running process, a network lab that drops packets), and seeded
schedules against real clusters that must find nothing wrong.

The long run (100 schedules over every fault class) is ``python -m tests.chaos --schedules 100``.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from subprocess import PIPE
from types import SimpleNamespace

import pytest

from logstore.storage import Storage
from replication.client import Admin
from tests import faulty_fs
from tests.chaos.checker import ANOMALY_KINDS, check, longest_without_ack
from tests.chaos.clocks import FakeClock
from tests.chaos.cluster import ChaosCluster
from tests.chaos.disks import TmpfsDisk
from tests.chaos.history import (
    NO_OFFSET,
    Ack,
    CorruptRead,
    Fault,
    FinalState,
    HighWatermark,
    History,
    OutOfRange,
    Read,
    Retention,
    StoredBatch,
    TimestampLookup,
    Transaction,
    transformed_value,
)
from tests.chaos.launcher import UNTIL_CHANGED, apply_faults
from tests.chaos.nemesis import FAULT_CLASSES, plan
from tests.chaos.netns import NetworkLab
from tests.chaos.runner import run_schedule
from tests.faulty_fs import FaultyStorage, InjectedStorageError
from tests.helpers import wait_until
from tests.proxy import TcpProxy

pytestmark = pytest.mark.chaos

E = "events"
T = "txn-events"


def clean() -> tuple[History, FinalState]:
    """A history with nothing wrong: 2 producers, a committed, an aborted and an unknown
    transaction, two readers, identical replicas, quick shutdowns."""
    history = History(
        acks=[
            Ack("p1", "p1-000000", E, 0, 0, 1.0),
            Ack("p2", "p2-000000", E, 0, 1, 1.1),
            Ack("p1", "p1-000001", E, 1, 0, 1.2),
            Ack("p1", "p1-000002", E, 0, 2, 1.3),
        ],
        transactions=[
            Transaction(0, T, ((0, "t000000-0"), (1, "t000000-1")), "committed"),
            Transaction(1, T, ((0, "t000001-0"),), "aborted"),
            Transaction(2, T, ((1, "t000002-0"), (0, "t000002-1")), "unknown"),
        ],
        reads=[
            Read("read_uncommitted", E, 0, 1, "p2-000000", 1.5),
            Read("read_uncommitted", T, 0, 2, "t000001-0", 1.5),
            Read("read_committed", T, 1, 0, "t000000-1", 1.6),
        ],
        high_watermarks=[
            HighWatermark("read_uncommitted", E, 0, 2, 1.5),
            HighWatermark("read_committed", E, 0, 1, 1.5),  # another reader: its own series
            HighWatermark("read_uncommitted", E, 0, 3, 1.6),
        ],
    )
    batches = [StoredBatch(0, 0, 0, 11), StoredBatch(1, 2, 1, 22)]
    final = FinalState(
        uncommitted={
            (E, 0): {0: "p1-000000", 1: "p2-000000", 2: "p1-000002", 3: "p2-000001"},
            (E, 1): {0: "p1-000001"},
            # offset 1 and 4 hold transaction markers; t000002 (unknown) never made it
            (T, 0): {0: "t000000-0", 2: "t000001-0"},
            (T, 1): {0: "t000000-1"},
        },
        committed={
            (E, 0): {0: "p1-000000", 1: "p2-000000", 2: "p1-000002", 3: "p2-000001"},
            (E, 1): {0: "p1-000001"},
            (T, 0): {0: "t000000-0"},
            (T, 1): {0: "t000000-1"},
        },
        high_watermarks={(E, 0): 4, (E, 1): 1},
        replicas={(E, 0): {0: batches, 1: list(batches), 2: list(batches)}},
        sigterm_s={"broker-0": 0.4, "controller-100": 0.2},
    )
    return history, final


def counts(history: History, final: FinalState) -> dict[str, int]:
    return {kind: len(found) for kind, found in check(history, final).items()}


def only(kind: str, n: int = 1) -> dict[str, int]:
    return {k: (n if k == kind else 0) for k in ANOMALY_KINDS}


# --- the checker ------------------------------------------------------------------------------


@pytest.mark.unit
def test_a_clean_history_passes() -> None:
    assert counts(*clean()) == only("none", 0)


@pytest.mark.unit
def test_acked_record_missing_is_lost() -> None:
    history, final = clean()
    del final.uncommitted[(E, 1)][0]
    found = check(history, final)
    assert {k: len(v) for k, v in found.items()} == only("acked_lost")
    assert "p1-000001 acked at events-1@0 is gone" in found["acked_lost"][0]


@pytest.mark.unit
def test_acked_offset_holding_another_value_is_lost() -> None:
    history, final = clean()
    final.uncommitted[(E, 1)][0] = "p3-000007"
    assert counts(history, final) == only("acked_lost")


@pytest.mark.unit
def test_acked_record_elsewhere_is_a_wrong_offset() -> None:
    history, final = clean()
    final.uncommitted[(E, 1)] = {1: "p1-000001"}
    assert counts(history, final) == only("wrong_offset")


@pytest.mark.unit
def test_a_record_acked_without_an_offset_must_be_stored_in_its_partition() -> None:
    history, final = clean()
    history.acks.append(Ack("pk1.0", "pk1.0-000000", E, 1, NO_OFFSET, 1.4))
    final.uncommitted[(E, 1)][1] = "pk1.0-000000"
    assert counts(history, final) == only("none", 0)
    final.uncommitted[(E, 0)][4] = final.uncommitted[(E, 1)].pop(1)
    assert counts(history, final) == only("wrong_offset")
    del final.uncommitted[(E, 0)][4]
    assert counts(history, final) == only("acked_lost")


@pytest.mark.unit
def test_a_value_stored_twice_is_a_duplicate() -> None:
    history, final = clean()
    final.uncommitted[(E, 0)][4] = "p2-000001"  # never acked (a failed send): at most once
    assert counts(history, final) == only("duplicates")


@pytest.mark.unit
def test_a_producers_values_out_of_order() -> None:
    history, final = clean()
    final.uncommitted[(E, 1)] = {0: "p1-000001", 1: "p1-000005", 2: "p1-000004"}
    found = check(history, final)
    assert {k: len(v) for k, v in found.items()} == only("order")
    assert "p1-000004 at offset 2 follows p1-000005 at offset 1" in found["order"][0]


@pytest.mark.unit
def test_a_read_that_changed_or_vanished() -> None:
    history, final = clean()
    history.reads.append(Read("read_uncommitted", E, 0, 3, "p3-000009", 2.0))  # replaced
    history.reads.append(Read("read_committed", E, 1, 5, "p1-000010", 2.0))  # gone
    assert counts(history, final) == only("read_changed", 2)


@pytest.mark.unit
def test_read_committed_reads_are_checked_against_the_committed_log() -> None:
    history, final = clean()
    # read_committed was given a record that the final read_committed log filters out
    history.reads.append(Read("read_committed", T, 0, 2, "t000001-0", 2.0))
    assert counts(history, final) == {
        **only("read_changed"),
        "aborted_visible": 1,  # and it belongs to an aborted transaction
    }


@pytest.mark.unit
def test_high_watermark_going_down_for_one_reader() -> None:
    history, final = clean()
    history.high_watermarks.append(HighWatermark("read_uncommitted", E, 0, 2, 1.7))
    history.high_watermarks.append(HighWatermark("read_uncommitted", E, 0, 4, 1.8))
    assert counts(history, final) == only("hw_backwards")


@pytest.mark.unit
def test_each_group_member_has_its_own_high_watermark_series() -> None:
    history, final = clean()
    # after a rebalance member 2 fetches a partition member 1 had read further: no anomaly
    history.high_watermarks.append(HighWatermark("kafka-read_committed-1", E, 0, 9, 2.0))
    history.high_watermarks.append(HighWatermark("kafka-read_committed-2", E, 0, 7, 2.1))
    assert counts(history, final) == only("none", 0)
    history.high_watermarks.append(HighWatermark("kafka-read_committed-2", E, 0, 6, 2.2))
    assert counts(history, final) == only("hw_backwards")


@pytest.mark.unit
def test_an_offset_refused_as_out_of_range_is_the_hw_going_back() -> None:
    history, final = clean()
    history.out_of_range.append(OutOfRange("read_committed", E, 0, 3, 2, 1.9))
    assert counts(history, final) == only("hw_backwards")


@pytest.mark.unit
def test_aborted_transaction_visible_in_the_final_log() -> None:
    history, final = clean()
    final.committed[(T, 0)][2] = "t000001-0"
    assert counts(history, final) == only("aborted_visible")


@pytest.mark.unit
def test_committed_transaction_partly_visible() -> None:
    history, final = clean()
    del final.committed[(T, 0)][0]
    found = check(history, final)
    assert {k: len(v) for k, v in found.items()} == only("committed_missing")
    assert "t000000-0 not visible" in found["committed_missing"][0]


@pytest.mark.unit
def test_unknown_outcome_is_all_or_nothing() -> None:
    history, final = clean()
    final.uncommitted[(T, 1)][3] = "t000002-0"
    final.uncommitted[(T, 0)][5] = "t000002-1"
    final.committed[(T, 1)][3] = "t000002-0"
    final.committed[(T, 0)][5] = "t000002-1"
    assert counts(history, final) == only("none", 0), "all of it visible is fine"
    del final.committed[(T, 0)][5]
    assert counts(history, final) == only("committed_missing"), "half of it is not"


def transformer_run(
    transactions: list[tuple[str, list[tuple[int, int]]]], committed: dict[int, int]
) -> tuple[History, FinalState]:
    """clean(), plus a consume-transform-produce loop from E (its group started at offset 0)
    to T: each transaction's (outcome, [(source partition, source offset) of each input]),
    its outputs stored in T (visible unless aborted), and the group's final committed offset
    of each partition of E. E-1@1 holds an empty value."""
    history, final = clean()
    final.uncommitted[(E, 1)][1] = final.committed[(E, 1)][1] = ""
    history.transformer_starts = {(E, 0): 0, (E, 1): 0}
    final.transformer_committed = {(E, p): offset for p, offset in committed.items()}
    for txn, (outcome, inputs) in enumerate(transactions, start=100):
        records = tuple(
            (p, transformed_value(txn, i, p, offset)) for i, (p, offset) in enumerate(inputs)
        )
        history.transactions.append(Transaction(txn, T, records, outcome))  # type: ignore[arg-type]
        for p, value in records:
            at = max(final.uncommitted.setdefault((T, p), {}), default=-1) + 2  # and a marker
            final.uncommitted[(T, p)][at] = value
            if outcome != "aborted":
                final.committed.setdefault((T, p), {})[at] = value
    return history, final


@pytest.mark.unit
def test_the_transformers_inputs_are_each_transformed_once() -> None:
    run = [("committed", [(0, 0), (0, 1), (1, 0)]), ("aborted", [(0, 2)]), ("unknown", [(0, 2)])]
    # E-0@3 is past the committed offset: not transformed yet; E-1@1 is empty: skipped
    assert counts(*transformer_run(run, {0: 3, 1: 2})) == only("none", 0)


@pytest.mark.unit
def test_a_lost_and_a_duplicated_input_of_the_transformer() -> None:
    run = [("committed", [(0, 0), (1, 0)]), ("committed", [(0, 2), (0, 0)])]
    found = check(*transformer_run(run, {0: 3, 1: 1}))
    assert {k: len(v) for k, v in found.items()} == {
        **only("input_lost"),
        "input_duplicated": 1,
    }
    lost = found["input_lost"][0]
    assert "events-0@1 (p2-000000) is below the group's committed offset 3" in lost
    assert "events-0@0 (p1-000000) was transformed 2 times" in found["input_duplicated"][0]


@pytest.mark.unit
def test_a_transformer_output_past_the_committed_offset_or_of_no_input() -> None:
    run = [("committed", [(0, 0), (0, 1), (1, 0)]), ("committed", [(0, 2), (0, 5)])]
    # E-0@2 is output, but the group committed only up to it: it would be transformed again;
    # E-0@5 is not in the log at all
    found = check(*transformer_run(run, {0: 2, 1: 1}))
    assert {k: len(v) for k, v in found.items()} == {
        **only("input_duplicated", 2),
        "read_changed": 0,
    }
    assert "at or past the group's committed offset 2" in found["input_duplicated"][0]
    found = check(*transformer_run(run, {0: 6, 1: 1}))
    assert {k: len(v) for k, v in found.items()} == {**only("read_changed"), "input_lost": 1}
    assert "name events-0@5, where the final log holds None" in found["read_changed"][0]


@pytest.mark.unit
def test_replicas_with_different_batches_below_the_hw() -> None:
    history, final = clean()
    final.replicas[(E, 0)][2] = [StoredBatch(0, 0, 0, 11), StoredBatch(1, 2, 2, 22)]  # epoch
    found = check(history, final)
    assert {k: len(v) for k, v in found.items()} == only("replicas_differ")
    assert "events-0 (HW 4): replicas differ from batch 1" in found["replicas_differ"][0]


@pytest.mark.unit
def test_replica_short_or_unreadable_below_the_hw() -> None:
    history, final = clean()
    final.replicas[(E, 0)][1] = [StoredBatch(0, 0, 0, 11)]
    assert counts(history, final) == only("replicas_differ")
    final.replicas[(E, 0)][1] = "ReplicaRangeError: offset 1 is in no segment object"
    assert counts(history, final) == only("replicas_differ")


@pytest.mark.unit
def test_slow_or_stuck_sigterm() -> None:
    history, final = clean()
    final.sigterm_s.update({"broker-1": 25.0, "broker-2": None})
    assert counts(history, final) == only("slow_sigterm", 2)


@pytest.mark.unit
def test_not_recovered_and_logs_unread() -> None:
    history, final = clean()
    final.not_recovered.append("events-0: leader -1, ISR (1,) of (0, 1, 2)")
    final.logs_read = False
    final.uncommitted.clear()  # the acks cannot be judged against logs never read
    assert counts(history, final) == only("not_recovered")


@pytest.mark.unit
def test_a_wiped_broker_not_back_in_every_isr_is_not_recovered() -> None:
    history, final = clean()
    history.faults.append(Fault("wipe_restart", 2.0, 8.0, {"broker": 1, "in_every_isr_after_s": 1}))
    assert counts(history, final) == only("none", 0)
    history.faults.append(Fault("wipe_restart", 9.0, 70.0, {"broker": 2, "not_in_isr": "events-0"}))
    found = check(history, final)
    assert {k: len(v) for k, v in found.items()} == only("not_recovered")
    assert "broker 2 wiped at 9.0 was not back in the ISR of events-0" in found["not_recovered"][0]


@pytest.mark.unit
def test_a_broker_that_exits_or_stays_out_when_its_disk_fills() -> None:
    history, final = clean()
    killed: dict[str, object] = {
        "broker": 0,
        "killed_while_full": True,
        "exited": False,
        "in_every_isr_after_s": 2,
    }
    history.faults.append(Fault("disk_full", 1.0, 4.0, killed))
    assert counts(history, final) == only("none", 0), "a kill by the nemesis is no crash"
    history.faults.append(Fault("disk_full", 5.0, 9.0, {"broker": 1, "exited": True}))
    history.faults.append(Fault("disk_full", 9.0, 70.0, {"broker": 2, "not_in_isr": "events-1"}))
    found = check(history, final)
    assert {k: len(v) for k, v in found.items()} == {
        **only("crashed_on_enospc"),
        "not_recovered": 1,
    }
    assert "broker 1 exited while its disk was full" in found["crashed_on_enospc"][0]
    assert (
        "broker 2 out of disk space at 9.0 was not back in the ISR of events-1"
        in found["not_recovered"][0]
    )


@pytest.mark.unit
def test_a_batch_failing_its_crc_given_to_a_reader() -> None:
    history, final = clean()
    history.corrupt_reads.append(CorruptRead("read_committed", "events-1: crc mismatch", 3.0))
    assert counts(history, final) == only("corrupt_served")


@pytest.mark.unit
def test_a_tmpfs_disk_fills_up_and_is_freed(tmp_path: Path) -> None:
    disk = TmpfsDisk(tmp_path / "disk", size_mb=1).mount()
    try:
        assert disk.fill(leave_bytes=0) > 0
        with pytest.raises(OSError, match="No space left") as err:
            (disk.log_root / "object").write_bytes(b"x" * 10_000)
        assert err.value.errno == errno.ENOSPC
        disk.free()
        (disk.log_root / "object").write_bytes(b"x" * 10_000)
    finally:
        disk.unmount()
    assert str(tmp_path) not in Path("/proc/mounts").read_text()
    disk.unmount()  # twice is fine


@pytest.mark.unit
def test_retention_before_its_limit_by_the_true_clock() -> None:
    history, final = clean()
    final.retention[(E, 0)] = Retention(0, 300_000, 50.0)
    final.retention[(E, 1)] = Retention(40, 30_000, 50.0)  # older than its limit: fine
    assert counts(history, final) == only("none", 0)
    final.retention[(E, 2)] = Retention(142, 300_000, 50.0)
    found = check(history, final)
    assert {k: len(v) for k, v in found.items()} == only("retention_early")
    assert (
        "events-2: log start offset 142, though the partition is 50 s old"
        in (found["retention_early"][0])
    )


@pytest.mark.unit
def test_a_timestamp_lookup_past_the_record_it_names() -> None:
    history, final = clean()
    final.timestamp_lookups += [
        TimestampLookup(E, 0, 5, 1_000, 5),
        TimestampLookup(E, 0, 6, 1_000, 5),  # an earlier record has that timestamp too
    ]
    assert counts(history, final) == only("none", 0)
    final.timestamp_lookups += [TimestampLookup(E, 0, 7, 990, 9), TimestampLookup(E, 1, 0, 5, -1)]
    assert counts(history, final) == only("timestamp_lookup", 2)


@pytest.mark.unit
def test_a_fake_clock_steps_a_running_process(tmp_path: Path) -> None:
    clock = FakeClock(tmp_path / "faketime")
    script = (
        "import sys, time\n"
        "from tests.chaos.clocks import sleep_on_a_condition\n"
        "time.sleep = sleep_on_a_condition\n"  # as the launcher: libfaketime's sleep fails
        "for line in sys.stdin:\n"
        "    time.sleep(0.01)\n"
        "    print(round(time.time() - float(line)), flush=True)\n"
    )
    env = {**os.environ, **clock.env(), "PYTHONPATH": str(Path(__file__).parents[1])}
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=PIPE, stdout=PIPE, text=True, env=env
    ) as proc:
        stdin, stdout = proc.stdin, proc.stdout
        assert stdin is not None
        assert stdout is not None

        def offset() -> int:
            stdin.write(f"{time.time()}\n")
            stdin.flush()
            return int(stdout.readline())

        assert abs(offset()) <= 1
        clock.step_to(-600)
        wait_until(lambda: abs(offset() + 600) <= 1, timeout=10, message="the step reached it")
        clock.step_to(0)
        wait_until(lambda: abs(offset()) <= 1, timeout=10, message="the step back reached it")
        stdin.close()
    assert proc.returncode == 0
    clock.remove()
    assert not clock.path.exists()


@pytest.mark.unit
def test_a_network_lab_drops_one_way_heals_and_leaves_nothing_behind() -> None:
    lab = NetworkLab(f"rt{uuid.uuid4().hex[:4]}", ["a", "b"], 199)
    serve = "import socket\ns = socket.create_server(('', 7000))\nprint('up', flush=True)\n"
    # the proxy forwards whole frames: an empty one (length 0)
    serve += "while True:\n    c, _ = s.accept(); c.sendall(bytes(4)); c.close()\n"
    try:
        lab.create()
        server = subprocess.Popen(
            [*lab.exec_prefix("a"), sys.executable, "-c", serve], stdout=PIPE, text=True
        )
        try:
            assert server.stdout is not None
            assert server.stdout.readline() == "up\n"
            with TcpProxy(lab.ip("a"), 7000, record=False, listen_host=lab.bridge_ip) as proxy:
                lab.proxy_ports["a"].add(proxy.port)
                probe = (
                    "import socket\ntry:\n"
                    f"    print(socket.create_connection(('{lab.bridge_ip}', {proxy.port}), 1)"
                    ".recv(4).hex())\n"
                    "except OSError:\n    print('dropped')\n"
                )

                def from_b() -> str:
                    cmd = [*lab.exec_prefix("b"), sys.executable, "-c", probe]
                    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()

                assert from_b() == "00000000", "b reaches a through a's proxy"
                lab.drop("b", "a")
                assert from_b() == "dropped"
                with socket.create_connection((lab.bridge_ip, proxy.port), timeout=5) as c:
                    assert c.recv(4) == bytes(4), "one way, between nodes: the harness still does"
                lab.heal()
                assert from_b() == "00000000"
        finally:
            server.kill()
            server.wait()
            assert server.stdout is not None
            server.stdout.close()
    finally:
        lab.remove()
    lab.remove()  # twice is fine
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert lab.prefix not in namespaces
    links = subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert lab.bridge not in links
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert lab.table not in tables


@pytest.mark.unit
def test_longest_time_without_an_ack_per_fault_class() -> None:
    acks = [Ack("p1", f"p1-{i:06d}", E, 0, i, t) for i, t in enumerate([0.0, 1.0, 4.5, 5.0, 9.0])]
    acks.append(Ack("p1", "p1-000100", E, 1, 0, 0.5))  # partition 1: no ack after 0.5
    faults = [Fault("pause_long", 1.2, 3.0), Fault("net_cut", 4.8, 6.0)]
    # pause_long: 1.0 -> 4.5 on events-0 (3.5 s); events-1's silence ends at `end`, in net_cut's
    assert longest_without_ack(acks, faults, end=9.5) == {"pause_long": 3.5, "net_cut": 9.0}


# --- fault plumbing ---------------------------------------------------------------------------


@pytest.mark.unit
def test_storage_faults_from_the_control_file(monkeypatch: pytest.MonkeyPatch) -> None:
    inner = Storage.from_url(f"memory://chaos-{uuid.uuid4().hex}/root")
    storage = FaultyStorage(inner)
    apply_faults(storage, [{"kind": "tear", "op": "write", "fraction": 0.25}])
    assert storage.pending == UNTIL_CHANGED
    with pytest.raises(InjectedStorageError, match="torn"):
        storage.child("events/0").write("00000000000000000000.seg", b"12345678")
    assert inner.read("events/0/00000000000000000000.seg") == b"12", "a torn write leaves a prefix"
    apply_faults(storage, [{"kind": "stall", "op": "write", "seconds": 0.2}])
    stalls: list[tuple[float, bool]] = []  # (seconds waited, whether the write had landed)
    monkeypatch.setattr(
        faulty_fs, "time", SimpleNamespace(sleep=lambda s: stalls.append((s, inner.exists("x"))))
    )
    storage.write("x", b"slow")
    assert stalls == [(0.2, False)], "the write waits 0.2 s, then happens"
    assert inner.read("x") == b"slow"
    apply_faults(storage, [{"kind": "fail", "op": "write"}])
    with pytest.raises(InjectedStorageError):
        storage.write("x", b"new")
    apply_faults(storage, [])
    storage.write("x", b"new")
    assert storage.read("x") == b"new"
    with pytest.raises(ValueError, match="unknown storage fault kind"):
        apply_faults(storage, [{"kind": "melt"}])


@pytest.mark.unit
def test_blocked_proxy_closes_new_connections_until_unblocked() -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        TcpProxy("127.0.0.1", server.getsockname()[1], record=False) as proxy,
    ):
        proxy.block()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
            assert client.recv(1) == b"", "a blocked proxy closes the connection at once"
        proxy.unblock()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as client:
            accepted, _ = server.accept()
            with accepted:
                client.sendall(b"\x00\x00\x00\x00")
                assert accepted.recv(4) == b"\x00\x00\x00\x00"


@pytest.mark.unit
def test_plans_are_seeded_and_cycle_through_every_class() -> None:
    assert plan(5, FAULT_CLASSES, 30) == plan(5, FAULT_CLASSES, 30)
    assert plan(5, FAULT_CLASSES, 30) != plan(6, FAULT_CLASSES, 30)
    first_cycle = plan(5, FAULT_CLASSES, len(FAULT_CLASSES))
    assert sorted(f.fault_class for f in first_cycle) == sorted(FAULT_CLASSES)
    with pytest.raises(ValueError, match="unknown fault classes"):
        plan(5, ["meteor"], 1)


# --- real schedules ---------------------------------------------------------------------------

SCHEDULES = [
    # the brokers over the broker WAL (log.wal.enable, the default)
    pytest.param(101, ["crash_restart_while_paused"], True, id="crash_restart_while_paused"),
    pytest.param(
        102,
        ["storage_fail", "storage_stall", "storage_tear", "net_cut", "net_stall", "pause_short"],
        True,
        id="storage_and_network",
    ),
    pytest.param(
        103, ["controller_kill", "coordinator_kill"], True, id="controller_and_coordinator"
    ),
    # a broker loses its whole store (a new disk) and rebuilds its replicas from its peers
    pytest.param(105, ["wipe_restart"], True, id="wipe_restart"),
    # each broker on a small tmpfs that fills up mid-flush (ENOSPC), then has space again
    pytest.param(106, ["disk_full"], True, id="disk_full"),
    # the wall clock of a leader, the coordinator and the active controller steps by minutes
    pytest.param(108, ["clock_jump"], True, id="clock_jump"),
    # packets dropped between nodes in network namespaces: a broker cut off, one way, two
    # brokers cut from each other; the active controller cut off from everyone
    pytest.param(109, ["net_partition", "controller_isolated"], True, id="network_partitions"),
    # the per-partition layout (log.wal.enable=false), which stays available: crashes
    # mid-flush and failing, stalling and tearing writes of the segment objects
    pytest.param(
        104,
        ["crash_restart_while_paused", "kill_restart_now", "storage_stall", "storage_tear"],
        False,
        id="segments_crashes_and_storage",
    ),
]


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_a_broker_restarts_behind_its_proxy_when_its_old_port_was_taken(tmp_path: Path) -> None:
    """Another test's process may take a killed broker's port before the restart (it did in
    CI: EADDRINUSE). The broker takes a fresh port and the proxy follows it."""
    cluster = ChaosCluster(tmp_path, brokers=1)
    try:
        cluster.start()
        broker = cluster.brokers[0]
        old_port = broker.port
        broker.kill()
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", old_port))
            squatter.listen()
            broker.start()
            assert broker.port != old_port
            with Admin(bootstrap_servers=cluster.bootstrap, default_api_timeout_ms=30000) as admin:
                cluster.wait_registered(admin, time.monotonic() + 30)
                assert [b.node_id for b in admin.describe_cluster().brokers] == [0]
    finally:
        cluster.close()


@pytest.mark.cluster
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("seed", "classes", "wal"), SCHEDULES)
def test_seeded_schedule_finds_no_anomaly(
    seed: int, classes: list[str], wal: bool, tmp_path: Path
) -> None:
    result = run_schedule(seed, classes, 12.0, tmp_path, wal=wal)
    assert result["faults"], "the nemesis injected nothing"
    assert result["acked"] > 0
    assert result["transactions"]["committed"] > 0
    assert result["ok"], json.dumps(result, indent=1)


@pytest.mark.cluster
@pytest.mark.timeout(240)
def test_a_seeded_schedule_of_kafka_clients_finds_no_anomaly(tmp_path: Path) -> None:
    """confluent-kafka's idempotent producers, consume-transform-produce transactions and
    consumer groups, through the Kafka listeners, under a broker's crash, a coordinator's,
    and a cut network."""
    classes = ["kill_restart_now", "coordinator_kill", "net_cut"]
    result = run_schedule(112, classes, 8.0, tmp_path, workload="kafka")
    assert result["faults"], "the nemesis injected nothing"
    assert result["acked"] > 0
    assert result["transactions"]["committed"] > 0
    assert result["reads"] > 0
    assert result["ok"], json.dumps(result, indent=1)
