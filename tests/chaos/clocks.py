"""A node's wall clock, stepped by the harness through libfaketime (Debian's ``faketime``).

    clock = FakeClock(Path("/tmp/x/broker-0/faketime"))
    env = clock.env()        # the node's process starts with libfaketime preloaded
    clock.step_to(+600)      # its wall clock is 10 minutes ahead, within a second
    clock.step_to(0)         # and back (another step)
    clock.remove()

libfaketime reads the offset from the file every :data:`CACHE_S` seconds
(``FAKETIME_CACHE_DURATION``), so a running process sees the step as a real clock step: the
wall clock (CLOCK_REALTIME) moves, the monotonic clock does not (``FAKETIME_DONT_FAKE_MONOTONIC``).

libfaketime 0.9.10 (Debian 12) breaks ``clock_nanosleep`` on the monotonic clock when that clock
is not faked (wolfcw/libfaketime#426): Python 3.11's ``time.sleep`` fails with EINVAL. A node
launched through :mod:`tests.chaos.launcher` with :data:`TIMESTAMP_ENV` set sleeps on a
condition variable instead (:func:`sleep_on_a_condition`), which waits on the monotonic clock
too.
"""

from __future__ import annotations

import glob
import os
import threading
from pathlib import Path
from typing import SupportsIndex

#: The environment variable naming the offset file of a process under libfaketime.
TIMESTAMP_ENV = "FAKETIME_TIMESTAMP_FILE"
#: How often (seconds) a process reads its offset file again.
CACHE_S = 1
_LIBRARY_GLOBS = (
    "/usr/lib/*/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)


def libfaketime() -> str:
    """The path of libfaketime.so.1; FileNotFoundError naming the package if it is absent."""
    for pattern in _LIBRARY_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    raise FileNotFoundError("libfaketime.so.1 not found: apt-get install faketime")


class FakeClock:
    """The offset file of one node's faked wall clock."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.offset_s = 0
        self.step_to(0)

    def env(self) -> dict[str, str]:
        """What the node's process needs in its environment."""
        return {
            "LD_PRELOAD": libfaketime(),
            TIMESTAMP_ENV: str(self.path),
            "FAKETIME_CACHE_DURATION": str(CACHE_S),
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    def step_to(self, offset_s: int) -> None:
        """Set the node's wall clock ``offset_s`` seconds from the true time (write to a
        temporary name, then rename: a read never sees half of it)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(f"{offset_s:+d}\n")
        os.replace(tmp, self.path)
        self.offset_s = offset_s

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def sleep_on_a_condition(seconds: float | SupportsIndex) -> None:
    """``time.sleep`` for a process under libfaketime: a wait on a condition variable."""
    threading.Event().wait(max(float(seconds), 0.0))
