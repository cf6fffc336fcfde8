"""docker-compose.yml: valid for `docker-compose config`, and every replog service's command
and configuration are accepted by the local tooling (no Docker engine is needed)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from replication.config import load_broker_config, parse_overrides

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, object]]:
    compose = shutil.which("docker-compose")
    assert compose is not None, (
        "docker-compose is not installed: .ci/run installs Debian's docker-compose package"
    )
    result = subprocess.run(
        [compose, "-f", str(COMPOSE), "config"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["services"]  # type: ignore[no-any-return]


def command_args(command: object) -> list[str]:
    """A service's ``command``: a string split as a shell would, a list, or none."""
    if isinstance(command, str):
        return shlex.split(command)
    assert isinstance(command, list | None), command
    return [str(arg) for arg in command or []]


def replog_commands(services: dict[str, dict[str, object]]) -> dict[str, list[str]]:
    out = {}
    for name, service in services.items():
        args = command_args(service.get("command"))
        if args[:1] == ["replog"]:
            out[name] = args[1:]
    return out


def test_topology(services: dict[str, dict[str, object]]) -> None:
    assert {"minio", "minio-init", "controller", "broker-0", "broker-1", "broker-2"} <= set(
        services
    )


def test_node_commands_load_their_configuration(services: dict[str, dict[str, object]]) -> None:
    nodes = {n: a for n, a in replog_commands(services).items() if a[1:2] == ["start"]}
    assert set(nodes) == {"controller", "broker-0", "broker-1", "broker-2"}
    buckets = set()
    for name, args in nodes.items():
        role = args[0]
        conf = args[args.index("--conf") + 1]
        sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
        overrides = parse_overrides(sets)
        if role == "controller":
            overrides = {"process.roles": "controller", **overrides}
        config = load_broker_config(ROOT / conf, overrides)  # refuses unknown keys and values
        assert config.storage_endpoint_url == "http://minio:9000", name
        assert config.metadata_root.startswith("s3://replog-metadata/"), name
        if role == "broker":
            assert config.advertised_host_port == (name, 9092)
            buckets.add(config.log_dir.split("/")[2])
    assert buckets == {"replog-broker-0", "replog-broker-1", "replog-broker-2"}  # one each


def test_the_spark_job_runs_an_example_with_flags_it_accepts(
    services: dict[str, dict[str, object]],
) -> None:
    args = command_args(services["spark-job"]["command"])
    assert args[0] == "python"
    script = ROOT / args[1]
    assert script.exists(), f"{args[1]} does not exist"
    help_text = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert help_text.returncode == 0, help_text.stderr
    for flag in (a for a in args if a.startswith("--")):
        assert flag in help_text.stdout, f"spark-job: {flag} is not an option of {args[1]}"


def test_other_commands_are_known_to_the_cli(services: dict[str, dict[str, object]]) -> None:
    for name, args in replog_commands(services).items():
        if args[1:2] == ["start"]:
            continue
        words = [a for a in args if not a.startswith("-")][:2]
        help_text = subprocess.run(
            [sys.executable, "-m", "replication.tools.cli", *words, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert help_text.returncode == 0, (name, help_text.stderr)
        for flag in (a.split("=")[0] for a in args if a.startswith("--")):
            assert flag in help_text.stdout, f"{name}: {flag} is not an option of {words}"
