"""Wall clocks that a step of the node's clock does not move at once.

:class:`SteadyWallClock` is what a log's retention, segment rolls and delayed deletes read;
:class:`MonotonicWallClock` is the group coordinator's, whose deadlines (sessions, rebalances)
and wall-clock times (commit timestamps, offset expiry) share one clock.

Retention by time is a wall-clock rule (``retention.ms`` against record timestamps, as in
Kafka), so a step of the node's wall clock is a step of every log's "now". A step back only
makes retention later (it deletes less). A step forward of more than ``retention.ms`` would
make it delete at once what is younger than its limit by the true time; Kafka does that. Here
a step forward reaches the logs no faster than the monotonic clock runs, times
:data:`CATCH_UP_RATE`: a clock that was behind (and is set right) is caught up within as long
as the step, and a step that is undone within that time (a bad NTP answer, a mistyped date)
never deletes anything.

    >>> clock = SteadyWallClock()
    >>> abs(clock() - time.time_ns() // 1_000_000) < 1_000
    True
"""

from __future__ import annotations

import threading
import time

#: How fast (wall ms per monotonic ms) the clock catches up with a wall clock stepped forward.
CATCH_UP_RATE = 2


class SteadyWallClock:
    """Milliseconds since the epoch: the wall clock, except that it never runs ahead of the
    monotonic clock times :data:`CATCH_UP_RATE` (a step back is followed at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mono_ms = time.monotonic_ns() // 1_000_000
        self._now_ms = time.time_ns() // 1_000_000

    def __call__(self) -> int:
        with self._lock:
            wall = time.time_ns() // 1_000_000
            mono = time.monotonic_ns() // 1_000_000
            ahead = self._now_ms + (mono - self._mono_ms) * CATCH_UP_RATE
            self._mono_ms = mono
            self._now_ms = min(wall, ahead)
            return self._now_ms


class MonotonicWallClock:
    """Milliseconds since the epoch: the wall clock when it was made, advanced by the
    monotonic clock. No step of the wall clock moves it (nor does a correction of a wrong
    clock: it keeps the offset it was made with until the process restarts), so a deadline in
    it is a deadline in the monotonic clock, and its times compare with other nodes' wall
    clocks as the wall clock did when it was made."""

    def __init__(self) -> None:
        self._origin_ms = time.time_ns() // 1_000_000 - time.monotonic_ns() // 1_000_000

    def __call__(self) -> int:
        return self._origin_ms + time.monotonic_ns() // 1_000_000


#: The clock of every log in this process (its start is the process's start, so a log opened
#: during a step forward does not take the step with it).
steady_wall_ms = SteadyWallClock()
