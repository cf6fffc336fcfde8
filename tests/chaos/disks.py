"""A small disk for a broker's log storage: a tmpfs the harness mounts, fills and frees.

    disk = TmpfsDisk(Path("/tmp/x/broker-0/disk"), size_mb=64).mount()
    disk.fill(leave_bytes=4096)   # every write but the first few KB now fails with ENOSPC
    disk.free()                   # the space is back
    disk.unmount()                # always, also when the schedule failed

The broker's log root is :attr:`TmpfsDisk.log_root`, a directory inside the mount, and the
space is taken by one file beside it (:attr:`TmpfsDisk.filler`), so the broker never sees a
file it did not write. Mounting needs root (``mount -t tmpfs``); :meth:`unmount` is safe to
call twice, and detaches lazily if a process still holds a file open there.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

#: How often :meth:`TmpfsDisk.fill` measures the free space again when the broker took some of
#: it meanwhile.
FILL_ATTEMPTS = 10


class TmpfsDisk:
    """One tmpfs of ``size_mb`` MiB mounted at ``mountpoint``."""

    def __init__(self, mountpoint: Path, size_mb: int) -> None:
        self.mountpoint = Path(mountpoint)
        self.size_mb = size_mb
        self.mounted = False

    @property
    def log_root(self) -> Path:
        return self.mountpoint / "logs"

    @property
    def filler(self) -> Path:
        return self.mountpoint / "filler"

    def mount(self) -> TmpfsDisk:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs", str(self.mountpoint)],
            check=True,
            capture_output=True,
            text=True,
        )
        self.mounted = True
        self.log_root.mkdir()
        return self

    def free_bytes(self) -> int:
        stat = os.statvfs(self.mountpoint)
        return stat.f_bavail * stat.f_frsize

    def fill(self, leave_bytes: int) -> int:
        """Take all the free space but ``leave_bytes`` (rounded to pages); returns the bytes
        taken. A write that needs more fails with ENOSPC, after storing what fitted."""
        fd = os.open(self.filler, os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            for _ in range(FILL_ATTEMPTS):
                taken = max(self.free_bytes() - leave_bytes, 0)
                try:
                    if taken:
                        os.posix_fallocate(fd, os.fstat(fd).st_size, taken)
                    return taken
                except OSError as err:  # the broker wrote since free_bytes(): measure again
                    if err.errno != errno.ENOSPC:
                        raise
            return 0
        finally:
            os.close(fd)

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        if not self.mounted:
            return
        result = subprocess.run(
            ["umount", str(self.mountpoint)], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:  # still busy (a process not reaped yet): detach it lazily
            subprocess.run(["umount", "-l", str(self.mountpoint)], check=True, capture_output=True)
        self.mounted = False
