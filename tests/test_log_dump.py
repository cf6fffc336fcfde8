"""`replog log dump`, as kafka-dump-log.sh: batches of a segment object or a partition."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from logstore.batch import Record, build
from logstore.log import Log
from logstore.segment import object_name
from logstore.storage import Storage
from replication.tools.cli import app

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
    segment = partition_dir / object_name(0)
    result = CliRunner().invoke(app, ["log", "dump", str(segment), "--records"])
    assert result.exit_code == 0, result.output
    assert "| offset: 0 CreateTime: 1000 key: k1 value: hello" in result.output
    assert "| offset: 1 CreateTime: 1001 key: null value: world" in result.output


def test_dump_reports_a_corrupt_batch(partition_dir: Path) -> None:
    segment = partition_dir / object_name(0)
    data = bytearray(segment.read_bytes())
    data[70] ^= 0xFF
    segment.write_bytes(bytes(data))
    result = CliRunner().invoke(app, ["log", "dump", str(segment)])
    assert result.exit_code == 2
    assert "isValid: false" in result.output


def test_dump_reports_a_torn_tail(partition_dir: Path) -> None:
    segment = partition_dir / object_name(0)
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
