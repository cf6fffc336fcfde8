"""``replog users`` (SCRAM credentials) and ``replog acls`` (ACLs), as Kafka's
kafka-configs.sh ``--alter --add-config 'SCRAM-SHA-512=[password=...]'`` and kafka-acls.sh.

    replog users add alice                                    # asks for the password (hidden)
    replog users add alice --mechanism SCRAM-SHA-256 --password-file alice.txt
    replog users add broker --metadata-log-dir s3://bucket/cluster/__cluster_metadata
    replog users list
    replog users delete alice --mechanism SCRAM-SHA-256
    replog acls add --allow-principal User:alice --operation Read --operation Describe \\
        --topic events
    replog acls add --allow-principal User:sink --operation Write --transactional-id \\
        replog-sink/ --resource-pattern-type prefixed
    replog acls list --topic events
    replog acls remove --allow-principal User:alice --operation Read --topic events

A password is never an argument (it would show in the process list and the shell history): it
is read from ``--password-file`` (its first line; ``-`` for stdin) or asked for without echo.
The client salts it and sends only the salted form (AlterUserScramCredentials).

``security init`` makes a whole new cluster's secrets at once (the Docker demo's secrets-init
service; :func:`replication.tools.secure_cluster.init_secrets`, as ``cluster up --secure``):

    replog security init --dir /secrets --conf conf/docker/controller.toml --host broker-0

``users add --metadata-log-dir`` writes the user straight into the metadata of a cluster that
has not started yet: a cluster whose brokers authenticate to each other with SASL needs the
brokers' user before any broker can register (Kafka's ``kafka-storage format --add-scram``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from logstore.errors import ConfigError
from replication.tools.cli_common import BootstrapOption, CommandConfigOption, admin_client

if TYPE_CHECKING:
    from replication.security.acl import AclBinding

__all__ = ["acls_app", "security_app", "users_app"]

users_app = typer.Typer(
    no_args_is_help=True,
    help="SCRAM users: add, list, delete (as kafka-configs --entity-type users; passwords "
    "are never arguments).",
)
acls_app = typer.Typer(
    no_args_is_help=True,
    help="ACLs: add, list, remove (as kafka-acls).",
)

MechanismOption = Annotated[str, typer.Option("--mechanism", help="SCRAM-SHA-256 or SCRAM-SHA-512")]


def _mechanism(name: str) -> str:
    from replication.security.scram import MECHANISMS

    upper = name.strip().upper()
    if upper not in MECHANISMS:
        raise ConfigError(f"--mechanism {name!r}: use {' or '.join(MECHANISMS)}")
    return upper


def _password(user: str, password_file: str | None) -> str:
    """The password: the first line of ``password_file`` (``-``: stdin), or asked for twice
    without echo."""
    if password_file is None:
        password: str = typer.prompt(
            f"Password for {user}", hide_input=True, confirmation_prompt=True
        )
    elif password_file == "-":
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        try:
            text = Path(password_file).read_text(encoding="utf-8")
        except OSError as err:
            raise ConfigError(
                f"--password-file {password_file}: cannot read it ({err.strerror})"
            ) from None
        password = text.splitlines()[0] if text else ""
    if not password:
        raise ConfigError(f"the password for {user} is empty")
    return password


# --- users ---------------------------------------------------------------------------------------


@users_app.command("add")
def users_add(
    name: Annotated[str, typer.Argument(help="the user name (its principal: User:NAME)")],
    mechanism: MechanismOption = "SCRAM-SHA-512",
    iterations: Annotated[
        int, typer.Option("--iterations", help="PBKDF2 iterations, 4096 to 16384")
    ] = 8192,
    password_file: Annotated[
        str | None,
        typer.Option(
            "--password-file",
            help="read the password from this file's first line (- for stdin); default: ask",
            show_default=False,
        ),
    ] = None,
    metadata_log_dir: Annotated[
        str | None,
        typer.Option(
            "--metadata-log-dir",
            help="write the user into the metadata of a cluster not yet started (its "
            "metadata.log.dir URL), for the brokers' own user with SASL between brokers",
            show_default=False,
        ),
    ] = None,
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
) -> None:
    """Add a user, or set a new password for one (a SCRAM credential for one mechanism)."""
    mech = _mechanism(mechanism)
    from replication.security.scram import MAX_ITERATIONS, MIN_ITERATIONS

    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ConfigError(
            f"--iterations {iterations}: use {MIN_ITERATIONS} to {MAX_ITERATIONS} (e.g. 8192)"
        )
    if not name:
        raise ConfigError("the user name is empty")
    password = _password(name, password_file)
    if metadata_log_dir is not None:
        from logstore.storage import Storage
        from replication.controller.acl_control import bootstrap_credentials
        from replication.metadata.store import MetadataStore
        from replication.security.scram import new_credential

        try:
            credential = new_credential(name, mech, password, iterations)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        store = MetadataStore(Storage.from_url(metadata_log_dir))
        written = bootstrap_credentials(store, [credential])
        typer.echo(
            f"Added {mech} credential for user {name} to {metadata_log_dir} "
            f"(metadata version {written.version})."
        )
        return
    from replication.client.admin import UserScramCredentialUpsertion

    with admin_client(bootstrap, command_config) as admin:
        admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(name, password, mech, iterations)]
        )
    typer.echo(f"Set {mech} credential for user {name}.")


@users_app.command("list")
def users_list(
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """The users with SCRAM credentials: each mechanism and its iteration count."""
    with admin_client(bootstrap, command_config) as admin:
        users = admin.describe_user_scram_credentials()
    if as_json:
        typer.echo(json.dumps(users, sort_keys=True))
        return
    if not users:
        typer.echo("No SCRAM users.")
        return
    for user in sorted(users):
        shown = ", ".join(f"{m} (iterations={i})" for m, i in sorted(users[user].items()))
        typer.echo(f"{user}: {shown}")


@users_app.command("delete")
def users_delete(
    name: Annotated[str, typer.Argument(help="the user name")],
    mechanism: Annotated[
        str | None,
        typer.Option(
            "--mechanism",
            help="only this mechanism's credential (default: all)",
            show_default=False,
        ),
    ] = None,
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
) -> None:
    """Delete a user's SCRAM credentials (one mechanism's with --mechanism)."""
    with admin_client(bootstrap, command_config) as admin:
        if mechanism is not None:
            mechanisms = [_mechanism(mechanism)]
        else:
            mechanisms = sorted(admin.describe_user_scram_credentials([name]).get(name, {}))
        admin.alter_user_scram_credentials(deletions=[(name, m) for m in mechanisms])
    typer.echo(f"Deleted {', '.join(mechanisms)} credential(s) of user {name}.")


# --- ACLs ----------------------------------------------------------------------------------------

#: kafka-acls' operation names (case and separators ignored) and the AclOperation of each
_OPERATIONS: Final = {
    "all": "ALL",
    "read": "READ",
    "write": "WRITE",
    "create": "CREATE",
    "delete": "DELETE",
    "alter": "ALTER",
    "describe": "DESCRIBE",
    "clusteraction": "CLUSTER_ACTION",
    "describeconfigs": "DESCRIBE_CONFIGS",
    "alterconfigs": "ALTER_CONFIGS",
    "idempotentwrite": "IDEMPOTENT_WRITE",
}
_SHOWN_OPERATIONS: Final = (
    "All, Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, "
    "AlterConfigs, IdempotentWrite"
)


def _many(flag: str, help_text: str) -> Any:
    return typer.Option(flag, help=help_text, show_default=False)


AllowPrincipal = Annotated[
    list[str] | None, _many("--allow-principal", "principal to allow (User:NAME), repeatable")
]
DenyPrincipal = Annotated[
    list[str] | None, _many("--deny-principal", "principal to deny (User:NAME), repeatable")
]
AllowHost = Annotated[
    list[str] | None, _many("--allow-host", "host the allowed principals may come from (*)")
]
DenyHost = Annotated[
    list[str] | None, _many("--deny-host", "host the denied principals are denied from (*)")
]
Operation = Annotated[list[str] | None, _many("--operation", f"repeatable: {_SHOWN_OPERATIONS}")]
Topic = Annotated[list[str] | None, _many("--topic", "topic name (or prefix, or *), repeatable")]
Group = Annotated[list[str] | None, _many("--group", "consumer group, repeatable")]
TransactionalId = Annotated[
    list[str] | None, _many("--transactional-id", "transactional id, repeatable")
]
Cluster = Annotated[bool, typer.Option("--cluster", help="the cluster resource")]
ProducerOption = Annotated[
    bool,
    typer.Option(
        "--producer",
        help="what a producer needs: Write, Describe, Create on --topic; Write, Describe on "
        "--transactional-id",
    ),
]
ConsumerOption = Annotated[
    bool,
    typer.Option(
        "--consumer", help="what a consumer needs: Read, Describe on --topic; Read on --group"
    ),
]
PatternOption = Annotated[
    str | None,
    typer.Option(
        "--resource-pattern-type",
        help="literal or prefixed (list and remove also take any and match)",
        show_default=False,
    ),
]


def _operation(name: str) -> Any:
    from replication.security.acl import AclOperation

    key = name.replace("_", "").replace("-", "").lower()
    if key not in _OPERATIONS:
        raise ConfigError(f"--operation {name!r}: use one of {_SHOWN_OPERATIONS}")
    return AclOperation[_OPERATIONS[key]]


def _pattern(name: str | None, default: str, allowed: tuple[str, ...]) -> Any:
    from replication.security.acl import PatternType

    chosen = (name or default).lower()
    if chosen not in allowed:
        raise ConfigError(f"--resource-pattern-type {name!r}: use {' or '.join(allowed)}")
    return PatternType[chosen.upper()]


def _resources(
    topic: list[str] | None,
    group: list[str] | None,
    transactional_id: list[str] | None,
    cluster: bool,
    *,
    required: bool = False,
) -> list[tuple[Any, str]]:
    """The resources the flags name; with ``required``, at least one."""
    from replication.security.acl import CLUSTER_NAME, ResourceType

    out = [(ResourceType.TOPIC, n) for n in topic or ()]
    out += [(ResourceType.GROUP, n) for n in group or ()]
    out += [(ResourceType.TRANSACTIONAL_ID, n) for n in transactional_id or ()]
    if cluster:
        out.append((ResourceType.CLUSTER, CLUSTER_NAME))
    if required and not out:
        raise ConfigError(
            "name a resource: --topic NAME, --group NAME, --transactional-id ID or --cluster"
        )
    return out


def _principals(flag: str, values: list[str] | None) -> list[str]:
    from replication.security.principal import KafkaPrincipal

    out = []
    for value in values or ():
        try:
            out.append(str(KafkaPrincipal.parse(value)))
        except ValueError as err:
            raise ConfigError(f"{flag} {value!r}: {err}") from None
    return out


def _entries(
    allow_principal: list[str] | None,
    deny_principal: list[str] | None,
    allow_host: list[str] | None,
    deny_host: list[str] | None,
) -> list[tuple[str, str, Any]]:
    """(principal, host, permission) of every principal flag with its hosts (default *)."""
    from replication.security.acl import AclPermissionType

    out = []
    for principal in _principals("--allow-principal", allow_principal):
        for host in allow_host or ["*"]:
            out.append((principal, host, AclPermissionType.ALLOW))
    for principal in _principals("--deny-principal", deny_principal):
        for host in deny_host or ["*"]:
            out.append((principal, host, AclPermissionType.DENY))
    return out


#: kafka-acls' --producer: the operations a producer needs, by resource type
_PRODUCER: Final = {
    "TOPIC": ("WRITE", "DESCRIBE", "CREATE"),
    "TRANSACTIONAL_ID": ("WRITE", "DESCRIBE"),
}
#: kafka-acls' --consumer: the operations a consumer needs, by resource type
_CONSUMER: Final = {"TOPIC": ("READ", "DESCRIBE"), "GROUP": ("READ",)}


def _operations(
    resources: list[tuple[Any, str]],
    operations: list[str] | None,
    producer: bool,
    consumer: bool,
) -> list[tuple[Any, str, Any]]:
    """(resource type, name, operation) of every ACL the flags ask for: --operation (default
    All) on every resource, or kafka-acls' --producer / --consumer sets."""
    from replication.security.acl import AclOperation

    if not producer and not consumer:
        ops = [_operation(o) for o in operations or ["All"]]
        return [(rtype, name, op) for rtype, name in resources for op in ops]
    if operations:
        raise ConfigError("give --operation, or --producer / --consumer, not both")
    if producer and not any(t.name == "TOPIC" for t, _ in resources):
        raise ConfigError("--producer needs --topic (and --transactional-id for transactions)")
    if consumer and not (
        any(t.name == "TOPIC" for t, _ in resources)
        and any(t.name == "GROUP" for t, _ in resources)
    ):
        raise ConfigError("--consumer needs --topic and --group")
    out: list[tuple[Any, str, Any]] = []
    for rtype, name in resources:
        wanted: dict[str, None] = {}
        for chosen, table in ((producer, _PRODUCER), (consumer, _CONSUMER)):
            if chosen:
                wanted.update(dict.fromkeys(table.get(rtype.name, ())))
        if not wanted:
            raise ConfigError(
                f"--{'producer' if producer else 'consumer'} does not apply to "
                f"{rtype.name.lower()} {name!r}"
            )
        out += [(rtype, name, AclOperation[op]) for op in wanted]
    return out


def _shown(b: AclBinding) -> str:
    return (
        f"(principal={b.principal}, host={b.host}, operation={b.operation.name}, "
        f"permissionType={b.permission.name})"
    )


def _print_acls(bindings: list[AclBinding]) -> None:
    by_resource: dict[tuple[Any, str, Any], list[AclBinding]] = {}
    for b in bindings:
        by_resource.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(b)
    for (rtype, name, pattern), found in by_resource.items():
        typer.echo(
            f"Current ACLs for resource `ResourcePattern(resourceType={rtype.name}, "
            f"name={name}, patternType={pattern.name})`:"
        )
        for b in found:
            typer.echo(f"\t{_shown(b)}")
        typer.echo("")


@dataclasses.dataclass(frozen=True)
class _AclChange:
    """What ``acls add`` and ``acls remove`` are given (kafka-acls --add / --remove take the
    same options)."""

    allow_principal: list[str] | None
    deny_principal: list[str] | None
    allow_host: list[str] | None
    deny_host: list[str] | None
    operation: list[str] | None
    topic: list[str] | None
    group: list[str] | None
    transactional_id: list[str] | None
    cluster: bool
    resource_pattern_type: str | None
    producer: bool
    consumer: bool
    force: bool

    def resources(self) -> list[tuple[Any, str]]:
        return _resources(
            self.topic, self.group, self.transactional_id, self.cluster, required=True
        )

    def entries(self) -> list[tuple[str, str, Any]]:
        return _entries(self.allow_principal, self.deny_principal, self.allow_host, self.deny_host)

    def operations(self, resources: list[tuple[Any, str]]) -> list[tuple[Any, str, Any]]:
        return _operations(resources, self.operation, self.producer, self.consumer)


def acls_change(
    ctx: typer.Context,
    allow_principal: AllowPrincipal = None,
    deny_principal: DenyPrincipal = None,
    allow_host: AllowHost = None,
    deny_host: DenyHost = None,
    operation: Operation = None,
    topic: Topic = None,
    group: Group = None,
    transactional_id: TransactionalId = None,
    cluster: Cluster = False,
    resource_pattern_type: PatternOption = None,
    producer: ProducerOption = False,
    consumer: ConsumerOption = False,
    force: Annotated[
        bool, typer.Option("--force", help="do not ask for confirmation (as kafka-acls --force)")
    ] = False,
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
) -> None:
    """``acls add`` and ``acls remove``: one set of options, as kafka-acls has."""
    change = _AclChange(
        allow_principal, deny_principal, allow_host, deny_host, operation, topic, group,
        transactional_id, cluster, resource_pattern_type, producer, consumer, force,
    )  # fmt: skip
    action = _acls_add if ctx.info_name == "add" else _acls_remove
    action(change, bootstrap, command_config)


def _acls_add(change: _AclChange, bootstrap: str, command_config: Path | None) -> None:
    resources = change.resources()
    entries = change.entries()
    if not entries:
        raise ConfigError("name a principal: --allow-principal User:NAME or --deny-principal")
    pattern = _pattern(change.resource_pattern_type, "literal", ("literal", "prefixed"))
    from replication.security.acl import AclBinding

    bindings = [
        AclBinding(rtype, name, pattern, principal, host, op, permission)
        for rtype, name, op in change.operations(resources)
        for principal, host, permission in entries
    ]
    with admin_client(bootstrap, command_config) as admin:
        admin.create_acls(bindings)
    typer.echo("Adding ACLs:")
    _print_acls(bindings)


def _acls_remove(change: _AclChange, bootstrap: str, command_config: Path | None) -> None:
    from replication.security.acl import AclBindingFilter

    resources = change.resources()
    pattern = _pattern(
        change.resource_pattern_type, "literal", ("any", "match", "literal", "prefixed")
    )
    entries = change.entries()
    targeted = bool(change.operation or change.producer or change.consumer)
    if entries:
        if targeted:
            targets = change.operations(resources)
        else:  # every operation of these principals on these resources
            from replication.security.acl import AclOperation

            targets = [(rtype, name, AclOperation.ANY) for rtype, name in resources]
        filters = [
            AclBindingFilter(rtype, name, pattern, principal, host, op, permission)
            for rtype, name, op in targets
            for principal, host, permission in entries
        ]
    else:
        if targeted:
            raise ConfigError(
                "--operation, --producer and --consumer need --allow-principal or --deny-principal"
            )
        filters = [AclBindingFilter(rtype, name, pattern) for rtype, name in resources]
        shown = ", ".join(f"{t.name}:{n}" for t, n in resources)
        if not change.force and not typer.confirm(f"Remove every ACL of {shown}?"):
            raise typer.Abort()
    with admin_client(bootstrap, command_config) as admin:
        removed = admin.delete_acls(filters)
    gone = sorted({b for found in removed for b in found})
    typer.echo(f"Removed {len(gone)} ACL(s).")
    _print_acls(gone)


acls_app.command(
    "add",
    help="Add ACLs: every principal (with its hosts) x operation (default All) x resource; "
    "--producer and --consumer add what a producer or consumer needs, as kafka-acls.",
)(acls_change)
acls_app.command(
    "remove",
    help="Remove ACLs: those of the principals and operations given (every operation without "
    "--operation) on the resources named, or, with no principal, every ACL of those resources "
    "(after a confirmation).",
)(acls_change)


@acls_app.command("list")
def acls_list(
    topic: Topic = None,
    group: Group = None,
    transactional_id: TransactionalId = None,
    cluster: Cluster = False,
    principal: Annotated[
        list[str] | None, _many("--principal", "only the ACLs of this principal, repeatable")
    ] = None,
    resource_pattern_type: PatternOption = None,
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """The ACLs of the resources named (every ACL without one)."""
    from replication.security.acl import AclBindingFilter, ResourceType

    resources = _resources(topic, group, transactional_id, cluster)
    pattern = _pattern(
        resource_pattern_type,
        "literal" if resources else "any",
        ("any", "match", "literal", "prefixed"),
    )
    principals: list[str | None] = [*_principals("--principal", principal)] or [None]
    targets: list[tuple[Any, str | None]] = [*resources] or [(ResourceType.ANY, None)]
    filters = [
        AclBindingFilter(rtype, name, pattern, who) for rtype, name in targets for who in principals
    ]
    with admin_client(bootstrap, command_config) as admin:
        found: list[AclBinding] = sorted({b for f in filters for b in admin.describe_acls(f)})
    if as_json:
        typer.echo(
            json.dumps(
                [
                    {
                        "resource_type": b.resource_type.name,
                        "resource_name": b.resource_name,
                        "pattern_type": b.pattern_type.name,
                        "principal": b.principal,
                        "host": b.host,
                        "operation": b.operation.name,
                        "permission_type": b.permission.name,
                    }
                    for b in found
                ]
            )
        )
        return
    _print_acls(found)


# --- security init (the Docker demo's secrets-init service) ---------------------------------------

security_app = typer.Typer(
    no_args_is_help=True,
    help="Secure a new cluster: a throwaway CA, node certificate, users (as cluster up --secure).",
)


@security_app.command("init")
def security_init(
    secrets_dir: Annotated[
        str,
        typer.Option(
            "--dir", help="where to write ca.pem, node.pem, node.toml, client.properties, ..."
        ),
    ],
    conf: Annotated[
        list[str] | None,
        typer.Option(
            "--conf",
            help="the nodes' TOML file(s): metadata.log.dir and storage.endpoint.url come from "
            "it (as kafka-storage format --config); repeatable, later ones win",
            show_default=False,
        ),
    ] = None,
    metadata_log_dir: Annotated[
        str | None,
        typer.Option(
            "--metadata-log-dir",
            help="the cluster's metadata.log.dir URL (overrides --conf's)",
            show_default=False,
        ),
    ] = None,
    host: Annotated[
        list[str] | None,
        typer.Option(
            "--host",
            help="a host name or address the nodes are reached at, named by their certificate; "
            "repeatable (default: 127.0.0.1 and localhost)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Make what a secured cluster needs, once, before its first node starts (as `replog
    cluster up --secure` does for a local one): a throwaway CA, one certificate for every node,
    users broker and admin (random passwords) written into the metadata, node.toml (give it to
    every node with --conf) and client.properties (--command-config). A second run on the same
    --dir changes nothing. Not for production: the CA's key lies beside the certificates."""
    from replication.config import load_broker_config
    from replication.tools.secure_cluster import LOCAL_HOSTS, init_secrets

    config = load_broker_config(
        conf, {} if metadata_log_dir is None else {"metadata.log.dir": metadata_log_dir}
    )
    if not (config.metadata_log_dir or conf):
        raise ConfigError(
            "name the cluster's metadata: --metadata-log-dir URL, or --conf with the nodes' "
            "metadata.log.dir"
        )
    root = config.metadata_root
    cluster = init_secrets(
        Path(secrets_dir).absolute(),  # node.toml names its files by absolute paths
        root,
        hosts=tuple(host or LOCAL_HOSTS),
        storage_options=config.storage_options(root),
    )
    typer.echo(
        f"Secured the cluster of {root}: users broker and admin; start every node with "
        f"--conf {cluster.node_conf}; clients use --command-config {cluster.client_properties}"
    )
