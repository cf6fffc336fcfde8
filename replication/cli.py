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
cluster_app = typer.Typer(no_args_is_help=True, help="A local cluster: a controller and N brokers.")
app.add_typer(cluster_app, name="cluster")

DataOption = Annotated[
    str, typer.Option("--data", help="directory or URL (s3://bucket/prefix) for the cluster's data")
]


@cluster_app.command("up")
def cluster_up(
    brokers: Annotated[int, typer.Option("--brokers", help="how many brokers")] = 3,
    data: DataOption = "replog-data",
    port_base: Annotated[int, typer.Option("--port-base", help="port of broker 0")] = 9092,
    detach: Annotated[bool, typer.Option("--detach", help="return once the cluster is up")] = False,
    conf_dir: Annotated[
        str, typer.Option("--conf-dir", help="where broker.toml and controller.toml live")
    ] = "conf",
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="key=value for every node")
    ] = None,
) -> None:
    """Start a controller and N brokers on 127.0.0.1, each broker on its own storage root."""
    from pathlib import Path

    from replication import local_cluster
    from replication.config import parse_overrides

    nodes = local_cluster.cluster_up(
        data,
        brokers,
        port_base,
        conf_dir=Path(conf_dir),
        overrides=parse_overrides(overrides or []),
    )
    bootstrap = ",".join(n.address for n in nodes if n.role == "broker")
    for n in nodes:
        typer.echo(f"{n.role} {n.node_id} on {n.address} (pid {n.pid}, log {n.log_file})")
    typer.echo(f"bootstrap servers: {bootstrap}")
    if detach:
        typer.echo(
            "stop it with: replog cluster down"
            + ("" if data == "replog-data" else f" --data {data}")
        )
        return
    typer.echo("Ctrl-C stops the cluster")
    try:
        import signal

        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        local_cluster.cluster_down(data)


@cluster_app.command("status")
def cluster_status(
    data: DataOption = "replog-data",
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Each node's id, address, pid and liveness, and the active controller."""
    import json

    from rich.table import Table

    from replication import local_cluster

    status = local_cluster.cluster_status(data)
    if as_json:
        typer.echo(json.dumps(status, indent=2))
        return
    table = Table(
        title=f"replog cluster on {status['data']} (metadata v{status['metadata_version']})"
    )
    for col in (
        "role",
        "id",
        "address",
        "pid",
        "alive",
        "answering",
        "fenced",
        "active controller",
    ):
        table.add_column(col)
    for n in status["nodes"]:
        table.add_row(
            n["role"],
            str(n["id"]),
            n["address"],
            str(n["pid"]),
            _yes(n["alive"]),
            _yes(n["answering"]),
            _yes(n["fenced"]),
            _yes(n["active_controller"]),
        )
    Console().print(table)
    ctl = status["controller"]
    typer.echo(
        f"active controller: {ctl['id']} at {ctl['address']} (epoch {ctl['epoch']})"
        if ctl
        else "no active controller"
    )


@cluster_app.command("down")
def cluster_down(data: DataOption = "replog-data") -> None:
    """Stop every process of the local cluster (SIGTERM, then SIGKILL after 30 s)."""
    from replication import local_cluster

    nodes = local_cluster.cluster_down(data)
    typer.echo(f"stopped {len(nodes)} processes")


def _yes(value: bool) -> str:
    return "yes" if value else "no"


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
