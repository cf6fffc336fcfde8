"""`replog users` and `replog acls` as a user runs them, against real brokers: one with an
authorizer configured (ACLs stored, listed, removed; a user bootstrapped offline before it
started) and one without (the ACL commands say security is disabled, as Kafka's; SCRAM users
still work). Passwords never show in any output.

Until the transport lands, connections are PLAINTEXT (User:ANONYMOUS), so the secure broker
makes ANONYMOUS a super user."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import BrokerProcess

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
BROKER_PASSWORD = "broker-secret-Zq81"
ALICE_PASSWORD = "alice-secret-Kx42"


def replog(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replication.tools.cli", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}{result.stdout}"
    for secret in (BROKER_PASSWORD, ALICE_PASSWORD):
        assert secret not in result.stdout + result.stderr
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode == 1, f"exit {result.returncode}: {result.stderr}{result.stdout}"
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    for secret in (BROKER_PASSWORD, ALICE_PASSWORD):
        assert secret not in result.stdout + result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("secure")
    proc = BrokerProcess(
        data,
        overrides={
            "authorizer.class.name": AUTHORIZER,
            "super.users": "User:ANONYMOUS;User:broker",
        },
    )
    # the brokers' own user, written before any node runs (kafka-storage format --add-scram)
    ok(
        replog(
            "users",
            "add",
            "broker",
            "--password-file",
            "-",
            "--metadata-log-dir",
            f"{proc.log_dir}/__cluster_metadata",
            input=BROKER_PASSWORD + "\n",
        )
    )
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("plain"))
    proc.start()
    yield proc
    proc.stop()


def test_users_are_added_listed_and_deleted(secure: BrokerProcess, tmp_path: Path) -> None:
    server = ("--bootstrap-server", secure.bootstrap)
    users = json.loads(ok(replog("users", "list", "--json", *server)))
    assert users == {"broker": {"SCRAM-SHA-512": 8192}}  # bootstrapped offline
    secret = tmp_path / "alice.txt"
    secret.write_text(ALICE_PASSWORD + "\n")
    out = ok(replog("users", "add", "alice", "--password-file", str(secret), *server))
    assert out.strip() == "Set SCRAM-SHA-512 credential for user alice."
    ok(
        replog(
            "users",
            "add",
            "alice",
            "--mechanism",
            "scram-sha-256",
            "--iterations",
            "4096",
            "--password-file",
            "-",
            *server,
            input=ALICE_PASSWORD + "\n",
        )
    )
    listed = ok(replog("users", "list", *server))
    assert "alice: SCRAM-SHA-256 (iterations=4096), SCRAM-SHA-512 (iterations=8192)" in listed
    ok(replog("users", "delete", "alice", "--mechanism", "SCRAM-SHA-256", *server))
    users = json.loads(ok(replog("users", "list", "--json", *server)))
    assert users["alice"] == {"SCRAM-SHA-512": 8192}
    out = ok(replog("users", "delete", "alice", *server))
    assert "SCRAM-SHA-512" in out
    assert "alice" not in json.loads(ok(replog("users", "list", "--json", *server)))
    one_line_error(
        replog("users", "delete", "nobody", "--mechanism", "SCRAM-SHA-256", *server),
        "nobody",
        "no SCRAM-SHA-256 credential",
    )
    # the offline bootstrap refuses a metadata log a controller runs on
    one_line_error(
        replog(
            "users",
            "add",
            "late",
            "--password-file",
            "-",
            "--metadata-log-dir",
            f"{secure.log_dir}/__cluster_metadata",
            input="pw\n",
        ),
        "in use",
        "replog users add",
    )


def test_acls_are_added_listed_and_removed(secure: BrokerProcess) -> None:
    server = ("--bootstrap-server", secure.bootstrap)
    out = ok(
        replog(
            "acls",
            "add",
            "--allow-principal",
            "User:alice",
            "--operation",
            "Read",
            "--operation",
            "describe",
            "--topic",
            "events",
            *server,
        )
    )
    assert "(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)" in out
    ok(
        replog(
            "acls",
            "add",
            "--allow-principal",
            "User:sink",
            "--operation",
            "Write",
            "--transactional-id",
            "replog-sink/",
            "--resource-pattern-type",
            "prefixed",
            "--deny-principal",
            "User:mallory",
            "--deny-host",
            "10.0.0.9",
            *server,
        )
    )
    listed = ok(replog("acls", "list", "--topic", "events", *server))
    assert "resourceType=TOPIC, name=events, patternType=LITERAL" in listed
    assert "operation=DESCRIBE" in listed
    assert "sink" not in listed
    every = json.loads(ok(replog("acls", "list", "--json", *server)))
    assert {
        (a["resource_name"], a["pattern_type"], a["principal"], a["host"], a["permission_type"])
        for a in every
    } == {
        ("events", "LITERAL", "User:alice", "*", "ALLOW"),
        ("replog-sink/", "PREFIXED", "User:sink", "*", "ALLOW"),
        ("replog-sink/", "PREFIXED", "User:mallory", "10.0.0.9", "DENY"),
    }
    matching = json.loads(
        ok(
            replog(
                "acls",
                "list",
                "--transactional-id",
                "replog-sink/s1/0",
                "--resource-pattern-type",
                "match",
                "--json",
                *server,
            )
        )
    )
    assert len(matching) == 2
    out = ok(
        replog(
            "acls",
            "remove",
            "--allow-principal",
            "User:alice",
            "--operation",
            "Read",
            "--topic",
            "events",
            *server,
        )
    )
    assert "Removed 1 ACL(s)." in out
    left = json.loads(ok(replog("acls", "list", "--topic", "events", "--json", *server)))
    assert [a["operation"] for a in left] == ["DESCRIBE"]
    out = ok(
        replog(
            "acls",
            "remove",
            "--transactional-id",
            "replog-sink/",
            "--resource-pattern-type",
            "prefixed",
            "--force",
            *server,
        )
    )
    assert "Removed 2 ACL(s)." in out
    ok(replog("acls", "remove", "--topic", "events", *server, input="y\n"))
    assert json.loads(ok(replog("acls", "list", "--json", *server))) == []


def test_bad_flags_are_one_line_errors(secure: BrokerProcess) -> None:
    server = ("--bootstrap-server", secure.bootstrap)
    add = ("acls", "add", "--allow-principal", "User:alice")
    one_line_error(replog(*add, "--operation", "Fly", "--topic", "t", *server), "Fly", "Read")
    one_line_error(replog(*add, *server), "name a resource", "--topic")
    one_line_error(
        replog("acls", "add", "--allow-principal", "alice", "--topic", "t", *server),
        "--allow-principal 'alice'",
        "User:alice",
    )
    one_line_error(
        replog(*add, "--topic", "t", "--resource-pattern-type", "match", *server),
        "literal or prefixed",
    )
    one_line_error(
        replog("users", "add", "bob", "--iterations", "100", "--password-file", "-", *server),
        "--iterations 100",
    )
    one_line_error(
        replog("users", "add", "bob", "--mechanism", "MD5", "--password-file", "-", *server),
        "SCRAM-SHA-256 or SCRAM-SHA-512",
    )
    one_line_error(
        replog("users", "add", "bob", "--password-file", "-", *server, input="\n"),
        "password for bob is empty",
    )


def test_without_an_authorizer_acl_commands_say_security_is_disabled(
    plain: BrokerProcess,
) -> None:
    server = ("--bootstrap-server", plain.bootstrap)
    one_line_error(
        replog(
            "acls",
            "add",
            "--allow-principal",
            "User:alice",
            "--operation",
            "Read",
            "--topic",
            "t",
            *server,
        ),
        "authorizer.class.name",
    )
    one_line_error(replog("acls", "list", *server), "authorizer.class.name")
    one_line_error(replog("acls", "remove", "--topic", "t", "--force", *server), "authorizer")
    # SCRAM users need no authorizer
    ok(replog("users", "add", "carol", "--password-file", "-", *server, input="pw-carol\n"))
    assert "carol" in json.loads(ok(replog("users", "list", "--json", *server)))


def test_producer_and_consumer_shortcuts_grant_what_kafka_acls_grants(
    secure: BrokerProcess,
) -> None:
    server = ("--bootstrap-server", secure.bootstrap)

    def acls_of(principal: str) -> set[tuple[str, str, str]]:
        found = json.loads(ok(replog("acls", "list", "--principal", principal, "--json", *server)))
        return {(a["resource_type"], a["resource_name"], a["operation"]) for a in found}

    ok(
        replog(
            "acls",
            "add",
            "--allow-principal",
            "User:prod",
            "--producer",
            "--topic",
            "orders",
            "--transactional-id",
            "tx-1",
            *server,
        )
    )
    assert acls_of("User:prod") == {
        ("TOPIC", "orders", "WRITE"),
        ("TOPIC", "orders", "DESCRIBE"),
        ("TOPIC", "orders", "CREATE"),
        ("TRANSACTIONAL_ID", "tx-1", "WRITE"),
        ("TRANSACTIONAL_ID", "tx-1", "DESCRIBE"),
    }
    ok(
        replog(
            "acls",
            "add",
            "--allow-principal",
            "User:cons",
            "--consumer",
            "--topic",
            "orders",
            "--group",
            "billing",
            *server,
        )
    )
    assert acls_of("User:cons") == {
        ("TOPIC", "orders", "READ"),
        ("TOPIC", "orders", "DESCRIBE"),
        ("GROUP", "billing", "READ"),
    }
    one_line_error(
        replog("acls", "add", "--allow-principal", "User:x", "--consumer", "--topic", "t", *server),
        "--consumer needs --topic and --group",
    )
    # without --operation, remove takes every operation of the principal on the resource
    out = ok(
        replog("acls", "remove", "--allow-principal", "User:prod", "--topic", "orders", *server)
    )
    assert "Removed 3 ACL(s)." in out
    assert acls_of("User:prod") == {
        ("TRANSACTIONAL_ID", "tx-1", "WRITE"),
        ("TRANSACTIONAL_ID", "tx-1", "DESCRIBE"),
    }
    ok(
        replog(
            "acls",
            "remove",
            "--allow-principal",
            "User:cons",
            "--consumer",
            "--topic",
            "orders",
            "--group",
            "billing",
            *server,
        )
    )
    assert acls_of("User:cons") == set()
    ok(replog("acls", "remove", "--transactional-id", "tx-1", "--force", *server))
    assert acls_of("User:prod") == set()
