"""docker-compose.yml and the Dockerfile, checked without a Docker engine or docker-compose:
the file's structure as the Compose specification defines it (services, dependencies with
conditions, health checks, restart policies), and every replog service's command and
configuration accepted by the local tooling. CI also runs `docker-compose config` on it
(.ci/run), which needs Debian's docker-compose; these tests need only PyYAML."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from replication.config import load_broker_config, parse_overrides

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

#: what a service may hold here (a subset of the Compose specification's service keys)
SERVICE_KEYS = {
    "build",
    "image",
    "command",
    "entrypoint",
    "environment",
    "depends_on",
    "ports",
    "healthcheck",
    "restart",
    "volumes",
}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
#: services that run once and exit: they must retry, and others wait for their success
ONE_SHOT = {"minio-init", "topics", "spark-job"}


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, object]]:
    doc = yaml.safe_load(COMPOSE.read_text())  # anchors and merge keys resolved
    assert isinstance(doc, dict), "docker-compose.yml must be a mapping"
    unknown = {k for k in doc if k not in {"services", "volumes", "networks"}}
    assert all(k.startswith("x-") for k in unknown), f"unknown top-level keys {unknown}"
    out = doc["services"]
    assert isinstance(out, dict)
    return out


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


def test_every_service_is_well_formed(services: dict[str, dict[str, object]]) -> None:
    for name, service in services.items():
        assert set(service) <= SERVICE_KEYS, (name, set(service) - SERVICE_KEYS)
        assert "image" in service or "build" in service, f"{name}: no image and no build"
        for port in service.get("ports", []):  # type: ignore[attr-defined]
            assert re.fullmatch(r"\d+:\d+", str(port)), (
                f"{name}: port {port!r} is not HOST:CONTAINER"
            )
        check = service.get("healthcheck")
        if check is not None:
            assert isinstance(check, dict)
            test = check["test"]
            assert isinstance(test, list), (name, test)
            assert test[0] in ("CMD", "CMD-SHELL"), (name, test)
            for key in ("interval", "timeout", "start_period"):
                assert re.fullmatch(r"\d+(ms|s|m)", str(check[key])), (name, key, check[key])
            assert int(check["retries"]) > 0


def test_services_wait_for_each_other_by_health_not_start_order(
    services: dict[str, dict[str, object]],
) -> None:
    for name, service in services.items():
        depends = service.get("depends_on", {})
        assert isinstance(depends, dict), f"{name}: depends_on must name a condition per service"
        for other, spec in depends.items():
            assert other in services, f"{name} depends on {other}, which is not a service"
            condition = spec["condition"]
            assert condition in CONDITIONS - {"service_started"}, (name, other, condition)
            if condition == "service_healthy":
                assert "healthcheck" in services[other], f"{name} waits for {other}'s health"
            else:
                assert other in ONE_SHOT, f"{name} waits for {other} to exit, but it serves"
    for name in ONE_SHOT:
        assert services[name].get("restart") == "on-failure", f"{name}: one-shot, must retry"
    for name, service in services.items():
        if name not in ONE_SHOT:
            assert "healthcheck" in service, f"{name} serves: it needs a health check"


def test_health_checks_run_commands_that_exist(services: dict[str, dict[str, object]]) -> None:
    for name, service in services.items():
        test = service["healthcheck"]["test"] if "healthcheck" in service else None  # type: ignore[index]
        if not test or test[1] not in ("replog", "python"):
            continue
        args = test[1:]
        if args[0] == "python":
            compile(args[-1], f"{name} healthcheck", "exec")  # a valid program
            continue
        words = [a for a in args[1:] if not a.startswith("-")][:2]
        help_text = subprocess.run(
            [sys.executable, "-m", "replication.tools.cli", *words, "--help"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert help_text.returncode == 0, (name, help_text.stderr)
        for flag in (a for a in args if a.startswith("--")):
            assert flag in help_text.stdout, f"{name}: {flag} is not an option of {words}"


def test_the_image_is_pinned_to_a_debian_release_with_java_17() -> None:
    text = DOCKERFILE.read_text()
    base = re.search(r"^FROM (\S+)", text, re.MULTILINE)
    assert base is not None
    pinned = r"python:3\.11(\.\d+)?-slim-(bookworm|trixie)"  # Debian 12 or 13: Java 17
    assert re.fullmatch(pinned, base.group(1)), base.group(1)
    assert "openjdk-17-jre-headless" in text
    assert '"/app[spark]"' in text  # the image runs the Spark job too
