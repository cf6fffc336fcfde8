"""docker-compose.yml and the Dockerfile, checked without a Docker engine or docker-compose:
the file's structure as the Compose specification defines it (services, dependencies with
conditions, health checks, restart policies), and every replog service's command and
configuration accepted by the local tooling. CI also runs `docker-compose config` on it
(.ci/run), which needs Debian's docker-compose; these tests need only PyYAML (they run
`docker-compose config` too where it is installed).

Every check runs on each variant: the plain file, the secured one (docker-compose.yml with
docker-compose.secure.yml as an override, merged here as Compose merges them), and the one on
images built here (docker-compose.local-s3.yml over it: moto's S3 server for MinIO, no
Prometheus or Grafana; tests/test_docker_demo.py runs it on a Docker engine). The
secured variant's services also run here as plain local processes: its secrets-init command
(on a local metadata directory), then the controller and brokers with the files it wrote,
then a client with its client.properties."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from datasource.options import parse_sink_options, parse_source_options
from replication.client import Consumer, Producer
from replication.config import BrokerConfig, load_broker_config, parse_overrides
from replication.tools.cli_common import read_properties
from tests.cluster import BrokerProcess, wait_until

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
SECURE = ROOT / "docker-compose.secure.yml"
LOCAL_S3 = ROOT / "docker-compose.local-s3.yml"
#: each variant's files, as `docker-compose -f FILE -f FILE` takes them (later ones override)
VARIANTS = {"plain": (COMPOSE,), "secure": (COMPOSE, SECURE), "local-s3": (COMPOSE, LOCAL_S3)}
#: where the secured variant's `secrets` volume is mounted (a temporary directory here)
SECRETS = "/secrets"
DOCKERFILE = ROOT / "Dockerfile"
S3_DOCKERFILE = ROOT / "docker" / "s3-server.Dockerfile"

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
    "profiles",
}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
#: services that run once and exit: they must retry, and others wait for their success
ONE_SHOT = {"s3-init", "secrets-init", "topics", "producer", "spark-job"}
#: services that read or write the object store: each needs its credentials and endpoint
#: (the Spark job's executors read the brokers' objects directly; without them, through the
#: brokers)
STORAGE_USERS = {"s3-init", "secrets-init", "controller", "broker-0", "broker-1", "broker-2"}
STORAGE_USERS |= {"spark-job"}
#: commands the third-party images hold, for their health checks (each image's documentation:
#: MinIO ships mc; Prometheus's and Grafana's images are busybox/Alpine based, with wget)
IMAGE_COMMANDS = {
    "minio/minio": {"mc", "minio"},
    "prom/prometheus": {"wget", "prometheus", "promtool"},
    "grafana/grafana": {"wget", "grafana", "grafana-cli", "grafana-server"},
}


#: the sequences Compose merges by adding an override's entries (other sequences, and
#: scalars such as command, are replaced; mappings merge key by key)
MERGED_SEQUENCES = {"ports", "volumes", "expose", "dns"}


def merge(base: object, override: object, key: str = "") -> object:
    """``override`` merged into ``base`` as Compose merges a second -f file into the first."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for name, value in override.items():
            out[name] = merge(base[name], value, name) if name in base else value
        return out
    if key in MERGED_SEQUENCES and isinstance(base, list) and isinstance(override, list):
        return [*base, *(v for v in override if v not in base)]
    return override


#: ``${NAME:-default}`` (the default if NAME is unset or empty) and ``${NAME-default}`` (if
#: unset), as Compose interpolates them
VARIABLE = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)(:?-)([^}]*)\}")


def interpolate(text: str) -> str:
    """``text`` with its variables replaced as Compose replaces them (from this environment)."""

    def value(match: re.Match[str]) -> str:
        name, kind, default = match.groups()
        got = os.environ.get(name)
        return default if got is None or (kind == ":-" and not got) else got

    return VARIABLE.sub(value, text)


def load_compose(*files: Path) -> dict[str, object]:
    """The Compose model of ``files`` (variables, anchors and merge keys resolved, files
    merged)."""
    doc: object = {}
    for path in files:
        part = yaml.safe_load(interpolate(path.read_text()))
        assert isinstance(part, dict), f"{path.name} must be a mapping"
        unknown = {k for k in part if k not in {"services", "volumes", "networks"}}
        assert all(k.startswith("x-") for k in unknown), f"{path.name}: unknown keys {unknown}"
        doc = merge(doc, part)
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def compose(variant: str) -> dict[str, object]:
    return load_compose(*VARIANTS[variant])


@pytest.fixture(scope="module")
def services(compose: dict[str, object]) -> dict[str, dict[str, object]]:
    out = compose["services"]
    assert isinstance(out, dict)
    return out


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replication.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def local(args: list[str], volume: Path | None) -> list[str]:
    """A command's arguments with the secrets volume's paths moved to ``volume``."""
    if volume is None:
        return args
    return [
        str(volume) + a[len(SECRETS) :] if a == SECRETS or a.startswith(SECRETS + "/") else a
        for a in args
    ]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The secured variant's secrets-init command run as a local process, the metadata on a
    local directory: ``secrets`` (the volume's content) and ``metadata`` under the path."""
    root = tmp_path_factory.mktemp("secure-compose")
    init = command_args(load_compose(*VARIANTS["secure"])["services"]["secrets-init"]["command"])  # type: ignore[index]
    assert init[:3] == ["replog", "security", "init"], init
    args = [*local(init, root / "secrets")[1:], "--metadata-log-dir", str(root / "metadata")]
    result = cli(*args)
    assert result.returncode == 0, result.stderr
    assert "client.properties" in result.stdout
    again = cli(*args)  # a restarted init job changes nothing
    assert again.returncode == 0, again.stderr
    return root


@pytest.fixture(scope="module")
def volume(variant: str, request: pytest.FixtureRequest) -> Path | None:
    """Where the variant's /secrets is here (None: the plain variant has no secrets)."""
    return Path(request.getfixturevalue("secured")) / "secrets" if variant == "secure" else None


def node_config(args: list[str], volume: Path | None, **more: str) -> BrokerConfig:
    """The configuration a node command (``controller start ...``) loads: its --conf files
    (the secrets volume's in ``volume``) and --set overrides, then ``more``."""
    args = local(args, volume)
    files = [ROOT / args[i + 1] for i, a in enumerate(args) if a == "--conf"]
    overrides = parse_overrides([args[i + 1] for i, a in enumerate(args) if a == "--set"])
    if args[0] == "controller":
        overrides = {"process.roles": "controller", **overrides}
    return load_broker_config(files, {**overrides, **more})  # refuses unknown keys and values


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


@pytest.mark.unit
def test_topology(services: dict[str, dict[str, object]]) -> None:
    assert {
        "s3",
        "s3-init",
        "controller",
        "broker-0",
        "broker-1",
        "broker-2",
        "topics",
        "producer",
        "spark-job",
    } <= set(services)


@pytest.mark.unit
def test_node_commands_load_their_configuration(
    services: dict[str, dict[str, object]], volume: Path | None
) -> None:
    nodes = {n: a for n, a in replog_commands(services).items() if a[1:2] == ["start"]}
    assert set(nodes) == {"controller", "broker-0", "broker-1", "broker-2"}
    buckets = set()
    for name, args in nodes.items():
        role = args[0]
        config = node_config(args, volume)
        protocols = {config.security.protocol(listener) for listener in ("REPLOG", "KAFKA")}
        assert protocols == ({"PLAINTEXT"} if volume is None else {"SASL_SSL"}), name
        assert config.storage_endpoint_url == "http://s3:9000", name
        assert config.metadata_root.startswith("s3://replog-metadata/"), name
        if role == "broker":
            assert config.advertised_host_port == (name, 9092)
            buckets.add(config.log_dir.split("/")[2])
    assert buckets == {"replog-broker-0", "replog-broker-1", "replog-broker-2"}  # one each


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.unit
def test_every_service_is_well_formed(services: dict[str, dict[str, object]]) -> None:
    for name, service in services.items():
        assert set(service) <= SERVICE_KEYS, (name, set(service) - SERVICE_KEYS)
        assert "image" in service or "build" in service, f"{name}: no image and no build"
        for port in service.get("ports", []):  # type: ignore[attr-defined]
            assert re.fullmatch(r"(\d+\.\d+\.\d+\.\d+:)?\d*:\d+", str(port)), (
                f"{name}: port {port!r} is not [IP:]HOST:CONTAINER (HOST empty: ephemeral)"
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


@pytest.mark.unit
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
    for name in ONE_SHOT & set(services):
        assert services[name].get("restart") == "on-failure", f"{name}: one-shot, must retry"
    for name, service in services.items():
        if name not in ONE_SHOT:
            assert "healthcheck" in service, f"{name} serves: it needs a health check"


@pytest.mark.unit
def test_health_checks_run_commands_that_exist(services: dict[str, dict[str, object]]) -> None:
    for name, service in services.items():
        test = service["healthcheck"]["test"] if "healthcheck" in service else None  # type: ignore[index]
        if not test:
            continue
        if test[1] not in ("replog", "python"):
            image = str(service.get("image", "")).split(":")[0]
            assert test[1] in IMAGE_COMMANDS.get(image, set()), (
                f"{name}: {test[1]} is not a command known to be in {image}"
            )
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


@pytest.mark.unit
def test_the_image_is_pinned_to_a_debian_release_with_java_17() -> None:
    for dockerfile in (DOCKERFILE, S3_DOCKERFILE):
        text = dockerfile.read_text()
        # the base is a build argument (a local bookworm image where nothing can be pulled),
        # by default a pinned public image
        assert re.search(r"^FROM \$\{BASE\}$", text, re.MULTILINE), dockerfile.name
        base = re.search(r"^ARG BASE=(\S+)$", text, re.MULTILINE)
        assert base is not None, f"{dockerfile.name}: no default BASE"
        pinned = r"python:3\.11(\.\d+)?-slim-(bookworm|trixie)"  # Debian 12 or 13: Java 17
        assert re.fullmatch(pinned, base.group(1)), base.group(1)
        assert "python3 -m venv" in text  # pip works on either base
    text = DOCKERFILE.read_text()
    assert "openjdk-17-jre-headless" in text
    assert "['optional-dependencies']['spark']" in text  # the image runs the Spark job too
    assert '"moto[server]==' in S3_DOCKERFILE.read_text()  # pinned as the images are


@pytest.mark.unit
def test_third_party_images_are_pinned(services: dict[str, dict[str, object]]) -> None:
    for name, service in services.items():
        image = str(service.get("image", ""))
        if image.startswith("replog"):
            continue  # built here (docker-compose.yml's build:, docker/build-images.sh)
        tag = image.partition(":")[2]
        assert tag != "latest", f"{name}: pin {image} to a release"
        assert re.fullmatch(r"(v?\d+\.\d+\.\d+|RELEASE\.[0-9TZ-]+)", tag), (name, image)


@pytest.mark.unit
def test_every_service_that_reads_storage_has_its_credentials_and_endpoint(
    services: dict[str, dict[str, object]],
) -> None:
    for name in STORAGE_USERS & set(services):
        env = services[name].get("environment")
        assert isinstance(env, dict), f"{name}: no environment: no credentials"
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
            assert env.get(key), f"{name}: {key} is not set"
        # botocore's (so s3fs's) endpoint from the environment: the Spark job's executors
        # take it from there, the nodes from storage.endpoint.url
        assert env.get("AWS_ENDPOINT_URL_S3") == "http://s3:9000", name
    s3 = services["s3"].get("environment", {})
    assert isinstance(s3, dict)
    if "MINIO_ROOT_USER" in s3:
        env = services["controller"]["environment"]
        assert isinstance(env, dict)
        assert (s3["MINIO_ROOT_USER"], s3["MINIO_ROOT_PASSWORD"]) == (
            env["AWS_ACCESS_KEY_ID"],
            env["AWS_SECRET_ACCESS_KEY"],
        )


@pytest.mark.unit
def test_a_producer_service_sends_a_known_number_of_records(
    services: dict[str, dict[str, object]],
) -> None:
    args = command_args(services["producer"]["command"])
    assert args[:2] == ["python", "docker/produce_events.py"]
    at = args.index("--num-records")
    assert int(args[at + 1]) > 0
    assert args[args.index("--topic") + 1] == "events"
    spark = command_args(services["spark-job"]["command"])
    assert spark[spark.index("--source") + 1] == "events"
    help_text = subprocess.run(
        [sys.executable, str(ROOT / args[1]), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert help_text.returncode == 0, help_text.stderr
    for flag in (a for a in args if a.startswith("--")):
        assert flag in help_text.stdout, f"producer: {flag} is not an option of {args[1]}"


@pytest.mark.unit
def test_the_local_s3_variant_runs_on_images_built_here() -> None:
    services = load_compose(*VARIANTS["local-s3"])["services"]
    assert isinstance(services, dict)
    s3 = services["s3"]
    assert s3["image"] == "replog-s3:dev"
    assert s3["build"]["dockerfile"] == S3_DOCKERFILE.name
    assert ROOT / s3["build"]["context"] == S3_DOCKERFILE.parent
    assert s3["entrypoint"][:1] == ["moto_server"]
    port = s3["entrypoint"][s3["entrypoint"].index("--port") + 1]
    assert published(s3, int(port)) is not None
    # nothing pulled: every service's image is built here
    for name, service in services.items():
        if "monitoring" in service.get("profiles", []):
            continue  # not started by `up`
        image = str(service["image"])
        assert image in ("replog:dev", "replog-s3:dev"), f"{name}: {image} would be pulled"
    assert {n for n, s in services.items() if s.get("profiles")} == {"prometheus", "grafana"}


# --- monitoring: Prometheus scrapes every node, Grafana shows the dashboard ------------------

PROMETHEUS_DIR = ROOT / "conf" / "docker" / "prometheus"
GRAFANA_DIR = ROOT / "conf" / "docker" / "grafana"
DASHBOARD = GRAFANA_DIR / "dashboards" / "replog.json"

#: the metric names replog keeps stable (named as the Prometheus JMX exporter names Kafka's JMX
#: metrics): what the dashboard and the alerts may use
METRICS = {
    "kafka_server_replicamanager_underreplicatedpartitions",
    "kafka_server_replicamanager_underminisrpartitioncount",
    "kafka_server_replicamanager_offlinereplicacount",
    "kafka_server_replicamanager_leadercount",
    "kafka_server_replicamanager_partitioncount",
    "kafka_server_replicamanager_isrshrinks_total",
    "kafka_server_replicamanager_isrexpands_total",
    "kafka_server_brokertopicmetrics_messagesin_total",
    "kafka_server_brokertopicmetrics_bytesin_total",
    "kafka_server_brokertopicmetrics_messagesout_total",
    "kafka_server_brokertopicmetrics_bytesout_total",
    "kafka_network_requestmetrics_requests_total",
    "kafka_server_delayedoperationpurgatory_purgatorysize",
    "kafka_server_replicafetchermanager_maxlag",
    "kafka_log_log_logendoffset",
    "kafka_log_log_highwatermark",
    "kafka_log_log_size",
    "kafka_server_fetchsessioncache_numincrementalfetchsessions",
    "kafka_server_fetchsessioncache_incrementalfetchsessionevictions_total",
    "kafka_coordinator_transaction_transactions",
    "kafka_consumergroup_lag",
    "replog_storage_requests_total",
    "replog_storage_errors_total",
    "kafka_controller_kafkacontroller_activecontrollercount",
    "kafka_controller_kafkacontroller_offlinepartitionscount",
    "kafka_controller_kafkacontroller_globalpartitioncount",
    "kafka_controller_kafkacontroller_globaltopiccount",
    "kafka_controller_kafkacontroller_activebrokercount",
    "kafka_controller_kafkacontroller_fencedbrokercount",
}
HISTOGRAMS = {
    "kafka_network_requestmetrics_totaltime_seconds",
    "replog_storage_request_duration_seconds",
    "replog_metadata_write_duration_seconds",
}
KNOWN = METRICS | {f"{h}{suffix}" for h in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
#: what the issue asks the dashboard to show
SHOWN = {
    "kafka_server_replicamanager_underreplicatedpartitions",
    "kafka_server_replicamanager_underminisrpartitioncount",
    "kafka_controller_kafkacontroller_offlinepartitionscount",
    "kafka_controller_kafkacontroller_activecontrollercount",
    "kafka_server_brokertopicmetrics_messagesin_total",
    "kafka_server_brokertopicmetrics_bytesin_total",
    "kafka_server_brokertopicmetrics_bytesout_total",
    "kafka_network_requestmetrics_requests_total",
    "kafka_network_requestmetrics_totaltime_seconds_bucket",
    "kafka_server_delayedoperationpurgatory_purgatorysize",
    "kafka_server_replicafetchermanager_maxlag",
    "kafka_server_replicamanager_isrshrinks_total",
    "kafka_server_replicamanager_isrexpands_total",
    "kafka_consumergroup_lag",
    "kafka_coordinator_transaction_transactions",
    "replog_storage_requests_total",
    "replog_storage_request_duration_seconds_bucket",
    "replog_storage_errors_total",
}


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(?:kafka|replog)_[a-z0-9_]+\b", expr))


def published(service: dict[str, object], port: int) -> int | None:
    """The host port a service publishes its container ``port`` on (0: an ephemeral one)."""
    for spec in service.get("ports", []):  # type: ignore[attr-defined]
        *host, container = str(spec).split(":")
        if int(container) == port:
            return int(host[-1]) if host and host[-1] else 0
    return None


def mounts(service: dict[str, object]) -> dict[str, Path]:
    """A service's bind mounts: path in the container -> file in this repository."""
    out = {}
    for volume in service.get("volumes", []):  # type: ignore[attr-defined]
        source, target, *_ = str(volume).split(":")
        assert source.startswith("./"), f"{volume}: mount a file of this repository"
        assert (ROOT / source).exists(), f"{volume}: {source} does not exist"
        out[target] = ROOT / source
    return out


def node_metrics_targets(services: dict[str, dict[str, object]]) -> dict[str, set[str]]:
    """Each node's scrape target, "service:metrics.port", by Prometheus job."""
    out: dict[str, set[str]] = {"replog-broker": set(), "replog-controller": set()}
    for name, args in replog_commands(services).items():
        if args[1:2] != ["start"]:
            continue
        sets = parse_overrides([args[i + 1] for i, a in enumerate(args) if a == "--set"])
        if args[0] == "controller":
            sets = {"process.roles": "controller", **sets}
        config = load_broker_config(ROOT / args[args.index("--conf") + 1], sets)
        assert config.metrics_port > 0, f"{name}: metrics.port is not set"
        out[f"replog-{args[0]}"].add(f"{name}:{config.metrics_port}")
    return out


@pytest.mark.unit
def test_monitoring_images_are_pinned_and_ports_published(
    services: dict[str, dict[str, object]],
) -> None:
    for name, port in (("prometheus", "9090:9090"), ("grafana", "3000:3000")):
        image = str(services[name]["image"])
        assert re.fullmatch(r"[a-z/]+:v?\d+\.\d+\.\d+", image), f"{name}: pin {image} to a release"
        assert f"{published(services[name], int(port.split(':')[1]))}:{port.split(':')[1]}" == port


@pytest.mark.unit
def test_prometheus_scrapes_every_node_on_its_metrics_port(
    services: dict[str, dict[str, object]],
) -> None:
    from replication.tools.prometheus_config import render

    files = mounts(services["prometheus"])
    args = command_args(services["prometheus"]["command"])
    config_path = next(a.split("=", 1)[1] for a in args if a.startswith("--config.file="))
    doc = yaml.safe_load(files[config_path].read_text())
    jobs = {job["job_name"]: job for job in doc["scrape_configs"]}
    targets = {
        name: {t for sc in job["static_configs"] for t in sc["targets"]}
        for name, job in jobs.items()
    }
    expected = node_metrics_targets(services)
    assert targets == expected
    for target in set().union(*targets.values()):
        assert target.split(":")[0] in services, f"{target}: not a service"
    for rules in doc["rule_files"]:
        assert rules in files, f"rule file {rules} is not mounted into the prometheus service"
    # the same config as `replog cluster prometheus-config` writes for local processes
    rendered = render({job: sorted(t) for job, t in expected.items()}, rule_files=doc["rule_files"])
    assert yaml.safe_load(rendered) == doc


@pytest.mark.unit
def test_alert_rules_use_the_fixed_metric_names() -> None:
    doc = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())
    rules = [rule for group in doc["groups"] for rule in group["rules"]]
    assert rules
    for rule in rules:
        names = metric_names(rule["expr"])
        assert names, rule
        assert names <= KNOWN, (rule["alert"], names - KNOWN)
        assert rule["labels"]["severity"] in ("warning", "critical")


@pytest.mark.unit
def test_grafana_provisions_the_prometheus_datasource_and_the_dashboard(
    services: dict[str, dict[str, object]],
) -> None:
    files = mounts(services["grafana"])
    provisioning = files["/etc/grafana/provisioning"]
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus"
    host, port = source["url"].removeprefix("http://").split(":")
    assert host == "prometheus"
    assert published(services[host], int(port)) == int(port)
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "replog.yml").read_text())[
        "providers"
    ]
    dashboards = files[provider["options"]["path"]]
    assert dashboards / "replog.json" == DASHBOARD
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]  # type: ignore[index]
    assert home == provider["options"]["path"] + "/replog.json"
    panels = json.loads(DASHBOARD.read_text())["panels"]
    for panel in panels:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == source["uid"], panel["title"]


@pytest.mark.unit
def test_the_dashboard_shows_the_key_metrics_by_their_fixed_names() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] == "replog cluster"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    used: set[str] = set()
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names, (panel["title"], target["expr"])
            assert names <= KNOWN, (panel["title"], names - KNOWN)
            used |= names
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
    assert used >= SHOWN, SHOWN - used
    latency = [t["expr"] for p in panels for t in p["targets"] if "totaltime" in t["expr"]]
    assert any(e.startswith("histogram_quantile(0.99") and "by (request, le)" in e for e in latency)


# --- the secured variant: docker-compose.secure.yml over docker-compose.yml ---------------------


@pytest.mark.unit
def test_docker_compose_accepts_the_files_and_merges_them_as_here(variant: str) -> None:
    """Debian's docker-compose (no engine needed), where installed: the files are valid, and
    its merge of the override agrees with this module's (which every other check relies on)."""
    if shutil.which("docker-compose") is None:
        pytest.skip("docker-compose is not installed (CI installs Debian's)")
    files = [arg for path in VARIANTS[variant] for arg in ("-f", str(path))]
    result = subprocess.run(
        ["docker-compose", *files, "config"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    theirs = yaml.safe_load(result.stdout)["services"]
    ours = load_compose(*VARIANTS[variant])["services"]
    assert isinstance(ours, dict)
    assert set(theirs) == set(ours)
    for name, service in ours.items():
        other = theirs[name]
        assert command_args(other.get("command")) == command_args(service.get("command")), name
        assert set(other.get("depends_on", {})) == set(service.get("depends_on", {})), name
        assert targets(other) == targets(service), name
        if "healthcheck" in service:
            assert other["healthcheck"]["test"] == service["healthcheck"]["test"], name


def targets(service: dict[str, object]) -> list[str]:
    """Where a service's volumes are mounted (``source:target[:mode]``, any source form)."""
    out = []
    for volume in service.get("volumes", []):  # type: ignore[attr-defined]
        parts = str(volume).split(":")
        out.append(parts[-2] if parts[-1] in ("ro", "rw") else parts[-1])
    return sorted(out)


def _waits_for(services: dict[str, dict[str, object]], name: str, other: str) -> bool:
    """Whether ``name`` starts only after ``other`` (directly or through its dependencies)."""
    depends = services[name].get("depends_on", {})
    assert isinstance(depends, dict)
    return other in depends or any(_waits_for(services, d, other) for d in depends)


def _mentions_secrets(service: dict[str, object]) -> bool:
    check = service.get("healthcheck", {})
    assert isinstance(check, dict)
    args = [*command_args(service.get("command")), *map(str, check.get("test", []))]
    return any(a == SECRETS or a.startswith(SECRETS + "/") for a in args)


@pytest.mark.unit
def test_secured_services_use_the_secrets_after_secrets_init_made_them(secured: Path) -> None:
    doc = load_compose(*VARIANTS["secure"])
    services = doc["services"]
    assert isinstance(services, dict)
    assert "secrets" in doc["volumes"]  # type: ignore[operator]  # a named volume, declared
    init = services["secrets-init"]
    assert f"secrets:{SECRETS}" in init["volumes"]
    assert init["depends_on"]["s3-init"]["condition"] == "service_completed_successfully"
    users = {n for n, s in services.items() if n != "secrets-init" and _mentions_secrets(s)}
    nodes = {n for n, a in replog_commands(services).items() if a[1:2] == ["start"]}
    assert users >= nodes | {"topics", "producer", "spark-job"}
    for name in users:
        assert f"secrets:{SECRETS}:ro" in services[name]["volumes"], f"{name}: mount it read-only"
        assert _waits_for(services, name, "secrets-init"), f"{name} starts before secrets-init"
        args = command_args(services[name]["command"])
        if name in nodes:
            assert f"{SECRETS}/node.toml" in args, f"{name}: start it with --conf node.toml"
        else:
            at = args.index("--command-config")
            assert args[at + 1] == f"{SECRETS}/client.properties", name
    # the certificate names every host a node is reached at (TLS checks the host name)
    certificate = x509.load_pem_x509_certificates((secured / "secrets" / "node.pem").read_bytes())
    names = certificate[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    named = {*names.get_values_for_type(x509.DNSName)}
    named |= {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    for name in nodes:
        config = node_config(replog_commands(services)[name], secured / "secrets")
        for address in (config.advertised_host_port, config.advertised_kafka_host_port):
            if address is not None:
                assert address[0] in named, f"{name}: the certificate does not name {address[0]}"
    assert "localhost" in named  # the brokers' health checks
    for path in (secured / "secrets").iterdir():
        if path.name != "ca.pem":
            assert path.stat().st_mode & 0o077 == 0, f"{path.name}: readable by others"


class ServiceProcess(BrokerProcess):
    """A compose service's node command as a local process: its own arguments (the secrets
    volume's files here), then what moves it to 127.0.0.1 and local storage."""

    def __init__(self, data_dir: Path, args: list[str], settings: dict[str, str]) -> None:
        super().__init__(data_dir, role=args[0])
        self.args = args
        self.settings = settings

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "replication.tools.cli", *self.args]
        for key, value in self.settings.items():
            cmd += ["--set", f"{key}={value}"]
        return cmd


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_secured_services_run_as_local_processes(secured: Path) -> None:
    services = load_compose(*VARIANTS["secure"])["services"]
    assert isinstance(services, dict)
    volume = secured / "secrets"
    commands = {n: local(a, volume) for n, a in replog_commands(services).items()}
    local_storage = {"metadata.log.dir": str(secured / "metadata"), "metrics.port": "-1"}
    controller = ServiceProcess(
        secured / "controller",
        commands["controller"],
        {**local_storage, "listeners": "127.0.0.1:0", "advertised.listeners": ""},
    )
    brokers = [
        ServiceProcess(
            secured / name,
            commands[name],
            {
                **local_storage,
                "listeners": "REPLOG://127.0.0.1:0",
                "advertised.listeners": "",
                "log.dir": str(secured / name / "data"),
            },
        )
        for name in ("broker-0", "broker-1", "broker-2")
    ]
    started: list[ServiceProcess] = []
    try:
        for node in [controller, *brokers]:
            node.start()
            started.append(node)
        bootstrap = ",".join(b.bootstrap for b in brokers)
        # the topics service, against the local brokers, with the volume's client.properties
        topics = commands["topics"]
        at = topics.index("--bootstrap-server") + 1
        created = cli(*topics[:at], bootstrap, *topics[at + 1 :])
        assert created.returncode == 0, created.stderr
        refused = cli("topics", "list", "--bootstrap-server", bootstrap)
        assert refused.returncode != 0  # without client.properties: no TLS, no login
        client = read_properties(volume / "client.properties")
        assert client["security.protocol"] == "SASL_SSL"
        config = {**client, "bootstrap.servers": bootstrap}
        with Producer({**config, "acks": "all"}) as producer:
            producer.send("events", b"secured").result(timeout=60)
        with Consumer({**config, "group.id": "compose", "auto.offset.reset": "earliest"}) as c:
            c.subscribe(["events"])
            values: list[bytes] = []

            def got_it() -> bool:
                values.extend(r.value for r in c.poll(500) if r.value)
                return b"secured" in values

            wait_until(got_it, timeout=60)
        # the Spark job's options: client.properties as kafka.-prefixed options, accepted
        spark = {f"kafka.{k}": v for k, v in client.items()}
        source = parse_source_options(
            {"bootstrap.servers": bootstrap, "subscribe": "events", **spark}, streaming=True
        )
        sink = parse_sink_options({"bootstrap.servers": bootstrap, "topic": "out", **spark})
        assert dict(source.client_security) == client
        assert sink.client_config() == config
        # nothing secret in any node's output
        passwords = [(volume / f"{u}.password").read_text().strip() for u in ("broker", "admin")]
        for node in started:
            text = node.stderr_path.read_text(errors="replace")
            assert not any(p in text for p in passwords), f"{node.role}: a password in its log"
    finally:
        for node in started:
            if node.alive:
                node.kill()
