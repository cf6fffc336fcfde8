"""The nemesis: a seeded plan of faults, carried out one after another against a ChaosCluster.

:func:`plan` turns a seed into a list of :class:`PlannedFault`: the classes (a shuffled cycle
of the classes asked for, so each appears before any repeats), the random numbers each fault
will use, and the healthy gap after it. Targets depend on the run (who leads which partition
when the fault starts), so :class:`Nemesis` looks them up through the Admin client and picks
among them with the planned numbers: the same seed makes the same choices in the same cluster
state. Every fault ends with :meth:`ChaosCluster.heal`.

Fault classes (S = broker.session.timeout.ms, 3 s here):

==========================  =================================================================
kill_restart_now            SIGKILL a broker (often a leader), restart it at once
kill_restart_later          SIGKILL a broker, restart it after S + 0.5..2.5 s
pause_short                 SIGSTOP a broker for 0.5..2 s (< S), then SIGCONT
pause_long                  SIGSTOP a broker for S + 1..3 s (> S: it is fenced)
crash_restart_while_paused  SIGSTOP a follower of a partition, 0.1..0.5 s later SIGKILL that
                            partition's leader and restart it at once; the follower resumes
                            1.5..1.9 s after its pause (< S: it stays in the ISR)
two_faults                  two of the single-broker faults at once, on different brokers
controller_kill             SIGKILL the active controller, restart it after S + 0.5..3 s
coordinator_kill            SIGKILL the leader of __transaction_state-0, restart it at once
                            or after S + 0.5..2 s
net_cut                     the broker's proxies cut every connection and refuse new ones
                            for 1..5 s
net_stall                   the broker's proxies hold every frame for 1..5 s
storage_fail                the broker's log storage fails every write for 1..4 s
storage_stall               every write of the broker's log storage waits 0.3..1.5 s, for 2..5 s
storage_tear                the broker's log storage tears every write (stores a prefix, then
                            raises) for 0.3..1.5 s; often the broker is SIGKILLed while its
                            writes tear, and restarted on what they left
disk_full                   the broker's disk (a tmpfs) fills up to 0..8 KiB of free space for
                            1..4 s (sometimes it is SIGKILLed then, and restarted), then the space
                            is freed; the fault lasts until the broker is back in every ISR
                            (needs ``disk_mb`` set on the cluster)
clock_jump                  the wall clock of one node (a partition's leader, the active
                            controller or the transaction coordinator) steps 6..10 minutes
                            forward or back, for 2..5 s, then steps back to the true time
                            (needs ``fake_clocks`` set on the cluster)
net_partition               packets between nodes are dropped (nftables, each node in a network
                            namespace of its own) for 1..6 s: a broker cut off from every other
                            node, or one broker's packets to another dropped one way, or two
                            brokers cut from each other while both reach the third and the
                            controllers (needs ``netns`` set on the cluster)
controller_isolated         the active controller's packets to and from every other node are
                            dropped for 2..6 s (the standby takes over; needs ``netns``)
wipe_restart                SIGKILL a broker (often a leader), empty its log storage (a new
                            disk), restart it; the fault lasts until it is back in every ISR
==========================  =================================================================
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from logstore.errors import ReplogError
from replication.client import Admin, PartitionInfo
from tests.chaos.cluster import SESSION_TIMEOUT_S, ChaosCluster
from tests.chaos.history import Fault, History
from tests.chaos.netns import NetworkLab

S = SESSION_TIMEOUT_S
TRANSACTION_TOPIC = "__transaction_state"

#: Faults that act on one broker; two_faults runs two of them at once.
BROKER_FAULTS = (
    "kill_restart_now",
    "kill_restart_later",
    "pause_short",
    "pause_long",
    "net_cut",
    "net_stall",
    "storage_fail",
    "storage_stall",
    "storage_tear",
)
FAULT_CLASSES = (
    *BROKER_FAULTS,
    "crash_restart_while_paused",
    "two_faults",
    "controller_kill",
    "coordinator_kill",
    # not in two_faults: two empty stores at once can hold the only copies of an acked batch
    "wipe_restart",
    # needs the brokers on disks of their own (ChaosCluster's disk_mb)
    "disk_full",
    # needs the nodes under libfaketime (ChaosCluster's fake_clocks)
    "clock_jump",
    # need every node in a network namespace of its own (ChaosCluster's netns)
    "net_partition",
    "controller_isolated",
)
#: The shapes of net_partition.
PARTITION_SHAPES = ("isolated", "one_way", "bridge")
#: The roles whose node's clock clock_jump steps.
CLOCK_ROLES = ("broker", "controller", "coordinator")
#: How long a wiped broker may take to rebuild its replicas from its peers and rejoin every ISR.
REJOIN_TIMEOUT_S = 60.0
#: Random numbers drawn per planned fault (each in [0, 1)).
DRAWS = 8


@dataclass(frozen=True)
class PlannedFault:
    fault_class: str
    #: numbers in [0, 1) the fault uses to pick its targets and durations
    draws: tuple[float, ...]
    #: seconds of health after the fault is healed
    gap_s: float


def plan(seed: int, classes: Sequence[str], count: int) -> list[PlannedFault]:
    """``count`` faults for ``seed``: shuffled cycles over ``classes``."""
    unknown = sorted(set(classes) - set(FAULT_CLASSES))
    if unknown or not classes:
        raise ValueError(f"unknown fault classes {unknown}; expected some of {FAULT_CLASSES}")
    rng = random.Random(seed)
    out: list[PlannedFault] = []
    while len(out) < count:
        cycle = list(classes)
        rng.shuffle(cycle)
        out += [
            PlannedFault(c, tuple(rng.random() for _ in range(DRAWS)), rng.uniform(1.0, 2.5))
            for c in cycle
        ]
    return out[:count]


def _between(draw: float, low: float, high: float) -> float:
    return round(low + draw * (high - low), 2)


def _pick(draw: float, items: Sequence[Any]) -> Any:
    return items[min(int(draw * len(items)), len(items) - 1)]


class Nemesis:
    """Carries out planned faults against ``cluster``; appends each to ``history.faults``."""

    def __init__(self, cluster: ChaosCluster, topic: str, partitions: int, history: History):
        self.cluster = cluster
        self.topic = topic
        self.partitions = partitions
        self.history = history
        self.admin = Admin(
            bootstrap_servers=cluster.bootstrap,
            request_timeout_ms=3000,
            default_api_timeout_ms=4000,
        )

    def close(self) -> None:
        self.admin.close()

    def run(self, planned: Sequence[PlannedFault], duration_s: float) -> None:
        """Carry out ``planned`` in order, starting no fault after ``duration_s``."""
        start = time.monotonic()
        for fault in planned:
            if time.monotonic() - start >= duration_s:
                return
            began = time.monotonic()
            detail = self.inject(fault.fault_class, fault.draws)
            not_started = self.cluster.heal()
            if not_started:
                detail["not_restarted"] = not_started
            self.history.faults.append(Fault(fault.fault_class, began, time.monotonic(), detail))
            time.sleep(fault.gap_s)

    def inject(self, fault_class: str, draws: Sequence[float]) -> dict[str, Any]:
        """Inject one fault (not healed yet); returns what was done to whom."""
        if fault_class == "crash_restart_while_paused":
            return self._crash_restart_while_paused(draws)
        if fault_class == "two_faults":
            return self._two_faults(draws)
        if fault_class == "controller_kill":
            return self._controller_kill(draws)
        if fault_class == "coordinator_kill":
            return self._coordinator_kill(draws)
        if fault_class == "wipe_restart":
            return self._wipe_restart(self._target(draws[0], draws[1]))
        if fault_class == "net_partition":
            return self._net_partition(draws)
        if fault_class == "controller_isolated":
            return self._controller_isolated(draws)
        if fault_class == "clock_jump":
            return self._clock_jump(draws)
        if fault_class == "disk_full":
            return self._disk_full(self._target(draws[0], draws[1]), draws[2:])
        return self._broker_fault(fault_class, self._target(draws[0], draws[1]), draws[2:])

    # --- targets --------------------------------------------------------------------------

    def _partition(self, topic: str, index: int) -> PartitionInfo | None:
        try:
            return self.admin.describe_topic(topic).partitions[index]
        except (ReplogError, IndexError):
            return None

    def _target(self, which: float, partition: float) -> int:
        """Mostly the leader of a partition of the topic (0.6 of the time), else any broker."""
        brokers = sorted(self.cluster.brokers)
        if which < 0.6:
            info = self._partition(self.topic, int(partition * self.partitions))
            if info is not None and info.leader in self.cluster.brokers:
                return info.leader
        return int(_pick(partition, brokers))

    # --- faults ---------------------------------------------------------------------------

    def _broker_fault(
        self, fault_class: str, broker: int, draws: Sequence[float]
    ) -> dict[str, Any]:
        cluster = self.cluster
        detail: dict[str, Any] = {"broker": broker}
        name = f"broker-{broker}"
        if fault_class in ("kill_restart_now", "kill_restart_later"):
            delay = (
                0.0 if fault_class == "kill_restart_now" else _between(draws[0], S + 0.5, S + 2.5)
            )
            detail.update(self._kill_restart(name, delay))
        elif fault_class in ("pause_short", "pause_long"):
            low, high = (0.5, S - 1.0) if fault_class == "pause_short" else (S + 1.0, S + 3.0)
            detail["pause_s"] = _between(draws[0], low, high)
            cluster.pause(name)
            time.sleep(detail["pause_s"])
            cluster.resume(name)
        elif fault_class in ("net_cut", "net_stall"):
            detail["seconds"] = _between(draws[0], 1.0, 5.0)
            proxies = cluster.broker_proxies(broker)
            if fault_class == "net_cut":
                detail["connections_cut"] = sum(proxy.block() for proxy in proxies)
                time.sleep(detail["seconds"])
                for proxy in proxies:
                    proxy.unblock()
            else:
                for proxy in proxies:
                    proxy.pause()
                time.sleep(detail["seconds"])
                for proxy in proxies:
                    proxy.resume()
        elif fault_class == "storage_fail":
            detail["seconds"] = _between(draws[0], 1.0, 4.0)
            self._storage_window(broker, [{"kind": "fail", "op": "write"}], detail["seconds"])
        elif fault_class == "storage_stall":
            detail["seconds"] = _between(draws[0], 2.0, 5.0)
            detail["write_delay_s"] = _between(draws[1], 0.3, 1.5)
            stall = {"kind": "stall", "op": "write", "seconds": detail["write_delay_s"]}
            self._storage_window(broker, [stall], detail["seconds"])
        elif fault_class == "storage_tear":
            detail["seconds"] = _between(draws[0], 0.3, 1.5)
            detail["fraction"] = _between(draws[1], 0.1, 0.9)
            detail["killed_while_tearing"] = draws[2] < 0.6
            tear = {"kind": "tear", "op": "write", "fraction": detail["fraction"]}
            cluster.set_storage_faults(broker, [tear])
            time.sleep(detail["seconds"])
            if detail["killed_while_tearing"]:
                cluster.brokers[broker].kill()
            cluster.set_storage_faults(broker, [])
            if detail["killed_while_tearing"]:
                detail.update(self._restart(name))
        else:
            raise ValueError(f"{fault_class} is not a single-broker fault")
        return detail

    def _storage_window(self, broker: int, faults: list[dict[str, Any]], seconds: float) -> None:
        self.cluster.set_storage_faults(broker, faults)
        time.sleep(seconds)
        self.cluster.set_storage_faults(broker, [])

    def _kill_restart(self, name: str, delay_s: float) -> dict[str, Any]:
        self.cluster.processes()[name].kill()
        time.sleep(delay_s)
        return {"restart_after_s": delay_s, **self._restart(name)}

    def _restart(self, name: str) -> dict[str, Any]:
        """Start a process again; how long until it was ready (or why it did not start: the
        heal that follows tries again)."""
        began = time.monotonic()
        try:
            self.cluster.processes()[name].start()
        except RuntimeError as err:
            return {"restart_failed": str(err)[-500:]}
        return {"ready_after_s": round(time.monotonic() - began, 2)}

    def _crash_restart_while_paused(self, draws: Sequence[float]) -> dict[str, Any]:
        cluster = self.cluster
        index = int(draws[0] * self.partitions)
        info = self._partition(self.topic, index)
        brokers = sorted(cluster.brokers)
        leader = (
            info.leader if info is not None and info.leader in brokers else _pick(draws[1], brokers)
        )
        followers = [b for b in (info.isr if info else ()) if b != leader] or [
            b for b in brokers if b != leader
        ]
        follower = _pick(draws[2], followers)
        pause_s = _between(draws[3], 1.5, 1.9)
        kill_after_s = _between(draws[4], 0.1, 0.5)
        paused = f"broker-{follower}"
        cluster.pause(paused)
        resume = threading.Timer(pause_s, cluster.resume, args=(paused,))
        resume.start()
        time.sleep(kill_after_s)
        detail = {
            "partition": f"{self.topic}-{index}",
            "leader": leader,
            "leader_epoch": info.leader_epoch if info is not None else None,
            "isr": list(info.isr) if info is not None else None,
            "paused_follower": follower,
            "pause_s": pause_s,
            "kill_after_s": kill_after_s,
            **self._kill_restart(f"broker-{leader}", 0.0),
        }
        resume.join()
        return detail

    def _two_faults(self, draws: Sequence[float]) -> dict[str, Any]:
        first = self._target(draws[0], draws[1])
        second = _pick(draws[2], [b for b in sorted(self.cluster.brokers) if b != first])
        classes = [_pick(draws[3], BROKER_FAULTS), _pick(draws[4], BROKER_FAULTS)]
        jobs: list[Callable[[], dict[str, Any]]] = [
            lambda: self._broker_fault(classes[0], first, draws[5:]),
            lambda: self._broker_fault(classes[1], second, [*draws[6:], *draws[:2]]),
        ]
        with ThreadPoolExecutor(2) as pool:
            details = list(pool.map(lambda job: job(), jobs))
        return {"faults": [{"class": c, **d} for c, d in zip(classes, details, strict=True)]}

    def _controller_kill(self, draws: Sequence[float]) -> dict[str, Any]:
        active = self.cluster.active_controller()
        if active not in self.cluster.controllers:
            active = _pick(draws[0], sorted(self.cluster.controllers))
        delay = _between(draws[1], S + 0.5, S + 3.0)
        return {"controller": active, **self._kill_restart(f"controller-{active}", delay)}

    def _coordinator(self, draw: float) -> int:
        """The transaction coordinator's broker (the leader of __transaction_state-0), or a
        broker picked with ``draw`` if it has none now."""
        info = self._partition(TRANSACTION_TOPIC, 0)
        brokers = sorted(self.cluster.brokers)
        return info.leader if info is not None and info.leader in brokers else _pick(draw, brokers)

    def _coordinator_kill(self, draws: Sequence[float]) -> dict[str, Any]:
        leader = self._coordinator(draws[0])
        delay = 0.0 if draws[1] < 0.5 else _between(draws[2], S + 0.5, S + 2.0)
        return {"broker": leader, **self._kill_restart(f"broker-{leader}", delay)}

    def _wipe_restart(self, broker: int) -> dict[str, Any]:
        name = f"broker-{broker}"
        self.cluster.brokers[broker].kill()
        detail: dict[str, Any] = {"broker": broker, "files_wiped": self.cluster.wipe_store(broker)}
        detail.update(self._restart(name))
        return {**detail, **self._until_in_every_isr(broker)}

    def _disk_full(self, broker: int, draws: Sequence[float]) -> dict[str, Any]:
        disk = self.cluster.disks.get(broker)
        if disk is None:
            raise ValueError("disk_full needs a cluster whose brokers have disks (disk_mb)")
        proc = self.cluster.brokers[broker]
        stderr_before = proc.stderr_path.stat().st_size
        detail: dict[str, Any] = {
            "broker": broker,
            "seconds": _between(draws[0], 1.0, 4.0),
            "left_bytes": int(draws[1] * 8 * 1024),
            "killed_while_full": draws[2] < 0.3,
        }
        detail["filled_bytes"] = disk.fill(detail["left_bytes"])
        time.sleep(detail["seconds"])
        detail["exited"] = not proc.alive
        if detail["killed_while_full"]:  # what it acked must be on its disk, or on its peers'
            proc.kill()
        disk.free()
        with proc.stderr_path.open("rb") as stderr:
            stderr.seek(stderr_before)
            detail["enospc_logged"] = stderr.read().count(b"No space left on device")
        if detail["killed_while_full"]:
            detail.update(self._restart(f"broker-{broker}"))
        return {**detail, **self._until_in_every_isr(broker)}

    def _clock_jump(self, draws: Sequence[float]) -> dict[str, Any]:
        role = _pick(draws[0], CLOCK_ROLES)
        if role == "controller":
            active = self.cluster.active_controller()
            node = f"controller-{active if active in self.cluster.controllers else 100}"
        elif role == "coordinator":
            node = f"broker-{self._coordinator(draws[1])}"
        else:
            node = f"broker-{self._target(0.0, draws[1])}"
        clock = self.cluster.clocks.get(node)
        if clock is None:
            raise ValueError("clock_jump needs a cluster whose nodes have fake clocks")
        minutes = _between(draws[2], 6.0, 10.0)
        detail = {
            "role": role,
            "node": node,
            "offset_s": int(minutes * 60) * (1 if draws[3] < 0.5 else -1),
            "seconds": _between(draws[4], 2.0, 5.0),
        }
        clock.step_to(detail["offset_s"])
        time.sleep(detail["seconds"])
        clock.step_to(0)
        return detail

    def _lab(self) -> NetworkLab:
        if self.cluster.lab is None:
            raise ValueError("network partitions need a cluster whose nodes have namespaces")
        return self.cluster.lab

    def _net_partition(self, draws: Sequence[float]) -> dict[str, Any]:
        lab = self._lab()
        shape = _pick(draws[0], PARTITION_SHAPES)
        first = self._target(draws[1], draws[2])
        others = [b for b in sorted(self.cluster.brokers) if b != first]
        second = _pick(draws[3], others)
        detail: dict[str, Any] = {"shape": shape, "seconds": _between(draws[4], 1.0, 6.0)}
        if shape == "isolated":
            detail["broker"] = first
            lab.cut([f"broker-{first}"], [n for n in lab.nodes if n != f"broker-{first}"])
        elif shape == "one_way":
            detail.update({"from": first, "to": second})
            lab.drop(f"broker-{first}", f"broker-{second}")
        else:
            detail.update({"cut": [first, second]})
            lab.cut([f"broker-{first}"], [f"broker-{second}"])
        time.sleep(detail["seconds"])
        lab.heal()
        return detail

    def _controller_isolated(self, draws: Sequence[float]) -> dict[str, Any]:
        lab = self._lab()
        active = self.cluster.active_controller()
        if active not in self.cluster.controllers:
            active = _pick(draws[0], sorted(self.cluster.controllers))
        name = f"controller-{active}"
        detail = {"controller": active, "seconds": _between(draws[1], 2.0, 6.0)}
        lab.cut([name], [n for n in lab.nodes if n != name])
        time.sleep(detail["seconds"])
        lab.heal()
        return detail

    def _until_in_every_isr(self, broker: int) -> dict[str, Any]:
        """Wait for ``broker`` to be in every ISR it belongs in; how long it took, or where
        it was still missing at the deadline."""
        began = time.monotonic()
        behind = self._wait_in_every_isr(broker, began + REJOIN_TIMEOUT_S)
        if behind:
            return {"not_in_isr": ", ".join(behind)}
        return {"in_every_isr_after_s": round(time.monotonic() - began, 2)}

    def _wait_in_every_isr(self, broker: int, deadline: float) -> list[str]:
        """Until ``broker`` is in the ISR of every partition it has a replica of; the
        partitions where it is not yet at the deadline."""
        behind = ["not checked yet"]
        while time.monotonic() < deadline:
            try:
                behind = [
                    f"{topic}-{p.partition}"
                    for topic in self.admin.list_topics(include_internal=True)
                    for p in self.admin.describe_topic(topic).partitions
                    if broker in p.replicas and broker not in p.isr
                ]
            except ReplogError as err:
                behind = [f"{type(err).__name__}: {err}"]
            if not behind:
                return []
            time.sleep(0.2)
        return behind
