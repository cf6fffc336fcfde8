"""The ``replog`` command line (Kafka's tool names and flags where they exist).

Every command turns a :class:`ReplogError` into one line on stderr that says what to do, and
exit status 1; tracebacks are for bugs only.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

from logstore.errors import ReplogError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="replog: Kafka-grade streams for Spark on object storage.",
)
log_app = typer.Typer(no_args_is_help=True, help="Inspect partition logs on storage.")
app.add_typer(log_app, name="log")
broker_app = typer.Typer(no_args_is_help=True, help="Run a broker.")
app.add_typer(broker_app, name="broker")
controller_app = typer.Typer(no_args_is_help=True, help="Run a controller.")
app.add_typer(controller_app, name="controller")

err_console = Console(stderr=True)


@log_app.command("dump")
def log_dump(
    path: Annotated[
        str, typer.Argument(help="a .seg object, or a partition directory (path or URL)")
    ],
    records: Annotated[bool, typer.Option("--records", help="print every record too")] = False,
) -> None:
    """Print each batch of segment objects, as kafka-dump-log.sh does."""
    from logstore.dump import dump

    bad = False
    for line in dump(path, records=records):
        typer.echo(line.text)
        bad = bad or line.error
    if bad:
        raise typer.Exit(2)


@broker_app.command("start")
def broker_start(
    conf: Annotated[str | None, typer.Option("--conf", help="broker TOML file (see conf/)")] = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="override one key: --set broker.id=1")
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR")] = "INFO",
) -> None:
    """Start a broker in the foreground (SIGTERM or Ctrl-C stops it gracefully).

    By default it is also a controller candidate (process.roles=broker,controller): alone it
    is a whole cluster; beside a controller it stands by to take over.
    """
    from replication.broker import run_node
    from replication.config import load_broker_config, parse_overrides

    run_node(load_broker_config(conf, parse_overrides(overrides or [])), log_level=log_level)


@controller_app.command("start")
def controller_start(
    conf: Annotated[
        str | None, typer.Option("--conf", help="controller TOML file (see conf/)")
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="override one key: --set broker.id=100")
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR")] = "INFO",
) -> None:
    """Start a controller alone (process.roles=controller) in the foreground."""
    from replication.broker import run_node
    from replication.config import load_broker_config, parse_overrides

    values = {"process.roles": "controller", **parse_overrides(overrides or [])}
    run_node(load_broker_config(conf, values), log_level=log_level)


@app.command("demo")
def demo(
    records: Annotated[int, typer.Option(help="how many synthetic events to write")] = 200_000,
    data: Annotated[
        str | None, typer.Option(help="storage URL or directory (default: a fresh temp dir)")
    ] = None,
) -> None:
    """Run the demo on an embedded default (today: one partition log on local files)."""
    from replication.demo import run_demo

    raise typer.Exit(run_demo(records=records, data=data))


def main() -> None:
    try:
        app()
    except ReplogError as err:
        err_console.print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
