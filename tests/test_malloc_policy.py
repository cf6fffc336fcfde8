"""A node's malloc policy: after a freed block of megabytes, the next large blocks still get
pages of their own (glibc would have raised its mmap threshold and taken them from the heap,
where they fragment it: a broker's RSS then grew with the bytes written)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

#: In a fresh interpreter: free an 8 MiB block (glibc raises its threshold to 8 MiB), then
#: allocate a 5 MiB one, and print how many more blocks malloc then holds mmapped (mallinfo2's
#: hblks).
PROBE = """
import ctypes, sys
from replication.server.malloc_policy import apply_malloc_policy
class MallInfo2(ctypes.Structure):
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(n, ctypes.c_size_t) for n in names.split()]
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "policy":
    assert apply_malloc_policy()
libc.free(libc.malloc(8 << 20))
before = libc.mallinfo2().hblks
block = libc.malloc(5 << 20)
print(libc.mallinfo2().hblks - before)
"""


def mmapped_blocks(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, timeout=60
    )
    return int(out.stdout.split()[-1])


def test_large_blocks_keep_their_own_pages_after_a_larger_one_is_freed() -> None:
    assert mmapped_blocks("glibc") == 0  # glibc alone: the 5 MiB block came from the heap
    assert mmapped_blocks("policy") == 1
