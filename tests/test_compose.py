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


def _code_text() -> str:
    root = Path(__file__).resolve().parent.parent
    return "\n".join(p.read_text() for d in ("registry", "consumers") for p in
                     (root / d).rglob("*.py"))


def test_the_audit_job_runs_a_real_command_with_variables_the_code_reads() -> None:
    import re

    from click.testing import CliRunner

    from registry.cli import main

    audit = SERVICES["audit"]
    assert audit["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"
    assert audit["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "healthcheck" in audit and audit["volumes"]
    env = audit["environment"]
    code = _code_text()
    for name in env:
        assert f'"{name}"' in code, f"the audit service sets {name}, which no code reads"
    assert env["JOBREG_BOOTSTRAP"].split(":")[0] == "kafka"
    assert env["JOBREG_AUDIT_DB"].startswith("postgresql+psycopg://jobreg@postgres")
    assert env["JOBREG_AUDIT_DB_PASSWORD_FILE"] == SERVICES["postgres"]["environment"][
        "POSTGRES_PASSWORD_FILE"]
    assert re.fullmatch(r"org\.apache\.spark:spark-sql-kafka-0-10_2\.13:4\.3\.0",
                        env["JOBREG_SPARK_PACKAGES"])  # the pyspark version we pin
    # the command parses: every option exists (click rejects unknown ones with exit 2)
    result = CliRunner().invoke(main, [*audit["command"], "--help"])
    assert result.exit_code == 0, result.output
    for option in (a for a in audit["command"] if a.startswith("--")):
        assert option in result.output
    health = CliRunner().invoke(main, [*audit["healthcheck"]["test"][2:], "--help"])
    assert health.exit_code == 0, health.output


def test_the_image_installs_the_package_and_bakes_in_the_connector() -> None:
    root = Path(__file__).resolve().parent.parent
    docker = (root / "Dockerfile").read_text()
    for folder in ("registry", "consumers", "schemas", "migrations"):
        assert f"COPY {folder} ./{folder}" in docker
    assert SERVICES["audit"]["environment"]["JOBREG_SPARK_PACKAGES"] in docker
    assert 'ENTRYPOINT ["jobreg"]' in docker
