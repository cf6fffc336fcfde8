"""The floor under a synchronous acks=all send on this machine: the message pattern alone.

A sync acks=all send to a 3-replica partition crosses four processes: the client sends the
batch to the leader; the leader answers both followers' parked fetches with it; each follower
makes it durable in its own store and fetches again from the next offset; the leader, once its
own store and both followers hold the batch, answers the client. This benchmark runs exactly
that pattern with no replog code at all: four Python processes on 127.0.0.1 (asyncio event
loops, length-prefixed frames, one writer thread per broker that makes each write durable and
completes it on the loop, as replog's WAL writer does), so the figure is what the language, the
event loop, the thread hand-offs and the machine's cores and disk cost before any of replog's
own work (codecs, sessions, logs, checks). replog's sync p50 minus this floor is replog's share.

The durable write is measured three ways, on the same disk, in the same run:

- ``new_object``: each write is a new object through logstore's LocalStorage (temp file,
  fsync, rename, directory fsync): what a WAL object write on local files does today;
- ``prewritten``: ``pwrite`` into space written and synced beforehand, then ``fdatasync``:
  a write that changes no file-system metadata, so it needs no journal commit;
- ``none``: no write (the process and network path alone).

    python benchmarks/acks_floor.py [--records 2000] [--dir DIR]

prints one JSON line: p50/p99/p99.9 per way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.peers.nats import percentiles
from logstore.storage import Storage

WAYS = ("new_object", "prewritten", "none")
_SIZE = struct.Struct(">I")
#: pre-written space per broker for ``prewritten`` (reused round robin)
_PREWRITTEN_BYTES = 16 << 20


def _frame(body: bytes) -> bytes:
    return _SIZE.pack(len(body)) + body


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = _SIZE.unpack(await reader.readexactly(4))
    return await reader.readexactly(size)


def _durable_write(way: str, root: Path) -> Callable[[bytes], None]:
    root.mkdir(parents=True, exist_ok=True)
    if way == "new_object":
        storage = Storage.from_url(root.as_uri())
        count = iter(range(1 << 62))
        return lambda data: storage.write(f"{next(count):020d}.obj", data)
    if way == "prewritten":
        fd = os.open(root / "prewritten", os.O_RDWR | os.O_CREAT, 0o644)
        os.write(fd, bytes(_PREWRITTEN_BYTES))
        os.fsync(fd)
        position = 0

        def write(data: bytes) -> None:
            nonlocal position
            if position + len(data) > _PREWRITTEN_BYTES:
                position = 0
            os.pwrite(fd, data, position)
            os.fdatasync(fd)
            position += len(data)

        return write
    return lambda data: None


class _Writer:
    """One I/O thread: woken per write, makes it durable, completes it on the event loop."""

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._write = write
        self._ready = threading.Condition()
        self._queue: list[tuple[bytes, asyncio.Future[None]]] = []
        threading.Thread(target=self._run, daemon=True).start()

    def submit(self, data: bytes) -> asyncio.Future[None]:
        done = self._loop.create_future()
        with self._ready:
            self._queue.append((data, done))
            self._ready.notify()
        return done

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue:
                    self._ready.wait()
                items, self._queue = self._queue, []
            self._write(b"".join(data for data, _ in items))
            for _, done in items:
                self._loop.call_soon_threadsafe(done.set_result, None)


async def _leader(port: int, write: Callable[[bytes], None], followers: int) -> None:
    writer = _Writer(write)
    log: list[bytes] = []
    durable = 0
    acked: dict[int, int] = {}
    new_data = asyncio.Event()
    waiting: list[tuple[int, asyncio.Future[None]]] = []

    def settle() -> None:
        if len(acked) < followers:
            return
        hw = min(durable, *acked.values())
        for item in [w for w in waiting if w[0] <= hw]:
            waiting.remove(item)
            item[1].set_result(None)

    async def own(end: int, data: bytes) -> None:
        nonlocal durable
        await writer.submit(data)
        durable = max(durable, end)
        settle()

    async def serve(reader: asyncio.StreamReader, out: asyncio.StreamWriter) -> None:
        try:
            await exchange(reader, out)
        except (ConnectionError, asyncio.IncompleteReadError):
            out.close()  # a follower or the producer went: the run is over

    async def exchange(reader: asyncio.StreamReader, out: asyncio.StreamWriter) -> None:
        nonlocal new_data
        hello = await _read_frame(reader)
        if hello.startswith(b"F"):  # a follower: fetch offset in, batches from it out
            follower = int(hello[1:])
            while True:
                offset = int(await _read_frame(reader))
                acked[follower] = offset
                settle()
                while offset >= len(log):
                    await new_data.wait()
                out.write(_frame(b"".join(log[offset:])))
        else:  # the producer: one batch in, its ack out once the ISR holds it
            while True:
                data = await _read_frame(reader)
                log.append(data)
                end = len(log)
                new_data.set()
                new_data = asyncio.Event()
                acked_end = asyncio.get_running_loop().create_future()
                waiting.append((end, acked_end))
                task = asyncio.ensure_future(own(end, data))
                await acked_end
                await task
                out.write(_frame(b"ok"))

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


async def _follower(port: int, write: Callable[[bytes], None], index: int) -> None:
    writer = _Writer(write)
    reader, out = await asyncio.open_connection("127.0.0.1", port)
    out.write(_frame(b"F%d" % index))
    offset = 0
    while True:
        out.write(_frame(b"%d" % offset))
        data = await _read_frame(reader)
        await writer.submit(data)
        offset += 1  # one batch per response: the producer sends one at a time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError("the floor's leader closed the connection")
        buf += chunk
    return bytes(buf)


def run_way(way: str, root: Path, records: int, warmup: int, value_bytes: int) -> dict[str, Any]:
    """The pattern with one way of writing: p50/p99 of ``records`` sync sends."""
    port = _free_port()
    me = [sys.executable, str(Path(__file__).resolve())]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        leader = subprocess.Popen(
            [*me, "--role", "leader", "--port", str(port), "--way", way, "--dir", str(root / "l")],
            stdout=subprocess.PIPE,
        )
        procs.append(leader)
        assert leader.stdout is not None
        if leader.stdout.readline().strip() != b"ready":
            raise RuntimeError("the floor's leader did not start")
        for i in range(2):
            procs.append(
                subprocess.Popen(
                    [*me, "--role", "follower", "--port", str(port), "--way", way,
                     "--dir", str(root / f"f{i}"), "--index", str(i)]
                )
            )  # fmt: skip
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(_frame(b"P"))
            # a record batch's size: replog's header plus the Arrow payload of one value
            batch = _frame(os.urandom(value_bytes + 400))
            lat: list[float] = []
            for i in range(warmup + records):
                s = time.perf_counter()
                sock.sendall(batch)
                (size,) = _SIZE.unpack(_recv_exactly(sock, 4))
                _recv_exactly(sock, size)
                if i >= warmup:
                    lat.append((time.perf_counter() - s) * 1000)
        return {"records": records, **percentiles(lat)}
    finally:
        for proc in reversed(procs):  # the followers first: the leader's close ends nothing
            proc.kill()
            proc.wait()


def run(root: Path, records: int, warmup: int = 200, value_bytes: int = 100) -> dict[str, Any]:
    """Every way, one after another, under ``root`` (removed after)."""
    try:
        return {way: run_way(way, root / way, records, warmup, value_bytes) for way in WAYS}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=2_000)
    parser.add_argument("--warmup-records", type=int, default=200)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--dir", default=None, help="where the writes go (the disk measured)")
    parser.add_argument("--role", choices=("leader", "follower"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role is not None:
        write = _durable_write(args.way, Path(args.dir))
        try:
            if args.role == "leader":
                asyncio.run(_leader(args.port, write, followers=2))
            else:
                asyncio.run(_follower(args.port, write, args.index))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the run is over: its leader went first
        return
    root = Path(tempfile.mkdtemp(prefix="replog-bench-acks-floor-", dir=args.dir))
    result = run(root, args.records, args.warmup_records, args.value_bytes)
    print(json.dumps({"benchmark": "acks_floor", **result}))


if __name__ == "__main__":
    main()
