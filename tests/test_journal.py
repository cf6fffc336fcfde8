"""Journaled local objects (logstore.journal): LocalStorage's small WAL writes into pre-written
journal files, seen by every reader as plain objects.

The Storage contract runs over a root whose every small object is journaled (files roll over
often: 64 KiB each); the tests below add what only the journal has: no new file per write,
other processes' views, deletes that stay deleted, files deleted oldest first, torn frames
never served, and a writer killed mid-append that loses nothing it acknowledged.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from logstore.errors import CorruptRecordError, ObjectNotFoundError, StorageError
from logstore.journal import FILE_HEADER_SIZE, JOURNAL_DIR, Journal, JournalEntry
from logstore.storage import LocalStorage, Storage
from tests.helpers import wait_until
from tests.test_storage import StorageTests, run_threads

pytestmark = pytest.mark.unit

SMALL = 64 << 10
WAL = "_replog/wal/L0"


def journaled(root: Path, *, prefix: str = "", capacity: int = SMALL) -> LocalStorage:
    storage = Storage.from_url(root.as_uri())
    assert isinstance(storage, LocalStorage)
    storage.journal(prefix, max_object_bytes=4096, capacity=capacity)
    return storage


def journal_files(root: Path) -> list[str]:
    directory = root / JOURNAL_DIR
    return sorted(os.listdir(directory)) if directory.exists() else []


def name(i: int) -> str:
    return f"{WAL}/{i:020d}-0000000001.wal"


class TestJournaledLocalStorage(StorageTests):
    """The whole Storage contract, every object up to 4 KiB journaled."""

    @pytest.fixture
    def storage(self, tmp_path: Path) -> Iterator[Storage]:
        storage = journaled(tmp_path / "root")
        try:
            yield storage
        finally:
            storage.close()


def test_small_writes_make_no_new_files(tmp_path: Path) -> None:
    """The point of it: a journaled write is a frame in an existing file, not a new file."""
    storage = journaled(tmp_path, prefix=WAL, capacity=1 << 20)
    storage.write(name(0), b"x" * 1000)
    wait_until(lambda: len(journal_files(tmp_path)) == 2, message="the spare file made")
    before = {p for p in tmp_path.rglob("*") if p.is_file()}
    for i in range(1, 200):
        storage.write(name(i), os.urandom(1000))
    after = {p for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before  # the active file and its prepared successor, nothing else
    assert not (tmp_path / WAL).exists()
    assert [o.path for o in storage.list("_replog")] == [name(i) for i in range(200)]
    storage.close()


def test_big_objects_and_other_prefixes_stay_files(tmp_path: Path) -> None:
    storage = journaled(tmp_path, prefix=WAL)
    storage.write(name(1), b"b" * 5000)  # over max_object_bytes
    storage.write("_replog/checkpoint", b"c")
    assert (tmp_path / name(1)).read_bytes() == b"b" * 5000
    assert (tmp_path / "_replog/checkpoint").read_bytes() == b"c"
    storage.write(name(1), b"small")  # a journaled write of the same name now wins
    assert storage.read(name(1)) == b"small"
    storage.write(name(1), b"b" * 5000)  # and a file takes it back
    assert storage.read(name(1)) == b"b" * 5000
    assert storage.size(name(1)) == 5000
    storage.close()


def test_a_flush_sized_object_is_journaled_by_default(tmp_path: Path) -> None:
    """By default objects up to 4 MiB are frames (a WAL object at hundreds of thousands of
    records/s is around a megabyte: as a file of its own its metadata is what a busy disk
    makes slow), bigger ones files; a reader in another process sees both."""
    storage = Storage.from_url(tmp_path.as_uri())
    assert isinstance(storage, LocalStorage)
    storage.journal(WAL)
    flush, big = os.urandom(800_000), os.urandom((4 << 20) + 1)
    storage.write(name(1), flush)
    storage.write(name(2), big)
    assert not (tmp_path / name(1)).exists()
    assert (tmp_path / name(2)).read_bytes() == big
    reader = Storage.from_url(tmp_path.as_uri())
    assert reader.read(name(1)) == flush
    assert reader.read_range(name(1), 799_990, 800_000) == flush[-10:]
    assert [(o.path, o.size) for o in reader.list(WAL)] == [
        (name(1), len(flush)),
        (name(2), len(big)),
    ]
    storage.close()


@pytest.mark.parametrize("capacity", [64 << 10, (3 << 20) + 1000])
def test_a_new_file_is_its_header_then_zeros_to_its_capacity(tmp_path: Path, capacity: int) -> None:
    """Files are pre-written whole before a frame goes in (written past the page cache where
    the file system allows: an aligned capacity all of it, an unaligned one but its tail),
    and frames written over the zeros read back, from this process and another."""
    journal = Journal(str(tmp_path), capacity=capacity, writer=True)
    journal.open_file()
    (first, *_) = journal_files(tmp_path)
    data = (tmp_path / JOURNAL_DIR / first).read_bytes()
    assert len(data) == capacity
    assert data[:4] == b"RPLJ"
    assert data[FILE_HEADER_SIZE:] == bytes(capacity - FILE_HEADER_SIZE)
    payloads = [os.urandom(n) for n in (1, 5000, 20_000)]
    for i, payload in enumerate(payloads):
        journal.append(name(i), payload)
    reader = Journal(str(tmp_path))
    reader.refresh()
    for i, payload in enumerate(payloads):
        for j in (journal, reader):
            entry = j.lookup(name(i))
            assert entry is not None
            assert j.read(entry) == payload
    journal.close()


def resident_pages(path: Path) -> list[bool]:
    """Which of the file's pages are in the page cache (mincore(2) over a mapping of it,
    which faults nothing in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    libc.mmap.argtypes += [ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    with open(path, "rb") as f:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    try:
        vector = ctypes.create_string_buffer(pages)
        assert libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
        return [bool(b & 1) for b in vector.raw]
    finally:
        libc.munmap(address, size)


@pytest.mark.skipif(sys.platform != "linux", reason="mincore and POSIX_FADV_DONTNEED: Linux")
def test_the_journal_leaves_no_frame_in_the_page_cache(tmp_path: Path) -> None:
    """A frame's pages are dropped once it is synced, walked or read (the journal is read
    about once, by compaction): only a frame's last, partial page stays, for the next one."""
    probe = tmp_path / "probe"
    probe.write_bytes(bytes(1 << 20))
    with open(probe, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if any(resident_pages(probe)):
        pytest.skip(
            f"the file system of {tmp_path} keeps its pages against POSIX_FADV_DONTNEED "
            "(tmpfs does: its pages are the file); run with --basetemp on a disk file system"
        )
    journal = Journal(str(tmp_path), capacity=4 << 20, writer=True)
    journal.open_file()
    payload = os.urandom(1 << 20)
    journal.append(name(1), payload)
    entry = journal.lookup(name(1))
    assert entry is not None
    path = tmp_path / JOURNAL_DIR / entry.file
    first = -(-entry.position // mmap.PAGESIZE)  # the first page wholly the frame's
    last = (entry.position + entry.size) // mmap.PAGESIZE
    assert not any(resident_pages(path)[first:last]), "the synced frame is still cached"
    assert resident_pages(path)[last], "the frame's last, partial page was dropped"
    reader = Journal(str(tmp_path))
    reader.refresh()  # walks the frame, reading it whole to check its CRC
    assert not any(resident_pages(path)[first:last]), "the walked frame stayed cached"
    assert reader.read(entry) == payload
    assert not any(resident_pages(path)[first:last]), "the frame read stayed cached"
    assert sum(resident_pages(path)) <= 4, "the walk or the read left other pages cached"
    journal.close()


def test_another_process_sees_writes_and_deletes_as_they_happen(tmp_path: Path) -> None:
    """A reader (a Spark executor, replog log dump) opens the root with no journal of its
    own: it finds objects journaled before and after its first look, and deletes."""
    writer = journaled(tmp_path, prefix=WAL, capacity=8192)
    writer.write(name(1), b"one")
    reader = Storage.from_url(tmp_path.as_uri())
    assert reader.read(name(1)) == b"one"
    for i in range(2, 40):  # over several files
        writer.write(name(i), b"%d" % i * 50)
    assert reader.read_range(name(39), 2, 6) == b"3939"
    assert reader.exists(name(20))
    assert reader.size(name(20)) == 100
    assert len(reader.list(WAL)) == 39
    # exists() and size() of a name the reader has seen see its delete at once (an object
    # store's HEAD does): a reader polling for a delete must not wait forever
    writer.delete(name(20))
    assert not reader.exists(name(20))
    with pytest.raises(ObjectNotFoundError):
        reader.size(name(20))
    writer.delete(name(1))
    writer.delete_many([name(2), name(3)])
    # a read or a list learns of deletes at its next walk (a list, or a name it does not know)
    assert [o.path for o in reader.list(WAL)][:1] == [name(4)]
    assert not reader.exists(name(1))
    with pytest.raises(ObjectNotFoundError):
        reader.read(name(2))
    assert JOURNAL_DIR not in {o.path.split("/")[0] for o in reader.list("")}
    writer.close()


def test_deletes_stay_deleted_and_files_go_oldest_first(tmp_path: Path) -> None:
    writer = journaled(tmp_path, prefix=WAL, capacity=8192)
    for i in range(60):
        writer.write(name(i), os.urandom(500))
    files = journal_files(tmp_path)
    assert len(files) >= 4
    # deleting a newer file's objects first keeps it: an older file still holds live objects
    for i in range(30, 60):
        writer.delete(name(i))
    assert journal_files(tmp_path)[0] == files[0]
    for i in range(30):
        writer.delete(name(i))
    # every written file is gone but the one being written (and its prepared successor)
    assert len(journal_files(tmp_path)) <= 2
    writer.close()
    # a fresh reader (a restart) finds nothing: the deletes were recorded
    assert Storage.from_url(tmp_path.as_uri()).list(WAL) == []


def test_a_restarted_writer_deletes_dead_files_and_keeps_live_ones(tmp_path: Path) -> None:
    first = journaled(tmp_path, prefix=WAL, capacity=8192)
    for i in range(30):
        first.write(name(i), os.urandom(500))
    for i in range(10):
        first.delete(name(i))
    first.close()
    second = journaled(tmp_path, prefix=WAL, capacity=8192)
    assert [o.path for o in second.list(WAL)] == [name(i) for i in range(10, 30)]
    second.write(name(30), b"new")
    for i in range(10, 30):
        second.delete(name(i))
    assert [o.path for o in second.list(WAL)] == [name(30)]
    second.close()
    assert len(journal_files(tmp_path)) <= 2


def write_and_find(tmp_path: Path, values: list[bytes], index: int) -> tuple[str, JournalEntry]:
    """Journal ``values`` as objects 0, 1, ... into one journal file; its name, and where
    object ``index`` is in it (as the writer's own walk finds it)."""
    writer = journaled(tmp_path, prefix=WAL, capacity=1 << 20)
    for i, value in enumerate(values):
        writer.write(name(i), value)
    writer.close()
    (active,) = journal_files(tmp_path)
    journal = Journal(str(tmp_path), writer=True)
    journal.refresh()
    entry = journal.lookup(name(index))
    assert entry is not None
    return active, entry


def flip_byte(path: Path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0x40]))


def test_a_damaged_frame_ends_the_walk_there(tmp_path: Path) -> None:
    """A bit flipped inside the fourth of five objects: the writer's walk (a restart's
    recovery) ends before it; another process's walk, which reads headers only, lists it
    until its first read, which refuses it and ends that walk there too."""
    active, third = write_and_find(tmp_path, [b"%d" % i * 100 for i in range(5)], 3)
    flip_byte(tmp_path / JOURNAL_DIR / active, third.position + 10)
    restarted = journaled(tmp_path, prefix=WAL, capacity=1 << 20)
    assert [o.path for o in restarted.list(WAL)] == [name(i) for i in range(3)]
    restarted.close()
    reader = Storage.from_url(tmp_path.as_uri())
    assert reader.read(name(2)) == b"2" * 100
    assert reader.read(name(4)) == b"4" * 100  # whole: its own CRC checks
    with pytest.raises(CorruptRecordError, match=f"{active}: the journal frame at byte"):
        reader.read_range(name(3), 0, 10)
    assert [o.path for o in reader.list(WAL)] == [name(i) for i in range(3)]
    with pytest.raises(ObjectNotFoundError):
        reader.read(name(4))
    # and so for a reader opened afterwards in this process (the same walk, shared)
    assert [o.path for o in Storage.from_url(tmp_path.as_uri()).list(WAL)] == [
        name(i) for i in range(3)
    ]


def test_a_torn_last_frame_is_not_served(tmp_path: Path) -> None:
    """The last frame of a file is never taken on its header alone: a crash that tore it (its
    header down, its data not) leaves it out of every walk."""
    active, last = write_and_find(tmp_path, [b"%d" % i * 3000 for i in range(3)], 2)
    with open(tmp_path / JOURNAL_DIR / active, "r+b") as f:  # its last pages never written
        f.seek(last.position + 1000)
        f.write(bytes(2000))
    reader = Storage.from_url(tmp_path.as_uri())
    assert [o.path for o in reader.list(WAL)] == [name(0), name(1)]
    assert reader.read(name(1)) == b"1" * 3000
    with pytest.raises(ObjectNotFoundError):
        reader.read(name(2))


def test_readers_in_one_process_share_one_walk(tmp_path: Path) -> None:
    """Every storage opened on a root in a process (a Spark task each) shares one reader
    journal, whose walks go on from where the last one stopped: a storage opened after more
    writes (below the root, too) sees them, and so does the one opened first."""
    writer = journaled(tmp_path, prefix=WAL, capacity=8192)
    for i in range(20):
        writer.write(name(i), b"%d" % i * 100)
    first = Storage.from_url(tmp_path.as_uri())
    assert len(first.list(WAL)) == 20
    for i in range(20, 40):  # over more files
        writer.write(name(i), b"%d" % i * 100)
    second = Storage.from_url((tmp_path / "_replog").as_uri())  # below the root, too
    assert second.read(f"wal/L0/{name(39).rsplit('/', 1)[1]}") == b"39" * 100
    assert isinstance(first, LocalStorage)
    assert isinstance(second, LocalStorage)
    views = [s._journal_view(refresh=False) for s in (first, second, writer)]
    assert views[0] is not None
    assert views[1] is not None
    assert views[2] is not None
    assert views[0].journal is views[1].journal
    assert len(first.list(WAL)) == 40
    # the writer's own storage keeps its own (writing) journal
    assert views[2].journal is not views[0].journal
    writer.close()


def test_foreign_bytes_are_not_frames(tmp_path: Path) -> None:
    """A copy of one file's frames into another file (another generation) is not read."""
    writer = journaled(tmp_path, prefix=WAL, capacity=1 << 20)
    writer.write(name(1), b"one")
    writer.close()
    (first,) = journal_files(tmp_path)
    second = journaled(tmp_path, prefix=WAL, capacity=1 << 20)
    second.write(name(2), b"two")
    second.close()
    files = journal_files(tmp_path)
    other = next(f for f in files if f != first)
    src = (tmp_path / JOURNAL_DIR / first).read_bytes()
    with open(tmp_path / JOURNAL_DIR / other, "r+b") as f:
        f.seek(FILE_HEADER_SIZE + 200)
        f.write(src[FILE_HEADER_SIZE : FILE_HEADER_SIZE + 200])
    reader = Storage.from_url(tmp_path.as_uri())
    assert [o.path for o in reader.list(WAL)] == [name(1), name(2)]


WRITER = textwrap.dedent(
    """
    import sys
    from logstore.storage import Storage
    storage = Storage.from_url(sys.argv[1])
    storage.journal("_replog/wal/L0", max_object_bytes=8192, capacity=32768)
    i = 0
    while True:
        path = f"_replog/wal/L0/{i:020d}-0000000001.wal"
        storage.write(path, (b"%020d" % i) * (1 + i % 40))
        if i % 7 == 3:
            storage.delete(f"_replog/wal/L0/{i - 3:020d}-0000000001.wal")
            print("DELETED", i - 3, flush=True)
        print("ACKED", i, flush=True)
        i += 1
    """
)


def test_a_writer_killed_mid_append_loses_nothing_it_acknowledged(tmp_path: Path) -> None:
    """SIGKILL while appending (files rolling every few dozen frames): every write that
    returned reads back whole after, every recorded delete stays done, and nothing else is
    there but the write (or delete) the kill cut short."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, tmp_path.as_uri()],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if len(lines) >= 400:
            break
    proc.send_signal(signal.SIGKILL)
    lines.extend(proc.stdout)  # what it printed before the kill
    proc.wait(timeout=30)
    proc.stdout.close()
    acked = {int(n) for k, n in map(str.split, lines) if k == "ACKED"}
    deleted = {int(n) for k, n in map(str.split, lines) if k == "DELETED"}
    assert len(acked) >= 300, f"the writer stopped early: {lines[-3:]}"
    cut_short = max(acked) + 1  # written, or being written, when the kill came
    maybe_deleted = {cut_short - 3} if cut_short % 7 == 3 else set()
    reader = Storage.from_url(tmp_path.as_uri())
    found = {int(o.path.rsplit("/", 1)[1].split("-")[0]) for o in reader.list(WAL)}
    assert acked - deleted - maybe_deleted <= found
    assert not found & deleted
    assert found <= acked | {cut_short}
    for i in found:
        assert reader.read(name(i)) == (b"%020d" % i) * (1 + i % 40)


def test_a_reader_walks_past_its_read_size_and_reads_big_frames(tmp_path: Path) -> None:
    """A walk reads a file 256 KiB at a time: frames across that boundary, and a frame
    bigger than it, are found whole."""
    storage = Storage.from_url(tmp_path.as_uri())
    assert isinstance(storage, LocalStorage)
    storage.journal(WAL, max_object_bytes=600 << 10, capacity=4 << 20)
    sizes = [7000] * 60 + [500 << 10] + [3000] * 10
    for i, size in enumerate(sizes):
        storage.write(name(i), bytes([i % 251]) * size)
    reader = Storage.from_url(tmp_path.as_uri())
    assert [o.size for o in reader.list(WAL)] == sizes
    for i, size in enumerate(sizes):
        assert reader.read(name(i)) == bytes([i % 251]) * size
    storage.close()


def test_threads_writing_and_deleting_at_once_across_rolls(tmp_path: Path) -> None:
    """Writers in several threads while files roll over (each waits for the spare at times):
    every write is there once, whole, and every delete took."""
    storage = journaled(tmp_path, prefix=WAL, capacity=16384)

    def work(t: int) -> None:
        for i in range(t * 1000, t * 1000 + 150):
            storage.write(name(i), b"%d" % i * 40)
            if i % 3 == 0:
                storage.delete(name(i))

    run_threads([functools.partial(work, t) for t in range(4)])
    expected = {name(i) for t in range(4) for i in range(t * 1000, t * 1000 + 150) if i % 3}
    for reader in (storage, Storage.from_url(tmp_path.as_uri())):
        assert {o.path for o in reader.list(WAL)} == expected
        for path in expected:
            i = int(path.rsplit("/", 1)[1].split("-")[0])
            assert reader.read(path) == b"%d" % i * 40
    storage.close()


def test_a_storage_opened_below_the_root_sees_the_journaled_objects(tmp_path: Path) -> None:
    """``replog log dump <root>/_replog/wal`` (or one of its objects) opens a storage below
    the broker root: the root's journal is found above it, names taken relative to it."""
    writer = journaled(tmp_path, prefix=WAL)
    writer.write(name(7), b"seven")
    wal = Storage.from_url((tmp_path / "_replog" / "wal").as_uri())
    assert [o.path for o in wal.list()] == [f"L0/{name(7).rsplit('/', 1)[1]}"]
    level = Storage.from_url((tmp_path / WAL).as_uri())
    assert level.read(name(7).rsplit("/", 1)[1]) == b"seven"
    child = writer.child("_replog")  # a child of the writer shares its journal's map
    assert child.read("wal/L0/" + name(7).rsplit("/", 1)[1]) == b"seven"
    writer.close()


def test_a_reader_refuses_to_delete_a_journaled_object(tmp_path: Path) -> None:
    """Deletes are frames in the writer's files: another process cannot record one, so it
    says so instead of forgetting the object for itself alone."""
    writer = journaled(tmp_path, prefix=WAL)
    writer.write(name(1), b"one")
    reader = Storage.from_url(tmp_path.as_uri())
    with pytest.raises(StorageError, match="only that process"):
        reader.delete(name(1))
    assert reader.delete_many([name(1)]).keys() == {name(1)}
    reader.delete(name(2))  # not there: fine, as for any object
    assert reader.read(name(1)) == b"one"
    writer.close()


def test_a_journal_that_could_not_hold_its_objects_is_refused(tmp_path: Path) -> None:
    storage = Storage.from_url(tmp_path.as_uri())
    with pytest.raises(ValueError, match="half the journal capacity"):
        storage.journal(WAL, max_object_bytes=64 << 10, capacity=100 << 10)
    with pytest.raises(ValueError, match="between 0"):
        storage.journal(WAL, max_object_bytes=-1)
    assert Storage.from_url("memory://journal-refused").journal(WAL) is False
