"""Partition reassignments (KIP-455) as the controller runs them (in Kafka, the reassignment
part of ReplicationControlManager): a move starts with the partition on target + (original -
target) replicas, completes once every target replica is in the ISR, or is cancelled back to
the original replicas; each step is one metadata version and one event."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from replication import events
from replication.errors import (
    InvalidReplicaAssignmentError,
    InvalidRequestError,
    NoReassignmentInProgressError,
    ReplogError,
    UnknownTopicOrPartitionError,
)
from replication.metadata.image import NO_LEADER, MetadataImage, PartitionState

#: the controller's log, where its metadata changes are told
log = logging.getLogger("replication.controller.controller")


class _ReassignmentWriter(Protocol):
    """What reassignments need of the controller."""

    _lock: threading.RLock
    image: MetadataImage

    def _commit(self, image: MetadataImage, base: MetadataImage | None = None) -> MetadataImage: ...

    def _live(self, image: MetadataImage) -> set[int]: ...

    def update_partition(self, topic: str, index: int, state: PartitionState) -> MetadataImage: ...


class PartitionReassignmentControl:
    """The controller's reassignment requests: alter, list, and completion as the ISR grows."""

    def alter_partition_reassignments(
        self: _ReassignmentWriter,
        changes: Sequence[tuple[str, int, Sequence[int] | None]],
        *,
        throttled_rate: int = 0,
    ) -> list[ReplogError | None]:
        """Start (target replicas) or cancel (None) reassignments, one result per change.

        As Kafka's KIP-455: during a move the partition's replicas are target + (original -
        target), the new ones catch up as followers, and the move completes (replicas = target)
        only once every target replica is in the ISR (:func:`_completed`). Acked records are
        safe throughout: the ISR only ever loses a replica when the move completes, and then
        every target replica is in it. ``throttled_rate`` (bytes/s, 0: none) is what the adding
        replicas fetch at while they catch up.
        """
        if throttled_rate < 0:
            raise InvalidRequestError(f"throttle {throttled_rate} bytes/s must be >= 0")
        with self._lock:
            image = self.image.next()
            live = self._live(image)
            results: list[ReplogError | None] = []
            steps: list[tuple[str, str, int, PartitionState]] = []
            for topic, index, target in changes:
                try:
                    info = image.topic(topic)
                    if info is None or not 0 <= index < len(info.partitions):
                        raise UnknownTopicOrPartitionError(f"unknown partition {topic}-{index}")
                    state = info.partitions[index]
                    new: PartitionState | None
                    if target is None:
                        new, what = _cancelled(topic, index, state, live), "cancelled"
                    else:
                        new = _started(image, topic, index, state, target, throttled_rate, live)
                        what = "started"
                    if new is None:  # already on the target replicas
                        results.append(None)
                        continue
                    if not new.reassigning and target is not None:
                        what = "completed"  # the same replicas, reordered: nothing to move
                    completed = _completed(new, live)
                    parts = list(info.partitions)
                    parts[index] = completed or new
                    image = image.with_topic(replace(info, partitions=tuple(parts)))
                    steps.append((what, topic, index, new))
                    if completed is not None:
                        steps.append(("completed", topic, index, completed))
                    results.append(None)
                except ReplogError as err:
                    results.append(err)
            if steps:
                self._commit(image)
            for what, topic, index, state in steps:
                log_reassignment(what, topic, index, state)
            return results

    def _maybe_complete_reassignment(self: _ReassignmentWriter, topic: str, index: int) -> None:
        with self._lock:
            info = self.image.topic(topic)
            if info is None or not 0 <= index < len(info.partitions):
                return
            done = _completed(info.partitions[index], self._live(self.image))
            if done is not None:
                self.update_partition(topic, index, done)
                log_reassignment("completed", topic, index, done)

    def list_partition_reassignments(
        self: _ReassignmentWriter, partitions: Sequence[tuple[str, int]] | None = None
    ) -> list[tuple[str, int, PartitionState]]:
        """The reassignments in progress (of ``partitions`` only, if given)."""
        with self._lock:
            wanted = None if partitions is None else set(partitions)
            return [
                (topic.name, index, state)
                for topic in self.image.topics
                for index, state in enumerate(topic.partitions)
                if state.reassigning and (wanted is None or (topic.name, index) in wanted)
            ]


def _started(
    image: MetadataImage,
    topic: str,
    index: int,
    state: PartitionState,
    target: Sequence[int],
    throttled_rate: int,
    live: set[int],
) -> PartitionState | None:
    wanted = tuple(target)
    registered = {b.broker_id for b in image.brokers}
    if not wanted or len(set(wanted)) != len(wanted):
        raise InvalidReplicaAssignmentError(
            f"{topic}-{index}: target replicas {list(wanted)} must name one or more "
            "distinct brokers"
        )
    if not set(wanted) <= registered:
        raise InvalidReplicaAssignmentError(
            f"{topic}-{index}: target replicas {list(wanted)} name brokers that are not "
            f"registered ({sorted(set(wanted) - registered)}); registered: {sorted(registered)}"
        )
    original = state.original_replicas
    if wanted == original and not state.reassigning:
        return None
    replicas = wanted + tuple(r for r in original if r not in wanted)
    isr = tuple(r for r in state.isr if r in replicas)
    if not isr:
        raise InvalidReplicaAssignmentError(
            f"{topic}-{index}: no replica of {list(replicas)} is in the ISR "
            f"{list(state.isr)}; let the reassignment in progress finish first"
        )
    new = replace(
        state,
        replicas=replicas,
        isr=isr,
        adding_replicas=tuple(r for r in wanted if r not in original),
        removing_replicas=tuple(r for r in original if r not in wanted),
        throttled_rate=throttled_rate,
        partition_epoch=state.partition_epoch + 1,
    )
    if new.leader not in replicas:  # led by an adding replica of the move this replaces
        new = _reelect(new, live)
    return new


def _cancelled(topic: str, index: int, state: PartitionState, live: set[int]) -> PartitionState:
    if not state.reassigning:
        raise NoReassignmentInProgressError(
            f"{topic}-{index} has no reassignment in progress to cancel"
        )
    original = state.original_replicas
    isr = tuple(r for r in state.isr if r in original)
    if not isr:
        raise InvalidReplicaAssignmentError(
            f"{topic}-{index}: cannot cancel: no original replica {list(original)} is in the "
            f"ISR {list(state.isr)} any more (it would lose records); let the "
            "reassignment finish"
        )
    new = replace(
        state,
        replicas=original,
        isr=isr,
        adding_replicas=(),
        removing_replicas=(),
        throttled_rate=0,
        partition_epoch=state.partition_epoch + 1,
    )
    if new.leader not in original:
        new = _reelect(new, live)
    return new


def _reelect(state: PartitionState, live: set[int]) -> PartitionState:
    """A new leader from the ISR (in replica order) with a new leader epoch."""
    candidates = [r for r in state.replicas if r in state.isr and r in live]
    return replace(
        state,
        leader=candidates[0] if candidates else NO_LEADER,
        leader_epoch=state.leader_epoch + 1,
    )


def _completed(state: PartitionState, live: set[int]) -> PartitionState | None:
    """The partition once its reassignment completes, or None if it cannot yet.

    Rule (KIP-455): a move completes only once every target replica is in the ISR. Then
    replicas = target, ISR = ISR & target (so still every target replica), and a leader
    that is being removed hands over to the first live target replica, with a new epoch.
    """
    target = state.target_replicas
    if not state.reassigning or not set(target) <= set(state.isr):
        return None
    done = replace(
        state,
        replicas=target,
        isr=tuple(r for r in state.isr if r in target),
        adding_replicas=(),
        removing_replicas=(),
        throttled_rate=0,
        partition_epoch=state.partition_epoch + 1,
    )
    if done.leader not in target:
        done = _reelect(done, live)
    return done


def log_reassignment(step: str, topic: str, index: int, state: PartitionState, **more: int) -> None:
    """A reassignment step (started, replica_caught_up, completed, cancelled) as an event."""
    events.event(
        log,
        events.REASSIGNMENT_STEP,
        step=step,
        topic=topic,
        partition=index,
        **more,
        replicas=state.replicas,
        adding_replicas=state.adding_replicas,
        removing_replicas=state.removing_replicas,
        isr=state.isr,
        leader=state.leader,
        leader_epoch=state.leader_epoch,
        partition_epoch=state.partition_epoch,
    )
