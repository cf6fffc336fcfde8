"""The ``replog`` command line (Kafka's tool names and flags where they exist).

Every command turns a :class:`ReplogError` into one line on stderr that says what to do, and
exit status 1; tracebacks are for bugs only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from logstore.errors import ReplogError

try:  # newer typer carries its own copy of click: its usage errors are that copy's classes
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - typer on top of the click package
    from click import exceptions as click_errors  # type: ignore[no-redef]

if TYPE_CHECKING:
    from replication.client import FetchedBatch

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="replog: Kafka-grade streams for Spark on object storage.",
)
log_app = typer.Typer(
    no_args_is_help=True, help="Inspect partition logs on storage (as kafka-dump-log)."
)
app.add_typer(log_app, name="log")
broker_app = typer.Typer(no_args_is_help=True, help="Run a broker.")
app.add_typer(broker_app, name="broker")
controller_app = typer.Typer(no_args_is_help=True, help="Run a controller.")
app.add_typer(controller_app, name="controller")
cluster_app = typer.Typer(no_args_is_help=True, help="A local cluster: a controller and N brokers.")
app.add_typer(cluster_app, name="cluster")
from replication.tools.cli_common import (  # noqa: E402
    DEFAULT_BOOTSTRAP,
    BootstrapOption,
    CommandConfigOption,
    CommandError,
    admin_client,
    client_config,
    key_values,
    read_properties,
)
from replication.tools.cli_monitoring import cluster_prometheus_config  # noqa: E402

cluster_app.command("prometheus-config")(cluster_prometheus_config)
from replication.tools.cli_transactions import transactions_app  # noqa: E402

app.add_typer(transactions_app, name="transactions")
from replication.tools.cli_groups import groups_app  # noqa: E402

app.add_typer(groups_app, name="consumer-groups")
from replication.tools.cli_configs import configs_app  # noqa: E402

app.add_typer(configs_app, name="configs")
from replication.tools.cli_records import records_app  # noqa: E402

app.add_typer(records_app, name="records")
from replication.tools.cli_partitions import brokers_app, partitions_app  # noqa: E402

app.add_typer(partitions_app, name="partitions")
app.add_typer(brokers_app, name="brokers")
from replication.tools.cli_security import acls_app, security_app, users_app  # noqa: E402

app.add_typer(users_app, name="users")
app.add_typer(acls_app, name="acls")
app.add_typer(security_app, name="security")
from replication.tools.cli_topics import topics_app  # noqa: E402

app.add_typer(topics_app, name="topics")
perf_app = typer.Typer(
    no_args_is_help=True,
    help="Measure throughput and latency (kafka-producer-perf-test, kafka-consumer-perf-test).",
)
app.add_typer(perf_app, name="perf")


def _print_version(value: bool) -> None:
    """``--version``: ``replog <version>`` from the installed distribution's metadata."""
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("replog")
    except PackageNotFoundError:
        raise ReplogError(
            "replog is not installed, so it has no version: install it "
            "(pip install -e . in the checkout, or pip install replog)"
        ) from None
    typer.echo(f"replog {installed}")
    raise typer.Exit


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print replog's version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    pass


DataOption = Annotated[
    str, typer.Option("--data", help="directory or URL (s3://bucket/prefix) for the cluster's data")
]


@cluster_app.command("up")
def cluster_up(
    brokers: Annotated[int, typer.Option("--brokers", help="how many brokers")] = 3,
    data: DataOption = "replog-data",
    port_base: Annotated[int, typer.Option("--port-base", help="port of broker 0")] = 9092,
    kafka_port_base: Annotated[
        int,
        typer.Option(
            "--kafka-port-base",
            help="port of broker 0's Kafka listener, for Kafka clients (-1: no Kafka listener)",
        ),
    ] = 19092,
    metrics_port_base: Annotated[
        int,
        typer.Option(
            "--metrics-port-base",
            help="port of broker 0's Prometheus endpoint (/metrics); broker i gets base+i, the "
            "controller base+brokers (-1: no metrics endpoints)",
        ),
    ] = 9404,
    detach: Annotated[bool, typer.Option("--detach", help="return once the cluster is up")] = False,
    conf_dir: Annotated[
        str, typer.Option("--conf-dir", help="where broker.toml and controller.toml live")
    ] = "conf",
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="key=value for every node")
    ] = None,
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="SASL_SSL on every listener and ACLs on: makes a throwaway CA, users broker and "
            "admin, and <data>/secrets/client.properties for --command-config",
        ),
    ] = False,
) -> None:
    """Start a controller and N brokers on 127.0.0.1, each broker on its own storage root."""
    from pathlib import Path

    from replication.config import parse_overrides
    from replication.tools import local_cluster

    nodes = local_cluster.cluster_up(
        data,
        brokers,
        port_base,
        kafka_port_base=None if kafka_port_base < 0 else kafka_port_base,
        metrics_port_base=None if metrics_port_base < 0 else metrics_port_base,
        conf_dir=Path(conf_dir),
        overrides=parse_overrides(overrides or []),
        secure=secure,
    )
    bootstrap = ",".join(n.address for n in nodes if n.role == "broker")
    for n in nodes:
        typer.echo(f"{n.role} {n.node_id} on {n.address} (pid {n.pid}, log {n.log_file})")
    typer.echo(f"bootstrap servers: {bootstrap}")
    kafka = ",".join(f"127.0.0.1:{n.kafka_port}" for n in nodes if n.kafka_port)
    if kafka:
        typer.echo(f"Kafka clients (kcat, confluent-kafka, ...): {kafka}")
    metrics = ",".join(f"127.0.0.1:{n.metrics_port}" for n in nodes if n.metrics_port)
    if metrics:
        typer.echo(f"Prometheus targets (/metrics): {metrics}")
    if secure:
        from replication.tools import secure_cluster

        secured = secure_cluster.existing(local_cluster.ClusterLayout.of(data).run_dir)
        assert secured is not None
        typer.echo(
            "secured: SASL_SSL, ACLs on; the admin's client settings are in "
            f"{secured.client_properties}, e.g.\n"
            f"  replog topics list --bootstrap-server {bootstrap.split(',')[0]} "
            f"--command-config {secured.client_properties}"
        )
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

    from replication.tools import local_cluster

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
    from replication.tools import local_cluster

    nodes = local_cluster.cluster_down(data)
    typer.echo(f"stopped {len(nodes)} processes")


def _yes(value: bool) -> str:
    return "yes" if value else "no"


err_console = Console(stderr=True)


@log_app.command("dump")
def log_dump(
    path: Annotated[
        str,
        typer.Argument(
            help="a .seg object, a partition directory, a .wal object, or a broker's "
            "_replog/wal directory (path or URL)"
        ),
    ],
    records: Annotated[bool, typer.Option("--records", help="print every record too")] = False,
) -> None:
    """Print each batch of segment or WAL objects, as kafka-dump-log.sh does.

    A WAL object shows its header, whether its footer checks, then each partition's chunk and
    its batches; one whose footer does not check is scanned as recovery would, and the byte
    where its valid prefix ends is printed. Exit code 2 if anything is invalid.
    """
    from logstore.dump import dump

    bad = False
    for line in dump(path, records=records):
        typer.echo(line.text)
        bad = bad or line.error
    if bad:
        raise typer.Exit(2)


LogFormatOption = Annotated[
    str | None,
    typer.Option(
        "--log-format",
        help="text or json (one JSON object per line); the config key logging.format",
    ),
]


LogLevelOption = Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR")]


def _conf_option(node: str) -> Any:
    return typer.Option("--conf", help=f"{node} TOML file (see conf/); repeatable, later ones win")


def _set_option(example: str) -> Any:
    return typer.Option("--set", help=f"override one key: --set {example}")


@broker_app.command("start")
def broker_start(
    conf: Annotated[list[str] | None, _conf_option("broker")] = None,
    overrides: Annotated[list[str] | None, _set_option("broker.id=1")] = None,
    log_level: LogLevelOption = "INFO",
    log_format: LogFormatOption = None,
) -> None:
    """Start a broker in the foreground (SIGTERM or Ctrl-C stops it gracefully).

    By default it is also a controller candidate (process.roles=broker,controller): alone it
    is a whole cluster; beside a controller it stands by to take over.
    """
    _run_node(conf, {}, overrides, log_level, log_format)


@controller_app.command("start")
def controller_start(
    conf: Annotated[list[str] | None, _conf_option("controller")] = None,
    overrides: Annotated[list[str] | None, _set_option("broker.id=100")] = None,
    log_level: LogLevelOption = "INFO",
    log_format: LogFormatOption = None,
) -> None:
    """Start a controller alone (process.roles=controller) in the foreground."""
    _run_node(conf, {"process.roles": "controller"}, overrides, log_level, log_format)


def _run_node(
    conf: list[str] | None,
    defaults: dict[str, str],
    overrides: list[str] | None,
    log_level: str,
    log_format: str | None,
) -> None:
    """Run a node in the foreground: its config from ``conf``, then ``defaults``, the --set
    ``overrides`` and --log-format (later ones win)."""
    from replication.config import load_broker_config, parse_overrides
    from replication.server.node import run_node

    values = {**defaults, **parse_overrides(overrides or []), **_log_format(log_format)}
    run_node(load_broker_config(conf, values), log_level=log_level)


def _log_format(log_format: str | None) -> dict[str, str]:
    """``--log-format`` is ``--set logging.format=...``: the flag wins over the file."""
    return {} if log_format is None else {"logging.format": log_format}


@app.command("demo")
def demo(
    records: Annotated[int, typer.Option(help="how many synthetic events to write")] = 60_000,
    data: Annotated[
        str | None,
        typer.Option(help="directory for the cluster's data (default: a fresh temp dir)"),
    ] = None,
    chaos: Annotated[
        bool, typer.Option("--chaos/--no-chaos", help="SIGKILL a partition leader midway")
    ] = True,
) -> None:
    """The whole mission in one command: a 3-broker cluster on local files, a Spark pipeline
    replog -> transform -> replog with the exactly-once sink, a leader SIGKILLed midway, and a
    verification table. Exit status 0 only if nothing was lost or duplicated."""
    # The cluster's packages know no Spark: the demo is a Spark program of the datasource
    # side, run in this process's place (same interpreter, same signals, its exit status).
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise CommandError(
            "replog demo runs a Spark pipeline, and pyspark is not installed here (a broker-only "
            "install): install the Spark extra, `python3 -m pip install 'replog[spark]'` "
            "(from a checkout: `python3 -m pip install -e '.[spark]'`), then run it again"
        ) from None
    args = [sys.executable, "-m", "datasource.demo", "--records", str(records)]
    if data is not None:
        args += ["--data", data]
    if not chaos:
        args.append("--no-chaos")
    os.execv(sys.executable, args)


# --- clients: topics, produce, consume, perf ------------------------------------------------------


def _partitions_of(
    bootstrap: str, command_config: Path | None, topic: str, partition: int | None
) -> list[int]:
    """The partitions of ``topic`` (just ``partition`` if given, checked to exist)."""
    from replication.client.describe import describe_topic_waiting

    with admin_client(bootstrap, command_config) as admin:
        described = describe_topic_waiting(admin, topic)
    ids = [p.partition for p in described.partitions]
    if partition is None:
        return ids
    if partition not in ids:
        raise CommandError(
            f"--partition {partition}: topic {topic!r} has partitions 0..{len(ids) - 1}"
        )
    return [partition]


@app.command("produce")
def produce(
    topic: Annotated[str, typer.Argument(help="the topic to write to")],
    acks: Annotated[
        str, typer.Option("--acks", help="all (every in-sync replica), 1 (the leader) or 0")
    ] = "all",
    key_separator: Annotated[
        str | None,
        typer.Option("--key-separator", help="lines are KEY<SEP>VALUE (split at the first SEP)"),
    ] = None,
    partition: Annotated[
        int | None, typer.Option("--partition", help="write every record to this partition")
    ] = None,
    producer_property: Annotated[
        list[str] | None,
        typer.Option("--producer-property", help="a producer setting key=value, repeatable"),
    ] = None,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    command_config: CommandConfigOption = None,
) -> None:
    """Send each line of stdin as a record (as kafka-console-producer); flush at EOF.

    Prints nothing on success; if records could not be delivered, one line saying why and
    exit status 1.
    """
    from concurrent.futures import Future

    from replication.client import Producer

    props = key_values("--producer-property", producer_property)
    _partitions_of(bootstrap, command_config, topic, partition)  # the topic exists, or fail
    separator = None if key_separator is None else key_separator.encode()
    if separator == b"":
        raise CommandError("--key-separator must not be empty")
    failed: list[BaseException] = []

    def check(future: Future[Any]) -> None:
        error = future.exception()
        if error is not None:
            failed.append(error)

    producer = Producer(client_config(bootstrap, command_config, acks=acks, **props))
    sent = 0
    try:
        for number, raw in enumerate(sys.stdin.buffer, 1):
            key, value = _split_line(raw, number, separator)
            producer.send(topic, value, key=key, partition=partition).add_done_callback(check)
            sent += 1
        producer.flush()
    except BaseException:
        producer.close(timeout=5)  # deliver what was sent, briefly; the error comes first
        raise
    producer.close()
    if failed:
        raise CommandError(
            f"{len(failed)} of {sent} records were not delivered to {topic!r}; "
            f"first error: {failed[0]}"
        )


def _split_line(raw: bytes, number: int, separator: bytes | None) -> tuple[bytes | None, bytes]:
    """(key, value) of one stdin line (its line ending dropped)."""
    line = raw[:-1] if raw.endswith(b"\n") else raw
    if line.endswith(b"\r"):
        line = line[:-1]
    if separator is None:
        return None, line
    key, found, value = line.partition(separator)
    if not found:
        sep = separator.decode(errors="replace")
        raise CommandError(
            f"line {number} has no key separator {sep!r}: write KEY{sep}VALUE, "
            "or leave out --key-separator"
        )
    return key, value


_CONSOLE_PROPERTIES = (
    "print.key",
    "print.value",
    "print.partition",
    "print.offset",
    "print.timestamp",
    "key.separator",
    "line.separator",
    "null.literal",
)


@app.command("consume")
def consume(
    topic: Annotated[str, typer.Argument(help="the topic to read")],
    from_beginning: Annotated[
        bool, typer.Option("--from-beginning", help="start at the oldest record, not the end")
    ] = False,
    max_messages: Annotated[
        int | None, typer.Option("--max-messages", help="exit after this many records")
    ] = None,
    isolation_level: Annotated[
        str,
        typer.Option(
            "--isolation-level",
            help="read_committed hides aborted and open transactions' records",
        ),
    ] = "read_uncommitted",
    partition: Annotated[
        int | None, typer.Option("--partition", help="read only this partition")
    ] = None,
    offset: Annotated[
        str | None,
        typer.Option(
            "--offset", help="with --partition: earliest, latest or an offset to start at"
        ),
    ] = None,
    timeout_ms: Annotated[
        int | None,
        typer.Option("--timeout-ms", help="exit after this long without a new record"),
    ] = None,
    properties: Annotated[
        list[str] | None,
        typer.Option(
            "--property",
            help="output format: print.key, print.partition, print.offset, print.timestamp "
            "(true/false), key.separator, line.separator, null.literal",
        ),
    ] = None,
    consumer_property: Annotated[
        list[str] | None,
        typer.Option("--consumer-property", help="a consumer setting key=value, repeatable"),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            help="read as a member of this consumer group: its share of the partitions, from "
            "the group's committed offsets (else the end, or the start with "
            "--from-beginning), committing what was printed",
        ),
    ] = None,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    command_config: CommandConfigOption = None,
) -> None:
    """Print each record's value on its own line (as kafka-console-consumer).

    Runs until Ctrl-C, --max-messages records, or --timeout-ms without a new record; then
    prints "Processed a total of N messages" on stderr. With --group, the offsets after the
    records printed are committed to the group on the way out (and every 5 s), so the next
    run of the group goes on from there.
    """
    import time

    from replication.client import Consumer, TopicPartition

    if max_messages is not None and max_messages < 0:
        raise CommandError(f"--max-messages {max_messages}: must be 0 or more")
    if timeout_ms is not None and timeout_ms < 0:
        raise CommandError(f"--timeout-ms {timeout_ms}: must be 0 or more")
    start_at = _start_offset(offset, partition)
    fmt = key_values("--property", properties)
    unknown = sorted(set(fmt) - set(_CONSOLE_PROPERTIES))
    if unknown:
        raise CommandError(
            f"--property {unknown[0]}: unknown; known: {', '.join(_CONSOLE_PROPERTIES)}"
        )
    render = _formatter(fmt)
    membership: dict[str, str] = {}
    if group is not None:
        if partition is not None:
            raise CommandError(
                "--group and --partition: a group's members share the partitions the "
                "coordinator gives them; leave out one of the two"
            )
        if not group.strip():
            raise CommandError("--group '': give a consumer group id")
        membership = {
            "group.id": group,
            "auto.offset.reset": "earliest" if from_beginning else "latest",
        }
    config = client_config(
        bootstrap,
        command_config,
        **{"isolation.level": isolation_level},
        **membership,
        **key_values("--consumer-property", consumer_property),
    )
    partitions = _partitions_of(bootstrap, command_config, topic, partition)
    tps = [TopicPartition(topic, p) for p in partitions]
    out = sys.stdout.buffer
    count = 0
    with Consumer(config) as consumer:
        if group is not None:
            consumer.subscribe([topic])  # it starts at the group's offsets, or auto.offset.reset
        else:
            consumer.assign(tps)
            if isinstance(start_at, int):
                consumer.seek(tps[0], start_at)
            elif from_beginning or start_at == "earliest":
                consumer.seek_to_beginning()
            else:
                consumer.seek_to_end()
        last = time.monotonic()
        try:
            while max_messages is None or count < max_messages:
                wait_ms = 1000
                if timeout_ms is not None:
                    idle_ms = (time.monotonic() - last) * 1000
                    if idle_ms >= timeout_ms:
                        break
                    wait_ms = int(min(wait_ms, timeout_ms - idle_ms)) + 1
                fetched = consumer.poll_arrow(timeout_ms=wait_ms)
                if not fetched:
                    continue
                last = time.monotonic()
                for f in fetched:
                    rows = f.num_rows
                    if max_messages is not None:
                        rows = min(rows, max_messages - count)
                    if rows < f.num_rows:
                        # Fetched but not printed: the consumer's position (what a group
                        # commits) goes back to the first record not printed.
                        consumer.seek(f.topic_partition, f.batch.column("offset")[rows].as_py())
                    if rows <= 0:
                        continue
                    lines = render(f, rows)
                    count += rows  # before the write: Ctrl-C can land as a write returns
                    out.write(lines)
                out.flush()
        finally:
            typer.echo(f"Processed a total of {count} messages", err=True)


def _start_offset(offset: str | None, partition: int | None) -> str | int | None:
    if offset is None:
        return None
    if partition is None:
        raise CommandError("--offset needs --partition (an offset belongs to one partition)")
    if offset in ("earliest", "latest"):
        return offset
    try:
        value = int(offset)
    except ValueError:
        value = -1
    if value < 0:
        raise CommandError(f"--offset {offset!r}: expected earliest, latest or an offset >= 0")
    return value


def _formatter(props: dict[str, str]) -> Callable[[FetchedBatch, int], bytes]:
    """Kafka's DefaultMessageFormatter: [CreateTime:ts SEP][Partition:p SEP][Offset:o SEP]
    [key SEP]value, one record a line."""

    def flag(name: str, default: bool) -> bool:
        value = props.get(name)
        if value is None:
            return default
        if value.lower() not in ("true", "false"):
            raise CommandError(f"--property {name}={value}: expected true or false")
        return value.lower() == "true"

    show = {
        name: flag(f"print.{name}", name == "value")
        for name in ("timestamp", "partition", "offset", "key", "value")
    }
    sep = props.get("key.separator", "\t").encode()
    end = props.get("line.separator", "\n").encode()
    null = props.get("null.literal", "null").encode()

    def render(fetched: FetchedBatch, rows: int) -> bytes:
        batch = fetched.batch.slice(0, rows)
        values = [null if v is None else v for v in batch.column(2).to_pylist()]
        if not any(show[n] for n in ("timestamp", "partition", "offset", "key")):
            return end.join(values) + end if show["value"] else end * rows
        fields: list[list[bytes]] = []
        if show["timestamp"]:
            types = batch.column(4).to_pylist()
            stamps = batch.column(3).to_pylist()
            fields.append(
                [
                    f"{'LogAppendTime' if t == 1 else 'CreateTime'}:{ts}".encode()
                    for t, ts in zip(types, stamps, strict=True)
                ]
            )
        if show["partition"]:
            fields.append([f"Partition:{fetched.partition}".encode()] * rows)
        if show["offset"]:
            fields.append([f"Offset:{o}".encode() for o in batch.column(0).to_pylist()])
        if show["key"]:
            fields.append([null if k is None else k for k in batch.column(1).to_pylist()])
        if show["value"]:
            fields.append(values)
        return b"".join(sep.join(parts) + end for parts in zip(*fields, strict=True))

    return render


# --- perf ------------------------------------------------------------------------------------


@contextmanager
def _progress(total: int, what: str, enabled: bool) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr if it is a terminal; yields ``update(done)``."""
    if not enabled or total <= 0 or not err_console.is_terminal:
        yield lambda done: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        Task,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task: Task) -> Text:
            speed = task.speed
            return Text("" if speed is None else f"{speed:,.0f} records/s")

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=False,
    ) as bar:
        task = bar.add_task(what, total=total)
        yield lambda done: bar.update(task, completed=done)


@perf_app.command("produce")
def perf_produce(
    topic: Annotated[str, typer.Option("--topic", help="the topic to write to (must exist)")],
    num_records: Annotated[int, typer.Option("--num-records", help="how many records to send")],
    record_size: Annotated[int, typer.Option("--record-size", help="bytes of each value")],
    throughput: Annotated[
        float, typer.Option("--throughput", help="records/s to aim at (-1: as fast as possible)")
    ] = -1,
    acks: Annotated[str, typer.Option("--acks", help="all, 1 or 0")] = "1",
    batch_size: Annotated[
        int | None, typer.Option("--batch-size", help="producer batch.size in bytes")
    ] = None,
    linger_ms: Annotated[int | None, typer.Option("--linger-ms", help="producer linger.ms")] = None,
    compression_type: Annotated[
        str | None, typer.Option("--compression-type", help="none, lz4 or zstd")
    ] = None,
    mode: Annotated[
        str,
        typer.Option(
            "--mode",
            help="records: Producer.send per record (latency per record); arrow: send_arrow "
            "of Arrow tables, the Spark path (latency per batch)",
        ),
    ] = "records",
    partition: Annotated[
        int | None, typer.Option("--partition", help="send every record to this partition")
    ] = None,
    producer_props: Annotated[
        list[str] | None,
        typer.Option("--producer-props", help="any producer setting key=value, repeatable"),
    ] = None,
    latency_sample_every: Annotated[
        int,
        typer.Option("--latency-sample-every", help="records mode: time one record in this many"),
    ] = 16,
    arrow_batch_records: Annotated[
        int, typer.Option("--arrow-batch-records", help="arrow mode: rows per send_arrow call")
    ] = 10_000,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON line instead")] = False,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    command_config: CommandConfigOption = None,
) -> None:
    """Send records as fast as asked and report records/s, MB/s and latency percentiles
    (as kafka-producer-perf-test). Latency is send-to-ack: per record in records mode
    (sampled), per batch in arrow mode."""
    import json

    from replication.tools.perf import freeze_startup_heap, produce_perf

    if mode not in ("records", "arrow"):
        raise CommandError(f"--mode {mode!r}: expected records or arrow")
    freeze_startup_heap()
    with _progress(num_records, f"produce {topic}", not as_json) as update:
        result = produce_perf(
            bootstrap,
            topic,
            num_records,
            record_size,
            mode="arrow" if mode == "arrow" else "records",
            throughput=throughput,
            acks=acks,
            batch_size=batch_size,
            linger_ms=linger_ms,
            compression_type=compression_type,
            partition=partition,
            producer_props=key_values("--producer-props", producer_props),
            client_props=read_properties(command_config) if command_config else None,
            latency_sample_every=latency_sample_every,
            arrow_batch_records=arrow_batch_records,
            progress=update,
        )
    if as_json:
        typer.echo(json.dumps(result.to_json()))
    else:
        r = result
        basis = (
            f"per record, send() to ack, one in {r.latency_sample_every} records timed"
            if r.latency == "record"
            else "per batch, send_arrow() to the batch's ack"
        )
        typer.echo(
            f"{r.records} records sent, {r.records_per_s:,.1f} records/sec "
            f"({r.mb_per_s:.2f} MB/sec), {r.latency_avg_ms:.2f} ms avg latency, "
            f"{r.latency_max_ms:.2f} ms max latency, {r.latency_p50_ms:.2f} ms 50th, "
            f"{r.latency_p95_ms:.2f} ms 95th, {r.latency_p99_ms:.2f} ms 99th "
            f"(latency {basis}; acks={r.acks}, mode={r.mode})."
        )
    if result.errors:
        raise CommandError(
            f"{result.errors} sends failed "
            f"({'sampled records' if result.latency == 'record' else 'batches'}); "
            f"first error: {result.first_error}"
        )


@perf_app.command("consume")
def perf_consume(
    topic: Annotated[str, typer.Option("--topic", help="the topic to read from the beginning")],
    messages: Annotated[int, typer.Option("--messages", help="how many records to read")],
    timeout: Annotated[
        int, typer.Option("--timeout", help="ms without a record before giving up")
    ] = 10_000,
    fetch_size: Annotated[
        int | None,
        typer.Option("--fetch-size", help="max.partition.fetch.bytes (bytes per partition)"),
    ] = None,
    consumer_props: Annotated[
        list[str] | None,
        typer.Option("--consumer-props", help="any consumer setting key=value, repeatable"),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option("--group", help="read as this consumer group (subscribe) instead of assign()"),
    ] = None,
    members: Annotated[
        int, typer.Option("--members", help="with --group: consumers in the group (threads)")
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON line instead")] = False,
    bootstrap: BootstrapOption = DEFAULT_BOOTSTRAP,
    command_config: CommandConfigOption = None,
) -> None:
    """Read records from the beginning and report records/s and MB/s (key and value bytes),
    as kafka-consumer-perf-test. With --group, --members consumers of one group share the
    topic; the time of the first rebalance is reported apart (join_s)."""
    import json

    from replication.tools.perf import consume_group_perf, consume_perf

    if group is not None:
        grouped = consume_group_perf(
            bootstrap,
            topic,
            messages,
            group=group,
            members=members,
            timeout_ms=timeout,
            consumer_props=key_values("--consumer-props", consumer_props),
            client_props=read_properties(command_config) if command_config else None,
        )
        if as_json:
            typer.echo(json.dumps(grouped.to_json()))
        else:
            typer.echo(
                f"{grouped.records} records read by {grouped.members} members of group "
                f"{grouped.group}, {grouped.records_per_s:,.1f} records/sec "
                f"({grouped.mb_per_s:.2f} MB/sec); first rebalance {grouped.join_s:.3f} s."
            )
        return

    with _progress(messages, f"consume {topic}", not as_json) as update:
        result = consume_perf(
            bootstrap,
            topic,
            messages,
            timeout_ms=timeout,
            fetch_size=fetch_size,
            consumer_props=key_values("--consumer-props", consumer_props),
            client_props=read_properties(command_config) if command_config else None,
            progress=update,
        )
    if as_json:
        typer.echo(json.dumps(result.to_json()))
    else:
        r = result
        typer.echo(
            f"{r.records} records read, {r.records_per_s:,.1f} records/sec "
            f"({r.mb_per_s:.2f} MB/sec, {r.bytes} bytes in {r.elapsed_s:.3f} s)."
        )
    if not result.complete:
        err_console.print(
            f"warning: only {result.records} of {messages} records came before {timeout} ms "
            f"passed without one; produce more, or lower --messages",
            highlight=False,
            soft_wrap=True,
        )


def main(argv: list[str] | None = None) -> None:
    """Run the CLI: errors a user can cause (ReplogError, bad flags) are one line on stderr and
    exit status 1; Ctrl-C exits with 130; tracebacks are for bugs only."""
    try:
        code = app(args=argv, prog_name="replog", standalone_mode=False)
    except ReplogError as err:
        _fail(str(err))
    except click_errors.NoArgsIsHelpError as err:
        # `replog`, `replog topics`, ... alone: the help, as click shows it (with rich, typer
        # has printed it already and the message is empty)
        if err.format_message().strip():
            err.show()
        sys.exit(2)
    except click_errors.UsageError as err:
        where = f"`{err.ctx.command_path} --help`" if err.ctx is not None else "`replog --help`"
        _fail(f"{err.format_message()} (see {where})")
    except click_errors.ClickException as err:
        _fail(err.format_message())
    except typer.Abort:
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str) -> None:
    text = " ".join(message.split())  # one line, whatever the message held
    # the message is text, not markup: "replog[spark]" must print as written
    err_console.print(
        f"[red]error:[/red] {escape(text)}", highlight=False, soft_wrap=True, markup=True
    )
    sys.exit(1)


if __name__ == "__main__":
    main()
