"""docker-compose.yml (which cannot run here) agrees with what the code reads."""

from __future__ import annotations

from pathlib import Path

import yaml

from registry.log import DEFAULT_TOPIC, TopicConfig

COMPOSE = yaml.safe_load((Path(__file__).resolve().parent.parent / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def _flags(service: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for arg in SERVICES[service]["command"]:
        name, _, value = arg.partition("=")
        out.setdefault(name, []).append(value)
    return out


def test_images_are_pinned() -> None:
    for name, service in SERVICES.items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin {image}"


def test_the_topic_is_created_with_exactly_our_settings() -> None:
    flags = _flags("kafka-init")
    config = TopicConfig()
    assert flags["--topic"] == [f"${{JOBREG_TOPIC:-{DEFAULT_TOPIC}}}"]
    assert flags["--partitions"] == [str(config.partitions)]
    assert flags["--replication-factor"] == [str(config.replication_factor)]
    assert dict(c.split("=", 1) for c in flags["--config"]) == config.kafka_config()
    assert "--if-not-exists" in flags


def test_kafka_is_kraft_with_transactions_and_no_auto_created_topics() -> None:
    env = SERVICES["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "1"
    assert SERVICES["kafka-init"]["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_health_checks_volumes_and_no_secrets() -> None:
    for name in ("kafka", "postgres"):
        assert "healthcheck" in SERVICES[name], name
        assert SERVICES[name]["volumes"], name
    env = SERVICES["postgres"]["environment"]
    assert "POSTGRES_PASSWORD" not in env and env["POSTGRES_PASSWORD_FILE"].startswith("/run/secrets/")
    text = (Path(__file__).resolve().parent.parent / "docker-compose.yml").read_text().lower()
    assert "password:" not in text.replace("postgres_password:", "")
