"""``replog records``: delete a partition's records before an offset, as Kafka's
kafka-delete-records.sh.

    replog records delete --topic events --partition 0 --offset 1000
    replog records delete --offset-json-file offsets.json

The JSON file is kafka-delete-records' own:
``{"partitions": [{"topic": "events", "partition": 0, "offset": 1000}], "version": 1}``
(offset -1: the partition's high watermark). Each partition's log start offset moves to its
offset on the leader (followers follow), and the records before it are no longer readable.
The CLI registers :data:`records_app` under ``records``; errors are one line on stderr and exit
status 1, as every replog command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from logstore.errors import ConfigError
from replication.tools.cli_common import BootstrapOption, CommandConfigOption, admin_client

__all__ = ["records_app"]

records_app = typer.Typer(
    no_args_is_help=True, help="Delete records before an offset (as kafka-delete-records)."
)

_EXAMPLE = '{"partitions": [{"topic": "events", "partition": 0, "offset": 1000}], "version": 1}'


def read_offset_json(path: str) -> dict[tuple[str, int], int]:
    """(topic, partition) -> offset from a kafka-delete-records offset JSON file."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"--offset-json-file {path}: no such file") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"--offset-json-file {path}: not readable JSON ({err})") from err
    entries = doc.get("partitions") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"--offset-json-file {path}: expected a partitions list, as {_EXAMPLE}")
    out: dict[tuple[str, int], int] = {}
    for entry in entries:
        key, value = _entry(path, entry)
        if key in out:
            raise ConfigError(f"--offset-json-file {path}: {key[0]}-{key[1]} is named twice")
        out[key] = value
    return out


def _entry(path: str, entry: Any) -> tuple[tuple[str, int], int]:
    problem = ConfigError(
        f"--offset-json-file {path}: entry {json.dumps(entry)} needs a topic (string), a "
        f"partition and an offset (integers), as {_EXAMPLE}"
    )
    if not isinstance(entry, dict) or not isinstance(entry.get("topic"), str) or not entry["topic"]:
        raise problem
    try:
        return (entry["topic"], int(entry["partition"])), int(entry["offset"])
    except (KeyError, TypeError, ValueError):
        raise problem from None


@records_app.command("delete")
def delete(
    bootstrap: BootstrapOption = "127.0.0.1:9092",
    command_config: CommandConfigOption = None,
    offset_json_file: Annotated[
        str | None,
        typer.Option(
            "--offset-json-file", help=f"partitions and offsets, as {_EXAMPLE}", show_default=False
        ),
    ] = None,
    topic: Annotated[str | None, typer.Option("--topic", show_default=False)] = None,
    partition: Annotated[int | None, typer.Option("--partition", show_default=False)] = None,
    offset: Annotated[
        int | None,
        typer.Option(
            "--offset",
            help="delete the records before it (-1: the high watermark)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Delete the records before an offset in each partition named: the log start offset moves
    there (the low watermark printed)."""
    single = (topic, partition, offset)
    if offset_json_file is not None:
        if any(v is not None for v in single):
            raise ConfigError("give --offset-json-file or --topic/--partition/--offset, not both")
        offsets = read_offset_json(offset_json_file)
    elif topic is None or partition is None or offset is None:
        raise ConfigError(
            "name what to delete: --offset-json-file FILE, or --topic T --partition P --offset O"
        )
    else:
        offsets = {(topic, partition): offset}
    with admin_client(bootstrap, command_config) as admin:
        low = admin.delete_records(offsets)
    typer.echo("Records delete operation completed:")
    for tp in sorted(low):
        typer.echo(f"partition: {tp.topic}-{tp.partition}\tlow_watermark: {low[tp]}")
