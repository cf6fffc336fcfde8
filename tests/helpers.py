"""What many test modules (and the chaos harness) need, kept once: unique names, free ports,
and polling a condition with a deadline.

    topic = unique_name("orders")                       # "orders-1f0c9a7e"
    wait_until(lambda: broker.alive, message="the broker up")

Reading a topic back is in :mod:`tests.readback`; wire-level reads (a raw Fetch loop) in
:mod:`tests.wire`; broker processes in :mod:`tests.cluster`.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


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
