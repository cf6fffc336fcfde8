"""Conformance suite for logstore.storage, run against every backend.

:class:`StorageTests` holds the contract; each ``Test*Storage`` subclass supplies a ``storage``
fixture (an empty Storage) and adds the tests only its backend can run.
"""

from __future__ import annotations

import fcntl
import functools
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    precondition,
    rule,
    run_state_machine_as_test,
)

import logstore.storage as storage_module
from logstore.errors import ObjectExistsError, ObjectNotFoundError, StorageError
from logstore.storage import TEMP_PREFIX, FsspecStorage, ObjectInfo, Storage
from tests.conftest import S3Location
from tests.faulty_fs import FaultyStorage, InjectedStorageError

REPO = Path(__file__).resolve().parents[1]


def run_threads(targets: list[Callable[[], None]], timeout: float = 20.0) -> None:
    """Run each target in its own thread; re-raise the first error any of them raised."""
    errors: list[BaseException] = []

    def wrap(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as err:
                errors.append(err)

        return run

    threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        assert not thread.is_alive(), "thread did not finish in time"
    if errors:
        raise errors[0]


def record_calls(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[Any]:
    """Wrap ``module.name`` (a one-argument function) so that each call's argument is
    recorded in the returned list; the real function still runs."""
    calls: list[Any] = []
    real = getattr(module, name)

    def recording(arg: Any) -> Any:
        calls.append(arg)
        return real(arg)

    monkeypatch.setattr(module, name, recording)
    return calls


class StorageTests:
    """The Storage contract. Subclasses override the ``storage`` fixture."""

    #: Threads racing in the put-if-absent test.
    race_threads: ClassVar[int] = 8
    #: Hypothesis examples for the model test (each runs ~20 operations).
    model_examples: ClassVar[int] = 25

    @pytest.fixture
    def storage(self) -> Iterator[Storage]:
        raise NotImplementedError

    # --- read ----------------------------------------------------------------------------

    def test_write_then_read(self, storage: Storage) -> None:
        storage.write("topic/0/00000000000000000000.seg", b"batch")
        assert storage.read("topic/0/00000000000000000000.seg") == b"batch"

    def test_read_missing(self, storage: Storage) -> None:
        with pytest.raises(ObjectNotFoundError) as info:
            storage.read("topic/0/missing")
        assert isinstance(info.value, FileNotFoundError)
        assert isinstance(info.value, StorageError)
        assert f"{storage.url}/topic/0/missing" in str(info.value)
        assert "read" in str(info.value)
        assert info.value.__cause__ is not None

    def test_read_of_a_prefix_is_missing(self, storage: Storage) -> None:
        storage.write("dir/object", b"x")
        with pytest.raises(ObjectNotFoundError):
            storage.read("dir")

    def test_read_range(self, storage: Storage) -> None:
        storage.write("obj", b"0123456789")
        assert storage.read_range("obj", 0, 3) == b"012"
        assert storage.read_range("obj", 3, 7) == b"3456"
        assert storage.read_range("obj", 0, 10) == b"0123456789"
        assert storage.read_range("obj", 4, 4) == b""

    def test_read_range_clips_at_size(self, storage: Storage) -> None:
        storage.write("obj", b"0123456789")
        assert storage.read_range("obj", 7, 100) == b"789"
        assert storage.read_range("obj", 10, 20) == b""
        assert storage.read_range("obj", 50, 60) == b""

    def test_read_range_missing(self, storage: Storage) -> None:
        with pytest.raises(ObjectNotFoundError):
            storage.read_range("missing", 0, 10)
        with pytest.raises(ObjectNotFoundError):
            storage.read_range("missing", 3, 3)

    @pytest.mark.parametrize(("start", "end"), [(-1, 3), (5, 4)])
    def test_read_range_rejects_a_bad_range(self, storage: Storage, start: int, end: int) -> None:
        storage.write("obj", b"0123456789")
        with pytest.raises(ValueError, match="byte range"):
            storage.read_range("obj", start, end)

    # --- write -----------------------------------------------------------------------------

    def test_write_overwrites(self, storage: Storage) -> None:
        storage.write("obj", b"first version, longer")
        storage.write("obj", b"second")
        assert storage.read("obj") == b"second"
        assert storage.size("obj") == 6
        assert storage.list() == [ObjectInfo("obj", 6)]

    def test_write_takes_any_buffer(self, storage: Storage) -> None:
        storage.write("bytearray", bytearray(b"abc"))
        storage.write("memoryview", memoryview(b"xabcx")[1:4])
        storage.put_if_absent("pia", memoryview(bytearray(b"abc")))
        assert storage.read("bytearray") == storage.read("memoryview") == storage.read("pia")

    def test_empty_object(self, storage: Storage) -> None:
        storage.write("empty", b"")
        storage.put_if_absent("empty2", b"")
        assert storage.read("empty") == b""
        assert storage.read_range("empty", 0, 10) == b""
        assert storage.size("empty") == 0
        assert storage.exists("empty")
        assert storage.list() == [ObjectInfo("empty", 0), ObjectInfo("empty2", 0)]

    def test_binary_data(self, storage: Storage) -> None:
        data = bytes(range(256)) * 64 + os.urandom(300_000)
        storage.write("bin", data)
        assert storage.read("bin") == data
        assert storage.read_range("bin", 255, 1024) == data[255:1024]
        assert storage.size("bin") == len(data)

    def test_overwrite_is_atomic_for_readers(self, storage: Storage) -> None:
        old, new = b"o" * 200_000, b"n" * 100_000
        storage.write("obj", old)
        done = threading.Event()
        seen: set[bytes] = set()

        def writer() -> None:
            try:
                for i in range(20):
                    storage.write("obj", new if i % 2 == 0 else old)
            finally:
                done.set()

        def reader() -> None:
            while True:
                finished = done.is_set()
                data = storage.read("obj")
                assert data in (old, new), f"partial read of {len(data)} bytes"
                seen.add(data)
                if finished:
                    return

        run_threads([writer, reader, reader])
        assert seen

    def test_list_never_shows_a_partial_object(self, storage: Storage) -> None:
        size = 100_000
        done = threading.Event()

        def writer() -> None:
            try:
                for i in range(15):
                    storage.write(f"seg/{i:04d}", b"x" * size)
            finally:
                done.set()

        def lister() -> None:
            while True:
                finished = done.is_set()
                for info in storage.list("seg"):
                    assert info.path.startswith("seg/0"), info
                    assert info.size == size, info
                if finished:
                    return

        run_threads([writer, lister])
        assert len(storage.list("seg")) == 15

    # --- put_if_absent ---------------------------------------------------------------------

    def test_put_if_absent_creates(self, storage: Storage) -> None:
        storage.put_if_absent("meta/epoch-1", b"controller-1")
        assert storage.read("meta/epoch-1") == b"controller-1"
        assert storage.list() == [ObjectInfo("meta/epoch-1", 12)]

    def test_put_if_absent_conflict_keeps_the_object(self, storage: Storage) -> None:
        storage.put_if_absent("meta/epoch-1", b"first")
        with pytest.raises(ObjectExistsError) as info:
            storage.put_if_absent("meta/epoch-1", b"second")
        assert isinstance(info.value, FileExistsError)
        assert isinstance(info.value, StorageError)
        assert f"{storage.url}/meta/epoch-1" in str(info.value)
        assert info.value.__cause__ is not None
        assert storage.read("meta/epoch-1") == b"first"
        storage.write("plain", b"written")
        with pytest.raises(ObjectExistsError):
            storage.put_if_absent("plain", b"other")
        assert storage.read("plain") == b"written"

    def test_put_if_absent_after_delete(self, storage: Storage) -> None:
        storage.put_if_absent("obj", b"1")
        storage.delete("obj")
        storage.put_if_absent("obj", b"2")
        assert storage.read("obj") == b"2"

    def test_put_if_absent_race_has_one_winner(self, storage: Storage) -> None:
        for round_ in range(3):
            path = f"meta/epoch-{round_}"
            winners, losers = self._race(storage, path)
            assert len(winners) == 1, winners
            assert len(losers) == self.race_threads - 1
            assert storage.read(path) == winners[0]

    def _race(self, storage: Storage, path: str) -> tuple[list[bytes], list[bytes]]:
        """Several threads put_if_absent ``path`` at once; return the winners and the losers."""
        barrier = threading.Barrier(self.race_threads)
        winners: list[bytes] = []
        losers: list[bytes] = []

        def contender(data: bytes) -> None:
            barrier.wait()
            try:
                storage.put_if_absent(path, data)
            except ObjectExistsError:
                losers.append(data)
            else:
                winners.append(data)

        run_threads(
            [
                functools.partial(contender, f"contender-{i}".encode())
                for i in range(self.race_threads)
            ]
        )
        return winners, losers

    # --- list ------------------------------------------------------------------------------

    def test_list_is_recursive_sorted_with_sizes(self, storage: Storage) -> None:
        objects = {"b/2/z": b"1", "a": b"22", "b/10": b"333", "b/2/a": b"", "c/d/e/f": b"4444"}
        for path, data in objects.items():
            storage.write(path, data)
        assert storage.list() == [ObjectInfo(path, len(objects[path])) for path in sorted(objects)]
        assert storage.list("") == storage.list()

    def test_list_prefix_is_a_directory(self, storage: Storage) -> None:
        for path in ["a/x", "a/y/z", "ab/x", "b", "a2"]:
            storage.write(path, b"data")
        assert [i.path for i in storage.list("a")] == ["a/x", "a/y/z"]
        assert [i.path for i in storage.list("a/")] == ["a/x", "a/y/z"]
        assert [i.path for i in storage.list("a/y")] == ["a/y/z"]
        assert [i.path for i in storage.list("ab")] == ["ab/x"]

    def test_list_empty_and_missing(self, storage: Storage) -> None:
        assert storage.list() == []
        storage.write("a/x", b"1")
        assert storage.list("missing") == []
        assert storage.list("a/x/deeper") == []

    # --- delete, exists, size --------------------------------------------------------------

    def test_delete(self, storage: Storage) -> None:
        storage.write("a/x", b"1")
        storage.write("a/y", b"2")
        storage.delete("a/x")
        assert not storage.exists("a/x")
        assert storage.list() == [ObjectInfo("a/y", 1)]
        with pytest.raises(ObjectNotFoundError):
            storage.read("a/x")

    def test_delete_missing_is_fine(self, storage: Storage) -> None:
        storage.delete("never/was")
        storage.write("obj", b"1")
        storage.delete("obj")
        storage.delete("obj")
        assert storage.list() == []

    def test_delete_many(self, storage: Storage) -> None:
        for name in ("a/x", "a/y", "b/z", "keep"):
            storage.write(name, name.encode())
        assert storage.delete_many(["a/x", "never/was", "b/z", "a/y", "a/x"]) == {}
        assert storage.list() == [ObjectInfo("keep", 4)]
        assert storage.delete_many([]) == {}

    def test_exists_and_size(self, storage: Storage) -> None:
        assert not storage.exists("obj")
        storage.write("dir/obj", b"12345")
        assert storage.exists("dir/obj")
        assert storage.size("dir/obj") == 5
        assert not storage.exists("dir"), "a prefix is not an object"
        assert not storage.exists("dir/obj/deeper")

    def test_size_missing(self, storage: Storage) -> None:
        with pytest.raises(ObjectNotFoundError, match="size"):
            storage.size("missing")
        storage.write("dir/obj", b"1")
        with pytest.raises(ObjectNotFoundError):
            storage.size("dir")

    # --- paths and children ----------------------------------------------------------------

    @pytest.mark.parametrize(
        "path", ["", "/a", "a/", "a//b", "./a", "a/../b", "..", f"a/{TEMP_PREFIX}x", "a\x00b"]
    )
    def test_invalid_paths_are_refused(self, storage: Storage, path: str) -> None:
        with pytest.raises(ValueError, match="path"):
            storage.write(path, b"x")
        with pytest.raises(ValueError, match="path"):
            storage.read(path)

    def test_child_isolation(self, storage: Storage) -> None:
        storage.write("other/x", b"not in the child")
        storage.write("topicx/y", b"a sibling, not in the child")
        child = storage.child("topic")
        assert child.url == f"{storage.url}/topic"
        assert child.list() == []
        child.write("0/seg", b"seg")
        child.put_if_absent("0/epoch", b"e")
        assert storage.read("topic/0/seg") == b"seg"
        assert child.list() == [ObjectInfo("0/epoch", 1), ObjectInfo("0/seg", 3)]
        with pytest.raises(ObjectNotFoundError):
            child.read("other/x")

        grandchild = child.child("0")
        assert grandchild.url == f"{storage.url}/topic/0"
        assert grandchild.read("seg") == b"seg"
        with pytest.raises(ObjectExistsError):
            grandchild.put_if_absent("epoch", b"again")
        grandchild.delete("seg")
        assert not storage.exists("topic/0/seg")
        assert [i.path for i in storage.list()] == ["other/x", "topic/0/epoch", "topicx/y"]
        grandchild.close()  # a child's close leaves the parent working
        assert storage.read("topic/0/epoch") == b"e"

    def test_close_twice_and_context_manager(self, storage: Storage) -> None:
        other = Storage.from_url(storage.url, **self.options())
        with other:
            other.write("x", b"1")
        other.close()
        assert storage.read("x") == b"1"

    def options(self) -> dict[str, Any]:
        """Storage options to open this backend's url again."""
        return {}

    # --- a model ---------------------------------------------------------------------------

    def test_matches_a_dict_model(self, storage: Storage) -> None:
        """Random operations agree with a dict of path -> bytes."""
        paths = st.sampled_from(["a", "b", "d/a", "d/e/f", "d/e/g", "x/y"])
        datas = st.binary(max_size=64)

        class Model(RuleBasedStateMachine):
            def __init__(self) -> None:
                super().__init__()
                self.storage = storage.child(f"model-{uuid.uuid4().hex[:8]}")
                self.model: dict[str, bytes] = {}

            @rule(path=paths, data=datas)
            def write(self, path: str, data: bytes) -> None:
                self.storage.write(path, data)
                self.model[path] = data

            @rule(path=paths, data=datas)
            def put_if_absent(self, path: str, data: bytes) -> None:
                if path in self.model:
                    with pytest.raises(ObjectExistsError):
                        self.storage.put_if_absent(path, data)
                else:
                    self.storage.put_if_absent(path, data)
                    self.model[path] = data

            @rule(path=paths)
            def delete(self, path: str) -> None:
                self.storage.delete(path)
                self.model.pop(path, None)

            @rule(path=paths, start=st.integers(0, 70), length=st.integers(0, 70))
            def read(self, path: str, start: int, length: int) -> None:
                if path in self.model:
                    assert self.storage.read(path) == self.model[path]
                    got = self.storage.read_range(path, start, start + length)
                    assert got == self.model[path][start : start + length]
                    assert self.storage.size(path) == len(self.model[path])
                else:
                    with pytest.raises(ObjectNotFoundError):
                        self.storage.read(path)
                    assert not self.storage.exists(path)

            @precondition(lambda self: bool(self.model))
            @rule(prefix=st.sampled_from(["", "d", "d/e", "x", "missing"]))
            def list_(self, prefix: str) -> None:
                expected = [
                    ObjectInfo(path, len(data))
                    for path, data in sorted(self.model.items())
                    if not prefix or path.startswith(prefix + "/")
                ]
                assert self.storage.list(prefix) == expected

        run_state_machine_as_test(
            Model,
            settings=settings(
                max_examples=self.model_examples,
                stateful_step_count=20,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )


# --- backends ------------------------------------------------------------------------------


@pytest.mark.unit
class TestLocalStorage(StorageTests):
    @pytest.fixture
    def storage(self, tmp_path: Path) -> Iterator[Storage]:
        with Storage.from_url((tmp_path / "root").as_uri()) as storage:
            yield storage

    def test_url_forms(self, tmp_path: Path) -> None:
        by_uri = Storage.from_url(tmp_path.as_uri())
        by_path = Storage.from_url(str(tmp_path))
        assert by_uri.url == by_path.url == f"file://{tmp_path}"
        by_uri.write("a/b", b"1")
        assert by_path.read("a/b") == b"1"
        assert (tmp_path / "a" / "b").read_bytes() == b"1"

    def test_url_round_trip_with_odd_characters(self, tmp_path: Path) -> None:
        storage = Storage.from_url(str(tmp_path / "a dir%20"))
        storage.write("x", b"1")
        assert Storage.from_url(storage.url).read("x") == b"1"
        assert (tmp_path / "a dir%20" / "x").exists()

    def test_relative_file_url_is_refused(self) -> None:
        with pytest.raises(ValueError, match="absolute"):
            Storage.from_url("file://relative/dir")

    def test_storage_options_are_refused(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match="endpoint_url"):
            Storage.from_url(str(tmp_path), endpoint_url="http://x")

    def test_without_fsync(self, tmp_path: Path) -> None:
        storage = Storage.from_url(str(tmp_path), fsync=False)
        storage.write("a/b/c", b"1")
        storage.put_if_absent("a/b/d", b"2")
        assert storage.list("a") == [ObjectInfo("a/b/c", 1), ObjectInfo("a/b/d", 1)]

    def test_delete_many_syncs_each_directory_once(
        self, storage: Storage, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """Thousands of garbage WAL objects deleted together cost one directory fsync per
        directory, not one per object (each is a journal commit the foreground writes'
        fsyncs would queue behind)."""
        names = [f"wal/L0/{i:04d}" for i in range(50)] + ["other/a", "other/b"]
        for name in names:
            storage.write(name, b"1")
        synced = record_calls(monkeypatch, storage_module, "_fsync_dir")
        assert storage.delete_many(names) == {}
        assert storage.list() == []
        assert sorted(os.path.relpath(d, tmp_path / "root") for d in synced) == ["other", "wal/L0"]

    @pytest.mark.parametrize("extra", [-1, 0, 1, 4096 + 3])
    def test_a_big_write_is_synced_in_slices(
        self, storage: Storage, monkeypatch: pytest.MonkeyPatch, extra: int
    ) -> None:
        """Objects over SYNC_SLICE_BYTES go down in slices, each synced before the next; the
        object reads back whole at every size around the slice boundary."""
        monkeypatch.setattr(storage_module, "SYNC_SLICE_BYTES", 4096)
        syncs = record_calls(monkeypatch, os, "fdatasync")
        data = os.urandom(2 * 4096 + extra)
        storage.write("big", data)
        assert storage.read("big") == data
        assert len(syncs) == -(-len(data) // 4096) - 1  # every slice but the last

    @pytest.mark.parametrize("extra", [-1, 0, 1, 4096 + 3, 3 * 8192 + 4095])
    def test_a_big_write_bypasses_the_page_cache(
        self,
        storage: Storage,
        monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path,
        extra: int,
    ) -> None:
        """Objects of DIRECT_MIN_BYTES and more are opened O_DIRECT (aligned slices through a
        page-aligned buffer, the unaligned tail through the page cache) and fsynced; smaller
        ones are not. Each reads back whole, at sizes around the threshold and the
        alignment, and no temporary file is left."""
        monkeypatch.setattr(storage_module, "DIRECT_MIN_BYTES", 16384)
        monkeypatch.setattr(storage_module, "SYNC_SLICE_BYTES", 8192)
        storage.write("small", b"")  # the root exists: no directory fsyncs of its making
        opened: list[int] = []
        real_open = os.open

        def spy(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            opened.append(flags)
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", spy)
        syncs = record_calls(monkeypatch, os, "fsync")
        data = os.urandom(16384 + extra)
        storage.write("big", data)
        monkeypatch.setattr(os, "open", real_open)
        assert storage.read("big") == data
        direct = [f for f in opened if f & storage_module.O_DIRECT]
        if extra < 0:
            assert direct == []
        else:
            assert len(direct) == 1
        assert len(syncs) == 2  # the file, then its directory
        assert sorted(os.listdir(tmp_path / "root")) == ["big", "small"]

    @pytest.mark.parametrize("refused_by", ["open", "write"])
    def test_a_file_system_without_direct_writes_gets_the_page_cache(
        self, storage: Storage, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, refused_by: str
    ) -> None:
        """A file system that refuses O_DIRECT (EINVAL at the open, as tmpfs before Linux
        6.6, some after creating the file; or at the first write) gets the object through the
        page cache, whole, with nothing left behind."""
        monkeypatch.setattr(storage_module, "DIRECT_MIN_BYTES", 16384)
        real_open, real_write = os.open, os.write

        def refusing_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if flags & storage_module.O_DIRECT:
                real_open(path, flags & ~storage_module.O_DIRECT, *args, **kwargs)  # created
                raise OSError(22, "Invalid argument", path)
            return real_open(path, flags, *args, **kwargs)

        def refusing_write(fd: int, data: Any) -> int:
            if fcntl.fcntl(fd, fcntl.F_GETFL) & storage_module.O_DIRECT:
                raise OSError(22, "Invalid argument")
            return real_write(fd, data)

        if refused_by == "open":
            monkeypatch.setattr(os, "open", refusing_open)
        else:
            monkeypatch.setattr(os, "write", refusing_write)
        data = os.urandom(5 * 8192 + 7)
        storage.write("big", data)
        monkeypatch.undo()
        assert storage.read("big") == data
        assert os.listdir(tmp_path / "root") == ["big"]

    def test_leftover_temp_file_is_ignored(self, storage: Storage, tmp_path: Path) -> None:
        storage.write("topic/0/seg", b"whole")
        directory = tmp_path / "root" / "topic" / "0"
        (directory / f"{TEMP_PREFIX}deadbeef").write_bytes(b"half a wri")
        (directory / f"{TEMP_PREFIX}cafe").write_bytes(b"")
        assert storage.list() == [ObjectInfo("topic/0/seg", 5)]
        assert storage.read("topic/0/seg") == b"whole"
        storage.put_if_absent("topic/0/other", b"ok")
        assert [i.path for i in storage.list("topic/0")] == ["topic/0/other", "topic/0/seg"]

    def test_temp_files_are_gone_after_writes(self, storage: Storage, tmp_path: Path) -> None:
        storage.write("a/x", b"1")
        storage.write("a/x", b"2")
        storage.put_if_absent("a/y", b"3")
        with pytest.raises(ObjectExistsError):
            storage.put_if_absent("a/y", b"4")
        assert sorted(os.listdir(tmp_path / "root" / "a")) == ["x", "y"]

    @pytest.mark.parametrize("call", ["write", "put_if_absent"])
    def test_crash_before_the_rename(self, storage: Storage, tmp_path: Path, call: str) -> None:
        """A process killed between writing the temp file and renaming it leaves the old state."""
        storage.write("topic/0/old", b"old contents")
        storage.write("topic/0/replaced", b"before")
        target = "topic/0/replaced" if call == "write" else "topic/0/new"
        script = f"""
import os
os.replace = os.link = lambda *args, **kwargs: os._exit(17)  # die at the rename or link
from logstore.storage import Storage
Storage.from_url({storage.url!r}).{call}({target!r}, b"new contents, never seen")
"""
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        done = subprocess.run([sys.executable, "-c", script], env=env, timeout=60, check=False)
        assert done.returncode == 17
        directory = tmp_path / "root" / "topic" / "0"
        leftovers = [n for n in os.listdir(directory) if n.startswith(TEMP_PREFIX)]
        assert len(leftovers) == 1, "the crash left its temp file"
        assert (directory / leftovers[0]).read_bytes() == b"new contents, never seen"

        assert storage.list() == [
            ObjectInfo("topic/0/old", 12),
            ObjectInfo("topic/0/replaced", 6),
        ]
        assert storage.read("topic/0/replaced") == b"before"
        assert not storage.exists("topic/0/new")
        storage.put_if_absent("topic/0/new", b"after recovery")
        assert storage.read("topic/0/new") == b"after recovery"

    def test_an_object_in_the_way_is_a_storage_error(self, storage: Storage) -> None:
        storage.write("a", b"object")
        for call in (storage.write, storage.put_if_absent):
            with pytest.raises(StorageError) as info:
                call("a/b", b"x")
            assert not isinstance(info.value, ObjectExistsError | ObjectNotFoundError)
            assert isinstance(info.value.__cause__, OSError)
            assert f"{storage.url}/a/b" in str(info.value)
        assert storage.list() == [ObjectInfo("a", 6)]

    def test_unreadable_root_is_a_storage_error(self, tmp_path: Path) -> None:
        (tmp_path / "file").write_bytes(b"")
        storage = Storage.from_url(str(tmp_path / "file" / "root"))
        assert storage.list() == []
        with pytest.raises(StorageError) as info:
            storage.write("x", b"1")
        assert not isinstance(info.value, ObjectExistsError)


@pytest.mark.unit
class TestMemoryStorage(StorageTests):
    @pytest.fixture
    def storage(self) -> Iterator[Storage]:
        url = f"memory://test-{uuid.uuid4().hex}/root"
        with Storage.from_url(url) as storage:
            yield storage
            for info in storage.list():
                storage.delete(info.path)

    def test_same_url_same_objects(self, storage: Storage) -> None:
        storage.write("x", b"1")
        assert Storage.from_url(storage.url).read("x") == b"1"

    def test_url_needs_a_name(self) -> None:
        with pytest.raises(ValueError, match="name"):
            Storage.from_url("memory://")


@pytest.mark.s3
class TestS3Storage(StorageTests):
    model_examples = 8

    @pytest.fixture
    def storage(self, s3_url: S3Location) -> Iterator[Storage]:
        self._options = dict(s3_url.storage_options)
        with Storage.from_url(s3_url.url, **s3_url.storage_options) as storage:
            yield storage

    def options(self) -> dict[str, Any]:
        return self._options

    def test_list_sees_other_writers(self, s3_url: S3Location) -> None:
        reader = Storage.from_url(s3_url.url, **s3_url.storage_options)
        writer = Storage.from_url(s3_url.url, **s3_url.storage_options)
        assert reader.list("a") == []
        assert not reader.exists("a/x")
        writer.write("a/x", b"1")
        assert reader.list("a") == [ObjectInfo("a/x", 1)]
        assert reader.exists("a/x")
        writer.delete("a/x")
        assert reader.list("a") == []
        reader.close()
        writer.close()

    def test_own_client_is_closed(self, s3_url: S3Location) -> None:
        own = Storage.from_url(s3_url.url, skip_instance_cache=True, **s3_url.storage_options)
        own.write("x", b"1")
        assert own.child("a").url == f"{s3_url.url}/a"
        own.child("a").close()
        assert own.read("x") == b"1", "a child's close leaves the client open"
        own.close()
        own.close()
        with Storage.from_url(s3_url.url, **s3_url.storage_options) as shared:
            assert shared.read("x") == b"1"

    def test_missing_bucket(self, s3_url: S3Location) -> None:
        storage = Storage.from_url("s3://no-such-bucket/root", **s3_url.storage_options)
        with pytest.raises(StorageError) as info:
            storage.write("x", b"1")
        assert not isinstance(info.value, ObjectNotFoundError)
        assert "s3://no-such-bucket/root/x" in str(info.value)
        with pytest.raises(StorageError) as info:
            storage.list()
        assert not isinstance(info.value, ObjectNotFoundError)
        storage.close()

    def test_unreachable_endpoint(self, s3_url: S3Location) -> None:
        storage = Storage.from_url(
            s3_url.url,
            endpoint_url="http://127.0.0.1:9",
            key="testing",
            secret="testing",
            config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 2},
        )
        with pytest.raises(StorageError) as info:
            storage.read("x")
        assert not isinstance(info.value, ObjectNotFoundError)
        assert info.value.retriable
        storage.close()


class _GenericMemoryFileSystem(MemoryFileSystem):
    """The memory filesystem under another protocol: an fsspec backend without a subclass."""

    protocol = "replogtest"
    store: ClassVar[dict[str, Any]] = {}
    pseudo_dirs: ClassVar[list[str]] = [""]

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return str(super()._strip_protocol(path.removeprefix("replogtest://")))


@pytest.mark.unit
class TestGenericFsspecStorage:
    @pytest.fixture
    def storage(self) -> Storage:
        fsspec.register_implementation("replogtest", _GenericMemoryFileSystem, clobber=True)
        return Storage.from_url(f"replogtest://test-{uuid.uuid4().hex}/root")

    def test_reads_writes_lists(self, storage: Storage) -> None:
        assert type(storage) is FsspecStorage
        storage.write("a/b", b"12")
        storage.write("a/c", b"3")
        assert storage.read("a/b") == b"12"
        assert storage.read_range("a/b", 1, 5) == b"2"
        assert storage.list("a") == [ObjectInfo("a/b", 2), ObjectInfo("a/c", 1)]
        storage.delete("a/b")
        assert not storage.exists("a/b")
        with pytest.raises(ObjectNotFoundError):
            storage.read("a/b")

    def test_put_if_absent_is_refused(self, storage: Storage) -> None:
        with pytest.raises(StorageError, match="conditional writes are unsupported"):
            storage.put_if_absent("a", b"1")
        assert not storage.exists("a")

    def test_unknown_protocol(self) -> None:
        with pytest.raises(ValueError, match="nosuchprotocol"):
            Storage.from_url("nosuchprotocol://x/y")


# --- the faulty wrapper --------------------------------------------------------------------


@pytest.mark.unit
class TestFaultyStorage(StorageTests):
    """The wrapper passes the whole contract when no fault is armed, and fails on command."""

    model_examples = 5

    @pytest.fixture
    def storage(self) -> Iterator[FaultyStorage]:
        inner = Storage.from_url(f"memory://test-{uuid.uuid4().hex}/root")
        yield FaultyStorage(inner)
        for info in inner.list():
            inner.delete(info.path)

    def test_fail_before(self, storage: FaultyStorage) -> None:
        storage.write("x", b"old")
        storage.fail("write", times=2)
        for _ in range(2):
            with pytest.raises(InjectedStorageError) as info:
                storage.write("x", b"new")
            assert isinstance(info.value, StorageError)
            assert info.value.retriable
        assert storage.read("x") == b"old", "a failure before the call changes nothing"
        storage.write("x", b"new")
        assert storage.read("x") == b"new"
        assert storage.calls["write"] == 4
        assert storage.pending == 0

    def test_delete_many_carries_on_past_a_failure(self, storage: FaultyStorage) -> None:
        for name in ("a", "b", "c"):
            storage.write(name, b"1")
        storage.fail("delete", path_prefix="b")
        failed = storage.delete_many(["a", "b", "c"])
        assert list(failed) == ["b"]
        assert isinstance(failed["b"], InjectedStorageError)
        assert storage.list() == [ObjectInfo("b", 1)], "the others went; b stays"

    def test_fail_after_is_outcome_unknown(self, storage: FaultyStorage) -> None:
        storage.fail("put_if_absent", after=True)
        with pytest.raises(InjectedStorageError, match="after"):
            storage.put_if_absent("epoch", b"mine")
        assert storage.read("epoch") == b"mine", "the call happened although it raised"
        with pytest.raises(ObjectExistsError):
            storage.put_if_absent("epoch", b"mine")

    @pytest.mark.parametrize(
        ("op", "call"),
        [
            ("read", lambda s: s.read("x")),
            ("read_range", lambda s: s.read_range("x", 0, 1)),
            ("list", lambda s: s.list()),
            ("delete", lambda s: s.delete("x")),
            ("exists", lambda s: s.exists("x")),
            ("size", lambda s: s.size("x")),
        ],
    )
    def test_every_operation_can_fail(
        self, storage: FaultyStorage, op: str, call: Callable[[Storage], object]
    ) -> None:
        storage.write("x", b"1")
        storage.fail(op)
        with pytest.raises(InjectedStorageError, match=op):
            call(storage)
        call(storage)

    def test_children_share_faults_by_path(self, storage: FaultyStorage) -> None:
        partition = storage.child("orders").child("0")
        storage.fail("write", path_prefix="orders/0/")
        storage.write("orders/1/seg", b"not matched")
        with pytest.raises(InjectedStorageError):
            partition.write("seg", b"matched")
        partition.write("seg", b"fine now")
        assert storage.read("orders/0/seg") == b"fine now"

    def test_heal(self, storage: FaultyStorage) -> None:
        storage.fail("read", times=5)
        assert storage.pending == 5
        storage.heal()
        storage.write("x", b"1")
        assert storage.read("x") == b"1"

    def test_unknown_operation(self, storage: FaultyStorage) -> None:
        with pytest.raises(ValueError, match="unknown operation"):
            storage.fail("rename")
