"""``replog consumer-groups``: list, describe, reset offsets of, and delete consumer groups, as
Kafka's kafka-consumer-groups.sh.

    replog consumer-groups list
    replog consumer-groups describe billing             # members, offsets, log end, lag
    replog consumer-groups reset-offsets billing --topic events --to-earliest            # plan
    replog consumer-groups reset-offsets billing --topic events --to-earliest --execute  # do it
    replog consumer-groups delete-offsets --group billing --topic events:0,1
    replog consumer-groups delete billing

The CLI registers :data:`groups_app` under ``consumer-groups``; errors are one line on stderr
and exit status 1, as every replog command.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from logstore.errors import ConfigError
from replication.tools.cli_common import BootstrapOption, CommandConfigOption, admin_client

__all__ = ["groups_app"]

groups_app = typer.Typer(
    no_args_is_help=True,
    help="List, describe, reset and delete consumer groups (as kafka-consumer-groups).",
)

GroupArgument = Annotated[str, typer.Argument(help="the group id")]
JsonOption = Annotated[bool, typer.Option("--json", help="print JSON")]


@groups_app.command("list")
def list_groups(
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Every consumer group the brokers coordinate."""
    with admin_client(bootstrap, command_config) as admin:
        groups = admin.list_consumer_groups()
    if as_json:
        typer.echo(json.dumps([{"group_id": g, "protocol_type": t} for g, t in groups]))
        return
    for group_id, _ in groups:
        typer.echo(group_id)


def describe_rows(admin: Any, group_id: str) -> tuple[Any, list[dict[str, Any]]]:
    """The group, and per partition: committed offset, log end, lag, and its member."""
    from replication.client import TopicPartition

    group = admin.describe_consumer_group(group_id)
    committed = admin.list_consumer_group_offsets(group_id)
    owner = {tp: m for m in group.members for tp in m.assignment}
    tps = sorted(set(committed) | set(owner))
    ends = admin.list_offsets(dict.fromkeys(tps, "latest")) if tps else {}
    rows = []
    for tp in tps:
        member = owner.get(TopicPartition(*tp))
        offset = committed.get(tp)
        end = ends.get(tp)
        rows.append(
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "current_offset": offset,
                "log_end_offset": end,
                "lag": None if offset is None or end is None else max(end - offset, 0),
                "member_id": member.member_id if member else None,
                "client_id": member.client_id if member else None,
                "host": member.host if member else None,
            }
        )
    return group, rows


@groups_app.command("describe")
def describe_group(
    group_id: Annotated[
        str | None, typer.Argument(help="the group id (or --all-groups)", show_default=False)
    ] = None,
    all_groups: Annotated[bool, typer.Option("--all-groups", help="describe every group")] = False,
    members: Annotated[
        bool,
        typer.Option(
            "--members", help="the members instead: id, instance id, client, host, partitions"
        ),
    ] = False,
    state: Annotated[
        bool,
        typer.Option(
            "--state", help="the group's state instead: state, assignor, coordinator, members"
        ),
    ] = False,
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Per partition: committed offset, log end offset, lag and the member that owns it; then
    the group's state, assignor and coordinator. --members and --state show those instead,
    as kafka-consumer-groups --describe does.

    --json prints one object per group ({"group_id", "state", "assignor", "coordinator",
    "members", "partitions"}; with --members, "members" is the list of members), a list of
    them with --all-groups.
    """
    if members and state:
        raise ConfigError("give at most one of --members and --state")
    if (group_id is None) == (not all_groups):
        raise ConfigError("give a group id or --all-groups (one of the two)")
    with admin_client(bootstrap, command_config) as admin:
        ids = [group_id] if group_id is not None else [g for g, _ in admin.list_consumer_groups()]
        described = [describe_rows(admin, g) for g in ids]
    if as_json:
        docs = [_group_json(group, rows, members=members) for group, rows in described]
        typer.echo(json.dumps(docs if all_groups else docs[0]))
        return
    for group, rows in described:
        if members:
            _print_members(group)
        elif state:
            _print_state(group)
        else:
            _print_offsets(group, rows)


def _group_json(group: Any, rows: list[dict[str, Any]], *, members: bool) -> dict[str, Any]:
    return {
        "group_id": group.group_id,
        "state": group.state,
        "assignor": group.assignor,
        "coordinator": group.coordinator,
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "host": m.host,
                "assignment": sorted([tp.topic, tp.partition] for tp in m.assignment),
            }
            for m in group.members
        ]
        if members
        else len(group.members),
        "partitions": rows,
    }


def _title(group: Any) -> str:
    return (
        f"group {group.group_id}: {group.state}, {len(group.members)} members, "
        f"assignor {group.assignor or '-'}, coordinator broker {group.coordinator}"
    )


def _print_offsets(group: Any, rows: list[dict[str, Any]]) -> None:
    table = Table(title=_title(group))
    for column in ("topic", "partition", "current offset", "log end", "lag", "member", "client"):
        table.add_column(column, justify="right" if column in ("partition", "lag") else "left")
    for r in rows:
        table.add_row(
            r["topic"],
            str(r["partition"]),
            "-" if r["current_offset"] is None else str(r["current_offset"]),
            "-" if r["log_end_offset"] is None else str(r["log_end_offset"]),
            "-" if r["lag"] is None else str(r["lag"]),
            r["member_id"] or "-",
            r["client_id"] or "-",
        )
    Console().print(table)


def _print_members(group: Any) -> None:
    table = Table(title=_title(group))
    for column in ("member", "instance", "client", "host", "partitions", "assignment"):
        table.add_column(column, justify="right" if column == "partitions" else "left")
    for m in group.members:
        table.add_row(
            m.member_id,
            m.group_instance_id or "-",
            m.client_id,
            m.host,
            str(len(m.assignment)),
            ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(m.assignment)) or "-",
        )
    Console().print(table)


def _print_state(group: Any) -> None:
    table = Table()
    for column in ("group", "coordinator", "assignor", "state", "members"):
        table.add_column(column, justify="right" if column == "members" else "left")
    table.add_row(
        group.group_id,
        str(group.coordinator),
        group.assignor or "-",
        group.state,
        str(len(group.members)),
    )
    Console().print(table)


@groups_app.command("reset-offsets")
def reset_offsets(
    group_id: Annotated[
        str | None, typer.Argument(help="the group id (or --all-groups)", show_default=False)
    ] = None,
    topic: Annotated[
        list[str] | None,
        typer.Option("--topic", help="a topic whose offsets to reset (repeatable)"),
    ] = None,
    all_topics: Annotated[
        bool, typer.Option("--all-topics", help="every topic the group has offsets of")
    ] = False,
    all_groups: Annotated[bool, typer.Option("--all-groups", help="every group")] = False,
    to_earliest: Annotated[bool, typer.Option("--to-earliest")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest")] = False,
    to_offset: Annotated[int | None, typer.Option("--to-offset", help="this offset")] = None,
    to_timestamp: Annotated[
        int | None,
        typer.Option("--to-timestamp", help="the first offset at or after this time (ms)"),
    ] = None,
    to_datetime: Annotated[
        str | None,
        typer.Option(
            "--to-datetime",
            help="the first offset at or after this time: YYYY-MM-DDTHH:mm:SS.sss, with a "
            "zone (Z, +01:00) or local time",
        ),
    ] = None,
    by_duration: Annotated[
        str | None,
        typer.Option(
            "--by-duration", help="the first offset at or after now minus PnDTnHnMnS (P1DT2H)"
        ),
    ] = None,
    shift_by: Annotated[
        int | None, typer.Option("--shift-by", help="move the committed offsets by N (+/-)")
    ] = None,
    execute: Annotated[
        bool, typer.Option("--execute", help="apply it (without: print the plan only)")
    ] = False,
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
) -> None:
    """Set a group's committed offsets of some topics (the group must have no members).
    Without --execute this prints the new offsets and changes nothing, as
    kafka-consumer-groups."""
    from replication.client import TopicPartition

    chosen = [
        n
        for n, v in (
            ("--to-earliest", to_earliest),
            ("--to-latest", to_latest),
            ("--to-offset", to_offset is not None),
            ("--to-timestamp", to_timestamp is not None),
            ("--to-datetime", to_datetime is not None),
            ("--by-duration", by_duration is not None),
            ("--shift-by", shift_by is not None),
        )
        if v
    ]
    if len(chosen) != 1:
        raise ConfigError(
            "give exactly one of --to-earliest, --to-latest, --to-offset, --to-timestamp, "
            f"--to-datetime, --by-duration, --shift-by (got {', '.join(chosen) or 'none'})"
        )
    if (group_id is None) == (not all_groups):
        raise ConfigError("give a group id or --all-groups (one of the two)")
    if bool(topic) == all_topics:
        raise ConfigError("give --topic (repeatable) or --all-topics (one of the two)")
    if to_datetime is not None:
        to_timestamp = parse_datetime_ms("--to-datetime", to_datetime)
    elif by_duration is not None:
        to_timestamp = int(time.time() * 1000) - parse_duration_ms("--by-duration", by_duration)
    with admin_client(bootstrap, command_config) as admin:
        ids = [group_id] if group_id is not None else [g for g, _ in admin.list_consumer_groups()]
        for group in ids:
            committed = admin.list_consumer_group_offsets(group)
            topics = sorted({tp.topic for tp in committed}) if all_topics else list(topic or [])
            tps = [
                TopicPartition(name, p.partition)
                for name in topics
                for p in admin.describe_topic(name).partitions
            ]
            if not tps:
                continue
            earliest = admin.list_offsets(dict.fromkeys(tps, "earliest"))
            latest = admin.list_offsets(dict.fromkeys(tps, "latest"))
            if to_earliest:
                plan = earliest
            elif to_latest:
                plan = latest
            elif to_offset is not None:
                plan = dict.fromkeys(tps, to_offset)
            elif to_timestamp is not None:
                found = admin.list_offsets(dict.fromkeys(tps, to_timestamp))
                plan = {tp: (o if o >= 0 else latest[tp]) for tp, o in found.items()}
            else:
                assert shift_by is not None
                plan = {tp: committed.get(tp, earliest[tp]) + shift_by for tp in tps}
            # as Kafka: an offset outside the log is clamped to it
            plan = {tp: min(max(o, earliest[tp]), latest[tp]) for tp, o in plan.items()}
            if execute:
                admin.alter_consumer_group_offsets(group, plan)
            table = Table(
                title=f"group {group}, {', '.join(topics)}: "
                + ("reset" if execute else "plan (dry run: add --execute)")
            )
            for column in ("topic", "partition", "current offset", "new offset"):
                table.add_column(column, justify="left" if column == "topic" else "right")
            for tp in tps:
                current = committed.get(tp)
                table.add_row(
                    tp.topic,
                    str(tp.partition),
                    "-" if current is None else str(current),
                    str(plan[tp]),
                )
            Console().print(table)


_DURATION = re.compile(
    r"P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?",
    re.IGNORECASE,
)


def parse_duration_ms(flag: str, text: str) -> int:
    """An ISO-8601 duration as Java's Duration.parse takes it (``PnDTnHnMnS``: P1DT2H30M,
    PT15M, PT0.5S), in ms; ConfigError names the flag otherwise."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or not any(match.groupdict().values()) or text.strip().upper().endswith("T"):
        raise ConfigError(
            f"{flag} {text!r}: expected an ISO-8601 duration PnDTnHnMnS, e.g. P1DT2H or PT15M"
        )
    d, h, m, sec = (float(match.group(k) or 0) for k in ("d", "h", "m", "s"))
    return int(((d * 24 + h) * 60 + m) * 60_000 + sec * 1000)


def parse_datetime_ms(flag: str, text: str) -> int:
    """``YYYY-MM-DDTHH:mm:SS[.sss]`` with an optional zone (Z, +01:00; else local time), in
    ms since the epoch; ConfigError names the flag otherwise."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            f"{flag} {text!r}: expected YYYY-MM-DDTHH:mm:SS.sss, optionally with a zone "
            "(2026-12-04T09:30:00.000Z, or +01:00)"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()  # local time, as Kafka's tool reads a time without a zone
    return int(when.timestamp() * 1000)


def parse_topic_partitions(flag: str, text: str) -> tuple[str, list[int] | None]:
    """``TOPIC`` or ``TOPIC:P[,P...]`` as kafka-consumer-groups takes --topic: the topic and
    its partitions (None: every partition); ConfigError names the flag otherwise."""
    topic, colon, rest = text.partition(":")
    if not topic:
        raise ConfigError(f"{flag} {text!r}: expected TOPIC or TOPIC:PARTITION[,PARTITION...]")
    if not colon:
        return topic, None
    try:
        partitions = [int(part) for part in rest.split(",")]
    except ValueError:
        raise ConfigError(
            f"{flag} {text!r}: partitions are comma-separated integers (events:0,1)"
        ) from None
    if any(part < 0 for part in partitions):
        raise ConfigError(f"{flag} {text!r}: a partition is 0 or more")
    return topic, partitions


@groups_app.command("delete-offsets")
def delete_offsets(
    group: Annotated[str, typer.Option("--group", help="the group id")],
    topic: Annotated[
        list[str],
        typer.Option(
            "--topic",
            help="TOPIC (every partition) or TOPIC:P[,P...] whose offsets to delete (repeatable)",
        ),
    ],
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete a group's committed offsets of some topics or partitions, as
    kafka-consumer-groups --delete-offsets: the group must be empty, or not subscribed to
    those topics (a partition of a subscribed topic answers GROUP_SUBSCRIBED_TO_TOPIC).
    Prints each partition's status; exits 1 if any partition failed."""
    from replication.client import TopicPartition

    wanted = [parse_topic_partitions("--topic", t) for t in topic]
    with admin_client(bootstrap, command_config) as admin:
        tps = []
        for name, partitions in wanted:
            if partitions is None:
                partitions = [p.partition for p in admin.describe_topic(name).partitions]
            tps += [TopicPartition(name, index) for index in partitions]
        results = admin.delete_consumer_group_offsets(group, tps)
    rows: list[dict[str, Any]] = [
        {"topic": tp.topic, "partition": tp.partition, "error": None if e is None else str(e)}
        for tp, e in sorted(results.items())
    ]
    if as_json:
        typer.echo(json.dumps({"group_id": group, "partitions": rows}))
    else:
        table = Table(title=f"group {group}: offsets deleted")
        for column in ("topic", "partition", "status"):
            table.add_column(column, justify="right" if column == "partition" else "left")
        for r in rows:
            table.add_row(r["topic"], str(r["partition"]), r["error"] or "Successful")
        Console().print(table)
    if any(r["error"] for r in rows):
        raise typer.Exit(1)


@groups_app.command("delete")
def delete_groups(
    group_ids: Annotated[list[str], typer.Argument(help="group ids")],
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
) -> None:
    """Delete groups that have no members, with their committed offsets."""
    with admin_client(bootstrap, command_config) as admin:
        admin.delete_consumer_groups(group_ids)
    for group_id in group_ids:
        typer.echo(f"deleted group {group_id}")
