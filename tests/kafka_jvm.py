"""Kafka's own Java programs against replog: its tools run from the jars' main classes (as
Kafka's ``bin/*.sh`` scripts run them) and a Java client driver (``tests/java/``) compiled with
``javac`` against kafka-clients, all on the jars :mod:`tests.maven` fetches.

    out = tool(TOPICS, "--bootstrap-server", bootstrap, "--list")     # a CompletedProcess
    facts = driver("admin", bootstrap, topic, group)                  # {"check": {...}, ...}

Each run is one small JVM (``-Xmx256m``, serial GC, C1 only: a tool starts in about a second),
with a log4j configuration that sends warnings to stderr and nothing to stdout, so a test reads
only what the tool prints.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests import maven

#: the tools' main classes, as Kafka 4.4's bin/*.sh name them
TOPICS = "org.apache.kafka.tools.TopicCommand"  # kafka-topics.sh
CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"  # kafka-console-producer.sh
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"  # kafka-console-consumer.sh
CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
CONFIGS = "org.apache.kafka.tools.ConfigCommand"  # kafka-configs.sh
ACLS = "org.apache.kafka.tools.AclCommand"  # kafka-acls.sh
TRANSACTIONS = "org.apache.kafka.tools.TransactionsCommand"  # kafka-transactions.sh
LOG_DIRS = "org.apache.kafka.tools.LogDirsCommand"  # kafka-log-dirs.sh
PRODUCER_PERF = "org.apache.kafka.tools.ProducerPerformance"  # kafka-producer-perf-test.sh
CONSUMER_PERF = "org.apache.kafka.tools.ConsumerPerformance"  # kafka-consumer-perf-test.sh

JAVA_SOURCES = Path(__file__).parent / "java"
DRIVER = "KafkaClientDriver"

#: small JVMs: two cores are shared by the whole suite
JVM_OPTIONS = ["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss1m"]

_LOG4J = """\
log4j.rootLogger=WARN, stderr
log4j.appender.stderr=org.apache.log4j.ConsoleAppender
log4j.appender.stderr.Target=System.err
log4j.appender.stderr.layout=org.apache.log4j.PatternLayout
log4j.appender.stderr.layout.ConversionPattern=[%d] %p %m (%c)%n
"""


class JavaUnavailableError(RuntimeError):
    """``java`` or ``javac`` is not installed."""


def _need(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        raise JavaUnavailableError(
            f"{program} is not installed: Kafka's tools and Java client need a JDK 17 "
            "(apt-get install openjdk-17-jdk-headless)"
        )
    return path


def _work_dir() -> Path:
    return maven.cache_root().parent / "java"


def log4j_config() -> Path:
    path = _work_dir() / "log4j.properties"
    if not path.exists() or path.read_text() != _LOG4J:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_LOG4J)
        tmp.replace(path)
    return path


def driver_classes() -> Path:
    """tests/java/*.java compiled against kafka-clients 4.4 (see :func:`compiled`)."""
    return compiled(JAVA_SOURCES, "kafka")


def compiled(sources_dir: Path, jar_set: str) -> Path:
    """``sources_dir``/*.java compiled against the jar set ``jar_set`` (once per machine and
    source: the directory is named by a digest of the sources and the classpath)."""
    classpath = maven.classpath(jar_set)
    sources = sorted(sources_dir.glob("*.java"))
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    digest.update(classpath.encode())
    out = _work_dir() / f"classes-{digest.hexdigest()[:12]}"
    done = out / "COMPLETE"
    if done.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            result = subprocess.run(
                [_need("javac"), "-nowarn", "-Xlint:none", "-J-Xmx512m", "-d", str(out),
                 "-cp", classpath, *map(str, sources)],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            if result.returncode != 0:
                raise RuntimeError(f"javac failed on {sources_dir}:\n{result.stderr[-4000:]}")
            done.write_text("\n".join(s.name for s in sources) + "\n")
    return out


def streams_app(main_class: str, *args: str, state_dir: Path) -> subprocess.Popen[str]:
    """A Kafka Streams application of tests/java/streams/ (compiled against kafka-streams 4.4)
    started in a JVM of its own; it runs until its stdin closes. Its stdout (JSON lines) and
    stderr go to files in ``state_dir``."""
    classes = compiled(JAVA_SOURCES / "streams", "kafka-streams")
    classpath = f"{classes}{os.pathsep}{maven.classpath('kafka-streams', 'kafka')}"
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "stdout.log", "a") as stdout, open(state_dir / "stderr.log", "a") as err:
        return subprocess.Popen(
            [_need("java"), "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             f"-Dlog4j.configuration=file:{log4j_config()}", "-cp", classpath, main_class, *args],
            stdin=subprocess.PIPE, stdout=stdout, stderr=err, text=True,
        )  # fmt: skip


def java(
    main_class: str,
    *args: str,
    input: str | None = None,
    timeout: float = 120,
    extra_classpath: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``main_class`` of the Kafka jars (a tool) in a small JVM; its output and exit code."""
    classpath = maven.classpath("kafka")
    if extra_classpath:
        classpath = f"{extra_classpath}{os.pathsep}{classpath}"
    return subprocess.run(
        [_need("java"), *JVM_OPTIONS, f"-Dlog4j.configuration=file:{log4j_config()}",
         "-cp", classpath, main_class, *args],
        capture_output=True, text=True, input=input, timeout=timeout,
    )  # fmt: skip


def tool(main_class: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """A Kafka tool's run, as ``kafka-*.sh`` would make it (see :func:`java`)."""
    return java(main_class, *args, **kwargs)


def driver(scenario: str, *args: str, timeout: float = 180) -> dict[str, dict[str, Any]]:
    """The facts the Java client driver printed for ``scenario``, by check name (a check
    printed more than once keeps its last); AssertionError with its output if it failed."""
    result = java(DRIVER, scenario, *args, timeout=timeout, extra_classpath=str(driver_classes()))
    facts: dict[str, dict[str, Any]] = {}
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    for fact in lines:
        if "check" in fact:
            facts[fact.pop("check")] = fact
    done = any(fact.get("done") for fact in lines)
    output = (
        f"{DRIVER} {scenario} exited {result.returncode}:\n{result.stdout}\n{result.stderr[-4000:]}"
    )
    assert result.returncode == 0, output
    assert done, output
    facts["_events"] = {"lines": lines}
    return facts
