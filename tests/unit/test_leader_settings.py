"""The settings of a term's producer (issue 42, finding 7): the gap-less guarantee, and no
timeout of librdkafka's longer than the write's patience (``registry.log``)."""

from __future__ import annotations

from confluent_kafka import Producer

from registry.kafka_config import Kafka
from registry.log import leader_producer_settings
from registry.rules import DUPLICATE_WINDOW_MS


def test_a_leader_producer_is_gapless_and_gives_up_within_its_patience() -> None:
    settings = leader_producer_settings(Kafka("127.0.0.1:1"), 10.0)
    assert settings["enable.idempotence"] is True
    assert settings["enable.gapless.guarantee"] is True
    assert settings["acks"] == "all"
    for name in ("message.timeout.ms", "socket.timeout.ms", "request.timeout.ms"):
        assert settings[name] == 10_000, name


def test_the_patience_is_at_most_half_the_duplicate_window_and_at_least_10_ms() -> None:
    """A record librdkafka still retries past half the window could land after the client
    re-sent it (the client re-sends within half the window, README "Compaction", 5)."""
    long = leader_producer_settings(Kafka("127.0.0.1:1"), 3600.0)
    assert long["message.timeout.ms"] == DUPLICATE_WINDOW_MS // 2 == 30_000
    short = leader_producer_settings(Kafka("127.0.0.1:1"), 0.001)
    assert short["socket.timeout.ms"] == 10  # librdkafka's minimum


def test_a_users_properties_cannot_lengthen_them() -> None:
    settings = leader_producer_settings(Kafka("127.0.0.1:1", {"socket.timeout.ms": "60000",
                                                              "message.timeout.ms": "300000"}),
                                        5.0)
    assert settings["socket.timeout.ms"] == settings["message.timeout.ms"] == 5000


def test_librdkafka_takes_them() -> None:
    for timeout in (0.001, 10.0, 3600.0):
        settings = leader_producer_settings(Kafka("127.0.0.1:1"), timeout)
        settings.pop("logger")
        Producer(settings)  # raises if librdkafka refuses a setting or their combination
