"""Issue 26: SASL against a broker. The embedded broker behind a SASL-terminating proxy
(tests/support/sasl_proxy.py, as Kroxylicious terminates SASL in front of Kafka): the proxy
itself against librdkafka and by hand; then jobreg's client, the CLI with a properties file,
forensics and the audit job (plain and on Spark) with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512.
A right password works; a wrong one is one line naming the mechanism and the user, never the
secret; a secret given as ``${env:...}`` or ``${file:...}`` shows in no output, log line or
exception."""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import struct
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from scramp import ScramClient
from support.sasl_proxy import (
    MECHANISMS,
    PLAIN_FAILED,
    Login,
    SaslProxy,
    _put_uvarint,
    _read_frame,
    _send,
    _string,
    _uvarint,
)
from support.tls import make_certs

from registry import AuthenticationFailed, BrokerError, ConfigError, EmbeddedBroker, Registry
from registry.forensics import Forensics
from registry.kafka_config import Kafka, load_properties, login_refused, scrubbed
from registry.log import write_raw

pytestmark = [pytest.mark.integration, pytest.mark.embedded_only(
    "SASL terminated by a proxy in front of the embedded broker (Kafka's own listener: "
    "test_kafka_security.py)")]

JOBREG = [sys.executable, "-m", "registry.cli"]
USER = "jobreg"
SECRET = "s3cr3t-Pw-never-shown"  # the right password
WRONG = "wr0ng-Pw-never-shown"
ENV = {"PATH": "/usr/bin:/bin"}


@pytest.fixture(scope="module")
def sasl_broker():
    """(bootstrap, proxy): an embedded broker reachable only through SASL (SASL_PLAINTEXT)."""
    with _proxied(SaslProxy({USER: SECRET, "other": "other-pw"})) as proxy:
        yield f"127.0.0.1:{proxy.port}", proxy


@contextlib.contextmanager
def _proxied(proxy: SaslProxy) -> Iterator[SaslProxy]:
    """``proxy`` in front of a broker of its own; the proxy stops first, which drops every
    client connection, so the broker then stops at once."""
    broker = None
    try:
        broker = EmbeddedBroker(advertised_port=proxy.port).start()
        proxy.target = broker.listen_port
        yield proxy
    finally:
        try:
            proxy.stop()
        finally:
            if broker is not None:
                broker.stop()


def _sasl(mechanism: str, password: str = SECRET, user: str = USER) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": password}


def _properties(path: Path, mechanism: str, password_ref: str) -> Path:
    path.write_text("# as for kafka-console-consumer --consumer.config\n"
                    "security.protocol=SASL_PLAINTEXT\n"
                    f"sasl.mechanism={mechanism}\n"
                    f"sasl.username={USER}\n"
                    f"sasl.password={password_ref}\n")
    return path


def _secret_ref(tmp_path: Path, how: str, password: str) -> tuple[str, dict[str, str]]:
    """A ``${env:...}`` or ``${file:...}`` reference to ``password``, and the environment."""
    if how == "env":
        return "${env:JOBREG_TEST_PW}", {**ENV, "JOBREG_TEST_PW": password}
    secret = tmp_path / f"pw-{uuid.uuid4().hex[:6]}"
    secret.write_text(password + "\n")
    return f"${{file:{secret}}}", dict(ENV)


def _chain(e: BaseException | None) -> list[BaseException]:
    seen: list[BaseException] = []
    while e is not None and e not in seen:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def _clients_kept_by(error: BaseException) -> list[object]:
    """The confluent-kafka clients that the frames of ``error``'s tracebacks (its chain's too)
    keep alive: a client whose login was refused retries it for as long as it lives."""
    kinds = (AdminClient, Consumer, Producer)
    found = []
    for x in _chain(error):
        tb = x.__traceback__
        while tb is not None:
            for value in tb.tb_frame.f_locals.values():
                for candidate in (value, getattr(value, "client", None)):
                    if isinstance(candidate, kinds):
                        found.append(candidate)
            tb = tb.tb_next
    return found


def _one_line_naming(text: str, mechanism: str) -> bool:
    return ("\n" not in text.strip() and "refused the SASL login" in text
            and f"mechanism {mechanism}" in text and f"user '{USER}'" in text)


# -- the proxy itself, against librdkafka ---------------------------------------------------

@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_authenticates_through_the_proxy(sasl_broker, mechanism) -> None:
    """confluent-kafka's own clients: admin, a transactional producer (its coordinator is found
    through the proxy), a read_committed consumer; each connection logs in."""
    bootstrap, proxy = sasl_broker
    config = {"bootstrap.servers": bootstrap, **_sasl(mechanism), "log_level": 0}
    topic = f"sasl-raw-{uuid.uuid4().hex[:8]}"
    before = len(proxy.logins)
    admin = AdminClient(config)
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(timeout=10)
    producer = Producer({**config, "transactional.id": f"sasl-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(topic, b"through SASL")
    producer.commit_transaction(10)
    consumer = Consumer({**config, "group.id": "sasl", "isolation.level": "read_committed",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        message = None
        for _ in range(100):
            message = consumer.poll(0.2)
            if message is not None:
                break
        assert message is not None and message.error() is None and \
            message.value() == b"through SASL"
    finally:
        consumer.close()
    logins = proxy.logins[before:]
    assert len(logins) >= 3 and set(logins) == {Login(mechanism, USER, True)}
    # librdkafka's versions: ApiVersions v3 (flexible), SaslHandshake v1, SaslAuthenticate v1
    assert {(18, 3), (17, 1), (36, 1)} <= proxy.seen


def test_librdkafka_with_a_wrong_password_or_without_sasl_is_refused(sasl_broker) -> None:
    bootstrap, proxy = sasl_broker
    errors: list[tuple[int, str]] = []
    admin = AdminClient({"bootstrap.servers": bootstrap, **_sasl("SCRAM-SHA-256", WRONG),
                         "log_level": 0, "error_cb": lambda e: errors.append((e.code(), e.str()))})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=1)
    admin.poll(0)
    assert any("Authentication failed during authentication due to invalid credentials with "
               "SASL mechanism SCRAM-SHA-256" in text for _, text in errors), errors
    assert Login("SCRAM-SHA-256", USER, False) in proxy.logins
    # A client that does not authenticate: its Metadata request closes the connection.
    refused = len(proxy.refused)
    plain = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    with pytest.raises(KafkaException):
        plain.list_topics(timeout=1)
    assert 3 in proxy.refused[refused:]  # Metadata
    del admin, plain  # freed now: they would retry for as long as they live


def _request(key: int, version: int, correlation: int, body: bytes, flexible: bool) -> bytes:
    header = struct.pack(">hhi", key, version, correlation) + _string("by-hand")
    return header + (b"\x00" if flexible else b"") + body


def test_the_exchange_by_hand_in_the_versions_librdkafka_does_not_use(sasl_broker) -> None:
    """ApiVersions v0, SaslAuthenticate v0 (PLAIN) and v2 (flexible: SCRAM-SHA-512 with
    scramp's client), a wrong password's error 58 with Kafka's message, an unsupported
    mechanism's error 33, and a request passed through after authentication."""
    bootstrap, _ = sasl_broker
    host, port = bootstrap.split(":")

    def connect() -> socket.socket:
        return socket.create_connection((host, int(port)), timeout=10)

    with connect() as s:
        _send(s, _request(18, 0, 1, b"", False))
        reply = _read_frame(s)
        correlation, error, count = struct.unpack_from(">ihi", reply)
        versions = {k: (lo, hi) for k, lo, hi in
                    (struct.unpack_from(">hhh", reply, 10 + 6 * i) for i in range(count))}
        assert (correlation, error) == (1, 0)
        assert versions[17] == (1, 1) and versions[36] == (0, 2) and 3 in versions
        _send(s, _request(17, 1, 2, _string("GSSAPI"), False))
        correlation, error, count = struct.unpack_from(">ihi", _read_frame(s))
        assert (correlation, error, count) == (2, 33, 3)  # UNSUPPORTED_SASL_MECHANISM, ours
        assert s.recv(1) == b""  # and the connection is closed

    def plain_v0(password: str) -> tuple[int, str]:
        with connect() as s:
            _send(s, _request(17, 1, 1, _string("PLAIN"), False))
            assert struct.unpack_from(">ih", _read_frame(s)) == (1, 0)
            token = f"\0{USER}\0{password}".encode()
            _send(s, _request(36, 0, 2, struct.pack(">i", len(token)) + token, False))
            reply = _read_frame(s)
            correlation, error, length = struct.unpack_from(">ihh", reply)
            message = reply[8:8 + length].decode() if length >= 0 else ""
            if error == 0:  # authenticated: a Metadata v1 request passes to the broker
                _send(s, _request(3, 1, 3, struct.pack(">i", 0), False))
                assert struct.unpack_from(">i", _read_frame(s)) == (3,)
            return error, message

    assert plain_v0(SECRET) == (0, "")
    assert plain_v0(WRONG) == (58, PLAIN_FAILED)

    def scram_v2(password: str) -> tuple[int, str]:
        client = ScramClient(["SCRAM-SHA-512"], USER, password)

        def authenticate(s: socket.socket, correlation: int, token: str) -> tuple[int, str, str]:
            raw = token.encode()
            _send(s, _request(36, 2, correlation, _put_uvarint(len(raw) + 1) + raw + b"\x00",
                              True))
            reply = _read_frame(s)
            assert struct.unpack_from(">i", reply) == (correlation,) and reply[4] == 0
            (error,) = struct.unpack_from(">h", reply, 5)
            size, at = _uvarint(reply, 7)
            message = reply[at:at + size - 1].decode() if size else ""
            at += max(size - 1, 0)
            size, at = _uvarint(reply, at)
            return error, message, reply[at:at + size - 1].decode()

        with connect() as s:
            _send(s, _request(17, 1, 1, _string("SCRAM-SHA-512"), False))
            assert struct.unpack_from(">ih", _read_frame(s)) == (1, 0)
            error, _, server_first = authenticate(s, 2, client.get_client_first())
            assert error == 0
            client.set_server_first(server_first)
            error, message, server_final = authenticate(s, 3, client.get_client_final())
            if error == 0:
                client.set_server_final(server_final)  # the server proved it knows us
            return error, message

    assert scram_v2(SECRET) == (0, "")
    assert scram_v2(WRONG) == (58, "Authentication failed during authentication due to invalid "
                                   "credentials with SASL mechanism SCRAM-SHA-512")


# -- jobreg's client and forensics ----------------------------------------------------------

@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_client_works_with_sasl(sasl_broker, mechanism) -> None:
    bootstrap, proxy = sasl_broker
    topic = f"sasl-client-{mechanism.lower()}"
    reg = Registry.connect(bootstrap, "sasl", topic=topic, client_config=_sasl(mechanism))
    try:
        term = reg.claim_leadership("jm-1")  # the grant producer
        term.submit("a", b"graph")  # the transactional producer
        term.cancel("a", "over SASL")
        # a zombie's raw write and a fresh reader, with the same settings
        write_raw(reg.kafka, reg.topic, reg.partition, "sasl/job/z", b"\x00garbage")
        fresh = Registry.connect(bootstrap, "sasl", topic=topic, client_config=_sasl(mechanism))
        assert fresh.job("a").status == "CANCELLED" and len(fresh.quarantined()) == 1
        assert "cancelled" in fresh.explain("a")
        fresh.close()
        forensics = Forensics.from_broker(Kafka(bootstrap, _sasl(mechanism)), topic, "sasl", 10)
        assert [d.job_id for d in forensics.timeline("a")] == ["a", "a"]
    finally:
        reg.close()
    assert Login(mechanism, USER, True) in proxy.logins


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_wrong_password_is_one_line_naming_the_mechanism_and_the_user(
        sasl_broker, mechanism) -> None:
    """At once (librdkafka would retry the login until the timeout), not "no broker answered"."""
    bootstrap, proxy = sasl_broker
    with pytest.raises(AuthenticationFailed) as e:
        Registry.connect(bootstrap, "sasl", topic="sasl-client", timeout=60,
                         client_config=_sasl(mechanism, WRONG))
    text = str(e.value)
    assert _one_line_naming(text, mechanism), text
    assert isinstance(e.value, BrokerError) and "no Kafka broker answered" not in text
    assert all(WRONG not in str(x) + repr(x) for x in _chain(e.value))
    assert Login(mechanism, USER, False) in proxy.logins
    assert _clients_kept_by(e.value) == []  # nothing keeps logging in while the error is kept
    with pytest.raises(AuthenticationFailed, match="user 'nobody'"):  # an unknown user
        Registry.connect(bootstrap, "sasl", topic="sasl-client", timeout=60,
                         client_config=_sasl(mechanism, SECRET, user="nobody"))


@pytest.mark.parametrize("how", ["env", "file"])
def test_a_secret_shows_in_no_output_log_line_or_exception(sasl_broker, tmp_path, caplog,
                                                           capsys, how) -> None:
    """The strongest a user could ask for: librdkafka's every debug context on, every logger
    at DEBUG; the right password and a wrong one, from the environment or a file."""
    bootstrap, _ = sasl_broker
    caplog.set_level(logging.DEBUG)
    for password in (SECRET, WRONG):
        ref, environ = _secret_ref(tmp_path, how, password)
        props = _properties(tmp_path / "client.properties", "SCRAM-SHA-256", ref)
        config = {**load_properties(props, environ=environ), "debug": "all"}
        assert config["sasl.password"] == password
        if password == SECRET:
            reg = Registry.connect(bootstrap, "secret", topic=f"sasl-secret-{how}",
                                   client_config=config)
            reg.claim_leadership("jm-1").submit("j", b"g")
            print(reg, repr(reg.kafka), reg.job("j"))
            reg.close()
            continue
        with pytest.raises(AuthenticationFailed) as e:
            Registry.connect(bootstrap, "secret", topic=f"sasl-secret-{how}",
                             client_config=config)
        assert _one_line_naming(str(e.value), "SCRAM-SHA-256"), e.value
        for x in _chain(e.value):
            assert password not in str(x) + repr(x) + repr(x.args)
    out = capsys.readouterr()
    assert len(caplog.records) > 100  # librdkafka's debug lines did reach the log
    for secret in (SECRET, WRONG):
        assert secret not in caplog.text + out.out + out.err
        assert all(secret not in r.getMessage() for r in caplog.records)


# -- the CLI ----------------------------------------------------------------------------------

def test_the_cli_and_forensics_read_with_a_properties_file(sasl_broker, tmp_path) -> None:
    bootstrap, _ = sasl_broker
    reg = Registry.connect(bootstrap, "sasl-cli", topic="sasl-cli",
                           client_config=_sasl("SCRAM-SHA-512"))
    term = reg.claim_leadership("jm-1")
    term.submit("job", b"g")
    term.cancel("job", "over SASL")
    term.submit("other", b"g")
    reg.close()
    dump = tmp_path / "sasl-cli.avro"
    outputs = ""
    for how, command in (("env", ["jobs"]), ("file", ["explain", "job"]),
                         ("env", ["timeline", "job"]), ("file", ["dump", str(dump)])):
        ref, env = _secret_ref(tmp_path, how, SECRET)
        props = _properties(tmp_path / f"{how}.properties", "SCRAM-SHA-512", ref)
        result = subprocess.run([*JOBREG, "--bootstrap", bootstrap, "--topic", "sasl-cli",
                                 "--namespace", "sasl-cli", "-F", str(props), *command],
                                capture_output=True, text=True, timeout=120, env=env)
        assert result.returncode == 0, result.stderr
        outputs += result.stdout + result.stderr
    assert "other" in outputs and "ACTIVE" in outputs and "cancelled" in outputs
    assert SECRET not in outputs
    offline = subprocess.run([*JOBREG, "--from-file", str(dump), "jobs", "--all"],
                             capture_output=True, text=True, timeout=120)
    assert offline.returncode == 0 and "CANCELLED" in offline.stdout, offline.stderr


@pytest.mark.parametrize("how", ["env", "file"])
def test_a_wrong_password_in_the_cli_is_one_line_and_exit_1(sasl_broker, tmp_path, how) -> None:
    """A read command, forensics, and the audit job (which then writes nothing)."""
    bootstrap, _ = sasl_broker
    ref, env = _secret_ref(tmp_path, how, WRONG)
    props = _properties(tmp_path / "wrong.properties", "PLAIN", ref)
    db = tmp_path / "never.db"
    base = [*JOBREG, "--bootstrap", bootstrap, "--topic", "sasl-cli", "--namespace", "sasl-cli",
            "--timeout", "60", "-F", str(props)]
    for command in (["jobs"], ["explain", "job"],
                    ["audit", "run", "--once", "--plain", "--db", f"sqlite:///{db}"]):
        result = subprocess.run([*base, *command], capture_output=True, text=True, timeout=120,
                                env=env)
        assert result.returncode == 1, result.stderr
        assert result.stdout == "" and "Traceback" not in result.stderr
        assert _one_line_naming(result.stderr, "PLAIN"), result.stderr
        assert WRONG not in result.stderr
    assert not db.exists()


@pytest.mark.parametrize(("setting", "said"), [
    ({"sasl.mechanism": "SCRAM-SHA-1024"}, "Unsupported hash function: SCRAM-SHA-1024 (try SCRAM-SHA-512)"),
    ({"sasl.username": None}, "sasl.username and sasl.password must be set")])
def test_sasl_settings_librdkafka_refuses_are_one_line(sasl_broker, tmp_path, setting,
                                                       said) -> None:
    """librdkafka refuses them when it makes a client: a ConfigError, not its exception."""
    bootstrap, _ = sasl_broker
    config = {k: v for k, v in {**_sasl("PLAIN", WRONG), **setting}.items() if v is not None}
    with pytest.raises(ConfigError) as e:
        Registry.connect(bootstrap, "sasl", topic="sasl-client", client_config=config)
    assert str(e.value) == f"librdkafka refuses the client properties: {said}"
    assert all(WRONG not in str(x) + repr(x) for x in _chain(e.value))
    props = tmp_path / "bad.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
    result = subprocess.run([*JOBREG, "--bootstrap", bootstrap, "-F", str(props), "jobs"],
                            capture_output=True, text=True, timeout=120, env=ENV)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr == f"Error: librdkafka refuses the client properties: {said}\n"


def _readme_sasl_properties() -> str:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text.split("### Connecting to a secured cluster", 1)[1].split("\n## ", 1)[0]
    [scram] = [p for p in re.findall(r"```properties\n(.*?)```", section, re.S)
               if "sasl.mechanism=SCRAM-SHA-512" in p]
    return scram


def test_the_readmes_sasl_scram_properties_work_over_sasl_ssl(tmp_path) -> None:
    """The README's SASL/SCRAM-over-TLS example as it stands (the fixture's CA in place of its
    path), against a proxy that terminates TLS and SASL."""
    certs = make_certs(tmp_path)
    with _proxied(SaslProxy({USER: SECRET}, ["SCRAM-SHA-512"], certs=certs)) as proxy:
        bootstrap = f"127.0.0.1:{proxy.port}"
        props = tmp_path / "scram.properties"
        props.write_text(_readme_sasl_properties().replace("/etc/jobreg/kafka-ca.pem",
                                                          str(certs.ca)))
        config = load_properties(props, environ={"JOBREG_KAFKA_PASSWORD": SECRET})
        assert config["security.protocol"] == proxy.protocol == "SASL_SSL"
        reg = Registry.connect(bootstrap, "readme", topic="sasl-readme", client_config=config)
        reg.claim_leadership("jm-1")
        reg.close()
        base = [*JOBREG, "--bootstrap", bootstrap, "--topic", "sasl-readme",
                "--namespace", "readme", "--timeout", "60", "-F", str(props), "leader"]
        result = subprocess.run(base, capture_output=True, text=True, timeout=120,
                                env={**ENV, "JOBREG_KAFKA_PASSWORD": SECRET})
        assert result.returncode == 0 and "jm-1" in result.stdout, result.stderr
        wrong = subprocess.run(base, capture_output=True, text=True, timeout=120,
                               env={**ENV, "JOBREG_KAFKA_PASSWORD": WRONG})
        assert wrong.returncode == 1 and _one_line_naming(wrong.stderr, "SCRAM-SHA-512")
        assert WRONG not in wrong.stderr + wrong.stdout
    assert set(proxy.logins) == {Login("SCRAM-SHA-512", USER, True),
                                 Login("SCRAM-SHA-512", USER, False)}


# -- the message itself (no broker) --------------------------------------------------------

def test_a_refused_login_reads_as_one_line_whatever_librdkafka_wrote() -> None:
    kafka = Kafka("h:9093", {**_sasl("SCRAM-SHA-256", "pw-in-the-reason"), "ssl.key.password": "kp"})
    said = ("sasl_ssl://h:9093/bootstrap: SASL authentication error: Authentication failed:\n"
            "user jobreg pw-in-the-reason kp (after 12ms in state AUTH_REQ, 3 identical error(s) "
            "suppressed)")
    assert login_refused(kafka, said) == (
        "h:9093 refused the SASL login (mechanism SCRAM-SHA-256, user 'jobreg'): Authentication "
        "failed: user jobreg *** ***; check the sasl.* properties")
    oauth = Kafka("h:1", {"sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.client.id": "app"})
    assert "(mechanism OAUTHBEARER, user 'app')" in login_refused(oauth, "x")
    assert "(mechanism GSSAPI, no user name given)" in login_refused(Kafka("h:1", {}), "x")
    assert scrubbed("a secret here", {"sasl.password": "", "ssl.ca.location": "secret"}) == \
        "a secret here"  # only secret-looking keys, only non-empty values


# -- the audit job ----------------------------------------------------------------------------

def _audit_topic(bootstrap: str, topic: str, mechanism: str) -> None:
    reg = Registry.connect(bootstrap, topic, topic=topic, client_config=_sasl(mechanism))
    term = reg.claim_leadership("jm-1")
    term.submit_many([(f"job-{i}", b"g") for i in range(20)])
    term.cancel("job-3", "over SASL")
    reg.close()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_audit_job_runs_and_checks_with_sasl_plain(sasl_broker, tmp_path,
                                                       mechanism) -> None:
    """The audit job without Spark, and `audit check`'s comparison, in-process."""
    from consumers.audit_job import materialize
    from registry.audit.writer import check

    bootstrap, proxy = sasl_broker
    topic = f"sasl-audit-{mechanism.lower()}"
    _audit_topic(bootstrap, topic, mechanism)
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    kafka = Kafka(bootstrap, _sasl(mechanism))
    before = len(proxy.logins)
    run = materialize(url, kafka, topic, engine="plain")
    assert run.records == 23  # grant, 20 submits, cancel, commit
    assert check(url, kafka, topic) == []
    assert set(proxy.logins[before:]) == {Login(mechanism, USER, True)}


def test_the_cli_audit_job_runs_and_checks_with_a_properties_file(sasl_broker, tmp_path) -> None:
    """`audit run --plain` and `audit check` with the properties file (a secret from a file)."""
    bootstrap, _ = sasl_broker
    topic = "sasl-audit-cli"
    _audit_topic(bootstrap, topic, "SCRAM-SHA-256")
    ref, env = _secret_ref(tmp_path, "file", SECRET)
    props = _properties(tmp_path / "client.properties", "SCRAM-SHA-256", ref)
    base = [*JOBREG, "--bootstrap", bootstrap, "--topic", topic, "-F", str(props)]
    db = f"sqlite:///{tmp_path / 'audit.db'}"
    run = subprocess.run([*base, "audit", "run", "--once", "--plain", "--db", db],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "wrote 23 records" in run.stdout, run.stdout
    check = subprocess.run([*base, "audit", "check", "--db", db], capture_output=True,
                           text=True, timeout=120, env=env)
    assert check.returncode == 0 and "agrees with the fold" in check.stdout, check.stderr
    assert SECRET not in run.stdout + run.stderr + check.stdout + check.stderr


@pytest.mark.spark
def test_the_audit_job_on_spark_with_sasl(sasl_broker, spark, tmp_path, capfd, caplog) -> None:
    """The Spark run with jobreg's Python source (its executors' consumers log in too); a wrong
    password stops it with the same one line before Spark reads anything. Neither password
    shows in what Spark, its workers or the library print or log."""
    from consumers.audit_job import run_audit
    from registry.audit.db import migrate
    from registry.audit.writer import check

    bootstrap, proxy = sasl_broker
    topic = "sasl-audit-spark"
    _audit_topic(bootstrap, topic, "SCRAM-SHA-512")
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    migrate(url)
    kafka = Kafka(bootstrap, _sasl("SCRAM-SHA-512"))
    before = len(proxy.logins)
    run = run_audit(url, kafka, topic, spark=spark, source="python")
    assert run.records == 23 and run.source == "jobreg-kafka"
    assert check(url, kafka, topic) == []
    assert set(proxy.logins[before:]) == {Login("SCRAM-SHA-512", USER, True)}
    with pytest.raises(AuthenticationFailed) as e:
        run_audit(url, Kafka(bootstrap, _sasl("SCRAM-SHA-512", WRONG)), topic, spark=spark,
                  source="python")
    assert _one_line_naming(str(e.value), "SCRAM-SHA-512") and WRONG not in str(e.value)
    out = capfd.readouterr()
    for secret in (SECRET, WRONG):
        assert secret not in out.out + out.err + caplog.text
