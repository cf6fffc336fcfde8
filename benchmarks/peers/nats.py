"""The latency peer: a 3-node NATS JetStream cluster on 127.0.0.1, driven by nats-py.

Why NATS: a replicated, file-backed log (JetStream, stream replicas=3) that is packaged in
Debian (``nats-server``) and has a Python client (nats-py, the ``bench`` extra), so the client
overheads compare with replog's Python client on the same machine in the same run.

:func:`find_nats_server` finds ``nats-server`` on PATH (or /usr/sbin), else installs Debian's
package with apt-get when running as root, else says why it is not available.
:class:`NatsCluster` writes three config files (client, route and monitoring ports, a
``store_dir`` each on the given directory, i.e. the same disk as replog's logs), starts the
servers and waits for ``/healthz``. :func:`run_workloads` runs the same workloads as
benchmarks/latency.py runs on replog: synchronous publishes (``await js.publish`` waits for the
stream's PubAck), a bounded max-rate window of outstanding publishes, a throttled half-rate
run, and the servers' idle CPU.

What JetStream's ack means, printed with the figures (:data:`HONESTY_NOTE`): the PubAck comes
once the stream's Raft group has the message on a *quorum* (2 of 3) of servers, and the file
store does not fsync each message (it writes to the OS at once and syncs in the background;
nats-server 2.10+ exposes the interval as ``jetstream.sync_interval``, whose ``always`` fsyncs
every write; :func:`accepts_sync_always` checks whether this binary takes it). replog's
acks=all answers once *every* ISR member has the batch in its store with fsync.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HONESTY_NOTE = (
    "JetStream acknowledges a publish once a quorum (2 of 3) of the stream's replicas has it,"
    " and its file store does not fsync per message (OS write at once, background sync);"
    " replog's acks=all waits for every ISR member's fsync'd write. Both use a Python client"
    " (nats-py / replog's Producer) on the same machine, same disk, same run."
)


def find_nats_server() -> tuple[str | None, str]:
    """``(path, how)``: the nats-server binary and how it was found, or ``(None, why not)``."""
    for candidate in (shutil.which("nats-server"), "/usr/sbin/nats-server", "/usr/bin/nats-server"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate, "found on PATH"
    if os.geteuid() != 0:
        return None, "not available: nats-server is not installed and this is not root (apt-get)"
    if shutil.which("apt-get") is None:
        return None, "not available: nats-server is not installed and there is no apt-get"
    done = subprocess.run(
        ["apt-get", "install", "-y", "nats-server"],
        capture_output=True,
        text=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
    path = shutil.which("nats-server") or "/usr/sbin/nats-server"
    if done.returncode != 0 or not os.access(path, os.X_OK):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
        return None, f"not available: apt-get install nats-server failed: {tail[0]}"
    return path, "installed now with apt-get install -y nats-server"


def server_version(binary: str) -> str:
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    return (done.stdout or done.stderr).strip()


def accepts_sync_always(binary: str) -> tuple[bool, str]:
    """Whether this nats-server accepts ``jetstream { sync_interval: always }`` (``-t``)."""
    with tempfile.TemporaryDirectory(prefix="replog-bench-nats-check-") as tmp:
        conf = Path(tmp) / "check.conf"
        conf.write_text(
            f'listen: "127.0.0.1:{free_port()}"\n'
            f'jetstream {{ store_dir: "{tmp}/js", sync_interval: always }}\n'
        )
        done = subprocess.run(
            [binary, "-c", str(conf), "-t"], capture_output=True, text=True, timeout=30
        )
    answer = (done.stderr or done.stdout).strip().replace(str(conf), "<conf>")
    return done.returncode == 0, answer or "configuration ok"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class NatsCluster:
    """Three nats-server processes with JetStream, routed to each other."""

    def __init__(self, binary: str, work: Path, *, sync_always: bool = False) -> None:
        self.binary = binary
        self.work = work
        self.sync_always = sync_always
        self.client_ports = [free_port() for _ in range(3)]
        self.route_ports = [free_port() for _ in range(3)]
        self.http_ports = [free_port() for _ in range(3)]
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{p}" for p in self.client_ports]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _config(self, i: int) -> str:
        routes = ", ".join(
            f'"nats-route://127.0.0.1:{p}"' for j, p in enumerate(self.route_ports) if j != i
        )
        sync = ", sync_interval: always" if self.sync_always else ""
        return (
            f'server_name: "n{i}"\n'
            f'listen: "127.0.0.1:{self.client_ports[i]}"\n'
            f'http: "127.0.0.1:{self.http_ports[i]}"\n'
            f'jetstream {{ store_dir: "{self.work / f"n{i}"}"{sync} }}\n'
            f'cluster {{ name: "bench", listen: "127.0.0.1:{self.route_ports[i]}",'
            f" routes: [{routes}] }}\n"
        )

    def start(self, timeout: float = 60) -> NatsCluster:
        self.work.mkdir(parents=True, exist_ok=True)
        for i in range(3):
            conf = self.work / f"n{i}.conf"
            conf.write_text(self._config(i))
            log = open(self.work / f"n{i}.log", "wb")  # noqa: SIM115 - the child owns it
            self.procs.append(
                subprocess.Popen([self.binary, "-c", str(conf)], stdout=log, stderr=log)
            )
            log.close()
        deadline = time.monotonic() + timeout
        for port in self.http_ports:
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                        break
                except OSError as e:
                    if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                        self.stop()
                        raise RuntimeError(
                            f"nats-server did not become healthy ({e}); see {self.work}"
                        ) from e
                    time.sleep(0.1)
        return self

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def percentiles(ms: list[float]) -> dict[str, float]:
    """p50/p99/p99.9/max of latencies in ms (nearest rank)."""
    if not ms:
        return {}
    s = sorted(ms)

    def at(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * len(s)))], 3)

    return {"p50_ms": at(0.50), "p99_ms": at(0.99), "p999_ms": at(0.999), "max_ms": round(s[-1], 3)}


async def _workloads(urls: list[str], args: Any) -> dict[str, Any]:
    import nats

    nc = await nats.connect(servers=urls)
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + 60
        while True:  # the meta leader may still be in election
            try:
                await js.add_stream(
                    name="BENCH", subjects=["bench.>"], num_replicas=3, storage="file"
                )
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        payload = os.urandom(args.value_bytes)
        out: dict[str, Any] = {}
        for _ in range(args.warmup_records):
            await js.publish("bench.x", payload)

        # Synchronous: one publish at a time, each waiting for its PubAck.
        lat: list[float] = []
        t0 = time.perf_counter()
        for _ in range(args.sync_records):
            s = time.perf_counter()
            await js.publish("bench.x", payload)
            lat.append((time.perf_counter() - s) * 1000)
        elapsed = time.perf_counter() - t0
        out["sync"] = {
            "records": len(lat),
            "records_per_s": round(len(lat) / elapsed),
            **percentiles(lat),
        }

        async def paced(rate: float | None, seconds: float, window: int) -> dict[str, Any]:
            """Publishes for ``seconds``: at ``rate``/s, or (None) as fast as ``window``
            outstanding publishes allow; latency from the publish call to its PubAck."""
            sem = asyncio.Semaphore(window)
            lat: list[float] = []
            errors = 0
            tasks: set[asyncio.Task[None]] = set()

            async def one() -> None:
                nonlocal errors
                s = time.perf_counter()
                try:
                    await js.publish("bench.x", payload)
                    lat.append((time.perf_counter() - s) * 1000)
                except Exception:
                    errors += 1
                finally:
                    sem.release()

            start = time.perf_counter()
            sent = 0
            while time.perf_counter() - start < seconds:
                await sem.acquire()
                task = asyncio.create_task(one())
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent += 1
                if rate is not None:
                    ahead = start + sent / rate - time.perf_counter()
                    if ahead > 0:
                        await asyncio.sleep(ahead)
            await asyncio.gather(*tasks)
            elapsed = time.perf_counter() - start
            result = {
                "records": len(lat),
                "records_per_s": round(len(lat) / elapsed),
                "mb_per_s": round(len(lat) * args.value_bytes / elapsed / 1e6, 2),
                "errors": errors,
                **percentiles(lat),
            }
            if rate is not None:
                result["target_records_per_s"] = round(rate)
            else:
                result["outstanding_window"] = window
            return result

        out["max_rate"] = await paced(None, args.max_seconds, args.nats_window)
        half = out["max_rate"]["records_per_s"] / 2
        out["half_rate"] = await paced(half, args.half_rate_seconds, 10 * args.nats_window)
        return out
    finally:
        await nc.close()


def run_workloads(urls: list[str], args: Any) -> dict[str, Any]:
    """Sync, max-rate and half-rate publishes against the cluster at ``urls`` (see module)."""
    return asyncio.run(_workloads(urls, args))
