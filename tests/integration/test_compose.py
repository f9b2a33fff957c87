"""docker-compose.yml (which cannot run here) agrees with what the code reads."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from registry.log import DEFAULT_TOPIC, TopicConfig

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def _flags(service: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for arg in SERVICES[service]["command"]:
        name, _, value = arg.partition("=")
        out.setdefault(name, []).append(value)
    return out


# The Compose Specification's JSON schema (compose-spec/compose-spec, schema/compose-spec.json at
# commit 170098b of 2026-06-23, Apache-2.0), kept in tests/support: nothing can be fetched here.
SPEC = json.loads((ROOT / "tests" / "support" / "compose-spec.json").read_text())


@pytest.mark.parametrize("name", ["docker-compose.yml", "docker-compose.secure.yml"])
def test_the_compose_files_validate_against_the_compose_specification(name: str) -> None:
    """Each file alone is a valid Compose file (an override file is one too: every top-level
    key is optional), as `docker compose config` would check it; docker cannot run here."""
    validator = jsonschema.Draft7Validator(SPEC)
    errors = [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
              for e in validator.iter_errors(yaml.safe_load((ROOT / name).read_text()))]
    assert errors == [], errors


def test_the_specification_check_catches_a_wrong_key() -> None:
    """The check above is not vacuous: a misspelt service key and a bad depends_on condition
    are each an error of the schema."""
    validator = jsonschema.Draft7Validator(SPEC)
    broken = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    broken["services"]["postgres"]["helthcheck"] = broken["services"]["postgres"]["healthcheck"]
    broken["services"]["audit"]["depends_on"]["postgres"]["condition"] = "service_ready"
    paths = {"/".join(map(str, e.absolute_path)) for e in validator.iter_errors(broken)}
    assert "services/postgres" in paths
    assert any(p.startswith("services/audit/depends_on") for p in paths), paths


def test_images_are_pinned() -> None:
    for name, service in SERVICES.items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin {image}"


BROKERS = ("kafka", "kafka-2", "kafka-3")


def test_the_topic_is_created_with_exactly_our_settings() -> None:
    """Our compaction settings exactly; production's replication on top: three replicas, a
    write acknowledged by two (min.insync.replicas=2 with the producer's acks=all)."""
    flags = _flags("kafka-init")
    config = TopicConfig(replication_factor=3)
    assert flags["--topic"] == [f"${{JOBREG_TOPIC:-{DEFAULT_TOPIC}}}"]
    assert flags["--partitions"] == [str(config.partitions)]
    assert flags["--replication-factor"] == [str(config.replication_factor)]
    assert dict(c.split("=", 1) for c in flags["--config"]) == {
        **config.kafka_config(), "min.insync.replicas": "2"}
    assert "--if-not-exists" in flags


def test_kafka_is_three_kraft_brokers_with_transactions_and_no_auto_created_topics() -> None:
    nodes = set()
    for name in BROKERS:
        env = SERVICES[name]["environment"]
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:9093,2@kafka-2:9093,3@kafka-3:9093"
        assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        assert f"INTERNAL://{name}:29092" in env["KAFKA_ADVERTISED_LISTENERS"]
        nodes.add(env["KAFKA_NODE_ID"])
        assert SERVICES["kafka-init"]["depends_on"][name]["condition"] == "service_healthy"
    assert nodes == {"1", "2", "3"}
    assert SERVICES["audit"]["environment"]["JOBREG_BOOTSTRAP"] == ",".join(
        f"{b}:29092" for b in BROKERS)


def test_the_audit_job_is_submitted_to_a_spark_standalone_cluster() -> None:
    """A master and two workers from the jobreg image's own Spark (pyspark's spark-class);
    the audit job's driver submits to the master and tells executors its own address; the
    executors open the database themselves, so the workers have its password file too."""
    docker = (ROOT / "Dockerfile").read_text()
    master = SERVICES["spark-master"]
    assert master["image"] == SERVICES["audit"]["image"]
    assert master["entrypoint"][0].endswith("/pyspark/bin/spark-class")
    assert master["entrypoint"][0].startswith(docker.split("SPARK_HOME=")[1].split()[0])
    assert master["command"][0] == "org.apache.spark.deploy.master.Master"
    port = master["command"][master["command"].index("--port") + 1]
    url = f"spark://{master['hostname']}:{port}"
    workers = [n for n in SERVICES if n.startswith("spark-worker-")]
    assert len(workers) >= 2
    audit_env = SERVICES["audit"]["environment"]
    for name in workers:
        worker = SERVICES[name]
        assert worker["image"] == master["image"] and worker["entrypoint"] == master["entrypoint"]
        assert worker["command"][:2] == ["org.apache.spark.deploy.worker.Worker", url]
        assert worker["environment"]["JOBREG_AUDIT_DB_PASSWORD_FILE"] == \
            audit_env["JOBREG_AUDIT_DB_PASSWORD_FILE"]
        assert "postgres_password" in worker["secrets"]
    assert audit_env["JOBREG_SPARK_MASTER"] == url
    command = SERVICES["audit"]["command"]
    assert command[command.index("--driver-host") + 1] == SERVICES["audit"]["hostname"]
    assert "spark-master" in SERVICES["audit"]["depends_on"]
    assert "SPARK_LOCAL_IP=127.0.0.1" not in docker and "local mode" not in docker


def test_health_checks_volumes_and_no_secrets() -> None:
    for name in (*BROKERS, "postgres"):
        assert "healthcheck" in SERVICES[name], name
        assert SERVICES[name]["volumes"], name
    env = SERVICES["postgres"]["environment"]
    assert "POSTGRES_PASSWORD" not in env and env["POSTGRES_PASSWORD_FILE"].startswith("/run/secrets/")
    text = (Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text().lower()
    for secret in COMPOSE["secrets"]:  # the secrets' names, declared: no value is in the file
        text = text.replace(f"{secret}:", "")
    assert "password:" not in text


def _code_text() -> str:
    root = Path(__file__).resolve().parents[2]
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
    assert env["JOBREG_SPARK_MASTER"].startswith("spark://")
    assert env["JOBREG_AUDIT_DB"].startswith("postgresql+psycopg://jobreg@postgres")
    assert env["JOBREG_AUDIT_DB_PASSWORD_FILE"] == SERVICES["postgres"]["environment"][
        "POSTGRES_PASSWORD_FILE"]
    # The connector nearest the pyspark we pin: Maven Central has no Spark 4.3.0
    # (consumers.spark.NEAREST_CONNECTOR).
    from consumers.spark import NEAREST_CONNECTOR
    pinned = re.search(r"pyspark==([\d.]+)", (ROOT / "requirements.lock").read_text())
    assert pinned is not None
    version = NEAREST_CONNECTOR.get(pinned.group(1), pinned.group(1))
    assert env["JOBREG_SPARK_PACKAGES"] == \
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"
    # the command parses: every option exists (click rejects unknown ones with exit 2)
    result = CliRunner().invoke(main, [*audit["command"], "--help"])
    assert result.exit_code == 0, result.output
    for option in (a for a in audit["command"] if a.startswith("--")):
        assert option in result.output
    health = CliRunner().invoke(main, [*healthcheck()[1], "--help"])
    assert health.exit_code == 0, health.output


def healthcheck() -> tuple[dict[str, str], list[str]]:
    """The audit service's health check: (the variables it sets, jobreg's arguments)."""
    test = SERVICES["audit"]["healthcheck"]["test"]
    assert test[:2] == ["CMD", "env"], test
    at = test.index("jobreg")
    return dict(a.split("=", 1) for a in test[2:at]), test[at + 1:]


def test_the_health_check_queries_as_the_reader_login_grant_reader_makes() -> None:
    """Issue 26: `audit query` refuses the superuser (POSTGRES_USER of the postgres image), so
    the health check reads as a login made by `jobreg audit grant-reader`, in a one-shot
    service that runs before the audit service, with a password from a secret of its own."""
    from click.testing import CliRunner
    from sqlalchemy.engine import make_url

    from registry.cli import main

    env, args = healthcheck()
    assert args[:2] == ["audit", "query"] and "--db" in args
    url = make_url(args[args.index("--db") + 1])
    assert url.password is None  # the password comes from the file
    assert url.get_backend_name() == "postgresql" and url.host == "postgres"
    superuser = SERVICES["postgres"]["environment"]["POSTGRES_USER"]
    assert url.username != superuser and url.database == SERVICES["postgres"]["environment"][
        "POSTGRES_DB"]
    assert "JOBREG_AUDIT_DB_PASSWORD_FILE" in _code_text()
    secret = env["JOBREG_AUDIT_DB_PASSWORD_FILE"]
    assert secret.startswith("/run/secrets/")
    assert Path(secret).name in SERVICES["audit"]["secrets"] and Path(secret).name in COMPOSE[
        "secrets"] and Path(secret).name != "postgres_password"
    # the one-shot service makes that login, with that password, before the audit service
    init = SERVICES["audit-reader"]
    assert SERVICES["audit"]["depends_on"]["audit-reader"]["condition"] == \
        "service_completed_successfully"
    assert init["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert init["image"] == SERVICES["audit"]["image"] and init["restart"] == "no"
    init_env = init["environment"]
    for name in init_env:
        assert f'"{name}"' in _code_text(), f"audit-reader sets {name}, which no code reads"
    assert init_env["JOBREG_AUDIT_READER_PASSWORD_FILE"] == secret
    assert make_url(init_env["JOBREG_AUDIT_DB"]).username == superuser  # an admin makes it
    assert set(init["secrets"]) == {"postgres_password", Path(secret).name}
    assert init["entrypoint"] == ["/bin/sh", "-c"]
    steps = [step.split() for step in init["command"][0].split("&&")]
    assert steps == [["jobreg", "audit", "migrate"],
                     ["jobreg", "audit", "grant-reader", url.username]]
    for step in steps:
        result = CliRunner().invoke(main, [*step[1:], "--help"])
        assert result.exit_code == 0, result.output


def test_the_image_installs_the_package_and_bakes_in_the_connector() -> None:
    root = Path(__file__).resolve().parents[2]
    docker = (root / "Dockerfile").read_text()
    for folder in ("registry", "consumers", "schemas", "migrations"):
        assert f"COPY {folder} ./{folder}" in docker
    assert SERVICES["audit"]["environment"]["JOBREG_SPARK_PACKAGES"] in docker
    assert 'ENTRYPOINT ["jobreg"]' in docker
    # The base install has no Spark nor database (issue 30): the image names the extras it
    # runs, at the lock's versions.
    assert "COPY pyproject.toml README.md requirements.lock ./" in docker
    assert "RUN pip install --no-cache-dir -c requirements.lock '.[spark,report,schemaregistry]'" \
        in docker


# -- docker-compose.secure.yml: TLS + SASL/SCRAM (issue 13) ------------------------------------

SECURE = yaml.safe_load((ROOT / "docker-compose.secure.yml").read_text())


def _secure_service(name: str) -> dict:
    """The service as compose merges the override into the base: mappings merged key by key,
    ``command``/``entrypoint``/``healthcheck.test`` replaced, ``secrets``/``volumes`` joined."""
    base, over = SERVICES[name], SECURE["services"].get(name, {})
    merged = {**base, **over}
    for key in ("environment", "healthcheck"):
        if key in base or key in over:
            merged[key] = {**base.get(key, {}), **over.get(key, {})}
    for key in ("secrets", "volumes"):
        merged[key] = [*base.get(key, []), *[v for v in over.get(key, [])
                                             if v not in base.get(key, [])]]
    return merged


def _secrets_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("secure_secrets",
                                                  ROOT / "deploy" / "secure_secrets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_secure_variant_clients_reach_kafka_only_over_sasl_ssl() -> None:
    env = _secure_service("kafka")["environment"]
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    advertised = {a.split("://")[0]: a.split("://")[1]
                  for a in env["KAFKA_ADVERTISED_LISTENERS"].split(",")}
    listening = {a.split("://")[0]: a.split(":")[-1] for a in env["KAFKA_LISTENERS"].split(",")}
    assert set(listening) == set(protocols)
    plaintext = {name for name, p in protocols.items() if p == "PLAINTEXT"}
    assert plaintext == {"BROKER", "CONTROLLER"}
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] == "BROKER"
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] == "CONTROLLER"
    # what is published to the host is a SASL_SSL listener, nothing plaintext
    published = {p.split(":")[-1] for p in _secure_service("kafka")["ports"]}
    assert published == {listening["EXTERNAL"]} and advertised["EXTERNAL"].startswith("localhost")
    assert protocols["INTERNAL"] == protocols["EXTERNAL"] == "SASL_SSL"
    # every broker is secured alike; the services use the internal SASL_SSL listeners, with
    # the properties file
    audit = _secure_service("audit")["environment"]
    internal = []
    for name in BROKERS:
        other = _secure_service(name)["environment"]
        assert other["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"] == \
            env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]
        assert other["KAFKA_INTER_BROKER_LISTENER_NAME"] == "BROKER"
        assert other["KAFKA_OPTS"] == env["KAFKA_OPTS"]
        internal += [a.split("://")[1] for a in other["KAFKA_ADVERTISED_LISTENERS"].split(",")
                     if a.startswith("INTERNAL://")]
    assert audit["JOBREG_BOOTSTRAP"] == ",".join(internal)
    assert advertised["INTERNAL"] == internal[0]
    # the executors read Kafka with the same settings: the CA file they name is there too
    for name in ("spark-worker-1", "spark-worker-2"):
        assert "kafka_ca.pem" in _secure_service(name)["secrets"]
    assert audit["JOBREG_KAFKA_CONFIG"].startswith("/run/secrets/")
    assert "JOBREG_KAFKA_CONFIG" in _code_text()


def test_secure_variant_secrets_fit_the_images_and_the_properties(tmp_path) -> None:
    from registry.kafka_config import java_client_options, load_properties

    wrote = _secrets_module().make(tmp_path)
    kafka = _secure_service("kafka")
    env = kafka["environment"]
    # the apache/kafka image reads these names from /etc/kafka/secrets (its configure script)
    assert "./secrets/kafka:/etc/kafka/secrets:ro" in kafka["volumes"]
    for key in ("KAFKA_SSL_KEYSTORE_FILENAME", "KAFKA_SSL_KEYSTORE_CREDENTIALS",
                "KAFKA_SSL_KEY_CREDENTIALS"):
        assert (tmp_path / "kafka" / env[key]).is_file(), key
    assert f"/etc/kafka/secrets/{wrote['jaas'].name}" in env["KAFKA_OPTS"]
    assert "ScramLoginModule" in wrote["jaas"].read_text()
    # every file the properties name is a secret the audit service mounts, from secrets/
    declared = {name: Path(spec["file"]).name for name, spec in SECURE["secrets"].items()}
    mounted = set(_secure_service("audit")["secrets"])
    client = wrote["client"].read_text()
    config_secret = Path(_secure_service("audit")["environment"]["JOBREG_KAFKA_CONFIG"]).name
    assert declared[config_secret] == wrote["client"].name and config_secret in mounted
    for path in {"/run/secrets/jobreg_kafka_password", "/run/secrets/kafka_ca.pem"}:
        name = Path(path).name
        assert path in client and name in mounted and (tmp_path / declared[name]).is_file()
    local = client.replace("/run/secrets/", f"{tmp_path}/")
    (tmp_path / "local.properties").write_text(local)
    props = load_properties(tmp_path / "local.properties")
    assert props["sasl.password"] == wrote["password"].read_text()
    # the SCRAM user kafka-init creates is the one the properties log in as, by a mechanism
    # the broker enables; and the audit job's built-in Kafka source can take them
    init = " ".join(_secure_service("kafka-init")["command"])
    assert f"--entity-name={props['sasl.username']}" in init
    assert f"{props['sasl.mechanism']}=[password=$$(cat /run/secrets/jobreg_kafka_password)]" \
        in init and "jobreg_kafka_password" in _secure_service("kafka-init")["secrets"]
    assert env["KAFKA_SASL_ENABLED_MECHANISMS"] == props["sasl.mechanism"]
    assert "--source" in SERVICES["audit"]["command"]
    assert java_client_options(props)["ssl.truststore.location"] == str(wrote["ca"])
    # the topic is still created with exactly our settings
    config = TopicConfig()
    for flag, value in config.kafka_config().items():
        assert f"--config={flag}={value}" in init
    assert f"--partitions={config.partitions}" in init and "--if-not-exists" in init


@pytest.mark.integration
@pytest.mark.embedded_only("serves TLS through a proxy in front of an embedded broker of its own")
def test_secure_variant_certificate_serves_tls_to_jobreg(tmp_path) -> None:
    """The broker certificate secure_secrets.py makes, served in front of the embedded broker,
    is trusted through the CA it makes, by name and by address (librdkafka checks both)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12
    from support.tls import Certs, TlsProxy

    from registry import EmbeddedBroker, Registry

    wrote = _secrets_module().make(tmp_path)
    key, cert, chain = pkcs12.load_key_and_certificates(
        wrote["keystore"].read_bytes(), wrote["keystore_creds"].read_bytes())
    (tmp_path / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "server-key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    proxy = TlsProxy(Certs(wrote["ca"], tmp_path / "server.pem", tmp_path / "server-key.pem"))
    try:
        # bootstrap by name (the DNS SAN localhost), then the advertised 127.0.0.1 (the IP SAN)
        with EmbeddedBroker(advertised_port=proxy.port) as broker:
            proxy.target = broker.listen_port
            reg = Registry.connect(f"localhost:{proxy.port}", "secure", topic="secure",
                                   client_config={"security.protocol": "SSL",
                                                  "ssl.ca.location": str(wrote["ca"])})
            try:
                reg.claim_leadership("jm-1").submit("job", b"g")
                assert reg.job("job").status == "ACTIVE"
            finally:
                reg.close()
    finally:
        proxy.stop()
