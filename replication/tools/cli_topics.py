"""``replog topics``: create, list, describe, alter and delete topics, as Kafka's
kafka-topics.sh.

    replog topics create events --partitions 6 --replication-factor 3 --config retention.ms=86400000
    replog topics list
    replog topics describe events              # leaders, ISR, high watermark, each replica's lag
    replog topics describe --under-replicated-partitions   # every topic's partitions in trouble
    replog topics delete events

The CLI registers :data:`topics_app` under ``topics``; errors are one line on stderr and exit
status 1, as every replog command.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from replication.tools.cli_common import (
    DEFAULT_BOOTSTRAP,
    BootstrapOption,
    CommandConfigOption,
    admin_client,
    key_values,
)

if TYPE_CHECKING:
    from replication.client import Admin
    from replication.client.describe import PartitionStatus, TopicStatus

__all__ = ["topics_app"]

topics_app = typer.Typer(
    no_args_is_help=True,
    help="Create, list, describe, alter and delete topics (as kafka-topics).",
)
_stderr = Console(stderr=True)


@topics_app.command("create")
def topics_create(
    name: Annotated[str, typer.Argument(help="the topic's name")],
    partitions: Annotated[
        int | None,
        typer.Option("--partitions", help="how many partitions (default: num.partitions)"),
    ] = None,
    replication_factor: Annotated[
        int | None,
        typer.Option(
            "--replication-factor",
            help="replicas of each partition (default: default.replication.factor)",
        ),
    ] = None,
    configs: Annotated[
        list[str] | None,
        typer.Option("--config", help="a topic config key=value, repeatable: retention.ms=60000"),
    ] = None,
    if_not_exists: Annotated[
        bool, typer.Option("--if-not-exists", help="succeed if the topic already exists")
    ] = False,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    command_config: CommandConfigOption = None,
) -> None:
    """Create a topic."""
    from replication.errors import TopicAlreadyExistsError

    settings = key_values("--config", configs)
    with admin_client(bootstrap, command_config) as admin:
        try:
            admin.create_topic(
                name,
                -1 if partitions is None else partitions,
                -1 if replication_factor is None else replication_factor,
                settings,
            )
        except TopicAlreadyExistsError:
            if if_not_exists:
                return
            raise
    typer.echo(f"Created topic {name}.")


@topics_app.command("list")
def topics_list(
    exclude_internal: Annotated[
        bool, typer.Option("--exclude-internal", help="leave out internal topics (__...)")
    ] = False,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    command_config: CommandConfigOption = None,
) -> None:
    """Print the name of every topic, one a line."""
    with admin_client(bootstrap, command_config) as admin:
        names = admin.list_topics(include_internal=not exclude_internal)
    for name in names:
        typer.echo(name)


@topics_app.command("delete")
def topics_delete(
    name: Annotated[str, typer.Argument(help="the topic's name")],
    if_exists: Annotated[
        bool, typer.Option("--if-exists", help="succeed if the topic does not exist")
    ] = False,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    command_config: CommandConfigOption = None,
) -> None:
    """Delete a topic and its data."""
    from replication.errors import UnknownTopicOrPartitionError

    with admin_client(bootstrap, command_config) as admin:
        try:
            admin.delete_topic(name)
        except UnknownTopicOrPartitionError:
            if if_exists:
                return
            raise
    typer.echo(f"Deleted topic {name}.")


@topics_app.command("alter")
def topics_alter(
    name: Annotated[str, typer.Argument(help="the topic's name")],
    partitions: Annotated[
        int,
        typer.Option(
            "--partitions",
            help="the topic's new partition count (it can only grow; keyed records of the "
            "old partitions do not move)",
            min=1,
        ),
    ],
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    command_config: CommandConfigOption = None,
) -> None:
    """Add partitions to a topic (as kafka-topics --alter --partitions). Its configs are
    changed with `replog configs alter`."""
    with admin_client(bootstrap, command_config) as admin:
        admin.create_partitions({name: partitions})
    typer.echo(f"Topic {name} now has {partitions} partitions.")


@topics_app.command("describe")
def topics_describe(
    name: Annotated[
        str | None, typer.Argument(help="the topic's name (none: every topic)", show_default=False)
    ] = None,
    exclude_internal: Annotated[
        bool, typer.Option("--exclude-internal", help="with no name: leave out internal topics")
    ] = False,
    under_replicated: Annotated[
        bool,
        typer.Option(
            "--under-replicated-partitions", help="only partitions whose ISR lacks a replica"
        ),
    ] = False,
    under_min_isr: Annotated[
        bool,
        typer.Option(
            "--under-min-isr-partitions",
            help="only partitions whose ISR is smaller than the topic's min.insync.replicas "
            "(acks=all writes to them fail)",
        ),
    ] = False,
    at_min_isr: Annotated[
        bool,
        typer.Option(
            "--at-min-isr-partitions",
            help="only partitions whose ISR is exactly min.insync.replicas (one more loss "
            "stops acks=all writes)",
        ),
    ] = False,
    unavailable: Annotated[
        bool, typer.Option("--unavailable-partitions", help="only partitions with no leader")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON (shape below)")] = False,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    command_config: CommandConfigOption = None,
) -> None:
    """Per partition: leader, leader epoch, replicas, ISR, high watermark, and each replica's
    log end offset (LEO) and lag (leader LEO - replica LEO), asked of every broker; of one
    topic, or of every topic with no name (as kafka-topics --describe).

    The filters (as kafka-topics'; several at once keep a partition that any of them keeps)
    show only the partitions in trouble, and only the topics that have such partitions.

    --json prints, for a named topic, one object: {"topic", "is_internal", "partition_count",
    "replication_factor", "min_insync_replicas", "partitions": [{"partition", "leader",
    "leader_epoch", "replicas", "isr", "offline_replicas", "under_replicated",
    "high_watermark", "log_start_offset", "log_end_offset", "replica_states": [{"broker",
    "is_leader", "in_isr", "log_start_offset", "log_end_offset", "durable_end_offset",
    "high_watermark", "leader_epoch", "size_bytes", "lag", "error"}]}]}; with no name, a list
    of them. Partition offsets are the leader's (-1 if it did not answer); a replica whose
    broker did not answer has null offsets and lag and says why in "error".
    """
    import json

    from replication.client.describe import describe_topic_status

    filters = {
        "under-replicated": under_replicated,
        "under-min-isr": under_min_isr,
        "at-min-isr": at_min_isr,
        "unavailable": unavailable,
    }
    with admin_client(bootstrap, command_config) as admin:
        names = (
            [name] if name is not None else admin.list_topics(include_internal=not exclude_internal)
        )
        described = []
        for topic in names:
            status = describe_topic_status(admin, topic)
            min_isr = _min_insync_replicas(admin, topic)
            kept = tuple(p for p in status.partitions if _kept(p, min_isr, filters))
            if kept or name is not None or not any(filters.values()):
                described.append((replace(status, partitions=kept), min_isr))
    if as_json:
        objects = [{**s.to_json(), "min_insync_replicas": m} for s, m in described]
        typer.echo(json.dumps(objects[0] if name is not None else objects))
        return
    for status, min_isr in described:
        _print_status(status, min_isr)


def _min_insync_replicas(admin: Admin, topic: str) -> int:
    entry = admin.describe_configs("topic", topic, ["min.insync.replicas"]).get(
        "min.insync.replicas"
    )
    return 1 if entry is None or entry.value is None else int(entry.value)


def _kept(p: PartitionStatus, min_isr: int, filters: dict[str, bool]) -> bool:
    """Whether partition ``p`` passes the describe filters (every partition with none)."""
    if not any(filters.values()):
        return True
    return (
        (filters["under-replicated"] and p.under_replicated)
        or (filters["under-min-isr"] and len(p.isr) < min_isr)
        or (filters["at-min-isr"] and len(p.isr) == min_isr)
        or (filters["unavailable"] and p.leader < 0)
    )


def _print_status(status: TopicStatus, min_isr: int) -> None:
    table = Table(
        title=f"topic {status.name}: {len(status.partitions)} partitions, "
        f"replication factor {status.replication_factor}"
        + (" (internal)" if status.is_internal else ""),
        caption=f"min.insync.replicas {min_isr}",
    )
    for col in ("partition", "leader", "epoch", "ISR", "HW", "replica", "LEO", "lag", "durable"):
        table.add_column(col, justify="left" if col in ("ISR", "replica") else "right")
    for p in status.partitions:
        first = True
        for r in p.replica_states:
            who = f"{r.broker}" + (" leader" if r.is_leader else "")
            if not r.in_isr:
                who += " [red](out of ISR)[/red]"
            table.add_row(
                str(p.partition) if first else "",
                str(p.leader) if first else "",
                str(p.leader_epoch) if first else "",
                ",".join(map(str, p.isr)) if first else "",
                _offset(p.high_watermark) if first else "",
                who,
                _offset(None if r.log is None else r.log.log_end_offset),
                "[red]?[/red]" if r.lag is None else str(r.lag),
                _offset(None if r.log is None else r.log.durable_end_offset),
            )
            first = False
    Console().print(table)
    unknown: dict[str, list[str]] = {}  # why -> partitions whose replica shows "?"
    for p in status.partitions:
        for r in p.replica_states:
            if r.error:
                unknown.setdefault(r.error, []).append(f"{p.partition}")
    for why, where in unknown.items():
        _stderr.print(f"? (partitions {', '.join(where)}): {why}", highlight=False, soft_wrap=True)


def _offset(value: int | None) -> str:
    return "?" if value is None or value < 0 else str(value)
