"""The sink's options, parsed by the source's parser: Kafka's names, with or without ``kafka.``,
and an unknown option refused with the list of known ones."""

from __future__ import annotations

import pytest

from datasource.errors import InvalidOptionError
from datasource.options import PRODUCER_OPTIONS, SinkOptions, parse_sink_options

pytestmark = pytest.mark.unit


def test_sink_options_as_spark_hands_them_over() -> None:
    # Spark lower-cases names, and adds checkpointLocation and queryName to a streaming write.
    opts = parse_sink_options(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9092",
            "topic": "out",
            "sink.id": "s1",
            "kafka.linger.ms": "5",
            "batch.size": "65536",
            "producer.compression.type": "zstd",
            "kafka.acks": "all",
            "checkpointlocation": "/tmp/ck",
            "queryname": "q",
        }
    )
    assert opts == SinkOptions(
        bootstrap_servers="127.0.0.1:9092",
        topic="out",
        sink_id="s1",
        producer={
            "linger.ms": "5",
            "batch.size": "65536",
            "compression.type": "zstd",
            "acks": "all",
        },
    )
    assert parse_sink_options({"bootstrap.servers": "h:1"}) == SinkOptions("h:1")
    # the sink decides these itself
    assert not {"transactional.id", "enable.idempotence", "bootstrap.servers"} & set(
        PRODUCER_OPTIONS
    )


BAD_SINK_OPTIONS = [
    # (options beyond bootstrap.servers, the option named, a phrase of the message)
    ({"topc": "out"}, "topc", "unknown option"),
    ({"kafka.group.id": "g"}, "kafka.group.id", "unknown option"),
    ({"transactional.id": "x"}, "transactional.id", "unknown option"),
    ({"producer.transactional.id": "x"}, "producer.transactional.id", "unknown producer setting"),
    ({"kafka.bootstrap.servers": "h:2"}, "kafka.bootstrap.servers", "given as well"),
    ({"acks": "1"}, "acks", "acks=all"),
    ({"kafka.linger.ms": "soon"}, "kafka.linger.ms", "integer"),
    ({"producer.compression.type": "zip"}, "producer.compression.type", "zstd"),
    ({"topic": " "}, "topic", "a topic name"),
]


@pytest.mark.parametrize(
    ("extra", "option", "phrase"),
    BAD_SINK_OPTIONS,
    ids=[case[1] for case in BAD_SINK_OPTIONS],
)
def test_bad_sink_options_are_refused_by_name(
    extra: dict[str, str], option: str, phrase: str
) -> None:
    with pytest.raises(InvalidOptionError) as caught:
        parse_sink_options({"bootstrap.servers": "h:1", **extra})
    error = caught.value
    assert error.option == option
    assert f"option {option}=" in str(error)
    assert phrase in str(error)


def test_an_unknown_sink_option_is_refused_with_the_known_ones() -> None:
    with pytest.raises(InvalidOptionError) as caught:
        parse_sink_options({"bootstrap.servers": "h:1", "topic": "t", "lingerms": "5"})
    message = str(caught.value)
    for known in ("bootstrap.servers", "topic", "sink.id", "linger.ms", "kafka.<name>"):
        assert known in message
    with pytest.raises(InvalidOptionError, match=r"option bootstrap\.servers is missing"):
        parse_sink_options({"topic": "t"})
