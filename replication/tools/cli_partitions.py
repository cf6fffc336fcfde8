"""``replog partitions`` and ``replog brokers``: move partitions, elect leaders, decommission
brokers, as Kafka's kafka-reassign-partitions.sh, kafka-leader-election.sh and
kafka-cluster.sh.

    replog partitions reassign --reassignment-json-file moves.json [--throttle 1048576]
    replog partitions reassign --reassignment-json-file moves.json --verify
    replog partitions reassign --reassignment-json-file moves.json --cancel
    replog partitions reassign --generate --topics-to-move-json-file topics.json --broker-list 1,2,3
    replog partitions elect-leaders --election-type preferred --all-topic-partitions
    replog brokers decommission --broker-id 3
    replog brokers unregister --broker-id 3

A reassignment file is Kafka's: ``{"version": 1, "partitions": [{"topic": "t", "partition": 0,
"replicas": [1, 2, 3]}]}``; a topics-to-move file ``{"version": 1, "topics": [{"topic": "t"}]}``.
The CLI registers :data:`partitions_app` under ``partitions`` and :data:`brokers_app` under
``brokers``. Errors are one line on stderr and exit status 1, as every replog command.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from replication.common import TopicPartition
from replication.errors import InvalidReplicaAssignmentError, InvalidRequestError
from replication.tools.cli_common import BootstrapOption, CommandConfigOption, admin_client

#: Admin.alter_partition_reassignments' argument: new replicas, or None to cancel
Moves = dict[TopicPartition | tuple[str, int], Sequence[int] | None]

__all__ = ["brokers_app", "partitions_app"]

partitions_app = typer.Typer(
    no_args_is_help=True,
    help="Move partitions between brokers and elect leaders (as kafka-reassign-partitions, "
    "kafka-leader-election).",
)
brokers_app = typer.Typer(
    no_args_is_help=True, help="Decommission and unregister brokers (as kafka-cluster)."
)


@partitions_app.callback()
def _partitions() -> None:
    """Move partitions between brokers and elect leaders (as kafka-reassign-partitions)."""


@brokers_app.callback()
def _brokers() -> None:
    """Decommission and unregister brokers (as kafka-cluster)."""


ThrottleOption = Annotated[
    int,
    typer.Option(
        "--throttle",
        min=0,
        help="bytes/s the new replicas may fetch at while they catch up (0: no limit)",
    ),
]


def _read_json(path: Path, flag: str) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as err:
        raise InvalidRequestError(f"cannot read {flag} {path}: {err.strerror or err}") from err
    except ValueError as err:
        raise InvalidReplicaAssignmentError(f"{flag} {path} is not JSON: {err}") from err


def read_reassignment(path: Path) -> dict[tuple[str, int], list[int]]:
    """The partitions and target replicas of a Kafka reassignment JSON file."""
    doc = _read_json(path, "--reassignment-json-file")
    example = '{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,2,3]}]}'
    parts = doc.get("partitions") if isinstance(doc, dict) else None
    if not isinstance(parts, list) or not parts:
        raise InvalidReplicaAssignmentError(
            f"--reassignment-json-file {path} names no partitions; expected {example}"
        )
    out: dict[tuple[str, int], list[int]] = {}
    for entry in parts:
        topic = entry.get("topic") if isinstance(entry, dict) else None
        index = entry.get("partition") if isinstance(entry, dict) else None
        replicas = entry.get("replicas") if isinstance(entry, dict) else None
        if (
            not isinstance(topic, str)
            or not isinstance(index, int)
            or not isinstance(replicas, list)
            or not all(isinstance(r, int) for r in replicas)
        ):
            raise InvalidReplicaAssignmentError(
                f"--reassignment-json-file {path}: entry {json.dumps(entry)} needs a string "
                f"topic, an integer partition and a list of broker ids; expected {example}"
            )
        if (topic, index) in out:
            raise InvalidReplicaAssignmentError(
                f"--reassignment-json-file {path} names {topic}-{index} twice"
            )
        out[(topic, index)] = list(replicas)
    return out


def reassignment_json(plan: dict[Any, list[int]]) -> str:
    """Kafka's reassignment JSON for ``plan`` ((topic, partition) -> replicas)."""
    return json.dumps(
        {
            "version": 1,
            "partitions": [
                {"topic": t, "partition": i, "replicas": list(r)}
                for (t, i), r in sorted(plan.items())
            ],
        }
    )


def _current(admin: Any, topics: list[str]) -> dict[tuple[str, int], list[int]]:
    return {
        (d.name, p.partition): list(p.replicas)
        for d in admin.describe_topics(topics)
        for p in d.partitions
    }


@partitions_app.command("reassign")
def reassign(
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
    reassignment_file: Annotated[
        Path | None,
        typer.Option(
            "--reassignment-json-file",
            help='Kafka\'s JSON: {"version":1,"partitions":[{"topic":..,"partition":..,'
            '"replicas":[..]}]}',
        ),
    ] = None,
    throttle: ThrottleOption = 0,
    verify: Annotated[
        bool, typer.Option("--verify", help="report each partition's progress")
    ] = False,
    cancel: Annotated[
        bool, typer.Option("--cancel", help="cancel the file's moves in progress")
    ] = False,
    generate: Annotated[
        bool,
        typer.Option(
            "--generate",
            help="propose moving --topics-to-move-json-file's topics onto --broker-list",
        ),
    ] = False,
    topics_file: Annotated[
        Path | None,
        typer.Option("--topics-to-move-json-file", help='{"version":1,"topics":[{"topic":"t"}]}'),
    ] = None,
    broker_list: Annotated[
        str | None, typer.Option("--broker-list", help="broker ids, comma separated: 1,2,3")
    ] = None,
) -> None:
    """Move partitions to new replicas (execute), follow (--verify), cancel (--cancel), or
    propose a plan (--generate)."""
    if sum((verify, cancel, generate)) > 1:
        raise InvalidRequestError("use one of --verify, --cancel, --generate")
    if generate:
        if topics_file is None or broker_list is None:
            raise InvalidRequestError(
                "--generate needs --topics-to-move-json-file and --broker-list"
            )
        _generate(bootstrap, command_config, topics_file, broker_list)
        return
    if reassignment_file is None:
        raise InvalidRequestError(
            "--reassignment-json-file is required (or --generate to propose one)"
        )
    plan = read_reassignment(reassignment_file)
    with admin_client(bootstrap, command_config) as admin:
        if verify:
            _verify(admin, plan)
        elif cancel:
            ongoing = admin.list_partition_reassignments(list(plan))
            todo: Moves = {tp: None for tp in plan if tp in ongoing}
            if todo:
                admin.alter_partition_reassignments(todo)
            shown = ",".join(f"{t}-{i}" for t, i in sorted(todo))
            typer.echo(f"Successfully cancelled partition reassignments for: {shown or 'none'}")
            idle = sorted(set(plan) - set(todo))
            if idle:
                typer.echo(
                    "Not in progress (nothing to cancel): " + ",".join(f"{t}-{i}" for t, i in idle)
                )
        else:
            current = _current(admin, sorted({t for t, _ in plan}))
            unknown = sorted(set(plan) - set(current))
            if unknown:
                raise InvalidReplicaAssignmentError(
                    "--reassignment-json-file names partitions that do not exist: "
                    + ", ".join(f"{t}-{i}" for t, i in unknown)
                )
            typer.echo("Current partition replica assignment\n")
            typer.echo(reassignment_json({tp: current[tp] for tp in plan}))
            typer.echo("\nSave this to use as the --reassignment-json-file option during rollback")
            moves: Moves = {tp: replicas for tp, replicas in plan.items()}  # noqa: C416 (mypy: keys)
            admin.alter_partition_reassignments(moves, throttle=throttle)
            if throttle:
                typer.echo(f"The catch-up of the new replicas is throttled to {throttle} B/s.")
            typer.echo(
                "Successfully started partition reassignments for "
                + ",".join(f"{t}-{i}" for t, i in sorted(plan))
            )


def _verify(admin: Any, plan: dict[tuple[str, int], list[int]]) -> None:
    ongoing = admin.list_partition_reassignments(list(plan))
    current = _current(admin, sorted({t for t, _ in plan}))
    typer.echo("Status of partition reassignment:")
    for tp in sorted(plan):
        name = f"{tp[0]}-{tp[1]}"
        moving = ongoing.get(tp)
        if moving is not None:
            typer.echo(
                f"Reassignment of partition {name} is still in progress: replicas "
                f"{list(moving.replicas)}, adding {list(moving.adding_replicas)}, removing "
                f"{list(moving.removing_replicas)}."
            )
        elif current.get(tp) == plan[tp]:
            typer.echo(f"Reassignment of partition {name} is complete.")
        else:
            typer.echo(
                f"Reassignment of partition {name} is not in progress and its replicas "
                f"{current.get(tp)} are not the target {plan[tp]} (cancelled or replaced)."
            )


def _generate(
    bootstrap: str, command_config: Path | None, topics_file: Path, broker_list: str
) -> None:
    from replication.client.reassignments import generate_assignment

    doc = _read_json(topics_file, "--topics-to-move-json-file")
    entries = doc.get("topics") if isinstance(doc, dict) else None
    if (
        not isinstance(entries, list)
        or not entries
        or not all(isinstance(e, dict) and isinstance(e.get("topic"), str) for e in entries)
    ):
        raise InvalidReplicaAssignmentError(
            f"--topics-to-move-json-file {topics_file}: expected "
            '{"version":1,"topics":[{"topic":"t"}]}'
        )
    try:
        brokers = [int(b) for b in broker_list.split(",") if b.strip()]
    except ValueError as err:
        raise InvalidRequestError(
            f"--broker-list {broker_list!r}: expected broker ids, e.g. 1,2,3"
        ) from err
    with admin_client(bootstrap, command_config) as admin:
        described = admin.describe_topics([e["topic"] for e in entries])
    current = {(d.name, p.partition): list(p.replicas) for d in described for p in d.partitions}
    proposed = generate_assignment(described, brokers)
    typer.echo("Current partition replica assignment")
    typer.echo(reassignment_json(current))
    typer.echo("\nProposed partition reassignment configuration")
    typer.echo(reassignment_json({(tp.topic, tp.partition): r for tp, r in proposed.items()}))


@partitions_app.command("elect-leaders")
def elect_leaders(
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
    election_type: Annotated[
        str,
        typer.Option(
            "--election-type",
            help="preferred (the first replica, if in sync) or unclean (may lose records)",
        ),
    ] = "preferred",
    topic: Annotated[str | None, typer.Option("--topic", help="the topic")] = None,
    partition: Annotated[
        int | None, typer.Option("--partition", help="the partition (with --topic)")
    ] = None,
    all_partitions: Annotated[
        bool, typer.Option("--all-topic-partitions", help="every partition")
    ] = False,
) -> None:
    """Elect leaders (as kafka-leader-election)."""
    kind: Literal["preferred", "unclean"]
    if election_type.lower() == "preferred":
        kind = "preferred"
    elif election_type.lower() == "unclean":
        kind = "unclean"
    else:
        raise InvalidRequestError(f"--election-type {election_type!r}: use preferred or unclean")
    if all_partitions == (topic is not None):
        raise InvalidRequestError("name --topic (and --partition) or --all-topic-partitions")
    if partition is not None and topic is None:
        raise InvalidRequestError("--partition needs --topic")
    with admin_client(bootstrap, command_config) as admin:
        wanted: list[tuple[str, int]] | None = None
        if topic is not None:
            ids = [p.partition for p in admin.describe_topic(topic).partitions]
            if partition is not None and partition not in ids:
                raise InvalidRequestError(
                    f"--partition {partition}: topic {topic!r} has partitions 0..{len(ids) - 1}"
                )
            wanted = [(topic, partition)] if partition is not None else [(topic, i) for i in ids]
        results = admin.elect_leaders(kind, wanted)
    elected = sorted(f"{tp.topic}-{tp.partition}" for tp, err in results.items() if err is None)
    failed = {f"{tp.topic}-{tp.partition}": err for tp, err in results.items() if err is not None}
    not_needed = sorted(
        n for n, err in failed.items() if type(err).__name__ == "ElectionNotNeededError"
    )
    if elected:
        typer.echo(
            f"Successfully completed leader election ({kind}) for partitions {', '.join(elected)}"
        )
    if not_needed:
        typer.echo(f"Valid replica already elected for partitions {', '.join(not_needed)}")
    if not elected and not failed:
        typer.echo("No partition needed an election.")
    errors = {n: e for n, e in failed.items() if n not in not_needed}
    if errors:
        for name, err in sorted(errors.items()):
            typer.echo(f"Error completing leader election ({kind}) for partition {name}: {err}")
        raise typer.Exit(1)


@brokers_app.command("decommission")
def decommission(
    broker_id: Annotated[int, typer.Option("--broker-id", help="the broker to empty")],
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
    throttle: ThrottleOption = 0,
    timeout: Annotated[
        float, typer.Option("--timeout", help="seconds to wait for the moves to complete")
    ] = 600.0,
) -> None:
    """Move every replica off a broker onto the other live brokers (keeping each partition's
    replication factor, spreading them by load), wait for the moves, then unregister it once
    it is stopped."""
    from replication.client.reassignments import plan_decommission

    with admin_client(bootstrap, command_config) as admin:
        cluster = admin.describe_cluster()
        live = [b.node_id for b in cluster.brokers]
        topics = admin.describe_topics(admin.list_topics(include_internal=True))
        plan = plan_decommission(broker_id, topics, live)
        if plan:
            typer.echo(f"Moving {len(plan)} partition(s) off broker {broker_id}:")
            typer.echo(reassignment_json({(tp.topic, tp.partition): r for tp, r in plan.items()}))
            moves: Moves = {tp: replicas for tp, replicas in plan.items()}  # noqa: C416 (mypy: keys)
            admin.alter_partition_reassignments(moves, throttle=throttle)
        deadline = time.monotonic() + timeout
        while True:
            holding = [
                f"{d.name}-{p.partition}"
                for d in admin.describe_topics(admin.list_topics(include_internal=True))
                for p in d.partitions
                if broker_id in p.replicas
            ]
            if not holding:
                break
            if time.monotonic() > deadline:
                raise InvalidRequestError(
                    f"broker {broker_id} still holds replicas of {', '.join(holding[:5])} after "
                    f"{timeout:g} s; follow with `replog partitions reassign --verify` and run "
                    "this again"
                )
            time.sleep(0.5)
        typer.echo(f"Broker {broker_id} holds no replicas.")
        if broker_id in [b.node_id for b in admin.describe_cluster().brokers]:
            typer.echo(
                f"Broker {broker_id} is still running: stop it, then run `replog brokers "
                f"unregister --broker-id {broker_id}` (a running broker registers again)."
            )
            return
        admin.unregister_broker(broker_id)
        typer.echo(f"Broker {broker_id} unregistered.")


@brokers_app.command("unregister")
def unregister(
    broker_id: Annotated[int, typer.Option("--broker-id", help="the broker to unregister")],
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
) -> None:
    """Remove a stopped broker's registration (refused while it holds replicas)."""
    with admin_client(bootstrap, command_config) as admin:
        admin.unregister_broker(broker_id)
    typer.echo(f"Broker {broker_id} unregistered.")
