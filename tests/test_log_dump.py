"""`replog log dump`, as kafka-dump-log.sh: batches of a segment object or a partition, and of
WAL objects or a broker's whole `_replog/wal`."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from logstore.batch import Record, build
from logstore.buffered_source import BufferedSource
from logstore.log import Log
from logstore.segment import object_name as segment_name
from logstore.storage import Storage
from logstore.wal import WalWriter
from logstore.wal_format import ChunkInput, encode_object, object_name, scan_object
from logstore.wal_index import WAL_PREFIX
from replication.tools.cli import app
from tests.test_wal_log import Node, fill

pytestmark = pytest.mark.unit


@pytest.fixture
def partition_dir(tmp_path: Path) -> Path:
    path = tmp_path / "events" / "0"
    log = Log.open(Storage.from_url(str(path)))
    log.append(build([Record(b"k1", b"hello", 1000), Record(None, b"world", 1001)]), leader_epoch=3)
    log.flush()
    log.append(
        build([Record(b"k2", b"again", 2000)], producer_id=7, producer_epoch=1, base_sequence=0),
        leader_epoch=4,
    )
    log.close()
    return path


def test_dump_partition_directory(partition_dir: Path) -> None:
    result = CliRunner().invoke(app, ["log", "dump", str(partition_dir)])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("baseOffset")]
    assert len(lines) == 2
    assert "baseOffset: 0 lastOffset: 1 count: 2" in lines[0]
    assert "leaderEpoch: 3" in lines[0]
    assert "isValid: true" in lines[0]
    assert "baseOffset: 2 lastOffset: 2 count: 1" in lines[1]
    assert "producerId: 7 producerEpoch: 1 baseSequence: 0" in lines[1]


def test_dump_one_object_with_records(partition_dir: Path) -> None:
    segment = partition_dir / segment_name(0)
    result = CliRunner().invoke(app, ["log", "dump", str(segment), "--records"])
    assert result.exit_code == 0, result.output
    assert "| offset: 0 CreateTime: 1000 key: k1 value: hello" in result.output
    assert "| offset: 1 CreateTime: 1001 key: null value: world" in result.output


def test_dump_reports_a_corrupt_batch(partition_dir: Path) -> None:
    segment = partition_dir / segment_name(0)
    data = bytearray(segment.read_bytes())
    data[70] ^= 0xFF
    segment.write_bytes(bytes(data))
    result = CliRunner().invoke(app, ["log", "dump", str(segment)])
    assert result.exit_code == 2
    assert "isValid: false" in result.output


def test_dump_reports_a_torn_tail(partition_dir: Path) -> None:
    segment = partition_dir / segment_name(0)
    segment.write_bytes(segment.read_bytes()[:-5])
    result = CliRunner().invoke(app, ["log", "dump", str(segment)])
    assert result.exit_code == 2
    assert "corrupt at byte 0" in result.output


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("missing", "no such path"),
        ("missing.seg", "no such segment object"),
        ("events/0/checkpoint.json", "is not a segment object"),
        ("events/0/notes.txt", "is not a segment object"),
        ("empty-dir", "holds no segment objects"),
    ],
)
def test_dump_of_what_is_not_a_segment_fails_and_says_what_to_give(
    tmp_path: Path, target: str, says: str
) -> None:
    (tmp_path / "events" / "0").mkdir(parents=True)
    (tmp_path / "events" / "0" / "checkpoint.json").write_text('{"format_version": 1}')
    (tmp_path / "events" / "0" / "notes.txt").write_text("hello")
    (tmp_path / "empty-dir" / "sub").mkdir(parents=True)
    (tmp_path / "empty-dir" / "sub" / "x.json").write_text("{}")
    result = subprocess.run(
        [sys.executable, "-m", "replication.tools.cli", "log", "dump", str(tmp_path / target)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""
    assert says in result.stderr
    assert "give a segment object (*.seg) or a partition directory" in result.stderr


# --- the WAL layout (docs/storage.md §2.2) ------------------------------------------------------

TOPIC_ID = uuid.UUID(int=7).hex


@pytest.fixture
def broker_root(tmp_path: Path) -> Path:
    """A broker root whose WAL holds a fence object (seq 1), then two flushes of 3 partitions
    of "events" (seqs 2 and 3), written by a real WalWriter."""
    return write_broker_root(tmp_path / "broker-0")


def write_broker_root(root: Path, *, journal: bool = False) -> Path:
    storage = Storage.from_url(str(root))
    if journal:  # as a broker on local files writes them (log.wal.journal.enable)
        storage.journal(f"{WAL_PREFIX}/L0")
    sources = [BufferedSource("events", TOPIC_ID, p) for p in range(3)]
    for round_ in range(2):
        # not started until every source has its batch: one object per round
        writer = WalWriter(
            storage,
            broker_id=4,
            broker_epoch=9,
            next_seq=1 + 2 * round_,
            fence=round_ == 0,
            autostart=False,
        )
        for source in sources:
            source.writer = writer
            end = source.log_end_offset
            records = [Record(b"k", f"{source.partition}:{end}".encode(), 1000 + end)]
            source.append(build(records, base_offset=end, partition_leader_epoch=5))
        writer.start()
        writer.close()
    storage.close()
    return root


def wal_path(root: Path, seq: int, *, epoch: int = 9) -> Path:
    return root / WAL_PREFIX / object_name(seq, epoch)


def test_dump_wal_directory_every_object_in_seq_order(broker_root: Path) -> None:
    result = CliRunner().invoke(app, ["log", "dump", str(broker_root / WAL_PREFIX)])
    assert result.exit_code == 0, result.output
    dumped = re.findall(r"^Dumping .*/(L0/\S+)$", result.output, re.M)
    assert dumped == [object_name(seq, 9) for seq in (1, 2, 3)]
    assert "format: 1 level: 0 brokerId: 4 brokerEpoch: 9 seq: 2" in result.output
    assert "footer: valid chunks: 0" in result.output  # the fence object
    assert result.output.count("footer: valid chunks: 3") == 2
    chunks = re.findall(r"^Chunk (\S+) \[(\d+), (\d+)\) .* seq: (\d+) ", result.output, re.M)
    assert chunks == [(f"events-{p}", "0", "1", "2") for p in range(3)] + [
        (f"events-{p}", "1", "2", "3") for p in range(3)
    ]
    batches = [line for line in result.output.splitlines() if line.startswith("baseOffset")]
    assert len(batches) == 6
    assert all("leaderEpoch: 5" in b and "isValid: true" in b for b in batches)
    # a chunk's batches carry the object's byte positions, right after the 64-byte chunk header
    first = re.search(r"^Chunk events-0 .* position: (\d+) size: (\d+)", result.output, re.M)
    assert first is not None
    assert f"baseOffset: 0 lastOffset: 0 count: 1 position: {first[1]} size: {first[2]}" in (
        result.output
    )


def test_dump_of_journaled_wal_objects_is_the_dump_of_the_same_objects_as_files(
    tmp_path: Path,
) -> None:
    """A broker on local files journals its L0 objects (no file each); ``replog log dump``
    of its WAL directory, or of one object's path, prints what it prints for files."""
    files = write_broker_root(tmp_path / "files")
    journaled = write_broker_root(tmp_path / "journaled", journal=True)
    assert not (journaled / WAL_PREFIX / "L0").exists()

    def dump_of(root: Path, *args: str) -> str:
        result = CliRunner().invoke(app, ["log", "dump", *args])
        assert result.exit_code == 0, result.output
        return re.sub(
            r"createdMs: \d+", "createdMs: <ms>", result.output.replace(str(root), "<root>")
        )

    assert dump_of(journaled, str(journaled / WAL_PREFIX)) == dump_of(
        files, str(files / WAL_PREFIX)
    )
    one = ("--records",)
    assert dump_of(journaled, str(wal_path(journaled, 3)), *one) == dump_of(
        files, str(wal_path(files, 3)), *one
    )


def test_dump_one_wal_object_with_records(broker_root: Path) -> None:
    result = CliRunner().invoke(app, ["log", "dump", str(wal_path(broker_root, 3)), "--records"])
    assert result.exit_code == 0, result.output
    assert result.output.count("Dumping ") == 1
    for p in range(3):
        assert f"| offset: 1 CreateTime: 1001 key: k value: {p}:1" in result.output


def test_dump_wal_object_with_a_flipped_byte(broker_root: Path) -> None:
    """The footer still checks (the damage is inside a batch): that batch is invalid, the
    others are not, and the exit code says so."""
    path = wal_path(broker_root, 2)
    data = bytearray(path.read_bytes())
    chunk = scan_object(bytes(data)).chunks[1]
    data[chunk.position + 80] ^= 0x01
    path.write_bytes(bytes(data))
    result = CliRunner().invoke(app, ["log", "dump", str(path)])
    assert result.exit_code == 2, result.output
    assert "footer: valid chunks: 3" in result.output
    batches = [line for line in result.output.splitlines() if line.startswith("baseOffset")]
    assert ["isValid: false" in b for b in batches] == [False, True, False]


def test_dump_torn_wal_object_reports_where_validity_ends(broker_root: Path) -> None:
    """A torn object (its footer gone) is scanned as recovery scans it: the whole valid chunks
    are printed, then the byte where the valid prefix ends; exit code 2."""
    path = wal_path(broker_root, 2)
    whole = path.read_bytes()
    full = scan_object(whole)
    cut = full.chunks[1].position + 100  # inside partition 1's only batch
    path.write_bytes(whole[:cut])
    torn = scan_object(whole[:cut])
    assert torn.valid_length == full.chunks[1].header_position
    result = CliRunner().invoke(app, ["log", "dump", str(path)])
    assert result.exit_code == 2, result.output
    assert "footer: invalid" in result.output
    assert "scanning the object" in result.output
    chunks = re.findall(r"^Chunk (.+?) \[", result.output, re.M)
    assert chunks == [f"<topic id {TOPIC_ID}>-0"]  # a scan knows the topic id, not the name
    assert f"valid up to byte {torn.valid_length} of {cut} (1 whole chunk(s) recoverable)" in (
        result.output
    )
    assert "partition 1" in result.output


def test_dump_wal_directory_exit_code_reflects_one_bad_object(broker_root: Path) -> None:
    path = wal_path(broker_root, 3)
    path.write_bytes(path.read_bytes()[:-3])  # the trailer torn
    result = CliRunner().invoke(app, ["log", "dump", str(broker_root / WAL_PREFIX)])
    assert result.exit_code == 2, result.output
    assert result.output.count("footer: valid") == 2
    size = len(path.read_bytes())
    recoverable = rf"valid up to byte \d+ of {size} \(3 whole chunk\(s\) recoverable\)"
    assert re.search(recoverable, result.output)


def test_dump_packed_object_shows_seq_ranges(tmp_path: Path) -> None:
    data, _ = encode_object(
        [
            ChunkInput(
                "events",
                TOPIC_ID,
                0,
                [build([Record(None, b"x", 1)], base_offset=10)],
                first_seq=3,
                last_seq=8,
            )
        ],
        seq=8,
        min_seq=3,
        level=1,
        broker_id=4,
        broker_epoch=9,
    )
    path = tmp_path / WAL_PREFIX / object_name(8, 9, level=1, min_seq=3)
    path.parent.mkdir(parents=True)
    path.write_bytes(bytes(data))
    result = CliRunner().invoke(app, ["log", "dump", str(path)])
    assert result.exit_code == 0, result.output
    assert "level: 1" in result.output
    assert "Chunk events-0 [10, 11) position: 96" in result.output
    assert "seq: 3..8 " in result.output


def test_dump_wal_object_whose_name_and_header_disagree(broker_root: Path) -> None:
    path = wal_path(broker_root, 2)
    renamed = wal_path(broker_root, 7)
    path.rename(renamed)
    result = CliRunner().invoke(app, ["log", "dump", str(renamed)])
    assert result.exit_code == 2, result.output
    assert "name says level 0, seq 7" in result.output


def test_dump_of_a_missing_wal_object_says_what_to_give(broker_root: Path) -> None:
    missing = str(wal_path(broker_root, 99))
    result = subprocess.run(
        [sys.executable, "-m", "replication.tools.cli", "log", "dump", missing],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "no such WAL object" in result.stderr
    assert "a WAL object (*.wal) or a broker's _replog/wal directory" in result.stderr


@pytest.mark.unit
def test_dump_partition_directory_over_the_wal(tmp_path: Path) -> None:
    """A partition written through the broker WAL: its directory holds only a checkpoint, the
    dump walks the partition's chunks in the root's WAL objects, as recovery does, and a
    packed (compacted) chunk reads the same."""
    root = Storage.from_url(str(tmp_path / "broker-0"))
    key = ("orders", 0)
    node = Node(root, [key])
    node.start()
    written = fill(node.logs[key], key, 3)
    node.flush()
    written += fill(node.logs[key], key, 2, epoch=1)
    node.flush()
    node.stop()
    partition = tmp_path / "broker-0" / "orders" / "0"
    assert not list(partition.glob("*.seg"))
    result = CliRunner().invoke(app, ["log", "dump", str(partition), "--records"])
    assert result.exit_code == 0, result.output
    assert "over the broker WAL" in result.output
    assert result.output.count("Chunk orders-0 [") == 2
    values = re.findall(r"value: (\S+)", result.output)
    assert values == [v.decode() for _, v in written]
    node.start()
    node.compactor().compact()
    node.stop()
    compacted = CliRunner().invoke(app, ["log", "dump", str(partition), "--records"])
    assert compacted.exit_code == 0, compacted.output
    assert compacted.output.count("Chunk orders-0 [") == 1
    assert re.findall(r"value: (\S+)", compacted.output) == values
