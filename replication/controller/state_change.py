"""The controller's state-change log (Kafka's ``state.change.logger``): one event per partition
whose leader, ISR or replica set a committed metadata version changed, and per topic config it
changed.

The active controller calls :func:`log_state_changes` with the version it replaced and the one
it committed, whatever decided the change (a topic created, a broker fenced or back, an
AlterPartition from a leader, an election, a reassignment): so every change is logged once,
in one shape, by the process that made it. Unchanged topics are the same objects in both
versions and are skipped without looking at their partitions.
"""

from __future__ import annotations

import logging

from replication import events
from replication.metadata.image import NO_LEADER, MetadataImage, PartitionState

log = logging.getLogger("replication.state_change")


def log_state_changes(old: MetadataImage, new: MetadataImage) -> None:
    for topic in new.topics:
        before = old.topic(topic.name)
        if before is topic:
            continue
        if before is not None and before.topic_id != topic.topic_id:
            before = None  # deleted and created again under the same name
        if before is not None and before.configs != topic.configs:
            events.log_config_changes(
                log, "topic", topic.name, before.config_map(), topic.config_map()
            )
        olds = before.partitions if before is not None else ()
        # untouched partitions are the same objects in both images
        for index, (was, state) in enumerate(zip(olds, topic.partitions, strict=False)):
            if was is not state and was != state:
                _partition_changed(topic.name, index, was, state)
        for index in range(len(olds), len(topic.partitions)):
            _partition_changed(topic.name, index, None, topic.partitions[index])


def _partition_changed(
    topic: str, index: int, was: PartitionState | None, state: PartitionState
) -> None:
    epochs = {"leader_epoch": state.leader_epoch, "partition_epoch": state.partition_epoch}
    old_leader = NO_LEADER if was is None else was.leader
    old_isr = () if was is None else was.isr
    if was is None or (was.leader, was.leader_epoch) != (state.leader, state.leader_epoch):
        if was is not None and state.leader != NO_LEADER and state.leader not in was.isr:
            events.event(
                log,
                events.UNCLEAN_LEADER_ELECTION,
                topic=topic,
                partition=index,
                new_leader=state.leader,
                old_isr=old_isr,
                new_isr=state.isr,
                **epochs,
            )
        events.event(
            log,
            events.LEADER_CHANGE,
            topic=topic,
            partition=index,
            old_leader=old_leader,
            new_leader=state.leader,
            isr=state.isr,
            replicas=state.replicas,
            **epochs,
        )
    if was is not None and was.replicas != state.replicas:
        events.event(
            log,
            events.REASSIGNMENT_STEP,
            topic=topic,
            partition=index,
            old_replicas=was.replicas,
            new_replicas=state.replicas,
            leader=state.leader,
            **epochs,
        )
    if was is None or was.isr == state.isr:
        return
    removed = [r for r in was.isr if r not in state.isr]
    added = [r for r in state.isr if r not in was.isr]
    for name, moved in ((events.ISR_SHRINK, removed), (events.ISR_EXPAND, added)):
        if moved:
            events.event(
                log,
                name,
                topic=topic,
                partition=index,
                leader=state.leader,
                old_isr=was.isr,
                new_isr=state.isr,
                replicas_moved=moved,
                **epochs,
            )
