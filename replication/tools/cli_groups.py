"""``replog consumer-groups``: list, describe, reset offsets of, and delete consumer groups, as
Kafka's kafka-consumer-groups.sh.

    replog consumer-groups list
    replog consumer-groups describe billing             # members, offsets, log end, lag
    replog consumer-groups reset-offsets billing --topic events --to-earliest            # plan
    replog consumer-groups reset-offsets billing --topic events --to-earliest --execute  # do it
    replog consumer-groups delete billing

The CLI registers :data:`groups_app` under ``consumer-groups``; errors are one line on stderr
and exit status 1, as every replog command.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from logstore.errors import ConfigError
from replication.tools.cli_common import BootstrapOption, CommandConfigOption, admin_client

__all__ = ["groups_app"]

groups_app = typer.Typer(
    no_args_is_help=True, help="List, describe, reset and delete consumer groups."
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
    group_id: GroupArgument,
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Per partition: committed offset, log end offset, lag and the member that owns it; then
    the group's state, assignor and coordinator."""
    with admin_client(bootstrap, command_config) as admin:
        group, rows = describe_rows(admin, group_id)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "group_id": group.group_id,
                    "state": group.state,
                    "assignor": group.assignor,
                    "coordinator": group.coordinator,
                    "members": len(group.members),
                    "partitions": rows,
                }
            )
        )
        return
    table = Table(
        title=f"group {group.group_id}: {group.state}, {len(group.members)} members, "
        f"assignor {group.assignor or '-'}, coordinator broker {group.coordinator}"
    )
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


@groups_app.command("reset-offsets")
def reset_offsets(
    group_id: GroupArgument,
    topic: Annotated[str, typer.Option("--topic", help="the topic whose offsets to reset")],
    to_earliest: Annotated[bool, typer.Option("--to-earliest")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest")] = False,
    to_offset: Annotated[int | None, typer.Option("--to-offset", help="this offset")] = None,
    to_timestamp: Annotated[
        int | None,
        typer.Option("--to-timestamp", help="the first offset at or after this time (ms)"),
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
    """Set a group's committed offsets of a topic (the group must have no members). Without
    --execute this prints the new offsets and changes nothing, as kafka-consumer-groups."""
    from replication.client import TopicPartition

    chosen = [
        n
        for n, v in (
            ("--to-earliest", to_earliest),
            ("--to-latest", to_latest),
            ("--to-offset", to_offset is not None),
            ("--to-timestamp", to_timestamp is not None),
            ("--shift-by", shift_by is not None),
        )
        if v
    ]
    if len(chosen) != 1:
        raise ConfigError(
            "give exactly one of --to-earliest, --to-latest, --to-offset, --to-timestamp, "
            f"--shift-by (got {', '.join(chosen) or 'none'})"
        )
    with admin_client(bootstrap, command_config) as admin:
        info = admin.describe_topic(topic)
        tps = [TopicPartition(topic, p.partition) for p in info.partitions]
        earliest = admin.list_offsets(dict.fromkeys(tps, "earliest"))
        latest = admin.list_offsets(dict.fromkeys(tps, "latest"))
        committed = admin.list_consumer_group_offsets(group_id)
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
            admin.alter_consumer_group_offsets(group_id, plan)
    table = Table(
        title=f"group {group_id}, topic {topic}: "
        + ("reset" if execute else "plan (dry run: add --execute)")
    )
    for column in ("partition", "current offset", "new offset"):
        table.add_column(column, justify="right")
    for tp in tps:
        current = committed.get(tp)
        table.add_row(str(tp.partition), "-" if current is None else str(current), str(plan[tp]))
    Console().print(table)


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
