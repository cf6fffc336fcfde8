"""``replog transactions``: look at transactions, as Kafka's kafka-transactions.sh.

    replog transactions list --bootstrap-server 127.0.0.1:9092          # open transactions
    replog transactions list --all --json                               # every one, as JSON

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

__all__ = ["transactions_app"]

transactions_app = typer.Typer(
    no_args_is_help=True, help="Inspect transactions (as kafka-transactions.sh)."
)

OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort")


@transactions_app.callback()
def _group() -> None:
    """Inspect transactions (as kafka-transactions.sh)."""
    # A callback keeps ``list`` a subcommand even while it is the only one.


BootstrapOption = Annotated[
    str,
    typer.Option(
        "--bootstrap-server",
        help="a broker's HOST:PORT to start from (a comma list works: h1:9092,h2:9092)",
    ),
]


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


@transactions_app.command("list")
def list_transactions(
    bootstrap: BootstrapOption = "127.0.0.1:9092",
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
    from replication.client import Admin

    wanted = list(states or ()) or ([] if show_all else list(OPEN_STATES))
    try:
        with Admin(bootstrap_servers=bootstrap) as admin:
            found = admin.list_transactions(wanted)
            coordinator = admin.transaction_coordinator()
    except (ReplogError, ValueError) as err:
        Console(stderr=True).print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from err
    now_ms = time.time_ns() // 1_000_000
    rows = [_row(t, coordinator, now_ms) for t in found]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        what = "transactions" if show_all or states else "open transactions"
        typer.echo(f"no {what} (coordinator: broker {coordinator})")
        return
    table = Table(title=f"transactions (coordinator: broker {coordinator})")
    for column in (
        "TransactionalId",
        "ProducerId",
        "Epoch",
        "State",
        "Age",
        "Timeout",
        "Partitions",
    ):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["transactional_id"],
            str(row["producer_id"]),
            str(row["producer_epoch"]),
            row["state"],
            "-" if row["age_ms"] is None else f"{row['age_ms'] / 1000:.1f}s",
            f"{row['timeout_ms'] / 1000:g}s",
            ", ".join(row["partitions"]) or "-",
        )
    Console(width=200).print(table)
