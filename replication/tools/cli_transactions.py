"""``replog transactions``: look at transactions, as Kafka's kafka-transactions.sh.

    replog transactions list --bootstrap-server 127.0.0.1:9092          # open transactions
    replog transactions list --all --json                               # every one, as JSON
    replog transactions describe --transactional-id orders-1            # one id's state
    replog transactions find-hanging --broker-id 1                      # stuck LSOs
    replog transactions abort --topic orders --partition 0 --start-offset 42

The CLI registers :data:`transactions_app` under ``transactions``. Errors are one line on
stderr and exit status 1, as every replog command.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from logstore.errors import ReplogError
from replication.tools.cli_common import BootstrapOption, CommandConfigOption, admin_client

__all__ = ["transactions_app"]

transactions_app = typer.Typer(
    no_args_is_help=True, help="Inspect transactions (as kafka-transactions.sh)."
)

OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort")


@transactions_app.callback()
def _group() -> None:
    """Inspect transactions (as kafka-transactions.sh)."""
    # A callback keeps ``list`` a subcommand even while it is the only one.


def _fail(err: Exception) -> typer.Exit:
    Console(stderr=True).print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
    return typer.Exit(1)


def _row(t: Any, coordinator: int, now_ms: int) -> dict[str, Any]:
    started = t.start_time_ms if t.start_time_ms >= 0 and t.is_open else None
    return {
        "transactional_id": t.transactional_id,
        "coordinator": coordinator,
        "producer_id": t.producer_id,
        "producer_epoch": t.producer_epoch,
        "state": t.state,
        "timeout_ms": t.timeout_ms,
        "start_time_ms": started,
        "age_ms": None if started is None else max(now_ms - started, 0),
        "partitions": [f"{tp.topic}-{tp.partition}" for tp in t.partitions],
    }


def _age(row: dict[str, Any]) -> str:
    return "-" if row["age_ms"] is None else f"{row['age_ms'] / 1000:.1f}s"


def _transaction_cells(row: dict[str, Any]) -> list[str]:
    """The table cells of one :func:`_row`: id, producer, epoch, state, age, timeout,
    partitions."""
    return [
        row["transactional_id"],
        str(row["producer_id"]),
        str(row["producer_epoch"]),
        row["state"],
        _age(row),
        f"{row['timeout_ms'] / 1000:g}s",
        ", ".join(row["partitions"]) or "-",
    ]


def _print_table(title: str, columns: tuple[str, ...], rows: list[list[str]]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for cells in rows:
        table.add_row(*cells)
    Console(width=200).print(table)


@transactions_app.command("list")
def list_transactions(
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
    states: Annotated[
        list[str] | None,
        typer.Option(
            "--state",
            help="only transactions in this state (repeatable): Empty, Ongoing, PrepareCommit, "
            "PrepareAbort, CompleteCommit, CompleteAbort",
        ),
    ] = None,
    show_all: Annotated[
        bool, typer.Option("--all", help="every transaction, not only open ones")
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="print a JSON list: transactional_id, coordinator, producer_id, "
            "producer_epoch, state, timeout_ms, start_time_ms, age_ms, partitions",
        ),
    ] = False,
) -> None:
    """List open transactions: producer, state, partitions and age.

    Open means Ongoing, PrepareCommit or PrepareAbort (--all: every state). An old Ongoing
    transaction holds back read_committed consumers (the LSO) until it ends or its
    transaction.timeout.ms aborts it.
    """

    wanted = list(states or ()) or ([] if show_all else list(OPEN_STATES))
    try:
        with admin_client(bootstrap, command_config) as admin:
            found = admin.list_transactions(wanted)
            coordinator = admin.transaction_coordinator()
    except (ReplogError, ValueError) as err:
        raise _fail(err) from err
    now_ms = time.time_ns() // 1_000_000
    rows = [_row(t, coordinator, now_ms) for t in found]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        what = "transactions" if show_all or states else "open transactions"
        typer.echo(f"no {what} (coordinator: broker {coordinator})")
        return
    _print_table(
        f"transactions (coordinator: broker {coordinator})",
        ("TransactionalId", "ProducerId", "Epoch", "State", "Age", "Timeout", "Partitions"),
        [_transaction_cells(row) for row in rows],
    )


@transactions_app.command("describe")
def describe_transaction(
    transactional_id: Annotated[str, typer.Option("--transactional-id", help="the id to describe")],
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON object")] = False,
) -> None:
    """Describe one transactional id as its coordinator knows it: producer id and epoch,
    state, timeout, the open transaction's start and partitions (DescribeTransactions)."""

    try:
        with admin_client(bootstrap, command_config) as admin:
            found = admin.describe_transactions([transactional_id])[transactional_id]
            coordinator = admin.transaction_coordinator()
    except (ReplogError, ValueError) as err:
        raise _fail(err) from err
    row = _row(found, coordinator, time.time_ns() // 1_000_000)
    if as_json:
        typer.echo(json.dumps(row, indent=2))
        return
    _print_table(
        f"transaction {transactional_id!r} (coordinator: broker {coordinator})",
        ("ProducerId", "Epoch", "State", "Age", "Timeout", "Partitions"),
        [_transaction_cells(row)[1:]],
    )


@transactions_app.command("find-hanging")
def find_hanging(
    broker_id: Annotated[
        int, typer.Option("--broker-id", help="look at the partitions this broker leads")
    ],
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
    max_transaction_timeout: Annotated[
        int,
        typer.Option(
            "--max-transaction-timeout",
            help="minutes a transaction must have been open (the brokers' "
            "transaction.max.timeout.ms; Kafka's default 15)",
            min=0,
        ),
    ] = 15,
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list")] = False,
) -> None:
    """Find hanging transactions: open on a partition the broker leads for longer than the
    max transaction timeout, while the coordinator does not know them as ongoing there. Each
    holds the partition's LSO (and read_committed consumers) back until aborted with
    `replog transactions abort`."""

    try:
        with admin_client(bootstrap, command_config) as admin:
            found = admin.find_hanging_transactions(broker_id, max_transaction_timeout * 60_000)
    except (ReplogError, ValueError) as err:
        raise _fail(err) from err
    now_ms = time.time_ns() // 1_000_000
    rows: list[dict[str, Any]] = [
        {
            "topic": h.partition.topic,
            "partition": h.partition.partition,
            "producer_id": h.producer_id,
            "producer_epoch": h.producer_epoch,
            "coordinator_epoch": h.coordinator_epoch,
            "start_offset": h.start_offset,
            "start_time_ms": h.start_time_ms if h.start_time_ms >= 0 else None,
            "age_ms": max(now_ms - h.start_time_ms, 0) if h.start_time_ms >= 0 else None,
            "transactional_id": h.transactional_id,
        }
        for h in found
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo(f"no hanging transactions on the partitions broker {broker_id} leads")
        return
    _print_table(
        f"hanging transactions (broker {broker_id})",
        (
            "Topic",
            "Partition",
            "ProducerId",
            "ProducerEpoch",
            "CoordinatorEpoch",
            "StartOffset",
            "Age",
        ),
        [
            [
                row["topic"],
                str(row["partition"]),
                str(row["producer_id"]),
                str(row["producer_epoch"]),
                str(row["coordinator_epoch"]),
                str(row["start_offset"]),
                _age(row),
            ]
            for row in rows
        ],
    )


@transactions_app.command("abort")
def abort_transaction(
    topic: Annotated[str, typer.Option("--topic", help="the partition's topic")],
    partition: Annotated[int, typer.Option("--partition", help="the partition")],
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
    start_offset: Annotated[
        int | None,
        typer.Option("--start-offset", help="the open transaction's first offset"),
    ] = None,
    producer_id: Annotated[int | None, typer.Option("--producer-id")] = None,
    producer_epoch: Annotated[int | None, typer.Option("--producer-epoch")] = None,
    coordinator_epoch: Annotated[int | None, typer.Option("--coordinator-epoch")] = None,
) -> None:
    """Abort a hanging transaction on one partition: its leader writes an ABORT marker
    (WriteTxnMarkers), so the LSO moves on and read_committed consumers skip its records.

    Name it by --start-offset, or by --producer-id, --producer-epoch and --coordinator-epoch
    (as `replog transactions find-hanging` prints them)."""

    by_producer = (producer_id, producer_epoch, coordinator_epoch)
    if (start_offset is None) == all(v is None for v in by_producer) or (
        start_offset is None and any(v is None for v in by_producer)
    ):
        raise _fail(
            ValueError(
                "give either --start-offset, or all of --producer-id, --producer-epoch and "
                "--coordinator-epoch"
            )
        )
    try:
        with admin_client(bootstrap, command_config) as admin:
            admin.abort_transaction(
                (topic, partition),
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                coordinator_epoch=coordinator_epoch,
                start_offset=start_offset,
            )
    except (ReplogError, ValueError) as err:
        raise _fail(err) from err
    typer.echo(f"aborted the open transaction on {topic}-{partition}")
