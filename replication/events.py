"""Operational events: one log line per change an operator follows a cluster by.

Who leads a partition, who is in sync, who is fenced, which configs apply, how a reassignment
moves: each such change is logged once, by the process that makes or applies it, as a line

    isr_shrink topic=events partition=0 old_isr=[0,1,2] new_isr=[0,1] leader_epoch=3 ...

with the event name first and ``key=value`` fields after it (Kafka's names: leader epoch,
partition epoch, broker epoch). The name and the fields also travel on the log record
(``record.event``, ``record.event_fields`` and one attribute per field), so the JSON format
(:mod:`replication.log_format`, ``logging.format=json``) emits them as keys of the line's
object. Events an operator should look at (a shrinking ISR, a fenced broker, request or
producer) log at WARNING, the others at INFO.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

#: a partition's leader (or leader epoch) changed, as the controller commits it
LEADER_CHANGE = "leader_change"
#: a replica became its partition's leader / a follower (as Kafka's makeLeader and
#: makeFollower), with the offset its leader epoch starts at (its log end offset)
BECOME_LEADER = "become_leader"
BECOME_FOLLOWER = "become_follower"
#: the controller elected a leader from outside the ISR (records may be lost)
UNCLEAN_LEADER_ELECTION = "unclean_leader_election"
#: followers left a partition's ISR / caught up and joined it (committed by the controller)
ISR_SHRINK = "isr_shrink"
ISR_EXPAND = "isr_expand"
#: the controller registered a broker (a new broker epoch)
BROKER_REGISTERED = "broker_registered"
#: the controller fenced a broker (session expired, or a new incarnation replaced it) /
#: unfenced it (it heartbeats again)
BROKER_FENCED = "broker_fenced"
BROKER_UNFENCED = "broker_unfenced"
#: a request carried an older leader epoch than the replica's (FENCED_LEADER_EPOCH)
FENCED_LEADER_EPOCH = "fenced_leader_epoch"
#: a transactional producer was fenced by a newer instance with the same transactional.id
PRODUCER_FENCED = "producer_fenced"
#: a process became the active controller
CONTROLLER_ACTIVE = "controller_active"
#: a broker applied a changed config (key, old and new value, and what it applies to)
CONFIG_CHANGE = "config_change"
#: a partition reassignment took a step (the controller logs every change of a replica set;
#: the reassignment code may log its own steps: started, a replica caught up, completed)
REASSIGNMENT_STEP = "reassignment_step"
#: a request was refused an operation on a resource (an ACL denies it, or none allows it):
#: principal, host, operation, resource (``Topic:events``), api, result=DENIED; logged by the
#: broker or controller that refused it, on logger ``replication.security.authorizer``
#: (Kafka's ``kafka.authorizer.logger``)
AUTHORIZATION_DENIED = "authorization_denied"

#: every event name, for documentation and tests
EVENTS = (
    LEADER_CHANGE,
    BECOME_LEADER,
    BECOME_FOLLOWER,
    UNCLEAN_LEADER_ELECTION,
    ISR_SHRINK,
    ISR_EXPAND,
    BROKER_REGISTERED,
    BROKER_FENCED,
    BROKER_UNFENCED,
    FENCED_LEADER_EPOCH,
    PRODUCER_FENCED,
    CONTROLLER_ACTIVE,
    CONFIG_CHANGE,
    REASSIGNMENT_STEP,
    AUTHORIZATION_DENIED,
)
#: events logged at WARNING: each is worth a look (and an alert if it repeats)
WARNING_EVENTS = frozenset(
    {UNCLEAN_LEADER_ELECTION, ISR_SHRINK, BROKER_FENCED, FENCED_LEADER_EPOCH, PRODUCER_FENCED}
)

#: attribute names a LogRecord holds already: a field may not take one (logging refuses it)
_RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def event(logger: logging.Logger, name: str, /, **fields: Any) -> None:
    """Log event ``name`` with ``fields`` (in the order given) on ``logger``.

    Field values are ints, strings, bools, None or sequences of them (an ISR, replicas).
    """
    clash = _RESERVED.intersection(fields) | ({"event", "event_fields"} & set(fields))
    if clash:  # checked whatever the level, so that a test at any level finds it
        raise ValueError(f"event {name}: field names {sorted(clash)} are LogRecord attributes")
    level = logging.WARNING if name in WARNING_EVENTS else logging.INFO
    if not logger.isEnabledFor(level):
        return
    values = {key: _plain(value) for key, value in fields.items()}
    logger.log(
        level,
        "%s %s",
        name,
        " ".join(f"{key}={_text(value)}" for key, value in values.items()),
        extra={"event": name, "event_fields": tuple(values), **values},
        stacklevel=2,
    )


def log_config_changes(
    logger: logging.Logger,
    resource: str,
    name: str,
    old: Mapping[str, str],
    new: Mapping[str, str],
) -> None:
    """One CONFIG_CHANGE event per key whose value differs between ``old`` and ``new``
    (None: the key was not set). ``resource`` is Kafka's resource type (topic, broker) and
    ``name`` the resource's name (a topic, a broker id, or "" for the cluster default)."""
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            event(
                logger,
                CONFIG_CHANGE,
                resource=resource,
                resource_name=name,
                key=key,
                old_value=old.get(key),
                new_value=new.get(key),
            )


def _plain(value: Any) -> Any:
    """A field as JSON holds it: sequences (tuples, sets of replica ids) become lists."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, Iterable):
        return [_plain(v) for v in value]
    return str(value)


def _text(value: Any) -> str:
    """A field in the text line: lists without spaces, strings quoted only where needed."""
    if isinstance(value, list):
        return "[" + ",".join(_text(v) for v in value) + "]"
    if isinstance(value, str):
        plain = value and not any(c.isspace() or c in '="[],' for c in value)
        return value if plain else json.dumps(value)
    return json.dumps(value)
