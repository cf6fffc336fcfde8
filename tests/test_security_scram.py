"""SCRAM credentials: RFC 7677's SCRAM-SHA-256 test vector, Kafka's salted-password form
(AlterUserScramCredentials) giving the same keys, a scramp client and server logging in
against a stored credential, and clear refusals."""

from __future__ import annotations

import base64

import pytest
from scramp import ScramClient, ScramException, ScramMechanism

from replication.security.scram import (
    MECHANISMS,
    ScramCredential,
    credential_from_salted,
    fake_credential,
    mechanism_name,
    new_credential,
    salted_password,
)

pytestmark = pytest.mark.unit

# RFC 7677, section 3
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_CLIENT_FINAL = (
    "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def login(
    credential: ScramCredential,
    user: str,
    password: str,
    *,
    c_nonce: str | None = None,
    s_nonce: str | None = None,
) -> tuple[str, str]:
    """One SCRAM exchange, scramp client against a scramp server that knows ``credential``;
    returns (client-final, server-final)."""

    def auth_fn(name: str) -> tuple[bytes, bytes, bytes, int]:
        assert name == credential.user
        return credential.auth_info()

    server = ScramMechanism(credential.mechanism).make_server(auth_fn, s_nonce=s_nonce)
    client = ScramClient([credential.mechanism], user, password, c_nonce=c_nonce)
    server.set_client_first(client.get_client_first())
    client.set_server_first(server.get_server_first())
    client_final = client.get_client_final()
    server.set_client_final(client_final)
    server_final = server.get_server_final()
    client.set_server_final(server_final)
    return client_final, server_final


def test_rfc_7677_scram_sha_256_vector() -> None:
    credential = new_credential("user", "SCRAM-SHA-256", "pencil", 4096, RFC_SALT)
    assert (credential.iterations, credential.salt) == (4096, RFC_SALT)
    client_final, server_final = login(
        credential, "user", "pencil", c_nonce=RFC_CLIENT_NONCE, s_nonce=RFC_SERVER_NONCE
    )
    assert client_final == RFC_CLIENT_FINAL
    assert server_final == RFC_SERVER_FINAL


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_the_salted_password_gives_the_keys_scramp_makes(mechanism: str) -> None:
    salt = b"0123456789abcdef"
    made = new_credential("alice", mechanism, "s3cret-ü", 4096, salt)
    salted = salted_password(mechanism, "s3cret-ü", salt, 4096)
    from_wire = credential_from_salted("alice", mechanism, 4096, salt, salted)
    assert from_wire == made
    assert salted not in (made.stored_key, made.server_key)


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_a_client_logs_in_against_the_stored_credential(mechanism: str) -> None:
    credential = new_credential("alice", mechanism, "correct horse")
    assert len(credential.salt) == 32
    assert credential.iterations == 8192
    login(credential, "alice", "correct horse")
    with pytest.raises(ScramException):
        login(credential, "alice", "wrong horse")
    # a new salt each time: the same password gives other keys
    assert new_credential("alice", mechanism, "correct horse").stored_key != credential.stored_key


def test_refusals_are_clear_and_never_show_the_password() -> None:
    with pytest.raises(ValueError, match=r"iterations 1000 .* outside 4096\.\.16384"):
        new_credential("alice", "SCRAM-SHA-256", "pw-xyzzy", 1000)
    with pytest.raises(ValueError, match=r"iterations 20000"):
        salted_password("SCRAM-SHA-256", "pw-xyzzy", b"salt", 20000)
    with pytest.raises(ValueError, match=r"'SCRAM-SHA-1' is not supported: use one of"):
        new_credential("alice", "SCRAM-SHA-1", "pw-xyzzy")
    with pytest.raises(ValueError, match="user name is empty"):
        new_credential("", "SCRAM-SHA-256", "pw-xyzzy")
    with pytest.raises(ValueError, match="password for user 'alice' is empty"):
        new_credential("alice", "SCRAM-SHA-256", "")
    with pytest.raises(ValueError, match="has 3 bytes, not the 64 of SCRAM-SHA-512"):
        credential_from_salted("alice", "SCRAM-SHA-512", 4096, b"salt", b"abc")
    with pytest.raises(ValueError, match="salt for user 'alice' is empty"):
        credential_from_salted("alice", "SCRAM-SHA-512", 4096, b"", bytes(64))
    with pytest.raises(ValueError, match="cannot be made") as caught:
        new_credential("alice", "SCRAM-SHA-256", "pw-\x07-xyzzy")  # SASLprep refuses BEL
    assert "xyzzy" not in str(caught.value)
    assert mechanism_name(2) == "SCRAM-SHA-512"
    with pytest.raises(ValueError, match=r"code 7 is unknown: use 1 \(SCRAM-SHA-256\)"):
        mechanism_name(7)


def test_the_secret_parts_stay_out_of_the_repr() -> None:
    credential = new_credential("alice", "SCRAM-SHA-256", "pw", 4096, b"NaCl-salt-1234")
    shown = repr(credential)
    assert "alice" in shown
    assert "4096" in shown
    for secret in (credential.salt, credential.stored_key, credential.server_key):
        assert repr(secret) not in shown
        assert secret.hex() not in shown


def test_an_unknown_user_gets_a_stable_fake_credential_no_password_matches() -> None:
    secret = b"per-process-secret-0123456789abc"
    fake = fake_credential(secret, "nobody", "SCRAM-SHA-512")
    assert fake == fake_credential(secret, "nobody", "SCRAM-SHA-512")  # same at every attempt
    assert fake.salt != fake_credential(secret, "other", "SCRAM-SHA-512").salt
    assert (
        fake.salt
        != fake_credential(b"another-broker-secret-0123456789", "nobody", "SCRAM-SHA-512").salt
    )
    assert len(fake.salt) == 32
    assert fake.iterations == 8192  # as a real one: nothing tells them apart
    real = new_credential("alice", "SCRAM-SHA-512", "pw")
    assert len(fake.stored_key) == len(real.stored_key)
    for guess in ("", "pw", "nobody"):
        with pytest.raises(ScramException):
            login(fake, "nobody", guess or "x")
