"""What many test modules (and the chaos harness) need, kept once: unique names, free ports,
polling a condition with a deadline, a worker SIGKILLed again and again while it runs, and a
broker registered with an in-process controller as a started broker is (unfenced).

    topic = unique_name("orders")                       # "orders-1f0c9a7e"
    wait_until(lambda: broker.alive, message="the broker up")

Reading a topic back is in :mod:`tests.readback`; wire-level reads (a raw Fetch loop) in
:mod:`tests.wire`; broker processes in :mod:`tests.cluster`.
"""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from replication.controller.controller import Controller
    from replication.metadata.image import BrokerInfo

T = TypeVar("T")

#: the repository's root: test workers run with it as their working directory and path
REPO = Path(__file__).resolve().parent.parent


def unique_name(prefix: str = "t") -> str:
    """``<prefix>-<8 hex digits>``: a topic (or transactional id, bucket...) no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago. Another process may take it before
    the caller binds it: callers that cannot use port 0 retry on a failed start."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(
    # Callable[..., ...]: mypy infers no type for a lambda binding a loop variable as a default
    # argument (``lambda i=i: ...``) against Callable[[], ...]. It is called with no argument.
    condition: Callable[..., T | None],
    timeout: float = 30,
    interval: float = 0.02,
    message: str = "",
) -> T:
    """Poll ``condition()`` until it returns a truthy value (returned) or fail after ``timeout``
    seconds with an AssertionError naming ``message``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or condition}")
        time.sleep(interval)


def kill_while_running_then_finish(
    start: Callable[[], subprocess.Popen[bytes]],
    output: Callable[[], list[bytes]],
    total: int,
    started: list[subprocess.Popen[bytes]],
    *,
    kills: int = 3,
    progress: int = 200,
) -> list[bytes]:
    """SIGKILL a worker ``kills`` times, each once ``output()`` has grown by ``progress``
    records since its start (most likely inside a transaction), then start it once more and
    wait for ``total`` records of output, which is returned. Every worker started is appended
    to ``started``, for the caller to stop the last one."""
    for kill in range(kills):
        started.append(start())
        before = len(output())
        wait_until(
            lambda before=before: len(output()) > before + progress,
            timeout=90,
            message=f"progress before kill {kill + 1}",
        )
        started[-1].kill()
        started[-1].wait()
    started.append(start())
    wait_until(lambda: len(output()) >= total, timeout=120, message=f"all {total} records")
    return output()


class LineWorker:
    """``python -m <module> <args>`` (a test worker) as a subprocess, its stdout read line by
    line on a thread: :meth:`next_line` waits for the next one, :meth:`kill` SIGKILLs it and
    :meth:`rest` gives what it printed but was not read."""

    def __init__(self, module: str, args: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        command = [sys.executable, "-m", module, *args]
        self.proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put("EOF")

    def next_line(self, timeout: float = 60) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the worker printed nothing for {timeout} s") from None
        assert line != "EOF", f"the worker exited with {self.proc.wait()}"
        return line

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._reader.join(60)
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def rest(self) -> list[str]:
        """After :meth:`kill`: the lines printed but not read yet."""
        out = []
        while (line := self.lines.get_nowait()) != "EOF":
            out.append(line)
        return out


def register_live(
    controller: Controller,
    broker_id: int,
    host: str,
    port: int,
    rack: str | None = None,
    incarnation: str = "",
    endpoints: tuple[tuple[str, str, int], ...] = (),
) -> BrokerInfo:
    """Register a broker with an in-process controller, then heartbeat as a broker that
    read the metadata of its registration does: the controller registers a broker fenced and
    unfences it at that heartbeat (as a broker process's start does). Returns it unfenced."""
    info = controller.register_broker(broker_id, host, port, rack, incarnation, endpoints)
    return controller.heartbeat(broker_id, info.epoch, controller.image.version)
