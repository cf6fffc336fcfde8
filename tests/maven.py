"""JVM jars from Maven Central, fetched with ``mvn`` into a cache the first time they are asked for.

The real peers replog is judged against are JVM programs: Apache Kafka (its brokers, Java
client and tools), Spark's own Kafka connector and Delta. Nothing here installs them by hand:
:func:`jars` writes a small pom naming one :data:`ARTIFACTS` set, runs
``mvn dependency:copy-dependencies`` over it, and returns the jars' local paths, which go to a
JVM's ``-cp`` or to Spark's ``spark.jars`` (Spark's own ``spark.jars.packages`` resolver may not
be configured for the registry a machine reaches; ``mvn`` is).

    classpath = os.pathsep.join(map(str, jars("kafka")))

The cache is ``$REPLOG_JARS_CACHE`` or ``~/.cache/replog/jars``, a directory per set and
version list; a set is fetched once per machine (an flock keeps concurrent test workers from
fetching it twice) and marked complete only when ``mvn`` succeeded. When ``mvn`` is missing or
fails, :class:`MavenUnavailableError` says which, with ``mvn``'s last lines.

The versions: Apache Kafka 4.4.0 (the newest 4.x served); Spark's connector at the pyspark
version in use (the tests pin pyspark 4.2.0: the newest version for which the registry serves
``spark-sql-kafka-0-10_2.13``, and the newest Delta 4.4 supports); Delta 4.4.0, whose jars
match the ``delta-spark`` Python package the ``delta`` extra pins.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

#: Apache Kafka's version: brokers (KRaft), Java client and tools
KAFKA_VERSION = "4.4.0"
#: Delta Lake's version (its jars and the ``delta-spark`` Python package of the ``delta`` extra)
DELTA_VERSION = "4.4.0"


def _pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def artifacts(name: str) -> list[str]:
    """The Maven coordinates (``group:artifact:version``) of the jar set ``name``."""
    if name == "kafka":
        # the broker (kafka_2.13 holds KafkaRaftServer and pulls clients, server, raft,
        # metadata, storage and coordinators), and the tools' main classes
        return [
            f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
            f"org.apache.kafka:kafka-tools:{KAFKA_VERSION}",
            # Kafka's scripts put slf4j's reload4j binding on the classpath; without a binding
            # slf4j prints a warning on every tool's start
            "org.slf4j:slf4j-reload4j:1.7.36",
        ]
    if name == "kafka-streams":
        return [f"org.apache.kafka:kafka-streams:{KAFKA_VERSION}"]
    if name == "spark-kafka":
        # Spark's own Kafka connector at the pyspark version in use; Spark's jars are
        # "provided" in its pom, so only the connector's own dependencies come with it
        return [f"org.apache.spark:spark-sql-kafka-0-10_2.13:{_pyspark_version()}"]
    if name == "delta":
        return [f"io.delta:delta-spark_2.13:{DELTA_VERSION}"]
    raise KeyError(f"unknown jar set {name!r}: one of kafka, kafka-streams, spark-kafka, delta")


class MavenUnavailableError(RuntimeError):
    """``mvn`` is not installed, or could not fetch a jar set."""


def cache_root() -> Path:
    return Path(os.environ.get("REPLOG_JARS_CACHE", Path.home() / ".cache" / "replog" / "jars"))


def _pom(coordinates: list[str]) -> str:
    deps = []
    for coordinate in coordinates:
        group, artifact, version = coordinate.split(":")
        deps.append(
            f"    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version></dependency>"
        )
    body = "\n".join(deps)
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>replog.tests</groupId>
  <artifactId>jars</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{body}
  </dependencies>
</project>
"""


def jars(name: str) -> list[Path]:
    """The local paths of jar set ``name``'s jars (with their runtime dependencies), fetched
    with ``mvn`` the first time; raises :class:`MavenUnavailableError` if that fails."""
    coordinates = artifacts(name)
    digest = hashlib.sha256("\n".join(coordinates).encode()).hexdigest()[:12]
    directory = cache_root() / f"{name}-{digest}"
    lib = directory / "lib"
    complete = directory / "COMPLETE"
    if not complete.exists():
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not complete.exists():
                _fetch(coordinates, directory, lib)
                complete.write_text("\n".join(coordinates) + "\n")
    found = sorted(lib.glob("*.jar"))
    if not found:
        raise MavenUnavailableError(f"{lib} holds no jars; remove {directory} and try again")
    return found


def classpath(*names: str) -> str:
    """The jars of the named sets joined as a JVM ``-cp`` value (each jar once)."""
    seen: dict[str, Path] = {}
    for name in names:
        for jar in jars(name):
            seen.setdefault(jar.name, jar)
    return os.pathsep.join(str(p) for p in seen.values())


def spark_jars(name: str) -> list[Path]:
    """Jar set ``name`` less the artifacts pyspark already ships in its ``jars/`` directory
    (Scala, Hadoop's client, slf4j, the codecs): what goes to ``spark.jars``. Two versions of
    one library on Spark's classpath is how a connector breaks at run time, and Spark's own
    ``--packages`` resolver leaves out what Spark provides the same way."""
    import pyspark

    shipped = [p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")]

    def ships(artifact: str) -> bool:
        prefix = f"{artifact}-"
        return any(n.startswith(prefix) and n[len(prefix) :][:1].isdigit() for n in shipped)

    return [jar for jar in jars(name) if not ships(jar.stem)]


def _fetch(coordinates: list[str], directory: Path, lib: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenUnavailableError(
            "mvn is not installed: the JVM peers' jars are fetched from Maven Central with it"
            " (apt-get install maven, as README's test command does)"
        )
    (directory / "pom.xml").write_text(_pom(coordinates))
    if lib.exists():
        shutil.rmtree(lib)
    command = [
        mvn,
        "-B",
        "-q",
        "-f",
        str(directory / "pom.xml"),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={lib}",
        "-DincludeScope=runtime",
        # file names are artifact ids, so spark_jars can tell which ones Spark already ships
        "-Dmdep.stripVersion=true",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise MavenUnavailableError(
            f"mvn could not fetch {', '.join(coordinates)} (exit {result.returncode}):\n{tail}"
        )
