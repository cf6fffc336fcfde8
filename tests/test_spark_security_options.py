"""The clients' security settings as options of the Spark source and sink: Kafka's names
(security.protocol, ssl.*, sasl.*), with or without ``kafka.``, carried to every client of a
query (the driver's and, pickled, the executors'), and never printed: not in a repr, not in an
error about a bad option."""

from __future__ import annotations

import pickle

import pytest

from datasource.errors import InvalidOptionError
from datasource.options import (
    PRODUCER_OPTIONS,
    SECURITY_OPTIONS,
    parse_sink_options,
    parse_source_options,
)
from datasource.planner import Planner

pytestmark = pytest.mark.unit

PASSWORD = "s3cret-Pa55"
JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    f'username="alice" password="{PASSWORD}";'
)
SECURE = {
    "kafka.security.protocol": "SASL_SSL",
    "kafka.sasl.mechanism": "SCRAM-SHA-512",
    "kafka.sasl.jaas.config": JAAS,
    "ssl.truststore.location": "/etc/replog/ca.pem",
}


def test_the_security_settings_are_the_clients_own_keys() -> None:
    assert {"security.protocol", "sasl.jaas.config", "sasl.mechanism"} <= set(SECURITY_OPTIONS)
    assert {"ssl.truststore.location", "ssl.keystore.location", "sasl.password"} <= set(
        SECURITY_OPTIONS
    )
    assert not set(SECURITY_OPTIONS) & set(PRODUCER_OPTIONS)


def test_the_source_carries_them_to_the_driver_and_the_executors_unprinted() -> None:
    opts = parse_source_options(
        {
            "bootstrap.servers": "127.0.0.1:9092",
            "subscribe": "t",
            "storage.secret": "storage-" + PASSWORD,
            **SECURE,
        },
        streaming=True,
    )
    assert dict(opts.client_security) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": JAAS,
        "ssl.truststore.location": "/etc/replog/ca.pem",
    }
    assert PASSWORD not in repr(opts)
    planner = Planner(opts)
    try:
        settings = planner.settings
        # the executors get the settings pickled, whole; their repr shows no secret
        assert pickle.loads(pickle.dumps(settings)).client_security == opts.client_security
        assert PASSWORD not in repr(settings)
        # the driver's admin client is configured with them
        admin_config = planner.view._config()
        assert admin_config["sasl.jaas.config"] == JAAS
        assert admin_config["security.protocol"] == "SASL_SSL"
    finally:
        planner.close()


def test_the_sink_gives_them_to_its_clients_not_as_producer_settings() -> None:
    opts = parse_sink_options({"bootstrap.servers": "h:1", "topic": "out", **SECURE})
    assert opts.producer == {}
    assert opts.client_config() == {
        "bootstrap.servers": "h:1",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": JAAS,
        "ssl.truststore.location": "/etc/replog/ca.pem",
    }
    assert PASSWORD not in repr(opts)


def test_a_bad_or_misspelt_secret_option_is_named_without_its_value() -> None:
    with pytest.raises(InvalidOptionError) as bad_bool:
        parse_sink_options({"bootstrap.servers": "h:1", "sasl.plain.insecure.enable": "maybe"})
    assert "sasl.plain.insecure.enable" in str(bad_bool.value)
    with pytest.raises(InvalidOptionError) as misspelt:
        parse_source_options(
            {"bootstrap.servers": "h:1", "subscribe": "t", "kafka.sasl.jaas.confg": JAAS},
            streaming=True,
        )
    message = str(misspelt.value)
    assert "kafka.sasl.jaas.confg" in message
    assert "unknown option" in message
    assert PASSWORD not in message
    assert "<redacted>" in message
    with pytest.raises(InvalidOptionError) as under_producer:
        parse_sink_options({"bootstrap.servers": "h:1", "producer.sasl.password": PASSWORD})
    assert PASSWORD not in str(under_producer.value)
