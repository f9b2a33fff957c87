"""Issue 13: every Kafka client jobreg makes takes its settings from one place, and works over
TLS (the embedded broker behind a TLS-terminating proxy, tests/support/tls.py); bad settings and
failed handshakes are one clear line that shows no secret."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.tls import TlsProxy, make_certs

from registry import BrokerError, ConfigError, EmbeddedBroker, Registry
from registry.kafka_config import GUARDED, Kafka, check_client_config, load_properties, redacted
from registry.log import write_raw

pytestmark = [pytest.mark.integration, pytest.mark.embedded_only(
    "TLS terminated by a proxy in front of the embedded broker (Kafka's own listener: "
    "test_kafka_security.py)")]

JOBREG = [sys.executable, "-m", "registry.cli"]


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory):
    """(bootstrap, CA file): an embedded broker reachable only through TLS."""
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    proxy = TlsProxy(certs)
    try:
        with EmbeddedBroker(advertised_port=proxy.port) as broker:
            proxy.target = broker.listen_port
            yield f"127.0.0.1:{proxy.port}", certs.ca
    finally:
        proxy.stop()


def _tls(ca: Path) -> dict[str, str]:
    return {"security.protocol": "SSL", "ssl.ca.location": str(ca)}


def test_the_client_works_over_tls(tls_broker) -> None:
    bootstrap, ca = tls_broker
    reg = Registry.connect(bootstrap, "tls", topic="tls-client", client_config=_tls(ca))
    try:
        term = reg.claim_leadership("jm-1")  # the grant producer
        term.submit("a", b"graph")  # the transactional producer
        term.cancel("a", "over TLS")
        # a zombie's raw write and a fresh reader, with the same settings
        write_raw(reg.kafka, reg.topic, reg.partition, "tls/job/z", b"\x00garbage")
        fresh = Registry.connect(bootstrap, "tls", topic="tls-client", client_config=_tls(ca))
        assert fresh.job("a").status == "CANCELLED" and len(fresh.quarantined()) == 1
        assert "cancelled" in fresh.explain("a")  # forensics reads over TLS too
        fresh.close()
    finally:
        reg.close()


def test_the_cli_reads_over_tls_with_a_properties_file(tls_broker, tmp_path) -> None:
    bootstrap, ca = tls_broker
    reg = Registry.connect(bootstrap, "tls-cli", topic="tls-cli", client_config=_tls(ca))
    reg.claim_leadership("jm-1").submit("job", b"g")
    reg.close()
    props = tmp_path / "client.properties"
    props.write_text("# as for kafka-console-consumer --consumer.config\n"
                     "security.protocol=SSL\n"
                     "ssl.ca.location=${env:JOBREG_TEST_CA}\n")
    result = subprocess.run([*JOBREG, "--bootstrap", bootstrap, "--topic", "tls-cli",
                             "--namespace", "tls-cli", "-F", str(props), "jobs"],
                            capture_output=True, text=True, timeout=120,
                            env={"JOBREG_TEST_CA": str(ca), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert "job" in result.stdout and "ACTIVE" in result.stdout


def test_an_untrusted_certificate_is_one_clear_error(tls_broker) -> None:
    bootstrap, _ = tls_broker
    with pytest.raises(BrokerError) as e:  # the system's CAs do not know our throwaway CA
        Registry.connect(bootstrap, "tls", topic="tls-client", timeout=3,
                         client_config={"security.protocol": "SSL"})
    assert "\n" not in str(e.value) and "certificate verify failed" in str(e.value)


def test_a_plaintext_client_against_the_tls_listener_is_one_clear_error(tls_broker) -> None:
    bootstrap, _ = tls_broker
    with pytest.raises(BrokerError) as e:
        Registry.connect(bootstrap, "tls", topic="tls-client", timeout=3)
    assert "\n" not in str(e.value) and f"no Kafka broker answered at {bootstrap}" in str(e.value)


def test_secrets_never_show_in_errors(tls_broker, tmp_path) -> None:
    """A SASL password from the environment: the client fails (the broker here speaks no
    SASL), and neither the library's error nor the CLI's output holds the password."""
    bootstrap, ca = tls_broker
    secret = "s3cr3t-never-shown"
    props = tmp_path / "sasl.properties"
    props.write_text("security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n"
                     "sasl.username=jobreg\nsasl.password=${env:JOBREG_TEST_PW}\n"
                     f"ssl.ca.location={ca}\n")
    result = subprocess.run([*JOBREG, "--bootstrap", bootstrap, "--topic", "tls-client",
                             "--namespace", "tls", "--timeout", "3", "-F", str(props), "jobs"],
                            capture_output=True, text=True, timeout=120,
                            env={"JOBREG_TEST_PW": secret, "PATH": "/usr/bin:/bin"})
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert secret not in result.stdout + result.stderr
    config = load_properties(props, environ={"JOBREG_TEST_PW": secret})
    assert config["sasl.password"] == secret
    assert secret not in repr(Kafka(bootstrap, config))
    assert redacted(config)["sasl.password"] == "***"


# -- the settings themselves (no broker) -----------------------------------------------------

@pytest.mark.parametrize("key", sorted(GUARDED))
def test_a_property_jobreg_relies_on_is_refused_with_why(key: str) -> None:
    with pytest.raises(ConfigError, match=rf"does not let {key} be set: "):
        check_client_config({key: "x"})
    with pytest.raises(ConfigError, match=rf"does not let {key} be set"):
        Registry("127.0.0.1:9092", "ns", partitions=1, client_config={key: "x"})


def test_a_guarded_property_in_a_file_is_a_usage_error_of_one_line(tmp_path) -> None:
    props = tmp_path / "bad.properties"
    props.write_text("security.protocol=SSL\nisolation.level=read_uncommitted\n")
    result = subprocess.run([*JOBREG, "--bootstrap", "127.0.0.1:9", "-F", str(props), "jobs"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "does not let isolation.level be set" in result.stderr
    assert "Traceback" not in result.stderr


def test_properties_files_read_as_kafkas_tools_read_them(tmp_path) -> None:
    secret_file = tmp_path / "pw"
    secret_file.write_text("from-a-file\n")
    props = tmp_path / "p.properties"
    props.write_text("! a comment\n# another\n\nsecurity.protocol = SASL_SSL\n"
                     "sasl.mechanism: SCRAM-SHA-512\n"
                     "sasl.username jobreg\n"
                     f"sasl.password=${{file:{secret_file}}}\n"
                     "ssl.endpoint.identification.algorithm=\\\n  https\n")
    assert load_properties(props) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "jobreg", "sasl.password": "from-a-file",
        "ssl.endpoint.identification.algorithm": "https"}
    props.write_text("sasl.password=${env:JOBREG_NOT_SET_ANYWHERE}\n")
    with pytest.raises(ConfigError, match="environment variable JOBREG_NOT_SET_ANYWHERE, "
                                          "which is not set"):
        load_properties(props, environ={})
    with pytest.raises(ConfigError, match="cannot read the client properties file"):
        load_properties(tmp_path / "absent.properties")


def _readme_properties() -> list[str]:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text.split("### Connecting to a secured cluster", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```properties\n(.*?)```", section, re.S)


def test_the_readmes_tls_properties_work_against_a_tls_listener(tls_broker, tmp_path) -> None:
    """The README's TLS example, with this fixture's CA in place of its path."""
    bootstrap, ca = tls_broker
    tls, *others = _readme_properties()
    props = tmp_path / "tls.properties"
    props.write_text(tls.replace("/etc/jobreg/kafka-ca.pem", str(ca)))
    Registry.connect(bootstrap, "readme", topic="tls-readme",
                     client_config=load_properties(props)).claim_leadership("jm-1")
    result = subprocess.run([*JOBREG, "--bootstrap", bootstrap, "--topic", "tls-readme",
                             "--namespace", "readme", "-F", str(props), "leader"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "jm-1" in result.stdout, result.stderr
    # The SASL examples are well-formed and pass the guard (no SASL broker to run them on).
    secret = tmp_path / "secret"
    secret.write_text("x")
    for text in others:
        props.write_text(text.replace("/run/secrets/jobreg_oidc_secret", str(secret)))
        assert load_properties(props, environ={"JOBREG_KAFKA_PASSWORD": "pw"})[
            "security.protocol"] == "SASL_SSL"


@pytest.mark.spark
def test_the_audit_job_runs_and_checks_over_tls(tls_broker, tmp_path) -> None:
    """The audit job (plain, and Spark's run with jobreg's Python source) and `audit check`
    take the same properties file, and work over TLS."""
    bootstrap, ca = tls_broker
    reg = Registry.connect(bootstrap, "tls-audit", topic="tls-audit", client_config=_tls(ca))
    term = reg.claim_leadership("jm-1")
    term.submit_many([(f"job-{i}", b"g") for i in range(20)])
    term.cancel("job-3", "over TLS")
    reg.close()
    props = tmp_path / "client.properties"
    props.write_text(f"security.protocol=SSL\nssl.ca.location={ca}\n")
    base = [*JOBREG, "--bootstrap", bootstrap, "--topic", "tls-audit", "-F", str(props)]
    for how in (["--plain"], ["--source", "python"]):
        db = f"sqlite:///{tmp_path / ('audit-' + how[-1].strip('-') + '.db')}"
        run = subprocess.run([*base, "audit", "run", "--once", *how, "--db", db],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        assert "wrote 23 records" in run.stdout, run.stdout  # grant, 20 submits, cancel, commit
        check = subprocess.run([*base, "audit", "check", "--db", db], capture_output=True,
                               text=True, timeout=120)
        assert check.returncode == 0 and "agrees with the fold" in check.stdout, check.stderr
    # without the properties the broker is not reached: one line, nothing written
    db = tmp_path / "never.db"
    plain = subprocess.run([*JOBREG, "--bootstrap", bootstrap, "--topic", "tls-audit",
                            "--timeout", "3", "audit", "run", "--once", "--plain", "--db",
                            f"sqlite:///{db}"], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 1 and len(plain.stderr.strip().splitlines()) == 1, plain.stderr
    assert not db.exists()


def test_properties_translate_to_the_java_client_for_sparks_kafka_source() -> None:
    from registry.kafka_config import java_client_options

    assert java_client_options({
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "jobreg", "sasl.password": 'p"w', "ssl.ca.location": "/ca.pem"}) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                            'username="jobreg" password="p\\"w";',
        "ssl.truststore.type": "PEM", "ssl.truststore.location": "/ca.pem"}
    assert java_client_options({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                                "sasl.username": "u", "sasl.password": "p"})[
        "sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.PlainLoginModule")
    with pytest.raises(ConfigError, match="ssl.key.location has no Java Kafka client equivalent"):
        java_client_options({"ssl.key.location": "/k.pem"})
    with pytest.raises(ConfigError, match="only with sasl.mechanism PLAIN, SCRAM"):
        java_client_options({"sasl.mechanism": "OAUTHBEARER", "sasl.username": "u",
                             "sasl.password": "p"})


def test_the_command_config_reaches_the_executors(tls_broker) -> None:
    """What Spark ships to executors (the fold task and the source's reader, pickled with
    pyspark's cloudpickle, as Spark does) carries the --command-config properties: on the
    other side both read the TLS-only broker (issue 28: executors on other hosts read Kafka
    themselves)."""
    from pyspark import cloudpickle

    from consumers.audit_job import FoldTask
    from consumers.kafka_source import KafkaInputPartition, KafkaSource, kafka_schema
    from registry.audit.partition import log_history

    bootstrap, ca = tls_broker
    kafka = Kafka(bootstrap, _tls(ca))
    reg = Registry.connect(bootstrap, "tls-exec", topic="tls-exec", client_config=_tls(ca))
    reg.claim_leadership("jm-1").submit_many([(f"job-{i}", b"g") for i in range(5)])
    end = reg.sync().provenance.last_offset + 1
    partition = reg.partition
    reg.close()

    task = cloudpickle.loads(cloudpickle.dumps(FoldTask("sqlite://", "tls-exec", 1, kafka)))
    assert task.bootstrap.config == _tls(ca)
    assert task.probe(partition, 0, end)
    assert [r.offset for r in log_history(task.bootstrap, "tls-exec", 10)(partition, end)][-1] \
        == end - 1

    options = {"kafka.bootstrap.servers": bootstrap, "subscribe": "tls-exec",
               **{f"kafka.{k}": v for k, v in kafka.config.items()}}
    reader = KafkaSource(options).streamReader(kafka_schema())
    shipped = cloudpickle.loads(cloudpickle.dumps(reader))
    rows = sum(b.num_rows for b in shipped.read(KafkaInputPartition("tls-exec", partition, 0,
                                                                      end)))
    assert rows == 7  # the grant, 5 submits, the call's commit record
